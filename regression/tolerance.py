"""The tolerance policy's public path; it lives in :mod:`nnx_pool.regression.compare.tolerance`.

What counts as "the same number" for each kind of result: the kind of computation, the
role of the array and its dtype resolve to a :class:`Tolerance` with its reason.
"""

from .compare.tolerance import (
  EXACT,
  KINDS,
  LOW_PRECISION_ULPS,
  MODULE_SHARE,
  ROLES,
  SCALE_ULPS,
  SCALED_KINDS,
  Tolerance,
  dtype_name,
  floored,
  is_float,
  policy_table,
  scales,
  tolerance_for,
)

__all__ = ["EXACT", "KINDS", "LOW_PRECISION_ULPS", "MODULE_SHARE", "ROLES", "SCALED_KINDS",
           "SCALE_ULPS", "Tolerance", "dtype_name", "floored", "is_float",
           "policy_table", "scales", "tolerance_for"]
