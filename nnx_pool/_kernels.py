"""Windowed reductions as sums and selects over strided taps, with fast adjoints.

Forward: a window of ``k`` taps is unrolled into ``k`` strided views of the
input, one per window offset in row-major window order, and XLA fuses them and
the elementwise reduction over them into one loop. Each view is spelt one of
two ways (:func:`taps`): a stride phase shifted by a small pad, which XLA CPU
fuses when the views have one consumer (sums, a max or min without offsets),
or a slice of one shared padded copy, when they feed both the values and the
window offsets (a differentiated max or min, or ``return_indices``). XLA CPU
computes those two in separate loops and materialises the padded copy, so for
the gradient, where only the first windows of a dim reach padding (the ResNet
stem's 3x3/2 pad 1 on an even map), the outputs are split into boxes
(:func:`_arg_select_boxes`): the interior reads plain strided slices of the
input, which both loops read in place, and only the thin borders pad a slab.

Backward: the adjoint of "gather every tap" is "scatter every output back to
its taps". Written naively (the transpose of a strided slice is a pad with
interior zeros) XLA materialises one input-sized array per tap. Instead
:func:`_scatter` splits the input into stride phases: the cells ``p`` with
``p % s == r`` receive from exactly the taps ``j`` with ``j * d % s == r``, each
through a *unit-stride* shift of the cotangent. Each phase is placed on its
cells by a pad with interior ``stride - 1``, and the disjoint placements are
added in one fused loop over the input (windows that tile the input stack and
reshape instead); pads partition with halo exchanges, so a spatially sharded
input keeps its sharding in the gradient.

Both reductions carry a ``jax.custom_jvp`` whose tangent map is the linear
transpose of :func:`_scatter`; reverse mode transposes it back, so ``jax.grad``
runs the phase scatter while ``jax.jvp``, ``jax.hessian`` and higher orders keep
working. For max/min the scatter is masked by the winning window offset, so the
gradient lands exactly on the element the indices report.

Large windows (more than :data:`UNROLL_LIMIT` taps) are decomposed separably,
one spatial dim at a time, so the op count (and compile time) grows with
``sum(window)`` instead of ``prod(window)``. Each stage is a 1-D window over one
dim, a :class:`Geometry` whose other dims are identity windows (window 1,
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

The entry points (:func:`kernel`) are jitted with the geometry static, so eager
calls run one compiled program per shape instead of one dispatch per tap, and
each runs under ``jax.named_scope("nnx_pool.<name>")``, so that profiles and
HLO metadata name it.

One rule picks a max or min everywhere, PyTorch's scan ``val > best or
isnan(val)`` (:func:`replaces`): the window kernels apply it tap by tap, and
:func:`arg_extremum` is the same rule as a reduction over an axis, for the
adaptive pools; :func:`extremum` is its value alone, for the gates.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from nnx_pool._geometry import DimGeometry, Geometry
from nnx_pool._jit import kernel
from nnx_pool._numerics import accumulation_dtype, spatial_mean, true_divide  # noqa: F401
from nnx_pool._select import Kind, arg_extremum, extremum, identity, replaces  # noqa: F401

# Windows with more taps than this are decomposed one spatial dim at a time.
UNROLL_LIMIT = 64
# The most taps a values-only max (min) reads through per-tap pads (``taps(...,
# shared_pad=False)``). Above it they read one shared padded copy instead: XLA:CPU of
# jax 0.7 takes time exponential in the tap count to compile the per-tap spelling of a
# strided, padded chain of selects (12 taps 0.5 s, 18 taps 8 s, 16 and 27 over 10 min).
PER_TAP_PAD_LIMIT = 9


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


def offset_dtype_for(geom: Geometry) -> jnp.dtype:
  """int8 window offsets when they fit (less memory traffic for the backward), else int32."""
  if geom.size > 2**31 - 1:
    raise ValueError(
        f"A max or min pool window reaching {geom.size} cells of the input is past what its "
        "int32 window offsets (kept for the gradient) address, 2**31 - 1 cells; pool tiles "
        "of the map, then pool the results."
    )
  return jnp.dtype(jnp.int8 if geom.size <= 127 else jnp.int32)


def _arg_select(
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
    arg = jnp.where(better, jnp.asarray(j, offset_dtype), arg)
  return best, arg


def _low_border(d: DimGeometry) -> int | None:
  """How many first windows of ``d`` start in padding; None if a window reaches past the end."""
  first = d.first_real_tap()
  if (first + d.real_count() < d.window).any():
    return None
  return int(np.count_nonzero(first))


def _boxes(geom: Geometry) -> list[tuple[tuple[int, int], ...]] | None:
  """Output boxes, ``[q0, q1)`` per dim, that partition the output; None if they do not apply.

  The low border of each dim in turn, over the interior of the dims before it
  and all of the dims after it, then the interior, where every tap of every
  window reads a real cell: at most ``ndim + 1`` boxes. None when no window
  starts in padding (the taps are strided slices of the input already) or one
  reaches past the input's end (see :func:`_arg_select_boxes`).
  """
  low = [_low_border(d) for d in geom.dims]
  if None in low or not any(low):
    return None
  inner = [(a, d.out) for a, d in zip(low, geom.dims, strict=True)]
  boxes = [(*inner[:axis], (0, a), *((0, d.out) for d in geom.dims[axis + 1:]))
           for axis, a in enumerate(low)]
  boxes.append(tuple(inner))
  return [box for box in boxes if all(q1 > q0 for q0, q1 in box)]


def _box_input(
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


def _box_mask(geom: Geometry, box: tuple[tuple[int, int], ...]) -> jax.Array:
  """Whether each output position lies in ``box``, shape ``(1, *out, 1)``."""
  inside = None
  ndim = len(geom.dims) + 2
  for axis, ((q0, q1), d) in enumerate(zip(box, geom.dims, strict=True), start=1):
    shape = [1] * ndim
    shape[axis] = d.out
    pos = lax.broadcasted_iota(jnp.int32, tuple(shape), axis)
    here = (pos >= q0) & (pos < q1)
    inside = here if inside is None else inside & here
  return inside


def _arg_select_boxes(x: jax.Array, geom: Geometry, kind: Kind) -> tuple[jax.Array, jax.Array]:
  """:func:`_arg_select`, box by box (:func:`_boxes`): the same values and offsets.

  Values and offsets are two loops for XLA:CPU (no multi-output fusion), so the
  taps have two consumers and are not fused into both: per-tap pads would each
  be materialised, and one padded copy of the input (``shared_pad``) is
  materialised too. Here the interior's taps are strided slices of the input,
  which XLA reads in place from both loops, and only the thin borders pad a
  slab of their own. Each box's results are padded to the output and selected
  by the box's mask: pads and selects, which keep a spatial sharding.
  """
  boxes = _boxes(geom)
  if boxes is None:
    # No window starts in padding: the taps are strided slices of x already. A window
    # reaches past the end: that high border's slab would be a slice at the far end
    # of its dim, which the SPMD partitioner moves with an all-reduce when that dim
    # is split over devices; such windows read one padded copy instead.
    return _arg_select(x, geom, kind, shared_pad=True)
  fill = identity(x.dtype, kind)
  values = arg = None
  for box in boxes:
    slab, sub = _box_input(x, geom, box)
    v, a = _arg_select(slab, sub, kind, shared_pad=True)
    config = [(0, 0, 0), *((q0, d.out - q1, 0) for (q0, q1), d in zip(box, geom.dims,
                                                                          strict=True)), (0, 0, 0)]
    v = lax.pad(v, jnp.asarray(fill, v.dtype), config)
    a = lax.pad(a, jnp.zeros((), a.dtype), config)
    if values is None:
      values, arg = v, a
    else:
      inside = _box_mask(geom, box)
      values, arg = jnp.where(inside, v, values), jnp.where(inside, a, arg)
  return values, arg


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
  """:func:`_scatter` of a sum whose windows tile the input (each cell in at most one).

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


