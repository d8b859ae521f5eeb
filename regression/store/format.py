"""The baseline format: the manifest, its checksum, and the arrays file it names.

The manifest holds the format and its version, every array's dtype, storage dtype,
shape and digest (the arrays file is named by a digest of this table), the caller's
fields, and a checksum of itself. float16 and the ml_dtypes are stored as raw bits.

The arrays file is a zip of ``.npy`` members, one per array: the array ``<key>`` is the
member ``<key>.npy`` (always: a key ``x.npy`` is the member ``x.npy.npy``), written here with
:mod:`zipfile` and :func:`numpy.lib.format.write_array`, never through Python keyword
arguments, so that no key (``file``, ``allow_pickle``) can clash with a parameter and no two
keys with one member. This is what ``np.savez_compressed`` wrote for every key that did not
end in ``.npy``, so the files of every version read the same way, and nnx-pool 0.2.0 reads
the new ones.

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
  (:mod:`nnx_pool.regression.fixture.weight_sets`). Batch baselines are unchanged from 2.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import unicodedata
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..constants import FORMAT_VERSION

FORMAT = "nnx-pool-regression"
MANIFEST = "manifest.json"
_V1_ARRAYS = "arrays.npz"  # the arrays file of format version 1
_MEMBER = ".npy"  # the array <key> is the zip member <key>.npy
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # every member's timestamp: equal arrays, equal bytes
# What a zip member's name cannot hold as it is: NUL ends it when read, and a backslash is
# read back as "/" on Windows (zipfile's own normalisation); other controls are refused too.
_UNNAMEABLE = ("Cc", "Cs")  # the Unicode categories refused: controls, lone surrogates


class BaselineError(Exception):
  """A baseline is missing, damaged, or of an incompatible version (a one-line message)."""


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
  """ml_dtypes, imported on first use: it costs 0.5 s (measured, ``-X importtime``), which a
  command that reads no such dtype need not pay."""
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
    problem = key_problem(key)
    if problem:
      raise ValueError(problem)
    array = np.asarray(array)
    stored_as = _stored_as(array.dtype, key)
    stored[key] = np.array(array.view(stored_as), order="C")  # keeps a 0-d array 0-d
    table[key] = {"dtype": array.dtype.name, "stored_as": stored_as.name,
                  "shape": [int(n) for n in array.shape], "digest": digest(array)}
  manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **fields, "arrays": table}
  manifest["manifest_sha256"] = _checksum(manifest)
  return manifest, stored


def key_problem(key: object) -> str | None:
  """Why ``key`` cannot name an array of a baseline (one line), or None when it can.

  Any non-empty string does that the manifest (JSON) and the arrays file (a zip member's
  UTF-8 name, :func:`member_name`) hold unchanged on every platform: letters of any script,
  spaces, ``/``; keys that differ only by case are two members of one zip, never two files.
  Refused: control characters (NUL cuts a member's name short), lone surrogates (no UTF-8)
  and backslashes (zipfile on Windows reads them back as ``/``).
  """
  if not isinstance(key, str) or not key:
    return f"array key must be a non-empty string; got {key!r}."
  bad = next((c for c in key if c == "\\" or unicodedata.category(c) in _UNNAMEABLE), None)
  if bad is not None:
    return (f"array key {key!r} holds {bad!r}, which a baseline's arrays file cannot name on "
            "every platform (control characters, lone surrogates and backslashes are refused); "
            "rename that leaf.")
  return None


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
