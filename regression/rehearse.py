"""``rehearse``: ``check`` run in a throwaway environment, this one changed by named requirements.

``nnx-pool-regression rehearse jax==0.9.2`` says what a change of versions would do to
the numbers before anything here changes. It:

1. creates a virtual environment (the standard library's :mod:`venv`, with pip), or
   reuses one built earlier for the same requirement set (:func:`cache_root`);
2. installs there this nnx-pool and its dependencies, each at the version installed
   here, except what the requirements name (:func:`make_plan`);
3. runs ``check`` there against a baseline of this environment (the shipped one by
   default) and returns its report, with the version changes the rehearsal made
   marked ``(rehearsal)``: ``jax 0.10.2 -> 0.9.2 (rehearsal)``;
4. with ``pytest_paths``, runs the user's ``python -m pytest PATHS`` there too, in the
   user's directory, with ``NNX_REGRESSION_CHECK_ONLY=1``, so the ``nnx_regression``
   fixture compares with the recorded baselines and never writes one.

**Requirements** are PEP 508 requirements, parsed with :mod:`packaging`
(:meth:`Requirement.parse`); anything else (a pip option, two requirements in one
argument, a bare path or URL) is refused before pip runs. What pip reads is the
parsed requirement written back (``str()``), one per line.

**Pins.** Every distribution of this interpreter (``importlib.metadata``) becomes a
``name==version`` line of a pip constraints file, except nnx-pool itself and anything
installed from a path or URL (editable or not), which no version names. Constraints
only bound what gets installed: the environment holds nnx-pool, its dependencies, the
requirements, matplotlib (the ``report`` extra) with ``html``, pytest with
``pytest_paths``, and nothing else. A requirement with a version specifier or a URL
(``jax==0.9.2``, ``flax>=0.12``) releases the pin of the package it names; a bare
name (``optax``) adds that package at this environment's version.

**jax and jaxlib are a pair.** A requirement for one that the other does not match
releases the other's pin too, and one pinned with ``==`` brings the other to the same
version: ``jax==0.9.2`` installs ``jaxlib==0.9.2``, ``jax==0.9.2+cpu`` ``jaxlib==0.9.2+cpu``.
Name both to choose each. Any other pin that conflicts (``flax 0.12.8 depends on
jax>=0.10.0``) stops the install, with the conflict in the one-line reason: name a
version of that package too, or pass ``resolve``, which turns the pin of every package
here that depends on a released one (flax, chex, optax, ... for jax) into an upper
bound, so that pip chooses the newest version no newer than this environment's that
admits the requirements (flax 0.12.6 for jax 0.9.2). The report names each version
it chose and the requirement that ruled out this environment's.

**This nnx-pool.** From a source checkout (:func:`~nnx_pool.regression.stamp.source_checkout`,
an editable install included), the files its build reads are copied to a temporary
directory, hashed as they are copied, and installed from there, so nothing is written
into the checkout. Installed from a wheel or an archive, it is installed from the URL
pip recorded (``direct_url.json``); installed from an index, as ``nnx-pool==<version>``
from the index. A cached environment is reinstalled (``--no-deps``) when that source
changed, and brought back to this environment's pins (``pip install`` again) when one
of them moved since it was built.

**The cache** (:func:`cache_root`) keeps one directory per requirement set
(:meth:`Plan.key`: the interpreter, the requirements, the extras, ``resolve``), and
the :data:`KEEP_DEFAULT` most recently used of them (:data:`KEEP_ENV` changes it);
:func:`clear_cache` empties it. A run holds its environment's lock
(:mod:`nnx_pool.regression.lock`) from before the build to the end of the run, so a
second rehearsal of the same set waits and then reuses it, and no clean-up removes an
environment in use.

**Never this environment.** Every subprocess runs the rehearsal environment's
interpreter, with ``PYTHONPATH``, ``PYTHONHOME`` and pip's ``--user``/``--target``/
``--prefix`` settings removed from its environment; this interpreter's environment is
only read.

Nothing here prints: :mod:`nnx_pool.regression.cli` renders the report, and
``progress`` is told of each step. The run's ``check`` and ``pytest`` write to this
process's stderr (tracebacks, the ``case n/N`` line on a terminal); ``pytest`` writes
its report to stdout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import venv
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as Pep508
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion

from nnx_pool.regression import lock, store
from nnx_pool.regression.report import Report
from nnx_pool.regression.stamp import git_revision, installed_versions, source_checkout, stamp_rows

SELF = "nnx-pool"
PAIRED = {"jax": "jaxlib", "jaxlib": "jax"}
# nnx_pool.regression.pytest_plugin.CHECK_ONLY_ENV (that module imports pytest).
CHECK_ONLY_ENV = "NNX_REGRESSION_CHECK_ONLY"
CACHE_ENV = "NNX_POOL_CACHE"
KEEP_ENV = "NNX_POOL_REHEARSE_KEEP"  # how many environments the cache keeps
KEEP_DEFAULT = 3  # about 750 MB each (docs/regression.md)
# What pyproject.toml's setuptools configuration reads to build nnx-pool.
SOURCE_FILES = ("pyproject.toml", "README.md", "nnx_pool", "regression")
# pytest's exit status -> (rehearse's exit code, what it means).
PYTEST_EXITS = {0: (0, "passed"), 1: (1, "tests failed"), 2: (2, "interrupted"),
                3: (2, "internal error"), 4: (2, "usage error"), 5: (2, "no tests collected")}
_LAYOUT = 2  # bump when an environment built by an older version can no longer be used
_KEY = re.compile(r"[0-9a-f]{16}\Z")  # a cache entry's name (Plan.key)
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_UNSET_ENV = ("PYTHONPATH", "PYTHONHOME", "PIP_USER", "PIP_TARGET", "PIP_PREFIX", "PIP_ROOT")
_ENV = "env"  # a cache entry's virtual environment
_USED = "last-used"  # a cache entry's file whose mtime is its last use
# In an environment: which nnx-pool is installed there (Source.digest) and its dependencies.
_SOURCE_STAMP = "nnx-pool-source.json"


class RehearsalError(Exception):
  """A rehearsal could not be planned or its environment built: exit code 2, one line."""


class StepProgress(Protocol):
  """The CLI's progress line: ``progress(n, total, what)``, and ``clear()``."""

  def __call__(self, n: int, total: int, what: str) -> None: ...

  def clear(self) -> None: ...


