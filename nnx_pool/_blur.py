"""Anti-aliased downsampling: timm's ``BlurPool2d``, a binomial blur then a stride, channels-last.

Zhang, "Making Convolutional Networks Shift-Invariant Again", ICML 2019,
https://arxiv.org/abs/1904.11486, as timm 1.0.31 ``timm/layers/blur_pool.py``
``BlurPool2d`` computes it: the binomial filter ``C(n-1, k) / 2^(n-1)``
(``n = filter_size``), its outer product over the spatial dims, applied to each
channel alone (a depthwise convolution) with a stride, after padding every side by
timm's ``get_padding(filter_size, stride) = ((stride - 1) + (filter_size - 1)) // 2``
(``timm/layers/padding.py``) in ``pad_mode``, one of ``F.pad``'s modes:

* ``"reflect"``: mirrored without repeating the edge (``x[1], x[0] | x[0], x[1], ...``);
  the padding must be shorter than the dim, as PyTorch requires;
* ``"constant"``: zeros (timm's ``aa_layer='blurpc'``);
* ``"replicate"``: the edge repeated;
* ``"circular"``: wrapped around; at most the dim's length, as PyTorch requires.

The coefficients are the exact ratios rounded to float32: timm's values bit for bit for
every size timm builds (2 to 64), and correct up to this module's limit of 1024 taps
(:data:`MAX_FILTER_SIZE`), where float32 binomials would overflow. Padding that would make
the padded input too large for XLA to size (a huge stride in ``"constant"`` or
``"replicate"`` mode) is refused before XLA sees it.

The padding is the same on both sides, so an even filter's output differs from an odd
one's, as timm's does: ``filter_size=4`` gives ``L - 1`` outputs at stride 1 and
``L // 2 + 1`` at stride 2, where 3 gives ``L`` and ``ceil(L / 2)``. timm's filter is a
non-persistent buffer: there are no weights and no ``from_torch``.

How it is computed: the filter is separable, and each tap reads the input through its
padding, a slice of the cells the padding mirrors (:func:`blur_views`), so no padded copy is
made; the sums run in the separable order (the first dim's taps innermost) in one loop. On a
large map on the CPU the outputs are split into boxes (the interior, whose taps are plain
strided slices, and the borders, which read the padding), joined by concatenation. The
gradient places the cotangent by stride phase, one dim after another, and adds the
padding's reads back onto the cells they mirror. On the benchmark row, (8, 56, 56, 128),
3/2 reflect, this took XLA's temporaries from 25.8 and 51.2 MB (forward, forward+backward)
to 0 and 6.1 MB, and the times are in docs/benchmarks.md. Filters of more than
:data:`MAX_VIEW_TAPS` taps, and maps that devices may split in space, pad the input once
and run one strided pass per dim, whose slices the partitioner moves with halo
exchanges. The passes sum in another order than a convolution: they agree with
PyTorch's to a few float32 ULPs. float16 and bfloat16 inputs are computed in float32 and
rounded once.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from ._args import flax_names, is_int
from ._geometry import check_padded_size
from ._jit import kernel, may_split_space
from ._layout import check_in_features, check_nonempty_spatial, prepare, unbatch
from ._numerics import accumulation_dtype
from ._spatial_args import SizeLike, as_tuple, spatial_dims
from ._taps import splits_boxes
from ._torch_pad import Pads, check_pad_mode, check_torch_pads, torch_pad

# ----------------------------------------------------------------------------
# The binomial blur: one strided 1-D pass per spatial dim.
# ----------------------------------------------------------------------------


# The longest filter: the kernel takes one strided slice per tap and dim, so its program grows
# with the filter (a 1024-tap 2-D blur of a 520 x 520 map: 4.5 s to its first result on the
# 2-core CPU, 0.47 s after).
MAX_FILTER_SIZE = 1024


def binomial_filter(size: int) -> tuple[float, ...]:
  """timm's 1-D filter ``C(n-1, k) / 2^(n-1)`` as float32 values (Python floats).

  Each coefficient is the exact integer ratio correctly rounded, then rounded to float32:
  timm 1.0.31's float32 values bit for bit for every size it builds (2 to 64; from 65 its
  ``torch.tensor`` of the binomials overflows int64), and the right values beyond, where a
  float32 ``C(n-1, k)`` or ``2^(n-1)`` overflows (129 gave all zeros, 200 NaN).
  """
  scale = 2 ** (size - 1)
  coeffs = np.array([math.comb(size - 1, k) / scale for k in range(size)]).astype(np.float32)
  return tuple(float(c) for c in coeffs)


def blur_padding(filter_size: int, stride: int) -> int:
  """timm's ``get_padding(filter_size, stride)``, put on both sides of each spatial dim."""
  return ((stride - 1) + (filter_size - 1)) // 2


