"""Whether a bisect step may run in this environment instead of one built for its set.

A step runs here only where an environment built for its requirement set would hold the
same thing (:meth:`Here.differs`):

* every requirement, and every requirement of theirs (nnx-pool's too), admitted by the
  version installed here; a local version label here (jaxlib ``0.4.30+cuda12``) that the
  requirement does not name is another build;
* the packages of every extra a requirement names installed here too, at versions they
  admit: ``jax[cuda12]==0.10.2`` needs jax-cuda12-plugin, which plain jax 0.10.2 here lacks;
* no jax plugin here (an entry point in the ``jax_plugins`` group, a ``jax_plugins``
  package, libtpu) that the set would not install: jax would run on another platform here
  (a GPU) than in the environments built for the other steps (a CPU), and the platform
  change be blamed on a release.

Everything is read from this environment's package metadata; nothing is imported or run.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as Pep508
from packaging.version import InvalidVersion, Version

from .bisect_plan import fits
from .rehearse_env import site_packages
from .rehearse_plan import admits, first_copies, normalise

PLUGIN_GROUP = "jax_plugins"  # the entry points jax loads its platform plugins from
PLUGIN_NAMES = ("libtpu", "libtpu-nightly")  # found by import, without an entry point


def _another_build(req: Pep508, version: str) -> bool:
  """Whether ``version`` carries a local label (``+cuda12``) that no specifier of ``req``
  names: PEP 440 lets ``==0.4.30`` match ``0.4.30+cuda12``, another build of the release."""
  try:
    local = Version(version).local
  except InvalidVersion:
    return False
  return local is not None and not any("+" in spec.version for spec in req.specifier)


def _is_plugin(name: str, dist: importlib.metadata.Distribution) -> bool:
  if name in PLUGIN_NAMES or any(ep.group == PLUGIN_GROUP for ep in dist.entry_points):
    return True
  return any(str(file).startswith(f"{PLUGIN_GROUP}/") for file in dist.files or ())


@dataclasses.dataclass(frozen=True)
class Here:
  """This environment's distributions, by normalised name (the first copy on the path)."""

  dists: Mapping[str, importlib.metadata.Distribution]

  @classmethod
  def read(cls, env: Path) -> Here:
    """The distributions of the environment ``env``."""
    paths = [str(p) for p in site_packages(env)]
    return cls(first_copies(importlib.metadata.distributions(path=paths)))

  @property
  def versions(self) -> dict[str, str]:
    """The installed versions, by normalised name."""
    return {name: dist.version for name, dist in self.dists.items()}

  def plugins(self) -> list[str]:
    """The jax plugins installed here (normalised names)."""
    return sorted(name for name, dist in self.dists.items() if _is_plugin(name, dist))

  def holds(self, requirements: Iterable[str]) -> tuple[set[str], str | None]:
    """What an environment of ``requirements`` would hold, read from here: ``(names, None)``,
    or ``(names so far, why not)`` at the first requirement here does not satisfy."""
    found: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Pep508(text) for text in requirements]
    while todo:
      req = todo.pop()
      name = normalise(req.name)
      dist = self.dists.get(name)
      if dist is None or req.url:
        return found, f"{req} is not installed here" if dist is None else f"{req} names a URL"
      if not admits(req.specifier, dist.version) or _another_build(req, dist.version):
        return found, f"{req} is not what is installed here ({name} {dist.version})"
      if (name, frozenset(req.extras)) in seen:
        continue
      seen.add((name, frozenset(req.extras)))
      found.add(name)
      for line in dist.requires or ():
        try:
          dep = Pep508(line)
        except InvalidRequirement:
          continue
        if dep.marker is None or any(dep.marker.evaluate({"extra": e})
                                     for e in ("", *sorted(req.extras))):
          dep.marker = None
          todo.append(dep)
    return found, None

  def differs(self, requirements: Sequence[str], also: Sequence[str]) -> tuple[bool, str]:
    """Whether a step of ``requirements`` runs here, and, where versions alone would have
    let it, why it does not (its extras, a local build, a jax plugin here).

    Args:
      requirements: the step's requirement set (:meth:`~.bisect_plan.Span.requirements`).
      also: what the environment built for it holds besides: nnx-pool's requirements (with
        the extras the bisect installs), pytest, matplotlib.

    Returns:
      ``(runs here, why not)``; the reason is empty where the versions differ (a step
      builds its environment then, as it always did) or where it runs here.
    """
    if not fits(requirements, self.versions):
      return False, ""
    held, why = self.holds([*requirements, *also])
    if why:
      return False, why
    stray = [f"{name} {self.dists[name].version}" for name in self.plugins() if name not in held]
    if stray:
      return False, (f"this environment holds {', '.join(stray)}, a jax plugin the set does "
                     "not install (jax would run on another platform here)")
    return True, ""
