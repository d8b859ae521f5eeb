"""Tests for the window pooling modules (nnx_pool._pool) on explicit expected arrays.

Expected arrays are written out next to their inputs; each comment names its
source: a hand computation, one of the project's seed fixtures (seed 003, seed 004),
Flax's own tests, or PyTorch 2.13 CPU (the function named). Parity sweeps live in
test_pool_torch.py and test_pool_properties.py.
"""

import ast
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

import nnx_pool
from nnx_pool import AvgPool, LPPool, MaxPool, MinPool, reference

# seed 003: the 4x4 max-pool grid.
GRID = np.array(
    [[1, 2, 5, 6], [3, 4, 8, 7], [0, -1, -3, -2], [-4, 9, -6, -5]], dtype=np.float32
)


def nhwc(a):
  """(H, W) -> (1, H, W, 1), in NumPy (float lists as float32): indexing a jax.Array, or
  jnp.asarray of a list, compiles a small program for every new shape."""
  a = np.asarray(a)
  return (a.astype(np.float32) if a.dtype == np.float64 else a)[None, :, :, None]


def f32(*values):
  """A float32 NumPy vector (a jnp.array of a list compiles a conversion per shape)."""
  return np.array(values, np.float32)


def plane(a):
  """(1, H, W, 1) -> (H, W) as NumPy."""
  return np.asarray(a)[0, :, :, 0]


# --- explicit vectors ----------------------------------------------------------------


def test_avgpool_seed004_arange16():
  # seed 004: arange(16) as (1, 4, 4, 1), 2x2 stride 2 -> [2.5, 4.5, 10.5, 12.5].
  y = AvgPool((2, 2))(np.arange(16.0, dtype=np.float32).reshape(1, 4, 4, 1))
  assert y.shape == (1, 2, 2, 1)
  np.testing.assert_array_equal(plane(y), [[2.5, 4.5], [10.5, 12.5]])


def test_maxpool_seed003_values_and_indices():
  # seed 003: k2 s2 gives 4, 8, 9, -2 at flat indices 5, 6, 13, 11.
  values, indices = MaxPool((2, 2), return_indices=True)(nhwc(GRID))
  np.testing.assert_array_equal(plane(values), [[4, 8], [9, -2]])
  np.testing.assert_array_equal(plane(indices), [[5, 6], [13, 11]])
  assert indices.dtype == jnp.int32


def test_maxpool_seed003_overlapping_windows():
  # seed 003: k3 s1 gives 8, 8, 9, 9; the 8 at cell 6 is shared by two windows.
  values, indices = MaxPool((3, 3), 1, return_indices=True)(nhwc(GRID))
  np.testing.assert_array_equal(plane(values), [[8, 8], [9, 9]])
  np.testing.assert_array_equal(plane(indices), [[6, 6], [13, 13]])


# The gradients of the explicit vectors below are jitted: eager, every op of the backward
# compiles on its own (jitted, the seven tests that take one went 2.5 s -> 1.2 s of compile
# CPU, pytest -k with their names -p tools.compile_census, 2 cores). Eager and jitted runs,
# gradient included, are compared in test_pool_eager_equals_jit.
def test_maxpool_seed003_gradient_lands_on_argmax():
  # seed 003: output gradients 1, 2, 3, 4 land on cells 5, 6, 13, 11; 0 elsewhere.
  cotangent = nhwc([[1.0, 2.0], [3.0, 4.0]])
  grad = jax.jit(jax.grad(lambda x: jnp.sum(MaxPool((2, 2))(x) * cotangent)))(nhwc(GRID))
  expected = np.zeros(16, np.float32)
  expected[[5, 6, 13, 11]] = [1, 2, 3, 4]
  np.testing.assert_array_equal(plane(grad), expected.reshape(4, 4))


def test_maxpool_seed003_overlapping_gradient_accumulates():
  # k3 s1: cell 6 wins windows (0, 0) and (0, 1), cell 13 wins (1, 0) and (1, 1).
  cotangent = nhwc([[1.0, 2.0], [3.0, 4.0]])
  grad = jax.jit(jax.grad(lambda x: jnp.sum(MaxPool((3, 3), 1)(x) * cotangent)))(nhwc(GRID))
  expected = np.zeros(16, np.float32)
  expected[6], expected[13] = 1 + 2, 3 + 4
  np.testing.assert_array_equal(plane(grad), expected.reshape(4, 4))


@pytest.mark.parametrize(
    "k, s, side",
    # seed 003's output-side table on the 4x4 grid.
    [(2, 2, 2), (3, 1, 2), (2, 1, 3), (4, 1, 1), (1, 1, 4), (3, 2, 1), (1, 3, 2)],
)
def test_maxpool_seed003_output_side_table(k, s, side):
  assert MaxPool((k, k), s)(nhwc(GRID)).shape == (1, side, side, 1)


def test_minpool_seed003_values_and_indices():
  # Hand computation: k2 s2 minima 1, 5, -4, -6 at cells 0, 2, 12, 14.
  values, indices = MinPool((2, 2), return_indices=True)(nhwc(GRID))
  np.testing.assert_array_equal(plane(values), [[1, 5], [-4, -6]])
  np.testing.assert_array_equal(plane(indices), [[0, 2], [12, 14]])


def test_avgpool_flax_same_vectors_both_policies():
  # Flax's own test (tests/linen/linen_test.py, PoolTest.test_avg_pool_padding_same):
  # [[1, 2], [3, 4]], 2x2, stride 1, SAME: [10, 6, 7, 4] / 4 with the padding counted,
  # [10/4, 6/2, 7/2, 4/1] without.
  x = nhwc([[1.0, 2.0], [3.0, 4.0]])
  included = AvgPool((2, 2), 1, "SAME")(x)
  excluded = AvgPool((2, 2), 1, "SAME", count_include_pad=False)(x)
  np.testing.assert_array_equal(plane(included), [[2.5, 1.5], [1.75, 1.0]])
  np.testing.assert_array_equal(plane(excluded), [[2.5, 3.0], [3.5, 4.0]])