def _strided_sum(x: jax.Array, axis: int, coeffs: tuple[float, ...], stride: int) -> jax.Array:
  """``y[q] = sum_j coeffs[j] * x[q * stride + j]`` along ``axis``, over the windows that fit."""
  k = len(coeffs)
  out = (x.shape[axis] - k) // stride + 1
  total = None
  for j, c in enumerate(coeffs):
    tap = lax.slice_in_dim(x, j, j + (out - 1) * stride + 1, stride, axis) * jnp.asarray(
        c, x.dtype)
    total = tap if total is None else total + tap
  return total  # pyright: ignore[reportReturnType]  # not None: a filter has at least one tap


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def strided_sum(x: jax.Array, axis: int, coeffs: tuple[float, ...], stride: int) -> jax.Array:
  """:func:`_strided_sum`, whose reverse mode runs :func:`_blur_axis_adjoint` (no padding).

  JAX's own transpose of a strided slice pads the cotangent with interior zeros, one
  input-sized array per tap: 82-105 ms against 42-50 ms forward and backward on the
  benchmark shape above.
  """
  return _strided_sum(x, axis, coeffs, stride)


@strided_sum.defjvp
def _strided_sum_jvp(axis, coeffs, stride, primals, tangents):
  (x,), (t,) = primals, tangents
  y = _strided_sum(x, axis, coeffs, stride)
  out = jax.ShapeDtypeStruct(y.shape, t.dtype)
  # Its transpose is the blur's along one dim without padding.
  (t_out,) = jax.linear_transpose(
      lambda ct: _blur_axis_adjoint(ct, axis, x.shape[axis], coeffs, stride, 0, "constant"),
      out)(t)
  return y, t_out


# ----------------------------------------------------------------------------
# Short filters: each tap reads the input through its padding, no padded copy.
# ----------------------------------------------------------------------------


# The most taps (the product of the filter sizes) read one by one through the padding
# (:func:`blur_views`, each box of outputs unrolls them all); larger filters pad the input once
# (:func:`strided_sum`). timm builds 2 to 64 a dim; its models use 3 to 5, 9 to 25 taps in 2-D.
MAX_VIEW_TAPS = 64

# Per spatial dim: (filter coefficients, stride, padding a side); the whole blur's geometry.
Axes = tuple[tuple[tuple[float, ...], int, int], ...]


