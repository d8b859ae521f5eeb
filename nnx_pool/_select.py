"""PyTorch's rule for choosing a max or min, and where the chosen element lies.

One rule picks a max or min everywhere, PyTorch's scan ``val > best or isnan(val)``
(:func:`replaces`): strictly better replaces, so ties keep the first; any NaN
replaces, so NaN propagates and the last NaN wins. Padding holds :func:`identity`,
which never replaces anything. The rule is applied

* tap by tap over a window (:func:`arg_select`, with the window offset of the
  winner; :func:`arg_select_boxes` box by box, the gradient's spelling), or over
  one dim of a separable window with the offset over the later dims as a payload
  (:func:`stage_arg_select`);
* as a reduction over an axis (:func:`arg_extremum`; :func:`extremum` is its value
  alone, for the gates), stage by stage over the adaptive pools' bins
  (:func:`arg_extremum_over_bins`).

Where the winner lies is PyTorch's flat per-plane index, ``h * W + w`` in 2-D:
:func:`flat_indices` turns window offsets into it, and
:func:`arg_extremum_over_bins` builds it stage by stage.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from ._geometry import Geometry
from ._jit import scoped
from ._taps import along, bin_slots, box_input, box_mask, boxes, taps

Kind = Literal["max", "min"]

# What a max or min module returns: the values, or with return_indices=True the pair
# (values, indices). The modules are generic in it (MaxPool[jax.Array] or
# MaxPool[ValuesAndIndices]), their __init__ overloads pick it from a literal return_indices,
# and a bare MaxPool means MaxPool[jax.Array]: PEP 696's default, which typing.TypeVar takes
# from Python 3.13 only, so type checkers read typing_extensions' (a dependency of flax).
ValuesAndIndices = tuple[jax.Array, jax.Array]
if TYPE_CHECKING:
  from typing_extensions import TypeVar

  Out = TypeVar("Out", default=jax.Array)
else:
  from typing import TypeVar

  Out = TypeVar("Out")


def identity(dtype, kind: Kind):
  """The padding value of a max (min) pool: the dtype's lowest (highest) value.

  -inf (+inf) for floats that hold it. Floats without infinities (float8
  ``e4m3fn``, the ``fnuz`` family, ``e8m0fnu``, ``float4_e2m1fn``) cast inf to NaN,
  which would win every padded window: they get their finite extreme, as integers
  do. A real cell equal to it ties with the padding and keeps its index, since the
  scan starts at the window's first real cell.
  """
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.floating):
    if np.isinf(np.array(np.inf).astype(dtype)):
      return -np.inf if kind == "max" else np.inf
    info = jnp.finfo(dtype)
  else:
    info = jnp.iinfo(dtype)
  return info.min if kind == "max" else info.max


def replaces(candidate: jax.Array, best: jax.Array, kind: Kind) -> jax.Array:
  """PyTorch's scan rule: ``candidate`` replaces the running ``best`` when better or NaN.

  Strictly better (``>`` for max, ``<`` for min), so ties keep the first; any NaN
  replaces, so NaN propagates and the last NaN wins.
  """
  better = (lax.gt if kind == "max" else lax.lt)(candidate, best)
  if jnp.issubdtype(candidate.dtype, jnp.floating):
    better = better | jnp.isnan(candidate)
  return better


def extremum(x: jax.Array, axis, kind: Kind, *, keepdims: bool = False) -> jax.Array:
  """``jnp.max`` (``jnp.min``) over ``axis`` with NaN propagated; ties share the gradient.

  NaN is propagated explicitly: on CPU, jaxlib 0.10.2 lowers some float
  ``reduce_max`` calls to a YNNPACK fusion that drops NaN (even returning -inf).
  """
  best = (jnp.max if kind == "max" else jnp.min)(x, axis=axis, keepdims=keepdims)
  if jnp.issubdtype(x.dtype, jnp.floating):
    best = jnp.where(jnp.any(jnp.isnan(x), axis=axis, keepdims=keepdims),
                     jnp.asarray(jnp.nan, best.dtype), best)
  return best


def arg_extremum(x: jax.Array, axis: int, kind: Kind, *,
                 valid: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """:func:`replaces` as a reduction over ``axis``: the extremum and its slot (int32).

  The slot is the first extremum along ``axis``, or the last NaN when there is
  one, as the scan would leave it; plain min/max reductions, which fuse, not a
  scan or an argmax. ``valid`` (broadcastable to ``x``): the slots that may win, the
  others holding :func:`identity` (so a valid cell equal to it still wins); none
  valid gives the slot ``x.shape[axis]``.
  """
  k = x.shape[axis]
  slot = lax.broadcasted_iota(jnp.int32, x.shape, axis)
  best = extremum(x, axis, kind)
  ties = x == jnp.expand_dims(best, axis)
  winner = jnp.min(jnp.where(ties if valid is None else ties & valid, slot, k), axis=axis)
  if jnp.issubdtype(x.dtype, jnp.floating):
    nan = jnp.isnan(x)
    winner = jnp.where(jnp.any(nan, axis=axis), jnp.max(jnp.where(nan, slot, -1), axis=axis),
                       winner)
  return best, winner


# The most taps a values-only max (min) reads through per-tap pads (``taps(...,
# shared_pad=False)``). Above it they read one shared padded copy instead: XLA:CPU of
# jax 0.7 takes time exponential in the tap count to compile the per-tap spelling of a
# strided, padded chain of selects (12 taps 0.5 s, 18 taps 8 s, 16 and 27 over 10 min).
PER_TAP_PAD_LIMIT = 9


def offset_dtype_for(geom: Geometry) -> jnp.dtype:
  """int8 window offsets when they fit (less memory traffic for the backward), else int32."""
  if geom.size > 2**31 - 1:
    raise ValueError(
        f"A max or min pool window reaching {geom.size} cells of the input is past what its "
        "int32 window offsets (kept for the gradient) address, 2**31 - 1 cells; pool tiles "
        "of the map, then pool the results."
    )
  return jnp.dtype(jnp.int8 if geom.size <= 127 else jnp.int32)


def arg_select(
    x: jax.Array, geom: Geometry, kind: Kind, *, shared_pad: bool
) -> tuple[jax.Array, jax.Array]:
  """Forward of the arg-extremum: values and the winning window offset (int32).

  PyTorch's rule over the real cells of each window, in row-major order: the
  running best starts at the identity with the window's first real cell, and a
  tap replaces it when ``tap > best or isnan(tap)`` (``<`` for min). Ties keep
  the first extremum; NaN propagates, and the last NaN wins. Padding holds the
  identity, so it never replaces anything.
  """
  offset_dtype = offset_dtype_for(geom)
  best = arg = None
  for j, tap in enumerate(taps(x, geom, identity(x.dtype, kind), shared_pad=shared_pad)):
    if best is None:
      best = tap
      first = geom.first_real_offset() if geom.needs_real_offset else np.zeros((), np.int64)
      arg = jnp.broadcast_to(
          jnp.asarray(first, offset_dtype).reshape((1, *first.shape, 1) if first.ndim else ()),
          tap.shape,
      )
      continue
    better = replaces(tap, best, kind)
    best = jnp.where(better, tap, best)
    # arg is set with best, at the first tap; pyright does not pair the two.
    arg = jnp.where(better, jnp.asarray(j, offset_dtype), arg)  # pyright: ignore[reportArgumentType]
  return best, arg  # pyright: ignore[reportReturnType]  # not None: a window has a tap


def arg_select_boxes(x: jax.Array, geom: Geometry, kind: Kind) -> tuple[jax.Array, jax.Array]:
  """:func:`arg_select`, box by box (:func:`nnx_pool._taps.boxes`): the same values and offsets.

  Values and offsets are two loops for XLA:CPU (no multi-output fusion), so the
  taps have two consumers and are not fused into both: per-tap pads would each
  be materialised, and one padded copy of the input (``shared_pad``) is
  materialised too. Here the interior's taps are strided slices of the input,
  which XLA reads in place from both loops, and only the thin borders pad a
  slab of their own. Each box's results are padded to the output and selected
  by the box's mask: pads and selects, which keep a spatial sharding.
  """
  parts = boxes(geom)
  if parts is None:
    # No window starts in padding: the taps are strided slices of x already. A window
    # reaches past the end: that high border's slab would be a slice at the far end
    # of its dim, which the SPMD partitioner moves with an all-reduce when that dim
    # is split over devices; such windows read one padded copy instead.
    return arg_select(x, geom, kind, shared_pad=True)
  fill = identity(x.dtype, kind)
  values = arg = None
  for box in parts:
    slab, sub = box_input(x, geom, box)
    v, a = arg_select(slab, sub, kind, shared_pad=True)
    config = [(0, 0, 0), *((q0, d.out - q1, 0) for (q0, q1), d in zip(box, geom.dims,
                                                                          strict=True)), (0, 0, 0)]
    v = lax.pad(v, jnp.asarray(fill, v.dtype), config)
    a = lax.pad(a, jnp.zeros((), a.dtype), config)
    if values is None:
      values, arg = v, a
    else:
      inside = box_mask(geom, box)
      # arg is set with values, at the first box; pyright does not pair the two.
      values, arg = jnp.where(inside, v, values), jnp.where(inside, a, arg)  # pyright: ignore[reportArgumentType]
  return values, arg  # pyright: ignore[reportReturnType]  # not None: there is a box


def select_forward(
    x: jax.Array, geom: Geometry, kind: Kind, with_offsets: bool
) -> tuple[jax.Array, jax.Array]:
  """The undifferentiated arg-select: its taps read one padded copy when both outputs are
  used or the window is over :data:`PER_TAP_PAD_LIMIT` taps, else per-tap pads (XLA drops
  the unused offsets). The results are the same.

  (Box by box, :func:`arg_select_boxes`, is the gradient's spelling: here the flat
  indices would be the offsets' one consumer, and XLA fuses the boxes' tap chains into
  the index arithmetic, measured 20 ms against 4 at the ResNet stem's shape.)
  """
  return arg_select(x, geom, kind, shared_pad=with_offsets or geom.size > PER_TAP_PAD_LIMIT)


def stage_arg_select(
    x: jax.Array, payload: jax.Array | None, geom: Geometry, axis: int, later: int,
    init: ArrayLike, kind: Kind, offset_dtype,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Forward of one separable arg-select stage: a 1-D window along ``axis``.

  ``geom`` is the stage geometry (identity windows off ``axis``), ``payload``
  the combined offset over the later dims (``None`` for the first stage),
  ``later`` the product of the later dims' windows, and ``init`` the static
  combined offset of each window's first real cell over this and the later
  dims (broadcast over the earlier dims). Same rule as :func:`arg_select`:
  the best starts at tap 0, a tap replaces it when ``tap > best or isnan(tap)``.

  Returns:
    The values, the combined offset (``tap * later + payload``, in
    ``offset_dtype``) and this dim's winning tap (int32, for the tangent).
  """
  d = geom.dims[axis]
  value_taps = taps(x, geom, identity(x.dtype, kind), shared_pad=True)
  if payload is not None:
    payload_taps = taps(payload, geom, 0, shared_pad=True)
  best = next(value_taps)
  init = jnp.asarray(init, offset_dtype)
  if payload is None:
    combined = jnp.broadcast_to(init, best.shape)
  else:
    first_payload = next(payload_taps)
    if d.first_real_tap().any():
      # A window starting in padding starts from its first real row: if no row
      # beats the identity, that row is all identity and its payload is static.
      starts_real = (d.first_real_tap() == 0).reshape(
          (1,) * (axis + 1) + (d.out,) + (1,) * (best.ndim - axis - 2))
      combined = jnp.where(starts_real, first_payload, init)
    else:
      combined = first_payload
  tap_dtype = jnp.int32
  first_tap = d.first_real_tap().reshape(
      (1,) * (axis + 1) + (d.out,) + (1,) * (best.ndim - axis - 2))
  arg = jnp.broadcast_to(jnp.asarray(first_tap, tap_dtype), best.shape)
  for j in range(1, d.window):
    tap = next(value_taps)
    better = replaces(tap, best, kind)
    best = jnp.where(better, tap, best)
    arg = jnp.where(better, jnp.asarray(j, tap_dtype), arg)
    offset = jnp.asarray(j * later, offset_dtype)
    if payload is not None:
      offset = offset + next(payload_taps)
    combined = jnp.where(better, offset, combined)
  return best, combined, arg


@scoped
def flat_indices(arg: jax.Array, geom: Geometry) -> jax.Array:
  """Turns window offsets into PyTorch's flat per-plane input index (int32).

  ``h * W + w`` in 2-D, ``(d * H + h) * W + w`` in 3-D: no batch or channel term.
  """
  flat = jnp.zeros(arg.shape, jnp.int32)
  remaining = arg.astype(jnp.int32)
  # Unravel the row-major offset from the last window dim to the first.
  plane_stride = 1
  for axis in reversed(range(len(geom.dims))):
    d = geom.dims[axis]
    tap = remaining % d.window
    remaining = remaining // d.window
    out_pos = lax.broadcasted_iota(jnp.int32, arg.shape, axis + 1)
    coord = out_pos * d.stride - d.pad_low + tap * d.dilation
    flat = flat + coord * plane_stride
    plane_stride *= d.length
  return flat


def arg_extremum_over_bins(
    x: jax.Array, out_shape: tuple[int, ...], kind: Kind
) -> tuple[jax.Array, jax.Array]:
  """Max (min) over PyTorch's adaptive bins of a batched ``x``: values and int32 flat indices.

  Dims are reduced from the last to the first (:func:`arg_extremum` over each
  dim's bin slots); each stage keeps, per output, the extremum and the flat
  per-plane index of its cell within the dims reduced so far. The stage-wise
  winner is the box's winner: the first extremum (last NaN) in row-major order
  lies in the first row holding the extremum (the last row holding a NaN). An
  output of 1 everywhere is one stage over the whole plane.
  """
  n, spatial, c = x.shape[0], x.shape[1:-1], x.shape[-1]
  result_shape = (n, *out_shape, c)
  if all(t == 1 for t in out_shape):
    x = x.reshape(n, math.prod(spatial), c)  # not -1: N or C may be 0
    spatial, out_shape = x.shape[1:-1], (1,)
  values, index, plane_stride = x, None, 1
  for axis in reversed(range(1, x.ndim - 1)):
    length, out = spatial[axis - 1], out_shape[axis - 1]
    if length == out:
      coord = lax.broadcasted_iota(jnp.int32, values.shape, axis)
    else:
      grouped, start, end, _ = bin_slots(values, axis, length, out)
      values, slot = arg_extremum(grouped, axis + 1, kind)
      if index is not None:  # the index within the later dims, at the winning slot
        chosen = lax.broadcasted_iota(jnp.int32, grouped.shape, axis + 1) == jnp.expand_dims(
            slot, axis + 1)
        index = jnp.sum(jnp.where(chosen, bin_slots(index, axis, length, out)[0], 0),
                        axis=axis + 1)
      # A surplus slot repeats its bin's last cell (and wins only as the last NaN).
      first = jnp.asarray(along(start, axis, slot.ndim), jnp.int32)
      last = jnp.asarray(along(end - 1, axis, slot.ndim), jnp.int32)
      coord = jnp.minimum(first + slot, last)
    term = coord * plane_stride
    index = term if index is None else index + term
    plane_stride *= length
  # index is set by the first pass of the loop: there is at least one spatial dim.
  return values.reshape(result_shape), index.reshape(result_shape)  # pyright: ignore[reportOptionalMemberAccess]
