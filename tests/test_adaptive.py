"""Tests for adaptive and selectable pooling (nnx_pool._adaptive).

Each expectation says where it comes from: a hand computation, a seed
fixture (seed 003, seed 004), the NumPy mirror (nnx_pool.reference)
or PyTorch 2.13 CPU. The PyTorch tests skip cleanly when torch is absent.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_pool import GlobalAvgPool, GlobalMaxPool, _adaptive, reference
from nnx_pool._adaptive import AdaptiveAvgPool, AdaptiveMaxPool, SelectAdaptivePool

_TORCH_REASON = "PyTorch parity needs torch==2.13.0 (the parity extra)"


def line(values):
  """A 1-D signal as (1, L, 1), made by NumPy (jnp would compile a conversion per shape)."""
  return np.asarray(values, np.float32)[None, :, None]


def jitted(fn, *args):
  """``fn(*args)`` as one compiled program. Called eagerly, a module also compiles each
  layout step (batch axes, reshapes) as a program of its own; eager calls equal jitted
  ones on every path (test_adaptivepools_eager_equals_jit_and_gradients_finite)."""
  # As NumPy arrays: indexing a jax.Array (y[0, :, 0]) compiles a slice and a squeeze per shape.
  return jax.device_get(jax.jit(fn)(*args))


# ----------------------------------------------------------------------------
# Adaptive pools: explicit vectors.
# ----------------------------------------------------------------------------


def test_adaptiveavgpool_pytorch_bins_not_equinox():
  # PyTorch 2.13 CPU, F.adaptive_avg_pool1d(arange(14), 4): the overlapping bins [0,4)
  # [3,7) [7,11) [10,14) give [1.5, 4.5, 8.5, 11.5]. (Equinox's bins partition the input
  # without overlap instead; we follow PyTorch.)
  y = AdaptiveAvgPool((4,))(line(np.arange(14)))[0, :, 0]
  np.testing.assert_array_equal(y, [1.5, 4.5, 8.5, 11.5])


def test_adaptivepool_overlapping_bins_1d():
  # Hand computation: 5 cells to 3 bins [0,2) [1,4) [3,5) over [0, 1, 2, 3, 4].
  avg, (values, indices) = jitted(
      lambda x: (AdaptiveAvgPool((3,))(x), AdaptiveMaxPool((3,), return_indices=True)(x)),
      line(np.arange(5)))
  np.testing.assert_array_equal(avg[0, :, 0], [0.5, 2.0, 3.5])
  np.testing.assert_array_equal(values[0, :, 0], [1.0, 3.0, 4.0])
  np.testing.assert_array_equal(indices[0, :, 0], [1, 3, 4])
  assert indices.dtype == jnp.int32


def test_adaptivepool_2d_hand_computed():
  # Hand computation: arange(9) as 3x3 to 2x2; rows and columns both bin to [0,2) [1,3),
  # so the boxes are {0,1,3,4}, {1,2,4,5}, {3,4,6,7}, {4,5,7,8}.
  avg, (values, indices) = jitted(
      lambda x: (AdaptiveAvgPool(2)(x), AdaptiveMaxPool(2, return_indices=True)(x)),
      np.arange(9.0, dtype=np.float32).reshape(1, 3, 3, 1))
  np.testing.assert_array_equal(avg[0, ..., 0], [[2.0, 3.0], [5.0, 6.0]])
  np.testing.assert_array_equal(values[0, ..., 0], [[4.0, 5.0], [7.0, 8.0]])
  np.testing.assert_array_equal(indices[0, ..., 0], [[4, 5], [7, 8]])


def test_adaptivepool_output_larger_than_input_and_none():
  # Hand computation: 2 cells to 3 bins [0,1) [0,2) [1,2): [2, 6] -> [2, 4, 6].
  # None keeps a dim: arange(6) as 2x3 to (None, 1) gives the row means [1, 4].
  larger, y = jitted(lambda a, b: (AdaptiveAvgPool((3,))(a), AdaptiveAvgPool((None, 1))(b)),
                     line([2, 6]), np.arange(6.0, dtype=np.float32).reshape(1, 2, 3, 1))
  np.testing.assert_array_equal(larger[0, :, 0], [2.0, 4.0, 6.0])
  np.testing.assert_array_equal(y[0, :, :, 0], [[1.0], [4.0]])


def test_adaptivemaxpool_ties_first_and_nan_last():
  # Hand computation of PyTorch's scan (val > max or isnan(val)): 4 cells to bins
  # [0,2) [1,3) [2,4). On [5, 5, 1, 5] the first 5 of each bin wins: cells 0, 1, 3.
  # On [nan, 1, nan, 2] to one bin the last NaN (cell 2) wins.
  (_, ties), (values, indices) = jitted(
      lambda a, b: (AdaptiveMaxPool((3,), return_indices=True)(a),
                    AdaptiveMaxPool((1,), return_indices=True)(b)),
      line([5, 5, 1, 5]), line([np.nan, 1, np.nan, 2]))
  np.testing.assert_array_equal(ties[0, :, 0], [0, 1, 3])
  assert np.isnan(values[0, 0, 0]) and indices[0, 0, 0] == 2


def test_adaptivemaxpool_3d_flat_index():
  # Hand computation: a single 1 at (d, h, w) = (1, 2, 3) of a 2x3x4 volume has the flat
  # per-plane index (1 * 3 + 2) * 4 + 3 = 23; bins (1, 2, 2) = [0,2) x {[0,2),[1,3)} x
  # {[0,2),[2,4)} put it in output (0, 1, 1) only.
  x = np.zeros((1, 2, 3, 4, 1), np.float32)
  x[0, 1, 2, 3, 0] = 1.0
  values, indices = jitted(AdaptiveMaxPool((1, 2, 2), return_indices=True), x)
  np.testing.assert_array_equal(values[0, 0, ..., 0], [[0.0, 0.0], [0.0, 1.0]])
  assert indices[0, 0, 1, 1, 0] == 23


def test_adaptivepool_integer_dtypes():
  # Max takes integers (hand computation: [3, 9, -2, 4] to 2 bins -> [9, 4]); average refuses.
  y = jitted(AdaptiveMaxPool((2,)), np.array([[3], [9], [-2], [4]], np.int32))
  np.testing.assert_array_equal(y[:, 0], [9, 4])
  assert y.dtype == jnp.int32
  with pytest.raises(TypeError, match="floating dtype"):
    jax.eval_shape(AdaptiveAvgPool((2,)), np.array([[3], [9]], np.int32))


def test_adaptiveavgpool_bfloat16_sums_in_float32():
  # Hand computation: bins of [253, 1, 1, 1, 1] in bfloat16. The float32 sum is 257 and
  # 257 / 5 = 51.4, which rounds to 51.5 in bfloat16 (spacing 0.25). In bfloat16, 257
  # rounds to 256 (ties to even) and 256 / 5 = 51.2 to 51.25. The divisor 5 is exact in
  # bfloat16, so only the accumulation dtype can change the result. One bin is the
  # global-mean path, two bins of 5 the window-kernel path.
  # One compiled program for the three (each eager call compiles its layout steps anew).
  line = np.array([253, 1, 1, 1, 1] * 2, jnp.bfloat16)[None, :, None]
  pools = [(AdaptiveAvgPool((1,)), line[:, :5]), (GlobalAvgPool(num_spatial_dims=1),
           line[:, :5]), (AdaptiveAvgPool((2,)), line)]
  for y in jitted(lambda xs: [pool(x) for (pool, _), x in zip(pools, xs, strict=True)],
                  [x for _, x in pools]):
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(y, np.float32).reshape(-1), 51.5)


def test_adaptivepool_unbatched_equals_batched():
  x = np.random.default_rng(1).standard_normal((7, 5, 3)).astype(np.float32)
  pools = (AdaptiveAvgPool((3, 2)), AdaptiveMaxPool((3, 2)), GlobalAvgPool())
  for single, batched in jitted(lambda x: [(p(x), p(x[None])) for p in pools], x):
    np.testing.assert_array_equal(single, batched[0])


def test_adaptivepool_matches_numpy_mirror_on_every_path():
  # NumPy mirror (reference.adaptive_*_pool): the global path (1, 1), the window-kernel
  # path (divisible, <= 64 cells), the per-dim reshape path (divisible, 81 cells) and the
  # gather path (not divisible). The mirror divides once by the cell count while PyTorch
  # (and we) divide per dim, hence one ULP of tolerance on averages.
  rng = np.random.default_rng(2)
  outs = [(1, 1), (4, 3), (2, 1), (3, 4)]
  xs = [rng.integers(-4, 5, (2, *spatial, 3)).astype(np.float32)
        for spatial in [(6, 5), (8, 6), (18, 9), (7, 5)]]
  for x in xs:
    x[0, 0, 0, 0] = np.nan
  got = jitted(lambda xs: [(AdaptiveAvgPool(out)(x), AdaptiveMaxPool(out, return_indices=True)(x))
                           for out, x in zip(outs, xs, strict=True)], xs)
  for out, x, (avg, (values, indices)) in zip(outs, xs, got, strict=True):
    np.testing.assert_allclose(avg, reference.adaptive_avg_pool(x, out), rtol=2e-7)
    ref_values, ref_indices = reference.adaptive_max_pool(x, out)
    np.testing.assert_array_equal(values, ref_values)
    np.testing.assert_array_equal(indices, ref_indices)


def test_adaptivepool_fast_paths_agree_with_per_dim_path(monkeypatch):
  # The window-kernel path against the per-dim path on the same divisible sizes, with ties
  # and NaN: both must give the same values and indices, bit for bit.
  x = np.random.default_rng(3).integers(0, 3, (2, 8, 12, 2)).astype(np.float32)
  x[1, 2, 3, 1] = np.nan
  fast = AdaptiveMaxPool((4, 3), return_indices=True)(x), AdaptiveAvgPool((4, 3))(x)
  monkeypatch.setattr(_adaptive, "_MAX_WINDOW_CELLS", 0)
  slow = AdaptiveMaxPool((4, 3), return_indices=True)(x), AdaptiveAvgPool((4, 3))(x)
  for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(slow), strict=True):
    np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------
# Gradients, eager and jit.
# ----------------------------------------------------------------------------


def test_adaptivemaxpool_gradient_lands_on_index_cell():
  # Hand computation: [5, 5, 1, 5, 0] to 3 bins [0,2) [1,4) [3,5): the first maxima are
  # cells 0, 1, 3; output gradients 1, 2, 3 land there and nowhere else.
  x = line([5, 5, 1, 5, 0])
  pool = AdaptiveMaxPool((3,), return_indices=True)
  g = line([1.0, 2.0, 3.0])

  def run(x):  # forward mode agrees
    return (pool(x)[1], jax.grad(lambda a: (pool(a)[0] * g).sum())(x),
            jax.jvp(lambda a: pool(a)[0], (x,), (line(np.arange(5.0)),))[1])

  indices, grad, tangent = jitted(run, x)
  np.testing.assert_array_equal(indices[0, :, 0], [0, 1, 3])
  np.testing.assert_array_equal(grad[0, :, 0], [1.0, 2.0, 0.0, 3.0, 0.0])
  np.testing.assert_array_equal(tangent[0, :, 0], [0.0, 1.0, 3.0])


def test_adaptiveavgpool_gradient_hand_computed():
  # Hand computation: 5 cells to bins [0,2) [1,4) [3,5) of sizes 2, 3, 2; d(sum)/dx is
  # 1/2, 1/2 + 1/3, 1/3, 1/3 + 1/2, 1/2.
  grad = jitted(jax.grad(lambda a: AdaptiveAvgPool((3,))(a).sum()), line(np.arange(5)))
  np.testing.assert_allclose(grad[0, :, 0], [0.5, 5 / 6, 1 / 3, 5 / 6, 0.5], rtol=1e-6)


# One point per computation path on the (7, 6) map (each op-by-op run compiles every
# primitive anew, about 50 a path): the global mean; the window path (7, 3), where every
# dim divides, for average and max; the per-dim bin path (2, 2), a gather along H (7 to 2)
# and a reshape along W (6 to 2), for average and max, then concatenated and flattened.
# The plain Adaptive*Pool modules call the same functions. The global max is the bin
# path's max (adaptive_max -> bins_select -> _select.arg_extremum_over_bins, its custom
# derivative included) with the plane as one stage reshaped to one bin, which the reshape
# stage along W takes here; its own run compiled 39 programs, 1.2 s of CPU (compile census).
@pytest.mark.parametrize(
    "pool",
    [GlobalAvgPool(), SelectAdaptivePool((7, 3), pool_type="avgmax"),
     SelectAdaptivePool(2, pool_type="catavgmax", flatten=True)],
    ids=["global_avg", "window_avgmax", "bins_catavgmax"],
)
def test_adaptivepools_eager_equals_jit_and_gradients_finite(pool):
  # The kernels jit themselves; jax.disable_jit() runs them op by op, really eagerly.
  # One vjp gives the output and the gradient of sum(y ** 2) (2 y pulled back), so the
  # eager forward runs once, not a second time inside jax.grad; jitted likewise, in one call.
  x = np.random.default_rng(4).standard_normal((2, 7, 6, 3)).astype(np.float32)

  def value_and_grad(m, a):
    y, pullback = jax.vjp(m, a)
    return y, pullback(2 * y)[0]

  with jax.disable_jit():
    eager, eager_grad = value_and_grad(pool, x)
  jitted, jitted_grad = nnx.jit(value_and_grad)(pool, x)
  np.testing.assert_allclose(eager, jitted, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(jitted_grad, eager_grad, rtol=1e-6, atol=1e-6)
  assert eager_grad.shape == x.shape and np.isfinite(eager_grad).all()


# ----------------------------------------------------------------------------
# SelectAdaptivePool.
# ----------------------------------------------------------------------------


def test_selectadaptivepool_types_hand_computed():
  # Hand computation on one 2x2 plane [[1, 2], [3, 6]]: avg 3, max 6, avgmax 4.5.
  x = np.array([[1.0, 2.0], [3.0, 6.0]], np.float32)[None, :, :, None]
  expected = {"avg": [3.0], "max": [6.0], "avgmax": [4.5], "catavgmax": [3.0, 6.0]}
  pools = {t: SelectAdaptivePool(pool_type=t, flatten=True) for t in expected}
  got = jitted(lambda x: {t: pool(x) for t, pool in pools.items()}, x)
  for pool_type, want in expected.items():
    np.testing.assert_array_equal(got[pool_type], [want])
    assert pools[pool_type].feat_mult() == len(want)


def test_selectadaptivepool_shapes_and_flatten():
  # Shapes are fixed when the call is traced: eval_shape traces it, and compiles nothing.
  x = jax.ShapeDtypeStruct((2, 6, 6, 5), jnp.float32)
  assert jax.eval_shape(SelectAdaptivePool(), x).shape == (2, 1, 1, 5)
  assert jax.eval_shape(SelectAdaptivePool(pool_type="catavgmax"), x).shape == (2, 1, 1, 10)
  assert jax.eval_shape(SelectAdaptivePool(3, pool_type="catavgmax", flatten=True),
                        x).shape == (2, 90)
  unbatched = jax.ShapeDtypeStruct((6, 6, 5), jnp.float32)
  assert jax.eval_shape(SelectAdaptivePool(flatten=True), unbatched).shape == (5,)


# ----------------------------------------------------------------------------
# Argument and input errors.
# ----------------------------------------------------------------------------


def test_adaptivepool_output_size_forms():
  assert AdaptiveAvgPool(3).output_size == (3, 3)
  assert AdaptiveAvgPool(3, num_spatial_dims=3).output_size == (3, 3, 3)
  assert AdaptiveAvgPool((None, 4)).output_size == (None, 4)
  with pytest.raises(ValueError, match="`output_size`"):
    AdaptiveAvgPool(0)
  with pytest.raises(ValueError, match="`output_size`"):
    AdaptiveAvgPool((1, 2, 3, 4))
  with pytest.raises(TypeError, match="`output_size`"):
    AdaptiveMaxPool((2, "a"))
  with pytest.raises(TypeError, match="`output_size`"):
    AdaptiveMaxPool(2.0)
  with pytest.raises(ValueError, match="but `num_spatial_dims=1` sets 1 spatial dim"):
    AdaptiveAvgPool((2, 2), num_spatial_dims=1)
  with pytest.raises(ValueError, match="`num_spatial_dims` must be 1, 2 or 3"):
    GlobalAvgPool(num_spatial_dims=4)
  with pytest.raises(TypeError, match="`keepdims`"):
    GlobalMaxPool(keepdims=1)
  with pytest.raises(ValueError, match="`pool_type`"):
    SelectAdaptivePool(pool_type="fast")


def test_adaptivepool_rank_and_layout_errors():
  with pytest.raises(ValueError, match=r"rank 3 or more; got shape \(4, 5\)"):
    AdaptiveAvgPool(2)(np.ones((4, 5), np.float32))
  with pytest.raises(ValueError, match=r"NCHW.*jnp.moveaxis\(x, 1, -1\)"):
    GlobalAvgPool(in_features=3)(np.ones((2, 3, 8, 8), np.float32))
  with pytest.raises(ValueError, match="in_features=3"):
    AdaptiveMaxPool(2, in_features=3)(np.ones((2, 8, 8, 4), np.float32))


# ----------------------------------------------------------------------------
# PyTorch 2.13 parity.
# ----------------------------------------------------------------------------


def _parity_configs():
  """(spatial, output_size, batched): hand-picked paths plus a seeded sweep."""
  # One configuration per path: the gather (bins that do not divide the dim), an output
  # larger than the input, the window kernels (divisible, <= 64 cells), the per-dim reshape
  # (divisible, more cells), the global mean and max, None, unbatched; each in 1-D, 2-D and
  # 3-D where its code depends on the rank (the gather and the reshape run per dim, the
  # global path on every spatial axis at once). Five took a kept path again, at about 0.15 s
  # of compile each (compile census, jit_ours 2.33 s for 16): ((14,), (4,)), the 1-D gather
  # of ((5,), (3,)) (its bins are also written out in
  # test_adaptiveavgpool_pytorch_bins_not_equinox); ((5, 7), (2, 3)), a gather along both
  # dims, which ((4, 4), (7, 3)) (W 4 to 3), ((5, 7), (None, 2)) (W 7 to 2) and the 3-D
  # ((3, 5, 7), (2, 3, 4)) take per dim; ((6, 5), (1, 1)), the global path of ((13,), (1,))
  # and ((3, 5, 7), (1, 1, 1)) in 2-D (test_selectadaptivepool_matches_timm_formulas_in_pytorch
  # compares the 2-D global mean and max with PyTorch's as well); ((10,), (5,)), the window
  # kernels of ((8, 8), (4, 4)) in 1-D; ((3,), (5,)), the larger output of ((4, 4), (7, 3))
  # (H 4 to 7), ((2, 3, 4), (3, None, 5)) and the seeded draw in 1-D (also written out in
  # test_adaptivepool_output_larger_than_input_and_none).
  picked = [
      ((5,), (3,), True), ((13,), (1,), False), ((130,), (2,), True),
      ((8, 8), (4, 4), True), ((4, 4), (7, 3), True),
      ((5, 7), (None, 2), False), ((18, 18), (2, 2), True),
      ((3, 5, 7), (2, 3, 4), True), ((2, 3, 4), (3, None, 5), True), ((3, 5, 7), (1, 1, 1), False),
  ]
  # One seeded draw, (1, 1, 4) to (2, 3, 1): outputs larger than a length-1 input beside a
  # dim reduced to 1. The next draws took paths kept above, at about 0.2 s of compile each:
  # the second, (8, 8) to (7, 9), a gather shrinking one dim and an output larger than the
  # input on the other, is ((4, 4), (7, 3)) with the axes swapped; three more drew gathers
  # and larger outputs in 2-D and 3-D again.
  rng = np.random.default_rng(2026)
  swept = []
  for _ in range(1):
    ndim = int(rng.integers(1, 4))
    spatial = tuple(int(v) for v in rng.integers(1, {1: 20, 2: 10, 3: 6}[ndim], ndim))
    out = tuple(int(v) for v in rng.integers(1, {1: 20, 2: 10, 3: 6}[ndim], ndim))
    swept.append((spatial, out, bool(rng.random() < 0.8)))
  return picked + swept


def _parity_inputs(spatial, rng):
  """Four kinds as the batch, two channels each: distinct values, ties, NaN, +-inf."""
  size = int(np.prod(spatial)) * 2
  kinds = [
      rng.permutation(size).astype(np.float32) - size / 2,  # distinct
      rng.integers(-2, 3, size).astype(np.float32),  # many ties
      np.where(rng.random(size) < 0.2, np.nan, rng.integers(-2, 3, size)).astype(np.float32),
      np.choose(rng.integers(0, 3, size), [-np.inf, np.inf, rng.integers(-2, 3, size)]
                ).astype(np.float32),
  ]
  return np.stack([k.reshape(*spatial, 2) for k in kinds])


def _torch_adaptive(torch, x, out, kind):
  """PyTorch's functional adaptive pool on a channels-last NumPy array."""
  ndim = x.ndim - 2
  fn = getattr(torch.nn.functional, f"adaptive_{kind}_pool{ndim}d")
  if ndim == 1:  # adaptive_*_pool1d refuses None; 2-D and 3-D take it as "keep"
    out = tuple(x.shape[1] if t is None else t for t in out)
  xt = torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1)))
  result = fn(xt, out, return_indices=True) if kind == "max" else (fn(xt, out),)
  return [np.moveaxis(r.numpy(), 1, -1) for r in result]


