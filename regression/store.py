"""Baselines on disk: ``manifest.json`` naming an ``arrays-<hex>.npz``, written atomically.

The manifest holds the format and its version, every array's dtype, storage dtype,
shape and digest (the arrays file is named by a digest of this table), the caller's
fields, and a checksum of itself. Loading never unpickles; float16 and the ml_dtypes
are stored as raw bits. A writer holds the lock of the parent directory
(:mod:`nnx_pool.regression.lock`: a ``flock`` on POSIX), writes the arrays file, then the
manifest (the commit point), each through an fsynced temporary file and ``os.replace``,
then deletes what the new manifest does not name. A reader opens the arrays file the
manifest names, reading the manifest again if a writer removed it meanwhile. No JAX here.

The arrays file is a zip of ``.npy`` members, one per array: the array ``<key>`` is the
member ``<key>.npy`` (always: a key ``x.npy`` is the member ``x.npy.npy``), written here with
:mod:`zipfile` and :func:`numpy.lib.format.write_array`, never through Python keyword
arguments, so that no key (``file``, ``allow_pickle``) can clash with a parameter and no two
keys with one member. This is what ``np.savez_compressed`` wrote for every key that did not
end in ``.npy``, so the files of every version read the same way, and nnx-pool 0.2.0 reads
the new ones. A reader checks each member's header (dtype, shape) against the manifest and
the member's size against both before it allocates the array, and reads the data as it
comes out of the zip, so a header or a size that lies costs no more memory than the file
holds; any damage, a manifest nested too deeply included, is one :class:`BaselineError` line.

Format versions, and how each older one still loads (:data:`FORMAT_VERSION` is written):

* 1: the arrays file is ``arrays.npz``; read as it is, replaced by ``record --force``.
* 2 (nnx-pool 0.1.0): ``arrays-<16 hex>.npz``, named by the digest of the manifest's
  array table. A pytest fixture baseline held ``output`` and ``output_eager`` and the full
  parameters (``weights/<path>``). Read as it is: the fixture compares both of this run's
  results with its ``output``, and the fresh parameters with its own by digest.
* 3: the same files. A fixture baseline holds one result per output (``output``; ``loss``
  and ``grad/<path>`` for ``check_grad``), and its manifest the model's state schema, mode
  flags, a fingerprint of every variable and of every submodule's output; the weights
  themselves only with ``store_params=True``, in a shared weight set
  (:mod:`nnx_pool.regression._fixture_core`). Batch baselines are unchanged from 2.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import re
import shutil
import stat
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from nnx_pool.regression import lock

FORMAT = "nnx-pool-regression"
FORMAT_VERSION = 3
MANIFEST = "manifest.json"
_V1_ARRAYS = "arrays.npz"  # the arrays file of format version 1
LOCK_TIMEOUT_S = 120.0  # how long a writer waits for another one writing into the same directory
_READ_ATTEMPTS = 10  # how often a reader starts again when a writer removed its arrays file
_MEMBER = ".npy"  # the array <key> is the zip member <key>.npy
_CHUNK = 1 << 22  # bytes read from a member at a time
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # every member's timestamp: equal arrays, equal bytes
_KEY = re.compile(r"^[A-Za-z0-9_.\-\[\]/:=,()']+$")
_OURS = re.compile(r"^(manifest\.json|arrays\.npz|arrays-[0-9a-f]{16}\.npz|\.tmp-[0-9a-f-]+)$")
_FIX = "re-record it (`record --force`, or `--nnx-regression-update` for a fixture baseline)"


class BaselineError(Exception):
  """A baseline is missing, damaged, or of an incompatible version (a one-line message)."""


class BaselineLockedError(FileExistsError):
  """Another process kept writing into the baseline's directory for too long."""


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


def _ml_dtypes():
  """ml_dtypes, imported on first use: it costs 0.5 s, and the pytest plugin imports this
  module in every session of a project that installs nnx-pool (measured, ``-X importtime``)."""
  import ml_dtypes

  return ml_dtypes


def dtype_by_name(name: str) -> np.dtype:
  """Looks up a dtype by name, including the ml_dtypes ones (``"bfloat16"``)."""
  if not isinstance(name, str):
    raise TypeError(f"`name` must be a dtype name; got {name!r}.")
  ml_dtypes = _ml_dtypes()
  if hasattr(ml_dtypes, name):
    return np.dtype(getattr(ml_dtypes, name))
  try:
    return np.dtype(name)
  except TypeError as e:
    raise ValueError(f"`name` is not a known dtype; got {name!r}.") from e


