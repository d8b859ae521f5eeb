"""The batch's inputs: small arrays generated deterministically, once, by integer hashing.

The values come from a SplitMix64 hash of each element's index, computed with
NumPy integer arithmetic, so they depend on no random-number API (NumPy's
``Generator`` streams and JAX's PRNG defaults both change between releases).
They are generated when a baseline is recorded and stored in it; ``check``
always reads them back from the baseline.

Each input is generated in float64 and cast to the case's dtype. Values meant
for low-precision cases are multiples of 1/8 below 5 in magnitude, so they are
exact, and distinct, in bfloat16 and float16 too.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..compare.tolerance import is_float
from ..store import dtype_by_name

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def uniform(shape: tuple[int, ...], salt: int) -> np.ndarray:
  """Deterministic float64 values in ``[0, 1)`` (SplitMix64 of the element index)."""
  n = math.prod(shape)
  z = (np.arange(1, n + 1, dtype=np.uint64) + np.uint64(salt) * np.uint64(1 << 32)) * _GOLDEN
  z = (z ^ (z >> np.uint64(30))) * _MIX1
  z = (z ^ (z >> np.uint64(27))) * _MIX2
  z = z ^ (z >> np.uint64(31))
  return ((z >> np.uint64(11)).astype(np.float64) / float(1 << 53)).reshape(shape)


def _ranks(shape: tuple[int, ...], salt: int) -> np.ndarray:
  """A deterministic permutation of ``0..n-1`` in the given shape."""
  u = uniform(shape, salt).ravel()
  ranks = np.empty(u.size, dtype=np.int64)
  ranks[np.argsort(u, kind="stable")] = np.arange(u.size)
  return ranks.reshape(shape)


def distinct_grid(shape: tuple[int, ...], salt: int) -> np.ndarray:
  """Distinct multiples of 1/8, centred on 0: exact and tie-free in every float dtype."""
  n = math.prod(shape)
  if n > 256:
    raise ValueError(
        f"`shape` must hold at most 256 elements to stay exact in bfloat16; got {shape}."
    )
  return (_ranks(shape, salt) - n // 2) / 8.0


def distinct_continuous(shape: tuple[int, ...], salt: int) -> np.ndarray:
  """Distinct values of order one that are not short binary fractions (rank plus a fraction)."""
  n = math.prod(shape)
  return (_ranks(shape, salt) - n / 2 + uniform(shape, salt + 1)) * (4.0 / n)


def positive(shape: tuple[int, ...], salt: int) -> np.ndarray:
  """Distinct values in ``[0.5, 2.5)``, for odd and fractional powers."""
  n = math.prod(shape)
  return 0.5 + 2.0 * (_ranks(shape, salt) + uniform(shape, salt + 1)) / n


def integers(shape: tuple[int, ...], salt: int) -> np.ndarray:
  """Integer values in ``[-8, 8]``; every sum of them is exact in float32 and bfloat16."""
  return np.floor(uniform(shape, salt) * 17.0) - 8.0


def extreme(shape: tuple[int, ...], salt: int) -> np.ndarray:
  """Magnitudes from 1e-40 (float32 subnormal) to 1e30, distinct.

  The first channel is positive and every other channel negative, so a window
  (which never mixes channels) cannot cancel.
  """
  exponents = np.array([-40.0, -30.0, -12.0, -3.0, 0.0, 3.0, 12.0, 30.0])
  u = uniform(shape, salt)
  pick = np.floor(uniform(shape, salt + 1) * exponents.size).astype(np.int64)
  values = (1.0 + u) * 10.0 ** exponents[pick]
  sign = np.where(np.arange(shape[-1]) == 0, 1.0, -1.0)
  return values * sign


def nonfinite(shape: tuple[int, ...], salt: int) -> np.ndarray:
  """A distinct grid with NaN, +inf and -inf at fixed places (shape ``(1, 4, 4, 2)``).

  Channel 0: NaN at (0, 1), +inf at (2, 2), -inf at (3, 3), one per 2x2 window.
  Channel 1: +inf and -inf in the same 2x2 window (an average is NaN there), and
  NaN at (3, 2).
  """
  if shape != (1, 4, 4, 2):
    raise ValueError(f"`shape` must be (1, 4, 4, 2) for the non-finite input; got {shape}.")
  x = distinct_grid(shape, salt)
  x[0, 0, 1, 0] = np.nan
  x[0, 2, 2, 0] = np.inf
  x[0, 3, 3, 0] = -np.inf
  x[0, 0, 0, 1] = np.inf
  x[0, 0, 1, 1] = -np.inf
  x[0, 3, 2, 1] = np.nan
  return x


def _zeros(shape: tuple[int, ...], salt: int) -> np.ndarray:
  del salt
  return np.zeros(shape)


# name -> (shape, generator, salt, what it is for)
Generator = Callable[[tuple[int, ...], int], np.ndarray]
INPUTS: dict[str, tuple[tuple[int, ...], Generator, int, str]] = {
    "one": ((1, 6, 6, 2), distinct_grid, 1, "one example, distinct values exact in every float"),
    "unbatched": ((6, 6, 2), distinct_grid, 2, "one example without a batch axis"),
    "batch": ((3, 6, 6, 2), distinct_continuous, 3, "a small batch of distinct values"),
    "asym": ((2, 5, 7, 3), distinct_continuous, 5, "asymmetric spatial sizes 5x7"),
    "seq": ((2, 9, 3), distinct_continuous, 7, "1-D sequences of length 9"),
    "vol": ((1, 4, 4, 4, 2), distinct_continuous, 9, "a 3-D volume 4x4x4"),
    "positive": ((2, 5, 7, 2), positive, 11, "positive values for odd and fractional LP norms"),
    "zeros": ((2, 4, 4, 2), _zeros, 0, "all zeros: every window is a tie"),
    "ints": ((2, 6, 6, 2), integers, 13, "integer values: sums are exact in any order"),
    "extreme": ((1, 6, 6, 2), extreme, 15, "magnitudes 1e-40..1e30, one sign per channel"),
    "nonfinite": ((1, 4, 4, 2), nonfinite, 17, "NaN, +inf and -inf at known places"),
    "gate_map": ((2, 5, 7, 8), distinct_continuous, 19, "a feature map for channel gates"),
    "gate_map_unbatched": ((5, 7, 8), distinct_continuous, 27, "one unbatched gate input"),
    "nchw_gate": ((1, 8, 6, 6), distinct_continuous, 25, "NCHW with 8 channels on axis 1"),
    "bad_rank": ((6, 6), distinct_grid, 21, "rank 2: no channel axis, must be refused"),
    "nchw": ((1, 2, 6, 6), distinct_grid, 23, "channels-first by mistake: must be refused"),
}


def make_input(name: str, dtype: str = "float32") -> np.ndarray:
  """Generates the named input in the given dtype.

  Args:
    name: a key of :data:`INPUTS`.
    dtype: a dtype name, e.g. ``"float32"``, ``"bfloat16"`` or ``"int8"``.

  Returns:
    A NumPy array (an ml_dtypes array for bfloat16).
  """
  if name not in INPUTS:
    raise ValueError(f"`name` must be one of {sorted(INPUTS)}; got {name!r}.")
  shape, generate, salt, _ = INPUTS[name]
  values = generate(shape, salt)
  target = dtype_by_name(dtype)
  if not is_float(target):
    if not np.all(np.isfinite(values)) or np.any(values != np.round(values)):
      raise ValueError(
          f"input {name!r} is not integer-valued, so it cannot be cast to `dtype` {dtype!r}; "
          "use 'ints' or 'zeros'."
      )
    info = np.iinfo(target) if target != np.bool_ else None
    if info is not None and (values.min() < info.min or values.max() > info.max):
      raise ValueError(f"input {name!r} does not fit `dtype` {dtype!r}.")
  return np.asarray(values).astype(target)


def make_cotangent(shape: tuple[int, ...], dtype) -> np.ndarray:
  """A fixed cotangent: small integers 1..5, exact in every float dtype."""
  n = math.prod(shape)
  values = (np.arange(n, dtype=np.int64) * 7) % 5 + 1
  return values.reshape(shape).astype(np.dtype(dtype))