def _scatter(ct: jax.Array, geom: Geometry, arg: jax.Array | None = None) -> jax.Array:
  """Adjoint of the tap gather: adds each output's ``ct`` to the input cells of its taps.

  With ``arg`` (window offsets), only the winning tap of each output receives.
  Linear in ``ct``; returns an array of the input's shape ``(N, *in, C)``.
  """
  if arg is None and geom.size > 4 and _is_tiling(geom):
    return _scatter_tiles(ct, geom)
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
  return total


def _gather(t: jax.Array, geom: Geometry, arg: jax.Array | None = None) -> jax.Array:
  """The tangent map: the transpose of :func:`_scatter`, applied to an input tangent."""
  out = jax.ShapeDtypeStruct((t.shape[0], *geom.out_shape, t.shape[-1]), t.dtype)
  (t_out,) = jax.linear_transpose(lambda ct: _scatter(ct, geom, arg), out)(t)
  return t_out


def _sum_taps(x: jax.Array, geom: Geometry) -> jax.Array:
  total = None
  for tap in taps(x, geom, 0, shared_pad=False):  # one consumer, also when differentiated
    total = tap if total is None else total + tap
  return total


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _window_sum(x: jax.Array, geom: Geometry) -> jax.Array:
  return _sum_taps(x, geom)


