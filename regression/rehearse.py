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
4. with ``pytest_paths``, runs ``python -m pytest PATHS`` there too, with
   ``NNX_REGRESSION_CHECK_ONLY=1``, so the ``nnx_regression`` fixture compares with the
   recorded baselines and never writes one.

**Pins.** Every distribution of this interpreter (``importlib.metadata``) becomes a
``name==version`` line of a pip constraints file, except nnx-pool itself and anything
installed from a path or URL (editable or not), which no version names. Constraints
only bound what gets installed: the environment holds nnx-pool, its dependencies, the
requirements, matplotlib (the ``report`` extra) with ``html``, pytest with
``pytest_paths``, and nothing else. A requirement with a version specifier or a URL
(``jax==0.9.2``, ``flax>=0.12``) releases the pin of the package it names; a bare
name (``optax``) adds that package at this environment's version. Requirements given
as a path or URL without a name release nothing.

**jax and jaxlib are a pair.** A requirement for one that the other does not match
releases the other's pin too, and one pinned with ``==`` brings the other to the same
version: ``jax==0.9.2`` installs ``jaxlib==0.9.2``. Name both to choose each. Any other
pin that conflicts (``flax 0.12.8 depends on jax>=0.10.0``) stops the install, with
the conflict in the one-line reason: name a version of that package too.

**This nnx-pool.** From a source checkout (:func:`~nnx_pool.regression.stamp.source_checkout`,
an editable install included), the files its build reads are copied to a temporary
directory and installed from there, so nothing is written into the checkout. Installed
from a wheel or an archive, it is installed from the URL pip recorded
(``direct_url.json``); installed from an index, as ``nnx-pool==<version>`` from the
index. A cached environment is reinstalled (``--no-deps``) when that source changed.

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
import fcntl
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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from nnx_pool.regression import store
from nnx_pool.regression.report import Report
from nnx_pool.regression.stamp import git_revision, installed_versions, source_checkout, stamp_rows

SELF = "nnx-pool"
PAIRED = {"jax": "jaxlib", "jaxlib": "jax"}
# nnx_pool.regression.pytest_plugin.CHECK_ONLY_ENV (that module imports pytest).
CHECK_ONLY_ENV = "NNX_REGRESSION_CHECK_ONLY"
CACHE_ENV = "NNX_POOL_CACHE"
# What pyproject.toml's setuptools configuration reads to build nnx-pool.
SOURCE_FILES = ("pyproject.toml", "README.md", "nnx_pool", "regression")
# pytest's exit status -> (rehearse's exit code, what it means).
PYTEST_EXITS = {0: (0, "passed"), 1: (1, "tests failed"), 2: (2, "interrupted"),
                3: (2, "internal error"), 4: (2, "usage error"), 5: (2, "no tests collected")}
_LAYOUT = 1  # bump when an environment built by an older version can no longer be used
_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?\s*(.*)\Z")
_EXACT = re.compile(r"==\s*([0-9][0-9A-Za-z.+!_-]*)\Z")  # one exact version, no wildcard
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_UNSET_ENV = ("PYTHONPATH", "PYTHONHOME", "PIP_USER", "PIP_TARGET", "PIP_PREFIX", "PIP_ROOT")


class RehearsalError(Exception):
  """A rehearsal could not be planned or its environment built: exit code 2, one line."""


class StepProgress(Protocol):
  """The CLI's progress line: ``progress(n, total, what)``, and ``clear()``."""

  def __call__(self, n: int, total: int, what: str) -> None: ...

  def clear(self) -> None: ...


def normalise(name: str) -> str:
  """A distribution name as PEP 503 compares it (``ML_Dtypes`` -> ``ml-dtypes``)."""
  return re.sub(r"[-_.]+", "-", name).lower()


