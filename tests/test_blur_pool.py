"""Tests for anti-aliased downsampling, BlurPool (nnx_pool._blur), timm's BlurPool2d.

Each expectation says where it comes from: a hand computation written out beside it,
the NumPy mirror (``nnx_pool.reference.blur_pool``, float64 loops over the padded
window), or PyTorch 2.13 CPU running timm 1.0.31 ``timm/layers/blur_pool.py``
``BlurPool2d.forward`` re-stated below (timm itself imports torchvision, which has no
CPU build for torch 2.13 here), with ``get_padding`` from ``timm/layers/padding.py``.
The PyTorch tests skip cleanly when torch is absent.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_pool import ChannelsFirstWarning, reference
from nnx_pool._blur import BlurPool, binomial_filter, blur_pool

_TORCH_REASON = "PyTorch parity needs torch==2.13.0 (the parity extra)"


def _zeros(shape, dtype=np.float32):
  """``jnp.zeros(shape, dtype)`` put on the device from NumPy: jnp.zeros compiles a program
  for each new shape, only to build the input that a refusal or the layout guard reads."""
  return jax.device_put(np.zeros(shape, dtype))


def _timm_blur(torch, x, filt_size, stride, pad_mode):
  """timm 1.0.31 BlurPool2d(channels=None, filt_size, stride, pad_mode).forward, N-D.

  ``_init_buffers``: coeffs = [comb(filt_size - 1, k)] / 2 ** (filt_size - 1) in float32,
  the filter their outer product, expanded over the channels; ``forward``:
  ``F.pad(x, [get_padding(filt_size, stride)] * 2 * ndim, mode=pad_mode)`` then
  ``F.conv2d(x, weight, stride=stride, groups=channels)``. timm has 2-D only; 1-D and 3-D
  use conv1d and conv3d with the same filter per dim.
  """
  F = torch.nn.functional
  ndim = x.dim() - 2
  coeffs = torch.tensor([math.comb(filt_size - 1, k) for k in range(filt_size)],
                        dtype=torch.float32) / (2 ** (filt_size - 1))
  blur = coeffs
  for _ in range(ndim - 1):
    blur = blur[..., None] * coeffs
  channels = x.shape[1]
  weight = blur[None, None].expand(channels, 1, *blur.shape).to(x.dtype)
  padding = ((stride - 1) + (filt_size - 1)) // 2  # get_padding(filt_size, stride)
  x = F.pad(x, [padding] * (2 * ndim), mode=pad_mode)
  conv = (F.conv1d, F.conv2d, F.conv3d)[ndim - 1]
  return conv(x, weight, stride=stride, groups=channels)


# ----------------------------------------------------------------------------
# By hand.
# ----------------------------------------------------------------------------


def test_blur_of_an_impulse_is_the_binomial_filter():
  # C(n-1, k) / 2^(n-1): [1, 2, 1] / 4 and [1, 4, 6, 4, 1] / 16, outer products in 2-D. At
  # stride 1 with zero padding (get_padding(3, 1) = 1, (5, 1) = 2) the output keeps the
  # size, and an impulse of 16 (256) gives the filter scaled to integers.
  x = np.zeros((1, 5, 5, 1), np.float32)
  x[0, 2, 2, 0] = 1.0
  # Both filters in one jitted program (eager, each op compiles alone).
  blur3, blur5 = jax.jit(lambda x: (blur_pool(16 * x, 3, 1, pad_mode="constant"),
                                    blur_pool(256 * x, 5, 1, pad_mode="constant")))(x)
  np.testing.assert_array_equal(blur3[0, ..., 0], [
      [0, 0, 0, 0, 0],
      [0, 1, 2, 1, 0],
      [0, 2, 4, 2, 0],
      [0, 1, 2, 1, 0],
      [0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(blur5[0, ..., 0], [
      [1, 4, 6, 4, 1],
      [4, 16, 24, 16, 4],
      [6, 24, 36, 24, 6],
      [4, 16, 24, 16, 4],
      [1, 4, 6, 4, 1]])
  assert reference.binomial_filter(5).tolist() == [1 / 16, 4 / 16, 6 / 16, 4 / 16, 1 / 16]


def test_long_filters_are_the_exact_binomials_rounded_to_float32():
  # Issue 30: float32 binomials overflowed, 129 taps gave all zeros and 200 NaN. An impulse
  # of 1 in the middle of k cells, at stride 1 with zero padding ((k - 1) // 2 a side),
  # blurs to the filter: output q is c[k - 1 - q] = c[q] (k - 1 outputs for an even k).
  # Expected: the closed form C(k-1, j) / 2^(k-1), exact in Python integers, rounded to
  # float64 and then float32 (hand computation, no float32 arithmetic on the way).
  impulses = []
  for k in (129, 200):
    x = np.zeros((1, k, 1), np.float32)
    x[0, k // 2, 0] = 1.0
    impulses.append(x)
  # Both lengths in one jitted program (eager, each of the k taps' ops compiles alone).
  blurred = jax.jit(lambda xs: [blur_pool(x, x.shape[1], 1, pad_mode="constant",
                                          num_spatial_dims=1) for x in xs])(impulses)
  for k, y in zip((129, 200), blurred, strict=True):
    got = np.asarray(y)[0, :, 0]
    want = np.array([math.comb(k - 1, j) / 2 ** (k - 1) for j in range(k)]).astype(np.float32)
    assert np.array_equal(np.array(binomial_filter(k), np.float32), want)
    # XLA:CPU flushes float32 subnormals (below 2**-126, the outermost taps) to zero.
    flushed = np.where(want < np.finfo(np.float32).tiny, np.float32(0), want)
    np.testing.assert_array_equal(got, flushed[:len(got)])
    assert len(got) == k - 1 + k % 2 and want.max() > 0.05


def test_binomial_filter_is_timms_for_every_size_timm_builds():
  # timm 1.0.31 BlurPool2d._init_buffers, run in PyTorch 2.13: a float32 tensor of the
  # binomials divided by 2 ** (filt_size - 1). From 65 taps torch.tensor overflows int64.
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  for k in range(2, 65):
    timm = (torch.tensor([math.comb(k - 1, j) for j in range(k)], dtype=torch.float32)
            / (2 ** (k - 1))).numpy()
    assert np.array_equal(np.array(binomial_filter(k), np.float32), timm), k


@pytest.fixture(scope="module")
def pad_modes_blurred():
  """[1, 2, 3, 4] blurred by [1, 2, 1] / 4 at stride 1 in each pad mode, in one program."""
  x = np.array([1.0, 2.0, 3.0, 4.0], np.float32).reshape(1, 4, 1)
  modes = ("reflect", "replicate", "circular", "constant")
  outs = jax.jit(lambda x: [BlurPool(3, 1, pad_mode=m, num_spatial_dims=1)(x) for m in modes])(x)
  return x, dict(zip(modes, outs, strict=True))


@pytest.mark.parametrize(("pad_mode", "expected"), [
    # x = [1, 2, 3, 4], filter [1, 2, 1] / 4, stride 1, one cell of padding each side:
    ("reflect", [1.5, 2.0, 3.0, 3.5]),  # [2 | 1 2 3 4 | 3]: (2+2+2)/4, (1+4+3)/4, ...
    ("replicate", [1.25, 2.0, 3.0, 3.75]),  # [1 | 1 2 3 4 | 4]: (1+2+2)/4, ..., (3+8+4)/4
    ("circular", [2.0, 2.0, 3.0, 3.0]),  # [4 | 1 2 3 4 | 1]: (4+2+2)/4, ..., (3+8+1)/4
    ("constant", [1.0, 2.0, 3.0, 2.75]),  # [0 | 1 2 3 4 | 0]: (0+2+2)/4, ..., (3+8+0)/4
])
def test_pad_modes_by_hand(pad_modes_blurred, pad_mode, expected):
  x, blurred = pad_modes_blurred
  np.testing.assert_array_equal(blurred[pad_mode][0, :, 0], expected)
  np.testing.assert_array_equal(reference.blur_pool(x, (3,), (1,), pad_mode)[0, :, 0], expected)


def test_default_is_reflect_stride_2_and_output_sizes_follow_timm():
  # 4x4 arange, [1, 2, 1] / 4, reflect pad 1, stride 2. Rows: out 0 = (x1 + 2 x0 + x1) / 4 =
  # (x0 + x1) / 2 = [2, 3, 4, 5]; out 1 = (x1 + 2 x2 + x3) / 4 = [8, 9, 10, 11]. Columns
  # the same: [[2.5, 4], [8.5, 10]].
  x = np.arange(16.0, dtype=np.float32).reshape(1, 4, 4, 1)
  np.testing.assert_array_equal(BlurPool()(x)[0, ..., 0], [[2.5, 4.0], [8.5, 10.0]])
  # get_padding(k, s) on both sides: L = 6 gives 3 (k=3, s=2), 4 (k=4, s=2: pad 2,
  # (6 + 4 - 4) // 2 + 1), 5 (k=4, s=1: pad 1) and 3 (k=5, s=3: pad 3, (6 + 6 - 5) // 3 + 1).
  # Shapes only: traced (jax.eval_shape), nothing compiled.
  x6 = jax.ShapeDtypeStruct((1, 6, 6, 1), jnp.float32)
  for k, s, out in [(3, 2, 3), (4, 2, 4), (4, 1, 5), (5, 3, 3)]:
    assert jax.eval_shape(BlurPool(k, s), x6).shape == (1, out, out, 1), (k, s)


# ----------------------------------------------------------------------------
# PyTorch (timm's forward) and the NumPy mirror.
# ----------------------------------------------------------------------------


_CASES = [  # (filter_size, strides, pad_mode, spatial)
    (3, 2, "reflect", (9, 10)),
    (5, 2, "constant", (9, 10)),
    (4, 2, "replicate", (9, 10)),
    (2, 3, "circular", (9, 10)),
    (3, 1, "reflect", (7,)),
    (3, 2, "circular", (5, 4, 6)),
]


@pytest.mark.parametrize(("filter_size", "strides", "pad_mode", "spatial"), _CASES)
def test_matches_timm_and_the_mirror_values_and_gradients(filter_size, strides, pad_mode,
                                                           spatial):
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  rng = np.random.default_rng(len(spatial) + filter_size)
  x = rng.standard_normal((2, *spatial, 3)).astype(np.float32)
  ndim = len(spatial)

  @jax.jit
  def run(x, g):
    y, vjp = jax.vjp(lambda x: blur_pool(x, filter_size, strides, pad_mode=pad_mode,
                                         num_spatial_dims=ndim), x)
    return y, vjp(g)[0]

  xt = torch.tensor(np.moveaxis(x, -1, 1).copy(), requires_grad=True)
  yt = _timm_blur(torch, xt, filter_size, strides, pad_mode)
  want = np.moveaxis(yt.detach().numpy(), 1, -1)
  g = rng.standard_normal(want.shape).astype(np.float32)
  yt.backward(torch.tensor(np.moveaxis(g, -1, 1).copy()))
  y, grad = run(x, g)
  # A separable pass sums in another order than PyTorch's convolution: a few ULPs.
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grad, np.moveaxis(xt.grad.numpy(), 1, -1), rtol=1e-5, atol=1e-6)
  mirror = reference.blur_pool(x, (filter_size,) * ndim, (strides,) * ndim, pad_mode)
  np.testing.assert_allclose(mirror, want, rtol=1e-5, atol=1e-6)


def test_a_long_filter_pads_once_and_its_gradient_is_the_transpose():
  # 9 x 9 = 81 taps, past the views' 64: one padded copy and one strided pass per dim
  # (strided_sum), whose reverse mode is the one-dim adjoint without padding. Values
  # against the mirror; the gradient of <blur(x), g> is the transpose of the blur,
  # <mirror blur(t), g> = <t, grad>, in float64 on the mirror's side.
  rng = np.random.default_rng(9)
  x, t = (rng.standard_normal((1, 12, 11, 2)).astype(np.float32) for _ in range(2))
  pool = BlurPool(9, (2, 3), pad_mode="replicate")
  # The output's shape traced only (an eager call compiled the blur for it).
  g = rng.standard_normal(jax.eval_shape(pool, x).shape).astype(np.float32)
  (_, y), grad = jax.device_get(jax.jit(lambda x: jax.value_and_grad(
      lambda v: (jnp.sum(pool(v) * g), pool(v)), has_aux=True)(x))(x))  # NumPy out
  want = reference.blur_pool(x.astype(np.float64), (9, 9), (2, 3), "replicate")
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
  blurred_t = reference.blur_pool(t.astype(np.float64), (9, 9), (2, 3), "replicate")
  assert float(np.sum(t * grad)) == pytest.approx(float(np.sum(blurred_t * g)), rel=1e-5)


# ----------------------------------------------------------------------------
# jit, vmap, forward mode, batch axes, dtypes, layout.
# ----------------------------------------------------------------------------


def test_batch_axes_vmap_and_forward_mode():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 3, 7, 6, 4)).astype(np.float32)  # (B1, B2, H, W, C)
  pool = BlurPool(3, 2)
  t = rng.standard_normal(x[0].shape).astype(np.float32)
  g = rng.standard_normal((3, 4, 3, 4)).astype(np.float32)  # the output of one example

  @jax.jit  # every call in one program (eager: each layout step and op compiled alone)
  def run(x, t, g):
    tangent = jax.jvp(pool, (x[0],), (t,))[1]
    grad = jax.grad(lambda v: jnp.sum(pool(v) * g))(x[0])
    return pool(x), pool(x.reshape(6, 7, 6, 4)), jax.vmap(pool)(x[0]), tangent, pool(t), grad

  # NumPy out: indexing and arithmetic on jax.Arrays compile a program each.
  several, flat, mapped, tangent, blurred_t, grad = jax.device_get(run(x, t, g))
  np.testing.assert_array_equal(several, flat.reshape(2, 3, 4, 3, 4))
  np.testing.assert_array_equal(mapped, several[0])  # unbatched under vmap
  # The blur is linear: the forward-mode tangent is the blur of the tangent, and the
  # reverse-mode gradient of <blur(x), g> is its transpose: <blur(t), g> = <t, grad>.
  np.testing.assert_allclose(tangent, blurred_t, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.sum(blurred_t * g), np.sum(t * grad), rtol=1e-5)


@pytest.fixture(scope="module")
def half_blurred():
  """BlurPool(5, 2) of each half input and of its float32 copy, all in one jitted program."""
  x = np.random.default_rng(1).standard_normal((2, 8, 8, 3))
  # Cast by NumPy (as jnp.asarray(x, name) would, through float32): no conversion compiled.
  halves = {name: x.astype(np.float32).astype(jnp.dtype(name)) for name in ("bfloat16",
                                                                             "float16")}
  pool = BlurPool(5, 2)
  return jax.jit(lambda hs: {d: (pool(h), pool(h.astype(jnp.float32))) for d, h in hs.items()})(
      halves)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_inputs_are_blurred_in_float32_and_rounded_once(half_blurred, dtype):
  got, wide = half_blurred[jnp.dtype(dtype).name]
  assert got.dtype == dtype
  np.testing.assert_array_equal(got, wide.astype(dtype))


def test_nchw_guard():
  with pytest.raises(ValueError, match=re.escape("use jnp.moveaxis(x, 1, -1)")):
    BlurPool(in_features=3)(_zeros((2, 3, 16, 16)))
  with pytest.warns(ChannelsFirstWarning):  # at trace time: traced alone, nothing compiled
    jax.eval_shape(BlurPool(), jax.ShapeDtypeStruct((2, 3, 16, 16), jnp.float32))


# ----------------------------------------------------------------------------
# Refusals.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: BlurPool(1), ValueError,
     "`filter_size` must be at least 2 in every dim (a filter of 1 tap does not blur; timm "
     "asserts filt_size > 1); got 1. For a plain strided subsample use x[:, ::2, ::2] or "
     "MaxPool(1, 2)."),
    (lambda: BlurPool((3, 0)), ValueError,  # the same answer below 1, not ">= 1"
     "`filter_size` must be at least 2 in every dim (a filter of 1 tap does not blur; timm "
     "asserts filt_size > 1); got (3, 0)."),
    (lambda: BlurPool(pad_mode="zeros"), ValueError,
     "`pad_mode` must be one of 'reflect', 'constant', 'replicate', 'circular' (F.pad's "
     "modes); got 'zeros'."),
    (lambda: BlurPool(pad_mode=None), TypeError,  # a wrong type, as elsewhere (issue 30)
     "`pad_mode` must be one of 'reflect', 'constant', 'replicate', 'circular' (F.pad's "
     "modes); got None."),
    (lambda: BlurPool((3, 1025)), ValueError,
     "`filter_size` must be at most 1024 in every dim (the kernel takes one slice per tap, "
     "so its program grows with the filter); got (3, 1025)."),
    (lambda: BlurPool(3.0), TypeError, "`filter_size` must be an int or a tuple of ints; got 3.0."),
    (lambda: BlurPool((3, 3), (2, 2, 2)), ValueError,
     "`strides` (2, 2, 2) has 3 entries, but `filter_size` (3, 3) sets 2 spatial dim(s)"),
    (lambda: BlurPool(stride=2), TypeError,
     "BlurPool takes `strides` (Flax's name), not `stride` (PyTorch's): write strides=... "
     "instead."),
    (lambda: BlurPool(channels=8), TypeError,
     "BlurPool takes `in_features` (Flax's name), not `channels` (timm's)"),
    (lambda: BlurPool(5, 2)(_zeros((1, 2, 8, 1))), ValueError,
     "BlurPool: reflect padding must be shorter than the dim it pads (PyTorch's F.pad rule: "
     "it mirrors the dim without its edge); spatial dim 0 has length 2 and padding (2, 2). "
     "Use an input at least 3 long there, or less padding."),
    (lambda: blur_pool(_zeros((1, 8, 2, 1)), 5, 3, pad_mode="circular"), ValueError,
     "blur_pool: circular padding must be at most the length of the dim it pads (PyTorch's "
     "F.pad rule: it would wrap around more than once); spatial dim 1 has length 2 and "
     "padding (3, 3). Use an input at least 3 long there, or less padding."),
    (lambda: blur_pool(_zeros((1, 1, 8, 1)), 4, 1, pad_mode="constant"), ValueError,
     "blur_pool: filter_size 4 does not fit spatial dim 0 of length 1 padded by (1, 1) "
     "(timm's get_padding); use an input at least 2 long there, or a smaller filter."),
    (lambda: BlurPool()(_zeros((1, 8, 8, 1), jnp.int32)), TypeError,
     "BlurPool: `inputs` has dtype int32, but this pooling needs a floating dtype"),
    (lambda: BlurPool()(_zeros((1, 0, 8, 1))), ValueError,
     "BlurPool: `inputs` needs non-empty spatial dims"),
    # Issue 30: XLA aborted the interpreter on these ("overflow in static extent product",
    # exit 134); timm's padding is (10**9 - 1 + 2) // 2 = 500000000 a side.
    (lambda: BlurPool(3, strides=10**9, pad_mode="constant")(_zeros((2, 8, 8, 16))),
     ValueError,
     "BlurPool: the input of shape (2, 8, 8, 16) padded to (2, 1000000008, 1000000008, 16) "
     "would be an array of 32000000512000002048 elements, more than the 2**60 that XLA can "
     "size (an int64 count of bytes, up to 8 an element); XLA would abort the interpreter. "
     "timm's padding grows with the stride, ((strides - 1) + (filter_size - 1)) // 2 a side, "
     "here (500000000, 500000000): use smaller `strides`."),
    (lambda: blur_pool(_zeros((8, 16)), 3, 10**18, pad_mode="replicate",
                       num_spatial_dims=1), ValueError,
     "blur_pool: the input of shape (1, 8, 16) padded to (1, 1000000000000000008, 16)"),
])
def test_refusals(call, error, message):
  with pytest.raises(error, match=re.escape(message)):
    call()
