"""Tests for issue 31's kernels: window sums split into boxes of outputs.

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

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import nnx_pool._adjoint
import nnx_pool._taps
from nnx_pool import reference
from nnx_pool._adjoint import tap_sum
from nnx_pool._geometry import Window
from nnx_pool._jit import may_split_space
from nnx_pool._taps import sum_taps

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
  """The mirror's gradient of ``sum(forward(x) * g)``: cell ``i`` gets ``sum(forward(e_i) * g)``."""
  grad = np.zeros(shape, np.float64)
  for i in np.ndindex(*shape):
    unit = np.zeros(shape, np.float32)
    unit[i] = 1.0
    grad[i] = np.sum(np.asarray(forward(unit), np.float64) * g)
  return grad


@pytest.fixture
def boxes_everywhere(monkeypatch):
  """Every kernel splits into boxes, whatever the map's size (the default on large maps)."""
  always = lambda x, out_shape: True  # noqa: E731
  for module in (nnx_pool._taps, nnx_pool._adjoint):
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
  np.testing.assert_array_equal(jax.jit(lambda a: sum_taps(a, geom, split=True))(x), want)
  np.testing.assert_array_equal(jax.jit(lambda a: sum_taps(a, geom, split=False))(x), want)
  # The gradient (a stride-1 sum's is itself a window sum in boxes, the others the phase
  # scatter) through the custom JVP, reverse mode.
  g = _ints(want.shape, len(case) + 1)
  grad = jax.jit(jax.grad(lambda a: jnp.sum(tap_sum(a, geom) * g)))(x)
  np.testing.assert_array_equal(grad, _mirror_jacobian_vjp(mirror, shape, g))


def _dilated_sum(x, window, padding, dilation):
  """Stride-1 window sums with dilation, by hand: zero padding, tap ``j`` at ``q - p + j*d``."""
  (k_h, k_w), (d_h, d_w), (p, _) = window, dilation, padding[0]
  padded = np.pad(np.asarray(x, np.float64), ((0, 0), (p, p), (p, p), (0, 0)))
  h = x.shape[1] + 2 * p - d_h * (k_h - 1)
  w = x.shape[2] + 2 * p - d_w * (k_w - 1)
  return sum(padded[:, i * d_h:i * d_h + h, j * d_w:j * d_w + w]
             for i in range(k_h) for j in range(k_w)).astype(np.float32)


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
