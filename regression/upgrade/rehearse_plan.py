"""What a rehearsal environment holds: the user's requirements over this environment's pins.

**Requirements** are PEP 508 requirements, parsed with :mod:`packaging`
(:meth:`Requirement.parse`); anything else (a pip option, two requirements in one
argument, a bare path or URL) is refused before pip runs. What pip reads is the
parsed requirement written back (``str()``), one per line.

**Pins.** Every distribution of this interpreter (``importlib.metadata``) becomes a
``name==version`` line of a pip constraints file, except nnx-pool itself and anything
installed from a path or URL (editable or not), which no version names. Constraints
only bound what gets installed: the environment holds nnx-pool, its dependencies, the
requirements, matplotlib (the ``report`` extra) with ``html``, pytest with
``pytest``, and nothing else. A requirement with a version specifier or a URL
(``jax==0.9.2``, ``flax>=0.12``) releases the pin of the package it names; a bare
name (``optax``) adds that package at this environment's version.

**jax and jaxlib are a pair.** A requirement for one that the other does not match
releases the other's pin too, and one pinned with ``==`` brings the other to the same
version: ``jax==0.9.2`` installs ``jaxlib==0.9.2``, ``jax==0.9.2+cpu`` ``jaxlib==0.9.2+cpu``.
Name both to choose each. Any other pin that conflicts (``flax 0.12.8 depends on
jax>=0.10.0``) stops the install (:mod:`nnx_pool.regression.upgrade.pip_messages` says so in
one line): name a version of that package too, or pass ``resolve``, which turns the
pin of every package here that depends on a released one (:func:`dependents`: flax,
chex, optax, ... for jax) into an upper bound, so that pip chooses the newest version
no newer than this environment's that admits the requirements (flax 0.12.6 for jax 0.9.2).

A :class:`Plan` is keyed (:meth:`Plan.key`) by its requirement set, which names its
environment in the cache (:mod:`nnx_pool.regression.upgrade.rehearse_cache`). What the text of a
requirement does not fix is resolved again before a cached environment is used
(:mod:`nnx_pool.regression.upgrade.rehearse_env`): the content of a ``file://`` location
(:func:`local_locations`), and the versions pip chooses for a range (``jax>=0.9,<0.10``), for
the partner it releases, and for the dependents ``resolve`` bounds (:func:`chosen_by_pip`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import os
import platform
import re
import sys
import urllib.parse
import urllib.request
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as Pep508
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion

from .. import store

SELF = "nnx-pool"
PAIRED = {"jax": "jaxlib", "jaxlib": "jax"}
_LAYOUT = 2  # bump when an environment built by an older version can no longer be used
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class RehearsalError(Exception):
  """A rehearsal could not be planned or its environment built: exit code 2, one line."""


def normalise(name: str) -> str:
  """A distribution name as PEP 503 compares it (``ML_Dtypes`` -> ``ml-dtypes``)."""
  return canonicalize_name(name)


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
    dists: the distributions (default: ``importlib.metadata.distributions()``, read once
      while no folder on ``sys.path`` changes: see :func:`_this_environment`).
  """
  if dists is None:
    return dict(_this_environment()[0])
  return _pins(first_copies(dists))


def installed_depends(dists: Iterable[importlib.metadata.Distribution] | None = None,
                      ) -> dict[str, tuple[str, ...]]:
  """What each distribution here requires (its ``Requires-Dist``), by normalised name."""
  if dists is None:
    return dict(_this_environment()[1])
  return _depends(first_copies(dists))


def _pins(found: Mapping[str, importlib.metadata.Distribution]) -> dict[str, str]:
  pins = {name: dist.version for name, dist in found.items()
          if name != SELF and dist.read_text("direct_url.json") is None}
  return dict(sorted(pins.items()))


def _depends(found: Mapping[str, importlib.metadata.Distribution],
             ) -> dict[str, tuple[str, ...]]:
  return {name: tuple(dist.requires or ()) for name, dist in found.items()}


_READ: dict[tuple, tuple[dict[str, str], dict[str, tuple[str, ...]]]] = {}


def _this_environment() -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
  """:func:`installed_pins` and :func:`installed_depends` of this interpreter, read again
  only when ``sys.path`` or a folder on it changed (installing or removing a distribution
  adds or removes a ``.dist-info`` folder, which changes its parent's modification time).

  Reading them parses every distribution's metadata (170 of them in the development
  environment: 0.1 s); ``bisect`` and ``rehearse`` ask at every step.
  """
  key = tuple(_modified(entry) for entry in sys.path)
  if key not in _READ:
    found = first_copies(None)
    _READ.clear()
    _READ[key] = (_pins(found), _depends(found))
  return _READ[key]


def _modified(entry: str) -> tuple[str, int]:
  path = entry or os.getcwd()  # "" is the working directory, wherever that is now
  try:
    return path, os.stat(path).st_mtime_ns
  except OSError:
    return path, -1


def first_copies(dists: Iterable[importlib.metadata.Distribution] | None,
                 ) -> dict[str, importlib.metadata.Distribution]:
  """Each distribution by normalised name, the first copy on the path where there are two."""
  found: dict[str, importlib.metadata.Distribution] = {}
  for dist in importlib.metadata.distributions() if dists is None else dists:
    name = dist.metadata["Name"]
    if name:
      found.setdefault(normalise(name), dist)
  return found


def dependencies(requires: Iterable[str]) -> dict[str, SpecifierSet]:
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
                and frontier & set(dependencies(requires))}
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
    them instead, see :func:`~nnx_pool.regression.upgrade.rehearse_env.stale_pins`).
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


def admits(spec: str | SpecifierSet, version: str | None) -> bool:
  """Whether a specifier (``>=0.7.0,<0.11``) admits ``version``; False if either is unreadable."""
  try:
    return version is not None and SpecifierSet(str(spec)).contains(version, prereleases=True)
  except (InvalidSpecifier, InvalidVersion):
    return False


def chosen_by_pip(plan: Plan) -> tuple[str, ...]:
  """The normalised names whose version pip chooses, not the requirement's text: those of
  a range (``jax>=0.9,<0.10``; not ``==`` of one version, nor a URL), the partner such a
  jax or jaxlib releases unless named, and the dependents ``resolve`` bounded."""
  chosen, named = set(plan.resolved), set()
  for text in plan.requirements:
    req = Pep508(text)
    named.add(normalise(req.name))
    specs = list(req.specifier)
    exact = len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version
    if specs and not exact and req.url is None:
      chosen.add(normalise(req.name))
  chosen |= {PAIRED[name] for name in chosen if name in PAIRED} - named
  return tuple(sorted(chosen))


def local_locations(plan: Plan) -> dict[str, Path]:
  """The ``file://`` location of each requirement that names one (``foo @ file:///dir``), by
  the requirement's text: what pip installs from there changes with the files, not the text."""
  found = {}
  for text in plan.requirements:
    url = Pep508(text).url
    if url and urllib.parse.urlsplit(url).scheme == "file":
      found[text] = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
  return found