def normalise(name: str) -> str:
  """A distribution name as PEP 503 compares it (``ML_Dtypes`` -> ``ml-dtypes``)."""
  return canonicalize_name(name)


# ------------------------------------------------------------------ the plan


@dataclasses.dataclass(frozen=True)
class Requirement:
  """One requirement as the user gave it, parsed.

  Attributes:
    text: the requirement as pip reads it: the parsed one written back
      (``" jax == 0.9.2 "`` -> ``jax==0.9.2``).
    name: the normalised name it installs.
    versioned: whether it says which version (a specifier or a URL), releasing the pin.
    exact: the one version an ``==`` specifier names (no wildcard), else None.
  """

  text: str
  name: str
  versioned: bool
  exact: str | None

  @classmethod
  def parse(cls, text: str) -> Requirement:
    """Reads a PEP 508 requirement: ``jax==0.9.2``, ``jax[cuda12]>=0.9``, ``optax``, ``x @ URL``.

    Raises:
      RehearsalError: ``text`` is no PEP 508 requirement (one line naming it), or its
        marker excludes this interpreter.
    """
    try:
      req = Pep508(text)
    except InvalidRequirement as e:
      raise RehearsalError(_refusal(text, e)) from None
    if req.marker is not None and not req.marker.evaluate():
      raise RehearsalError(f"rehearse: {text!r} does not apply to this interpreter (its marker "
                           f"{str(req.marker)!r} is false here); leave the marker out.")
    specs = list(req.specifier)
    exact = (specs[0].version if len(specs) == 1 and specs[0].operator == "=="
             and not specs[0].version.endswith("*") else None)
    return cls(str(req), normalise(req.name), bool(specs) or req.url is not None, exact)


def _refusal(text: str, error: InvalidRequirement) -> str:
  """The one line refusing ``text``: what PEP 508 expected there, or how to name a path."""
  stripped = text.strip()
  location = (not stripped.startswith("-") and " " not in stripped
              and (_SCHEME.match(stripped) or "/" in stripped or "\\" in stripped
                   or stripped.endswith((".whl", ".zip", ".tar.gz"))))
  if location:
    url = stripped if _SCHEME.match(stripped) else Path(stripped).absolute().as_uri()
    return (f"rehearse: {text!r} is a path or URL without a name; name the package it "
            f"installs, as PEP 508 writes it: 'NAME @ {url}'.")
  reason = (str(error).splitlines() or ["empty"])[0]
  return (f"rehearse: {text!r} is not a requirement ({reason}); give one PEP 508 requirement "
          "per argument, a name, optional [extras], then a version specifier, e.g. jax==0.9.2 "
          "or 'flax>=0.12', and no pip options.")


def installed_pins(dists: Iterable[importlib.metadata.Distribution] | None = None,
                   ) -> dict[str, str]:
  """This interpreter's distributions as ``{normalised name: version}``, sorted by name.

  nnx-pool itself is left out, and so is anything installed from a path or URL (it
  has a ``direct_url.json``, editable or not). Where two copies of a distribution are
  on the path, the first one, the one imported, counts.

  Args:
    dists: the distributions (default: ``importlib.metadata.distributions()``).
  """
  pins = {}
  for name, dist in _first_copies(dists).items():
    if name != SELF and dist.read_text("direct_url.json") is None:
      pins[name] = dist.version
  return dict(sorted(pins.items()))


def installed_depends(dists: Iterable[importlib.metadata.Distribution] | None = None,
                      ) -> dict[str, tuple[str, ...]]:
  """What each distribution here requires (its ``Requires-Dist``), by normalised name."""
  return {name: tuple(dist.requires or ()) for name, dist in _first_copies(dists).items()}


def _first_copies(dists: Iterable[importlib.metadata.Distribution] | None,
                  ) -> dict[str, importlib.metadata.Distribution]:
  found: dict[str, importlib.metadata.Distribution] = {}
  for dist in importlib.metadata.distributions() if dists is None else dists:
    name = dist.metadata["Name"]
    if name:
      found.setdefault(normalise(name), dist)
  return found


def _dependencies(requires: Iterable[str]) -> dict[str, SpecifierSet]:
  """The ``Requires-Dist`` lines that apply here (no extra), by normalised name."""
  found = {}
  for line in requires:
    try:
      req = Pep508(line)
    except InvalidRequirement:
      continue
    if req.marker is None or req.marker.evaluate({"extra": ""}):
      found[normalise(req.name)] = req.specifier
  return found


