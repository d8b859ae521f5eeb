"""Tests for regression.compare and regression.tolerance: the comparison rules and the policy."""

import math

import ml_dtypes
import numpy as np
import pytest

from nnx_pool.regression.compare import compare_arrays, failing_elements
from nnx_pool.regression.tolerance import Tolerance, tolerance_for

EXACT = Tolerance("exact")
CLOSE = Tolerance("allclose", rtol=1e-6, atol=1e-6)


def test_compare_equal_arrays_pass_with_zero_error():
  a = np.array([1.0, -2.0, 3.5], np.float32)
  verdict = compare_arrays(a, a.copy(), EXACT)
  assert verdict.passed and verdict.max_abs == 0 and verdict.max_rel == 0 and verdict.size == 3


def test_compare_allclose_boundary_is_atol_plus_rtol_times_expected():
  expected = np.array([1.0, 100.0])
  # 100 * 1e-6 + 1e-6 = 1.01e-4 is allowed at 100; twice that is not.
  assert compare_arrays(expected + [0, 1.0e-4], expected, CLOSE).passed
  verdict = compare_arrays(expected + [0, 2.1e-4], expected, CLOSE)
  assert not verdict.passed and verdict.mismatches == 1
  assert verdict.max_abs == pytest.approx(2.1e-4) and verdict.max_rel == pytest.approx(2.1e-6)
  assert "1 of 2 elements differ (first at (1,): 100.00021 vs baseline 100)" in verdict.message


def test_compare_message_counts_every_failing_element_and_names_the_first():
  expected = np.zeros((2, 3), np.float32)
  actual = expected.copy()
  actual[0, 2], actual[1, 0] = 0.5, 2.0  # row-major: (0, 2) comes first
  assert compare_arrays(actual, expected, CLOSE).message == (
      "2 of 6 elements differ (first at (0, 2): 0.5 vs baseline 0); 2 of them where the "
      "baseline is 0, compared by absolute error (no relative error there)")
  ints = np.array([[1, 2], [3, 4]], np.int32)
  assert compare_arrays(ints, np.array([[1, 0], [0, 4]], np.int32), EXACT).message == (
      "2 of 4 elements differ (first at (0, 1): 2 vs baseline 0)")


def test_compare_relative_error_only_where_the_baseline_is_not_zero():
  # Hand-built: |1.5 - 1| / 1 = 0.5 is the one relative error; the element whose baseline is
  # 0 moved by 0.25 and counts by its absolute error, never as an infinite relative one.
  expected = np.array([0.0, 1.0, 2.0], np.float32)
  actual = np.array([0.25, 1.5, 2.0], np.float32)
  verdict = compare_arrays(actual, expected, CLOSE)
  assert (verdict.max_abs, verdict.max_rel, verdict.mismatches) == (0.5, 0.5, 2)
  assert verdict.message == (
      "2 of 3 elements differ (first at (0,): 0.25 vs baseline 0); 1 of them where the "
      "baseline is 0, compared by absolute error (no relative error there)")
  only_zero = compare_arrays(np.array([0.25, 1.0], np.float32), np.zeros(2, np.float32), CLOSE)
  assert (only_zero.max_abs, only_zero.max_rel) == (1.0, 0.0)


def test_compare_excess_is_the_worst_element_over_its_own_tolerance():
  # atol 1e-6 + rtol 1e-6 * |e|: at e = 1 the limit is 2e-6, at e = 0 it is 1e-6. An error of
  # 4e-6 at e = 1 is 2x its limit, 3e-6 at e = 0 is 3x: the worst is 3x.
  expected = np.array([1.0, 0.0])
  verdict = compare_arrays(expected + [4e-6, 3e-6], expected, CLOSE)
  assert verdict.excess == pytest.approx(3.0)
  assert compare_arrays(expected, expected, CLOSE).excess == 0
  assert compare_arrays(expected + [1.0, 0], expected, EXACT).excess == math.inf
  assert compare_arrays(expected[:1], expected, CLOSE).excess == math.inf  # shape changed


