"""Edges of the geometry and the kernels that a mutation pass over _geometry.py and the kernels
(then _kernels.py, since split into _taps, _select, _adjoint and _separable) found untested
(2026-12-03; 100 hand-applied mutants, see the issue 12 closing note).

Each expectation is derived by hand from the rule it names (PyTorch's Pool.h output size,
lax's SAME padding, the float32 rounding of a division) and written out; the comment
next to each test lists the mutants it kills.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_pool import functional as F
from nnx_pool import output_shape
from nnx_pool._geometry import Window


def _out(length, k, s, padding=0, *, dilation=1, ceil_mode=False):
  window = Window.create(k, s, padding, dilation=dilation, ceil_mode=ceil_mode,
                         num_spatial_dims=1)
  return window.resolve((length,)).out_shape[0]


def test_mut_ceil_mode_drops_a_window_starting_past_the_input():
  # PyTorch Pool.h: out = ceil((L + 2p - k) / s) + 1, minus 1 if (out - 1) * s >= L + p.
  assert _out(10, 1, 2, ceil_mode=True) == 5   # ceil(9/2)+1 = 6; 5*2 = 10 >= 10 -> 5
  assert _out(5, 2, 2, 1, ceil_mode=True) == 3  # ceil(5/2)+1 = 4; 3*2 = 6 >= 6 -> 3
  assert _out(7, 2, 3, ceil_mode=True) == 3     # ceil(5/3)+1 = 3; 2*3 = 6 < 7 -> 3


def test_mut_huge_ceil_window_keeps_only_reachable_taps():
  (dim,) = Window.create(10**12, ceil_mode=True, num_spatial_dims=1).resolve((4,)).dims
  assert (dim.out, dim.window, dim.stride, dim.applied_high) == (1, 4, 1, 0)


def test_mut_padding_over_half_on_one_side_is_rejected():
  # e = 3, half = 1: a low pad of 2 is over half even though the high pad is 0.
  with pytest.raises(ValueError, match="at most half the effective window"):
    Window.create(3, 1, ((2, 0),))
  with pytest.raises(ValueError, match="at most half the effective window"):
    Window.create(3, 1, ((0, 2),))


def test_mut_applied_high_is_exactly_the_reach_past_the_input():
  # reach = (out - 1) * s + e; applied_high = max(reach - L - lo, 0).
  (dim,) = Window.create(3, 2, num_spatial_dims=1).resolve((7,)).dims   # out 3, reach 7
  assert dim.applied_high == 0
  (dim,) = Window.create(3, 1, 1, num_spatial_dims=1).resolve((5,)).dims  # out 5, reach 7
  assert dim.applied_high == 1
  (dim,) = Window.create(2, 2, num_spatial_dims=1).resolve((5,)).dims   # out 2, reach 4 < 5
  assert dim.applied_high == 0


def test_mut_max_pool_grad_with_a_leftover_cell():
  # L=5, k=2, s=2 (floor): windows [0,1] and [2,3]; cell 4 is never read.
  x = np.arange(5.0, dtype=np.float32).reshape(1, 5, 1)
  g = jax.jit(jax.grad(lambda v: F.max_pool(v, 2, 2, num_spatial_dims=1).sum()))(x)
  np.testing.assert_array_equal(g[0, :, 0], [0, 1, 0, 1, 0])


def test_mut_same_padding_never_negative():
  # lax SAME: L=5, k=1, s=3: out = 2, total = max(3 + 1 - 5, 0) = 0 -> taps x[0], x[3].
  x = np.arange(5.0, dtype=np.float32).reshape(1, 5, 1)
  pooled = jax.jit(lambda x: (F.max_pool(x, 1, 3, "SAME", num_spatial_dims=1),
                              F.avg_pool(x, 1, 3, "SAME", num_spatial_dims=1)))(x)
  for y in pooled:  # max, then average
    np.testing.assert_array_equal(y[0, :, 0], [0, 3])


def test_mut_same_padding_uses_the_dilated_window():
  # e = 2 * (2 - 1) + 1 = 3, s = 1: total = 4 + 3 - 5 = 2 -> (1, 1); out[i] = max(x[i-1], x[i+1]).
  x = np.arange(5.0, dtype=np.float32).reshape(1, 5, 1)
  y = jax.jit(lambda x: F.max_pool(x, 2, 1, "SAME", dilation=2, num_spatial_dims=1))(x)
  np.testing.assert_array_equal(y[0, :, 0], [1, 2, 3, 4, 3])


def test_mut_padded_length_of_exactly_int32_max_is_accepted():
  n = 2**31 - 1
  assert output_shape((n, 1), 1, n, num_spatial_dims=1) == (1, 1)
  with pytest.raises(ValueError, match="int32"):
    output_shape((n + 1, 1), 1, n, num_spatial_dims=1)


def test_mut_indices_past_int8_in_a_large_window():
  # 1-D window of 200 taps (offsets 0..199 need int32); the max sits at cell 150.
  x1 = np.zeros((1, 200, 1), np.float32)
  x1[0, 150, 0] = 1.0
  # 12x12 = 144 taps in 2-D: max at (11, 10) -> flat index 11 * 12 + 10 = 142.
  x2 = np.zeros((1, 12, 12, 1), np.float32)
  x2[0, 11, 10, 0] = 1.0
  # Both in one jitted program (eager: 1.2 s in a full `make test`; jitted: 0.9 s, pytest
  # --durations, this file alone on 2 cores).
  (values, indices), (_, indices2) = jax.jit(lambda x1, x2: (
      F.max_pool(x1, 200, 200, num_spatial_dims=1, return_indices=True),
      F.max_pool(x2, 12, 12, return_indices=True)))(x1, x2)
  assert float(values[0, 0, 0]) == 1.0
  assert int(indices[0, 0, 0]) == 150
  assert int(indices2[0, 0, 0, 0]) == 142


def test_mut_avg_pool_grad_tiling_windows_with_low_padding():
  # k3 s3 p1 over 6x6: windows [-1, 1] and [2, 4] per dim; cell 5 is in none.
  # count_include_pad: divisor 9 everywhere, so d(sum)/dx = 1/9 on covered cells, else 0.
  x = np.ones((1, 6, 6, 1), np.float32)
  g = jax.jit(jax.grad(lambda v: F.avg_pool(v, 3, 3, 1).sum()))(x)[0, :, :, 0]
  covered = (np.arange(6) < 5).astype(np.float32)
  np.testing.assert_allclose(g, np.outer(covered, covered) / 9, rtol=1e-6)


def test_mut_window_sum_grad_dilated_tiling_geometry():
  from nnx_pool._separable import window_sum
  # k3 s3 d2 over L=9: out 2, taps {0, 2, 4} and {3, 5, 7}; per-dim hit counts below.
  geom = Window.create((3, 3), 3, dilation=2).resolve((9, 9))
  x = np.ones((1, 9, 9, 1), np.float32)
  g = jax.jit(jax.grad(lambda v: window_sum(v, geom).sum()))(x)[0, :, :, 0]
  hits = np.array([1, 0, 1, 1, 1, 1, 0, 1, 0], np.float32)
  np.testing.assert_array_equal(g, np.outer(hits, hits))


def test_mut_avg_pool_divides_correctly_rounded():
  # PyTorch divides: float32(3) / float32(7) = 0.42857143, while 3 * float32(1/7) = 0.42857146.
  x = jnp.asarray([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]).reshape(1, 7, 1)
  y = F.avg_pool(x, 7, 7, num_spatial_dims=1)
  assert np.asarray(y)[0, 0, 0] == np.float32(3) / np.float32(7)


def test_mut_extremum_propagates_nan_on_ynnpack_shapes():
  from nnx_pool._select import extremum
  # jaxlib 0.10.2 CPU drops NaN from a jitted jnp.max over (1, 2) of a (1, 8, 8, 64) array.
  x = np.random.default_rng(0).normal(size=(1, 8, 8, 64)).astype(np.float32)
  x[0, 0, 0, 5] = np.nan
  got = np.asarray(jax.jit(lambda v: extremum(v, (1, 2), "max"))(x))
  want = np.max(x, axis=(1, 2))  # NumPy propagates NaN
  np.testing.assert_array_equal(got, want)
  assert np.isnan(got[0, 5])


def test_mut_max_pool_grad_on_tiling_windows_of_more_than_four_taps():
  # 3x3 windows at stride 3 tile a 6x6 map (9 taps, over the 4 at which sums take the tiled
  # scatter): each window's gradient goes to its one maximum (min: its one minimum), not to
  # all nine cells. Mutation pass of issue 22: the sums' tiled scatter taken for a max too.
  x = np.arange(36.0, dtype=np.float32).reshape(1, 6, 6, 1)
  weights = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32).reshape(1, 2, 2, 1)
  g_max, g_min = jax.jit(lambda x: (  # both in one program
      jax.grad(lambda v: (F.max_pool(v, 3, 3) * weights).sum())(x),
      jax.grad(lambda v: (F.min_pool(v, 3, 3) * weights).sum())(x)))(x)
  g = g_max[0, :, :, 0]
  want = np.zeros((6, 6), np.float32)
  want[2, 2], want[2, 5], want[5, 2], want[5, 5] = 1, 2, 3, 4  # each block's bottom-right
  np.testing.assert_array_equal(g, want)
  g = g_min[0, :, :, 0]
  want = np.zeros((6, 6), np.float32)
  want[0, 0], want[0, 3], want[3, 0], want[3, 3] = 1, 2, 3, 4  # each block's top-left
  np.testing.assert_array_equal(g, want)