@dataclasses.dataclass(frozen=True)
class Requirement:
  """One requirement as the user gave it.

  Attributes:
    text: the requirement, as pip reads it.
    name: the normalised name it installs; None for a bare path or URL.
    versioned: whether it says which version (a specifier or a URL), releasing the pin.
    exact: the one version an ``==`` specifier names, else None.
  """

  text: str
  name: str | None
  versioned: bool
  exact: str | None

  @classmethod
  def parse(cls, text: str) -> Requirement:
    """Reads ``jax==0.9.2``, ``jax[cuda12]>=0.9``, ``optax``, ``x @ URL``, ``./pkg``.

    Raises:
      RehearsalError: ``text`` is empty, an option, spans lines, or is no requirement.
    """
    stripped = text.strip()
    if not stripped or stripped.startswith("-") or "\n" in text or "\r" in text:
      raise RehearsalError(
          f"rehearse: {text!r} is not a requirement; give one per argument, e.g. jax==0.9.2.")
    match = _NAME.match(stripped)
    rest = match.group(3) if match else ""
    if match and (not rest or rest[0] in "<>=!~@;("):
      spec = rest.split(";")[0].strip()
      exact = _EXACT.match(spec.strip("()"))
      return cls(stripped, normalise(match.group(1)), bool(spec), exact and exact.group(1))
    if "/" in stripped or "\\" in stripped or stripped.endswith((".whl", ".zip", ".tar.gz")):
      return cls(stripped, None, True, None)
    raise RehearsalError(
        f"rehearse: {text!r} is not a requirement (a name, optional [extras], then a version "
        "specifier, e.g. jax==0.9.2 or 'flax>=0.12').")


def installed_pins(dists: Iterable[importlib.metadata.Distribution] | None = None,
                   ) -> dict[str, str]:
  """This interpreter's distributions as ``{normalised name: version}``, sorted by name.

  nnx-pool itself is left out, and so is anything installed from a path or URL (it
  has a ``direct_url.json``, editable or not). Where two copies of a distribution are
  on the path, the first one, the one imported, counts.

  Args:
    dists: the distributions (default: ``importlib.metadata.distributions()``).
  """
  seen: set[str] = set()
  pins: dict[str, str] = {}
  for dist in importlib.metadata.distributions() if dists is None else dists:
    name = dist.metadata["Name"]
    if not name or normalise(name) in seen:
      continue
    seen.add(normalise(name))
    if normalise(name) != SELF and dist.read_text("direct_url.json") is None:
      pins[normalise(name)] = dist.version
  return dict(sorted(pins.items()))


@dataclasses.dataclass(frozen=True)
class Source:
  """Where the rehearsal installs this nnx-pool from.

  Attributes:
    root: a source checkout, copied before each install; or None.
    url: else the URL pip installed it from (a wheel, an archive); or None.
    version: else the version to install from the index.
    requires: its declared requirements (extras included), part of the cache key.
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
    h = hashlib.sha256(f"{self.url} {self.version}".encode())
    for path in self.files():
      h.update(path.relative_to(self.root).as_posix().encode() + b"\0")
      h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()

  def requirement(self, extras: Sequence[str], scratch: Path) -> str:
    """The pip requirement installing it with ``extras``; a checkout is copied under ``scratch``."""
    name = f"{SELF}[{','.join(extras)}]" if extras else SELF
    url = self.url
    if self.root is not None:
      copy = scratch / "nnx-pool-source"
      shutil.rmtree(copy, ignore_errors=True)
      for path in self.files():
        target = copy / path.relative_to(self.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
      url = copy.as_uri()
    return f"{name} @ {url}" if url else f"{name}=={self.version}"


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


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a rehearsal environment holds (besides nnx-pool and its dependencies).

  Attributes:
    requirements: the user's requirements, then the paired jax or jaxlib they imply,
      then pytest with ``--pytest`` (unless named).
    changes: the requirements as given (what the report names).
    constraints: ``name==version`` of every distribution here whose pin no
      requirement released.
    extras: nnx-pool's extras to install (``report`` for ``--html``).
    requires: nnx-pool's declared requirements.
  """

  requirements: tuple[str, ...]
  changes: tuple[str, ...]
  constraints: tuple[str, ...]
  extras: tuple[str, ...]
  requires: tuple[str, ...]

  def key(self) -> str:
    """The cache key: 16 hex digits of a SHA-256 over the interpreter, pins and requirements.

    The order of the requirements and of the pins does not matter.
    """
    data = {
        "layout": _LAYOUT,
        "python": [sys.implementation.cache_tag, platform.python_version(), sys.base_prefix,
                   platform.machine()],
        "requirements": sorted(self.requirements),
        "constraints": sorted(self.constraints),
        "extras": sorted(self.extras),
        "requires": sorted(self.requires),
    }
    return hashlib.sha256(store.canonical_json(data).encode()).hexdigest()[:16]