@_window_sum.defjvp
def _window_sum_jvp(geom, primals, tangents):
  (x,), (t,) = primals, tangents
  return _sum_taps(x, geom), _gather(t, geom)


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


def _separable_sum(x: jax.Array, geom: Geometry) -> jax.Array:
  """:func:`_window_sum` as one 1-D window sum per spatial dim, first to last."""
  spatial = geom.in_shape
  for axis, d in enumerate(geom.dims):
    if _is_identity(d):
      continue
    x = _window_sum(x, _stage(geom, axis, spatial))
    spatial = (*spatial[:axis], d.out, *spatial[axis + 1:])
  return x


def _reduce_window(x: jax.Array, geom: Geometry, init, op) -> jax.Array:
  """XLA's ``reduce_window`` over the same windows (the ``"xla"`` implementation)."""
  one = (1,)
  return lax.reduce_window(
      x, np.asarray(init, x.dtype), op, one + geom.window + one,
      one + tuple(d.stride for d in geom.dims) + one, ((0, 0), *geom.pads, (0, 0)),
      window_dilation=one + tuple(d.dilation for d in geom.dims) + one)


@kernel(static_argnums=(1, 2))
def window_sum(x: jax.Array, geom: Geometry, implementation: str = "taps") -> jax.Array:
  """Sum of every window (zero padding), shape ``(N, *geom.out_shape, C)``.

  Windows over :data:`UNROLL_LIMIT` taps are summed one spatial dim at a time.
  ``implementation="xla"`` sums with XLA's ``reduce_window`` instead (see
  :mod:`nnx_pool._backend`).
  """
  if implementation == "xla":
    return _reduce_window(x, geom, 0, lax.add)
  if geom.size > UNROLL_LIMIT:
    return _separable_sum(x, geom)
  return _window_sum(x, geom)


def _select_forward(
    x: jax.Array, geom: Geometry, kind: Kind, with_offsets: bool
) -> tuple[jax.Array, jax.Array]:
  """The undifferentiated arg-select: its taps read one padded copy when both outputs are
  used or the window is over :data:`PER_TAP_PAD_LIMIT` taps, else per-tap pads (XLA drops
  the unused offsets). The results are the same.

  (Box by box, :func:`_arg_select_boxes`, is the gradient's spelling: here the flat
  indices would be the offsets' one consumer, and XLA fuses the boxes' tap chains into
  the index arithmetic, measured 20 ms against 4 at the ResNet stem's shape.)
  """
  return _arg_select(x, geom, kind, shared_pad=with_offsets or geom.size > PER_TAP_PAD_LIMIT)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def _window_select(
    x: jax.Array, geom: Geometry, kind: Kind, with_offsets: bool
) -> tuple[jax.Array, jax.Array]:
  # Undifferentiated: the offsets are computed only when asked for.
  return _select_forward(x, geom, kind, with_offsets)


