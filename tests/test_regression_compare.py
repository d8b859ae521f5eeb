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


@pytest.mark.parametrize(
    ("kind", "role", "dtype", "rule", "rtol", "atol"),
    [
        ("select", "output", "float32", "exact", 0, 0),
        ("select", "grad_input", "bfloat16", "exact", 0, 0),
        ("select_ties", "grad_input", "float32", "sum", 0, 0),
        ("select", "indices", "int32", "exact", 0, 0),
        ("window", "output", "float32", "allclose", 1e-6, 1e-6),
        ("window", "output", "float16", "allclose", 1e-3, 1e-3),
        ("window", "output", "bfloat16", "allclose", 1e-2, 1e-2),
        ("window", "output", "float64", "allclose", 1e-13, 1e-13),
        ("window", "grad_input", "float32", "allclose", 4e-6, 4e-6),
        ("window", "grad_input", "bfloat16", "allclose", 4e-2, 4e-2),
        ("window", "output", "int8", "exact", 0, 0),
        ("exact_sum", "output", "float32", "exact", 0, 0),
        ("exact_sum", "grad_input", "float32", "allclose", 4e-6, 4e-6),
        ("window_rel", "output", "float32", "allclose", 1e-6, float(np.finfo(np.float32).tiny)),
        ("gate", "output", "float32", "allclose", 1e-5, 1e-5),
        ("gate", "grad_params", "bfloat16", "allclose", 1e-1, 1e-1),
        ("model", "output", "float32", "allclose", 1e-5, 1e-5),
        ("model", "output", "bool", "exact", 0, 0),
    ],
)
def test_tolerance_policy_numbers(kind, role, dtype, rule, rtol, atol):
  dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
  tol = tolerance_for(kind, role, dt)
  assert (tol.rule, tol.rtol, tol.atol) == (rule, rtol, atol)
  assert tol.reason


def test_tolerance_user_override_applies_to_models_only():
  tol = tolerance_for("model", "output", np.float32, rtol=0.1)
  assert (tol.rtol, tol.atol, tol.reason) == (0.1, 1e-5, "set by the test")


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