def test_avgpool_1d_padding_both_policies():
  # PyTorch 2.13 CPU, F.avg_pool1d([1..5], 3, 1, 1), count_include_pad True and False.
  x = f32(1, 2, 3, 4, 5)[None, :, None]
  np.testing.assert_allclose(np.asarray(AvgPool((3,), 1, 1)(x))[0, :, 0], [1, 2, 3, 4, 3],
                             rtol=1e-6)
  np.testing.assert_allclose(
      np.asarray(AvgPool((3,), 1, 1, count_include_pad=False)(x))[0, :, 0], [1.5, 2, 3, 4, 4.5],
      rtol=1e-6
  )


def test_avgpool_ceil_mode_7x7():
  # PyTorch 2.13 CPU, F.avg_pool2d(arange(49).reshape(7, 7), 2, 3, ceil_mode=True).
  y = AvgPool((2, 2), 3, ceil_mode=True)(nhwc(np.arange(49.0).reshape(7, 7)))
  np.testing.assert_array_equal(plane(y), [[4, 7, 9.5], [25, 28, 30.5], [42.5, 45.5, 48]])


def test_avgpool_divisor_override():
  # Hand computation: the four 2x2 sums of arange(16) are 10, 18, 42, 50; divided by 3.
  y = AvgPool((2, 2), divisor_override=3)(np.arange(16.0, dtype=np.float32).reshape(1, 4, 4, 1))
  np.testing.assert_allclose(plane(y), np.array([[10, 18], [42, 50]]) / 3, rtol=1e-6)


def test_maxpool_ties_first_maximum_wins():
  # PyTorch: on ties the first maximum in row-major window order wins.
  x = nhwc([[5.0, 5.0], [5.0, 5.0]])
  values, indices = MaxPool((2, 2), return_indices=True)(x)
  assert plane(indices).tolist() == [[0]]
  grad = jax.jit(jax.grad(lambda x: MaxPool((2, 2))(x).sum()))(x)
  np.testing.assert_array_equal(plane(grad), [[1, 0], [0, 0]])
  _, indices = MinPool((2, 2), return_indices=True)(nhwc([[7.0, 2.0], [2.0, 2.0]]))
  assert plane(indices).tolist() == [[1]]


def test_maxpool_nan_propagates_and_last_nan_wins():
  # PyTorch 2.13 CPU: max_pool over [1, nan, 3, nan] gives nan at index 3 (it updates on
  # `val > max || isnan(val)`), and the gradient goes to index 3.
  x = f32(1, np.nan, 3, np.nan)[None, :, None]
  values, indices = jax.device_get(MaxPool((4,), return_indices=True)(x))
  assert np.isnan(values[0, 0, 0]) and indices[0, 0, 0] == 3
  grad = np.asarray(jax.jit(jax.grad(lambda x: MaxPool((4,))(x).sum()))(x))
  np.testing.assert_array_equal(grad[0, :, 0], [0, 0, 0, 1])
  values, indices = jax.device_get(MinPool((2,), return_indices=True)(x))
  assert np.isnan(values[0, :, 0]).all()
  np.testing.assert_array_equal(indices[0, :, 0], [1, 3])


def test_maxpool_all_minus_inf_points_at_first_real_cell():
  # PyTorch 2.13 CPU: max_pool1d(k3, s1, p1) over [-inf, -inf] -> values -inf, indices [0, 0].
  x = np.full((1, 2, 1), -np.inf, np.float32)
  values, indices = jax.device_get(MaxPool((3,), 1, 1, return_indices=True)(x))
  np.testing.assert_array_equal(values[0, :, 0], [-np.inf, -np.inf])
  np.testing.assert_array_equal(indices[0, :, 0], [0, 0])


def test_maxpool_int32_padding_uses_dtype_min():
  # PyTorch 2.13 CPU, max_pool2d(k2, s1, p1, return_indices=True) on this int32 plane.
  lo = np.iinfo(np.int32).min
  x = nhwc(np.array([[lo, 5], [lo, lo]], np.int32))
  values, indices = MaxPool((2, 2), 1, 1, return_indices=True)(x)
  assert values.dtype == jnp.int32
  np.testing.assert_array_equal(plane(values), [[lo, 5, 5], [lo, 5, 5], [lo, lo, lo]])
  np.testing.assert_array_equal(plane(indices), [[0, 1, 1], [0, 1, 1], [2, 2, 3]])


def test_minpool_int8_no_overflow():
  # -max(-x) overflows int8 at -128; MinPool compares directly.
  x = np.array([-128, 127, 3, -128], np.int8)[None, :, None]
  values, indices = jax.device_get(MinPool((2,), return_indices=True)(x))
  np.testing.assert_array_equal(values[0, :, 0], [-128, -128])
  np.testing.assert_array_equal(indices[0, :, 0], [0, 3])


def test_maxpool_dilation_and_gradient():
  # Hand computation: k2 d2 s1 over [0, 5, 1, 4, 2]: windows {0,1}, {5,4}, {1,2} by cell.
  x = f32(0, 5, 1, 4, 2)[None, :, None]
  values, indices = jax.device_get(MaxPool((2,), 1, dilation=2, return_indices=True)(x))
  np.testing.assert_array_equal(values[0, :, 0], [1, 5, 2])
  np.testing.assert_array_equal(indices[0, :, 0], [2, 1, 4])
  weights = f32(1, 2, 3)[None, :, None]
  grad = jax.jit(jax.grad(lambda x: jnp.sum(MaxPool((2,), 1, dilation=2)(x) * weights)))(x)
  np.testing.assert_array_equal(np.asarray(grad)[0, :, 0], [0, 2, 1, 0, 3])