def test_adaptivepools_match_pytorch_sweep():
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  rng = np.random.default_rng(7)
  configs = _parity_configs()
  inputs = [_parity_inputs(spatial, rng) for spatial, _, _ in configs]
  # Averages of integer-valued data (every kind but the first) must match bit for bit;
  # the first kind is standard normal, within float32 rounding (the sums run in another order).
  avg_inputs = [np.concatenate([rng.standard_normal(x[:1].shape), x[1:]]).astype(np.float32)
                for x in inputs]

  def ours(xs, avg_xs):
    results = []
    for (spatial, out, batched), x, xa in zip(configs, xs, avg_xs, strict=True):
      if not batched:  # unbatched: fold the four kinds into the channel axis
        x = jnp.moveaxis(x, 0, -2).reshape(*spatial, -1)
        xa = jnp.moveaxis(xa, 0, -2).reshape(*spatial, -1)
      values, indices = AdaptiveMaxPool(out, return_indices=True)(x)
      results.append((values, indices, AdaptiveAvgPool(out)(xa)))
    return results

  # As NumPy arrays: slicing a jax.Array compiles a program per shape (24 of them, 0.7 s).
  for (spatial, out, batched), x, xa, (values, indices, avg) in zip(
      configs, inputs, avg_inputs, jax.device_get(jax.jit(ours)(inputs, avg_inputs)),
      strict=True):
    if not batched:
      values, indices, avg = (np.moveaxis(np.asarray(a).reshape(*a.shape[:-1], 4, 2), -2, 0)
                              for a in (values, indices, avg))
    t_values, t_indices = _torch_adaptive(torch, x, out, "max")
    (t_avg,) = _torch_adaptive(torch, xa, out, "avg")
    msg = f"spatial={spatial} output_size={out} batched={batched}"
    np.testing.assert_array_equal(values, t_values, err_msg=msg)
    np.testing.assert_array_equal(indices, t_indices, err_msg=msg)
    np.testing.assert_array_equal(avg[1:], t_avg[1:], err_msg=msg)
    np.testing.assert_allclose(avg[:1], t_avg[:1], rtol=1e-5, atol=1e-6, err_msg=msg)