def dependents(released: Collection[str], depends: Mapping[str, Sequence[str]]) -> set[str]:
  """Every package of ``depends`` that requires one of ``released``, directly or through others.

  Args:
    released: normalised names.
    depends: ``Requires-Dist`` lines by normalised name (:func:`installed_depends`).
  """
  found: set[str] = set()
  frontier = set(released)
  while frontier:
    frontier = {name for name, requires in depends.items()
                if name not in found and name not in released and name != SELF
                and frontier & set(_dependencies(requires))}
    found |= frontier
  return found


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a rehearsal environment holds (besides nnx-pool and its dependencies).

  Attributes:
    requirements: the user's requirements, then the paired jax or jaxlib they imply,
      then pytest with ``--pytest`` (unless named); each as pip reads it.
    changes: the user's requirements (what the report names).
    constraints: ``name==version`` of every distribution here whose pin no
      requirement released; ``name<=version`` for those ``resolve`` released.
    extras: nnx-pool's extras to install (``report`` for ``--html``).
    resolve: pip may choose older versions of the dependents (:func:`dependents`).
    resolved: those dependents, whose pins are upper bounds.
    requires: nnx-pool's declared requirements.
  """

  requirements: tuple[str, ...]
  changes: tuple[str, ...]
  constraints: tuple[str, ...]
  extras: tuple[str, ...]
  resolve: bool = False
  resolved: tuple[str, ...] = ()
  requires: tuple[str, ...] = ()

  def key(self) -> str:
    """The cache key: 16 hex digits of a SHA-256 over the interpreter and the requirement set.

    The requirement set is the requirements (in any order), the extras and ``resolve``;
    this environment's pins are not part of it (a cached environment is brought to
    them instead, see :func:`stale_pins`).
    """
    data = {
        "layout": _LAYOUT,
        "python": [sys.implementation.cache_tag, platform.python_version(), sys.base_prefix,
                   platform.machine()],
        "requirements": sorted(self.requirements),
        "extras": sorted(self.extras),
        "resolve": self.resolve,
    }
    return hashlib.sha256(store.canonical_json(data).encode()).hexdigest()[:16]


def make_plan(
    requirements: Sequence[str], *, pins: Mapping[str, str], requires: Sequence[str] = (),
    html: bool = False, pytest: bool = False, resolve: bool = False,
    depends: Mapping[str, Sequence[str]] | None = None,
) -> Plan:
  """Applies the requirements to this environment's pins (see the module docstring).

  Args:
    requirements: PEP 508 requirements, e.g. ``["jax==0.9.2", "jaxlib==0.9.2"]``.
    pins: this environment's versions (:func:`installed_pins`).
    requires: nnx-pool's declared requirements (:attr:`Source.requires`).
    html: install the ``report`` extra (matplotlib).
    pytest: install pytest.
    resolve: let pip choose older versions of the packages that depend on a released one.
    depends: with ``resolve``, what each package here requires (:func:`installed_depends`).

  Raises:
    RehearsalError: no requirement, a malformed one, or one naming nnx-pool.
  """
  if not requirements:
    raise RehearsalError("rehearse: name at least one requirement, e.g. jax==0.9.2.")
  parsed = [Requirement.parse(r) for r in requirements]
  for req in parsed:
    if req.name == SELF:
      raise RehearsalError(f"rehearse: {req.text!r} names nnx-pool, which the rehearsal "
                           "installs itself from this one; name its dependencies instead.")
  named = {r.name for r in parsed}
  released = {r.name for r in parsed if r.versioned}
  added = []
  for req in parsed:
    partner = PAIRED.get(req.name)
    if partner and req.versioned and partner not in named:
      released.add(partner)
      if req.exact:
        added.append(f"{partner}=={req.exact}")
        named.add(partner)
  if pytest and "pytest" not in named:
    added.append("pytest")
  resolved = dependents(released, depends or {}) & set(pins) if resolve else set()
  constraints = tuple(f"{name}{'<=' if name in resolved else '=='}{version}"
                      for name, version in sorted(pins.items()) if name not in released)
  return Plan(
      requirements=tuple(r.text for r in parsed) + tuple(added),
      changes=tuple(r.text for r in parsed),
      constraints=constraints,
      extras=("report",) if html else (),
      resolve=resolve,
      resolved=tuple(sorted(resolved)),
      requires=tuple(requires),
  )


# ------------------------------------------------------------- this nnx-pool


@dataclasses.dataclass(frozen=True)
class Snapshot:
  """nnx-pool as one install takes it: the pip requirement, and the digest of what it installs."""

  requirement: str
  digest: str


@dataclasses.dataclass(frozen=True)
class Source:
  """Where the rehearsal installs this nnx-pool from.

  Attributes:
    root: a source checkout, copied before each install; or None.
    url: else the URL pip installed it from (a wheel, an archive); or None.
    version: else the version to install from the index.
    requires: its declared requirements (extras included).
  """

  root: Path | None
  url: str | None
  version: str | None
  requires: tuple[str, ...]

  def files(self) -> list[Path]:
    """The files of a checkout that the build reads (:data:`SOURCE_FILES`)."""
    if self.root is None:
      return []
    files = []
    for name in SOURCE_FILES:
      path = self.root / name
      found = [path] if path.is_file() else sorted(path.rglob("*"))
      files += [p for p in found if p.is_file() and "__pycache__" not in p.parts]
    return files

  def digest(self) -> str:
    """What a cached environment compares with the nnx-pool it holds: the files, or the URL."""
    return self._hash((self._name(p), p.read_bytes()) for p in self.files())

  def snapshot(self, extras: Sequence[str], scratch: Path) -> Snapshot:
    """The pip requirement installing it with ``extras``, and the digest of what it installs.

    A checkout is copied under ``scratch`` and the digest taken from the bytes copied,
    so an edit made while pip installs the copy is not stamped onto it.
    """
    name = f"{SELF}[{','.join(extras)}]" if extras else SELF
    if self.root is None:
      return Snapshot(f"{name} @ {self.url}" if self.url else f"{name}=={self.version}",
                      self.digest())
    copy = scratch / "nnx-pool-source"
    shutil.rmtree(copy, ignore_errors=True)
    copied = []
    for path in self.files():
      data = path.read_bytes()
      target = copy / self._name(path)
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_bytes(data)
      copied.append((self._name(path), data))
    return Snapshot(f"{name} @ {copy.as_uri()}", self._hash(copied))

  def _name(self, path: Path) -> str:
    return path.relative_to(self.root).as_posix()

  def _hash(self, files: Iterable[tuple[str, bytes]]) -> str:
    h = hashlib.sha256(f"{self.url} {self.version}".encode())
    for name, data in files:
      h.update(name.encode() + b"\0")
      h.update(hashlib.sha256(data).digest())
    return h.hexdigest()


def this_source() -> Source:
  """Where this nnx-pool comes from: a checkout, the URL pip installed it from, or an index.

  Raises:
    RehearsalError: nnx-pool is neither a checkout nor installed.
  """
  root = source_checkout()
  if root is not None:
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    requires = [*project.get("dependencies", []),
                *(f"{r}; extra == {name!r}" for name, group in sorted(extras.items())
                  for r in group)]
    return Source(root, None, None, tuple(requires))
  try:
    dist = importlib.metadata.distribution(SELF)
  except importlib.metadata.PackageNotFoundError as e:
    raise RehearsalError("rehearse: nnx-pool is neither a source checkout nor an installed "
                         "distribution; install it with pip first.") from e
  direct = dist.read_text("direct_url.json")
  url = json.loads(direct).get("url") if direct else None
  return Source(None, url, dist.version, tuple(dist.requires or ()))


# ------------------------------------------------------------------ the cache


def cache_root() -> Path:
  """Where rehearsal environments are kept, one directory per :meth:`Plan.key`.

  ``$NNX_POOL_CACHE/rehearse`` when that is set, else ``$XDG_CACHE_HOME/nnx-pool/rehearse``,
  else ``~/.cache/nnx-pool/rehearse``. :func:`clear_cache` empties it.
  """
  if os.environ.get(CACHE_ENV):
    return Path(os.environ[CACHE_ENV]).expanduser().absolute() / "rehearse"
  base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
  return Path(base).expanduser().absolute() / "nnx-pool" / "rehearse"


def keep_count() -> int:
  """How many environments the cache keeps: ``$NNX_POOL_REHEARSE_KEEP``, else :data:`KEEP_DEFAULT`.

  Raises:
    RehearsalError: the variable is set to anything but a whole number of 1 or more.
  """
  text = os.environ.get(KEEP_ENV, "")
  if not text:
    return KEEP_DEFAULT
  try:
    keep = int(text)
  except ValueError:
    keep = 0
  if keep < 1:
    raise RehearsalError(
        f"rehearse: {KEEP_ENV} must be how many rehearsal environments to keep, a whole number "
        f"of 1 or more; got {text!r}. Unset it to keep {KEEP_DEFAULT}.")
  return keep


def shown(path: Path) -> str:
  """A path as a report shows it: ``~/…`` under the home directory."""
  home = Path.home()
  return f"~/{path.relative_to(home).as_posix()}" if path.is_relative_to(home) else str(path)


def _last_used(entry: Path) -> float:
  for path in (entry / _USED, entry):
    with contextlib.suppress(OSError):
      return path.stat().st_mtime
  return 0.0


def _entries(root: Path) -> list[Path]:
  """The cache's environments (directories named by a key), the most recently used first."""
  if not root.is_dir():
    return []
  found = [p for p in root.iterdir() if _KEY.match(p.name) and p.is_dir()]
  return sorted(found, key=_last_used, reverse=True)


