"""Which way a window reduction runs: unrolled tap by tap, or one spatial dim at a time.

Windows of at most :data:`UNROLL_LIMIT` taps are unrolled (:mod:`nnx_pool._taps`,
differentiated by :mod:`nnx_pool._adjoint`). Larger windows are decomposed
separably, one spatial dim at a time, so the op count (and compile time) grows
with ``sum(window)`` instead of ``prod(window)``. Each stage is a 1-D window over
one dim, a :class:`Geometry` whose other dims are identity windows (window 1,
stride 1, no padding), and keeps its own custom_jvp and phase-scatter adjoint:

* sums apply the 1-D windowed sum along each dim in turn: an exact linear
  composition, only the summation order changes;
* max/min run the dims from last to first. Each stage is a 1-D arg-select
  that carries an integer payload, the combined row-major offset over the later
  dims, selected alongside the values: ``offset = tap * prod(later windows) +
  payload``. Per row the first extremum, then the first row holding it, is the
  first extremum in row-major order; per row the last NaN, then the last row
  with a NaN, is the last NaN in row-major order; so the result is PyTorch's
  rule, bit for bit. A window starting in padding starts from its first real
  cell in every stage, so an all -inf window reports its first real cell. Each
  stage's tangent picks its winning tap, and the composition sends the
  gradient to exactly the reported element.

:func:`window_sum` and :func:`select` are the entry points that the pooling
kernels call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._adjoint import stage_select, tap_select, tap_sum
from ._geometry import DimGeometry, Geometry
from ._jit import scoped
from ._select import Kind, offset_dtype_for, select_forward, stage_arg_select

# Windows with more taps than this are decomposed one spatial dim at a time.
UNROLL_LIMIT = 64


def _is_identity(d: DimGeometry) -> bool:
  """Whether a dim's window leaves it unchanged: one tap, unit stride, every position kept.

  (A single window over a longer dim also has one tap and unit stride, see
  :class:`DimGeometry`, but keeps one position.)
  """
  return d.window == 1 and d.stride == 1 and d.out == d.length


def _stage(geom: Geometry, axis: int, spatial: tuple[int, ...]) -> Geometry:
  """The 1-D window of ``geom`` along ``axis``, identity windows over the current ``spatial``."""
  dims = tuple(
      geom.dims[axis] if i == axis else DimGeometry(n, 1, 1, 1, 0, 0, n)
      for i, n in enumerate(spatial)
  )
  return Geometry(dims)


def separable_sum(x: jax.Array, geom: Geometry) -> jax.Array:
  """:func:`nnx_pool._adjoint.tap_sum` as one 1-D window sum per spatial dim, first to last."""
  spatial = geom.in_shape
  for axis, d in enumerate(geom.dims):
    if _is_identity(d):
      continue
    x = tap_sum(x, _stage(geom, axis, spatial))
    spatial = (*spatial[:axis], d.out, *spatial[axis + 1:])
  return x


def separable_select(
    x: jax.Array, geom: Geometry, kind: Kind, differentiable: bool,
) -> tuple[jax.Array, jax.Array]:
  """:func:`nnx_pool._select.arg_select` as one 1-D arg-select per spatial dim, last to first."""
  offset_dtype = offset_dtype_for(geom)
  spatial = geom.in_shape
  ndim = len(geom.dims)
  payload = None
  later = 1
  # Combined first-real offset over the dims processed so far (last to current).
  first_real = np.zeros((), np.int64)
  for axis in reversed(range(ndim)):
    d = geom.dims[axis]
    first_real = np.add.outer(d.first_real_tap() * later, first_real)
    if not _is_identity(d):
      stage = _stage(geom, axis, spatial)
      # Aligned with the array axes: (1, ..., 1, out_axis, ..., out_last, 1).
      init = first_real.reshape((1,) * (axis + 1) + first_real.shape + (1,))
      if differentiable:
        x, payload = stage_select(x, payload, stage, axis, later, init, kind, offset_dtype)
      else:
        x, payload, _ = stage_arg_select(x, payload, stage, axis, later, init, kind,
                                         offset_dtype)
    later *= d.window
    spatial = (*spatial[:axis], d.out, *spatial[axis + 1:])
  if payload is None:  # every window is a single tap
    payload = jnp.zeros(x.shape, offset_dtype)
  return x, payload


@scoped
def window_sum(x: jax.Array, geom: Geometry) -> jax.Array:
  """Sum of every window (zero padding), shape ``(N, *geom.out_shape, C)``.

  Differentiable in ``x`` in forward and reverse mode, to any order. Windows over
  :data:`UNROLL_LIMIT` taps are summed one spatial dim at a time.
  """
  if geom.size > UNROLL_LIMIT:
    return separable_sum(x, geom)
  return tap_sum(x, geom)


@scoped
def select(
    x: jax.Array, geom: Geometry, kind: Kind, with_offsets: bool = True
) -> tuple[jax.Array, jax.Array]:
  """Max (min) of every window and the row-major window offset it came from.

  For floats, differentiable in ``x`` in forward and reverse mode, to any
  order: each output's derivative is that of its winning input element. Integer
  inputs get the plain forward. Windows over :data:`UNROLL_LIMIT` taps are
  reduced one spatial dim at a time. ``with_offsets=False`` says the caller
  drops the offsets (they are still returned): only how the taps are spelt
  for XLA changes, never a result.
  """
  floating = jnp.issubdtype(x.dtype, jnp.floating)
  if geom.size > UNROLL_LIMIT:
    return separable_select(x, geom, kind, differentiable=floating)
  if floating:
    return tap_select(x, geom, kind, with_offsets)
  return select_forward(x, geom, kind, with_offsets)
