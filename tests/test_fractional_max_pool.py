"""Tests for fractional max pooling (nnx_pool._fractional), PyTorch's FractionalMaxPool2d/3d.

Each expectation says where it comes from: an interval table or array computed by hand
(written out), the NumPy mirror (``nnx_pool.reference.fractional_max_pool``, loops over
``fractional_intervals`` in the sample's dtype), or PyTorch 2.13 CPU itself:
``torch.nn.functional.fractional_max_pool2d/3d(..., _random_samples=samples)``, whose
values, indices and gradients must agree bit for bit. The PyTorch tests skip cleanly
when torch is absent.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from nnx_pool import ChannelsFirstWarning, reference
from nnx_pool._fractional import FractionalMaxPool, fractional_max_pool, interval_starts

_TORCH_REASON = "PyTorch parity needs torch==2.13.0 (the parity extra)"


def _float0(shape):
  return np.zeros(shape, jax.dtypes.float0)


def _value_index_grad(x, window, out, samples, g=None):
  """Values, indices and the gradient of sum(values * g), g = 1, 2, 3, ... by default (one jit)."""

  @jax.jit
  def run(x, samples, g):
    (values, index), vjp = jax.vjp(
        lambda x: fractional_max_pool(x, window, out, samples=samples, return_indices=True), x)
    if g is None:
      g = jnp.arange(1, values.size + 1, dtype=values.dtype).reshape(values.shape)
    return values, index, vjp((g, _float0(index.shape)))[0]

  return jax.device_get(run(x, samples, g))  # NumPy out: indexing a jax.Array compiles


# ----------------------------------------------------------------------------
# Interval tables and small cases by hand.
# ----------------------------------------------------------------------------


def test_interval_table_for_a_given_sample():
  # L = 10 cells, 4 windows of 3: alpha = (10 - 3) / (4 - 1) = 7 / 3. By hand in float32, as
  # PyTorch computes for a float32 input: u = float32(0.2857143) = 0.28571430, alpha =
  # 2.3333333 (2.33333325, below 7/3); 1 + u = 1.28571427; (1 + u) * alpha = 2.99999976 -> 2
  # (exactly, 9/7 * 7/3 = 3); (2 + u) * alpha = 5.3333335 -> 5; u * alpha = 0.67 -> 0; the
  # last window starts at 10 - 3 = 7. In float64 the second window would start at 3.
  u = np.float32(0.2857143)
  # The three tables in one jitted program (eager, each op compiles alone).
  table, half, one = jax.jit(lambda u, h, n: (
      interval_starts(u, 10, 4, 3), interval_starts(h, 10, 4, 2), interval_starts(n, 7, 1, 3)))(
          np.array([u]), np.array([0.5], np.float32), np.array([0.9], np.float32))
  expected = [0, 2, 5, 7]
  np.testing.assert_array_equal(table, [expected])
  assert reference.fractional_intervals(u, 10, 4, 3) == expected
  assert reference.fractional_intervals(np.float64(u), 10, 4, 3) == [0, 3, 5, 7]
  # u = 0.5, 4 windows of 2 over 10: alpha = 8/3; int(0.5a)=1, int(1.5a)=int(4.0)=4,
  # int(2.5a)=int(6.67)=6, minus 1 each; last 10 - 2 = 8.
  np.testing.assert_array_equal(half, [[0, 3, 5, 8]])
  # One window: it starts at L - k whatever the sample.
  np.testing.assert_array_equal(one, [[4]])


def test_pool_by_hand_with_pytorch_sample_order():
  # 5x5 arange, 2x2 windows, 3x3 outputs: alpha = 3 / 2. Samples (W's, H's) = (0.3, 0.6),
  # PyTorch's order in 2-D. H: int((i + .6) * 1.5) - int(.9) = 0, 2; last 3: rows 0, 2, 3.
  # W: int((i + .3) * 1.5) - int(.45) = 0, 1; last 3: columns 0, 1, 3. Each window's max
  # is its bottom-right cell (the input increases along both axes).
  x = np.arange(25.0, dtype=np.float32).reshape(1, 5, 5, 1)
  values, index, grad = _value_index_grad(x, 2, 3, np.array([[[0.3, 0.6]]], np.float32))
  expected_index = [[6, 7, 9], [16, 17, 19], [21, 22, 24]]
  np.testing.assert_array_equal(index[0, ..., 0], expected_index)
  np.testing.assert_array_equal(values[0, ..., 0], np.array(expected_index, np.float32))
  # The gradient of output k (cotangent k + 1, row-major) lands on its cell.
  expected_grad = np.zeros(25, np.float32)
  expected_grad[np.array(expected_index).ravel()] = np.arange(1, 10)
  np.testing.assert_array_equal(grad[0, ..., 0], expected_grad.reshape(5, 5))


def test_ties_nan_and_overlapping_windows_by_hand():
  # 1-D (one sample drives the one dim): 6 cells, 4 windows of 3, alpha = 3 / 3 = 1, so
  # windows start at 0, 1, 2, 3 whatever the sample. Ties keep the first maximum; NaN wins,
  # and the last NaN in a window wins. Overlapping windows that pick the same cell add
  # their cotangents there (1 + 2 on cell 1).
  x = np.array([5.0, 7.0, 7.0, np.nan, 1.0, np.nan], np.float32).reshape(1, 6, 1)
  xf = x.copy()
  xf[0, 3, 0] = xf[0, 5, 0] = -1.0  # no NaN: first 7 wins in windows 0 and 1, the 7 at 2 in 2
  samples = np.array([[[0.4]]], np.float32)

  @jax.jit  # both in one program (eager: each op compiled alone)
  def run(x, xf):
    grad = jax.grad(lambda x: jnp.sum(
        fractional_max_pool(x, 3, 4, samples=samples, num_spatial_dims=1)
        * jnp.array([1.0, 2.0, 4.0, 8.0])[None, :, None]))(xf)
    return fractional_max_pool(x, 3, 4, samples=samples, return_indices=True,
                               num_spatial_dims=1), grad

  (values, index), grad = run(x, xf)
  np.testing.assert_array_equal(index[0, :, 0], [1, 3, 3, 5])
  np.testing.assert_array_equal(values[0, :, 0], [7.0, np.nan, np.nan, np.nan])
  # Windows [5, 7, 7], [7, 7, -1], [7, -1, 1], [-1, 1, -1] pick cells 1, 1, 2 and 4.
  np.testing.assert_array_equal(grad[0, :, 0], [0.0, 3.0, 4.0, 0.0, 8.0, 0.0])


# ----------------------------------------------------------------------------
# PyTorch itself, bit for bit; the NumPy mirror.
# ----------------------------------------------------------------------------


def _torch_pool(torch, x, window, out, samples, g):
  """PyTorch on the channels-last ``x``: values, indices and the gradient of sum(values * g)."""
  ndim = x.ndim - 2
  xt = torch.tensor(np.moveaxis(x, -1, 1).copy(), requires_grad=True)
  pool = torch.nn.functional.fractional_max_pool2d if ndim == 2 else (
      torch.nn.functional.fractional_max_pool3d)
  values, index = pool(xt, window, output_size=out, return_indices=True,
                       _random_samples=torch.tensor(samples))
  values.backward(torch.tensor(np.moveaxis(g, -1, 1).copy()))
  return (np.moveaxis(values.detach().numpy(), 1, -1), np.moveaxis(index.numpy(), 1, -1),
          np.moveaxis(xt.grad.numpy(), 1, -1))


@pytest.mark.parametrize(("spatial", "window", "out", "ties"), [
    ((9, 11), (2, 3), (5, 6), True),
    # Windows of 3 at steps of 1 or 2: a local maximum is picked by up to 9 windows.
    ((12, 13), (3, 3), (10, 8), False),
    ((7, 6, 8), (2, 1, 3), (3, 4, 5), True),
])
def test_matches_pytorch_bit_for_bit(spatial, window, out, ties):
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  rng = np.random.default_rng(len(spatial))
  if ties:  # small integers: many ties inside windows; a few NaN
    x = rng.integers(0, 4, (2, *spatial, 3)).astype(np.float32)
    x.flat[rng.choice(x.size, 3, replace=False)] = np.nan
  else:
    x = rng.standard_normal((2, *spatial, 3)).astype(np.float32)
  samples = rng.random((2, 3, len(spatial))).astype(np.float32)
  # Random cotangents: where windows overlap, a cell sums several of them, and the sums
  # agree bit for bit only if they are added in PyTorch's order (output order).
  g = rng.standard_normal((2, *out, 3)).astype(np.float32)
  ours = _value_index_grad(x, window, out, samples, g)
  theirs = _torch_pool(torch, x, window, out, samples, g)
  for got, want, what in zip(ours, theirs, ("values", "indices", "gradient"), strict=True):
    np.testing.assert_array_equal(np.asarray(got), want, err_msg=what)
  mirror = reference.fractional_max_pool(x, window, out, samples)
  np.testing.assert_array_equal(mirror[0], theirs[0])
  np.testing.assert_array_equal(mirror[1], theirs[1])


def test_matches_pytorch_unbatched_and_in_bfloat16():
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  rng = np.random.default_rng(7)
  # Unbatched: PyTorch's (C, H, W) input with (1, C, 2) samples.
  x = rng.standard_normal((13, 10, 4)).astype(np.float32)
  samples = rng.random((1, 4, 2)).astype(np.float32)
  values, index = jax.jit(lambda x: FractionalMaxPool((3, 2), (6, 7), return_indices=True)(
      x, samples=samples))(x)
  want_values, want_index = torch.nn.functional.fractional_max_pool2d(
      torch.tensor(np.moveaxis(x, -1, 0).copy()), (3, 2), output_size=(6, 7),
      return_indices=True, _random_samples=torch.tensor(samples))
  np.testing.assert_array_equal(values, np.moveaxis(want_values.numpy(), 0, -1))
  np.testing.assert_array_equal(index, np.moveaxis(want_index.numpy(), 0, -1))
  # bfloat16: the intervals are computed in bfloat16, every operation rounded as c10's
  # BFloat16 rounds it (float32 arithmetic gives other W starts in 12 of these 16 planes).
  xb = torch.tensor(rng.standard_normal((2, 8, 3, 40)), dtype=torch.bfloat16)
  sb = torch.tensor(rng.random((2, 8, 2)), dtype=torch.bfloat16)
  want_values, want_index = torch.nn.functional.fractional_max_pool2d(
      xb, (2, 2), output_size=(2, 17), return_indices=True, _random_samples=sb)
  # Cast by NumPy (exact: the values are bfloat16's), not compiled conversions.
  x_ours = np.moveaxis(xb.float().numpy(), 1, -1).astype(ml_dtypes.bfloat16)
  values, index = jax.jit(lambda x, s: fractional_max_pool(
      x, 2, (2, 17), samples=s, return_indices=True))(
          x_ours, sb.float().numpy().astype(ml_dtypes.bfloat16))
  assert values.dtype == jnp.bfloat16
  np.testing.assert_array_equal(index, np.moveaxis(want_index.numpy(), 1, -1))
  np.testing.assert_array_equal(values.astype(np.float32),
                                np.moveaxis(want_values.float().numpy(), 1, -1))


def test_one_dim_and_the_three_dim_equality_case_match_the_mirror():
  rng = np.random.default_rng(3)
  x1 = rng.standard_normal((2, 12, 3)).astype(np.float32)
  s1 = rng.random((2, 3, 1)).astype(np.float32)
  # window + out - 1 == length along T: PyTorch 2.13's 3-D check (strict) refuses it, its
  # 2-D check and the interval rule accept it (alpha = 1: windows at 0, 1, 2).
  x3 = rng.standard_normal((1, 4, 5, 6, 2)).astype(np.float32)
  s3 = rng.random((1, 2, 3)).astype(np.float32)
  # Both in one jitted program (eager, each op compiles alone); the samples stay concrete.
  got1, got3 = jax.jit(lambda x1, x3: (
      fractional_max_pool(x1, (3,), 5, samples=s1, return_indices=True),
      fractional_max_pool(x3, 2, (3, 2, 4), samples=s3, return_indices=True)))(x1, x3)
  want = reference.fractional_max_pool(x1, (3,), (5,), s1)
  np.testing.assert_array_equal(got1[0], want[0])
  np.testing.assert_array_equal(got1[1], want[1])
  got = got3
  want = reference.fractional_max_pool(x3, (2, 2, 2), (3, 2, 4), s3)
  np.testing.assert_array_equal(got[1], want[1])


def test_output_ratio_is_pytorchs_truncated_product():
  # int(100 * 0.29) = int(28.999999999999996) = 28, not 29; int(10 * 0.5) = 5.
  # The shape only: traced (jax.eval_shape), nothing compiled.
  x = jax.ShapeDtypeStruct((1, 100, 10, 1), jnp.float32)
  y = jax.eval_shape(lambda x: fractional_max_pool(
      x, 2, output_ratio=(0.29, 0.5), samples=np.full((1, 1, 2), 0.5)), x)
  assert y.shape == (1, 28, 5, 1)


def test_half_precision_starts_past_the_end_are_clamped():
  # In bfloat16 over 1000 cells the starts round past L - k = 998 (the mirror, like
  # PyTorch's assert, refuses them); here they are clamped to the last window.
  with pytest.raises(ValueError, match="PyTorch asserts"):
    reference.fractional_intervals(ml_dtypes.bfloat16(0.0), 1000, 333, 2)
  starts = np.asarray(jax.jit(lambda u: interval_starts(u, 1000, 333, 2))(
      np.zeros((1,), ml_dtypes.bfloat16)))
  assert starts.min() >= 0 and starts.max() == 998 and starts[0, -2] == 998


# ----------------------------------------------------------------------------
# Random samples from rngs or a key; batching, jit, vmap, jvp, dtypes.
# ----------------------------------------------------------------------------


def test_rngs_draw_from_the_dropout_stream():
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 9, 9, 3)), jnp.float32)
  pool = FractionalMaxPool(2, 4)
  # The samples are jax.random.uniform((N, C, 2)) with the stream's next key.
  key = nnx.Rngs(dropout=5).dropout()
  want = pool(x, samples=jax.random.uniform(key, (2, 3, 2)))
  np.testing.assert_array_equal(pool(x, rngs=nnx.Rngs(dropout=5)), want)
  np.testing.assert_array_equal(pool(x, rngs=nnx.Rngs(dropout=5).dropout), want)  # a stream
  np.testing.assert_array_equal(pool(x, rngs=key), want)  # a key
  np.testing.assert_array_equal(fractional_max_pool(x, 2, 4, key=key), want)
  # nnx.Rngs(5) has no dropout stream: NNX falls back to its default one.
  np.testing.assert_array_equal(pool(x, rngs=nnx.Rngs(5)), fractional_max_pool(
      x, 2, 4, key=nnx.Rngs(5).default()))
  # The stream advances: the next call draws new samples, also under nnx.jit.
  rngs = nnx.Rngs(dropout=5)
  apply = nnx.jit(lambda pool, x, rngs: pool(x, rngs=rngs))
  np.testing.assert_array_equal(apply(pool, x, rngs), want)
  assert not np.array_equal(apply(pool, x, rngs), want)


def test_batch_axes_vmap_jvp_and_bfloat16():
  rng = np.random.default_rng(4)
  x = rng.standard_normal((2, 3, 8, 7, 4)).astype(np.float32)  # (B1, B2, H, W, C)
  samples = rng.random((2, 3, 4, 2)).astype(np.float32)
  pool = FractionalMaxPool((2, 3), output_ratio=0.6, return_indices=True)
  t = rng.standard_normal(x[0].shape).astype(np.float32)
  xi = rng.integers(-8, 8, x[0].shape).astype(np.float32)

  # Every call in one program (eager: each layout step and op compiled alone). The samples
  # are traced, so their range check is skipped; they are the same drawn values in [0, 1).
  @jax.jit
  def run(x, samples, t, xi):
    return (pool(x.reshape(6, 8, 7, 4), samples=samples.reshape(6, 4, 2)),
            pool(x, samples=samples),
            # vmap over examples, each unbatched with its (C, 2) samples.
            jax.vmap(lambda x, s: pool(x, samples=s))(x[0], samples[0]),
            jax.jvp(lambda v: pool(v, samples=samples[0])[0], (x[0],), (t,))[1],
            pool(xi.astype(jnp.bfloat16), samples=samples[0].astype(jnp.bfloat16)))

  # NumPy out: indexing and reshaping jax.Arrays compile a program each.
  flat, several, mapped, tangent, got = jax.device_get(run(x, samples, t, xi))
  for a, b in zip(several, flat, strict=True):
    np.testing.assert_array_equal(a, b.reshape(2, 3, *b.shape[1:]))
  np.testing.assert_array_equal(mapped[0], several[0][0])
  # Forward mode: the tangent of each output is the tangent of its indexed cell.
  index = np.asarray(several[1][0]).reshape(3, -1, 4)
  want = np.take_along_axis(t.reshape(3, -1, 4), index, axis=1).reshape(tangent.shape)
  np.testing.assert_array_equal(tangent, want)
  # bfloat16 stays bfloat16 and picks the cells float32 picks where the values are exact.
  assert got[0].dtype == jnp.bfloat16
  want = reference.fractional_max_pool(
      xi, (2, 3), (4, 4), samples[0].astype(ml_dtypes.bfloat16))
  np.testing.assert_array_equal(got[1], want[1])


def test_nchw_guard():
  with pytest.raises(ValueError, match=re.escape("use jnp.moveaxis(x, 1, -1)")):
    FractionalMaxPool(2, 4, in_features=3)(np.zeros((2, 3, 16, 16), np.float32),
                                           samples=np.zeros((2, 16, 2)))
  with pytest.warns(ChannelsFirstWarning):  # at trace time: traced alone, nothing compiled
    jax.eval_shape(lambda x: FractionalMaxPool(2, (2, 4))(x, samples=np.zeros((2, 16, 2))),
                   jax.ShapeDtypeStruct((2, 3, 16, 16), jnp.float32))


# ----------------------------------------------------------------------------
# Refusals.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(("build", "error", "message"), [
    (lambda: FractionalMaxPool(2), TypeError,
     "`output_size` and `output_ratio` are alternatives: pass exactly one (as PyTorch's "
     "FractionalMaxPool2d); got neither. Pass output_size=(out_h, out_w) or "
     "output_ratio=0.5."),
    (lambda: FractionalMaxPool(2, 3, output_ratio=0.5), TypeError,
     "`output_size` and `output_ratio` are alternatives: pass exactly one (as PyTorch's "
     "FractionalMaxPool2d); got both, output_size=3 and output_ratio=0.5. Drop one of them."),
    (lambda: FractionalMaxPool(2, output_ratio=1.0), ValueError,
     "`output_ratio` must be a number or a tuple of numbers, one per spatial dim, each "
     "strictly between 0 and 1 (PyTorch's range); got 1.0. For an output as large as the "
     "input, pool with output_size instead."),
    (lambda: FractionalMaxPool(2, output_ratio=(0.5, "a")), TypeError,
     "`output_ratio` must be a number or a tuple of numbers, one per spatial dim, each "
     "strictly between 0 and 1; got (0.5, 'a')."),
    (lambda: FractionalMaxPool((2, 2), (3, 3, 3)), ValueError,
     "`output_size` (3, 3, 3) has 3 entries, but `window_shape` (2, 2) sets 2 spatial dim(s)"),
    (lambda: FractionalMaxPool(2, 3, kernel_size=2), TypeError,
     "FractionalMaxPool takes `window_shape` (Flax's name), not `kernel_size` (PyTorch's)"),
])
def test_constructor_refusals(build, error, message):
  with pytest.raises(error, match=re.escape(message)):
    build()


_X = np.zeros((2, 6, 6, 3), np.float32)
_S = np.zeros((2, 3, 2), np.float32)
_S_FIVE = _S.copy()
_S_FIVE[1, 2, 0] = 5.0


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: FractionalMaxPool(3, 5)(_X, samples=_S), ValueError,
     "FractionalMaxPool: window 3 with 5 outputs does not fit spatial dim 0 of length 6: "
     "PyTorch needs window + out - 1 <= length, here 7. Use a smaller window_shape or fewer "
     "outputs (output_size, output_ratio)."),
    (lambda: FractionalMaxPool(2, output_ratio=0.1)(_X, samples=_S), ValueError,
     "FractionalMaxPool: output_ratio 0.1 of spatial dim 0 of length 6 gives int(6 * 0.1) = 0 "
     "outputs; use a larger ratio or output_size."),
    (lambda: FractionalMaxPool(2, 3)(_X), TypeError,
     "FractionalMaxPool needs random samples, and there is no hidden global random state: "
     "pass samples=<array of shape (2, 3, 2) in [0, 1)> (PyTorch's _random_samples) or "
     "rngs=nnx.Rngs(dropout=0) (its 'dropout' stream, or 'default')."),
    (lambda: fractional_max_pool(_X, 2, 3), TypeError,
     "fractional_max_pool needs random samples, and there is no hidden global random state: "
     "pass samples=<array of shape (2, 3, 2) in [0, 1)> (PyTorch's _random_samples) or "
     "key=jax.random.key(0)."),
    (lambda: FractionalMaxPool(2, 3)(_X, samples=_S, rngs=nnx.Rngs(0)), TypeError,
     "FractionalMaxPool: pass `samples` or `rngs`, not both."),
    (lambda: fractional_max_pool(_X, 2, 3, samples=_S, key=jax.random.key(0)), TypeError,
     "fractional_max_pool: pass `samples` or `key`, not both."),
    (lambda: FractionalMaxPool(2, 3)(_X, samples=_S[:, :, :1]), ValueError,
     "FractionalMaxPool: `samples` must have shape (2, 3, 2) (the input's batch axes, its 3 "
     "channels, one sample per spatial dim); got (2, 3, 1)."),
    (lambda: FractionalMaxPool(2, 3)(_X[0], samples=_S[:1, :, :1]), ValueError,
     "`samples` must have shape (3, 2) or (1, 3, 2)"),
    (lambda: FractionalMaxPool(2, 3)(_X, samples=np.zeros((2, 3, 2), np.int32)), TypeError,
     "FractionalMaxPool: `samples` must be floating (PyTorch's torch.rand draws, in [0, 1)); "
     "got dtype int32."),
    (lambda: FractionalMaxPool(2, 3)(_X, rngs=nnx.Rngs(params=0)), ValueError,
     "FractionalMaxPool: `rngs` has no 'dropout' stream and no 'default' one to fall back "
     "on; build it as nnx.Rngs(dropout=0) or nnx.Rngs(0), or pass the stream to use, e.g. "
     "rngs=rngs.params."),
    (lambda: FractionalMaxPool(2, 3)(_X, rngs=0), TypeError,
     "FractionalMaxPool: `rngs` must be an nnx.Rngs, an nnx.RngStream or a JAX key; got int."),
    (lambda: fractional_max_pool(_X, 2, 3, key=0), TypeError,
     "fractional_max_pool: `key` must be a JAX key such as jax.random.key(0); got int."),
    (lambda: FractionalMaxPool(2, 3)(_X.astype(np.int32), samples=_S), TypeError,
     "FractionalMaxPool: `inputs` has dtype int32, but this pooling needs a floating dtype"),
    # Issue 30: samples outside [0, 1) were used as given; PyTorch's _random_samples, passed
    # to the call, got Python's bare unexpected-keyword error.
    (lambda: FractionalMaxPool(2, 3)(_X, samples=np.full((2, 3, 2), np.nan, np.float32)),
     ValueError,
     "FractionalMaxPool: `samples` must lie in [0, 1), where PyTorch's torch.rand draws them; "
     "got 12 outside it, the first nan. Draw them with jax.random.uniform, or pass rngs (key) "
     "instead."),
    (lambda: FractionalMaxPool(2, 3)(_X, samples=_S_FIVE), ValueError,
     "got 1 outside it, the first 5.0."),
    (lambda: fractional_max_pool(_X, 2, 3, samples=_S - 1.0), ValueError,
     "fractional_max_pool: `samples` must lie in [0, 1), where PyTorch's torch.rand draws "
     "them; got 12 outside it, the first -1.0."),
    (lambda: FractionalMaxPool(2, 3)(_X, _random_samples=_S), TypeError,
     "FractionalMaxPool's call takes `samples` (nnx-pool's name), not `_random_samples` "
     "(PyTorch's): write samples=... instead."),
    (lambda: FractionalMaxPool(2, 3)(_X, key=jax.random.key(0)), TypeError,
     "FractionalMaxPool's call got an unexpected keyword argument `key`; FractionalMaxPool's "
     "call takes (inputs, *, samples, rngs)."),
])
def test_call_refusals(call, error, message):
  with pytest.raises(error, match=re.escape(message)):
    call()


def test_traced_samples_are_not_checked_and_go_into_pytorchs_rule():
  # Under jit the samples are tracers (documented): 5.0 is used as given. Expected: the
  # NumPy mirror of PyTorch's interval rule with the same sample, starts clamped to fit.
  x = np.arange(36.0, dtype=np.float32).reshape(1, 6, 6, 1)
  samples = np.array([[[0.25, 5.0]]], np.float32)
  got = jax.jit(lambda s: fractional_max_pool(x, 2, 3, samples=s))(samples)
  np.testing.assert_array_equal(got, reference.fractional_max_pool(x, (2, 2), (3, 3), samples)[0])