def _size(path: Path) -> int:
  """The bytes of the files under ``path`` (links not followed)."""
  total = 0
  for where, _, names in os.walk(path):
    for name in names:
      with contextlib.suppress(OSError):
        total += os.lstat(os.path.join(where, name)).st_size
  return total


def _remove_entry(entry: Path) -> bool:
  """Removes a cache entry unless a rehearsal holds it; whether it was removed."""
  try:
    held = lock.exclusive(entry, timeout_s=0)
  except (lock.Busy, FileNotFoundError):  # in use, or removed meanwhile
    return False
  with held:
    for child in entry.iterdir():
      if child.is_dir() and not child.is_symlink():
        shutil.rmtree(child)
      elif child.name != lock.LOCK_FILE:
        child.unlink()
    with contextlib.suppress(OSError):
      os.rmdir(entry)  # POSIX: at once, under the lock (a waiter then finds it gone)
  with contextlib.suppress(OSError):  # Windows: the lock file, once released, then the directory
    (entry / lock.LOCK_FILE).unlink(missing_ok=True)
    os.rmdir(entry)
  return True


def prune(root: Path, keep: int, current: str | None = None) -> list[str]:
  """Removes all but the ``keep`` most recently used environments (and ``current``).

  An environment a rehearsal holds is left, however old. Returns the names removed.
  """
  entries = _entries(root)
  entries.sort(key=lambda p: p.name != current)  # stable: `current` first, then by last use
  return [e.name for e in entries[keep:] if _remove_entry(e)]


@dataclasses.dataclass(frozen=True)
class Cleared:
  """What :func:`clear_cache` did: entries removed, their bytes, entries in use and left."""

  root: Path
  removed: list[str]
  freed: int
  busy: list[str]


def clear_cache(root: Path | None = None) -> Cleared:
  """Removes every cached environment that no rehearsal holds, and any unfinished build."""
  root = cache_root() if root is None else root
  removed, freed, busy = [], 0, []
  for entry in _entries(root):
    size = _size(entry)
    if _remove_entry(entry):
      removed.append(entry.name)
      freed += size
    else:
      busy.append(entry.name)
  for leftover in root.glob(".tmp-*") if root.is_dir() else ():  # builds of an older layout
    freed += _size(leftover)
    shutil.rmtree(leftover, ignore_errors=True)
  return Cleared(root, removed, freed, busy)


def _take(entry: Path, waiting: Callable[[], None]) -> lock.Held:
  """The lock of a cache entry, created where missing; waits for another rehearsal using it."""
  for _ in range(3):
    entry.mkdir(parents=True, exist_ok=True)
    try:
      return lock.exclusive(entry, waiting=waiting)
    except FileNotFoundError:  # lock.Gone too: a clean-up removed it meanwhile; make it again
      continue
  raise RehearsalError(f"rehearse: the cache entry {shown(entry)} was removed three times while "
                       "this rehearsal waited for it (rehearse --clear-cache running?); "
                       "run it again.")


# ----------------------------------------------------------- pip's messages