def test_compare_nan_must_be_at_the_same_places():
  expected = np.array([np.nan, 1.0], np.float32)
  assert compare_arrays(np.array([np.nan, 1.0], np.float32), expected, EXACT).passed
  verdict = compare_arrays(np.array([0.0, 1.0], np.float32), expected, CLOSE)
  assert not verdict.passed and math.isinf(verdict.max_abs)
  assert not compare_arrays(np.array([np.nan, np.nan], np.float32), expected, CLOSE).passed


def test_compare_infinities_must_match_in_sign():
  expected = np.array([np.inf, -np.inf])
  assert compare_arrays(expected.copy(), expected, CLOSE).passed
  assert not compare_arrays(np.array([np.inf, np.inf]), expected, CLOSE).passed
  assert not compare_arrays(np.array([1e308, -np.inf]), expected, CLOSE).passed


def test_compare_dtype_and_shape_changes_fail():
  a = np.ones(3, np.float32)
  verdict = compare_arrays(a.astype(np.float64), a, CLOSE)
  assert not verdict.passed and verdict.message == "dtype float64 != baseline float32"
  assert compare_arrays(a[:2], a, CLOSE).message == "shape (2,) != baseline (3,)"


def test_compare_integers_are_exact_in_their_own_dtype():
  big = np.array([2**62 + 1], np.int64)  # float64 cannot tell it from 2**62
  verdict = compare_arrays(big, np.array([2**62], np.int64), EXACT)
  assert not verdict.passed
  # Plain numbers in the message (NumPy 2's repr would say np.int64(...)).
  assert "(first at (0,): 4611686018427387905 vs baseline 4611686018427387904)" in verdict.message
  loose = Tolerance("allclose", rtol=0.5, atol=0.5)
  assert not compare_arrays(np.array([1], np.int32), np.array([2], np.int32), loose).passed
  assert compare_arrays(np.array([True]), np.array([True]), EXACT).passed


def test_compare_bfloat16_without_precision_loss():
  expected = np.array([1.0, 2.0], ml_dtypes.bfloat16)
  bumped = np.array([1.0078125, 2.0], ml_dtypes.bfloat16)  # one ulp above 1
  assert not compare_arrays(bumped, expected, EXACT).passed
  assert compare_arrays(bumped, expected, Tolerance("allclose", rtol=1e-2, atol=1e-2)).passed


def test_compare_sum_rule_ignores_where_tied_gradient_lands():
  # (N=1, H=2, W=2, C=1): the same total per (sample, channel), different element.
  expected = np.array([1.0, 0, 0, 0], np.float32).reshape(1, 2, 2, 1)
  moved = np.array([0, 0, 1.0, 0], np.float32).reshape(1, 2, 2, 1)
  ties = Tolerance("sum")
  assert compare_arrays(moved, expected, ties).passed
  assert not compare_arrays(moved, expected, EXACT).passed
  assert not compare_arrays(moved * 2, expected, ties).passed


def test_failing_elements_mark_what_compare_counts():
  # Hand-built: one value over atol + rtol*|expected|, one NaN moved, one inf flipped,
  # one value within tolerance; the verdict counts exactly the marked elements.
  expected = np.array([1.0, 2.0, np.nan, np.inf, 5.0])
  actual = np.array([1.0 + 3e-6, 2.0 + 1e-6, 3.0, -np.inf, 5.0])
  bad = failing_elements(actual, expected, CLOSE)
  assert bad.tolist() == [True, False, True, True, False]
  assert compare_arrays(actual, expected, CLOSE).mismatches == int(bad.sum())
  assert failing_elements(np.array([3, 4], np.int32), np.array([3, 5], np.int32),
                          EXACT).tolist() == [False, True]