def test_maxpool_gradient_drops_padding():
  # Hand computation: k3 s1 p1 over [2, 1]: both windows pick cell 0; padding gets nothing.
  x = f32(2, 1)[None, :, None]
  grad = jax.jit(jax.grad(lambda x: MaxPool((3,), 1, 1)(x).sum()))(x)
  np.testing.assert_array_equal(np.asarray(grad)[0, :, 0], [2, 0])


def test_lppool_vectors():
  # Hand computation: sqrt(9 + 16) = 5, sqrt(36 + 64) = 10.
  y = np.asarray(LPPool(2, (2,))(f32(3, 4, 6, 8)[:, None]))
  np.testing.assert_allclose(y[:, 0], [5, 10])
  # PyTorch 2.13 CPU: lp_pool1d([3, 4, 12], 2, 2, ceil_mode=True) = [5.0000, 16.9706]: the
  # partial window (one cell) is scaled by k / 1 = 2, so sqrt(2 * 144).
  y = np.asarray(LPPool(2, (2,), ceil_mode=True)(f32(3, 4, 12)[None, :, None]))
  np.testing.assert_allclose(y[0, :, 0], [5.0, np.sqrt(288.0)], rtol=1e-6)
  # p = 1 is a plain window sum (no absolute value): 1 + -3 = -2.
  y = np.asarray(LPPool(1, (2,))(f32(1, -3)[None, :, None]))
  np.testing.assert_allclose(y[0, :, 0], [-2.0])


def test_pool_3d():
  # Hand computation: arange(8) as a 2x2x2 cube, one 2x2x2 window: mean 3.5, max 7 at 7.
  x = np.arange(8.0, dtype=np.float32).reshape(1, 2, 2, 2, 1)
  np.testing.assert_array_equal(np.asarray(AvgPool((2, 2, 2))(x)).reshape(-1), [3.5])
  values, indices = jax.device_get(MaxPool((2, 2, 2), return_indices=True)(x))
  assert values.shape == indices.shape == (1, 1, 1, 1, 1)
  assert float(values.reshape(())) == 7.0 and int(indices.reshape(())) == 7


# Values-only max (min) over more than 9 strided, padded taps. XLA:CPU of jax 0.7 (the
# floor job) never finished compiling these when each tap read its own pad; they now
# read one shared padded copy (nnx_pool._select.PER_TAP_PAD_LIMIT).
@pytest.mark.parametrize(("module", "mirror", "shape", "window", "strides", "padding"), [
    (MaxPool, reference.max_pool, (2, 9, 9, 3), (4, 4), (2, 2), ((1, 1), (1, 1))),
    (MinPool, reference.min_pool, (2, 11, 10, 2), (5, 5), (2, 2), ((2, 2), (2, 2))),
    (MaxPool, reference.max_pool, (1, 7, 7, 7, 2), (3, 3, 3), (2, 2, 2), ((1, 1),) * 3),
])
def test_many_padded_strided_taps_match_mirror(module, mirror, shape, window, strides, padding):
  x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
  got = jax.jit(module(window, strides, padding, num_spatial_dims=len(window)))(x)
  np.testing.assert_array_equal(got, mirror(x, window, strides, padding)[0])


# Windows over 64 taps run one spatial dim at a time. A dim with a single window keeps
# one position even when its window is one tap at unit stride (here dim 0), so that
# stage must run: each config below once gave the dim's full length back.
_ONE_WINDOW_DIMS = [
    # (input shape, window, strides, padding, dilation, ceil_mode)
    ((1, 2, 9, 9, 2), (1, 9, 9), (2, 1, 1), "VALID", (1, 1, 1), False),
    ((2, 3, 70, 1), (1, 70), (5, 70), "VALID", (1, 1), False),
    ((1, 2, 70, 3), (2, 70), (2, 70), "VALID", (2, 1), True),
    ((1, 5, 33, 2), (3, 33), (4, 1), ((1, 1), (0, 0)), (1, 1), True),
]


@pytest.mark.parametrize(("shape", "window", "strides", "padding", "dilation", "ceil_mode"),
                         _ONE_WINDOW_DIMS)
def test_separable_pools_keep_one_position_for_a_single_window_dim(
    shape, window, strides, padding, dilation, ceil_mode):
  x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
  g = np.random.default_rng(8).standard_normal  # cotangent, drawn at the output's shape
  want, want_idx = reference.max_pool(x, window, strides, padding, dilation=dilation,
                                      ceil_mode=ceil_mode)
  pool = MaxPool(window, strides, padding, dilation=dilation, ceil_mode=ceil_mode,
                 return_indices=True)
  avg = AvgPool(window, strides, padding, ceil_mode=ceil_mode) if dilation == (1,) * len(
      window) else None
  ct = g(want.shape).astype(np.float32)

  @jax.jit  # values, indices, gradient and average in one program (eager: op by op)
  def run(v, ct):
    (got, idx), vjp = jax.vjp(pool, v)
    grad = vjp((ct, np.zeros(idx.shape, jax.dtypes.float0)))[0]
    return got, idx, grad, None if avg is None else avg(v)

  got, idx, grad, mean = run(jnp.asarray(x), ct)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(idx, want_idx)
  np.testing.assert_array_equal(grad, reference.max_pool_grad(
      x, ct, window, strides, padding, dilation=dilation, ceil_mode=ceil_mode))
  if avg is not None:
    np.testing.assert_allclose(mean, reference.avg_pool(x, window, strides, padding,
                                                        ceil_mode=ceil_mode), rtol=1e-6)


