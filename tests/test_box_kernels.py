"""Tests for issue 31's kernels: window sums and blurs split into boxes of outputs, the blur's
taps read through its padding, and the fractional max pool's per-image gather.

On the CPU, large maps (``nnx_pool._taps.BOX_MIN_POSITIONS`` outputs) take the box split,
and the suite's small maps do not: these tests force each spelling on small maps. The
expectations come from the NumPy mirror (``nnx_pool.reference``, float64 loops over each
window): the sums of integer-valued inputs are exact in float32, so the window sums and
their gradients must equal it bit for bit. Gradients are checked against the mirror's
Jacobian, built cell by cell from its forward (the gradient of ``sum(f(x) * g)`` at cell
``i`` is ``sum(f(e_i) * g)``, ``e_i`` the unit array at ``i``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import nnx_pool._adjoint
import nnx_pool._blur
import nnx_pool._fractional
import nnx_pool._taps
from nnx_pool import FractionalMaxPool, reference
from nnx_pool._adjoint import tap_sum
from nnx_pool._blur import blur_pool, blur_views
from nnx_pool._geometry import Window
from nnx_pool._jit import may_split_space
from nnx_pool._taps import sum_taps

_TORCH_REASON = "PyTorch parity needs torch==2.13.0 (the parity extra)"

# (window, strides, padding, dilation, ceil_mode, input shape): borders low and high, the
# ceil-mode overhang, dilation, 1-D and 3-D, and windows that all leave the input.
SUMS = {
    "3x3/1 p1": ((3, 3), (1, 1), 1, (1, 1), False, (2, 7, 6, 2)),
    "3x3/2 p1 ceil, odd": ((3, 3), (2, 2), 1, (1, 1), True, (1, 9, 7, 2)),
    "2x3/(3,2) p((1,0),(1,1)) ceil": ((2, 3), (3, 2), ((1, 0), (1, 1)), (1, 1), True,
                                      (1, 10, 9, 1)),
    "3x3/1 p2 dilation 2": ((3, 3), (1, 1), 2, (2, 2), False, (1, 8, 7, 1)),
    "5/1 p2, 1-D": ((5,), (1,), 2, (1,), False, (2, 9, 2)),
    "3x3x3/2 p1": ((3, 3, 3), (2, 2, 2), 1, (1, 1, 1), False, (1, 5, 6, 4, 1)),
    "5x5/1 p2 on 3x4: no interior": ((5, 5), (1, 1), 2, (1, 1), False, (1, 3, 4, 1)),
}


def _ints(shape, seed):
  return np.random.default_rng(seed).integers(-3, 4, shape).astype(np.float32)


def _mirror_jacobian_vjp(forward, shape, g):
  """The mirror's gradient of ``sum(forward(x) * g)``: cell ``i`` gets ``sum(forward(e_i) * g)``.

  The mirror pools each example on its own, so every unit array ``e_i`` goes through it in
  one call, stacked on the batch axis.
  """
  cells = math.prod(shape)
  units = np.eye(cells, dtype=np.float32).reshape(cells * shape[0], *shape[1:])
  out = np.asarray(forward(units), np.float64).reshape(cells, *g.shape)
  return np.sum(out * g, axis=tuple(range(1, out.ndim))).reshape(shape)


@pytest.fixture
def boxes_everywhere(monkeypatch):
  """Every kernel splits into boxes, whatever the map's size (the default on large maps)."""
  always = lambda x, out_shape: True  # noqa: E731
  for module in (nnx_pool._taps, nnx_pool._adjoint, nnx_pool._blur):
    monkeypatch.setattr(module, "splits_boxes", always)