def pip_failure(output: str, requirements: Sequence[str], pins: Mapping[str, str], *,
                resolve: bool = False) -> str:
  """The one line that says why pip failed, naming the requirement it could not install.

  Args:
    output: pip's stdout and stderr.
    requirements: what the user asked for.
    pins: this environment's versions, to say when one of them is in the way.
    resolve: whether ``--resolve`` was given (else a dependent in the way suggests it).
  """
  lines = [line.strip() for line in output.splitlines()]
  errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR: ")]
  causes: list[str] = []
  if "The conflict is caused by:" in lines:
    for line in lines[lines.index("The conflict is caused by:") + 1:]:
      if not line:
        break
      causes.append(line)
  missing = [e for e in errors if e.startswith("No matching distribution found")]
  if causes:
    reason = _conflict(causes, pins, resolve)
  elif missing:
    reason = missing[-1]
  elif errors:
    useful = [e for e in errors if not e.startswith("ResolutionImpossible")]
    reason = (useful or errors)[-1]
  else:
    reason = next((line for line in reversed(lines) if line), "pip failed without a message")
  reason = re.sub(r"\s*\(from versions: [^)]*\)", "", " ".join(reason.split()))
  mentioned = {normalise(t) for t in _TOKEN.findall(reason)}
  which = [r for r in requirements if Requirement.parse(r).name in mentioned or r in reason]
  if not which:
    which = [SELF] if SELF in mentioned or "nnx_pool" in reason else list(requirements)
  return f"rehearse: pip could not install {' '.join(which)}: {reason}"


def _conflict(causes: Sequence[str], pins: Mapping[str, str], resolve: bool) -> str:
  """pip's "The conflict is caused by" lines, less those that are not the conflict, with hints."""
  requested = dict(re.findall(r"^The user requested ([A-Za-z0-9._-]+)==(\S+)$",
                              "\n".join(causes), re.M))
  parts, hints = [], []
  for cause in causes:
    depends = re.match(r"(\S+) (\S+) depends on ([A-Za-z0-9._-]+)(\[[^\]]*\])?(\S*)$", cause)
    pinned = re.match(r"The user requested \(constraint\) ([A-Za-z0-9._-]+)==(\S+)", cause)
    if cause.startswith("The user requested") and not pinned:
      continue  # what the user asked for, said again
    if depends and _admits(depends.group(5), requested.get(depends.group(3))):
      continue  # a dependent that accepts the requested version is not the conflict
    parts.append(cause)
    if depends and pins.get(normalise(depends.group(1))) == depends.group(2):
      name, version = depends.group(1), depends.group(2)
      hints.append(f"{name} {version} is this environment's version; name a {name} version "
                   + ("too" if resolve else "too, or pass --resolve to let pip choose one"))
    elif pinned:
      hints.append(f"{pinned.group(1)} {pinned.group(2)} is this environment's version; "
                   f"name a {pinned.group(1)} version too")
  return "; ".join(parts) + (f" ({'; '.join(hints)})" if hints else "")


def _admits(spec: str | SpecifierSet, version: str | None) -> bool:
  """Whether a specifier (``>=0.7.0,<0.11``) admits ``version``; False if either is unreadable."""
  try:
    return version is not None and SpecifierSet(str(spec)).contains(version, prereleases=True)
  except (InvalidSpecifier, InvalidVersion):
    return False


def combined_exit(check: int, pytest: int | None) -> int:
  """rehearse's exit code: the worse of ``check``'s and ``pytest``'s (see :data:`PYTEST_EXITS`)."""
  if pytest is None:
    return check
  return max(check, PYTEST_EXITS.get(pytest, (2, ""))[0])


def rehearsal_changes(old: Mapping[str, Any], new: Mapping[str, Any],
                      here: Mapping[str, str | None]) -> list[str]:
  """:func:`~nnx_pool.regression.stamp.stamp_changes`, each version the rehearsal changed marked.

  Args:
    old: the baseline's stamp.
    new: the rehearsal's stamp.
    here: this environment's versions (:func:`~nnx_pool.regression.stamp.installed_versions`).

  Returns:
    Lines like ``jax 0.10.2 -> 0.9.2 (rehearsal)``; a change the rehearsal did not make
    (the baseline was recorded elsewhere) is not marked.
  """
  versions = new.get("versions") or {}
  lines = []
  for label, before, after, changed in stamp_rows(old, new):
    if changed:
      ours = label in versions and versions[label] != here.get(label)
      lines.append(f"{label} {before} -> {after}" + (" (rehearsal)" if ours else ""))
  return lines


def resolved_notes(plan: Plan, there: Mapping[str, str], pins: Mapping[str, str],
                   depends: Mapping[str, Sequence[str]]) -> list[str]:
  """What ``--resolve`` chose, and why: each dependent whose version differs from this one's.

  Args:
    plan: the plan (its ``resolved`` dependents).
    there: the rehearsal environment's versions (:func:`environment_versions`).
    pins: this environment's versions.
    depends: what each package here requires (:func:`installed_depends`).
  """
  if not plan.resolve:
    return []
  notes = []
  for name in plan.resolved:
    chosen, here = there.get(name), pins.get(name)
    if chosen is None or chosen == here:
      continue
    why = next((f"{name} {here}, this environment's, requires {dep}{spec}, which excludes "
                f"{dep} {there[dep]}" for dep, spec in _dependencies(depends.get(name, ())).items()
                if dep in there and not _admits(spec, there[dep])),
               f"the newest {name} no newer than this environment's {here} that pip could "
               "install with the requirements")
    notes.append(f"rehearsal: --resolve chose {name} {chosen} ({why})")
  return notes or ["rehearsal: --resolve kept every dependent at this environment's version"]


# --------------------------------------------------------- the environment


def _python(env: Path) -> Path:
  return env / ("Scripts" if os.name == "nt" else "bin") / ("python.exe" if os.name == "nt"
                                                            else "python")


def _site_packages(env: Path) -> list[Path]:
  return [*env.glob("lib/python*/site-packages"), *env.glob("Lib/site-packages")]


def environment_versions(env: Path) -> dict[str, str]:
  """The distributions installed in the rehearsal environment ``env``, by normalised name."""
  dists = importlib.metadata.distributions(path=[str(p) for p in _site_packages(env)])
  return {name: dist.version for name, dist in _first_copies(dists).items()}