def make_plan(
    requirements: Sequence[str], *, pins: Mapping[str, str], requires: Sequence[str] = (),
    html: bool = False, pytest: bool = False,
) -> Plan:
  """Applies the requirements to this environment's pins (see the module docstring).

  Args:
    requirements: pip requirements, e.g. ``["jax==0.9.2", "jaxlib==0.9.2"]``.
    pins: this environment's versions (:func:`installed_pins`).
    requires: nnx-pool's declared requirements (:attr:`Source.requires`).
    html: install the ``report`` extra (matplotlib).
    pytest: install pytest.

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
  named = {r.name for r in parsed if r.name}
  released = {r.name for r in parsed if r.name and r.versioned}
  added = []
  for req in parsed:
    partner = PAIRED.get(req.name or "")
    if partner and req.versioned and partner not in named:
      released.add(partner)
      if req.exact:
        added.append(f"{partner}=={req.exact}")
        named.add(partner)
  if pytest and "pytest" not in named:
    added.append("pytest")
  constraints = tuple(f"{name}=={version}" for name, version in sorted(pins.items())
                      if name not in released)
  return Plan(
      requirements=tuple(r.text for r in parsed) + tuple(added),
      changes=tuple(r.text for r in parsed),
      constraints=constraints,
      extras=("report",) if html else (),
      requires=tuple(requires),
  )


def cache_root() -> Path:
  """Where rehearsal environments are kept, one directory per :meth:`Plan.key`.

  ``$NNX_POOL_CACHE/rehearse`` when that is set, else ``$XDG_CACHE_HOME/nnx-pool/rehearse``,
  else ``~/.cache/nnx-pool/rehearse``. Delete it to clear the cache.
  """
  if os.environ.get(CACHE_ENV):
    return Path(os.environ[CACHE_ENV]).expanduser().absolute() / "rehearse"
  base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
  return Path(base).expanduser().absolute() / "nnx-pool" / "rehearse"


def shown(path: Path) -> str:
  """A path as a report shows it: ``~/…`` under the home directory."""
  home = Path.home()
  return f"~/{path.relative_to(home).as_posix()}" if path.is_relative_to(home) else str(path)


def pip_failure(output: str, requirements: Sequence[str], pins: Mapping[str, str]) -> str:
  """The one line that says why pip failed, naming the requirement it could not install.

  Args:
    output: pip's stdout and stderr.
    requirements: what the user asked for.
    pins: this environment's versions, to say when one of them is in the way.
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
    requested = dict(re.findall(r"^The user requested ([A-Za-z0-9._-]+)==(\S+)$",
                                "\n".join(causes), re.M))
    parts, hints = [], []
    for cause in causes:
      depends = re.match(r"(\S+) (\S+) depends on ([A-Za-z0-9._-]+)(\[[^\]]*\])?(\S*)$", cause)
      pinned = re.match(r"The user requested \(constraint\) ([A-Za-z0-9._-]+)==(\S+)", cause)
      if cause.startswith("The user requested") and not pinned:
        continue  # what the user asked for, said again
      if depends and _allows(depends.group(5), requested.get(depends.group(3))):
        continue  # a dependent that accepts the requested version is not the conflict
      parts.append(cause)
      if depends and pins.get(normalise(depends.group(1))) == depends.group(2):
        pinned = depends
      if pinned:
        hints.append(f"{pinned.group(1)} {pinned.group(2)} is this environment's version; "
                     f"name a {pinned.group(1)} version too")
    reason = "; ".join(parts) + (f" ({'; '.join(hints)})" if hints else "")
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


def _release(version: str) -> tuple[int, ...] | None:
  """``0.10.2`` -> ``(0, 10, 2)``; None for anything but a plain release."""
  return tuple(int(n) for n in version.split(".")) if re.fullmatch(r"\d+(\.\d+)*", version) \
      else None