def digest(array: np.ndarray) -> str:
  """The SHA-256 of an array's dtype name, shape and C-order bytes."""
  array = np.asarray(array)
  h = hashlib.sha256(array.dtype.name.encode())
  h.update(repr(tuple(int(n) for n in array.shape)).encode())
  h.update(np.ascontiguousarray(array).tobytes())
  return "sha256:" + h.hexdigest()


def _stored_as(dtype: np.dtype, key: str) -> np.dtype:
  """What ``.npz`` holds ``dtype`` as: itself, or raw bits for float16 and the ml_dtypes."""
  # ml_dtypes first: float8_e5m2 and complex32 claim kinds "f" and "c", but .npy cannot name them.
  if dtype.name == "float16" or getattr(_ml_dtypes(), dtype.name, None) is dtype.type:
    return np.dtype(f"uint{dtype.itemsize * 8}")
  if dtype.kind in "biufc":
    return dtype
  raise TypeError(f"array {key!r} has dtype {dtype}, which a baseline cannot hold without "
                  "pickling; store numeric, bool or ml_dtypes arrays only.")


def canonical_json(data: Any) -> str:
  """The JSON text a manifest checksum is taken over (sorted keys, no NaN)."""
  return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _checksum(data: Mapping[str, Any]) -> str:
  body = {k: v for k, v in data.items() if k != "manifest_sha256"}
  return "sha256:" + hashlib.sha256(canonical_json(body).encode()).hexdigest()