# --- batching, jit, vmap and dtypes ----------------------------------------------------


def test_pool_unbatched_equals_batched():
  x = np.random.default_rng(0).standard_normal((3, 6, 5, 2)).astype(np.float32)
  modules = (AvgPool((2, 2), 1, 1), MaxPool((3, 2), (2, 1)), MinPool((2, 2)), LPPool(2, (2, 2)))

  @jax.jit  # every module at both ranks in one program (eager: each layout step compiled)
  def both(x):
    return [(m(x[1]), m(x)[1]) for m in modules], MaxPool((2, 2), return_indices=True)(x[0])

  pairs, (values, indices) = both(x)
  for unbatched, batched in pairs:
    np.testing.assert_array_equal(unbatched, batched)
  assert values.shape == indices.shape == (3, 2, 2)


@nnx.jit
def _values_and_grad(module, x):
  """``module(x)`` and the gradient of ``sum(module(x) ** 2)``: one program."""
  return module(x), jax.grad(lambda v: jnp.sum(module(v) ** 2))(x)


@pytest.mark.parametrize(
    "module",
    [
        AvgPool((3, 3), 2, 1, ceil_mode=True, count_include_pad=False),
        MaxPool((2, 2), 2, ((1, 0), (0, 1)), dilation=(1, 2)),
        LPPool(3, (2, 2), ceil_mode=True),
    ],
    ids=["avg", "max", "lp"],
)
def test_pool_eager_equals_jit(module):
  # The kernels jit themselves; jax.disable_jit() runs them op by op, really eagerly. One
  # module per kernel: MinPool runs MaxPool's (_SelectPool.__call__, run_extremum with the
  # other kind), so "max" covers its eager path; MinPool's jitted values, indices and
  # gradient are checked against the mirror (test_pool_properties.py,
  # test_maxpool_minpool_match_mirror and test_maxpool_minpool_gradient_matches_mirror).
  # (Its own eager case took 0.49 s of compile CPU, 12 programs: pytest tests/test_pool.py
  # with a per-test census, 2 cores.)
  x = np.random.default_rng(1).uniform(0.5, 2.0, (2, 7, 6, 3)).astype(np.float32)

  def loss(v):
    return jnp.sum(module(v) ** 2)

  # Eager, every primitive compiles at every shape: the forward pass of each module, and
  # the gradient of one, max (its scatter to the argmax cells is min's too; the jitted
  # gradients are checked against the mirror, test_pool_properties.py, and finite
  # differences, test_pool_gradient_matches_finite_differences).
  with jax.disable_jit():
    eager = module(x)
    eager_grad = jax.grad(loss)(x) if isinstance(module, MaxPool) else None
  jitted, jitted_grad = jax.device_get(_values_and_grad(module, x))
  np.testing.assert_allclose(jitted, eager, rtol=1e-6)
  assert np.isfinite(jitted_grad).all()
  if eager_grad is not None:
    np.testing.assert_allclose(jitted_grad, eager_grad, rtol=1e-6, atol=1e-6)


def test_maxpool_vmap_matches_batch():
  x = np.random.default_rng(2).standard_normal((4, 6, 6, 2)).astype(np.float32)
  pool = MaxPool((3, 3), 2, 1, return_indices=True)
  grad = jax.grad(lambda x: pool(x)[0].sum())

  @jax.jit  # one program (eager, the vmapped backward compiled op by op)
  def both(x):
    # each example unbatched, then the batch
    return jax.vmap(pool)(x), pool(x), jax.vmap(grad)(x), grad(x)

  (values, indices), (ref_values, ref_indices), g, ref_g = both(x)
  np.testing.assert_array_equal(values, ref_values)
  np.testing.assert_array_equal(indices, ref_indices)
  np.testing.assert_array_equal(g, ref_g)


def test_maxpool_dtypes_match_float32():
  # Integer-valued inputs are exact in every dtype here, so max and min agree exactly. A
  # 1-D map, windows of 3 at stride 2 with both borders padded: a dtype changes each
  # element's comparison and fill, not how the taps are read at any rank (3x3 windows on a
  # 5x7 map took 1.0 s of compile CPU, 1-D 0.6 s: pytest -k dtypes_match_float32
  # -p tools.compile_census, 2 cores).
  x = np.random.default_rng(3).integers(-100, 100, (2, 11, 3))
  pools = [cls((3,), 2, 1, return_indices=True) for cls in (MaxPool, MinPool)]
  dtypes = (jnp.bfloat16, jnp.float16, jnp.int32, jnp.int8)
  # One program for both pools in every dtype and float32, the reference computed once (eager:
  # each layout step compiled alone; one program per dtype took 4 compiles of the float32 pools).
  results, refs = jax.jit(lambda vs, ref: ([[p(v) for p in pools] for v in vs],
                                           [p(ref) for p in pools]))(
      [x.astype(dtype) for dtype in dtypes], x.astype(np.float32))  # NumPy: no conversions
  for dtype, pooled in zip(dtypes, results, strict=True):
    for (values, indices), (ref_values, ref_indices) in zip(pooled, refs, strict=True):
      assert values.dtype == dtype
      name = np.dtype(dtype).name
      np.testing.assert_array_equal(np.asarray(values, np.float32), ref_values, err_msg=name)
      np.testing.assert_array_equal(indices, ref_indices, err_msg=name)


def _jax_holds(dtype) -> bool:
  """Whether this JAX can make an array of ``dtype`` (float6 and e5m3fnu: not in 0.10)."""
  try:
    jnp.asarray(np.zeros(2, dtype))
  except (TypeError, RuntimeError):
    return False
  return True


