"""Tests for the global pools (nnx_pool._global): the mean and the max, with and without a mask.

Each expectation says where it comes from: a hand computation, Keras 3's own test, a seed
fixture (seed 000), or the NumPy mirror (nnx_pool.reference), which computes the masked
pools with loops of its own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_pool import GlobalAvgPool, GlobalMaxPool, reference
from nnx_pool import functional as F


def seed000_map(h, w, c=3, n=2):
  """Integer-generated (n, h, w, c) maps, values in [-7, 7]: every partial sum is exact."""
  n_, i, j, k = np.meshgrid(np.arange(n), np.arange(h), np.arange(w), np.arange(c), indexing="ij")
  return ((n_ * 5 + i * 7 + j * 3 + k * 11) % 15 - 7).astype(np.float32)


# ----------------------------------------------------------------------------
# Without a mask.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("h, w", [(5, 7), (8, 8), (64, 64), (128, 128)])
def test_globalavgpool_seed000_bit_exact(h, w):
  # seed 000: integer-generated maps whose sums are exact in any order, so the
  # mean is bit-exact against the closed form float32(sum) / float32(h * w).
  x = seed000_map(h, w)
  closed_form = x.astype(np.int64).sum(axis=(1, 2)).astype(np.float32) / np.float32(h * w)
  eager = GlobalAvgPool()(x)
  jitted = jax.jit(lambda a: GlobalAvgPool()(a))(x)
  assert eager.shape == (2, 3) and eager.dtype == jnp.float32
  np.testing.assert_array_equal(eager, closed_form)
  np.testing.assert_array_equal(jitted, closed_form)


def test_globalavgpool_keepdims_unbatched_and_1d_3d():
  # Hand computation: arange(12) as (2, 3, 2) (H, W, C): channel 0 holds 0, 2, ..., 10
  # (mean 5), channel 1 holds 1, 3, ..., 11 (mean 6).
  x = np.arange(12.0, dtype=np.float32).reshape(2, 3, 2)  # NumPy inputs: jnp ones compile
  # 1-D: (N, L, C) = (1, 4, 1) of [1, 2, 3, 6] -> 3; 3-D: ones -> 1.
  one_d = np.array([[[1.0], [2.0], [3.0], [6.0]]], np.float32)
  # One compiled program (called eagerly, each call compiled its layout steps one by one:
  # 12 programs; test_globalavgpool_seed000_bit_exact calls the module eagerly).
  y, kept, kept_batched, y1, y3 = jax.jit(lambda x, one_d, ones: (
      GlobalAvgPool()(x), GlobalAvgPool(keepdims=True)(x), GlobalAvgPool(keepdims=True)(x[None]),
      GlobalAvgPool(num_spatial_dims=1)(one_d),
      GlobalAvgPool(num_spatial_dims=3, keepdims=True)(ones)))(
          x, one_d, np.ones((2, 3, 4, 5, 6), np.float32))
  np.testing.assert_array_equal(y, [5.0, 6.0])
  np.testing.assert_array_equal(kept, [[[5.0, 6.0]]])
  assert kept_batched.shape == (1, 1, 1, 2)
  np.testing.assert_array_equal(y1, [[3.0]])
  np.testing.assert_array_equal(y3, np.ones((2, 1, 1, 1, 6)))


def test_globalmaxpool_values_nan_and_integers():
  # Hand computation: per-channel maxima of a 2x2 map; NaN propagates; int32 kept.
  x = np.array([[[3.0, 0.0], [1.0, 5.0]], [[2.0, 7.0], [4.0, 1.0]]], np.float32)
  x_nan = x.copy()  # NumPy inputs: jnp ones and x.at[].set compile
  x_nan[1, 0, 1] = np.nan
  # One compiled program (eager calls compiled their layout steps one by one).
  y_float, y_nan, y = jax.jit(lambda a, b, c: [GlobalMaxPool()(v) for v in (a, b, c)])(
      x, x_nan, np.array([[[3], [9]], [[-2], [4]]], np.int32))
  np.testing.assert_array_equal(y_float, [4.0, 7.0])
  np.testing.assert_array_equal(y_nan, [4.0, np.nan])
  np.testing.assert_array_equal(y, [9])
  assert y.dtype == jnp.int32


def test_globalmaxpool_gradient_goes_to_first_tie():
  # Hand computation: the plane [[5, 1], [5, 5]] has its first maximum at cell 0, so
  # (as PyTorch's adaptive_max_pool2d(x, 1)) all of the gradient goes there, unsplit.
  x = np.array([[5.0, 1.0], [5.0, 5.0]], np.float32)[None, :, :, None]
  grad = jax.jit(jax.grad(lambda a: GlobalMaxPool()(a).sum()))(x)  # eager: op by op
  np.testing.assert_array_equal(grad[0, :, :, 0], [[1.0, 0.0], [0.0, 0.0]])


def test_globalpool_matches_numpy_mirror():
  # NumPy mirror (reference.global_avg_pool / global_max_pool) on random floats.
  x = np.random.default_rng(0).standard_normal((3, 6, 5, 4)).astype(np.float32)
  np.testing.assert_allclose(GlobalAvgPool()(x), reference.global_avg_pool(x), rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(GlobalMaxPool()(x), reference.global_max_pool(x))


# ----------------------------------------------------------------------------
# With a mask.
# ----------------------------------------------------------------------------

# Keras 3's test batch (keras/src/layers/pooling/global_average_pooling_test.py,
# GlobalAveragePoolingCorrectnessTest.test_global_average_pooling1d, channels_last):
# np.arange(24, dtype="float32").reshape((2, 3, 4)) with the int32 mask [[1, 1, 0], [0, 1, 0]].
KERAS_X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
KERAS_MASK = np.array([[1, 1, 0], [0, 1, 0]], np.int32)


def test_masked_average_is_keras_on_its_test_batch_and_the_max_by_hand():
  # Keras: entry 0 averages rows [0, 1, 2, 3] and [4, 5, 6, 7]; entry 1 keeps [16, ..., 19].
  # The max by hand: row 1 of entry 0 is the larger; entry 1 has one valid row.
  avg, mx = GlobalAvgPool(num_spatial_dims=1), GlobalMaxPool(num_spatial_dims=1)
  np.testing.assert_array_equal(avg(KERAS_X, KERAS_MASK), [[2, 3, 4, 5], [16, 17, 18, 19]])
  np.testing.assert_array_equal(mx(KERAS_X, KERAS_MASK), [[4, 5, 6, 7], [16, 17, 18, 19]])
  # A bool mask is the same; keepdims keeps the step axis (Keras: (2, 1, 4)).
  kept = F.global_avg_pool(KERAS_X, KERAS_MASK == 1, num_spatial_dims=1, keepdims=True)
  np.testing.assert_array_equal(kept, [[[2, 3, 4, 5]], [[16, 17, 18, 19]]])
  # Integers: the max keeps the dtype; a plane with no valid cell is 0 (embedding_bag's rule).
  ints = F.global_max_pool(KERAS_X.astype(np.int32) - 30, np.array([[0, 1, 1], [0, 0, 0]]),
                           num_spatial_dims=1)
  np.testing.assert_array_equal(ints, [[-22, -21, -20, -19], [0, 0, 0, 0]])
  assert ints.dtype == jnp.int32


def _masked_cases(rng):
  """(input, mask, num_spatial_dims) in 1, 2 and 3 spatial dims, unbatched and with two batch
  axes; some planes hold no valid cell, others one, and masked cells hold inf and NaN."""
  cases = []
  for shape, ndim in (((4, 6, 3), 1), ((3, 4, 5, 2), 2), ((2, 3, 2, 4, 2), 3), ((5, 4, 3), 2),
                      ((2, 2, 5, 3), 1)):
    x = rng.standard_normal(shape).astype(np.float32)
    mask = rng.random(shape[:-1]) < 0.4
    flat = mask.reshape(-1, *shape[-ndim - 1:-1])
    flat[0] = False  # no valid cell
    flat[-1] = False
    flat[-1].flat[-1] = True  # one valid cell, the last
    x = np.where(mask[..., None], x, np.where(rng.random(shape) < 0.5, np.inf, np.nan))
    cases.append((x.astype(np.float32), mask, ndim))
  return cases


def _batched(a, ndim, channels=True):
  """``a`` with its batch axes merged into one (the mirror takes (N, *spatial[, C]))."""
  tail = ndim + 1 if channels else ndim
  return a.reshape(-1, *a.shape[a.ndim - tail:])


def test_masked_pools_match_the_mirror_in_every_rank_eager_and_jitted():
  # Every case in one jitted program against the mirror; the first (1-D) also eagerly, op
  # by op (jax.disable_jit: each shape's ops compile anew, so one case, not all five).
  cases = _masked_cases(np.random.default_rng(7))

  def run(xs):
    return [(F.global_avg_pool(x, m, num_spatial_dims=d),
             F.global_max_pool(x, m, num_spatial_dims=d))
            for x, (_, m, d) in zip(xs, cases, strict=True)]

  jitted = jax.jit(run)([x for x, _, _ in cases])
  for (x, mask, ndim), (avg, mx) in zip(cases, jitted, strict=True):
    batch = x.shape[:x.ndim - ndim - 1]
    want_avg = reference.global_avg_pool(_batched(x, ndim), _batched(mask, ndim, False))
    want_max = reference.global_max_pool(_batched(x, ndim), _batched(mask, ndim, False))
    np.testing.assert_allclose(avg, want_avg.reshape(*batch, -1), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(mx, want_max.reshape(*batch, -1))
    assert np.isfinite(avg).all() and np.isfinite(mx).all()
  x, mask, ndim = cases[0]
  with jax.disable_jit():
    eager = (F.global_avg_pool(x, mask, num_spatial_dims=ndim),
             F.global_max_pool(x, mask, num_spatial_dims=ndim))
  np.testing.assert_allclose(eager[0], jitted[0][0], rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(eager[1], jitted[0][1])


def test_masked_gradients_are_finite_zero_where_masked_and_by_hand():
  # Hand computation on one (2, 4) map, one channel, of which cells 1, 2 and 4 are valid
  # and the masked cells hold inf and NaN: the mean's gradient is 1/3 on each valid cell;
  # the max's, the first maximum among the valid cells (cell 2, tied with cell 4), 1 there.
  x = np.array([[np.nan, 1.0, 7.0, np.inf], [7.0, np.nan, -np.inf, 2.0]],
               np.float32)[None, :, :, None]
  mask = np.array([[[False, True, True, False], [True, False, False, False]]])
  empty = np.zeros_like(mask)  # NumPy inputs: jnp ones compile a program each

  def loss(a, m):
    return (GlobalAvgPool()(a, m).sum(), GlobalMaxPool()(a, m).sum())

  for value_and_grad in (jax.jit(jax.value_and_grad(lambda a, m: sum(loss(a, m)))),
                         jax.value_and_grad(lambda a, m: sum(loss(a, m)))):
    value, grad = value_and_grad(x, mask)
    assert float(value) == 5.0 + 7.0
    np.testing.assert_allclose(grad[0, ..., 0], [[0, 1 / 3, 1 + 1 / 3, 0], [1 / 3, 0, 0, 0]],
                               rtol=1e-6)
    # No valid cell: both pools give 0, with a zero gradient everywhere.
    value, grad = value_and_grad(x, empty)
    assert float(value) == 0.0
    np.testing.assert_array_equal(grad, np.zeros(x.shape))
  # Forward mode: the tangent of the max is that of its cell; of the mean, the valid ones'.
  tangent = np.arange(8.0, dtype=np.float32).reshape(x.shape)
  _, (avg_t, max_t) = jax.jit(lambda a, t: jax.jvp(lambda a: loss(a, mask), (a,), (t,)))(
      x, tangent)  # jitted (eager compiles op by op); reverse mode runs both ways above
  assert float(avg_t) == pytest.approx((1 + 2 + 4) / 3) and float(max_t) == 2.0


def test_a_mask_of_the_wrong_shape_or_dtype_is_refused_naming_both_shapes():
  x = np.ones((2, 5, 3), np.float32)  # NumPy inputs: jnp.ones compiles a broadcast a shape
  pool = GlobalAvgPool(num_spatial_dims=1)
  with pytest.raises(ValueError) as info:
    pool(x, np.ones((5,), bool))
  assert str(info.value) == (
      "GlobalAvgPool: `mask` must have shape (*batch, *spatial) = (2, 5), the input's shape "
      "(2, 5, 3) without its channel axis; got (5,).")
  with pytest.raises(ValueError, match=r"got \(2, 5, 1\)\. Drop its channel axis: mask\[..., 0\]"):
    F.global_max_pool(x, np.ones((2, 5, 1), bool), num_spatial_dims=1)
  with pytest.raises(ValueError, match=r"the same for every channel: pass mask\[\.\.\., 0\]"):
    pool(x, np.ones((2, 5, 3), bool))
  with pytest.raises(TypeError, match=r"^global_avg_pool: `mask` must be bool .* got dtype "
                                      r"float32\. For a 0/1 float mask m, pass m != 0\.$"):
    F.global_avg_pool(x, np.ones((2, 5), np.float32), num_spatial_dims=1)
  with pytest.raises(TypeError, match=r"`mask` must be an array; got str"):
    pool(x, "valid")


def test_a_masked_pool_inside_an_nnx_module_under_nnx_jit():
  # A sequence model's mean over its real steps: the module call inside nnx.jit.
  class Head(nnx.Module):
    def __init__(self):
      self.pool = GlobalAvgPool(num_spatial_dims=1)

    def __call__(self, x, mask):
      return self.pool(x, mask)

  got = nnx.jit(lambda m, x, k: m(x, k))(Head(), KERAS_X, KERAS_MASK)
  np.testing.assert_array_equal(got, [[2, 3, 4, 5], [16, 17, 18, 19]])