def _allows(spec: str, version: str | None) -> bool:
  """Whether a plain specifier (``>=0.7.0,<0.11``) surely admits ``version``; False if unsure."""
  have = _release(version or "")
  if have is None or not spec:
    return False
  for clause in spec.split(","):
    match = re.fullmatch(r"(>=|<=|==|!=|>|<)(.+)", clause.strip())
    bound = _release(match.group(2)) if match else None
    if bound is None:
      return False
    width = max(len(have), len(bound))
    a, b = have + (0,) * (width - len(have)), bound + (0,) * (width - len(bound))
    ok = {">=": a >= b, "<=": a <= b, "==": a == b, "!=": a != b, ">": a > b, "<": a < b}
    if not ok[match.group(1)]:
      return False
  return True


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


def _python(env: Path) -> Path:
  return env / ("Scripts" if os.name == "nt" else "bin") / ("python.exe" if os.name == "nt"
                                                            else "python")


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


@contextlib.contextmanager
def _locked(path: Path, waiting: Callable[[], None]) -> Iterator[None]:
  """Holds an exclusive ``flock`` on the environment directory; a second rehearsal waits for it."""
  fd = os.open(path, os.O_RDONLY)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      waiting()
      fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)  # releases the lock


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


# In an environment: the digest (Source.digest) of the nnx-pool installed there.
_SOURCE_STAMP = "nnx-pool-source.sha256"


def _current(env: Path, digest: str) -> bool:
  stamp = env / _SOURCE_STAMP
  return stamp.is_file() and stamp.read_text() == digest


def _build(env: Path, plan: Plan, source: Source, scratch: Path, steps: _Steps,
           pins: Mapping[str, str]) -> None:
  """Creates the environment at ``env`` and installs the plan there; raises RehearsalError."""
  steps.next("creating a virtual environment (python -m venv)")
  try:
    venv.EnvBuilder(with_pip=True, symlinks=os.name != "nt").create(env)
  except (OSError, subprocess.CalledProcessError) as e:
    raise RehearsalError(f"rehearse: could not create a virtual environment with pip in "
                         f"{shown(env)} ({e}).") from e
  constraints, requirements = env / "rehearsal-constraints.txt", env / "rehearsal-requirements.txt"
  constraints.write_text("".join(f"{c}\n" for c in plan.constraints))
  requirements.write_text("".join(f"{r}\n" for r in plan.requirements))
  what = f"installing {' '.join(plan.requirements)} and nnx-pool (pip)"
  steps.next(what)
  code, output = _pip(env, ["install", "-c", str(constraints), "-r", str(requirements),
                            source.requirement(plan.extras, scratch)],
                      on_line=lambda line: steps.show(f"pip: {line}"))
  if code:
    raise RehearsalError(pip_failure(output, plan.changes, pins))
  store.write_atomic(env / _SOURCE_STAMP, source.digest().encode())


def _refresh(env: Path, plan: Plan, source: Source, scratch: Path, steps: _Steps,
             pins: Mapping[str, str]) -> None:
  """Reinstalls nnx-pool (``--no-deps``) in a cached environment whose copy is out of date."""
  digest = source.digest()
  if _current(env, digest):
    return
  what = "reinstalling nnx-pool, changed since the environment was built (pip --no-deps)"
  steps.next(what)
  code, output = _pip(env, ["install", "--no-deps", "--force-reinstall",
                            source.requirement(plan.extras, scratch)],
                      on_line=lambda line: steps.show(f"pip: {line}"))
  if code:
    raise RehearsalError(pip_failure(output, [SELF], pins))
  store.write_atomic(env / _SOURCE_STAMP, digest.encode())


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


def _pytest(env: Path, paths: Sequence[str]) -> int:
  """Runs the user's tests in the environment, comparing only (:data:`CHECK_ONLY_ENV`)."""
  command = [str(_python(env)), "-P", "-m", "pytest", "-p", "no:cacheprovider", *paths]
  environ = {**_environ(env), CHECK_ONLY_ENV: "1"}
  return subprocess.run(command, env=environ, stdin=subprocess.DEVNULL, check=False).returncode


