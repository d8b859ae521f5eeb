"""Compares arrays under a :class:`~nnx_pool.regression.compare.tolerance.Tolerance`.

Rules, in order:

1. Dtypes must be equal (a float32 result where the baseline holds float64 is
   a change, not a pass) and shapes must be equal.
2. NaN must be at the same places in both arrays.
3. Infinities must be equal (same place, same sign).
4. The finite rest: ``exact`` needs equal values; ``allclose`` needs
   ``|actual - expected| <= atol + rtol * |expected|``; ``sum`` compares the
   totals over the spatial axes (per sample and channel) exactly.

The verdict reports the largest absolute and relative error, how many
elements failed, and the first failing index. The relative error is taken only
where the baseline is not 0: where it is 0, a relative error means nothing
(any difference is infinitely many times it), so those elements count by their
absolute error alone, and the message says how many of the failing ones they are.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .tolerance import Tolerance, is_float


@dataclasses.dataclass
class Verdict:
  """The outcome of comparing one array with its baseline.

  Attributes:
    passed: whether every element is within tolerance.
    max_abs: the largest absolute error over finite elements (0 when equal).
    max_rel: the largest relative error over the elements whose baseline is not 0.
    mismatches: how many elements failed.
    size: how many elements were compared.
    message: why it failed ("" when it passed).
    excess: the largest ``|actual - expected| / (atol + rtol * |expected|)``, how many
      times its tolerance the worst element is off (``inf`` for an exact rule, a moved NaN
      or a changed shape); what reports rank failing arrays by.
  """

  passed: bool
  max_abs: float = 0.0
  max_rel: float = 0.0
  mismatches: int = 0
  size: int = 0
  message: str = ""
  excess: float = 0.0

  def to_json(self) -> dict[str, Any]:
    """A JSON-safe dict (infinite errors become the string ``"inf"``)."""
    data = dataclasses.asdict(self)
    for key in ("max_abs", "max_rel", "excess"):
      data[key] = json_float(data[key])
    return data


def json_float(value: float | None) -> float | str | None:
  """A float that JSON can hold: ``inf``/``nan`` become strings."""
  if value is None or math.isfinite(value):
    return value
  return str(value)


def _sum_spatial(a: np.ndarray) -> np.ndarray:
  """Totals over the spatial axes: keeps the first (batch) and last (channel) axis."""
  if a.ndim >= 3:
    return a.sum(axis=tuple(range(1, a.ndim - 1)))
  return a.sum(axis=tuple(range(a.ndim - 1))) if a.ndim >= 2 else a.sum(keepdims=True)


def compare_arrays(actual: np.ndarray, expected: np.ndarray, tol: Tolerance) -> Verdict:
  """Compares ``actual`` with the baseline's ``expected``.

  Args:
    actual: the array computed now.
    expected: the baseline's array.
    tol: the tolerance to apply.

  Returns:
    A :class:`Verdict`.
  """
  actual, expected = np.asarray(actual), np.asarray(expected)
  if actual.dtype != expected.dtype:
    return Verdict(False, math.inf, math.inf, message=(
        f"dtype {actual.dtype.name} != baseline {expected.dtype.name}"), excess=math.inf)
  if actual.shape != expected.shape:
    return Verdict(False, math.inf, math.inf, message=(
        f"shape {actual.shape} != baseline {expected.shape}"), excess=math.inf)
  if not is_float(actual.dtype):
    return _compare_exact_ints(actual, expected)
  a, e = actual.astype(np.float64), expected.astype(np.float64)
  with np.errstate(all="ignore"):
    if tol.rule == "sum":
      a, e = _sum_spatial(a), _sum_spatial(e)
    return _finish(a, e, tol, exact=tol.rule in ("exact", "sum"))


def _compare_exact_ints(actual: np.ndarray, expected: np.ndarray) -> Verdict:
  """Integers and bools: equal or not, compared in their own dtype (no float rounding)."""
  bad = actual != expected
  size = int(actual.size)
  mismatches = int(bad.sum())
  diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
  scale = np.abs(expected.astype(np.float64))
  rel = np.where((diff > 0) & (scale > 0), diff / np.where(scale > 0, scale, 1.0), 0.0)
  return Verdict(
      mismatches == 0, float(diff.max()) if size else 0.0, float(rel.max()) if size else 0.0,
      mismatches, size, _differ(bad, actual, expected, lambda v: repr(v.item())),
      math.inf if mismatches else 0.0,
  )


def failing_elements(actual: np.ndarray, expected: np.ndarray, tol: Tolerance) -> np.ndarray:
  """Which elements fail the comparison :func:`compare_arrays` makes.

  Under the ``sum`` rule an element fails when the total of its sample and
  channel does.

  Args:
    actual: the array computed now.
    expected: the baseline's array, of the same dtype and shape.
    tol: the tolerance to apply.

  Returns:
    A bool array of their shape.

  Raises:
    ValueError: the dtypes or shapes differ, so no element corresponds to another.
  """
  actual, expected = np.asarray(actual), np.asarray(expected)
  if actual.dtype != expected.dtype or actual.shape != expected.shape:
    raise ValueError(
        f"`actual` and `expected` must have one dtype and shape; got {actual.dtype.name}"
        f"{list(actual.shape)} and {expected.dtype.name}{list(expected.shape)}.")
  if not is_float(actual.dtype):
    return actual != expected
  a, e = actual.astype(np.float64), expected.astype(np.float64)
  with np.errstate(all="ignore"):
    if tol.rule != "sum":
      return _failures(a, e, tol, exact=tol.rule == "exact")[0]
    totals = _failures(_sum_spatial(a), _sum_spatial(e), tol, exact=True)[0]
  if a.ndim >= 3:  # (N, C) totals back over the spatial axes
    totals = totals.reshape(totals.shape[0], *[1] * (a.ndim - 2), totals.shape[-1])
  return np.broadcast_to(totals, a.shape).copy()


def _failures(
    a: np.ndarray, e: np.ndarray, tol: Tolerance, *, exact: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(failing elements, finite elements, |a - e| where finite else 0)`` of float64 arrays."""
  nan_a, nan_e = np.isnan(a), np.isnan(e)
  inf_a, inf_e = np.isinf(a), np.isinf(e)
  bad = nan_a != nan_e
  bad |= (inf_a | inf_e) & ~(nan_a | nan_e) & (a != e)
  finite = ~(nan_a | nan_e | inf_a | inf_e)
  diff = np.where(finite, np.abs(a - e), 0.0)
  if exact:
    bad |= finite & (diff > 0)
  else:
    bad |= finite & (diff > tol.atol + tol.rtol * np.abs(e))
  return bad, finite, diff


