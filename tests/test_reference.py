"""Tests of the NumPy mirror `nnx_pool.reference`.

Two layers: the peers' test vectors (PyTorch 2.13 CPU, lax and Flax, each with its
source named), and a few more worked out by hand from the rules, written out next to
their inputs; then a
seeded parity sweep against PyTorch 2.13 (CPU), which is skipped when torch is
not installed. Arrays are channels-last; PyTorch is fed NCHW via moveaxis.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from nnx_pool import reference as ref

NAN = np.nan


def _grid(rows) -> np.ndarray:
  """A 2-D list as a (1, H, W, 1) float64 array."""
  a = np.asarray(rows, dtype=np.float64)
  return a.reshape(1, *a.shape, 1)


def _row(values, dtype=np.float64) -> np.ndarray:
  """A 1-D list as a (1, L, 1) array."""
  return np.asarray(values, dtype=dtype).reshape(1, -1, 1)


# The project's seed-003 grid (PyTorch 2.13 CPU checked every vector quoted from it below).
SEED003 = [[1, 2, 5, 6], [3, 4, 8, 7], [0, -1, -3, -2], [-4, 9, -6, -5]]


# ----------------------------------------------------------------------------
# Output size and SAME padding.
# ----------------------------------------------------------------------------


# Source: PyTorch 2.13 CPU, F.max_pool2d(zeros(1, 1, 4, 4), window, stride).shape[-1].
@pytest.mark.parametrize(
  ("window", "stride", "expected"),
  [(2, 2, 2), (3, 1, 2), (2, 1, 3), (4, 1, 1), (1, 1, 4), (3, 2, 1), (1, 3, 2)],
)
def test_output_size_matches_table(window, stride, expected):
  assert ref.output_size(4, window, stride, 0, 0) == expected


def test_output_size_ceil_l10_k1_s2_gives_5():
  # Source: PyTorch 2.13 CPU, F.max_pool1d(zeros(1, 1, 10), 1, 2, ceil_mode=True): 5.
  assert ref.output_size(10, 1, 2, 0, 0, ceil_mode=True) == 5
  assert ref.output_size(10, 1, 2, 0, 0, ceil_mode=False) == 5


def test_output_size_ceil_drops_window_starting_in_right_padding():
  # Source: the rule; checked on torch 2.13: max_pool1d(arange(5), 2, 2, 1, ceil_mode=True)
  # has 3 outputs. ceil((5+2-2)/2)+1 = 4, but window 3 would start at 6 >= 5+1.
  assert ref.output_size(5, 2, 2, 1, 1, ceil_mode=True) == 3
  # 7x7, k2 s3, ceil: ceil(5/3)+1 = 3 and the last window starts at 6 < 7.
  assert ref.output_size(7, 2, 3, 0, 0, ceil_mode=True) == 3
  assert ref.output_size(7, 2, 3, 0, 0, ceil_mode=False) == 2


def test_output_size_with_dilation():
  # Source: the rule: e = 2*(3-1)+1 = 5, (5+2-5)//1+1 = 3 (torch 2.13 agrees).
  assert ref.output_size(5, 3, 1, 1, 1, dilation=2) == 3


def test_output_size_rejects_window_larger_than_input():
  with pytest.raises(ValueError):
    ref.output_size(2, 3, 1, 0, 0)
  with pytest.raises(ValueError):
    ref.output_size(4, 2, 0, 0, 0)


@pytest.mark.parametrize(
  ("length", "window", "stride", "dilation", "expected"),
  [
    (2, 2, 1, 1, (0, 1)),  # total 1: the extra cell goes high (Flax vector below).
    (5, 3, 2, 1, (1, 1)),  # out 3, total 2*2+3-5 = 2.
    (4, 3, 2, 1, (0, 1)),  # out 2, total 2+3-4 = 1.
    (7, 1, 3, 1, (0, 0)),  # out 3, total max(6+1-7, 0) = 0.
    (4, 2, 4, 1, (0, 0)),  # stride larger than the window: max(0+2-4, 0) = 0.
    (5, 3, 1, 2, (2, 2)),  # dilated window e = 5: total 4.
    (6, 4, 1, 1, (1, 2)),  # total 3.
  ],
)
def test_same_padding_follows_lax_rule(length, window, stride, dilation, expected):
  # Source: lax.padtype_to_pads's SAME rule (out = ceil(L / s), total = max((out - 1) * s +
  # e - L, 0), the extra cell high), worked by hand.
  assert ref.same_padding(length, window, stride, dilation) == expected


# ----------------------------------------------------------------------------
# Average pooling.
# ----------------------------------------------------------------------------


def test_avg_pool_flax_same_counts_padding():
  # Source: Flax's own test (tests/linen/linen_test.py, PoolTest.test_avg_pool_padding_same):
  # [[1,2],[3,4]], 2x2, stride 1, SAME, including pads: [10, 6, 7, 4] / 4.
  # Under the PyTorch rule the SAME pad (0, 1) is explicit padding, so it counts.
  x = _grid([[1, 2], [3, 4]])
  out = ref.avg_pool(x, (2, 2), (1, 1), "SAME")
  np.testing.assert_allclose(out.ravel(), [2.5, 1.5, 1.75, 1.0])


def test_avg_pool_flax_same_excludes_padding():
  # Source: the same Flax test, excluding pads: [10/4, 6/2, 7/2, 4/1].
  x = _grid([[1, 2], [3, 4]])
  out = ref.avg_pool(x, (2, 2), (1, 1), "SAME", count_include_pad=False)
  np.testing.assert_allclose(out.ravel(), [2.5, 3.0, 3.5, 4.0])


def test_avg_pool_1d_k3_s1_p1_both_policies():
  # Source: PyTorch 2.13 CPU, F.avg_pool1d([1..5], 3, 1, 1), count_include_pad True, False.
  x = _row([1, 2, 3, 4, 5])
  incl = ref.avg_pool(x, (3,), (1,), ((1, 1),))
  excl = ref.avg_pool(x, (3,), (1,), ((1, 1),), count_include_pad=False)
  np.testing.assert_allclose(incl.ravel(), [1, 2, 3, 4, 3])
  np.testing.assert_allclose(excl.ravel(), [1.5, 2, 3, 4, 4.5])


def test_avg_pool_ceil_7x7_overhang_not_counted():
  # Source: PyTorch 2.13 CPU, F.avg_pool2d(arange(49).reshape(7, 7), 2, 3, ceil_mode=True).
  x = np.arange(49, dtype=np.float64).reshape(1, 7, 7, 1)
  out = ref.avg_pool(x, (2, 2), (3, 3), "VALID", ceil_mode=True)
  expected = [[4, 7, 9.5], [25, 28, 30.5], [42.5, 45.5, 48]]
  np.testing.assert_allclose(out[0, :, :, 0], expected)


def test_avg_pool_arange16_seed004():
  # Source: the project's seed 004: arange(16), 2x2, stride 2, VALID (PyTorch 2.13 CPU too).
  x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
  out = ref.avg_pool(x, (2, 2), (2, 2), "VALID")
  assert out.dtype == np.float32
  np.testing.assert_allclose(out.ravel(), [2.5, 4.5, 10.5, 12.5])


def test_avg_pool_ceil_with_padding_counts_pad_but_not_overhang():
  # Source: torch 2.13: avg_pool1d([1..6], 3, 2, 1, ceil_mode=True) gives [1, 3, 5, 3]
  # and with count_include_pad=False [1.5, 3, 5, 6]. The last window [5, 8) is
  # clipped to [-1, 7): one real cell and one pad cell, divisor 2.
  x = _row([1, 2, 3, 4, 5, 6])
  incl = ref.avg_pool(x, (3,), (2,), ((1, 1),), ceil_mode=True)
  excl = ref.avg_pool(x, (3,), (2,), ((1, 1),), ceil_mode=True, count_include_pad=False)
  np.testing.assert_allclose(incl.ravel(), [1, 3, 5, 3])
  np.testing.assert_allclose(excl.ravel(), [1.5, 3, 5, 6])


def test_avg_pool_divisor_override_replaces_divisor():
  # Source: hand: the 2x2 window sums of arange(16) are 10, 18, 42, 50; divided by 2.
  x = np.arange(16, dtype=np.float64).reshape(1, 4, 4, 1)
  out = ref.avg_pool(x, (2, 2), (2, 2), "VALID", divisor_override=2)
  np.testing.assert_allclose(out.ravel(), [5, 9, 21, 25])


def test_avg_pool_sums_in_float64_then_casts():
  # Source: hand: float16 cannot hold 2049, but the float64 sum 2048+1+... is exact.
  x = _row([2048, 1, 1, 0], dtype=np.float16)
  out = ref.avg_pool(x, (4,), (4,), "VALID", divisor_override=1)
  assert out.dtype == np.float16
  assert out.ravel()[0] == np.float16(2050)


def test_avg_pool_asymmetric_padding_divisor():
  # Source: hand: L=3, k2 s1, padding (0, 1): windows [0,2), [1,3), [2,4).
  # Including pads the last divisor is 2 (cell 2 and the high pad).
  x = _row([2, 4, 6])
  incl = ref.avg_pool(x, (2,), (1,), ((0, 1),))
  excl = ref.avg_pool(x, (2,), (1,), ((0, 1),), count_include_pad=False)
  np.testing.assert_allclose(incl.ravel(), [3, 5, 3])
  np.testing.assert_allclose(excl.ravel(), [3, 5, 6])


# ----------------------------------------------------------------------------
# Max / min pooling and their gradient.
# ----------------------------------------------------------------------------


def test_max_pool_seed003_k2s2_values_and_indices():
  # Source: the project's seed 003 (PyTorch 2.13 CPU, F.max_pool2d(..., return_indices=True)).
  values, indices = ref.max_pool(_grid(SEED003), (2, 2), (2, 2), "VALID")
  np.testing.assert_array_equal(values.ravel(), [4, 8, 9, -2])
  np.testing.assert_array_equal(indices.ravel(), [5, 6, 13, 11])
  assert indices.dtype == np.int64


def test_max_pool_seed003_k3s1_overlap():
  # Source: seed 003 and PyTorch 2.13 CPU; by hand: 8 is cell (1,2)=6, 9 is (3,1)=13.
  values, indices = ref.max_pool(_grid(SEED003), (3, 3), (1, 1), "VALID")
  np.testing.assert_array_equal(values.ravel(), [8, 8, 9, 9])
  np.testing.assert_array_equal(indices.ravel(), [6, 6, 13, 13])


def test_max_pool_grad_seed003_scatters_to_argmax():
  # Source: seed 003 and PyTorch 2.13 CPU backward: grads 1, 2, 3, 4 land on cells 5, 6, 13, 11.
  g = np.array([1, 2, 3, 4], dtype=np.float64).reshape(1, 2, 2, 1)
  grad = ref.max_pool_grad(_grid(SEED003), g, (2, 2), (2, 2), "VALID")
  expected = np.zeros(16)
  expected[[5, 6, 13, 11]] = [1, 2, 3, 4]
  np.testing.assert_array_equal(grad.ravel(), expected)


def test_max_pool_grad_overlapping_windows_accumulate():
  # Source: hand, from the k3 s1 indices above: cell 6 gets 1+2, cell 13 gets 3+4.
  g = np.array([1, 2, 3, 4], dtype=np.float32).reshape(1, 2, 2, 1)
  x = _grid(SEED003).astype(np.float32)
  grad = ref.max_pool_grad(x, g, (3, 3), (1, 1), "VALID")
  expected = np.zeros(16, dtype=np.float32)
  expected[6], expected[13] = 3, 7
  assert grad.dtype == np.float32
  np.testing.assert_array_equal(grad.ravel(), expected)


def test_min_pool_grad_scatters_to_argmin():
  # Source: hand: the seed-003 2x2 minima are 1, 5, -4, -6 at cells 0, 2, 12, 14.
  g = np.array([1, 2, 3, 4], dtype=np.float64).reshape(1, 2, 2, 1)
  grad = ref.max_pool_grad(_grid(SEED003), g, (2, 2), (2, 2), "VALID", kind="min")
  expected = np.zeros(16)
  expected[[0, 2, 12, 14]] = [1, 2, 3, 4]
  np.testing.assert_array_equal(grad.ravel(), expected)


def test_max_pool_tie_first_in_row_major_order_wins():
  # Source: PyTorch 2.13 CPU (first maximum wins): F.max_pool1d gives index 1 for [1, 3, 3, 2].
  _, idx1 = ref.max_pool(_row([1, 3, 3, 2]), (4,), (4,), "VALID")
  assert idx1.ravel().tolist() == [1]
  # 2-D: 5 at (0,1)=1 and (1,0)=2; row-major order visits (0,1) first.
  _, idx2 = ref.max_pool(_grid([[1, 5], [5, 0]]), (2, 2), (2, 2), "VALID")
  assert idx2.ravel().tolist() == [1]


def test_max_pool_last_nan_wins():
  # Source: torch 2.13: max_pool2d over [1, nan, 3, nan] gives (nan, index 3).
  values, indices = ref.max_pool(_grid([[1, NAN, 3, NAN]]), (1, 4), (1, 4), "VALID")
  assert np.isnan(values.ravel()[0])
  assert indices.ravel().tolist() == [3]


def test_max_pool_nan_is_kept_against_later_numbers():
  # Source: the rule: after a NaN, `5 > nan` is false, so the NaN (index 0) stays.
  values, indices = ref.max_pool(_row([NAN, 5]), (2,), (2,), "VALID")
  assert np.isnan(values.ravel()[0])
  assert indices.ravel().tolist() == [0]


def test_min_pool_ties_and_nan():
  # Source: the rule with `<`: first minimum wins, last NaN wins.
  values, indices = ref.min_pool(_row([4, 1, 1, 3]), (4,), (4,), "VALID")
  assert (values.ravel().tolist(), indices.ravel().tolist()) == ([1.0], [1])
  values, indices = ref.min_pool(_row([3, NAN, 3, 1, NAN, 0]), (6,), (6,), "VALID")
  assert np.isnan(values.ravel()[0])
  assert indices.ravel().tolist() == [4]


def test_max_pool_integer_with_padding():
  # Source: torch 2.13: max_pool2d(int32 [[2, 5, 5, 1]], (1, 2), 1, (0, 1), return_indices=True)
  # gives values [2, 5, 5, 5, 1] and indices [0, 1, 1, 2, 3]; padding is never chosen.
  values, indices = ref.max_pool(_row([2, 5, 5, 1], np.int32), (2,), (1,), ((1, 1),))
  assert values.dtype == np.int32
  np.testing.assert_array_equal(values.ravel(), [2, 5, 5, 5, 1])
  np.testing.assert_array_equal(indices.ravel(), [0, 1, 1, 2, 3])


def test_max_pool_integer_dtype_min_keeps_first_real_cell():
  # Source: the rule: start at int8 min with the first real cell's index; -128 never beats it.
  values, indices = ref.max_pool(_row([-128, -128, 7], np.int8), (2,), (2,), ((1, 1),))
  np.testing.assert_array_equal(values.ravel(), [-128, 7])
  np.testing.assert_array_equal(indices.ravel(), [0, 2])
  values, indices = ref.max_pool(_row([-128, -128], np.int8), (2,), (2,), "VALID")
  assert (values.ravel().tolist(), indices.ravel().tolist()) == ([-128], [0])


def test_min_pool_integer_dtype_max_keeps_first_real_cell():
  # Source: the rule: start at uint8 max (255) with the first real cell's index.
  values, indices = ref.min_pool(_row([255, 255, 0], np.uint8), (2,), (2,), ((0, 1),))
  np.testing.assert_array_equal(values.ravel(), [255, 0])
  np.testing.assert_array_equal(indices.ravel(), [0, 2])


def test_max_pool_dilation():
  # Source: hand: k2 d2 s1 on [0, 9, 1, 8, 2, 7] visits cells (0,2), (1,3), (2,4), (3,5).
  values, indices = ref.max_pool(_row([0, 9, 1, 8, 2, 7]), (2,), (1,), "VALID", dilation=(2,))
  np.testing.assert_array_equal(values.ravel(), [1, 9, 2, 8])
  np.testing.assert_array_equal(indices.ravel(), [2, 1, 4, 3])


def test_max_pool_3d_flat_index():
  # Source: the rule (d*H + h)*W + w: the maximum of a 2x3x4 volume at (1, 2, 3) is 23.
  x = np.zeros((1, 2, 3, 4, 1))
  x[0, 1, 2, 3, 0] = 1
  _, indices = ref.max_pool(x, (2, 3, 4), (2, 3, 4), "VALID")
  assert indices.ravel().tolist() == [23]


def test_max_pool_same_padding_uses_negative_infinity():
  # Source: hand: all-negative row, k2 s1 SAME pad (0, 1): the pad never wins.
  values, indices = ref.max_pool(_row([-3, -1, -2]), (2,), (1,), "SAME")
  np.testing.assert_array_equal(values.ravel(), [-1, -1, -2])
  np.testing.assert_array_equal(indices.ravel(), [1, 1, 2])


def test_max_pool_dilated_window_without_real_cell_mirrors_pytorch():
  # Source: torch 2.13: max_pool2d(arange(7).view(1,1,7,1), (2,2), (3,1), (1,1), (1,2),
  # return_indices=True) gives values [-inf]*3 and indices [1, 3, 6]. Along W (length 1)
  # the taps are -1 and 1: no real cell. PyTorch steps -1 to 1 and flattens
  # (h0, 1) with W=1, so the indices alias cells (1,0), (3,0), (6,0).
  x = np.arange(7, dtype=np.float64).reshape(1, 7, 1, 1)
  values, indices = ref.max_pool(x, (2, 2), (3, 1), ((1, 1), (1, 1)), dilation=(1, 2))
  np.testing.assert_array_equal(values.ravel(), [-np.inf] * 3)
  np.testing.assert_array_equal(indices.ravel(), [1, 3, 6])
  # Integers get the dtype's min. Source: torch 2.13, int32 [[3]] with (2,1) d(2,1) p(1,0).
  values, indices = ref.max_pool(np.full((1, 1, 1, 1), 3, np.int32), (2, 1), (1, 1),
                                 ((1, 1), (0, 0)), dilation=(2, 1))
  assert (values.ravel().tolist(), indices.ravel().tolist()) == ([-2**31], [1])
  # The mirror's gradient sends nothing from such outputs (PyTorch leaks it to cells 1, 3, 6).
  grad = ref.max_pool_grad(x, np.ones((1, 3, 1, 1)), (2, 2), (3, 1), ((1, 1), (1, 1)),
                           dilation=(1, 2))
  np.testing.assert_array_equal(grad.ravel(), np.zeros(7))


# ----------------------------------------------------------------------------
# LP pooling.
# ----------------------------------------------------------------------------


def test_lp_pool_full_windows():
  # Source: hand: p=2 over [1,2] and [3,4] is sqrt(5) and 5.
  out = ref.lp_pool(_row([1, 2, 3, 4]), 2, (2,), (2,))
  np.testing.assert_allclose(out.ravel(), [math.sqrt(5), 5])


def test_lp_pool_ceil_partial_window_scaled_by_k_over_clipped():
  # Source: PyTorch 2.13 CPU, F.lp_pool1d([3, 4, 2], 1, 2, ceil_mode=True) = [7, 4]: the partial
  # window [2] is averaged (2/1), then multiplied by k=2.
  out = ref.lp_pool(_row([3, 4, 2]), 1, (2,), (2,), ceil_mode=True)
  np.testing.assert_allclose(out.ravel(), [7, 4])


def test_lp_pool_uses_x_to_the_p_not_abs():
  # Source: PyTorch 2.13 CPU, F.lp_pool1d: x**p with no absolute value, so p=1 over [-1, -2]
  # is -3; p=3 over [-2, 1] is (-7)**(1/3) = nan.
  np.testing.assert_allclose(ref.lp_pool(_row([-1, -2]), 1, (2,)).ravel(), [-3])
  assert np.isnan(ref.lp_pool(_row([-2, 1]), 3, (2,)).ravel()[0])


# ----------------------------------------------------------------------------
# Adaptive and global pooling.
# ----------------------------------------------------------------------------


def test_adaptive_bins_overlap_and_upsample():
  # Source: the rule start=floor(i*L/T), end=ceil((i+1)*L/T), worked by hand.
  assert ref.adaptive_bins(5, 3) == [(0, 2), (1, 4), (3, 5)]
  assert ref.adaptive_bins(2, 5) == [(0, 1), (0, 1), (0, 2), (1, 2), (1, 2)]
  assert ref.adaptive_bins(14, 4) == [(0, 4), (3, 7), (7, 11), (10, 14)]
  assert ref.adaptive_bins(6, 3) == [(0, 2), (2, 4), (4, 6)]


def test_adaptive_avg_pool_pytorch_rule_not_equinox():
  # Source: PyTorch 2.13 CPU, F.adaptive_avg_pool1d(arange(14), 4) = [1.5, 4.5, 8.5, 11.5].
  out = ref.adaptive_avg_pool(np.arange(14, dtype=np.float64).reshape(1, 14, 1), (4,))
  np.testing.assert_allclose(out.ravel(), [1.5, 4.5, 8.5, 11.5])


def test_adaptive_avg_pool_none_keeps_dim():
  # Source: hand: arange(12) as 3x4, output (1, None): column means 4, 5, 6, 7.
  x = np.arange(12, dtype=np.float64).reshape(1, 3, 4, 1)
  out = ref.adaptive_avg_pool(x, (1, None))
  assert out.shape == (1, 1, 4, 1)
  np.testing.assert_allclose(out.ravel(), [4, 5, 6, 7])


def test_adaptive_max_pool_indices_ties_and_nan():
  # Source: hand: bins of 5 to 3 are [0,2), [1,4), [3,5).
  # [7, 7, NAN, 1, 9]: bin 0 tie -> index 0; bin 1 NaN at 2; bin 2 -> 9 at 4.
  values, indices = ref.adaptive_max_pool(_row([7, 7, NAN, 1, 9]), (3,))
  np.testing.assert_array_equal(values.ravel(), [7, NAN, 9])
  np.testing.assert_array_equal(indices.ravel(), [0, 2, 4])


def test_adaptive_max_pool_larger_than_input():
  # Source: hand: 2 to 5 uses bins (0,1), (0,1), (0,2), (1,2), (1,2).
  values, indices = ref.adaptive_max_pool(_row([3, 8]), (5,))
  np.testing.assert_array_equal(values.ravel(), [3, 3, 8, 8, 8])
  np.testing.assert_array_equal(indices.ravel(), [0, 0, 1, 1, 1])


def test_global_pools_reduce_all_spatial_axes():
  # Source: hand: arange(24) as (1, 2, 3, 4) channels-last: channel c holds c, c+4, ..., c+20.
  x = np.arange(24, dtype=np.float64).reshape(1, 2, 3, 4)
  np.testing.assert_allclose(ref.global_avg_pool(x), [[10, 11, 12, 13]])
  np.testing.assert_allclose(ref.global_max_pool(x), [[20, 21, 22, 23]])
  x[0, 0, 1, 2] = NAN
  assert np.isnan(ref.global_max_pool(x)[0, 2])
  assert ref.global_avg_pool(np.ones((2, 3, 1))).shape == (2, 1)


# ----------------------------------------------------------------------------
# Max unpooling.
# ----------------------------------------------------------------------------


def test_max_unpool_scatters_into_default_size():
  # Source: hand: default size (2-1)*2 - 0 + 2 = 4.
  out = ref.max_unpool(_row([5, 7]), _row([1, 2], np.int64), (2,), (2,))
  np.testing.assert_array_equal(out.ravel(), [0, 5, 7, 0])


def test_max_unpool_duplicate_index_later_write_wins():
  # Source: torch 2.13: max_unpool1d([5, 7], indices [1, 1], 2) gives [0, 7, 0, 0].
  out = ref.max_unpool(_row([5, 7]), _row([1, 1], np.int64), (2,), (2,))
  np.testing.assert_array_equal(out.ravel(), [0, 7, 0, 0])


def test_max_unpool_round_trip_seed003():
  # Source: seed 003 and PyTorch 2.13 CPU, F.max_unpool2d: 4, 8, 9, -2 go back to cells 5, 6,
  # 13, 11.
  values, indices = ref.max_pool(_grid(SEED003), (2, 2), (2, 2), "VALID")
  out = ref.max_unpool(values, indices, (2, 2), (2, 2))
  expected = np.zeros(16)
  expected[[5, 6, 13, 11]] = [4, 8, 9, -2]
  np.testing.assert_array_equal(out.ravel(), expected)


def test_max_unpool_output_size_within_one_stride():
  # Source: PyTorch's _unpool_output_size: default 4, stride 2, so 3, 4, 5 are allowed.
  x, idx = _row([5, 7]), _row([0, 2], np.int64)
  assert ref.max_unpool(x, idx, (2,), (2,), output_size=(5,)).shape == (1, 5, 1)
  assert ref.max_unpool(x, idx, (2,), (2,), output_size=(3,)).shape == (1, 3, 1)
  with pytest.raises(ValueError):
    ref.max_unpool(x, idx, (2,), (2,), output_size=(6,))
  with pytest.raises(ValueError):
    ref.max_unpool(x, idx, (2,), (2,), output_size=(2,))


def test_max_unpool_rejects_index_outside_plane():
  with pytest.raises(ValueError):
    ref.max_unpool(_row([5, 7]), _row([0, 4], np.int64), (2,), (2,))


# ----------------------------------------------------------------------------
# Input validation.
# ----------------------------------------------------------------------------


def test_invalid_arguments_raise_value_error():
  x = np.zeros((1, 4, 4, 1))
  with pytest.raises(ValueError):
    ref.max_pool(x, (2,), (2,), "VALID")  # rank does not match the window
  with pytest.raises(ValueError):
    ref.max_pool(x, (2, 2), (2, 2), "same")  # padding strings are upper-case
  with pytest.raises(ValueError):
    ref.max_pool(x, (2, 2), (2, 2), ((1, 1),))  # one pair per dim
  with pytest.raises(ValueError):
    ref.max_pool(x, (2, 2), (0, 2), "VALID")
  with pytest.raises(ValueError):
    ref.max_pool(x, (2, 2), (2, 2), ((-1, 0), (0, 0)))
  with pytest.raises(ValueError):
    ref.avg_pool(x, (2, 2), (2, 2), "VALID", divisor_override=0)
  with pytest.raises(ValueError):
    ref.avg_pool(x, (5, 5), (1, 1), "VALID")
  with pytest.raises(ValueError):
    ref.adaptive_avg_pool(x, (0, 2))
  with pytest.raises(ValueError):
    ref.lp_pool(x, 0, (2, 2))
  with pytest.raises(ValueError):
    ref.max_pool_grad(x, np.zeros((1, 1, 1, 1)), (2, 2), (2, 2), "VALID")
  with pytest.raises(ValueError):
    ref.max_pool(np.zeros((1, 4, 1), dtype=bool), (2,), (2,), "VALID")


# ----------------------------------------------------------------------------
# Parity with PyTorch 2.13 (CPU).
# ----------------------------------------------------------------------------

_TORCH_REASON = "PyTorch parity needs torch==2.13.0 (the `parity` extra)"

# Configurations per sweep; the total is reported in the test ids.
N_MAX = 120
N_AVG = 120
N_ADAPTIVE = 60
N_LP = 40
N_UNPOOL = 40

# Largest spatial length per rank, to keep the loops of the mirror quick.
_MAX_LEN = {1: 9, 2: 7, 3: 5}


def _torch():
  return pytest.importorskip("torch", reason=_TORCH_REASON)


def _to_torch(torch, x: np.ndarray):
  """Channels-last numpy to a contiguous NC* torch tensor."""
  return torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1)).copy())


def _from_torch(t) -> np.ndarray:
  """NC* torch tensor to channels-last numpy."""
  return np.moveaxis(t.detach().numpy(), 1, -1)


def _fn(torch, name: str, nd: int):
  return getattr(torch.nn.functional, f"{name}{nd}d")


def _data(rng, shape, style: str) -> np.ndarray:
  """Test data: 'ties' small integers as float32, 'nan' with NaNs, 'float' float64, 'int' int32."""
  if style == "ties":
    return rng.integers(-3, 4, size=shape).astype(np.float32)
  if style == "nan":
    x = rng.integers(-3, 4, size=shape).astype(np.float32)
    x[rng.random(shape) < 0.2] = np.nan
    return x
  if style == "int":
    return rng.integers(-50, 50, size=shape).astype(np.int32)
  return rng.standard_normal(shape)


def _window_config(
  rng, nd: int, *, dilate: bool, stride_is_window: bool = False, pad: bool = True,
  fit_unpadded: bool = False,
):
  """A random (shape, window, strides, pad, dilation, ceil_mode) that PyTorch accepts.

  ``fit_unpadded``: the input is at least the window in every dim, which
  AvgPool3d demands even when padding would make the window fit.
  """
  while True:
    window = tuple(int(k) for k in rng.integers(1, 4, size=nd))
    strides = tuple(int(s) for s in rng.integers(1, 4, size=nd))
    if stride_is_window:
      strides = window
    dilation = tuple(int(d) for d in rng.integers(1, 3, size=nd)) if dilate else (1,) * nd
    pads = tuple(int(rng.integers(0, k // 2 + 1)) if pad else 0 for k in window)
    spatial = tuple(int(n) for n in rng.integers(1, _MAX_LEN[nd] + 1, size=nd))
    ceil_mode = bool(rng.integers(2))
    if fit_unpadded and any(n < k for n, k in zip(spatial, window, strict=True)):
      continue
    try:
      for length, k, s, p, d in zip(spatial, window, strides, pads, dilation, strict=True):
        ref.output_size(length, k, s, p, p, dilation=d, ceil_mode=ceil_mode)
    except ValueError:
      continue
    n, c = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    return (n, *spatial, c), window, strides, pads, dilation, ceil_mode


def _has_empty_window(shape, window, strides, pad, dilation, ceil_mode) -> bool:
  """Whether some dilated window has no tap inside the input (a PyTorch quirk case)."""
  for length, k, s, p, d in zip(shape[1:-1], window, strides, pad, dilation, strict=True):
    out = ref.output_size(length, k, s, p, p, dilation=d, ceil_mode=ceil_mode)
    for o in range(out):
      if not any(0 <= o * s - p + j * d < length for j in range(k)):
        return True
  return False


@pytest.mark.parametrize("seed", range(N_MAX))
def test_parity_max_min_pool_with_indices_and_grad(seed):
  torch = _torch()
  rng = np.random.default_rng([3, seed])
  nd = int(rng.integers(1, 4))
  shape, window, strides, pad, dilation, ceil_mode = _window_config(rng, nd, dilate=True)
  style = ["ties", "nan", "float", "int"][seed % 4]
  kind = "min" if seed % 3 == 2 and style != "int" else "max"
  x = _data(rng, shape, style)
  padding = tuple((p, p) for p in pad)
  fn = _fn(torch, "max_pool", nd)
  kwargs = dict(stride=strides, padding=pad, dilation=dilation, ceil_mode=ceil_mode,
                return_indices=True)

  pool = ref.max_pool if kind == "max" else ref.min_pool
  values, indices = pool(x, window, strides, padding, dilation=dilation, ceil_mode=ceil_mode)
  sign = 1 if kind == "max" else -1
  tx = _to_torch(torch, x)
  t_values, t_indices = fn(sign * tx, window, **kwargs)
  np.testing.assert_array_equal(values, sign * _from_torch(t_values))
  np.testing.assert_array_equal(indices, _from_torch(t_indices))

  if style == "float" and not _has_empty_window(shape, window, strides, pad, dilation, ceil_mode):
    g = rng.standard_normal(values.shape)
    tx = _to_torch(torch, x).requires_grad_(True)
    out, _ = fn(sign * tx, window, **kwargs)
    (sign * out).backward(_to_torch(torch, g))
    grad = ref.max_pool_grad(x, g, window, strides, padding, dilation=dilation,
                             ceil_mode=ceil_mode, kind=kind)
    np.testing.assert_allclose(grad, _from_torch(tx.grad), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(N_AVG))
def test_parity_avg_pool(seed):
  torch = _torch()
  rng = np.random.default_rng([4, seed])
  nd = int(rng.integers(1, 4))
  shape, window, strides, pad, _, ceil_mode = _window_config(
    rng, nd, dilate=False, fit_unpadded=nd == 3)
  count_include_pad = bool(rng.integers(2))
  divisor_override = None
  if nd > 1 and rng.random() < 0.3:
    divisor_override = int(rng.integers(1, 6))
  x = _data(rng, shape, "float")
  out = ref.avg_pool(x, window, strides, tuple((p, p) for p in pad), ceil_mode=ceil_mode,
                     count_include_pad=count_include_pad, divisor_override=divisor_override)
  kwargs = dict(stride=strides, padding=pad, ceil_mode=ceil_mode,
                count_include_pad=count_include_pad)
  if divisor_override is not None:
    kwargs["divisor_override"] = divisor_override
  expected = _from_torch(_fn(torch, "avg_pool", nd)(_to_torch(torch, x), window, **kwargs))
  np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(N_ADAPTIVE))
def test_parity_adaptive_pools(seed):
  torch = _torch()
  rng = np.random.default_rng([5, seed])
  nd = int(rng.integers(1, 4))
  spatial = tuple(int(n) for n in rng.integers(1, _MAX_LEN[nd] + 1, size=nd))
  # Divisible, non-divisible and larger-than-input sizes; None (keep) from 2-D up.
  choices = [lambda n: n, lambda n: max(1, n // 2), lambda n: max(1, n - 1), lambda n: n + 2,
             lambda n: 2 * n + 1, lambda n: 1, lambda n: 3]
  out = [choices[int(rng.integers(len(choices)))](n) for n in spatial]
  if nd > 1:
    out = [None if rng.random() < 0.25 else t for t in out]
  out = tuple(out)
  x = _data(rng, (int(rng.integers(1, 3)), *spatial, int(rng.integers(1, 4))),
            ["ties", "nan", "float"][seed % 3])
  tx = _to_torch(torch, x)
  t_size = out[0] if nd == 1 else out

  expected = _from_torch(_fn(torch, "adaptive_avg_pool", nd)(tx, t_size))
  np.testing.assert_allclose(ref.adaptive_avg_pool(x, out), expected, rtol=1e-6, atol=1e-6)

  t_values, t_indices = _fn(torch, "adaptive_max_pool", nd)(tx, t_size, return_indices=True)
  values, indices = ref.adaptive_max_pool(x, out)
  np.testing.assert_array_equal(values, _from_torch(t_values))
  np.testing.assert_array_equal(indices, _from_torch(t_indices))


@pytest.mark.parametrize("seed", range(N_LP))
def test_parity_lp_pool(seed):
  torch = _torch()
  rng = np.random.default_rng([6, seed])
  nd = int(rng.integers(1, 4))
  default_stride = seed % 5 == 0  # stride=None means stride = window in both
  shape, window, strides, _, _, ceil_mode = _window_config(
    rng, nd, dilate=False, stride_is_window=default_stride, pad=False, fit_unpadded=nd == 3)
  norm_type = [1, 2, 3, 1.5][seed % 4]
  x = rng.uniform(0.1, 2.0, size=shape)
  if norm_type == 2 and seed % 8 == 1:
    x = rng.standard_normal(shape)  # x**2 of negatives is still fine
  t_strides = None if default_stride else strides
  out = ref.lp_pool(x, norm_type, window, t_strides, ceil_mode=ceil_mode)
  t_window = window[0] if nd == 1 else window  # lp_pool1d takes ints only
  if nd == 1 and t_strides is not None:
    t_strides = t_strides[0]
  expected = _fn(torch, "lp_pool", nd)(_to_torch(torch, x), norm_type, t_window, t_strides,
                                       ceil_mode)
  np.testing.assert_allclose(out, _from_torch(expected), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", range(N_UNPOOL))
def test_parity_max_unpool(seed):
  torch = _torch()
  rng = np.random.default_rng([7, seed])
  nd = int(rng.integers(1, 4))
  window = tuple(int(k) for k in rng.integers(1, 4, size=nd))
  strides = tuple(int(s) for s in rng.integers(1, 4, size=nd))
  pad = tuple(int(rng.integers(0, k // 2 + 1)) for k in window)
  in_spatial = tuple(int(n) for n in rng.integers(1, 4, size=nd))
  default = [(i - 1) * s - 2 * p + k
             for i, s, p, k in zip(in_spatial, strides, pad, window, strict=True)]
  if min(default) < 1:  # e.g. one input cell, k2 p1: drop the padding
    pad = (0,) * nd
    default = [(i - 1) * s + k for i, s, k in zip(in_spatial, strides, window, strict=True)]
  output_size = None
  out_spatial = default
  if seed % 2:
    # Anywhere strictly within one stride of the default (and at least 1).
    out_spatial = [max(d + int(rng.integers(-s + 1, s)), 1)
                   for d, s in zip(default, strides, strict=True)]
    output_size = tuple(out_spatial)
  plane = math.prod(out_spatial)
  shape = (int(rng.integers(1, 3)), *in_spatial, int(rng.integers(1, 4)))
  x = rng.standard_normal(shape)
  # Few distinct indices, so duplicates (later write wins) are common.
  high = plane if seed % 3 else min(plane, 3)
  indices = rng.integers(0, high, size=shape).astype(np.int64)

  out = ref.max_unpool(x, indices, window, strides, pad, output_size)
  # PyTorch's channels-last unpool kernel (which max_unpool1d always takes) runs
  # input positions in parallel, so duplicates race; one thread is deterministic.
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    expected = _fn(torch, "max_unpool", nd)(
      _to_torch(torch, x), _to_torch(torch, indices), window, strides, pad, output_size)
  finally:
    torch.set_num_threads(threads)
  np.testing.assert_array_equal(out, _from_torch(expected))


def test_parity_channels_last_memory_format_agrees():
  # PyTorch has separate channels-last kernels; the tie/NaN rule holds there too.
  torch = _torch()
  x = np.array([1, NAN, 3, NAN, 3, 3, 1, 2], dtype=np.float32)
  x = np.stack([x, np.roll(x, 3), np.roll(x, 5)], axis=-1).reshape(1, 2, 4, 3)
  tx = _to_torch(torch, x).contiguous(memory_format=torch.channels_last)
  t_values, t_indices = torch.nn.functional.max_pool2d(tx, 2, 1, return_indices=True)
  values, indices = ref.max_pool(x, (2, 2), (1, 1), "VALID")
  np.testing.assert_array_equal(values, _from_torch(t_values))
  np.testing.assert_array_equal(indices, _from_torch(t_indices))


def test_parity_torch_quirk_dilated_empty_window_grad_leaks():
  # Records PyTorch 2.13's behaviour that the mirror declines to copy: the
  # backward of an all-padding dilated window adds g to the aliased cell.
  torch = _torch()
  tx = torch.arange(7.0).view(1, 1, 7, 1).requires_grad_(True)
  out, _ = torch.nn.functional.max_pool2d(tx, (2, 2), (3, 1), (1, 1), (1, 2), return_indices=True)
  out.sum().backward()
  np.testing.assert_array_equal(tx.grad.numpy().ravel(), [0, 1, 0, 1, 0, 0, 1])
