"""The cache of rehearsal environments: one directory per requirement set, the most recent kept.

:func:`cache_root` holds one directory per :meth:`~.rehearse_plan.Plan.key`
(the interpreter, the requirements, the extras, ``resolve``), each holding the virtual
environment (:data:`ENV_DIR`) and a file whose modification time is its last use
(:func:`mark_used`). :func:`prune` keeps the :data:`KEEP_DEFAULT` most recently used of
them (:data:`KEEP_ENV` changes it); :func:`clear_cache` empties it. A run holds its
entry's lock (:func:`take`, :mod:`nnx_pool.regression.store.lock`) from before the build to the
end of the run, so a second rehearsal of the same set waits and then reuses it, and no
clean-up removes an environment in use.

**Nothing planted runs.** An entry is used only with its :data:`MANIFEST`, written last, once
its environment is complete (:func:`write_manifest`), holding the digests of the resolved
requirement set and of the nnx-pool installed there; an entry without a valid one is
rebuilt, its environment removed unrun (:mod:`nnx_pool.regression.upgrade.rehearse_env`). On POSIX,
the cache directory and each entry are made ``0700`` and refused (:func:`check_private`)
when another user owns them or may write to them: anyone who can write there could plant an
environment, and a manifest with it; so is the directory that holds the cache
(``$NNX_POOL_CACHE``) when others may write to it without the sticky bit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .. import store
from ..store import lock
from .rehearse_plan import RehearsalError

MANIFEST = "manifest.json"  # a cache entry's manifest, written last (write_manifest)
MANIFEST_FORMAT = "nnx-pool-rehearsal"
MANIFEST_LAYOUT = 1

CACHE_ENV = "NNX_POOL_CACHE"
KEEP_ENV = "NNX_POOL_REHEARSE_KEEP"  # how many environments the cache keeps
KEEP_DEFAULT = 3  # about 750 MB each with pip, a few MB with uv (docs/regression.md)
ENV_DIR = "env"  # a cache entry's virtual environment
_USED = "last-used"  # a cache entry's file whose mtime is its last use
_KEY = re.compile(r"[0-9a-f]{16}\Z")  # a cache entry's name (Plan.key)


def cache_root() -> Path:
  """Where rehearsal environments are kept, one directory per
  :meth:`~nnx_pool.regression.upgrade.rehearse_plan.Plan.key`.

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


def make_private(path: Path) -> None:
  """Creates ``path`` and any missing directory above it, each ``0700`` (only this user)."""
  missing = []
  for directory in (path, *path.parents):
    if directory.exists():
      break
    missing.append(directory)
  for directory in reversed(missing):
    with contextlib.suppress(FileExistsError):  # another rehearsal made it meanwhile
      os.mkdir(directory, 0o700)


def check_private(path: Path, *, above: bool = False) -> None:
  """Refuses (RehearsalError) a cache directory another user owns or may write to (POSIX).

  Anyone who may write to it could put an environment there whose ``bin/python`` a
  rehearsal would run, and a manifest with it. ``above``: the directory that holds the
  cache (``$NNX_POOL_CACHE``), where a writer could rename the cache away and put another
  in its place; there the system's own (root's) directory, and one others may write to
  with the sticky bit (``/tmp``: nobody renames another's entry), are fine. Windows has no
  such modes: nothing is checked.
  """
  if not hasattr(os, "geteuid"):
    return
  info = path.stat()
  owner = f"user {info.st_uid}, not you (user {os.geteuid()})" if info.st_uid not in (
      os.geteuid(), *((0,) if above else ())) else None
  sticky = above and bool(info.st_mode & stat.S_ISVTX)
  writers = [who for who, bit in (("its group", stat.S_IWGRP), ("every user", stat.S_IWOTH))
             if info.st_mode & bit and not sticky]
  if owner is None and not writers:
    return
  why = f"is owned by {owner}" if owner else (
      f"may be written by {' and '.join(writers)} (mode {stat.S_IMODE(info.st_mode):04o}"
      f"{', without the sticky bit' if above else ''})")
  fix = (f"run `chmod go-w {path}`{f' (or `chmod +t {path}`)' if above else ''}, or "
         if not owner else "") + f"set {CACHE_ENV} to a directory of your own"
  what = (f"the directory {shown(path)} that holds the cache" if above else
          f"the cache directory {shown(path)}")
  how = ("rename the cache away and put one there whose environments rehearse would run"
         if above else "put an environment there that rehearse would run")
  raise RehearsalError(f"rehearse: {what} {why}: another user could {how}; {fix}.")