def _finish(a: np.ndarray, e: np.ndarray, tol: Tolerance, *, exact: bool) -> Verdict:
  size = int(a.size)
  bad, finite, diff = _failures(a, e, tol, exact=exact)
  scale = np.abs(e)
  nonzero = finite & (scale > 0)
  rel = np.where(nonzero & (diff > 0), diff / np.where(nonzero, scale, 1.0), 0.0)
  mismatches = int(bad.sum())
  max_abs = float(diff.max()) if size else 0.0
  max_rel = float(rel.max()) if size else 0.0
  if exact:
    excess = math.inf if mismatches else 0.0
  else:
    limit = tol.atol + tol.rtol * scale
    ratio = np.where(finite & (diff > 0), diff / np.where(limit > 0, limit, 1.0), 0.0)
    ratio = np.where(finite & (diff > 0) & (limit == 0), math.inf, ratio)
    excess = float(ratio.max()) if size else 0.0
  if (bad & ~finite).any():
    max_abs = max_rel = excess = math.inf
  message = _differ(bad, a, e, lambda v: f"{float(v):.9g}")
  at_zero = int((bad & finite & (scale == 0)).sum())
  if at_zero:
    message += (f"; {at_zero} of them where the baseline is 0, compared by absolute error "
                "(no relative error there)")
  return Verdict(mismatches == 0, max_abs, max_rel, mismatches, size, message, excess)


def _differ(bad: np.ndarray, actual: np.ndarray, expected: np.ndarray,
            show: Callable[[Any], str]) -> str:
  """``2 of 18 elements differ (first at (0, 1, 2, 1): 1.5 vs baseline 1.25)``; "" if none.

  ``show`` writes one element: integers as they are, floats to 9 significant digits.
  """
  mismatches = int(bad.sum())
  if not mismatches:
    return ""
  first = tuple(int(i) for i in np.argwhere(bad)[0])
  return (f"{mismatches} of {bad.size} elements differ (first at {first}: "
          f"{show(actual[first])} vs baseline {show(expected[first])})")
