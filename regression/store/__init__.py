"""Baselines on disk: ``manifest.json`` naming an ``arrays-<hex>.npz``, written atomically.

A baseline is a directory: a manifest (the format, its version, every array's dtype, shape
and digest, the caller's fields, a checksum of itself) and the arrays file it names. Loading
never unpickles; any damage is one :class:`BaselineError` line. No JAX here.

* :mod:`.format`: the manifest, its checksum, the arrays file, the format versions;
* :mod:`.write`: writing one atomically, under the lock of its directory;
* :mod:`.read`: reading one, every byte checked before it is believed;
* :mod:`.lock`: the kit's one lock between processes (the store's writers, ``rehearse``).
"""

from .format import (
  FORMAT,
  FORMAT_VERSION,
  MANIFEST,
  Baseline,
  BaselineError,
  arrays_name,
  build_manifest,
  canonical_json,
  digest,
  dtype_by_name,
  encode_arrays,
  key_problem,
  member_name,
  parse_json,
)
from .read import read_baseline, stored_format_version
from .write import (
  LOCK_TIMEOUT_S,
  BaselineLockedError,
  check_writable,
  inside_baseline_problem,
  is_link,
  link_target,
  write_atomic,
  write_baseline,
)

__all__ = [
  "FORMAT", "FORMAT_VERSION", "LOCK_TIMEOUT_S", "MANIFEST", "Baseline", "BaselineError",
  "BaselineLockedError", "arrays_name", "build_manifest", "canonical_json", "check_writable",
  "digest", "dtype_by_name", "encode_arrays", "inside_baseline_problem", "is_link",
  "key_problem", "link_target", "member_name", "parse_json", "read_baseline",
  "stored_format_version", "write_atomic", "write_baseline",
]