FLOATS = [getattr(ml_dtypes, n) for n in dir(ml_dtypes) if n.startswith(("float", "bfloat"))]


def _has_infinity(dtype) -> bool:
  return bool(np.isinf(np.array(np.inf).astype(dtype)))


# Every float ml_dtypes offers; the XLA implementation for those without infinity only
# (the others take the same -inf padding as float32, which other tests cover).
DTYPE_CASES = {"taps": FLOATS,
               "xla": [d for d in FLOATS if _jax_holds(d) and not _has_infinity(d)]}
# With return_indices=True a max or min runs the taps under either implementation
# (nnx_pool._window_kernels.window_extremum): "xla" pools values only, so that its max and min
# run XLA's reduce_window from their finite padding value. (With indices, its program compiled
# the taps' kernels a second time: 2.5 s of compile CPU, 0.9 s values only, pytest -k
# "every_ml_dtypes and xla" -p tools.compile_census, 2 cores.)
_INDICES = {"taps": True, "xla": False}


@pytest.mark.parametrize("implementation", list(DTYPE_CASES))
def test_select_pool_every_ml_dtypes_float(implementation):
  # The float8 e4m3fn/fnuz, e8m0fnu and float4 types have no infinity: padding must not
  # become NaN. Expected: the mirror on the same values in float32 (selection is exact).
  held = [d for d in DTYPE_CASES[implementation] if _jax_holds(d)]
  for dtype in DTYPE_CASES[implementation]:
    if dtype not in held:
      name = np.dtype(dtype).name
      with pytest.raises(TypeError, match=f"`inputs` has dtype {name}, which this JAX cannot"):
        MaxPool(3, 2, 1)(np.zeros((1, 4, 4, 1), dtype))
  # Windows of 2 at stride 2 with one cell of padding on a length-10 map: the first and the
  # last window read padding (low and high borders). The kernel's code is the same for any
  # window (one tap per cell) and rank (each dim's taps alike); what a dtype changes is each
  # element's comparison, fill and rounding. 1-D compiles 2 taps per dtype: 2x2 on a 6x8
  # map took 3.4 s of compile CPU for [taps], 1-D 2.2 s (pytest -k "every_ml_dtypes and
  # taps" -p tools.compile_census, 2 cores).
  xs = [np.random.default_rng(7).uniform(-6, 6, (1, 10, 2)).astype(d) for d in held]
  # MinPool in the dtypes without infinity, whose padding is their own largest value; in the
  # others it pads with +inf as in float32 (other tests), and MaxPool shows each of them
  # works. Min in those took 0.5 s CPU of [taps] (pytest -k every_ml_dtypes, 2 cores).
  with_min = [not _has_infinity(d) for d in held]

  indices = _INDICES[implementation]

  @jax.jit  # one compilation for the pools over every dtype
  def pools(vs):
    return [(MaxPool((2,), 2, 1, return_indices=indices)(v),
             MinPool((2,), 2, 1, return_indices=indices)(v) if m else None,
             AvgPool((2,), 2, 1, count_include_pad=False)(v))
            for v, m in zip(vs, with_min, strict=True)]

  with nnx_pool.use_implementation(implementation):
    results = pools(xs)  # NumPy in: jnp.asarray would compile a copy per dtype
  for dtype, x, (maxima, minima, mean) in zip(held, xs, results, strict=True):
    name = np.dtype(dtype).name
    x32 = x.astype(np.float32)
    selects = [(maxima, reference.max_pool), (minima, reference.min_pool)]
    for out, mirror in (pair for pair in selects if pair[0] is not None):
      values = out[0] if indices else out
      want_values, want_indices = mirror(x32, (2,), (2,), ((1, 1),))
      assert values.dtype == dtype, name
      np.testing.assert_array_equal(np.asarray(values).astype(np.float32), want_values,
                                    err_msg=name)
      if indices:
        np.testing.assert_array_equal(out[1], want_indices, err_msg=name)
    # Averages sum in float32 and round once: within one rounding of the float64 mean.
    want = reference.avg_pool(x32.astype(np.float64), (2,), (2,), ((1, 1),),
                              count_include_pad=False)
    assert mean.dtype == dtype, name
    np.testing.assert_allclose(np.asarray(mean).astype(np.float64), want,
                               rtol=float(ml_dtypes.finfo(dtype).eps),
                               atol=float(ml_dtypes.finfo(dtype).smallest_subnormal or 0),
                               err_msg=name)


def test_maxpool_float8_arange_with_padding():
  # The example: MaxPool(3, 2, 1) on arange(16) in e4m3fn gave [[nan nan] [nan 15]].
  x = np.arange(16.0).reshape(1, 4, 4, 1).astype(ml_dtypes.float8_e4m3fn)
  y = MaxPool(3, 2, 1)(x)
  np.testing.assert_array_equal(np.asarray(y, np.float32)[0, ..., 0], [[5, 7], [13, 15]])