def test_failing_elements_under_the_sum_rule_mark_the_whole_sample_and_channel():
  expected = np.zeros((2, 2, 2, 2), np.float32)
  actual = expected.copy()
  actual[1, 0, 0, 0], actual[1, 1, 1, 0] = 1, -1  # the total of (1, channel 0) is unchanged
  actual[0, 0, 1, 1] = 1  # the total of (0, channel 1) moved
  bad = failing_elements(actual, expected, Tolerance("sum"))
  assert bad.shape == expected.shape
  assert bad[0, :, :, 1].all() and bad.sum() == 4


def test_failing_elements_need_one_dtype_and_shape():
  with pytest.raises(ValueError, match=r"one dtype and shape; got float32\[2\] and float64\[2\]"):
    failing_elements(np.zeros(2, np.float32), np.zeros(2), EXACT)


def test_compare_raises_no_numpy_warnings():
  # pytest turns warnings into errors here: inf - inf and 0/0 must stay silent.
  a = np.array([np.inf, 0.0, np.nan, -np.inf])
  assert not compare_arrays(a, np.array([np.inf, 0.0, 1.0, 0.0]), CLOSE).passed


# ---------------------------------------------------------------- policy
# What each tolerance must cover, derived here from the dtype's epsilon and the length of the
# reduction it is there for, never read from tolerance.py's table.
#
# * eps is the spacing of the dtype's floats in [1, 2); u = eps / 2 rounds one operation.
# * A sum of n terms in any order lies within (n - 1) u of the exact sum, relative to the sum
#   of the magnitudes (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq.
#   4.4). Two orders (the baseline's and this run's) then differ by at most (n - 1) eps; a
#   chain of k further roundings adds k eps.
# * float16 and bfloat16 are computed in float32 and rounded once (tolerance.py's stated
#   policy): each run is within u of its float32 value, so two runs differ by one eps of the
#   dtype, plus the float32 bound.
# * A gradient carries the forward's error and adds a reduction of its own of as many terms
#   (the backward of a window sums the cotangents of the up to 9 windows overlapping a cell):
#   twice the forward's bound.
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
# Roundings of the forward, counted in eps as above (two runs): a window sums up to 9 cells
# (3x3, the batch's largest window and adaptive bin); a whole-map mean up to 80 (the longest
# the policy covers); a gate averages the batch's 5x7 map (35 cells), runs two matmuls over
# 8 channels (8 terms each), a sigmoid (exp, division) and a product: 34 + 7 + 7 + 3.
FORWARD_ROUNDINGS = {"window": 8, "global": 79, "gate": 51}
# What each kind of case reduces: windows (also the gradient of an exact integer average and
# of extreme magnitudes), whole maps, gates; a user's model is given a gate's budget.
# check_grad's "gradient" kind: its loss is a model forward (a gate's budget), and each gradient
# leaf repeats the forward's reductions in the backward pass, as the gradient rows below count.
REDUCES = {"window": "window", "window_rel": "window", "exact_sum": "window", "global": "global",
           "gate": "gate", "model": "gate", "gradient": "gate"}
# Not absurdly larger: at most 100x the forward's bound. The policy gives a gradient 4x its
# forward's tolerance against a bound twice the forward's: the same headroom is 200x there.
MOST = {"output": 100, "grad_input": 200, "grad_params": 200}


def _dtype(name: str) -> np.dtype:
  return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _bound(roundings: int, dtype: str) -> float:
  if dtype in ("float64", "float32"):
    return roundings * EPS[dtype]
  return roundings * EPS["float32"] + EPS[dtype]


