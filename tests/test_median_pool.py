"""Tests for median pooling, MedianPool (nnx_pool._median), timm's MedianPool2d.

Each expectation says where it comes from: a hand computation written out beside it,
the NumPy mirror (``nnx_pool.reference.median_pool``: a stable sort of each window,
independent of the rank counting here), or PyTorch 2.13 CPU running timm 1.0.31
``timm/layers/median_pool.py`` ``MedianPool2d.forward`` re-stated below (timm itself
imports torchvision, which has no CPU build for torch 2.13 here). The PyTorch tests
skip cleanly when torch is absent.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from nnx_pool import ChannelsFirstWarning, reference
from nnx_pool._median import MedianPool, median_pool

_TORCH_REASON = "PyTorch parity needs torch==2.13.0 (the parity extra)"


def _zeros(shape, dtype=np.float32):
  """``jnp.zeros(shape, dtype)`` put on the device from NumPy: jnp.zeros compiles a program
  for each new shape, only to build the input that a refusal or the layout guard reads."""
  return jax.device_put(np.zeros(shape, dtype))


def _timm_median(torch, x, kernel_size, stride, padding, same):
  """timm 1.0.31 MedianPool2d(kernel_size, stride, padding, same).forward, verbatim but for
  the tuples (``to_2tuple``, ``to_4tuple``) written out by the caller."""
  F = torch.nn.functional
  k, s = kernel_size, stride
  if same:  # MedianPool2d._padding
    ih, iw = x.size()[2:]
    ph = max(k[0] - s[0], 0) if ih % s[0] == 0 else max(k[0] - (ih % s[0]), 0)
    pw = max(k[1] - s[1], 0) if iw % s[1] == 0 else max(k[1] - (iw % s[1]), 0)
    padding = (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2)
  x = F.pad(x, padding, mode="reflect")
  x = x.unfold(2, k[0], s[0]).unfold(3, k[1], s[1])
  return x.contiguous().view(x.size()[:4] + (-1,)).median(dim=-1)[0]


def _one_hot_grad(pool, x):
  return jax.grad(lambda x: jnp.sum(pool(x)))(x)


# ----------------------------------------------------------------------------
# By hand: the lower median, ties, NaN and where the gradient goes.
# ----------------------------------------------------------------------------


def test_lower_median_by_hand():
  # A permutation of 1..9: the median is 5.
  x = np.array([[1.0, 9.0, 2.0], [8.0, 3.0, 7.0], [4.0, 6.0, 5.0]], np.float32)[None, ..., None]
  # An even count takes the lower of the two middle values: pairs of [3, 1, 4, 1, 5, 9].
  x1 = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0], np.float32).reshape(1, 6, 1)
  # 2x2 windows of 4 cells at stride 2: the second smallest.
  x2 = np.array([[4.0, 1.0, 0.0, 9.0], [3.0, 2.0, 7.0, 8.0]], np.float32)[None, ..., None]
  # All three in one jitted program (eager, each op compiles alone).
  y, y1, y2 = jax.jit(lambda x, x1, x2: (
      MedianPool(3)(x), median_pool(x1, 2, num_spatial_dims=1), MedianPool(2, 2)(x2)))(x, x1, x2)
  np.testing.assert_array_equal(y[0, ..., 0], [[5.0]])
  np.testing.assert_array_equal(y1[0, :, 0], [1.0, 1.0, 1.0, 1.0, 5.0])
  np.testing.assert_array_equal(y2[0, ..., 0], [[2.0, 7.0]])


def test_same_padding_reflects_by_hand():
  # same=True, 3x3 at stride 1: TF SAME pads 1 on each side, by reflection, so the 3x3
  # map becomes rows (r1, r0, r1, r2, r1), each row (c1, c0, c1, c2, c1):
  #   3 8 3 7 3 / 9 1 9 2 9 / 3 8 3 7 3 / 6 4 6 5 6 / 3 8 3 7 3
  # Each output is the median of its 3x3 block of that, e.g. (2, 0): 3 8 3 6 4 6 3 8 3 ->
  # sorted 3 3 3 3 4 6 6 8 8, median 4.
  x = np.array([[1.0, 9.0, 2.0], [8.0, 3.0, 7.0], [4.0, 6.0, 5.0]], np.float32)[None, ..., None]
  expected = [[3.0, 7.0, 3.0], [6.0, 5.0, 6.0], [4.0, 6.0, 5.0]]
  np.testing.assert_array_equal(jax.jit(MedianPool(3, same=True))(x)[0, ..., 0], expected)
  np.testing.assert_array_equal(reference.median_pool(x, (3, 3), (1, 1), "SAME")[0][0, ..., 0],
                                expected)
  # SAME at stride 2 on 5 cells: ceil(5 / 2) = 3 outputs, total padding (3-1)*2 + 3 - 5 = 2.
  # The shape only: traced (jax.eval_shape), nothing compiled.
  x5 = jax.ShapeDtypeStruct((1, 5, 5, 1), jnp.float32)
  assert jax.eval_shape(MedianPool(3, 2, same=True), x5).shape == (1, 3, 3, 1)


def test_ties_nan_and_signed_zero_choose_pytorchs_cell():
  # Ties rank in window order, and the median is the cell of rank (n - 1) // 2 in a stable
  # sort, PyTorch's nth_element on (value, position): [3, 1, 3, 3, 0, 3, 2, 3, 5] sorts to
  # 0 1 2 3(0) 3(2) 3(3) 3(5) 3(7) 5, rank 4 is the 3 at position 2 (PyTorch 2.13's
  # median index is 2). The gradient goes to that one cell.
  x = np.array([3.0, 1.0, 3.0, 3.0, 0.0, 3.0, 2.0, 3.0, 5.0], np.float32).reshape(1, 3, 3, 1)
  xn = np.array([1.0, np.nan, 2.0, np.nan], np.float32).reshape(1, 4, 1)
  xz = np.array([0.0, -0.0, 0.0], np.float32).reshape(1, 3, 1)
  pool, pool1 = MedianPool(3), MedianPool(4, num_spatial_dims=1)

  @jax.jit  # every case in one program (eager: each op compiled alone)
  def run(x, xn, xz):
    return (_one_hot_grad(pool, x), _one_hot_grad(pool, jnp.ones_like(x)), pool1(xn),
            _one_hot_grad(pool1, xn), MedianPool(3, num_spatial_dims=1)(xz))

  grad_ties, grad_equal, nan_value, grad_nan, signed = run(x, xn, xz)
  expected = np.zeros(9, np.float32)
  expected[2] = 1.0
  np.testing.assert_array_equal(np.ravel(grad_ties), expected)
  # All equal: rank 4 of 9 is the fifth cell.
  expected = np.zeros(9, np.float32)
  expected[4] = 1.0
  np.testing.assert_array_equal(np.ravel(grad_equal), expected)
  # NaN: the window's first NaN, value and gradient (PyTorch: [1, nan, 2, nan] -> index 1).
  assert np.isnan(nan_value[0, 0, 0])
  np.testing.assert_array_equal(np.ravel(grad_nan), [0.0, 1.0, 0.0, 0.0])
  # -0.0 equals 0.0 and ranks by position; the chosen cell keeps its sign (PyTorch: -0.).
  got = signed[0, 0, 0]
  assert got == 0.0 and np.signbit(got)


def test_integer_inputs_are_pooled_exactly():
  x = np.random.default_rng(0).integers(-1000, 1000, (2, 6, 7, 3)).astype(np.int32)
  got = jax.jit(MedianPool((3, 2), (1, 2), 1))(x)
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, reference.median_pool(x, (3, 2), (1, 2), ((1, 1),) * 2)[0])


# ----------------------------------------------------------------------------
# PyTorch (timm's forward) and the NumPy mirror.
# ----------------------------------------------------------------------------


# SAME at stride 1 (3x3) took paths kept here again: its reflected padding is written out by
# hand in test_same_padding_reflects_by_hand (values); the values and gradients of a
# reflected SAME padding, here at strides (2, 3), where the padding is (2, 2) and (0, 1).
# Without it, 0.43 s less compile CPU (compile census).
_CASES = [  # kernel, stride, padding as F.pad's (l, r, t, b), same
    ((2, 4), (2, 1), (1, 2, 0, 1), False),
    ((5, 3), (2, 3), (0, 0, 0, 0), True),
]


@pytest.mark.parametrize(("kernel", "stride", "padding", "same"), _CASES)
def test_matches_timm_and_the_mirror_values_and_gradients(kernel, stride, padding, same):
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  rng = np.random.default_rng(sum(kernel))
  # Small integers (many ties) and a NaN: the chosen cell, not only the value, must agree.
  x = rng.integers(0, 4, (2, 7, 8, 3)).astype(np.float32)
  x[1, 3, 4, 2] = np.nan
  ours = ((padding[2], padding[3]), (padding[0], padding[1]))

  @jax.jit
  def run(x, g):
    y, vjp = jax.vjp(lambda x: median_pool(x, kernel, stride, ours, same=same), x)
    return y, vjp(g)[0]

  xt = torch.tensor(np.moveaxis(x, -1, 1).copy(), requires_grad=True)
  yt = _timm_median(torch, xt, kernel, stride, padding, same)
  want = np.moveaxis(yt.detach().numpy(), 1, -1)
  g = rng.standard_normal(want.shape).astype(np.float32)
  yt.backward(torch.tensor(np.moveaxis(g, -1, 1).copy()))
  y, grad = run(x, g)
  np.testing.assert_array_equal(y, want)
  want_grad = np.moveaxis(xt.grad.numpy(), 1, -1)
  # Cotangents summed over overlapping windows and mirrored cells: a few ULPs apart.
  np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)
  values, index = reference.median_pool(x, kernel, stride, "SAME" if same else ours)
  np.testing.assert_array_equal(values, want)
  # The mirror's indices name the cells the gradient reaches (padding mirrored back).
  mirror_grad = np.zeros((2, 56, 3), np.float64)
  for n in range(2):
    for c in range(3):
      np.add.at(mirror_grad[n, :, c], index[n, ..., c].ravel(), g[n, ..., c].ravel())
  np.testing.assert_allclose(grad, mirror_grad.reshape(x.shape), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("window", "strides", "padding", "shape"), [
    ((3,), (2,), ((2, 1),), (2, 9, 3)),
    ((2, 3, 2), (1, 2, 1), ((1, 0), (1, 1), (0, 1)), (1, 4, 5, 4, 2)),
])
def test_one_and_three_dims_match_the_mirror(window, strides, padding, shape):
  x = np.random.default_rng(len(shape)).integers(0, 5, shape).astype(np.float32)
  np.testing.assert_array_equal(jax.jit(lambda x: median_pool(x, window, strides, padding))(x),
                                reference.median_pool(x, window, strides, padding)[0])


# ----------------------------------------------------------------------------
# jit, vmap, forward mode, batch axes, dtypes, layout.
# ----------------------------------------------------------------------------


def test_batch_axes_vmap_forward_mode_and_bfloat16():
  rng = np.random.default_rng(2)
  x = rng.standard_normal((2, 3, 6, 5, 4)).astype(np.float32)  # (B1, B2, H, W, C)
  pool = MedianPool(3, 1, 1)
  t = rng.standard_normal(x[0].shape).astype(np.float32)

  @jax.jit  # every call in one program (eager: each layout step and op compiled alone)
  def run(x, t):
    xb = x[0].astype(jnp.bfloat16)
    return (pool(x), pool(x.reshape(6, 6, 5, 4)), jax.vmap(pool)(x[0]),
            jax.jvp(pool, (x[0],), (t,))[1], pool(xb))

  several, flat, mapped, tangent, got = jax.device_get(run(x, t))  # NumPy: slices compile
  np.testing.assert_array_equal(several, flat.reshape(2, 3, 6, 5, 4))
  np.testing.assert_array_equal(mapped, several[0])  # unbatched under vmap
  # Forward mode: each output's tangent is the tangent of its median cell, which the
  # mirror names (a reflected cell names the input cell it mirrors).
  _, index = reference.median_pool(x[0], (3, 3), (1, 1), ((1, 1), (1, 1)))
  want = np.take_along_axis(t.reshape(3, 30, 4), index.reshape(3, 30, 4), axis=1)
  np.testing.assert_array_equal(tangent, want.reshape(tangent.shape))
  # bfloat16 is selected, not computed: the cells the mirror selects from the same values.
  assert got.dtype == jnp.bfloat16
  xb = np.asarray(x[0].astype(ml_dtypes.bfloat16), np.float32)
  want, _ = reference.median_pool(xb, (3, 3), (1, 1), ((1, 1), (1, 1)))
  np.testing.assert_array_equal(np.asarray(got, np.float32), want)


def test_nchw_guard():
  with pytest.raises(ValueError, match=re.escape("use jnp.moveaxis(x, 1, -1)")):
    MedianPool(in_features=3)(_zeros((2, 3, 16, 16)))
  with pytest.warns(ChannelsFirstWarning):  # at trace time: traced alone, nothing compiled
    jax.eval_shape(MedianPool(), jax.ShapeDtypeStruct((2, 3, 16, 16), jnp.float32))


# ----------------------------------------------------------------------------
# Refusals.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: MedianPool(3, 1, (1, 1, 2, 2)), ValueError,
     "`padding` (1, 1, 2, 2) reads as F.pad's flat (left, right, top, bottom[, front, back]) "
     "order, timm's MedianPool2d form; here padding is an int, one int per spatial dim or one "
     "(low, high) pair per spatial dim, first dim first: write padding=((2, 2), (1, 1))."),
    (lambda: MedianPool(3, padding="SAME"), TypeError,
     "`padding` must be an int, a tuple of ints (one per spatial dim) or of (low, high) pairs; "
     "got 'SAME'. For TF-style 'SAME' padding pass same=True (timm's `same`)."),
    (lambda: MedianPool(3, padding=1.0), TypeError,  # without the strings MedianPool refuses
     "`padding` must be an int, a tuple of ints (one per spatial dim) or of (low, high) pairs; "
     "got 1.0."),
    (lambda: MedianPool(3, 1, 1, same=True), ValueError,
     "`padding` 1 and same=True disagree: same=True computes the padding (TF's 'SAME' rule), "
     "and timm's MedianPool2d then ignores `padding`. Pass one: padding=0 with same=True, or "
     "same=False."),
    (lambda: MedianPool(3, same=1), TypeError, "`same` must be a bool; got 1."),
    (lambda: MedianPool((3, 3), (1, 1, 1)), ValueError,
     "`strides` (1, 1, 1) has 3 entries, but `window_shape` (3, 3) sets 2 spatial dim(s)"),
    (lambda: MedianPool(kernel_size=3), TypeError,
     "MedianPool takes `window_shape` (Flax's name), not `kernel_size` (PyTorch's)"),
    (lambda: MedianPool(3, 1, 2)(_zeros((1, 2, 8, 1))), ValueError,
     "MedianPool: reflect padding must be shorter than the dim it pads (PyTorch's F.pad rule: "
     "it mirrors the dim without its edge); spatial dim 0 has length 2 and padding (2, 2). Use "
     "an input at least 3 long there, or less padding."),
    (lambda: median_pool(_zeros((1, 2, 8, 1)), 3), ValueError,
     "median_pool: window 3 does not fit spatial dim 0 of length 2 padded by (0, 0); "
     "PyTorch's unfold keeps whole windows only. Use a window of at most 2 there, more "
     "padding (less than 2 on a side), or same=True."),
    (lambda: MedianPool()(_zeros((1, 4, 4, 1), bool)), TypeError,
     "MedianPool: `inputs` has dtype bool; cast it first"),
])
def test_refusals(call, error, message):
  with pytest.raises(error, match=re.escape(message)):
    call()