@pytest.mark.parametrize("dtype, rtol", [(jnp.bfloat16, 1e-2), (jnp.float16, 1e-3)])
def test_avgpool_low_precision_accumulates_in_float32(dtype, rtol):
  x = np.random.default_rng(4).uniform(-1, 1, (2, 9, 9, 3)).astype(np.float32)
  x_low = x.astype(dtype)  # NumPy: jnp.asarray(x, dtype) compiles a conversion
  pool = AvgPool((3, 3), 1, 1, count_include_pad=False)

  @jax.jit  # the pools and the gradient in one program (eager: each step compiled alone)
  def run(v):
    grad = jax.grad(lambda a: jnp.sum(AvgPool((3, 3), 2, 1)(a).astype(jnp.float32)))(v)
    return pool(v), pool(v.astype(jnp.float32)), grad

  y, ref, grad = run(x_low)
  assert y.dtype == dtype
  np.testing.assert_allclose(np.asarray(y, np.float32), ref, rtol=rtol, atol=rtol)
  assert grad.dtype == dtype and np.isfinite(np.asarray(grad, np.float32)).all()
  # Hand computation: 256 then eight ones in one 3x3 window. Summed in float32, 264 / 9 =
  # 29.33, which rounds to 29.375 in bfloat16 (spacing 0.125) and to 29.328125 in float16.
  # A bfloat16 running sum stalls at 256 (257 rounds to even), giving 28.5. These calls
  # stay eager, as a user makes them (the module's own programs, nothing fused around).
  window = np.ones((1, 3, 3, 1), dtype)  # NumPy: .at[].set compiles a scatter
  window[0, 0, 0, 0] = 256
  want = {jnp.bfloat16: 29.375, jnp.float16: 29.328125}[dtype]
  assert float(np.asarray(AvgPool(3)(window))[0, 0, 0, 0]) == want
  assert float(np.asarray(LPPool(1, 3)(window))[0, 0, 0, 0]) == 264  # p = 1: the sum, exact


# --- equality with flax.nnx where the semantics coincide ----------------------------


# Windows and strides of the comparison with Flax: each with both paddings, VALID and SAME.
# ((3, 2), (2, 1)) overlaps in both dims (window 3 at stride 2, 2 at stride 1) and its SAME
# pads are symmetric in H, (1, 1), and high-only in W, (0, 1); ((2, 2), (2, 2)) tiles the map,
# its SAME pads high-only in H. A square ((3, 3), (1, 1)) took the same paths (overlap, SAME
# pads (1, 1)): without it the test's one program went 1.34 s -> 0.93 s of compile CPU
# (pytest tests/test_pool.py -k equals_flax with a per-test census, 2 cores).
FLAX_WINDOWS = [((2, 2), (2, 2)), ((3, 2), (2, 1))]


def test_pool_equals_flax():
  x = np.random.default_rng(5).standard_normal((2, 7, 8, 3)).astype(np.float32)
  configs = [(window, strides, padding) for window, strides in FLAX_WINDOWS
             for padding in ("VALID", "SAME")]

  # Ours and Flax's for every configuration in one program (eager: Flax's ops compiled one
  # by one; one program per configuration took 6 compiles).
  @jax.jit
  def both(x):
    out = []
    for window, strides, padding in configs:
      ours = [MaxPool(window, strides, padding)(x), MinPool(window, strides, padding)(x)]
      flax = [nnx.max_pool(x, window, strides, padding),
              nnx.min_pool(x, window, strides, padding)]
      for include in (True, False):
        ours.append(AvgPool(window, strides, padding, count_include_pad=include)(x))
        flax.append(nnx.avg_pool(x, window, strides, padding, count_include_pad=include))
      out.append((ours, flax))
    return out

  for config, (ours, flax) in zip(configs, both(x), strict=True):
    np.testing.assert_array_equal(ours[0], flax[0], err_msg=f"max {config}")
    np.testing.assert_array_equal(ours[1], flax[1], err_msg=f"min {config}")
    for got, want in zip(ours[2:], flax[2:], strict=True):  # average, pads counted or not
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"avg {config}")


# --- gradients -------------------------------------------------------------------------


def test_ceil_mode_strides_longer_than_the_input_pool_the_padded_windows():
  # L = 1, window 6, stride 3, padding 3, ceil mode: windows [-3, 3) and [0, 6), two
  # outputs (PyTorch); the second window's stride phase starts past the input.
  x = f32(5)[None, :, None]
  np.testing.assert_array_equal(np.asarray(MaxPool((6,), 3, 3, ceil_mode=True)(x))[0, :, 0],
                                [5.0, 5.0])
  # Divisors clipped to [-3, L + 3) = [-3, 4): 6 cells, then [0, 4): 4 cells.
  np.testing.assert_allclose(np.asarray(AvgPool((6,), 3, 3, ceil_mode=True)(x))[0, :, 0],
                             [5 / 6, 5 / 4], rtol=1e-7)
  grid = np.arange(6.0, dtype=np.float32).reshape(1, 2, 3, 1)
  got = np.asarray(MaxPool((7, 3), (4, 1), ((3, 3), (1, 1)), ceil_mode=True)(grid))
  want, _ = reference.max_pool(np.asarray(grid), (7, 3), (4, 1), ((3, 3), (1, 1)),
                               ceil_mode=True)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got[0, :, :, 0], [[4, 5, 5], [4, 5, 5]])  # hand: rows 0-1


def test_avgpool_gradient_closed_form():
  # The gradient of sum(avg) puts 1 / divisor on every cell of every window covering it.
  # k3 s1 p1 over L=4 excluding pads: divisors [2, 3, 3, 2]; cell 0 is in windows 0, 1.
  x = np.zeros((1, 4, 1), np.float32)
  grad = jax.jit(jax.grad(lambda x: AvgPool((3,), 1, 1, count_include_pad=False)(x).sum()))(x)
  grad = np.asarray(grad)
  expected = [1 / 2 + 1 / 3, 1 / 2 + 1 / 3 + 1 / 3, 1 / 3 + 1 / 3 + 1 / 2, 1 / 3 + 1 / 2]
  np.testing.assert_allclose(grad[0, :, 0], expected, rtol=1e-6)


@pytest.mark.parametrize(("window", "ceil_mode"), [((3, 3), False), ((3, 3), True),
                                                   ((2, 4), True), ((1, 5), False)])
