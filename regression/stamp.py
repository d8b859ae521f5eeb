"""The environment stamp: everything that can move a number between two runs.

A stamp records package versions, the JAX backend (with its device and process counts),
the JAX configuration that changes numerics, every ``JAX_*``/``XLA_*`` environment
variable, the date and the git revision; a fixture baseline's also says how the check's
inputs lay (``layout``). :func:`stamp_header` is the one line a report prints for
each side before its table; :func:`stamp_changes` lists what differs between
two stamps in a form a report can print next to the numeric drift
(``jax 0.9.2 -> 0.10.2``). A value that cannot be known (None: the git revision
of an installed package, say) is shown as ``unknown`` and is never a change.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The distributions whose versions are stamped, and the key each is stamped under.
_PACKAGES = (
    ("numpy", "numpy"),
    ("jax", "jax"),
    ("jaxlib", "jaxlib"),
    ("flax", "flax"),
    ("chex", "chex"),
    ("ml_dtypes", "ml_dtypes"),
    ("nnx-pool", "nnx_pool"),
)
_CONFIG = ("jax_enable_x64", "jax_default_matmul_precision", "jax_threefry_partitionable")
_ENV_PREFIXES = ("JAX_", "XLA_")
# The baseline shipped with the package (regression/baseline/ in the repository).
SHIPPED = Path(__file__).resolve().parent / "baseline"
UNKNOWN = "unknown"


def source_checkout() -> Path | None:
  """The repository root when the kit runs from a source checkout, else None.

  Installed from a wheel, the kit lies at ``site-packages/nnx_pool/regression``
  and there is no checkout: its git revision is unknown, and ``record`` does not
  write the shipped baseline.
  """
  root = Path(__file__).resolve().parent.parent
  markers = (root / "pyproject.toml", root / "nnx_pool" / "__init__.py", root / "regression")
  return root if all(m.exists() for m in markers) else None


def _version(dist: str) -> str | None:
  """The installed version of a distribution; None (unknown) when it is not installed."""
  try:
    return importlib.metadata.version(dist)
  except importlib.metadata.PackageNotFoundError:
    return None


def _git(where: Path, *args: str) -> str | None:
  try:
    done = subprocess.run(
        ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10, check=False
    )
  except (OSError, subprocess.SubprocessError):
    return None
  return done.stdout.strip() if done.returncode == 0 else None


def git_revision(where: str | os.PathLike | None = None) -> dict[str, Any]:
  """The git commit of the checkout at ``where``, and if it is dirty.

  Args:
    where: a directory in a checkout (default: this package's source
      checkout; None values, unknown, for an installed package).
  """
  where = Path(where) if where is not None else source_checkout()
  rev = _git(where, "rev-parse", "HEAD") if where is not None else None
  if rev is None:
    return {"revision": None, "dirty": None}
  # rev is None whenever where is.
  status = _git(where, "status", "--porcelain", "--untracked-files=no")  # pyright: ignore[reportArgumentType]
  return {"revision": rev, "dirty": bool(status) if status is not None else None}


def installed_versions() -> dict[str, str | None]:
  """The versions a stamp records: python's and each stamped distribution's (None: not installed).

  Read from package metadata, without importing anything.
  """
  versions: dict[str, str | None] = {"python": platform.python_version()}
  for dist, key in _PACKAGES:
    versions[key] = _version(dist)
  return versions


def collect_stamp(git_dir: str | os.PathLike | None = None) -> dict[str, Any]:
  """Collects the stamp of the running environment (imports JAX).

  Args:
    git_dir: the checkout whose revision is recorded (default: the one holding
      this package; the pytest fixture passes the user's project root).

  Returns:
    A JSON-serializable dict with ``versions``, ``backend``, ``config``,
    ``env``, ``date`` and ``git``.
  """
  import jax

  versions = installed_versions()
  devices = jax.devices()
  backend = {
      "platform": devices[0].platform,
      "device_kind": devices[0].device_kind,
      "device_count": len(devices),
      "process_count": jax.process_count(),
      "python_implementation": sys.implementation.name,
      "machine": platform.machine(),
  }
  config = {}
  for name in _CONFIG:
    value = getattr(jax.config, name, None)
    config[name] = value if isinstance(value, (bool, int, float, type(None))) else str(value)
  env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)}
  date = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
  return {
      "versions": versions,
      "backend": backend,
      "config": config,
      "env": env,
      "date": date,
      "git": git_revision(git_dir),
  }


# A fixture baseline's stamp also says how the check's inputs lay (``layout``: processes,
# mesh, each input's split; :func:`nnx_pool.regression.processes.arrays.layout`).
_SECTIONS = ("versions", "backend", "layout", "config", "env", "git")


def _flat(stamp: Mapping[str, Any]) -> dict[str, Any]:
  flat = {}
  for section in _SECTIONS:
    values = stamp.get(section) or {}
    if isinstance(values, Mapping):
      for key, value in values.items():
        flat[(section, key)] = value
  return flat


def _label(section: str, key: str) -> str:
  if section == "env":
    return f"env {key}"
  if section in ("git", "layout"):
    return f"{section} {key}"
  return key


def _show(section: str, key: str, value: Any) -> str:
  if value is None:
    return "unset" if section == "env" else UNKNOWN
  if section == "git" and key == "revision" and isinstance(value, str):
    return value[:12]
  return str(value)


def stamp_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
  """Lists what differs between two stamps, one line each, dates excluded.

  An environment variable that is set on one side only is a change; any other
  value that one side could not know (None) is not.

  Args:
    old: the baseline's stamp.
    new: the current (or second) stamp.

  Where the git revision changed, whether either side's tree had uncommitted changes is said
  on that line, not as a ``git dirty`` change of its own: the code differs either way (the
  shipped baseline, recorded from a tree with changes, against a clean clone read ``git dirty
  True -> False``, as if that moved something).

  Returns:
    Lines like ``jax 0.9.2 -> 0.10.2``, ``env XLA_FLAGS unset -> --xla_foo`` or ``git
    revision fe60abbedbcb (with uncommitted changes) -> 41e1838716d1``.
  """
  return [line for _, line in labelled_changes(old, new)]


def labelled_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, str]]:
  """:func:`stamp_changes`, each line beside the label of the value it names (``jax``)."""
  rows = stamp_rows(old, new)
  moved = any(changed for label, _, _, changed in rows if label == "git revision")
  dirty = [(side.get("git") or {}).get("dirty") is True for side in (old, new)]
  lines = []
  for label, before, after, changed in rows:
    if not changed or (moved and label == "git dirty"):
      continue
    if moved and label == "git revision":
      before, after = (f"{value} (with uncommitted changes)" if was else value
                       for value, was in zip((before, after), dirty, strict=True))
    lines.append((label, f"{label} {before} -> {after}"))
  return lines


def stamp_rows(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, str, str, bool]]:
  """Every value of two stamps side by side, dates excluded (the HTML report's table).

  Returns:
    ``(label, old value, new value, changed)`` per value, in the order of
    :func:`stamp_changes`, which lists the changed ones.
  """
  a, b = _flat(old), _flat(new)
  rows = []
  for key in sorted(set(a) | set(b), key=lambda k: (_order(k[0]), k[1])):
    section, name = key
    unknown = section != "env" and (a.get(key) is None or b.get(key) is None)
    rows.append((_label(section, name), _show(section, name, a.get(key)),
                 _show(section, name, b.get(key)), a.get(key) != b.get(key) and not unknown))
  return rows


def _order(section: str) -> int:
  return _SECTIONS.index(section)


# What a report's header names for each side, in order.
_HEADER = ("python", "numpy", "jax", "jaxlib", "flax")


def stamp_header(stamp: Mapping[str, Any]) -> str:
  """One line naming the versions and the device a stamp was taken on.

  ``python 3.11.7, numpy 2.4.6, jax 0.10.2, jaxlib 0.10.2, flax 0.12.8, cpu (cpu),
  git eb143693f648`` (``unknown`` for what the stamp lacks).
  """
  versions = stamp.get("versions") or {}
  backend = stamp.get("backend") or {}
  git = (stamp.get("git") or {}).get("revision")
  parts = [f"{name} {versions.get(name) or UNKNOWN}" for name in _HEADER]
  parts.append(f"{backend.get('platform') or UNKNOWN} ({backend.get('device_kind') or UNKNOWN})")
  parts.append(f"git {git[:12] if isinstance(git, str) else UNKNOWN}")
  return ", ".join(parts)


def format_stamp(stamp: Mapping[str, Any]) -> str:
  """Renders a stamp as aligned ``key: value`` lines for ``info``."""
  lines = []
  for section in _SECTIONS:
    values = stamp.get(section) or {}
    if section == "layout" and not values:
      continue  # only a fixture baseline's stamp has one
    lines.append(f"{section}:")
    if not values:
      lines.append("  (none)")
    for key, value in values.items():
      lines.append(f"  {key:<30} {UNKNOWN if value is None and section != 'env' else value}")
  lines.append(f"date: {stamp.get('date')}")
  return "\n".join(lines)
