"""Writing a baseline: atomically, under the lock of its directory.

A writer holds the lock of the parent directory (:mod:`.lock`: a ``flock`` on POSIX),
writes the arrays file, then the manifest (the commit point), each through an fsynced
temporary file and ``os.replace``, then deletes what the new manifest does not name. A
baseline of a newer format, or a directory holding other files, is never replaced.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import lock
from .format import FORMAT_VERSION, MANIFEST, arrays_name, build_manifest, encode_arrays
from .read import stored_format_version

LOCK_TIMEOUT_S = 120.0  # how long a writer waits for another one writing into the same directory
_OURS = re.compile(r"^(manifest\.json|arrays\.npz|arrays-[0-9a-f]{16}\.npz|\.tmp-[0-9a-f-]+)$")


class BaselineLockedError(FileExistsError):
  """Another process kept writing into the baseline's directory for too long."""


def _fsync_dir(path: Path) -> None:
  """Makes a rename in ``path`` durable where the platform can (Windows cannot open a folder)."""
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:  # some file systems refuse to fsync a directory
    pass
  finally:
    os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
  """Writes and fsyncs a new file (the seam tests use to simulate a crash mid-write)."""
  with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
  """Writes a file whole or not at all: see :func:`_put` (the CLI's ``--html`` report)."""
  path = Path(path)
  _put(path.parent, path.name, data)


def _put(out: Path, name: str, data: bytes) -> None:
  """Writes ``out/name`` through a temporary file that is fsynced, then renamed into place."""
  tmp = out / f".tmp-{os.getpid()}-{os.urandom(4).hex()}"
  try:
    _write_file(tmp, data)
    os.replace(tmp, out / name)
  except BaseException:
    tmp.unlink(missing_ok=True)
    raise
  _fsync_dir(out)


def check_writable(out: str | os.PathLike, *, force: bool) -> None:
  """Raises FileExistsError unless ``out`` may be (re)written; see :func:`write_baseline`."""
  out = Path(out)
  if not out.exists():
    return
  if not out.is_dir():
    raise FileExistsError(f"`out` exists and is not a directory: {out}.")
  version = stored_format_version(out)
  if type(version) is int and version > FORMAT_VERSION:
    raise FileExistsError(
        f"baseline {out} has format version {version}, newer than this nnx-pool writes "
        f"({FORMAT_VERSION}); refusing to replace it, even with --force. Upgrade nnx-pool, "
        "or record to another directory with --out.")
  names = os.listdir(out)
  others = sorted(n for n in names if not _OURS.match(n))
  if others:
    raise FileExistsError(
        f"`out` {out} holds files other than a baseline's ({others[0]!r}); refusing to "
        "replace it even with --force. Choose an empty or new directory.")
  if MANIFEST in names and not force:
    raise FileExistsError(f"baseline {out} exists; pass --force to replace it.")


def _lock(directory: Path, timeout_s: float) -> lock.Held:
  """The lock of ``directory`` (:func:`.lock.exclusive`), for ``timeout_s``."""
  try:
    return lock.exclusive(directory, timeout_s=timeout_s)
  except lock.Busy:
    raise BaselineLockedError(
        f"another process has been writing a baseline in {directory} for over "
        f"{timeout_s:g} s; try again when it has finished.") from None


def write_baseline(
    out: str | os.PathLike,
    fields: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
    *,
    force: bool = False,
) -> Path:
  """Writes a baseline directory atomically.

  Args:
    out: the baseline directory to create or replace.
    fields: JSON-serializable manifest fields (e.g. ``stamp`` and ``cases``).
    arrays: the arrays, by key.
    force: replace an existing baseline (without it, one is refused).

  Returns:
    The path written.

  Raises:
    FileExistsError: see :func:`check_writable`; :class:`BaselineLockedError` when
      another writer holds the directory for over :data:`LOCK_TIMEOUT_S`.
    OSError: the disk refused a write; the old baseline, if any, is untouched.
    TypeError: an array cannot be stored without pickling.
  """
  out = Path(out)
  check_writable(out, force=force)
  manifest, stored = build_manifest(fields, arrays)
  npz = encode_arrays(stored)
  keep = {MANIFEST, arrays_name(manifest)}
  out.parent.mkdir(parents=True, exist_ok=True)
  with _lock(out.parent, LOCK_TIMEOUT_S):
    check_writable(out, force=force)  # again: another writer may have finished meanwhile
    created = not out.exists()
    out.mkdir(exist_ok=True)
    try:
      _put(out, arrays_name(manifest), npz)
      _put(out, MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    except BaseException:
      if created:
        shutil.rmtree(out, ignore_errors=True)
      raise
    _fsync_dir(out.parent)
    for name in set(os.listdir(out)) - keep:  # old arrays, temporary files of killed writers
      if _OURS.match(name):
        (out / name).unlink(missing_ok=True)
  return out
