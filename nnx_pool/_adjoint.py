"""The derivatives of the window reductions: custom JVPs whose transposes scatter fast.

The adjoint of "gather every tap" is "scatter every output back to its taps".
Written naively (the transpose of a strided slice is a pad with interior zeros)
XLA materialises one input-sized array per tap. Instead :func:`scatter` splits the
input into stride phases: the cells ``p`` with ``p % s == r`` receive from exactly
the taps ``j`` with ``j * d % s == r``, each through a *unit-stride* shift of the
cotangent. Each phase is placed on its cells by a pad with interior ``stride - 1``,
and the disjoint placements are added in one fused loop over the input (windows
that tile the input stack and reshape instead); pads partition with halo
exchanges, so a spatially sharded input keeps its sharding in the gradient.

Each reduction carries a ``jax.custom_jvp`` whose tangent map (:func:`gather`) is
the linear transpose of :func:`scatter`; reverse mode transposes it back, so
``jax.grad`` runs the phase scatter while ``jax.jvp``, ``jax.hessian`` and higher
orders keep working. For max/min the scatter is masked by the winning window
offset, so the gradient lands exactly on the element the indices report: the
unrolled window sum and select (:func:`tap_sum`, :func:`tap_select`), one stage of
a separable select (:func:`stage_select`), and the adaptive max over bins
(:func:`bins_select`), whose tangent is picked at its flat indices.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._geometry import DimGeometry, Geometry
from ._select import (
  Kind,
  arg_extremum_over_bins,
  arg_select_boxes,
  select_forward,
  stage_arg_select,
)
from ._taps import splits_boxes, sum_taps


def _phases(geom: Geometry):
  """Per dim: the phase count ``Q``, and per phase ``r`` the ``(tap, shift)`` pairs feeding it.

  Padded position ``q * s + r`` is tap ``j`` of output ``q + shift`` when
  ``(r - j * d) % s == 0``, with ``shift = (r - j * d) // s`` (never positive).
  """
  result = []
  for d in geom.dims:
    padded = d.length + d.pad_low + d.applied_high
    q = -(-padded // d.stride)
    per_phase = [
        [(j, (r - j * d.dilation) // d.stride)
         for j in range(d.window) if (r - j * d.dilation) % d.stride == 0]
        for r in range(d.stride)
    ]
    result.append((q, per_phase))
  return result


def _is_tiling(geom: Geometry) -> bool:
  """Whether the windows tile the input: stride = window, no dilation, no low padding."""
  return all(d.stride == d.window and d.dilation == 1 and d.pad_low == 0 for d in geom.dims)


def _scatter_tiles(ct: jax.Array, geom: Geometry) -> jax.Array:
  """:func:`scatter` of a sum whose windows tile the input (each cell in at most one).

  The cotangent is broadcast over each window and reshaped to the input,
  cropped to it or zero-extended past the last whole window: one fused loop,
  where the phase scatter stacks one block per phase. Measured (fwd+bwd of
  an average pool, ms, phases -> tiles): 8x8/8 13.4 -> 6.5, adaptive 56 -> 7
  2.5 -> 0.7, 3x3/3 2.0 -> 1.5, but 2x2/2 1.5 -> 2.1, and a max pool's masked
  broadcast was slower than its phases (adaptive max 56 -> 7: 0.8 -> 6.0); so
  only sums over more than 4 taps take this path.
  """
  n, c = ct.shape[0], ct.shape[-1]
  split = tuple(v for d in geom.dims for v in (d.out, d.window))
  full = jnp.broadcast_to(ct.reshape(n, *(v for d in geom.dims for v in (d.out, 1)), c),
                          (n, *split, c))
  full = full.reshape(n, *(d.out * d.window for d in geom.dims), c)
  config = [(0, 0, 0), *((0, d.length - d.out * d.window, 0) for d in geom.dims), (0, 0, 0)]
  return lax.pad(full, jnp.zeros((), ct.dtype), config)


def _transposed(geom: Geometry) -> Geometry:
  """The window sum whose taps are a stride-1 sum's transposed: cell ``m`` of the input
  receives ``ct[m + pad_low - j * dilation]`` for each tap ``j``, the window over ``ct``
  flipped and padded by ``effective_window - 1 - pad_low`` below."""
  dims = []
  for d in geom.dims:
    low = d.effective_window - 1 - d.pad_low
    high = max(0, d.length - 1 - low + d.effective_window - d.out)
    dims.append(DimGeometry(d.out, d.window, 1, d.dilation, low, high, d.length))
  return Geometry(tuple(dims))


def scatter(ct: jax.Array, geom: Geometry, arg: jax.Array | None = None) -> jax.Array:
  """Adjoint of the tap gather: adds each output's ``ct`` to the input cells of its taps.

  With ``arg`` (window offsets), only the winning tap of each output receives.
  Linear in ``ct``; returns an array of the input's shape ``(N, *in, C)``.

  A stride-1 sum on a map split into boxes (:func:`nnx_pool._taps.splits_boxes`) is
  scattered as the window sum it is transposed (:func:`_transposed`), in boxes too: that
  reads the cotangent in place, where the phases below read one padded copy of it, an
  input-sized temporary (26.3 MB, past Flax's 24.5, on AvgPool 3x3/1 pad 1's gradient at
  (8, 112, 112, 64); docs/benchmarks.md).
  """
  if arg is None and geom.size > 4 and _is_tiling(geom):
    return _scatter_tiles(ct, geom)
  if arg is None and all(d.stride == 1 for d in geom.dims) and splits_boxes(ct, geom.in_shape):
    return sum_taps(ct, _transposed(geom), split=True)
  phases = _phases(geom)
  n, c = ct.shape[0], ct.shape[-1]
  # Pad the cotangent (and offsets, with -1 that matches no tap) so that every
  # unit-stride shift below stays in range.
  pads = []
  for d, (q, per_phase) in zip(geom.dims, phases, strict=True):
    shifts = [shift for taps_ in per_phase for _, shift in taps_] or [0]
    pads.append((max(0, -min(shifts)), max(0, q - 1 + max(shifts) - (d.out - 1))))
  config = [(0, 0, 0), *((lo, hi, 0) for lo, hi in pads), (0, 0, 0)]
  ct = lax.pad(ct, jnp.zeros((), ct.dtype), config)
  if arg is not None:
    arg = lax.pad(arg, jnp.asarray(-1, arg.dtype), config)
  block_shape = (n, *(q for q, _ in phases), c)
  zero = jnp.zeros((), ct.dtype)

  def phase_block(rs: tuple[int, ...]) -> jax.Array:
    total = None
    chosen = (per_phase[r] for (_, per_phase), r in zip(phases, rs, strict=True))
    for combo in itertools.product(*chosen):
      offset = 0
      start = [0]
      for (j, shift), d, (lo, _) in zip(combo, geom.dims, pads, strict=True):
        offset = offset * d.window + j
        start.append(lo + shift)
      start.append(0)
      limit = [a + b for a, b in zip(start, block_shape, strict=True)]
      term = lax.slice(ct, start, limit)
      if arg is not None:
        term = jnp.where(lax.slice(arg, start, limit) == offset, term, zero)
      total = term if total is None else total + term
    return jnp.zeros(block_shape, ct.dtype) if total is None else total

  if _is_tiling(geom):
    # Every cell is in at most one window: stacking the phases and merging the
    # phase axis into the spatial one is a relabelling, which keeps a spatial
    # sharding whose shards hold whole windows without any collective.
    def interleave(prefix: tuple[int, ...]) -> jax.Array:
      axis = len(prefix)
      if axis == len(geom.dims):
        return phase_block(prefix)
      stride = geom.dims[axis].stride
      stacked = jnp.stack([interleave((*prefix, r)) for r in range(stride)], axis=axis + 2)
      shape = stacked.shape
      return stacked.reshape(*shape[:axis + 1], shape[axis + 1] * stride, *shape[axis + 3:])

    full = interleave(())
    limit = (n, *(d.length for d in geom.dims), c)
    return lax.slice(full, (0,) * full.ndim, limit)
  # Overlapping or shifted windows: each phase is placed on its cells by a pad
  # with interior ``stride - 1`` (cropping the padding), and the disjoint
  # placements are added. A pad is partitioned with halo exchanges, so this
  # keeps a spatial sharding, where a stack and reshape across phase blocks whose
  # length the shards do not divide all-gathers the map.
  total = None
  for rs in itertools.product(*(range(d.stride) for d in geom.dims)):
    config = [(0, 0, 0)]
    for r, d, (q, _) in zip(rs, geom.dims, phases, strict=True):
      low = r - d.pad_low  # phase cell b lies at padded position b * s + r
      config.append((low, d.length - low - (q - 1) * d.stride - 1, d.stride - 1))
    config.append((0, 0, 0))
    placed = lax.pad(phase_block(rs), zero, config)
    total = placed if total is None else total + placed
  # Not None: the loop runs at least once (every stride is >= 1).
  return total  # pyright: ignore[reportReturnType]


def gather(t: jax.Array, geom: Geometry, arg: jax.Array | None = None) -> jax.Array:
  """The tangent map: the transpose of :func:`scatter`, applied to an input tangent."""
  out = jax.ShapeDtypeStruct((t.shape[0], *geom.out_shape, t.shape[-1]), t.dtype)
  (t_out,) = jax.linear_transpose(lambda ct: scatter(ct, geom, arg), out)(t)
  return t_out


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def tap_sum(x: jax.Array, geom: Geometry) -> jax.Array:
  """:func:`nnx_pool._taps.sum_taps`, differentiated by the phase scatter."""
  return sum_taps(x, geom)


@tap_sum.defjvp
def _tap_sum_jvp(geom, primals, tangents):
  (x,), (t,) = primals, tangents
  return sum_taps(x, geom), gather(t, geom)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def tap_select(
    x: jax.Array, geom: Geometry, kind: Kind, with_offsets: bool
) -> tuple[jax.Array, jax.Array]:
  """:func:`nnx_pool._select.select_forward`; its tangent is that of each winning tap."""
  # Undifferentiated: the offsets are computed only when asked for.
  return select_forward(x, geom, kind, with_offsets)


@tap_select.defjvp
def _tap_select_jvp(geom, kind, with_offsets, primals, tangents):
  (x,), (t,) = primals, tangents
  values, arg = arg_select_boxes(x, geom, kind)  # the tangent needs the offsets
  return (values, arg), (gather(t, geom, arg), np.zeros(arg.shape, jax.dtypes.float0))


class _Static:
  """A hashable wrapper for a static NumPy array (a nondiff custom_jvp argument)."""

  def __init__(self, value: np.ndarray):
    self.value = value
    self._key = (value.shape, value.dtype.str, value.tobytes())

  def __hash__(self):
    return hash(self._key)

  def __eq__(self, other):
    return isinstance(other, _Static) and self._key == other._key


def stage_select(
    x: jax.Array, payload: jax.Array | None, geom: Geometry, axis: int, later: int,
    init: np.ndarray, kind: Kind, offset_dtype,
) -> tuple[jax.Array, jax.Array]:
  """:func:`nnx_pool._select.stage_arg_select` (values and combined offsets), differentiable in
  ``x``: each output's tangent is that of this stage's winning tap."""
  return _stage_select(x, payload, geom, axis, later, _Static(init), kind, offset_dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5, 6, 7))
def _stage_select(x, payload, geom, axis, later, init, kind, offset_dtype):
  best, combined, _ = stage_arg_select(x, payload, geom, axis, later, init.value, kind,
                                       offset_dtype)
  return best, combined


@_stage_select.defjvp
def _stage_select_jvp(geom, axis, later, init, kind, offset_dtype, primals, tangents):
  x, payload = primals
  t, _ = tangents
  best, combined, arg = stage_arg_select(x, payload, geom, axis, later, init.value, kind,
                                         offset_dtype)
  return (best, combined), (gather(t, geom, arg), np.zeros(combined.shape, jax.dtypes.float0))


def _take_plane(t: jax.Array, index: jax.Array) -> jax.Array:
  """``t[n, index[n, ..., c], c]``: cells of each (n, c) plane at flat per-plane indices.

  One index per plane (a global max) selects with a mask and a sum over the
  plane rather than a gather: with the plane sharded over devices that is a
  plain all-reduce, where a gather's output sharding would be ambiguous. The
  sum is exact (one term is not zero) but for the sign of a zero: a selected
  -0.0 comes back as +0.0.
  """
  n, c = t.shape[0], t.shape[-1]
  plane, picks = math.prod(t.shape[1:-1]), math.prod(index.shape[1:-1])
  flat_t, flat_index = t.reshape(n, plane, c), index.reshape(n, picks, c)  # not -1: N, C may be 0
  if picks == 1:
    cell = lax.broadcasted_iota(jnp.int32, flat_t.shape, 1)
    flat = jnp.sum(jnp.where(cell == flat_index, flat_t, jnp.zeros((), t.dtype)), axis=1,
                   keepdims=True)
  else:
    flat = jnp.take_along_axis(flat_t, flat_index, axis=1)
  return flat.reshape(index.shape)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def bins_select(
    x: jax.Array, out_shape: tuple[int, ...], kind: Kind
) -> tuple[jax.Array, jax.Array]:
  """:func:`nnx_pool._select.arg_extremum_over_bins`, whose derivative is the indexed cell's."""
  return arg_extremum_over_bins(x, out_shape, kind)


@bins_select.defjvp
def _bins_select_jvp(out_shape, kind, primals, tangents):
  (x,), (t,) = primals, tangents
  _, index = arg_extremum_over_bins(x, out_shape, kind)
  # Values picked at the index, so that higher derivatives follow it too.
  values = _take_plane(x, index)
  return (values, index), (_take_plane(t, index), np.zeros(index.shape, jax.dtypes.float0))
