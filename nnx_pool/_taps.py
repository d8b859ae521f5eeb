"""What each window tap reads: strided views of the input, in row-major window order.

A window of ``k`` taps is unrolled into ``k`` strided views of the input, one per
window offset, and XLA fuses them and the elementwise reduction over them into one
loop. Each view is spelt one of two ways (:func:`taps`): a stride phase shifted by
a small pad, which XLA CPU fuses when the views have one consumer (sums, a max or
min without offsets), or a slice of one shared padded copy, when they feed both the
values and the window offsets (a differentiated max or min, or ``return_indices``).
XLA CPU computes those two in separate loops and materialises the padded copy, so
for the gradient, where only the first windows of a dim reach padding (the ResNet
stem's 3x3/2 pad 1 on an even map), the outputs are split into boxes
(:func:`boxes`): the interior reads plain strided slices of the input, which both
loops read in place, and only the thin borders pad a slab of their own.

A window sum on a large map is split the same way on the CPU (:func:`sum_taps`): its
interior reads strided slices of the input, which XLA:CPU loops over without checking
the bounds of a pad at every element.

The adaptive pools' bins are read the same way, as slots (:func:`bin_slots`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._geometry import DimGeometry, Geometry, adaptive_bins
from ._jit import may_split_space


def _tap_phases(d: DimGeometry) -> list[tuple[int, int, int]]:
  """Per window tap along one dim: ``(phase, low, high)``.

  Tap ``j`` of output ``q`` reads input ``q * stride + j * dilation - pad_low``,
  which is element ``q + shift`` of the stride phase ``x[phase::stride]``
  (``shift`` and ``phase`` the floor quotient and remainder of
  ``j * dilation - pad_low`` by the stride). The tap is that phase padded by
  ``low = -shift`` and ``high`` cells (negative: cropped) to ``out`` cells.
  """
  result = []
  for j in range(d.window):
    shift, phase = divmod(j * d.dilation - d.pad_low, d.stride)
    cells = -(-(d.length - phase) // d.stride)  # len(x[phase::stride])
    result.append((phase, -shift, d.out - cells + shift))
  return result


def taps(x: jax.Array, geom: Geometry, value, *, shared_pad: bool) -> Iterator[jax.Array]:
  """Yields what each window tap reads, in row-major tap order, shape ``(N, *out, C)``.

  Two spellings of the same arrays, ``value`` where a tap reads padding:

  * ``shared_pad=False``: a stride phase of the unpadded input, shifted into
    place by a small pad (or crop). When each tap has one consumer XLA CPU fuses
    these pads into it, and no padded copy of the input is materialised.
  * ``shared_pad=True``: strided slices of one padded copy of the input. When
    the taps feed two computations (the values and the window offsets of a
    differentiated max), XLA would materialise every shifted phase above, one
    input-sized array per tap; one shared padded copy is then far cheaper.

  Which to use where was measured (docs/benchmarks.md).
  """
  fill = jnp.asarray(value, x.dtype)
  if shared_pad:
    if any(lo or hi for lo, hi in geom.pads):
      config = [(0, 0, 0), *((lo, hi, 0) for lo, hi in geom.pads), (0, 0, 0)]
      x = lax.pad(x, fill, config)
    for offset in itertools.product(*(range(d.window) for d in geom.dims)):
      start = (0, *(j * d.dilation for j, d in zip(offset, geom.dims, strict=True)), 0)
      ends = (s + (d.out - 1) * d.stride + 1 for s, d in zip(start[1:-1], geom.dims, strict=True))
      limit = (x.shape[0], *ends, x.shape[-1])
      yield lax.slice(x, start, limit, (1, *(d.stride for d in geom.dims), 1))
    return
  for combo in itertools.product(*(_tap_phases(d) for d in geom.dims)):
    # A phase may start past the end (ceil mode, a stride over L + 1): an empty slice.
    firsts = (min(phase, d.length) for (phase, _, _), d in zip(combo, geom.dims, strict=True))
    start = (0, *firsts, 0)
    view = lax.slice(x, start, x.shape, (1, *(d.stride for d in geom.dims), 1))
    if any(low or high for _, low, high in combo):
      config = [(0, 0, 0), *((low, high, 0) for _, low, high in combo), (0, 0, 0)]
      view = lax.pad(view, fill, config)
    yield view


def _low_border(d: DimGeometry) -> int | None:
  """How many first windows of ``d`` start in padding; None if a window reaches past the end."""
  first = d.first_real_tap()
  if (first + d.real_count() < d.window).any():
    return None
  return int(np.count_nonzero(first))


def boxes(geom: Geometry) -> list[tuple[tuple[int, int], ...]] | None:
  """Output boxes, ``[q0, q1)`` per dim, that partition the output; None if they do not apply.

  The low border of each dim in turn, over the interior of the dims before it
  and all of the dims after it, then the interior, where every tap of every
  window reads a real cell: at most ``ndim + 1`` boxes. None when no window
  starts in padding (the taps are strided slices of the input already) or one
  reaches past the input's end (see :func:`nnx_pool._select.arg_select_boxes`).
  """
  low = [_low_border(d) for d in geom.dims]
  if None in low or not any(low):
    return None
  inner = [(a, d.out) for a, d in zip(low, geom.dims, strict=True)]
  result = [(*inner[:axis], (0, a), *((0, d.out) for d in geom.dims[axis + 1:]))
            for axis, a in enumerate(low)]
  result.append(tuple(inner))
  # `None in low` returned above; pyright does not narrow the list's entries from it.
  return [box for box in result if all(q1 > q0 for q0, q1 in box)]  # pyright: ignore[reportReturnType, reportOperatorIssue]


def box_input(
    x: jax.Array, geom: Geometry, box: tuple[tuple[int, int], ...]
) -> tuple[jax.Array, Geometry]:
  """The input cells that a box of outputs reads, and the box's windows over them.

  The slab is a slice of ``x``; its geometry pads it by what the box's taps
  reach past the input, so an interior box reads plain strided slices of ``x``.
  """
  dims, start, limit = [], [0], [x.shape[0]]
  for (q0, q1), d in zip(box, geom.dims, strict=True):
    first = q0 * d.stride - d.pad_low
    end = (q1 - 1) * d.stride + d.effective_window - d.pad_low
    lo, hi = max(first, 0), min(end, d.length)
    dims.append(DimGeometry(hi - lo, d.window, d.stride, d.dilation, lo - first, end - hi,
                            q1 - q0))
    start.append(lo)
    limit.append(hi)
  start.append(0)
  limit.append(x.shape[-1])
  return lax.slice(x, start, limit), Geometry(tuple(dims))


def box_mask(geom: Geometry, box: tuple[tuple[int, int], ...]) -> jax.Array:
  """Whether each output position lies in ``box``, shape ``(1, *out, 1)``."""
  inside = None
  ndim = len(geom.dims) + 2
  for axis, ((q0, q1), d) in enumerate(zip(box, geom.dims, strict=True), start=1):
    shape = [1] * ndim
    shape[axis] = d.out
    pos = lax.broadcasted_iota(jnp.int32, tuple(shape), axis)
    here = (pos >= q0) & (pos < q1)
    inside = here if inside is None else inside & here
  return inside  # pyright: ignore[reportReturnType]  # not None: there is at least one dim


def _sum_padded_taps(x: jax.Array, geom: Geometry) -> jax.Array:
  """Sum of every window (zero padding), tap by tap, each tap a phase shifted by a pad."""
  total = None
  for tap in taps(x, geom, 0, shared_pad=False):  # one consumer, also when differentiated
    total = tap if total is None else total + tap
  return total  # pyright: ignore[reportReturnType]  # not None: a window has at least one tap


def _segments(d: DimGeometry) -> list[tuple[int, int]]:
  """The outputs of one dim split where their windows leave the input: ``[0, a)`` start in
  the low padding, ``[a, b)`` read real cells only, ``[b, out)`` reach past the end."""
  a = min(d.out, -(-d.pad_low // d.stride))
  b = max(a, min(d.out, (d.length - 1 + d.pad_low - (d.effective_window - 1)) // d.stride + 1))
  return [(q0, q1) for q0, q1 in ((0, a), (a, b), (b, d.out)) if q1 > q0]


# The fewest output positions (per image and channel) for which a window sum is split into
# boxes (:func:`sum_taps`): below it the boxes' compile time (up to 3**ndim boxes, each
# unrolled) outweighs what they save; 16 x 16 maps compile in 0.1 s either way.
BOX_MIN_POSITIONS = 32 * 32


def splits_boxes(x: jax.Array, out_shape: tuple[int, ...]) -> bool:
  """Whether a kernel reading ``x`` splits its ``out_shape`` outputs into boxes by default:
  on the CPU backend, for maps of at least :data:`BOX_MIN_POSITIONS` outputs that devices
  do not split in space."""
  return (jax.default_backend() == "cpu" and math.prod(out_shape) >= BOX_MIN_POSITIONS
          and not may_split_space(x))


def sum_taps(x: jax.Array, geom: Geometry, split: bool | None = None) -> jax.Array:
  """Sum of every window (zero padding), tap by tap, shape ``(N, *geom.out_shape, C)``.

  With ``split`` the outputs are split into boxes, per dim those whose windows start in the
  low padding, read real cells only, or reach past the end, joined by concatenation: the
  interior's taps are strided slices of the input, and only the thin borders pad a slab of
  their own. XLA:CPU checks the bounds of a pad fused into a loop at every element it
  writes: the nine padded taps of AvgPool 3x3/1 pad 1 took 3x the time of the boxes on
  (8, 112, 112, 64) (docs/benchmarks.md). Both spellings add the same taps in the same
  order. ``split`` None: on the CPU backend, for maps of at least
  :data:`BOX_MIN_POSITIONS` outputs that devices do not split in space
  (:func:`nnx_pool._jit.may_split_space`: a concatenation along a split dim is moved with
  all-to-all exchanges, where the padded taps need halo exchanges only).
  """
  per_dim = [_segments(d) for d in geom.dims]
  if split is None:
    split = splits_boxes(x, geom.out_shape)
  if not split or all(len(segments) == 1 for segments in per_dim):
    return _sum_padded_taps(x, geom)

  def join(axis: int, box: tuple[tuple[int, int], ...]) -> jax.Array:
    if axis == len(per_dim):
      return _sum_padded_taps(*box_input(x, geom, box))
    parts = [join(axis + 1, (*box, segment)) for segment in per_dim[axis]]
    return parts[0] if len(parts) == 1 else lax.concatenate(parts, axis + 1)

  return join(0, ())


def bin_slots(a: jax.Array, axis: int, length: int, out: int):
  """Splits ``axis`` of ``a`` into ``(out, K)`` bin slots; ``K`` is the longest bin.

  Returns ``(grouped, start, end, valid)``: the grouped array (one more axis,
  right after ``axis``), each bin's ``[start, end)`` and a ``(out, K)`` mask of
  the slots that hold a cell of their bin. A divisible dim is a plain reshape
  with every slot valid (mask None); otherwise a gather whose surplus slots repeat the
  bin's last cell.
  """
  start, end = adaptive_bins(length, out)
  if length % out == 0:
    k = length // out
    shape = a.shape[:axis] + (out, k) + a.shape[axis + 1:]
    return a.reshape(shape), start, end, None
  k = int((end - start).max())
  slots = np.minimum(start[:, None] + np.arange(k)[None, :], end[:, None] - 1)
  valid = start[:, None] + np.arange(k)[None, :] < end[:, None]
  return jnp.take(a, slots, axis=axis), start, end, valid


def along(vector: np.ndarray, axis: int, ndim: int) -> np.ndarray:
  """Reshapes a 1-D ``vector`` to broadcast along ``axis`` of a rank-``ndim`` array."""
  shape = [1] * ndim
  shape[axis] = vector.shape[0]
  return vector.reshape(shape)