@_window_select.defjvp
def _window_select_jvp(geom, kind, with_offsets, primals, tangents):
  (x,), (t,) = primals, tangents
  values, arg = _arg_select_boxes(x, geom, kind)  # the tangent needs the offsets
  return (values, arg), (_gather(t, geom, arg), np.zeros(arg.shape, jax.dtypes.float0))


def _stage_select(
    x: jax.Array, payload: jax.Array | None, geom: Geometry, axis: int, later: int,
    init: np.ndarray, kind: Kind, offset_dtype,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Forward of one separable arg-select stage: a 1-D window along ``axis``.

  ``geom`` is the stage geometry (identity windows off ``axis``), ``payload``
  the combined offset over the later dims (``None`` for the first stage),
  ``later`` the product of the later dims' windows, and ``init`` the static
  combined offset of each window's first real cell over this and the later
  dims (broadcast over the earlier dims). Same rule as :func:`_arg_select`:
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


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5, 6, 7))
def _stage_select_diff(x, payload, geom, axis, later, init, kind, offset_dtype):
  best, combined, _ = _stage_select(x, payload, geom, axis, later, init.value, kind, offset_dtype)
  return best, combined


@_stage_select_diff.defjvp
def _stage_select_jvp(geom, axis, later, init, kind, offset_dtype, primals, tangents):
  x, payload = primals
  t, _ = tangents
  best, combined, arg = _stage_select(x, payload, geom, axis, later, init.value, kind, offset_dtype)
  return (best, combined), (_gather(t, geom, arg), np.zeros(combined.shape, jax.dtypes.float0))


class _Static:
  """A hashable wrapper for a static NumPy array (a nondiff custom_jvp argument)."""

  def __init__(self, value: np.ndarray):
    self.value = value
    self._key = (value.shape, value.dtype.str, value.tobytes())

  def __hash__(self):
    return hash(self._key)

  def __eq__(self, other):
    return isinstance(other, _Static) and self._key == other._key


def _separable_select(
    x: jax.Array, geom: Geometry, kind: Kind, differentiable: bool,
) -> tuple[jax.Array, jax.Array]:
  """:func:`_arg_select` as one 1-D arg-select per spatial dim, last to first."""
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
        x, payload = _stage_select_diff(
            x, payload, stage, axis, later, _Static(init), kind, offset_dtype)
      else:
        x, payload, _ = _stage_select(x, payload, stage, axis, later, init, kind, offset_dtype)
    later *= d.window
    spatial = (*spatial[:axis], d.out, *spatial[axis + 1:])
  if payload is None:  # every window is a single tap
    payload = jnp.zeros(x.shape, offset_dtype)
  return x, payload


@kernel(static_argnums=(1, 2, 3, 4))
def select(
    x: jax.Array, geom: Geometry, kind: Kind, with_offsets: bool = True,
    implementation: str = "taps",
) -> tuple[jax.Array, jax.Array | None]:
  """Max (min) of every window and the row-major window offset it came from.

  For floats, differentiable in ``x`` in forward and reverse mode, to any
  order: each output's derivative is that of its winning input element. Integer
  inputs get the plain forward. Windows over :data:`UNROLL_LIMIT` taps are
  reduced one spatial dim at a time. ``with_offsets=False`` says the caller
  drops the offsets (they are still returned): only how the taps are spelt
  for XLA changes, never a result.
  """
  if implementation == "xla" and not with_offsets and all(d.dilation == 1 for d in geom.dims):
    # XLA's own max (min), differentiated by JAX: no window offsets (None). JAX has no
    # gradient for a dilated one, which therefore stays on the taps.
    return _reduce_window(x, geom, identity(x.dtype, kind),
                          lax.max if kind == "max" else lax.min), None
  floating = jnp.issubdtype(x.dtype, jnp.floating)
  if geom.size > UNROLL_LIMIT:
    return _separable_select(x, geom, kind, differentiable=floating)
  if floating:
    return _window_select(x, geom, kind, with_offsets)
  return _select_forward(x, geom, kind, with_offsets)


@kernel(static_argnums=1)
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