def build_manifest(
    fields: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Builds the manifest and the arrays to store; see :func:`write_baseline`."""
  reserved = {"format", "format_version", "arrays", "manifest_sha256"}
  if reserved & set(fields):
    raise ValueError(f"`fields` may not set reserved keys; got {sorted(reserved & set(fields))}.")
  stored, table = {}, {}
  for key, array in arrays.items():
    if not isinstance(key, str) or not _KEY.match(key):
      raise ValueError(f"array key must be a plain string; got {key!r}.")
    array = np.asarray(array)
    stored_as = _stored_as(array.dtype, key)
    stored[key] = np.array(array.view(stored_as), order="C")  # keeps a 0-d array 0-d
    table[key] = {"dtype": array.dtype.name, "stored_as": stored_as.name,
                  "shape": [int(n) for n in array.shape], "digest": digest(array)}
  manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **fields, "arrays": table}
  manifest["manifest_sha256"] = _checksum(manifest)
  return manifest, stored


def member_name(key: str) -> str:
  """The zip member that holds the array ``key`` in an arrays file: ``<key>.npy``."""
  return key + _MEMBER


def encode_arrays(stored: Mapping[str, np.ndarray]) -> bytes:
  """The arrays file (a zip of ``.npy`` members, deflated) holding ``stored``, by key."""
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as z:
    for key, array in stored.items():
      info = zipfile.ZipInfo(member_name(key), date_time=_ZIP_TIME)
      info.compress_type = zipfile.ZIP_DEFLATED
      with z.open(info, "w", force_zip64=True) as f:
        np.lib.format.write_array(f, array, allow_pickle=False)
  return buffer.getvalue()


def parse_json(data: bytes | str) -> Any:
  """JSON text as Python values; ValueError for anything but JSON (a nesting too deep too)."""
  try:
    value = json.loads(data)
    canonical_json(value)  # no NaN or Infinity
  except RecursionError:
    raise ValueError("nested too deeply") from None
  return value


def arrays_name(manifest: Mapping[str, Any]) -> str:
  """A manifest's arrays file: ``arrays-<16 hex of its table's digest>.npz`` (v1 ``arrays.npz``)."""
  if manifest.get("format_version") == 1:
    return _V1_ARRAYS
  return f"arrays-{_checksum(manifest['arrays'])[7:23]}.npz"


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


def stored_format_version(path: str | os.PathLike) -> Any:
  """The ``format_version`` a baseline's manifest claims (None if unreadable), unvalidated."""
  try:
    with _open(str(Path(path) / MANIFEST), Path(path)) as f:
      manifest = parse_json(f.read())
    return manifest["format_version"] if manifest["format"] == FORMAT else None
  except (OSError, ValueError, BaselineError, KeyError, TypeError, IndexError):
    return None


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
  """The lock of ``directory`` (:func:`~nnx_pool.regression.lock.exclusive`), for ``timeout_s``."""
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


def _fail(path: Path, reason: str) -> BaselineError:
  return BaselineError(" ".join(f"baseline {path}: {reason}".split()))


# POSIX reads a baseline's files relative to one open directory, so that a directory
# swapped in between cannot mix two baselines; Windows has no directory descriptors
# (nor O_NONBLOCK, nor FIFOs) and reads them by path.
_DIR_FD = hasattr(os, "O_DIRECTORY") and os.open in os.supports_dir_fd
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _open_dir(path: Path) -> int | None:
  """A descriptor of directory ``path`` where the platform has them, else None."""
  if _DIR_FD:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
  if not path.exists():
    raise FileNotFoundError(path)
  if not path.is_dir():
    raise NotADirectoryError(20, "Not a directory", str(path))
  return None


def _open(name: str, path: Path, dfd: int | None = None):
  """Opens regular file ``name`` (of directory ``dfd``) for reading; a FIFO never blocks it."""
  if dfd is None:
    fd = os.open(path / name, os.O_RDONLY | _NONBLOCK | getattr(os, "O_BINARY", 0))
  else:
    fd = os.open(name, os.O_RDONLY | _NONBLOCK, dir_fd=dfd)
  if not stat.S_ISREG(os.fstat(fd).st_mode):
    os.close(fd)
    raise _fail(path, f"{os.path.basename(name)} is not a regular file; remove it and {_FIX}.")
  return os.fdopen(fd, "rb")


def _parse_manifest(path: Path, data: bytes) -> tuple[dict[str, Any], str]:
  """The validated manifest and the name of its arrays file."""
  try:
    manifest = parse_json(data.decode("utf-8"))
  except ValueError as e:
    raise _fail(path, f"{MANIFEST} is not valid JSON ({e}); {_FIX}.") from None
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
    raise _fail(path, f"{MANIFEST} is not an {FORMAT} manifest; {_FIX}.")
  version = manifest.get("format_version")
  if type(version) is int and version > FORMAT_VERSION:
    raise _fail(path, f"format version {version} is newer than this nnx-pool reads "
                f"({FORMAT_VERSION}); upgrade nnx-pool or re-record the baseline.")
  if type(version) is not int or version < 1:
    raise _fail(path, f"{MANIFEST} has no known format_version (got {version!r}); {_FIX}.")
  if manifest.get("manifest_sha256") != _checksum(manifest):
    raise _fail(path, f"{MANIFEST} was edited after recording (checksum mismatch); {_FIX}.")
  if not isinstance(manifest.get("arrays"), dict):
    raise _fail(path, f"{MANIFEST} has no 'arrays' table; {_FIX}.")
  return manifest, arrays_name(manifest)


class _Counted:
  """A member's stream that counts the bytes read from it (the ``.npy`` header's length)."""

  def __init__(self, stream):
    self.stream, self.count = stream, 0

  def read(self, n: int = -1) -> bytes:
    data = self.stream.read(n)
    self.count += len(data)
    return data


def _entry(path: Path, key: str, entry: Any) -> tuple[np.dtype, np.dtype, tuple[int, ...]]:
  """A manifest entry's dtype, storage dtype and shape, each checked for its type."""
  malformed = _fail(path, f"{MANIFEST} has a malformed entry for array {key!r}; {_FIX}.")
  if not isinstance(entry, dict) or not all(
      isinstance(entry.get(f), str) for f in ("dtype", "stored_as", "digest")):
    raise malformed
  shape = entry.get("shape")
  if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
    raise malformed
  try:
    dtype = dtype_by_name(entry["dtype"])
    stored_as = _stored_as(dtype, key)
  except (TypeError, ValueError):
    raise malformed from None
  if entry["stored_as"] != stored_as.name:
    raise malformed
  return dtype, stored_as, tuple(shape)


def _member(path: Path, name: str, key: str, z: zipfile.ZipFile, info: zipfile.ZipInfo,
            stored_as: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
  """The array of one member, its header and size checked before anything is allocated."""
  where = f"array {key!r} in {name}"
  with z.open(info) as raw:
    f = _Counted(raw)
    try:
      version = np.lib.format.read_magic(f)
      read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                     (2, 0): np.lib.format.read_array_header_2_0}.get(version)
      if read_header is None:
        raise ValueError(f"npy format version {version}")
      got_shape, fortran, dtype = read_header(f)
    except ValueError as e:
      raise _fail(path, f"{where} has no readable .npy header ({e}); {_FIX}.") from None
    if dtype.hasobject:
      raise _fail(path, f"{where} holds an object array; refusing to unpickle it; {_FIX}.")
    if dtype.name != stored_as.name:
      raise _fail(path, f"array {key!r} is stored as {dtype.name} but {MANIFEST} says "
                  f"{stored_as.name}; {_FIX}.")
    if tuple(got_shape) != shape or fortran:
      raise _fail(path, f"{where} has shape {tuple(got_shape)}"
                  f"{' (Fortran order)' if fortran else ''} but {MANIFEST} says {shape}; {_FIX}.")
    size = math.prod(shape) * dtype.itemsize
    if info.file_size != f.count + size:
      raise _fail(path, f"{where} holds {info.file_size - f.count} bytes of data where its shape "
                  f"{shape} needs {size}; {_FIX}.")
    data = bytearray()
    while len(data) < size:  # as the zip yields it: a size that lies allocates nothing
      chunk = f.read(min(_CHUNK, size - len(data)))
      if not chunk:
        raise _fail(path, f"{where} is truncated; {_FIX}.")
      data += chunk
  array = np.frombuffer(data, dtype=dtype).reshape(shape)
  return array if dtype.isnative else array.astype(dtype.newbyteorder("="))


def _load(path: Path, name: str, table: Mapping[str, Any], file) -> dict[str, np.ndarray]:
  """The arrays of ``file``, decoded and checked against the manifest's ``table``."""
  entries = {key: _entry(path, key, entry) for key, entry in sorted(table.items())}
  arrays = {}
  try:
    with zipfile.ZipFile(file) as z:
      infos = z.infolist()
      members = {info.filename: info for info in infos}
      if len(members) < len(infos):
        raise _fail(path, f"{name} holds two members of one name; {_FIX}.")
      held = {m.removesuffix(_MEMBER) if m.endswith(_MEMBER) else m for m in members}
      for key in sorted(set(table) ^ held):
        where = (f"listed in {MANIFEST} is missing from {name}" if key in table
                 else f"in {name} is not listed in {MANIFEST}")
        raise _fail(path, f"array {key!r} {where}; {_FIX}.")
      for key, (dtype, stored_as, shape) in entries.items():
        info = members.get(member_name(key))
        if info is None:  # held under another member name (np.savez's, of a key `x.npy`)
          raise _fail(path, f"array {key!r} is not held as {member_name(key)} in {name}; {_FIX}.")
        arrays[key] = _member(path, name, key, z, info, stored_as, shape).view(dtype)
  except (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError,
          RuntimeError) as e:  # RuntimeError: an encrypted member
    reason = f"{name} is truncated or damaged ({type(e).__name__}: {e}); {_FIX}."
    raise _fail(path, reason) from None
  for key in sorted(table):
    if digest(arrays[key]) != table[key]["digest"]:
      raise _fail(path, f"array {key!r} does not match its digest (changed after recording); "
                  f"{_FIX}.")
  return arrays


def read_baseline(path: str | os.PathLike) -> Baseline:
  """Loads and validates a baseline directory.

  Args:
    path: the baseline directory.

  Returns:
    The :class:`Baseline`.

  Raises:
    BaselineError: it is missing, damaged, edited or of a newer format (one line: what to do).
  """
  path = Path(path)
  try:
    dfd = _open_dir(path)
  except FileNotFoundError:
    raise _fail(path, f"no such directory; record one with `record --out {path}`.") from None
  except OSError as e:  # not a directory, or not readable
    raise _fail(path, f"cannot open it ({e.strerror}); pass a baseline directory.") from None
  try:
    for _ in range(_READ_ATTEMPTS):
      try:
        with _open(MANIFEST, path, dfd) as f:
          manifest, name = _parse_manifest(path, f.read())
      except FileNotFoundError:
        reason = f"{MANIFEST} is missing; record one with `record --out {path}`."
        raise _fail(path, reason) from None
      try:
        with _open(name, path, dfd) as f:
          return Baseline(path, manifest, _load(path, name, manifest["arrays"], f))
      except FileNotFoundError:
        continue  # a writer committed a new manifest and removed these arrays: read it again
    raise _fail(path, f"{name}, named by {MANIFEST}, is missing; {_FIX}.")
  except OSError as e:
    raise _fail(path, f"cannot read it ({e.strerror}); check its permissions.") from None
  finally:
    if dfd is not None:
      os.close(dfd)
