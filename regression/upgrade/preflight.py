"""What ``rehearse`` and ``bisect`` judge before they build anything.

Each is an input that is wrong whatever gets installed, refused in one line that shows
the fix, within seconds instead of after minutes of pip and recording:

* :func:`kit_pattern`: a ``-k`` that selects none of the kit's cases, named as this
  environment's batch names them (the rehearsal installs a copy of this nnx-pool, whose
  batch is the same);
* :func:`pytest_paths`: a path given to ``--pytest`` that does not exist here;
* :func:`pin_conflicts`: (``bisect``) releases of the walk that a package this environment
  keeps at its own version (not named in the sets, and not chosen by ``--resolve``), or this
  nnx-pool itself, does not admit: every step there would fail to install.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from packaging.version import Version

from .rehearse_plan import PAIRED, SELF, RehearsalError, admits, dependencies


def kit_pattern(pattern: str | None, command: str) -> None:
  """Refuses a ``-k`` that selects none of the kit's cases (``check -k`` would exit 2 there).

  Raises:
    RehearsalError: ``{command}: -k 'typo' selects none of the 115 cases ...``.
  """
  if not pattern:
    return
  from ..batch import load_batch, selects_none  # imports JAX: only with a -k to judge

  try:
    names = [case.name for case in load_batch().cases]
  except Exception:  # noqa: BLE001 - a batch that cannot be built here: check there says why
    return
  problem = selects_none(pattern, names)
  if problem:
    raise RehearsalError(f"{command}: {problem}")


def pytest_paths(paths: Sequence[str], command: str) -> None:
  """Refuses a path given to ``--pytest`` (before any ``--``) that does not exist here.

  A test's node id (``tests/test_model.py::test_logits``) counts by its file.

  Raises:
    RehearsalError: one line naming the path and the directory it was looked for in.
  """
  for text in paths:
    path = Path(text.split("::", 1)[0])
    if not path.exists():
      raise RehearsalError(
          f"{command}: --pytest {text}: there is no {path} in {Path.cwd()}; run it from the "
          "directory that holds your tests, or name them as pytest would take them there.")


def _installed_with(requires: Sequence[str], depends: Mapping[str, Sequence[str]],
                    also: Collection[str]) -> set[str]:
  """The packages an environment of nnx-pool (and ``also``) holds, as this one's metadata says:
  nnx-pool's requirements and theirs, transitively, extras left out."""
  found: set[str] = set()
  frontier = set(dependencies(requires)) | set(also)
  while frontier:
    found |= frontier
    frontier = {dep for name in frontier for dep in dependencies(depends.get(name, ()))} - found
  return found


def pin_conflicts(package: str, releases: Sequence[Version], *, named: Collection[str],
                  pins: Mapping[str, str], depends: Mapping[str, Sequence[str]],
                  requires: Sequence[str], also: Collection[str] = (),
                  resolve: bool = False) -> None:
  """Refuses a walk that this environment's kept versions exclude (``bisect`` without them).

  Args:
    package: the package bisected (its partner, jaxlib for jax, is judged with it).
    releases: the releases walked.
    named: the packages the sets name (not kept at this environment's version).
    pins: this environment's versions.
    depends: what each package here requires.
    requires: this nnx-pool's requirements.
    also: what the steps install beside nnx-pool (pytest, matplotlib).
    resolve: ``--resolve``: pip chooses the dependents, so only nnx-pool itself is judged.

  Raises:
    RehearsalError: the first package in the way, its requirement, the releases it
      excludes, and the fix (``--resolve``, or name a version of it in both sets).
  """
  released = {package, PAIRED.get(package, package)}
  held = _installed_with(requires, depends, also) & set(pins)
  kept = [] if resolve else sorted(held - set(named) - released)
  for name in [SELF, *kept]:
    spec = dependencies(requires if name == SELF else depends.get(name, ())).get(package)
    excluded = [str(r) for r in releases if spec is not None and not admits(spec, str(r))]
    if not excluded:
      continue
    which = ", ".join(excluded)
    if name == SELF:
      raise RehearsalError(
          f"bisect: this nnx-pool requires {package}{spec}, which excludes {package} {which} "
          "of the walk: they cannot be installed with it; bisect releases it admits.")
    raise RehearsalError(
        f"bisect: this environment's {name} {pins.get(name)}, which every step keeps (the sets "
        f"do not name it), requires {package}{spec}, which excludes {package} {which} of the "
        f"walk; pass --resolve to let pip choose, at each release, the newest {name} no newer "
        f"than {pins.get(name)} that admits it, or name a {name} version in both sets.")