def test_avgpool_gradient_of_tiling_windows_matches_mirror(window, ceil_mode):
  # Windows that tile the map (stride = window): the leftover cells of floor mode get
  # no gradient, the ceil-mode partial windows divide by their real cells. Expected:
  # the mirror's average pool is linear, so its transpose is read off one basis input
  # (a single 1) per cell.
  shape = (1, 7, 8, 1)
  pool = AvgPool(window, ceil_mode=ceil_mode)
  out_shape = jax.eval_shape(pool, jax.ShapeDtypeStruct(shape, jnp.float32)).shape
  g = np.random.default_rng(3).integers(-4, 5, out_shape).astype(np.float64)
  want = np.zeros(shape)
  for cell in np.ndindex(*shape):
    basis = np.zeros(shape)
    basis[cell] = 1.0
    want[cell] = np.sum(reference.avg_pool(basis, window, window, "VALID",
                                           ceil_mode=ceil_mode) * g)
  # Jitted: eager, the backward's every op compiles on its own (test_pool_eager_equals_jit
  # compares eager and jitted runs).
  grad = jax.jit(jax.grad(lambda v: jnp.sum(pool(v) * g)))(np.zeros(shape, np.float32))
  np.testing.assert_allclose(grad, want, rtol=1e-6)


@pytest.mark.parametrize(
    "module",
    [AvgPool((3, 3), 2, 1, ceil_mode=True), LPPool(2.5, (2, 2), 1, ceil_mode=True),
     LPPool(2, (3, 2))],
    ids=["avg", "lp2.5", "lp2"],
)
def test_pool_gradient_matches_finite_differences(module):
  x = jnp.asarray(np.random.default_rng(6).uniform(0.5, 2.0, (1, 5, 6, 2)), jnp.float32)
  check_grads(module, (x,), order=1, modes=("fwd", "rev"), eps=1e-2, atol=1e-2, rtol=1e-2)


def test_maxpool_second_order_is_zero_and_forward_mode_works():
  # Max pooling is piecewise linear: the Hessian is zero; forward mode picks the argmax.
  x = nhwc(GRID)
  # Each transformation jitted (eager, every op of the hessian compiled on its own).
  hessian = jax.jit(jax.hessian(lambda x: jnp.sum(MaxPool((2, 2), 1)(x) ** 1)))(x)
  np.testing.assert_array_equal(hessian, np.zeros((1, 4, 4, 1) * 2))
  tangent = np.arange(16.0, dtype=np.float32).reshape(1, 4, 4, 1)
  _, t_out = jax.jit(lambda x, t: jax.jvp(MaxPool((2, 2)), (x,), (t,)))(x, tangent)
  np.testing.assert_array_equal(plane(t_out), [[5, 6], [13, 11]])
  # Reverse over reverse: d/dx of the gradient of sum(y**2) is 2 at each argmax cell.
  def grad_of_square(x):
    return jax.grad(lambda x: jnp.sum(MaxPool((2, 2))(x) ** 2))(x)

  grad_of_grad = jax.jit(jax.grad(lambda x: grad_of_square(x).sum()))(x)
  expected = np.zeros(16, np.float32)
  expected[[5, 6, 13, 11]] = 2
  np.testing.assert_array_equal(plane(grad_of_grad), expected.reshape(4, 4))


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: MaxPool(0), ValueError, "`window_shape` entries must be >= 1; got 0"),
        (lambda: MaxPool((2, 2), (1, 0)), ValueError,
         r"`strides` entries must be >= 1; got \(1, 0\)"),
        (lambda: MaxPool((2, 2), dilation=-1), ValueError, "`dilation` entries must be >= 1"),
        (lambda: AvgPool((2, 2), padding="full"), ValueError, "`padding` must be"),
        (lambda: AvgPool((2, 2), padding=[1, 1, 1]), ValueError, "one entry per spatial dim"),
        (lambda: AvgPool((3, 3), 1, 2), ValueError, "at most half the effective window"),
        (lambda: AvgPool((2, 2, 2, 2)), ValueError, "1, 2 or 3 entries"),
        (lambda: AvgPool("2"), TypeError, "`window_shape` must be an int or a tuple"),
        (lambda: AvgPool((2,), divisor_override=0), ValueError,
         "`divisor_override` must be a positive"),
        (lambda: AvgPool((2,), count_include_pad=None), TypeError,
         "`count_include_pad` must be a bool"),
        (lambda: MaxPool((2,), return_indices="yes"), TypeError, "`return_indices` must be a bool"),
        (lambda: LPPool(0, (2,)), ValueError, "`norm_type` must be a positive finite number"),
        (lambda: LPPool(float("inf"), (2,)), ValueError, "`norm_type` must be a positive finite"),
        (lambda: MaxPool((2,), in_features=0), ValueError, "`in_features` must be a positive int"),
    ],
)
def test_pool_bad_arguments_raise(build, error, match):
  with pytest.raises(error, match=match):
    build()


@pytest.mark.parametrize(
    "module, x, error, match",
    [
        # NumPy inputs: jnp.zeros compiles a broadcast for each shape, at collection.
        (MaxPool((2, 2)), np.zeros((4, 4)), ValueError, r"rank 3 or more; got shape \(4, 4\)"),
        (MaxPool((2, 2, 2)), np.zeros((4, 4, 4)), ValueError, r"rank 4 or more; got shape"),
        (MaxPool((5, 5)), np.zeros((1, 4, 4, 1)), ValueError, "Output size is too small"),
        (MaxPool((2, 2)), np.zeros((1, 4, 4, 1), np.complex64), TypeError, "complex"),
        (MaxPool((2, 2)), np.zeros((1, 4, 4, 1), bool), TypeError, "dtype bool"),
        (AvgPool((2, 2)), np.zeros((1, 4, 4, 1), np.int32), TypeError, "needs a floating dtype"),
        (AvgPool((2, 2)), "image", TypeError, "`inputs` must be an array"),
    ],
)
def test_pool_bad_inputs_raise(module, x, error, match):
  with pytest.raises(error, match=match):
    module(x)


