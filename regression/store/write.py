"""Writing a baseline: atomically, under the lock of its directory.

A writer holds the lock of the parent directory (:mod:`.lock`: a ``flock`` on POSIX),
writes the arrays file, then the manifest (the commit point), each through an fsynced
temporary file and ``os.replace``, then deletes what the new manifest does not name. A
baseline of a newer format, or a directory holding other files, is never replaced.

Nothing is written through a symbolic link: ``os.replace`` replaces a linked file's link,
and a baseline directory that is a link (or a Windows junction) is, with ``force``, replaced
by a directory of its own, built beside it first; what the link pointed to is left as it
was (a user who linked two baselines keeps the other one). The directories above a
baseline are the user's layout and are followed.
"""

from __future__ import annotations

import contextlib
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


def is_link(path: str | os.PathLike) -> bool:
  """Whether ``path`` is a symbolic link, or a Windows junction (which ``islink`` does not
  call one), dangling or not."""
  return os.path.islink(path) or bool(getattr(os.path, "isjunction", lambda _: False)(path))


def _unlink(path: Path) -> None:
  """Removes the link ``path`` itself, never what it points to (Windows removes a link to a
  directory, and a junction, as a directory)."""
  try:
    os.unlink(path)
  except (IsADirectoryError, PermissionError):
    if os.name != "nt":
      raise
    os.rmdir(path)


def link_target(path: str | os.PathLike) -> str:
  """What ``path`` links to ("" when it is no link, "?" when the link cannot be read)."""
  if not is_link(path):
    return ""
  try:
    return os.readlink(path)
  except OSError:
    return "?"


def _replace_link(link: Path, directory: Path) -> None:
  """Moves ``directory`` to where the link ``link`` is: the link goes, what it pointed to
  stays. Not one rename (none replaces a link by a directory): a failure puts the link back."""
  target = os.readlink(link)
  _unlink(link)
  try:
    os.replace(directory, link)
  except BaseException:
    with contextlib.suppress(OSError):
      os.symlink(target, link, target_is_directory=True)
    raise


def baseline_around(out: str | os.PathLike) -> Path | None:
  """The baseline (or obtained file, or weight set) directory that a file written at
  ``out`` would land in, directly or below; None when no directory above it is one."""
  parent = Path(out).absolute().parent.resolve()
  for directory in (parent, *parent.parents):
    if (directory / MANIFEST).is_file() and stored_format_version(directory):
      return directory
  return None


def inside_baseline_problem(flag: str, given: str | os.PathLike) -> str | None:
  """Why the file ``flag`` names (``--json``, ``--nnx-regression-html``) may not be written
  there: it would land inside a baseline's directory (:func:`baseline_around`), whose
  manifest it could replace and where any other file blocks the next update; or None."""
  baseline = baseline_around(given)
  if baseline is None:
    return None
  return (f"{flag} {given}: lies inside {baseline}, a baseline's directory (or an obtained "
          "file's, or a weight set's), which holds the kit's own files only; write it "
          "elsewhere.")


def _durable() -> bool:
  """Whether writes are fsynced: unless ``NNX_POOL_FSYNC=0``, for a machine whose baselines
  need not outlive a crash of it (a CI runner's throwaway disk, a test suite's temporary
  directories), where each fsync waits for the disk (about 3 ms on a 2-core cloud VM). The
  order of the writes, and so their atomicity against a killed process, stays the same."""
  return os.environ.get("NNX_POOL_FSYNC", "1") != "0"


def _fsync_dir(path: Path) -> None:
  """Makes a rename in ``path`` durable where the platform can (Windows cannot open a folder)."""
  if not _durable():
    return
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
    if _durable():
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
  if is_link(out):  # its target is never touched: only the link is replaced, with force
    if force:
      return
    raise FileExistsError(
        f"`out` {out} is a symbolic link (to {link_target(out)}), and baselines are never "
        "written through a link; pass --force to replace the link itself with a directory "
        "(what it points to is kept), or choose another directory.")
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

  A baseline directory that is a symbolic link is replaced (with ``force``) by a directory
  of its own; what the link pointed to is not touched.

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
    link = is_link(out)
    # A link is replaced by a directory built beside it, never written through.
    into = out.parent / f".tmp-{os.getpid()}-{os.urandom(4).hex()}" if link else out
    created = link or not out.exists()
    into.mkdir(exist_ok=True)
    try:
      _put(into, arrays_name(manifest), npz)
      _put(into, MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
      if link:
        _replace_link(out, into)
    except BaseException:
      if created:
        shutil.rmtree(into, ignore_errors=True)
      raise
    _fsync_dir(out.parent)
    for name in set(os.listdir(out)) - keep:  # old arrays, temporary files of killed writers
      if _OURS.match(name):
        (out / name).unlink(missing_ok=True)
  return out