@pytest.mark.parametrize("case", list(SUMS))
def test_window_sums_in_boxes_and_their_gradients_equal_the_mirror(case, boxes_everywhere):
  window, strides, padding, dilation, ceil_mode, shape = SUMS[case]
  if isinstance(padding, int):
    padding = ((padding, padding),) * len(window)
  geom = Window.create(window, strides, padding, dilation=dilation,
                       ceil_mode=ceil_mode).resolve(shape[1:-1])
  if dilation != (1,) * len(window):  # the mirror's avg_pool has no dilation: its taps by hand
    mirror = functools.partial(_dilated_sum, window=window, padding=padding, dilation=dilation)
  else:
    mirror = functools.partial(reference.avg_pool, window=window, strides=strides,
                               padding=padding, ceil_mode=ceil_mode, divisor_override=1)
  x = _ints(shape, len(case))
  want = mirror(x)
  g = _ints(want.shape, len(case) + 1)

  @jax.jit  # both spellings and the gradient in one program
  def run(a, g):
    # The gradient (a stride-1 sum's is itself a window sum in boxes, the others the phase
    # scatter) through the custom JVP, reverse mode.
    grad = jax.grad(lambda a: jnp.sum(tap_sum(a, geom) * g))(a)
    return sum_taps(a, geom, split=True), sum_taps(a, geom, split=False), grad

  in_boxes, in_one_box, grad = run(x, g)
  np.testing.assert_array_equal(in_boxes, want)
  np.testing.assert_array_equal(in_one_box, want)
  np.testing.assert_array_equal(grad, _mirror_jacobian_vjp(mirror, shape, g))


def _dilated_sum(x, window, padding, dilation):
  """Stride-1 window sums with dilation, by hand: zero padding, tap ``j`` at ``q - p + j*d``."""
  (k_h, k_w), (d_h, d_w), (p, _) = window, dilation, padding[0]
  padded = np.pad(np.asarray(x, np.float64), ((0, 0), (p, p), (p, p), (0, 0)))
  h = x.shape[1] + 2 * p - d_h * (k_h - 1)
  w = x.shape[2] + 2 * p - d_w * (k_w - 1)
  return sum(padded[:, i * d_h:i * d_h + h, j * d_w:j * d_w + w]
             for i in range(k_h) for j in range(k_w)).astype(np.float32)


# (filter_size, strides, pad_mode, input shape): every pad mode, borders low only (3/2) and
# both (3/1), a stride past the filter, 1-D and 3-D.
BLURS = [
    (3, 2, "reflect", (2, 7, 8, 2)),
    (3, 1, "reflect", (1, 5, 6, 1)),
    (4, 2, "replicate", (1, 7, 6, 1)),
    (5, 2, "constant", (1, 6, 7, 1)),
    (2, 3, "circular", (1, 7, 8, 1)),
    (3, 1, "circular", (2, 9, 2)),
    (3, 2, "reflect", (1, 5, 4, 6, 1)),
]