def test_pool_in_features_mismatch_names_nchw_and_the_fix():
  pool = MaxPool((2, 2), in_features=3)
  with pytest.raises(ValueError, match=r"channels-first \(NCHW.*jnp\.moveaxis\(x, 1, -1\)"):
    pool(np.zeros((2, 3, 8, 8), np.float32))
  with pytest.raises(ValueError, match=r"jnp\.moveaxis\(x, 0, -1\)"):
    pool(np.zeros((3, 8, 8), np.float32))
  with pytest.raises(ValueError, match="in_features=3 on the last axis; got shape") as info:
    pool(np.zeros((2, 8, 8, 4), np.float32))
  assert "NCHW" not in str(info.value)
  assert pool(np.zeros((2, 8, 8, 3), np.float32)).shape == (2, 4, 4, 3)


def test_pool_checks_survive_python_O():
  # python -O drops `assert` statements and `if __debug__:` blocks, and nothing else that
  # code can see but sys.flags.optimize. The package has none of the three, so every check
  # runs under -O as it does here. (test_errors_table_holds_under_python_O runs the whole
  # errors table, MaxPool's `window_shape` below 1 included, in a `python -O` child.)
  found = []
  for path in sorted(Path(nnx_pool.__file__).parent.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if (isinstance(node, ast.Assert)
          or isinstance(node, ast.Name) and node.id == "__debug__"
          or isinstance(node, ast.Attribute) and node.attr == "optimize"):
        found.append(f"{path.name}:{node.lineno}")
  assert not found, f"code that python -O changes: {found}"
  with pytest.raises(ValueError, match="`window_shape` entries must be >= 1"):
    MaxPool((0,))


@pytest.mark.parametrize(
    "window, strides, padding, dilation, ceil_mode, shape",
    [
        ((3,), (2,), ((1, 1),), (2,), True, (2, 11, 3)),
        ((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), True, (2, 8, 7, 2)),
        ((2, 3), (1, 2), ((0, 1), (1, 0)), (2, 1), False, (1, 7, 9, 2)),
        ((2, 2, 2), (1, 2, 2), ((1, 1), (0, 0), (1, 1)), (1, 1, 2), True, (1, 4, 5, 6, 2)),
    ],
)
def test_maxpool_gradient_matches_mirror(window, strides, padding, dilation, ceil_mode, shape):
  # NumPy mirror (nnx_pool.reference): each output's cotangent added to its argmax cell.
  from nnx_pool import reference

  rng = np.random.default_rng(7)
  # Small integers are exact in bfloat16; the few ties follow the first-max rule in both.
  x = (rng.permutation(np.prod(shape)) % 200 - 100).reshape(shape).astype(np.float32)
  pool = MaxPool(window, strides, padding, dilation=dilation, ceil_mode=ceil_mode)
  out_shape = jax.eval_shape(pool, jax.ShapeDtypeStruct(shape, jnp.float32)).shape
  g = rng.integers(-8, 8, out_shape).astype(np.float32)
  expected = reference.max_pool_grad(
      x, g, window, strides, padding, dilation=dilation, ceil_mode=ceil_mode
  )
  # bfloat16 and float16 on the 2-D geometry with overlapping windows, padding and ceil
  # mode and on the 3-D one: a dtype changes each element's comparison and each cell's
  # accumulation, not the geometry (float32 shows the other two); the low-precision ones on
  # all four took 1.5 s of compile CPU, on two 1.0 s (pytest -k gradient_matches_mirror
  # -p tools.compile_census, 2 cores).
  low = len(window) == 3 or window == (3, 3)
  dtypes = (jnp.bfloat16, jnp.float16, jnp.float32) if low else (jnp.float32,)

  # Jitted (eager, the backward's every op compiles on its own), the dtypes' gradients in
  # one program (one per dtype took 12 compiles for the 4 geometries).
  @jax.jit
  def grads(x, g):
    return [jax.grad(lambda v: jnp.sum(pool(v).astype(jnp.float32) * g))(x.astype(dtype))
            for dtype in dtypes]

  for dtype, grad in zip(dtypes, grads(x, g), strict=True):
    assert grad.dtype == dtype
    np.testing.assert_array_equal(np.asarray(grad, np.float32), expected,
                                  err_msg=np.dtype(dtype).name)


def test_each_module_documents_the_arguments_it_takes_in_order():
  # The Args sections are made from one text per argument (_pool._ARGS): each module lists
  # exactly its own arguments, in the order of its signature.
  def listed(cls):
    args = cls.__doc__.split("\nArgs:\n", 1)[1]
    return [line.split(":")[0].strip() for line in args.splitlines() if line[:4].strip()]

  common = ["window_shape", "strides"]
  assert listed(AvgPool) == [*common, "padding", "num_spatial_dims", "ceil_mode",
                             "count_include_pad", "divisor_override", "in_features"]
  assert listed(MaxPool) == listed(MinPool) == [
      *common, "padding", "num_spatial_dims", "dilation", "ceil_mode", "return_indices",
      "in_features"]
  assert listed(LPPool) == ["norm_type", *common, "num_spatial_dims", "ceil_mode",
                            "in_features"]
  assert "padding: cells added around the input" in MinPool.__doc__


def test_documenting_a_class_without_a_docstring_leaves_it_alone():
  # python -OO drops docstrings: building the Args section must not fail on import then.
  from nnx_pool._pool import _document

  class Bare:
    def __init__(self, window_shape):
      pass

  assert _document(Bare).__doc__ is None
