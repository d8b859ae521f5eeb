"""Reading a baseline: every byte checked before it is believed, nothing unpickled.

A reader opens the arrays file the manifest names, reading the manifest again if a writer
removed it meanwhile. It checks the manifest's checksum and format version, each member's
header (dtype, shape) against the manifest and the member's size against both before it
allocates the array, and reads the data as it comes out of the zip, so a header or a size
that lies costs no more memory than the file holds; any damage, a manifest nested too
deeply included, is one :class:`~.format.BaselineError` line.
"""

from __future__ import annotations

import math
import os
import stat
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .format import (
  _MEMBER,
  FORMAT,
  FORMAT_VERSION,
  MANIFEST,
  Baseline,
  BaselineError,
  _checksum,
  _stored_as,
  arrays_name,
  digest,
  dtype_by_name,
  member_name,
  parse_json,
)

_READ_ATTEMPTS = 10  # how often a reader starts again when a writer removed its arrays file
_CHUNK = 1 << 22  # bytes read from a member at a time
_FIX = "re-record it (`record --force`, or `--nnx-regression-update` for a fixture baseline)"


def stored_format_version(path: str | os.PathLike) -> Any:
  """The ``format_version`` a baseline's manifest claims (None if unreadable), unvalidated."""
  try:
    with _open(str(Path(path) / MANIFEST), Path(path)) as f:
      manifest = parse_json(f.read())
    return manifest["format_version"] if manifest["format"] == FORMAT else None
  except (OSError, ValueError, BaselineError, KeyError, TypeError, IndexError):
    return None


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