def rehearse(
    requirements: Sequence[str],
    *,
    baseline: str | os.PathLike,
    pattern: str | None = None,
    dry_run: bool = False,
    html: str | os.PathLike | None = None,
    pytest_paths: Sequence[str] = (),
    cache: bool = True,
    progress: StepProgress | None = None,
) -> Report:
  """Runs ``check`` (and the user's tests) in an environment changed by ``requirements``.

  Args:
    requirements: pip requirements applied over this environment's versions.
    baseline: the baseline to compare with (a directory here).
    pattern: ``check -k``: only the cases it selects.
    dry_run: ``check --dry-run``: report drift, exit 0.
    html: ``check --html``: the page to write (the ``report`` extra is installed there).
    pytest_paths: also run ``python -m pytest`` on these there, comparing only.
    cache: keep the environment under :func:`cache_root` and reuse it; False builds a
      throwaway one and removes it.
    progress: the CLI's progress line, told of each step.

  Returns:
    The report of ``check``, its version changes marked ``(rehearsal)``, with notes
    naming the environment and pytest's outcome. Exit code: :func:`combined_exit` of
    ``check``'s and pytest's; 2 with a one-line ``error`` when the requirements are
    malformed, pip cannot install them, or ``check`` ran without writing a report.
  """
  try:
    source = this_source()
    pins = installed_pins()
    plan = make_plan(requirements, pins=pins, requires=source.requires, html=html is not None,
                     pytest=bool(pytest_paths))
  except RehearsalError as e:
    return Report(command="check", exit_code=2, error=str(e))
  here = installed_versions()
  # The checkout's revision now, as the copy installed below is taken (None from a wheel).
  git = git_revision(source.root) if source.root is not None else None
  with tempfile.TemporaryDirectory(prefix="nnx-pool-rehearse-") as tmp:
    scratch = Path(tmp)
    env = cache_root() / plan.key() if cache else scratch / "env"
    cached = cache and (env / "pyvenv.cfg").is_file()
    setup = 0 if cached and _current(env, source.digest()) else 1 if cached else 2
    steps = _Steps(progress, setup + 1 + bool(pytest_paths))
    started = time.monotonic()
    try:
      if not cached:
        if cache:  # built beside its place, then renamed into it
          env.parent.mkdir(parents=True, exist_ok=True)
          build = Path(tempfile.mkdtemp(prefix=f".tmp-{env.name}-", dir=env.parent))
        else:
          build = env
        try:
          _build(build, plan, source, scratch, steps, pins)
          if build != env:
            try:
              os.rename(build, env)  # the commit: a half-built environment is never at `env`
            except OSError:  # another rehearsal built the same environment meanwhile
              shutil.rmtree(build)
        except BaseException:
          shutil.rmtree(build, ignore_errors=True)
          raise
      with _locked(env, lambda: steps.show("waiting for another rehearsal in this environment")):
        if cached:
          _refresh(env, plan, source, scratch, steps, pins)
        setup_s = time.monotonic() - started
        steps.next("running check")
        steps.clear()  # check draws its own case n/N line
        json_path = scratch / "check.json"
        code = _check(env, Path(baseline).absolute(), json_path, pattern=pattern,
                      dry_run=dry_run, html=None if html is None else Path(html).absolute(),
                      scratch=scratch)
        tested = None
        if pytest_paths:
          steps.next(f"running pytest {' '.join(pytest_paths)}")
          steps.clear()
          tested = _pytest(env, pytest_paths)
    except RehearsalError as e:
      return Report(command="check", exit_code=2, error=str(e))
    report = _report(json_path, code, here, git)
  report.baseline = str(baseline)
  where = (f"environment {shown(env)} ({'reused' if cached else f'built in {setup_s:.0f} s'})"
           if cache else f"a throwaway environment, built in {setup_s:.0f} s and removed")
  report.notes.append(
      f"rehearsal: check ran in a separate environment with {' '.join(plan.changes)}, "
      f"everything else at this environment's versions; {where}")
  if tested is not None:
    meaning = PYTEST_EXITS.get(tested, (2, "an unknown status"))[1]
    outcome = f"pytest {' '.join(pytest_paths)} exited {tested} ({meaning}), comparing only"
    report.notes.append(f"rehearsal: {outcome}")
    if report.error:
      report.error += f"; {outcome}"
  report.exit_code = combined_exit(code if report.error is None else code or 2, tested)
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