def test_adaptivepools_gradients_match_pytorch():
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  rng = np.random.default_rng(8)
  # The batched 1-D and 2-D paths of the sweep: the gather (1-D), the reshape (1-D and 2-D),
  # the window kernels, and the larger output beside a gather ((4, 4) to (7, 3)).
  configs = [c for c in _parity_configs() if c[2]][:5]
  # Finite inputs with ties (kinds 0 and 1): the max gradient must land where PyTorch's does.
  inputs = [_parity_inputs(spatial, rng)[:2] for spatial, _, _ in configs]
  shapes = [(2, *(s if t is None else t for s, t in zip(spatial, out, strict=True)), 2)
            for spatial, out, _ in configs]
  cotangents = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]

  def grads(xs, gs):
    out = []
    for (_, size, _), x, g in zip(configs, xs, gs, strict=True):
      g_max = jax.vjp(AdaptiveMaxPool(size), x)[1](g)[0]
      g_avg = jax.vjp(AdaptiveAvgPool(size), x)[1](g)[0]
      out.append((g_max, g_avg))
    return out

  for (spatial, size, _), x, g, (g_max, g_avg) in zip(
      configs, inputs, cotangents, jax.jit(grads)(inputs, cotangents), strict=True):
    gt = torch.from_numpy(np.ascontiguousarray(np.moveaxis(g, -1, 1)))
    expected = []
    for kind in ("max", "avg"):
      xt = torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1))).requires_grad_()
      fn = getattr(torch.nn.functional, f"adaptive_{kind}_pool{len(spatial)}d")
      fn(xt, tuple(s if t is None else t for s, t in zip(spatial, size, strict=True))).backward(gt)
      expected.append(np.moveaxis(xt.grad.numpy(), 1, -1))
    msg = f"spatial={spatial} output_size={size}"
    np.testing.assert_array_equal(g_max, expected[0], err_msg=msg)
    np.testing.assert_allclose(g_avg, expected[1], rtol=1e-6, atol=1e-7, err_msg=msg)


def test_selectadaptivepool_matches_timm_formulas_in_pytorch():
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  F = torch.nn.functional
  x = np.random.default_rng(9).standard_normal((2, 7, 5, 3)).astype(np.float32)
  xt = torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1)))
  # timm's SelectAdaptivePool2d(pool_type, flatten=True) (timm/layers/adaptive_avgmax_pool.py:
  # avgmax is 0.5 * (avg + max), catavgmax concatenates on the channels), written here.
  avg, mx = F.adaptive_avg_pool2d(xt, 1).flatten(1), F.adaptive_max_pool2d(xt, 1).flatten(1)
  expected = {"avg": avg, "max": mx, "avgmax": 0.5 * (avg + mx),
              "catavgmax": torch.cat([avg, mx], dim=1)}
  pools = {t: SelectAdaptivePool(1, pool_type=t, flatten=True) for t in expected}
  got = jitted(lambda x: {t: pool(x) for t, pool in pools.items()}, x)  # one program for all
  for pool_type, want in expected.items():
    np.testing.assert_allclose(got[pool_type], want.numpy(), rtol=1e-6, atol=1e-6,
                               err_msg=pool_type)
