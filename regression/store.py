"""Baselines on disk: a JSON manifest and an ``.npz`` of arrays, written atomically.

A baseline directory holds exactly two files:

* ``manifest.json``: the format name and version, a table of every array
  (its dtype, how it is stored, its shape and its digest), whatever the caller
  adds (the environment stamp, the cases), and a SHA-256 of the manifest
  itself, so a hand edit is detected.
* ``arrays.npz``: the arrays, written by :func:`numpy.savez_compressed`.

Loading never unpickles: :func:`numpy.load` runs with ``allow_pickle=False``
and object arrays are refused. float16, bfloat16 and the other ml_dtypes are
stored as their raw bits (an unsigned integer of the same width) plus the dtype
name, so they round-trip bit for bit (``np.save`` turns bfloat16 into void).

Writing goes to a temporary directory in the same parent, is fsynced, and is
then swapped in with one rename (an atomic exchange where the OS has one), so a
crash at any point leaves either the old or the new baseline, never a mix.
Concurrent writers of one baseline take turns: each holds an exclusive lock on
the parent directory (``flock``; no lock file is left behind) from the
overwrite check to the swap, so a second ``record`` without ``--force`` sees
the first one's baseline and refuses, and with ``--force`` replaces it whole.
A baseline of a newer format version is never replaced (:func:`check_writable`).
A reader opens both files through one directory descriptor, so a read that
overlaps a ``record --force`` sees the old recording or the new one, whole.

Every problem found while loading raises :class:`BaselineError` with a
one-line reason; nothing here imports JAX.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import errno
import functools
import glob
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

try:
  import fcntl
except ImportError:  # pragma: no cover - not on Windows: writers are not serialised there
  fcntl = None

FORMAT = "nnx-pool-regression"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ARRAYS = "arrays.npz"

# Plain NumPy dtypes that .npz stores faithfully. float16 is stored as raw bits
# too, as the format promises bit-exact half precision whatever NumPy does.
_NATIVE = frozenset({
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64", "complex64", "complex128",
})
# How long a writer waits for another one writing into the same directory.
LOCK_TIMEOUT_S = 120.0
# How often a reader starts again when a writer swaps the baseline mid-read.
_READ_ATTEMPTS = 10
_KEY = re.compile(r"^[A-Za-z0-9_.\-\[\]/:=,()']+$")


class BaselineError(Exception):
  """A baseline is missing, damaged, or written by an incompatible version.

  The message is one line, fit to print after ``error:``.
  """


@dataclasses.dataclass
class Baseline:
  """A loaded baseline.

  Attributes:
    path: the directory it was read from.
    manifest: the parsed manifest (including the ``arrays`` table).
    arrays: every array, decoded to its real dtype.
  """

  path: Path
  manifest: dict[str, Any]
  arrays: dict[str, np.ndarray]


def dtype_by_name(name: str) -> np.dtype:
  """Looks up a dtype by name, including the ml_dtypes ones (``"bfloat16"``)."""
  if not isinstance(name, str):
    raise TypeError(f"`name` must be a dtype name; got {name!r}.")
  if hasattr(ml_dtypes, name):
    return np.dtype(getattr(ml_dtypes, name))
  try:
    return np.dtype(name)
  except TypeError as e:
    raise ValueError(f"`name` is not a known dtype; got {name!r}.") from e


def digest(array: np.ndarray) -> str:
  """The SHA-256 of an array's dtype name, shape and C-order bytes."""
  array = np.asarray(array)
  h = hashlib.sha256()
  h.update(array.dtype.name.encode())
  h.update(repr(tuple(int(n) for n in array.shape)).encode())
  h.update(np.ascontiguousarray(array).tobytes())
  return "sha256:" + h.hexdigest()