def uv_cache_dir() -> Path:
  """uv's cache, beside the rehearsal cache (``.../nnx-pool/uv``: on its filesystem, so that
  environments link their files from it), made and checked private as the cache is: anyone
  who may write there could change the files every environment links to.

  Raises:
    RehearsalError: it is another user's or writable by others (:func:`check_private`).
  """
  path = cache_root().parent / "uv"
  make_private(path)
  check_private(path.parent, above=True)
  check_private(path)
  return path


def disk_use(paths: Iterable[Path]) -> tuple[int, int]:
  """The bytes of the files under ``paths`` (each file once, links not followed): those no
  other path shares, and those linked from elsewhere (uv's cache)."""
  own = linked = 0
  seen: set[tuple[int, int]] = set()
  for path in paths:
    for where, _, names in os.walk(path):
      for name in names:
        with contextlib.suppress(OSError):
          info = os.lstat(os.path.join(where, name))
          if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) in seen:
            continue
          seen.add((info.st_dev, info.st_ino))
          if info.st_nlink > 1:
            linked += info.st_size
          else:
            own += info.st_size
  return own, linked


def read_manifest(entry: Path) -> dict[str, Any] | None:
  """The manifest of a cache entry when it is one this version wrote for it, else None."""
  try:
    data = store.parse_json((entry / MANIFEST).read_bytes())
  except (OSError, ValueError):
    return None
  if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or data.get(
      "layout") != MANIFEST_LAYOUT or data.get("key") != entry.name:
    return None
  kinds = {"requirements": str, "resolved": dict, "source": str, "requires": list,
           "unfollowed": list}
  if not all(isinstance(data.get(field), kind) for field, kind in kinds.items()):
    return None
  return data


def write_manifest(entry: Path, fields: Mapping[str, Any]) -> None:
  """Writes an entry's manifest (atomically): the last step of a build or an update."""
  data = {"format": MANIFEST_FORMAT, "layout": MANIFEST_LAYOUT, "key": entry.name, **fields}
  store.write_atomic(entry / MANIFEST, (json.dumps(data, indent=1, sort_keys=True) + "\n")
                     .encode())


def drop_manifest(entry: Path) -> None:
  """Removes an entry's manifest: the first step of a build or an update, so that one that
  stops halfway leaves an entry that is rebuilt, never used."""
  (entry / MANIFEST).unlink(missing_ok=True)


def take(entry: Path, waiting: Callable[[], None]) -> lock.Held:
  """The lock of a cache entry, created (``0700``) where missing; waits for another rehearsal
  using it.

  Raises:
    RehearsalError: the cache directory or the entry is another user's or writable by
      others (:func:`check_private`).
  """
  for _ in range(3):
    make_private(entry.parent)
    check_private(entry.parent.parent, above=True)
    check_private(entry.parent)
    make_private(entry)
    check_private(entry)
    try:
      return lock.exclusive(entry, waiting=waiting)
    except FileNotFoundError:  # lock.Gone too: a clean-up removed it meanwhile; make it again
      continue
  raise RehearsalError(f"rehearse: the cache entry {shown(entry)} was removed three times while "
                       "this rehearsal waited for it (rehearse --clear-cache running?); "
                       "run it again.")


def mark_used(entry: Path) -> None:
  """Records that a rehearsal used ``entry`` now (what :func:`prune` keeps by)."""
  store.write_atomic(entry / _USED, f"{time.time():.0f}\n".encode())