@pytest.mark.parametrize(("kind", "role", "dtype"), [
    (kind, role, dtype) for kind in REDUCES for role in MOST for dtype in EPS
    if (kind, role) != ("exact_sum", "output")  # exact: see the next test
])
def test_tolerance_covers_the_rounding_it_is_there_for_and_not_much_more(kind, role, dtype):
  roundings = FORWARD_ROUNDINGS[REDUCES[kind]] * (1 if role == "output" else 2)
  bound = _bound(roundings, dtype)
  tol = tolerance_for(kind, role, _dtype(dtype))
  assert tol.rule == "allclose" and tol.reason
  assert bound <= tol.rtol <= MOST[role] * bound, (tol.rtol, bound, tol.rtol / bound)
  if kind == "window_rel" and role == "output":
    # Same-signed windows cannot cancel, so only a result below the smallest normal number
    # loses its relative precision (a subnormal flushed to zero): it moves by at most that.
    tiny = float(ml_dtypes.finfo(_dtype(dtype)).tiny)
    assert tiny <= tol.atol <= 100 * tiny
  else:
    assert tol.atol == tol.rtol  # the batch's inputs are of order one


@pytest.mark.parametrize(("kind", "role", "dtype", "rule"), [
    # max and min select an input value, and their gradient scatters a small-integer
    # cotangent that adds exactly in any order; under ties only the totals are pinned.
    *[(kind, role, dtype, "sum" if kind == "select_ties" and role.startswith("grad") else "exact")
      for kind in ("select", "select_ties") for role in ("output", "grad_input", "grad_params")
      for dtype in EPS],
    # Integer-valued inputs sum exactly, so their average is one correctly rounded division.
    *[("exact_sum", "output", dtype, "exact") for dtype in EPS],
    # Indices, integers and bools have no rounding, whatever the kind.
    *[(kind, "indices", "int32", "exact") for kind in REDUCES],
    *[(kind, "output", dtype, "exact") for kind in REDUCES for dtype in ("int8", "int32", "bool")],
])
def test_tolerance_exact_kinds_are_exact(kind, role, dtype, rule):
  tol = tolerance_for(kind, role, _dtype(dtype))
  assert (tol.rule, tol.rtol, tol.atol) == (rule, 0, 0) and tol.reason


def test_tolerance_user_override_applies_to_models_only():
  tol = tolerance_for("model", "output", np.float32, rtol=0.1)
  assert (tol.rtol, tol.atol, tol.reason) == (0.1, 1e-5, "set by the test")
  tol = tolerance_for("gradient", "grad_params", np.float32, atol=0.5)
  assert (tol.rtol, tol.atol, tol.reason) == (4e-5, 0.5, "set by the test")
  assert tolerance_for("window", "output", np.float32, rtol=0.1).rtol == 1e-6


def test_tolerance_gradient_kind_labels_the_loss_and_the_gradients_apart():
  # check_grad's rows say what they are: a loss is a forward result, a gradient a gradient
  # (the report called both "user model forward").
  loss = tolerance_for("gradient", "output", np.float32)
  grad = tolerance_for("gradient", "grad_params", np.float32)
  assert loss.reason.startswith("loss of check_grad") and grad.reason.startswith("gradient of")
  assert grad.rtol > loss.rtol


def test_tolerance_round_trips_through_json():
  tol = tolerance_for("window", "output", np.float16)
  assert Tolerance.from_json(tol.to_json()) == tol
  assert tol.describe() == "rtol=1e-03 atol=1e-03"


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: tolerance_for("fuzzy", "output", np.float32), ValueError, "`kind` must be one of"),
        (lambda: tolerance_for("window", "loss", np.float32), ValueError, "`role` must be one of"),
        (lambda: Tolerance("approx"), ValueError, "`rule` must be 'exact', 'allclose' or 'sum'"),
        (lambda: Tolerance("allclose", rtol=-1), ValueError, "non-negative; got rtol=-1"),
        (lambda: Tolerance.from_json([1]), TypeError, "`data` must be a mapping; got list"),
    ],
)
def test_tolerance_bad_arguments_name_the_argument(call, error, match):
  with pytest.raises(error, match=match):
    call()