def _storage_dtype(dtype: np.dtype, key: str) -> np.dtype:
  ml_dtype = dtype.name in _ml_names()
  if dtype.hasobject or (dtype.kind in "OUSVM m" and not ml_dtype):
    raise TypeError(
        f"array {key!r} has dtype {dtype}, which a baseline cannot hold without pickling; "
        "store numeric or bool arrays only."
    )
  if dtype.name in _NATIVE:
    return dtype
  if dtype.name == "float16" or ml_dtype:
    return np.dtype(f"uint{dtype.itemsize * 8}")
  raise TypeError(f"array {key!r} has unsupported dtype {dtype}.")


@functools.cache
def _ml_names() -> frozenset[str]:
  """Names of the ml_dtypes scalar types (bfloat16, float8_*, int4, ...)."""
  names = set()
  for attr in dir(ml_dtypes):
    with contextlib.suppress(TypeError, ValueError):
      dt = np.dtype(getattr(ml_dtypes, attr))
      if dt.kind == "V" and dt.name == attr:
        names.add(attr)
  return frozenset(names)


def encode(key: str, array: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
  """Turns an array into what ``.npz`` stores, plus its manifest entry."""
  array = np.asarray(array)
  stored_as = _storage_dtype(array.dtype, key)
  stored = array.view(stored_as) if stored_as != array.dtype else array
  entry = {
      "dtype": array.dtype.name,
      "stored_as": stored_as.name,
      "shape": [int(n) for n in array.shape],
      "digest": digest(array),
  }
  return np.ascontiguousarray(stored), entry


def canonical_json(data: Any) -> str:
  """The JSON text a manifest checksum is taken over (sorted keys, no NaN)."""
  return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _manifest_checksum(manifest: Mapping[str, Any]) -> str:
  body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
  return "sha256:" + hashlib.sha256(canonical_json(body).encode()).hexdigest()


def build_manifest(
    fields: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Builds the manifest and the arrays to store; see :func:`write_baseline`."""
  reserved = {"format", "format_version", "arrays", "manifest_sha256"} & set(fields)
  if reserved:
    raise ValueError(f"`fields` may not set reserved keys; got {sorted(reserved)}.")
  stored, table = {}, {}
  for key, array in arrays.items():
    if not isinstance(key, str) or not _KEY.match(key):
      raise ValueError(f"array key must be a plain string; got {key!r}.")
    stored[key], table[key] = encode(key, array)
  manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **fields, "arrays": table}
  manifest["manifest_sha256"] = _manifest_checksum(manifest)
  return manifest, stored


# ---------------------------------------------------------------- writing


def _fsync_dir(path: Path) -> None:
  with contextlib.suppress(OSError):
    fd = os.open(path, os.O_RDONLY)
    try:
      os.fsync(fd)
    finally:
      os.close(fd)


def _write_file(path: Path, write) -> None:
  with open(path, "wb") as f:
    write(f)
    f.flush()
    os.fsync(f.fileno())


def _write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
  """Writes the arrays file (a seam tests use to simulate a crash mid-write)."""
  _write_file(path, lambda f: np.savez_compressed(f, **arrays))


def _write_manifest(path: Path, manifest: Mapping[str, Any]) -> None:
  text = json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False) + "\n"
  _write_file(path, lambda f: f.write(text.encode()))


def _looks_like_baseline(path: Path) -> bool:
  """Whether ``path`` is empty or holds only baseline files (safe to replace)."""
  names = {p.name for p in path.iterdir()}
  return names <= {MANIFEST, ARRAYS}


def _rename_exchange(a: Path, b: Path) -> bool:
  """Atomically swaps two paths with ``renameat2(RENAME_EXCHANGE)``; False if unsupported."""
  libc_name = ctypes.util.find_library("c")
  if not libc_name:
    return False
  libc = ctypes.CDLL(libc_name, use_errno=True)
  renameat2 = getattr(libc, "renameat2", None)
  if renameat2 is None:
    return False
  at_fdcwd, rename_exchange = -100, 2
  rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
  if rc == 0:
    return True
  err = ctypes.get_errno()
  if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
    return False
  raise OSError(err, os.strerror(err), str(a), None, str(b))


def _swap_in(tmp: Path, out: Path) -> None:
  """Moves the finished ``tmp`` to ``out``, replacing any old baseline atomically."""
  if not out.exists():
    os.rename(tmp, out)
    return
  if _rename_exchange(tmp, out):
    shutil.rmtree(tmp)  # tmp now holds the old baseline
    return
  # No atomic exchange: two renames. A crash between them leaves the old
  # baseline complete under `.<name>.old-*`, which read_baseline points to.
  old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
  os.rmdir(old)
  os.rename(out, old)
  os.rename(tmp, out)
  shutil.rmtree(old)


def _remove_stale_temps(out: Path) -> None:
  """Removes temporary directories left by records that were killed."""
  for stale in out.parent.glob(f".{glob.escape(out.name)}.tmp-*"):
    pid = stale.name.split("-")[-2] if stale.name.count("-") >= 2 else ""
    if pid.isdigit() and int(pid) != os.getpid() and _pid_alive(int(pid)):
      continue
    shutil.rmtree(stale, ignore_errors=True)


def _umask() -> int:
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def stored_format_version(path: str | os.PathLike) -> Any:
  """The ``format_version`` a baseline's manifest claims, without validating anything else.

  Returns None when there is no readable manifest of this format.
  """
  try:
    manifest = json.loads((Path(path) / MANIFEST).read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError, json.JSONDecodeError):
    return None
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
    return None
  return manifest.get("format_version")


def check_writable(out: str | os.PathLike, *, force: bool) -> None:
  """Raises FileExistsError unless ``out`` may be (re)written; see :func:`write_baseline`."""
  out = Path(out)
  if not out.exists():
    return
  if not out.is_dir():
    raise FileExistsError(f"`out` exists and is not a directory: {out}.")
  version = stored_format_version(out)
  if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
    raise FileExistsError(
        f"baseline {out} has format version {version}, newer than this nnx-pool writes "
        f"({FORMAT_VERSION}); refusing to replace it, even with --force. Upgrade nnx-pool, "
        "or record to another directory with --out."
    )
  if not force:
    raise FileExistsError(f"baseline {out} exists; pass --force to replace it.")
  if not _looks_like_baseline(out):
    raise FileExistsError(
        f"`out` {out} holds files other than {MANIFEST} and {ARRAYS}; refusing to replace "
        "it even with --force. Choose an empty or new directory."
    )


class BaselineLockedError(FileExistsError):
  """Another process kept writing into the baseline's directory for too long."""


@contextlib.contextmanager
def _writer_lock(parent: Path, timeout_s: float) -> Iterator[None]:
  """Holds an exclusive ``flock`` on ``parent`` (a directory), waiting up to ``timeout_s``.

  The lock belongs to the open file description, so it is released when the
  holder exits, even by SIGKILL; no lock file is created.
  """
  if fcntl is None:
    yield
    return
  fd = os.open(parent, os.O_RDONLY)
  try:
    deadline = time.monotonic() + timeout_s
    while True:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
      except BlockingIOError:
        if time.monotonic() > deadline:
          raise BaselineLockedError(
              f"another process has been writing a baseline in {parent} for over "
              f"{timeout_s:g} s; try again when it has finished."
          ) from None
        time.sleep(0.02)
    yield
  finally:
    os.close(fd)  # releases the lock


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
    force: replace an existing baseline. Without it an existing ``out`` is refused.

  Returns:
    The path written.

  Raises:
    FileExistsError: ``out`` exists and ``force`` is False, ``out`` holds
      files that are not a baseline's, or a baseline of a newer format (it is
      never replaced then); :class:`BaselineLockedError` when another writer
      holds the directory for more than :data:`LOCK_TIMEOUT_S`.
    OSError: the disk refused a write (full, read-only); the old baseline,
      if any, is untouched and the temporary directory is removed.
    TypeError: an array cannot be stored without pickling.
  """
  out = Path(out)
  check_writable(out, force=force)
  manifest, stored = build_manifest(fields, arrays)
  out.parent.mkdir(parents=True, exist_ok=True)
  with _writer_lock(out.parent, LOCK_TIMEOUT_S):
    check_writable(out, force=force)  # again: another writer may have finished meanwhile
    _remove_stale_temps(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
    try:
      os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private (0700)
      _write_npz(tmp / ARRAYS, stored)
      _write_manifest(tmp / MANIFEST, manifest)
      _fsync_dir(tmp)
      _swap_in(tmp, out)
      _fsync_dir(out.parent)
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
  return out


# ---------------------------------------------------------------- reading


def _fail(path: Path, reason: str) -> BaselineError:
  return BaselineError(f"baseline {path}: {reason}")


class _Swapped(Exception):
  """The baseline directory was being replaced by a writer while it was being opened."""


def _old_copies(path: Path) -> list[Path]:
  """Previous baselines parked by the two-rename swap (see :func:`_swap_in`), oldest first."""
  if not path.parent.exists():
    return []
  return sorted(path.parent.glob(f".{glob.escape(path.name)}.old-*"))


def _open_file(dfd: int, name: str, path: Path):
  """Opens regular file ``name`` of the directory ``dfd`` for reading, never blocking."""
  fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK, dir_fd=dfd)  # a FIFO must not hang us
  try:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
      raise _fail(path, f"{name} is not a regular file.")
    return os.fdopen(fd, "rb")
  except BaseException:
    os.close(fd)
    raise


@contextlib.contextmanager
def _open_pair(path: Path) -> Iterator[tuple[Any, Any]]:
  """Opens the manifest and the arrays of *one* recording of ``path``.

  Writers never change a baseline directory in place; they swap in a whole new
  one. Opening both files relative to one directory descriptor therefore pairs
  a manifest with its own arrays, even while a ``record --force`` runs. Raises
  :class:`_Swapped` when the directory is missing or loses a file mid-swap, and
  the caller reads again.
  """
  if not path.exists():
    if _old_copies(path):
      raise _Swapped  # between the two renames of a swap, or a record killed there
    _check_present(path)  # (checks again: a swap may have just finished)
  try:
    dfd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
  except FileNotFoundError:
    raise _Swapped from None
  except NotADirectoryError:
    raise _fail(path, "is a file, not a baseline directory.") from None
  files = []
  try:
    for name in (MANIFEST, ARRAYS):
      try:
        files.append(_open_file(dfd, name, path))
      except FileNotFoundError:
        try:
          swapped = os.stat(path).st_ino != os.fstat(dfd).st_ino
        except FileNotFoundError:
          swapped = True
        if swapped:
          raise _Swapped from None
        hint = f"; record one with `record --out {path} --force`" if name == MANIFEST else ""
        raise _fail(path, f"{name} is missing{hint}.") from None
    yield files[0], files[1]
  finally:
    for f in files:
      f.close()
    os.close(dfd)


def _check_present(path: Path) -> None:
  if not path.exists():
    olds = _old_copies(path)
    hint = f" (an interrupted record left the previous one at {olds[-1]})" if olds else ""
    raise _fail(path, f"no such directory{hint}; record one with `record --out {path}`.")


def _read_manifest(path: Path, file) -> dict[str, Any]:
  try:
    manifest = json.loads(file.read().decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise _fail(path, f"{MANIFEST} is not valid JSON ({e}).") from None
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
    raise _fail(path, f"{MANIFEST} is not an {FORMAT} manifest (no 'format': '{FORMAT}').")
  version = manifest.get("format_version")
  if not isinstance(version, int) or isinstance(version, bool):
    raise _fail(path, f"{MANIFEST} has no integer format_version; got {version!r}.")
  if version > FORMAT_VERSION:
    raise _fail(
        path,
        f"format version {version} is newer than this nnx-pool reads ({FORMAT_VERSION}); "
        "upgrade nnx-pool or re-record the baseline.",
    )
  if version < FORMAT_VERSION:
    raise _fail(
        path, f"format version {version} is older than {FORMAT_VERSION}; re-record the baseline."
    )
  if manifest.get("manifest_sha256") != _manifest_checksum(manifest):
    raise _fail(
        path, f"{MANIFEST} was edited after recording (checksum mismatch); re-record it."
    )
  table = manifest.get("arrays")
  if not isinstance(table, dict):
    raise _fail(path, f"{MANIFEST} has no 'arrays' table.")
  return manifest


def _load_npz(path: Path, table: Mapping[str, Any], file) -> dict[str, np.ndarray]:
  raw: dict[str, np.ndarray] = {}
  try:
    with np.load(file, allow_pickle=False) as npz:
      for key in npz.files:
        raw[key] = npz[key]
  except ValueError as e:
    if "pickle" in str(e):
      raise _fail(path, f"{ARRAYS} holds an object array; refusing to unpickle it.") from None
    raise _fail(path, f"{ARRAYS} is damaged ({e}).") from None
  except (zipfile.BadZipFile, EOFError, OSError, KeyError) as e:
    raise _fail(path, f"{ARRAYS} is truncated or damaged ({type(e).__name__}: {e}).") from None
  missing = sorted(set(table) - set(raw))
  if missing:
    raise _fail(path, f"array {missing[0]!r} listed in {MANIFEST} is missing from {ARRAYS}.")
  extra = sorted(set(raw) - set(table))
  if extra:
    raise _fail(path, f"array {extra[0]!r} in {ARRAYS} is not listed in {MANIFEST}.")
  return raw


def decode(key: str, stored: np.ndarray, entry: Mapping[str, Any], path: Path) -> np.ndarray:
  """Turns a stored array back into its real dtype, checking it against its entry."""
  if not isinstance(entry, Mapping) or not {"dtype", "stored_as", "shape", "digest"} <= set(entry):
    raise _fail(path, f"manifest entry for array {key!r} is incomplete.")
  if stored.dtype.hasobject:
    raise _fail(path, f"array {key!r} is an object array; refusing it.")
  if stored.dtype.name != entry["stored_as"]:
    raise _fail(
        path,
        f"array {key!r} is stored as {stored.dtype.name} but {MANIFEST} says "
        f"{entry['stored_as']}.",
    )
  try:
    dtype = dtype_by_name(entry["dtype"])
  except (TypeError, ValueError):
    raise _fail(path, f"array {key!r} has unknown dtype {entry['dtype']!r}.") from None
  if _storage_dtype(dtype, key).name != entry["stored_as"]:
    raise _fail(
        path, f"array {key!r}: dtype {dtype.name} cannot be stored as {entry['stored_as']}."
    )
  array = stored.view(dtype) if dtype != stored.dtype else stored
  if list(array.shape) != list(entry["shape"]):
    raise _fail(
        path, f"array {key!r} has shape {list(array.shape)} but {MANIFEST} says {entry['shape']}."
    )
  if digest(array) != entry["digest"]:
    raise _fail(path, f"array {key!r} does not match its digest (changed after recording).")
  return array


def read_baseline(path: str | os.PathLike) -> Baseline:
  """Loads and validates a baseline directory.

  Args:
    path: the baseline directory.

  Returns:
    The :class:`Baseline`.

  Raises:
    BaselineError: the directory is missing, damaged, edited, or of a newer
      format; the message is one line.
  """
  path = Path(path)
  for attempt in range(_READ_ATTEMPTS):
    try:
      with _open_pair(path) as (manifest_file, arrays_file):
        manifest = _read_manifest(path, manifest_file)
        table = manifest["arrays"]
        raw = _load_npz(path, table, arrays_file)
      break
    except _Swapped:
      time.sleep(0.002 * 2**attempt)  # about 2 s in all
  else:
    _check_present(path)  # missing all along: says where a killed record left the old one
    raise _fail(path, f"it was replaced {_READ_ATTEMPTS} times while being read; try again.")
  arrays = {key: decode(key, raw[key], table[key], path) for key in sorted(table)}
  return Baseline(path=path, manifest=manifest, arrays=arrays)