def stale_pins(there: Mapping[str, str], constraints: Iterable[str]) -> list[str]:
  """Each installed version a constraint no longer admits: ``numpy 2.4.5 -> 2.4.6``.

  Args:
    there: the environment's versions (:func:`environment_versions`).
    constraints: the plan's constraints (this environment's pins now).
  """
  stale = []
  for line in constraints:
    try:
      req = Pep508(line)
    except InvalidRequirement:  # a version PEP 440 cannot read: pip will say so
      continue
    have = there.get(normalise(req.name))
    if have is not None and not _admits(req.specifier, have):
      stale.append(f"{normalise(req.name)} {have} -> {str(req.specifier).removeprefix('==')}")
  return stale


def _environ(env: Path) -> dict[str, str]:
  """The environment variables of a subprocess in the rehearsal environment ``env``."""
  environ = {k: v for k, v in os.environ.items() if k not in _UNSET_ENV}
  environ["VIRTUAL_ENV"] = str(env)
  environ["PATH"] = os.pathsep.join([str(_python(env).parent), environ.get("PATH", "")])
  environ["PYTHONNOUSERSITE"] = "1"
  return environ


def _pip(env: Path, args: Sequence[str], *, on_line: Callable[[str], None]) -> tuple[int, str]:
  """Runs the environment's own pip: its exit status and output (each line to ``on_line``)."""
  command = [str(_python(env)), "-m", "pip", *args, "--disable-pip-version-check",
             "--no-input", "--progress-bar", "off"]
  lines = []
  with subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, env=_environ(env)) as proc:
    for line in proc.stdout or ():
      lines.append(line)
      if line.strip() and not line.startswith("WARNING"):
        on_line(line.strip())
  return proc.returncode, "".join(lines)


@dataclasses.dataclass
class _Steps:
  """Numbers the steps on the progress line (``rehearse: step 2/3 installing ...``)."""

  progress: StepProgress | None
  total: int
  n: int = 0

  def next(self, what: str) -> None:
    self.n += 1
    self.show(what)

  def show(self, what: str) -> None:
    if self.progress is not None:
      self.progress(self.n, self.total, what)

  def clear(self) -> None:
    if self.progress is not None:
      self.progress.clear()


@dataclasses.dataclass(frozen=True)
class _Job:
  """What building or updating an environment needs, besides the environment."""

  plan: Plan
  source: Source
  scratch: Path
  steps: _Steps
  pins: Mapping[str, str]


def _read_stamp(env: Path) -> dict[str, Any]:
  with contextlib.suppress(OSError, ValueError):
    stamp = json.loads((env / _SOURCE_STAMP).read_text())
    if isinstance(stamp, dict):
      return stamp
  return {}


def _write_stamp(env: Path, digest: str | None, requires: Sequence[str]) -> None:
  stamp = {"source": digest, "requires": sorted(requires)}
  store.write_atomic(env / _SOURCE_STAMP, store.canonical_json(stamp).encode())


def _install(env: Path, job: _Job, what: str) -> None:
  """``pip install`` of the plan and nnx-pool, under the constraints; stamps what it installed."""
  plan = job.plan
  constraints, requirements = env / "rehearsal-constraints.txt", env / "rehearsal-requirements.txt"
  store.write_atomic(constraints, "".join(f"{c}\n" for c in plan.constraints).encode())
  store.write_atomic(requirements, "".join(f"{r}\n" for r in plan.requirements).encode())
  snapshot = job.source.snapshot(plan.extras, job.scratch)  # hashed once, before pip runs
  job.steps.next(what)
  code, output = _pip(env, ["install", "-c", str(constraints), "-r", str(requirements),
                            snapshot.requirement],
                      on_line=lambda line: job.steps.show(f"pip: {line}"))
  if code:
    raise RehearsalError(pip_failure(output, plan.changes, job.pins, resolve=plan.resolve))
  _write_stamp(env, snapshot.digest, job.source.requires)


def _build(env: Path, job: _Job) -> None:
  """Creates the environment at ``env`` and installs the plan there; raises RehearsalError."""
  job.steps.next("creating a virtual environment (python -m venv)")
  try:
    venv.EnvBuilder(with_pip=True, symlinks=os.name != "nt").create(env)
  except (OSError, subprocess.CalledProcessError) as e:
    raise RehearsalError(f"rehearse: could not create a virtual environment with pip in "
                         f"{shown(env)} ({e}).") from e
  _install(env, job, f"installing {' '.join(job.plan.requirements)} and nnx-pool (pip)")


def _outdated(env: Path, job: _Job) -> tuple[list[str], bool]:
  """What a cached environment lacks: pins that moved here (or new dependencies), a new nnx-pool."""
  stamp = _read_stamp(env)
  moved = stale_pins(environment_versions(env), job.plan.constraints)
  if stamp.get("requires") != sorted(job.source.requires):
    moved.append("nnx-pool's dependencies")
  return moved, stamp.get("source") != job.source.digest()


def _update(env: Path, job: _Job, moved: Sequence[str], changed: bool) -> None:
  """Brings a cached environment to this environment's pins and this nnx-pool."""
  if moved:
    _install(env, job, f"updating {', '.join(moved)} to this environment's versions (pip)")
  if not changed:
    return
  job.steps.next("reinstalling nnx-pool, changed since the environment was built (pip --no-deps)")
  snapshot = job.source.snapshot(job.plan.extras, job.scratch)
  code, output = _pip(env, ["install", "--no-deps", "--force-reinstall", snapshot.requirement],
                      on_line=lambda line: job.steps.show(f"pip: {line}"))
  if code:
    raise RehearsalError(pip_failure(output, [SELF], job.pins))
  _write_stamp(env, snapshot.digest, job.source.requires)