@pytest.mark.parametrize(("filter_size", "strides", "pad_mode", "shape"), BLURS)
def test_blur_views_in_boxes_or_not_match_the_mirror(filter_size, strides, pad_mode, shape,
                                                     monkeypatch):
  ndim = len(shape) - 2
  sizes, steps = (filter_size,) * ndim, (strides,) * ndim
  pad = nnx_pool._blur.blur_padding(filter_size, strides)
  axes = ((nnx_pool._blur.binomial_filter(filter_size), strides, pad),) * ndim

  def mirror(a):
    return reference.blur_pool(a, sizes, steps, pad_mode)

  x = np.random.default_rng(filter_size + strides).standard_normal(shape).astype(np.float32)
  want = mirror(x)
  g = np.random.default_rng(1).standard_normal(want.shape).astype(np.float32)

  def blur(v, split):
    # The split is read while tracing: each call below is traced with its own.
    monkeypatch.setattr(nnx_pool._blur, "splits_boxes", lambda x, out_shape: split)
    return blur_views(v, axes, pad_mode)

  @jax.jit  # both spellings' values, the gradient and the tangent in one program
  def run(a, g):
    # The gradient and the tangent run the custom JVP's adjoint, which reads no box split
    # (the split is the forward's alone): one of each serves both spellings.
    grad = jax.grad(lambda v: jnp.sum(blur(v, True) * g))(a)
    tangent = jax.jvp(lambda v: blur(v, True), (a,), (a,))[1]  # linear: the blur of a
    return blur(a, True), blur(a, False), grad, tangent

  in_boxes, in_one_box, grad, tangent = run(x, g)
  # The separable passes sum in another order than the mirror's float64 product: ULPs.
  np.testing.assert_allclose(in_boxes, want, rtol=1e-6, atol=1e-6, err_msg="boxes")
  np.testing.assert_allclose(in_one_box, want, rtol=1e-6, atol=1e-6, err_msg="one box")
  np.testing.assert_allclose(grad, _mirror_jacobian_vjp(mirror, shape, g), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(tangent, want, rtol=1e-6, atol=1e-6)


def test_blur_views_keep_nan_and_infinities_in_their_windows():
  # [1, 2, 1] / 4, stride 2, reflect pad 1 over rows [a, inf, b, c, NaN, d] (hand
  # computation): output 0 reads padded [x1 | x0 x1] = inf, inf, inf -> inf; output 1 reads
  # x1 x2 x3 -> inf; output 2 reads x3 x4 x5 -> NaN. Columns are constant, so each row
  # blurs to itself. A GEMM-style sum with zero weights would turn inf into NaN elsewhere.
  rows = np.array([1.0, np.inf, 2.0, 3.0, np.nan, 4.0], np.float32)
  x = np.broadcast_to(rows[None, :, None, None], (1, 6, 4, 1)).copy()
  got = np.asarray(blur_pool(x, 3, 2))[0, :, 0, 0]
  assert np.isposinf(got[0]) and np.isposinf(got[1]) and np.isnan(got[2])


def test_may_split_space_reads_the_mesh_a_trace_sees():
  # Abstract meshes of 2 x 4 devices, no devices needed: an Explicit spec says where the map
  # is split; on Auto axes over several devices the trace cannot see it, so it may be.
  seen = {}
  for kind in (AxisType.Explicit, AxisType.Auto):
    mesh = AbstractMesh((2, 4), ("data", "space"), axis_types=(kind, kind))
    for spec in (P("data"), P("data", "space"), P(None, None, "space")):
      arg = jax.ShapeDtypeStruct((2, 8, 8, 3), jnp.float32, sharding=NamedSharding(mesh, spec))
      jax.jit(lambda a, key=(kind, spec): seen.setdefault(key, may_split_space(a)) and a).trace(
          arg)
  assert seen == {(AxisType.Explicit, P("data")): False,
                  (AxisType.Explicit, P("data", "space")): True,
                  (AxisType.Explicit, P(None, None, "space")): True,
                  (AxisType.Auto, P("data")): True,
                  (AxisType.Auto, P("data", "space")): True,
                  (AxisType.Auto, P(None, None, "space")): True}
  plain = []
  jax.jit(lambda a: plain.append(may_split_space(a)) or a).trace(
      jax.ShapeDtypeStruct((2, 8, 8, 3), jnp.float32))
  assert plain == [False]


@pytest.mark.parametrize(("flat_limit", "channels"), [(2**31 - 1, 3), (0, 4)],
                         ids=["per-image flat gather", "fallback"])
def test_fractional_gathers_match_pytorch(flat_limit, channels, monkeypatch):
  # PyTorch 2.13 CPU fractional_max_pool2d with the same _random_samples: values and indices
  # bit for bit, through the per-image gather and through the per-plane fallback kept for
  # images past int32 (forced here with a limit of 0; another channel count, so that the
  # kernel is traced again rather than taken from jit's cache).
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  monkeypatch.setattr(nnx_pool._fractional, "_FLAT_LIMIT", flat_limit)
  rng = np.random.default_rng(3)
  x = rng.standard_normal((2, 9, 8, channels)).astype(np.float32)
  samples = rng.random((2, channels, 2), dtype=np.float32)
  values, indices = jax.jit(lambda a, s: FractionalMaxPool(2, (4, 5), return_indices=True)(
      a, samples=s))(x, samples)
  want, want_idx = torch.nn.functional.fractional_max_pool2d(
      torch.from_numpy(np.moveaxis(x, -1, 1).copy()), 2, output_size=(4, 5),
      return_indices=True, _random_samples=torch.from_numpy(samples))
  np.testing.assert_array_equal(values, np.moveaxis(want.numpy(), 1, -1))
  np.testing.assert_array_equal(indices, np.moveaxis(want_idx.numpy(), 1, -1))