def _cdiv(a: int, b: int) -> int:
  return -(-a // b)


def _out(length: int, coeffs: tuple[float, ...], stride: int, pad: int) -> int:
  return (length + 2 * pad - len(coeffs)) // stride + 1


def _regions(length: int, first: int, stride: int, out: int) -> tuple[int, int]:
  """Where ``t(q) = q * stride + first`` leaves the input: ``q < q_lo`` reads the low padding,
  ``q >= q_hi`` the high padding, ``[q_lo, q_hi)`` real cells."""
  q_lo = min(out, max(0, _cdiv(-first, stride)))
  return q_lo, min(out, max(q_lo, _cdiv(length - first, stride)))


def _border(length: int, first: int, stride: int, mode: str, low: bool) -> tuple[int, int]:
  """The input cell ``a + b * q`` that a padded position ``t(q)`` stands for, as ``(a, b)``:
  reflect mirrors without the edge, replicate repeats it, circular wraps around."""
  if mode == "replicate":
    return (0 if low else length - 1), 0
  if mode == "reflect":  # -t, or 2 (L - 1) - t
    return (-first if low else 2 * (length - 1) - first), -stride
  return (first + length if low else first - length), stride  # circular


def _cells(x: jax.Array, axis: int, a: int, b: int, qa: int, qb: int) -> jax.Array:
  """``x[a + b * q]`` along ``axis`` for ``q`` in ``[qa, qb)``: a strided slice, reversed for
  ``b < 0``, one cell repeated for ``b == 0``."""
  i0, i1 = a + b * qa, a + b * (qb - 1)
  if b == 0 or qb - qa == 1:
    shape = list(x.shape)
    shape[axis] = qb - qa
    return jnp.broadcast_to(lax.slice_in_dim(x, i0, i0 + 1, 1, axis), shape)
  if b > 0:
    return lax.slice_in_dim(x, i0, i1 + 1, b, axis)
  return lax.rev(lax.slice_in_dim(x, i1, i0 + 1, -b, axis), (axis,))


def _view(x: jax.Array, reads: list[tuple[int, int, int, int, int]], mode: str) -> jax.Array:
  """What one tap of the blur reads for a box of outputs, without a padded copy of ``x``.

  ``reads`` holds per spatial dim ``(axis, first, stride, qa, qb)``: outputs ``q`` in ``[qa,
  qb)`` read padded position ``q * stride + first``, a real cell or the cell its padding
  mirrors (zeros in constant mode). Each dim is at most three pieces (low padding, real
  cells, high padding), slices of ``x`` joined by concatenation; a box whose windows stay
  inside the input reads one strided slice.
  """
  if not reads:
    return x
  (axis, first, stride, qa, qb), rest = reads[0], reads[1:]
  length = x.shape[axis]
  q_lo, q_hi = _regions(length, first, stride, qb)
  parts = []
  for a0, b0, low in ((qa, min(q_lo, qb), True), (max(q_lo, qa), min(q_hi, qb), None),
                      (max(q_hi, qa), qb, False)):
    if b0 <= a0:
      continue
    if low is None:
      piece = _cells(x, axis, first, stride, a0, b0)
    elif mode == "constant":
      piece = jnp.zeros_like(lax.slice_in_dim(x, 0, 1, 1, axis))
      piece = jnp.broadcast_to(piece, (*x.shape[:axis], b0 - a0, *x.shape[axis + 1:]))
    else:
      piece = _cells(x, axis, *_border(length, first, stride, mode, low), a0, b0)
    parts.append(_view(piece, rest, mode))
  return parts[0] if len(parts) == 1 else lax.concatenate(parts, axis)


def _blur_box(x: jax.Array, axes: Axes, mode: str, box: tuple[tuple[int, int], ...]
              ) -> jax.Array:
  """The blur of one box of outputs, in the separable order: the first spatial dim's taps
  summed innermost, ``sum_k c_k (... (sum_i c_i tap_i...k))``, each tap a :func:`_view`."""

  def level(axis: int, taps: tuple[int, ...]) -> jax.Array:
    if axis == 0:
      reads = [(d + 1, j - pad, stride, *q)
               for d, (j, (_, stride, pad), q) in enumerate(zip(taps, axes, box, strict=True))]
      return _view(x, reads, mode)
    total = None
    for j, c in enumerate(axes[axis - 1][0]):
      term = level(axis - 1, (j, *taps)) * jnp.asarray(c, x.dtype)
      total = term if total is None else total + term
    return total  # pyright: ignore[reportReturnType]  # not None: a filter has taps

  return level(len(axes), ())


def _blur_boxes(x: jax.Array, axes: Axes, mode: str) -> jax.Array:
  """The blur, where :func:`nnx_pool._taps.splits_boxes` says so (a large map on the CPU), in
  boxes of outputs joined by concatenation: per dim the outputs whose taps read the low
  padding, real cells only, or the high padding.

  XLA:CPU checks which piece a concatenation reads at every element it writes, so the
  interior, the bulk of the map, reads plain strided slices: 0.7 ms against 1.4 for the
  taps through pieces everywhere, on (8, 56, 56, 128) (docs/benchmarks.md). A small map
  is one box, which compiles faster.
  """
  outs = [_out(n, *axis) for n, axis in zip(x.shape[1:-1], axes, strict=True)]
  split = splits_boxes(x, tuple(outs))
  per_dim = []
  for axis, ((coeffs, stride, pad), out) in enumerate(zip(axes, outs, strict=True), start=1):
    los, his = zip(*(_regions(x.shape[axis], j - pad, stride, out) for j in range(len(coeffs))),
                   strict=True)
    a, b = max(los), max(max(los), min(his))
    segments = [(q0, q1) for q0, q1 in ((0, a), (a, b), (b, out)) if q1 > q0]
    per_dim.append(segments if split else [(0, out)])

  def join(axis: int, box: tuple[tuple[int, int], ...]) -> jax.Array:
    if axis == len(per_dim):
      return _blur_box(x, axes, mode, box)
    parts = [join(axis + 1, (*box, segment)) for segment in per_dim[axis]]
    return parts[0] if len(parts) == 1 else lax.concatenate(parts, axis + 1)

  return join(0, ())


def _shifted(ct: jax.Array, axis: int, shift: int, cells: int) -> jax.Array:
  """``ct[t + shift]`` along ``axis`` for ``t`` in ``[0, cells)``, zero outside ``ct``."""
  config = [(0, 0, 0)] * ct.ndim
  config[axis] = (-shift, shift + cells - ct.shape[axis], 0)
  return lax.pad(ct, jnp.zeros((), ct.dtype), config)


def _blur_axis_adjoint(ct: jax.Array, axis: int, length: int, coeffs: tuple[float, ...],
                       stride: int, pad: int, mode: str) -> jax.Array:
  """The transpose of the blur along one dim (``y[q] = sum_j coeffs[j] * padded[q * stride +
  j]``): cell ``m`` receives ``coeffs[j] * ct[q]`` for each tap ``j`` and output ``q`` that
  read it, through a real cell or the padding mirroring it.

  By stride phase: cell ``t * stride + r`` receives from the taps ``j`` with ``(r + pad - j) %
  stride == 0`` through unit-stride shifts of ``ct``, and from the padding's reads a few
  cells of ``ct`` put in place by a pad; the phases are stacked and interleaved. Every term
  is a pad or slice of ``ct``, which XLA adds in one loop.
  """
  out = ct.shape[axis]
  cells = _cdiv(length, stride)  # per phase; the interleaved phases are cropped to length
  blocks: list[jax.Array | None] = [None] * stride

  def add(r: int, term: jax.Array, c: float) -> None:
    term = term * jnp.asarray(c, ct.dtype)
    block = blocks[r]
    blocks[r] = term if block is None else block + term

  for j, c in enumerate(coeffs):
    for r in range(stride):
      if (r + pad - j) % stride == 0:
        add(r, _shifted(ct, axis, (r + pad - j) // stride, cells), c)
    first = j - pad
    q_lo, q_hi = _regions(length, first, stride, out)
    for qa, qb, low in ((0, q_lo, True), (q_hi, out, False)):
      if qb <= qa or mode == "constant":
        continue
      a, b = _border(length, first, stride, mode, low)
      part = lax.slice_in_dim(ct, qa, qb, 1, axis)
      if b == 0:  # replicate: the edge cell receives them all
        part = jnp.sum(part, axis=axis, keepdims=True)
      elif b < 0:  # reflect: descending cells, so ascending in reverse
        part = lax.rev(part, (axis,))
      m = a + b * (qb - 1 if b < 0 else qa)  # the first cell receiving, all in one phase
      add(m % stride, _shifted(part, axis, -(m // stride), cells), c)
  shape = list(ct.shape)
  shape[axis] = cells
  stacked = jnp.stack([jnp.zeros(shape, ct.dtype) if block is None else block
                       for block in blocks], axis=axis + 1)
  shape[axis] = cells * stride
  return lax.slice_in_dim(stacked.reshape(shape), 0, length, 1, axis)


def _blur_adjoint(ct: jax.Array, spatial: tuple[int, ...], axes: Axes, mode: str) -> jax.Array:
  """The transpose of the whole blur: one dim's :func:`_blur_axis_adjoint` after another, the
  last dim first."""
  for axis in reversed(range(1, len(axes) + 1)):
    coeffs, stride, pad = axes[axis - 1]
    ct = _blur_axis_adjoint(ct, axis, spatial[axis - 1], coeffs, stride, pad, mode)
  return ct


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def blur_views(x: jax.Array, axes: Axes, mode: str) -> jax.Array:
  """:func:`_blur_boxes`, whose reverse mode runs :func:`_blur_adjoint`."""
  return _blur_boxes(x, axes, mode)


@blur_views.defjvp
def _blur_views_jvp(axes, mode, primals, tangents):
  (x,), (t,) = primals, tangents
  y = _blur_boxes(x, axes, mode)
  out = jax.ShapeDtypeStruct(y.shape, t.dtype)
  (t_out,) = jax.linear_transpose(
      lambda ct: _blur_adjoint(ct, x.shape[1:-1], axes, mode), out)(t)
  return y, t_out


@kernel(static_argnums=(1, 2, 3, 4))
def binomial_blur(x: jax.Array, filter_size: tuple[int, ...], strides: tuple[int, ...],
                  pads: Pads, pad_mode: str) -> jax.Array:
  """The blur of a batched float ``x``: its taps read through the padding (:func:`blur_views`),
  or for long filters and maps devices may split, a padded copy and one strided pass per
  spatial dim."""
  y = x.astype(accumulation_dtype(x.dtype))
  if math.prod(filter_size) <= MAX_VIEW_TAPS and not may_split_space(y):
    axes = tuple((binomial_filter(k), s, p)
                 for k, s, (p, _) in zip(filter_size, strides, pads, strict=True))
    return blur_views(y, axes, pad_mode).astype(x.dtype)
  # Long filters, and maps split over devices: one padded copy, whose slices (unlike the
  # boxes' concatenation) the partitioner moves with halo exchanges.
  y = torch_pad(y, pads, pad_mode)
  for axis, (k, s) in enumerate(zip(filter_size, strides, strict=True), start=1):
    y = strided_sum(y, axis, binomial_filter(k), s)
  return y.astype(x.dtype)


# ----------------------------------------------------------------------------
# Argument checks, the function and the module.
# ----------------------------------------------------------------------------


def _configure(filter_size, strides, pad_mode, num_spatial_dims, in_features):
  """Validated ``(filter_size, strides, pad_mode, in_features)``, one entry per spatial dim."""
  ndim = spatial_dims(num_spatial_dims, filter_size=filter_size, strides=strides)
  entries = filter_size if isinstance(filter_size, Sequence) and not isinstance(
      filter_size, str) else (filter_size,)
  if all(is_int(k) for k in entries) and min(int(k) for k in entries) < 2:  # not ">= 1"
    raise ValueError(
        f"`filter_size` must be at least 2 in every dim (a filter of 1 tap does not blur; "
        f"timm asserts filt_size > 1); got {filter_size!r}. For a plain strided subsample "
        "use x[:, ::2, ::2] or MaxPool(1, 2).")
  if all(is_int(k) for k in entries) and max(int(k) for k in entries) > MAX_FILTER_SIZE:
    raise ValueError(
        f"`filter_size` must be at most {MAX_FILTER_SIZE} in every dim (the kernel takes one "
        f"slice per tap, so its program grows with the filter); got {filter_size!r}. (timm "
        "1.0.31 builds at most 64: from 65 its binomials overflow int64.)")
  return (as_tuple(filter_size, ndim, "filter_size"), as_tuple(strides, ndim, "strides"),
          check_pad_mode(pad_mode), check_in_features(in_features))


def _blur(inputs, filter_size: tuple[int, ...], strides: tuple[int, ...], pad_mode: str,
          in_features, name: str, owner=None) -> jax.Array:
  x, batch = prepare(inputs, len(filter_size), kind="float", module=name,
                     in_features=in_features, owner=owner)
  check_nonempty_spatial(x, name)
  spatial = tuple(x.shape[1:-1])
  pads = tuple((p, p) for p in map(blur_padding, filter_size, strides))
  check_torch_pads(spatial, pads, pad_mode, name)
  check_padded_size(
      x.shape, pads, name,
      f"timm's padding grows with the stride, ((strides - 1) + (filter_size - 1)) // 2 a side, "
      f"here {tuple(p for p, _ in pads)}: use smaller `strides`.")
  for axis, (length, k, (lo, hi)) in enumerate(zip(spatial, filter_size, pads, strict=True)):
    if length + lo + hi < k:
      raise ValueError(
          f"{name}: filter_size {k} does not fit spatial dim {axis} of length {length} "
          f"padded by ({lo}, {hi}) (timm's get_padding); use an input at least "
          f"{k - lo - hi} long there, or a smaller filter.")
  return unbatch(binomial_blur(x, filter_size, strides, pads, pad_mode), batch)


@flax_names
def blur_pool(inputs: jax.Array, filter_size: SizeLike = 3, strides: SizeLike = 2, *,
              pad_mode: str = "reflect",
              num_spatial_dims: int | None = None, in_features: int | None = None) -> jax.Array:
  """A binomial blur then a stride, timm's ``BlurPool2d``: the function of :class:`BlurPool`.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import functional as F
    >>> x = jnp.zeros((1, 5, 5, 1)).at[0, 2, 2, 0].set(16.0)  # an impulse
    >>> F.blur_pool(x, 3, 1, pad_mode="constant")[0, ..., 0]  # 16 times the filter
    Array([[0., 0., 0., 0., 0.],
           [0., 1., 2., 1., 0.],
           [0., 2., 4., 2., 0.],
           [0., 1., 2., 1., 0.],
           [0., 0., 0., 0., 0.]], dtype=float32)

  Args:
    inputs: ``(*batch, *spatial, C)`` floats.
    filter_size: the binomial filter's length, 2 to 1024, an int or a tuple per dim
      (default 3).
    strides: the step between outputs, an int or a tuple per dim (default 2).
    pad_mode: ``"reflect"`` (default), ``"constant"`` (zeros), ``"replicate"`` or
      ``"circular"``, as ``F.pad``.
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3; keyword-only, 2
      unless a tuple argument sets it by its length.
    in_features: the channel count, checked against the last axis when given
      (default None).
  """
  sizes, strides, pad_mode, in_features = _configure(filter_size, strides, pad_mode,
                                                      num_spatial_dims, in_features)
  return _blur(inputs, sizes, strides, pad_mode, in_features, "blur_pool")


class BlurPool(nnx.Module):
  """Anti-aliased downsampling: a binomial blur of each channel, then a stride (timm's BlurPool2d).

  Zhang, "Making Convolutional Networks Shift-Invariant Again", ICML 2019,
  https://arxiv.org/abs/1904.11486; timm 1.0.31 ``timm/layers/blur_pool.py``. The
  filter is ``C(n-1, k) / 2^(n-1)`` per dim (``[1, 2, 1] / 4`` for 3,
  ``[1, 4, 6, 4, 1] / 16`` for 5), each side padded by
  ``((stride - 1) + (filter_size - 1)) // 2`` in ``pad_mode``. It has no
  parameters (timm's ``filt`` is a non-persistent buffer), so ``BlurPool2d(channels,
  filt_size, stride, pad_mode)`` is ``BlurPool(filt_size, stride, pad_mode=...,
  in_features=channels)``. Computed as described in :mod:`nnx_pool._blur`.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import BlurPool
    >>> x = jnp.arange(16.0).reshape(1, 4, 4, 1)
    >>> BlurPool()(x)[0, ..., 0]  # reflect padding, stride 2
    Array([[ 2.5,  4. ],
           [ 8.5, 10. ]], dtype=float32)

  Args:
    filter_size: the binomial filter's length, 2 to 1024, an int (repeated over
      ``num_spatial_dims``) or a tuple per dim (default 3).
    strides: the step between outputs, an int or a tuple per dim (default 2).
    pad_mode: ``"reflect"`` (default, timm's), ``"constant"`` (zeros, timm's
      ``'blurpc'``), ``"replicate"`` or ``"circular"``, as ``F.pad``.
    in_features: the channel count, checked against the last axis when given
      (default None).
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3; keyword-only, 2
      unless a tuple argument sets it by its length.
  """

  @flax_names
  def __init__(self, filter_size: SizeLike = 3, strides: SizeLike = 2, *, pad_mode: str = "reflect",
               in_features: int | None = None, num_spatial_dims: int | None = None):
    self.filter_size, self.strides, self.pad_mode, self.in_features = _configure(
        filter_size, strides, pad_mode, num_spatial_dims, in_features)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Blurs and subsamples ``(*batch, *spatial, C)`` to ``(*batch, *out, C)``.

    ``out = (length + 2 * pad - filter_size) // stride + 1`` per dim, with timm's
    ``pad = ((stride - 1) + (filter_size - 1)) // 2``.
    """
    return _blur(inputs, self.filter_size, self.strides, self.pad_mode, self.in_features,
                 type(self).__name__, self)