def _prepare(entry: Path, job: _Job, then: int) -> str:
  """Makes ``entry``'s environment ready, under its lock; says how (built, updated, reused).

  ``then``: the steps that follow (check, pytest), for the progress line's total.
  """
  env = entry / _ENV
  started = time.monotonic()
  if (env / "pyvenv.cfg").is_file():
    moved, changed = _outdated(env, job)
    job.steps.total = bool(moved) + changed + then
    _update(env, job, moved, changed)
    return f"updated in {time.monotonic() - started:.0f} s" if moved or changed else "reused"
  job.steps.total = 2 + then
  for unfinished in entry.glob(".tmp-*"):  # a build killed before it was renamed into place
    shutil.rmtree(unfinished, ignore_errors=True)
  build = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry))
  try:
    _build(build, job)
    os.rename(build, env)  # the commit: a half-built environment is never at `env`
  except BaseException:
    shutil.rmtree(build, ignore_errors=True)
    raise
  return f"built in {time.monotonic() - started:.0f} s"


def _check(env: Path, baseline: Path, json_path: Path, *, pattern: str | None, dry_run: bool,
           html: Path | None, scratch: Path) -> int:
  """Runs ``check`` in the environment; its stdout (the table) is dropped, its stderr shown."""
  command = [str(_python(env)), "-P", "-m", "nnx_pool.regression", "check",
             "--baseline", str(baseline), "--json", str(json_path)]
  if pattern is not None:
    command += ["-k", pattern]
  if dry_run:
    command.append("--dry-run")
  if html is not None:
    command += ["--html", str(html)]
  # cwd: a scratch directory, so that no nnx_pool/ in the caller's directory shadows the
  # installed one (-P keeps the directory off sys.path too).
  return subprocess.run(command, cwd=scratch, env=_environ(env), stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, check=False).returncode


# The user's `python -m pytest`, run by `python -c` so that sys.path is the same (their
# directory first), with a guard: `import nnx_pool` must find the rehearsed nnx-pool, before
# pytest starts (a nnx_pool/ in their directory) and after it ends (one a conftest found).
# A foreign one is written to the file named by $NNX_POOL_REHEARSE_FOREIGN, and exits 4.
PYTEST_MAIN = """\
import importlib.util, os, sys
def foreign(origin):
  where = os.path.dirname(os.path.realpath(origin)) if origin else "nowhere"
  return where != os.path.realpath(os.environ["NNX_POOL_REHEARSED"]) and where
def refuse(where):
  report = os.environ["NNX_POOL_REHEARSE_FOREIGN"]
  with open(report + ".tmp", "w") as f:
    f.write(where)
  os.replace(report + ".tmp", report)
  sys.exit(4)
spec = importlib.util.find_spec("nnx_pool")
if foreign(spec and spec.origin):
  refuse(foreign(spec and spec.origin))
import pytest
code = pytest.main()  # the arguments after -c's code, as `python -m pytest ARGS` reads them
module = sys.modules.get("nnx_pool")
if module is not None and foreign(module.__file__):
  refuse(foreign(module.__file__))
sys.exit(int(code))
"""


def rehearsed_package(env: Path) -> Path:
  """The directory ``import nnx_pool`` must find in the rehearsal environment ``env``."""
  return ([*_site_packages(env), env][0]) / "nnx_pool"


def _pytest(env: Path, paths: Sequence[str], *, rehearsed: Path, foreign: Path) -> int:
  """Runs the user's tests in the environment, in their directory, comparing only.

  Args:
    env: the rehearsal environment.
    paths: pytest's arguments.
    rehearsed: the nnx_pool package the tests must import (:func:`rehearsed_package`).
    foreign: where the guard writes the nnx_pool they found instead, if any.
  """
  command = [str(_python(env)), "-c", PYTEST_MAIN, "-p", "no:cacheprovider", *paths]
  environ = {**_environ(env), CHECK_ONLY_ENV: "1", "NNX_POOL_REHEARSED": str(rehearsed),
             "NNX_POOL_REHEARSE_FOREIGN": str(foreign)}
  return subprocess.run(command, env=environ, stdin=subprocess.DEVNULL, check=False).returncode


def _foreign_error(foreign: Path, rehearsed: Path) -> str | None:
  """The one line refusing a pytest run that imported another nnx_pool; None if it did not."""
  try:
    where = foreign.read_text()
  except FileNotFoundError:
    return None
  return (f"rehearse: pytest would import nnx_pool from {where}, not the rehearsed one "
          f"({shown(rehearsed)}), so its results would not be the rehearsal's; a nnx_pool "
          f"package in {os.getcwd()} (or a path your conftest adds) comes first. Run rehearse "
          "--pytest from a directory without one.")


@dataclasses.dataclass
class _Outcome:
  """What ran in the environment: check's exit code and report, pytest's status, and where."""

  code: int
  json_path: Path
  there: dict[str, str]  # the environment's versions
  tested: int | None = None
  error: str | None = None
  where: str = ""


def _run_there(env: Path, job: _Job, run: _Run) -> _Outcome:
  """Runs check, then the user's tests, in the environment."""
  job.steps.next("running check")
  job.steps.clear()  # check draws its own case n/N line
  json_path = job.scratch / "check.json"
  code = _check(env, run.baseline, json_path, pattern=run.pattern, dry_run=run.dry_run,
                html=run.html, scratch=job.scratch)
  outcome = _Outcome(code, json_path, environment_versions(env))
  if run.pytest_paths:
    job.steps.next(f"running pytest {' '.join(run.pytest_paths)}")
    job.steps.clear()
    rehearsed, foreign = rehearsed_package(env), job.scratch / "foreign-nnx-pool.txt"
    outcome.tested = _pytest(env, run.pytest_paths, rehearsed=rehearsed, foreign=foreign)
    outcome.error = _foreign_error(foreign, rehearsed)
  return outcome


def rehearse(
    requirements: Sequence[str],
    *,
    baseline: str | os.PathLike,
    pattern: str | None = None,
    dry_run: bool = False,
    html: str | os.PathLike | None = None,
    pytest_paths: Sequence[str] = (),
    cache: bool = True,
    resolve: bool = False,
    progress: StepProgress | None = None,
) -> Report:
  """Runs ``check`` (and the user's tests) in an environment changed by ``requirements``.

  Args:
    requirements: PEP 508 requirements applied over this environment's versions.
    baseline: the baseline to compare with (a directory here).
    pattern: ``check -k``: only the cases it selects.
    dry_run: ``check --dry-run``: report drift, exit 0.
    html: ``check --html``: the page to write (the ``report`` extra is installed there).
    pytest_paths: also run ``python -m pytest`` on these there, comparing only.
    cache: keep the environment under :func:`cache_root` and reuse it; False builds a
      throwaway one and removes it.
    resolve: let pip choose older versions of the packages that depend on a released one.
    progress: the CLI's progress line, told of each step.

  Returns:
    The report of ``check``, its version changes marked ``(rehearsal)``, with notes
    naming the environment, what ``resolve`` chose, and pytest's outcome. Exit code:
    :func:`combined_exit` of ``check``'s and pytest's; 2 with a one-line ``error`` when
    the requirements are malformed, pip cannot install them, ``check`` ran without
    writing a report, or the tests imported another nnx_pool.
  """
  try:
    source = this_source()
    pins = installed_pins()
    depends = installed_depends() if resolve else {}
    plan = make_plan(requirements, pins=pins, requires=source.requires, html=html is not None,
                     pytest=bool(pytest_paths), resolve=resolve, depends=depends)
    keep = keep_count() if cache else 0
  except RehearsalError as e:
    return Report(command="check", exit_code=2, error=str(e))
  here = installed_versions()
  # The checkout's revision now, as the copy installed below is taken (None from a wheel).
  git = git_revision(source.root) if source.root is not None else None
  run = _Run(Path(baseline).absolute(), pattern, dry_run,
             None if html is None else Path(html).absolute(), tuple(pytest_paths))
  with tempfile.TemporaryDirectory(prefix="nnx-pool-rehearse-") as tmp:
    job = _Job(plan, source, Path(tmp), _Steps(progress, 2 + run.then()), pins)
    try:
      outcome = _in_cache(job, run) if cache else _in_throwaway(job, run)
    except RehearsalError as e:
      return Report(command="check", exit_code=2, error=str(e))
    report = _report(outcome.json_path, outcome.code, here, git)
  report.baseline = str(baseline)
  others = ("everything else at this environment's versions, or older where --resolve chose"
            if resolve else "everything else at this environment's versions")
  report.notes.append(f"rehearsal: check ran in a separate environment with "
                      f"{' '.join(plan.changes)}, {others}; {outcome.where}")
  report.notes += resolved_notes(plan, outcome.there, pins, depends)
  if cache:
    removed = prune(cache_root(), keep, plan.key())
    if removed:
      report.notes.append(f"rehearsal: removed {len(removed)} cached environment(s) used least "
                          f"recently, keeping {keep} ({KEEP_ENV} changes it)")
  return _fold_pytest(report, outcome, pytest_paths)


@dataclasses.dataclass(frozen=True)
class _Run:
  """What runs in the environment: check's options, and pytest's arguments."""

  baseline: Path
  pattern: str | None
  dry_run: bool
  html: Path | None
  pytest_paths: tuple[str, ...]

  def then(self) -> int:
    """The steps that follow the environment's set-up: check, and pytest."""
    return 1 + bool(self.pytest_paths)


def _in_cache(job: _Job, run: _Run) -> _Outcome:
  """Runs in the cached environment of the plan, built or brought up to date first."""
  entry = cache_root() / job.plan.key()
  env = entry / _ENV

  def waiting() -> None:
    job.steps.show("waiting for another rehearsal using this environment")

  try:
    with _take(entry, waiting):
      how = _prepare(entry, job, run.then())
      store.write_atomic(entry / _USED, f"{time.time():.0f}\n".encode())
      outcome = _run_there(env, job, run)
  except BaseException:
    with contextlib.suppress(OSError):
      entry.rmdir()  # only if a failed build left it empty
    raise
  outcome.where = f"environment {shown(env)} ({how})"
  return outcome


def _in_throwaway(job: _Job, run: _Run) -> _Outcome:
  """Runs in an environment built in the scratch directory, removed with it."""
  env = job.scratch / _ENV
  started = time.monotonic()
  _build(env, job)
  built = time.monotonic() - started
  outcome = _run_there(env, job, run)
  outcome.where = f"a throwaway environment, built in {built:.0f} s and removed"
  return outcome


def _fold_pytest(report: Report, outcome: _Outcome, pytest_paths: Sequence[str]) -> Report:
  """pytest's outcome in the report's notes, error and exit code."""
  tested = outcome.tested
  if tested is not None:
    meaning = PYTEST_EXITS.get(tested, (2, "an unknown status"))[1]
    text = f"pytest {' '.join(pytest_paths)} exited {tested} ({meaning}), comparing only"
    report.notes.append(f"rehearsal: {text}")
    if outcome.error:
      report.error = outcome.error + (f"; {report.error}" if report.error else "")
    elif report.error:
      report.error += f"; {text}"
  code = outcome.code
  report.exit_code = combined_exit(code if report.error is None else code or 2, tested)
  if outcome.error:
    report.exit_code = 2
  return report


def _report(json_path: Path, code: int, here: Mapping[str, str | None],
            git: dict[str, Any] | None) -> Report:
  """The child's report, its stamp's git that of the checkout installed, its changes marked."""
  try:
    report = Report.from_json(json.loads(json_path.read_text()))
  except (OSError, ValueError, KeyError, TypeError):
    return Report(command="check", exit_code=code or 2, error=(
        f"rehearse: check in the rehearsal environment exited {code} without a readable "
        "report; its messages above say why."))
  if report.stamp and git is not None and not (report.stamp.get("git") or {}).get("revision"):
    report.stamp["git"] = git  # the code installed there is this checkout's
  if report.stamp and report.baseline_stamp:
    report.stamp_changes = rehearsal_changes(report.baseline_stamp, report.stamp, here)
  return report
