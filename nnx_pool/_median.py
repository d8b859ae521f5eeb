"""Median pooling, timm's ``MedianPool2d``: the lower median of each window, channels-last.

timm 1.0.31 ``timm/layers/median_pool.py`` ``MedianPool2d`` pads the input with
``F.pad(..., mode='reflect')``, by ``padding`` or, with ``same=True``, by TF's
``'SAME'`` rule (the total ``max((ceil(L / s) - 1) * s + k - L, 0)`` split with the
odd cell on the high side, ignoring ``padding``), cuts the windows with ``unfold``
(no partial windows) and takes ``median(dim=-1)[0]``. PyTorch's median of ``n``
values is the lower one for an even ``n``: the element of rank ``(n - 1) // 2``
in ascending order. Here, as in PyTorch 2.13 CPU (``median_with_indices_impl``
in ``aten/src/ATen/native/Sorting.cpp``):

* equal values rank in window order (row-major), so the median is one cell: the
  one of rank ``(n - 1) // 2`` in a stable sort. PyTorch's ``nth_element`` compares
  ``(value, position)`` pairs, which picks that same cell; ``-0.0`` and ``0.0`` are
  equal, and the cell keeps its own sign;
* a window holding NaN gives NaN, from its first NaN cell.

The gradient of each output goes to that one cell, as PyTorch's median backward
sends it to the index it returns; a cell read through the reflect padding passes
it on to the input cell it mirrors (the transpose of the padding). Integer
inputs are pooled too; bool and complex are refused. Values are selected, not
computed, so every dtype is exact.

How it is computed: each window cell's rank is counted with ``n (n - 1) / 2``
elementwise comparisons of the window's strided views, which XLA fuses into one
loop, and the cell of rank ``(n - 1) // 2`` is selected. Measured on
(8, 58, 58, 64) float32, 2-core CPU: 3x3 in 5 ms and 5x5 in 32-39 ms against 0.87 s
and 3.5 s for XLA's ``lax.sort`` along a stacked window axis, and 7x7 in 0.14 s
(1.8 s to compile; the comparisons grow with the square of the window).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ._adjoint import gather
from ._args import check_bool, flax_names
from ._geometry import Geometry, Window
from ._jit import kernel
from ._layout import check_in_features, check_nonempty_spatial, prepare, unbatch
from ._spatial_args import PaddingLike, SizeLike, parse_padding, refuse_flat_padding, spatial_dims
from ._taps import taps
from ._torch_pad import check_torch_pads, torch_pad

Pads = tuple[tuple[int, int], ...]


# ----------------------------------------------------------------------------
# The median of every window, and its derivative.
# ----------------------------------------------------------------------------


def _median_forward(x: jax.Array, geom: Geometry) -> tuple[jax.Array, jax.Array]:
  """The median of each window and its row-major window offset (int32).

  Cell ``i`` ranks after every cell below it and every equal cell before it, so
  the ranks are a permutation and one cell has rank ``(n - 1) // 2``; each pair
  of cells is compared once. A NaN compares false both ways: a window holding
  one takes its first NaN cell instead.
  """
  views = list(taps(x, geom, 0, shared_pad=False))
  n = len(views)
  ranks = [jnp.zeros(views[0].shape, jnp.int32) for _ in range(n)]
  for i in range(n):
    for j in range(i + 1, n):
      below = views[j] < views[i]  # else (no NaN) views[i] <= views[j]: i ranks first
      ranks[i] = ranks[i] + below.astype(jnp.int32)
      ranks[j] = ranks[j] + (~below).astype(jnp.int32)
  middle = (n - 1) // 2
  arg = jnp.zeros(views[0].shape, jnp.int32)
  for i in range(1, n):
    arg = jnp.where(ranks[i] == middle, jnp.int32(i), arg)
  if jnp.issubdtype(x.dtype, jnp.floating):
    any_nan = first_nan = None
    for i in reversed(range(n)):
      nan = jnp.isnan(views[i])
      first_nan = (jnp.where(nan, jnp.int32(i), first_nan) if first_nan is not None
                   else jnp.full(nan.shape, i, jnp.int32))
      any_nan = nan if any_nan is None else any_nan | nan
    arg = jnp.where(any_nan, first_nan, arg)  # pyright: ignore[reportArgumentType]  # the loop ran: n >= 1
  values = views[0]
  for i in range(1, n):
    values = jnp.where(arg == i, views[i], values)
  return values, arg


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def median_select(x: jax.Array, geom: Geometry) -> tuple[jax.Array, jax.Array]:
  """:func:`_median_forward`; each output's tangent is that of its median cell, placed by
  :func:`nnx_pool._adjoint.gather` (whose transpose is the phase scatter)."""
  return _median_forward(x, geom)


@median_select.defjvp
def _median_select_jvp(geom, primals, tangents):
  (x,), (t,) = primals, tangents
  values, arg = _median_forward(x, geom)
  return (values, arg), (gather(t, geom, arg), np.zeros(arg.shape, jax.dtypes.float0))


@kernel(static_argnums=(1, 2))
def window_median(x: jax.Array, pads: Pads, geom: Geometry) -> jax.Array:
  """timm's median pool of a batched ``x``: reflect-padded by ``pads``, windows ``geom``."""
  return median_select(torch_pad(x, pads, "reflect"), geom)[0]


# ----------------------------------------------------------------------------
# Argument checks, the function and the module.
# ----------------------------------------------------------------------------


# The padding forms MedianPool takes: the window pools' without their "VALID"/"SAME" strings.
_PADDING_FORMS = "an int, a tuple of ints (one per spatial dim) or of (low, high) pairs"


def _configure(window_shape, strides, padding, same, num_spatial_dims, in_features):
  """The validated window (its padding "VALID"), padding pairs, ``same`` and ``in_features``."""
  refuse_flat_padding(padding, "an int, one int per spatial dim or one (low, high) pair per "
                      "spatial dim", ", timm's MedianPool2d form")
  if isinstance(padding, str):
    raise TypeError(
        f"`padding` must be {_PADDING_FORMS}; got {padding!r}. For TF-style 'SAME' padding "
        "pass same=True (timm's `same`).")
  same = check_bool(same, "same")
  ndim = spatial_dims(num_spatial_dims, window_shape=window_shape, strides=strides,
                      padding=padding)
  window = Window.create(window_shape, strides, "VALID", num_spatial_dims=ndim)
  try:
    pads = parse_padding(padding, ndim)
  except TypeError:  # its message offers "VALID" and "SAME", which are refused above
    raise TypeError(f"`padding` must be {_PADDING_FORMS}; got {padding!r}.") from None
  if same and any(lo or hi for lo, hi in pads):
    raise ValueError(
        f"`padding` {padding!r} and same=True disagree: same=True computes the padding "
        "(TF's 'SAME' rule), and timm's MedianPool2d then ignores `padding`. Pass one: "
        "padding=0 with same=True, or same=False.")
  return window, pads, same, check_in_features(in_features)


def _median(inputs, window: Window, pads: Pads, same: bool, in_features, name: str,
            owner=None) -> jax.Array:
  x, batch = prepare(inputs, window.ndim, kind="ordered", module=name,
                     in_features=in_features, owner=owner)
  check_nonempty_spatial(x, name)
  spatial = tuple(x.shape[1:-1])
  if same:
    same_window = Window.create(window.shape, window.strides, "SAME")
    pads = tuple((d.pad_low, d.pad_high) for d in same_window.resolve(spatial).dims)
  check_torch_pads(spatial, pads, "reflect", name)
  padded = tuple(n + lo + hi for n, (lo, hi) in zip(spatial, pads, strict=True))
  for axis, (length, n, k, (lo, hi)) in enumerate(
      zip(padded, spatial, window.shape, pads, strict=True)):
    if length < k:
      raise ValueError(
          f"{name}: window {k} does not fit spatial dim {axis} of length {n} padded by "
          f"({lo}, {hi}); PyTorch's unfold keeps whole windows only. Use a window of at "
          f"most {length} there, more padding (less than {n} on a side), or same=True.")
  geom = window.resolve(padded, name)
  return unbatch(window_median(x, pads, geom), batch)


@flax_names
def median_pool(inputs: jax.Array, window_shape: SizeLike = 3, strides: SizeLike = 1,
                padding: PaddingLike = 0, *,
                same: bool = False, num_spatial_dims: int | None = None,
                in_features: int | None = None) -> jax.Array:
  """The lower median of each window, timm's ``MedianPool2d``: the function of :class:`MedianPool`.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import functional as F
    >>> x = jnp.array([3., 1., 4., 1., 5., 9.]).reshape(1, 6, 1)  # (N, L, C)
    >>> F.median_pool(x, 2, num_spatial_dims=1)[0, :, 0]  # the lower of each pair
    Array([1., 1., 1., 1., 5.], dtype=float32)

  Args:
    inputs: ``(*batch, *spatial, C)``, floating or integer.
    window_shape: the window, an int or a tuple per dim (default 3).
    strides: the step between windows, an int or a tuple per dim (default 1).
    padding: reflect padding, an int, an int per dim (both sides) or a ``(low, high)``
      pair per dim, each shorter than its dim (default 0).
    same: pad by TF's ``'SAME'`` rule instead (default False).
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3; keyword-only, 2
      unless a tuple argument sets it by its length.
    in_features: the channel count, checked against the last axis when given
      (default None).
  """
  window, pads, same, in_features = _configure(window_shape, strides, padding, same,
                                               num_spatial_dims, in_features)
  return _median(inputs, window, pads, same, in_features, "median_pool")


class MedianPool(nnx.Module):
  """Median pooling (a median filter at stride 1), timm's ``MedianPool2d``, channels-last.

  Each output is the lower median of its window, PyTorch's ``median``: the value
  of rank ``(n - 1) // 2`` among the window's ``n`` cells. The input is padded by
  reflection first, by ``padding`` or (``same=True``) by TF's ``'SAME'`` rule; only
  whole windows are kept. timm 1.0.31 ``timm/layers/median_pool.py``:
  ``MedianPool2d(kernel_size, stride, padding, same)`` is
  ``MedianPool(kernel_size, stride, padding, same=same)``, except that timm's
  4-tuple ``padding`` in F.pad's ``(left, right, top, bottom)`` order is written
  ``((top, bottom), (left, right))`` here (a 4-tuple is refused with that
  translation), and a 2-tuple pads each spatial dim on both sides, as every pool
  here does (timm's pads the last dim alone). Ties, NaN and the gradient are
  described in :mod:`nnx_pool._median`.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import MedianPool
    >>> x = jnp.array([[1., 9., 2.], [8., 3., 7.], [4., 6., 5.]]).reshape(1, 3, 3, 1)
    >>> MedianPool(3)(x)[0, ..., 0]  # the median of 1..9
    Array([[5.]], dtype=float32)
    >>> MedianPool(3, same=True)(x)[0, ..., 0]  # padded by reflection to 5x5
    Array([[3., 7., 3.],
           [6., 5., 6.],
           [4., 6., 5.]], dtype=float32)

  Args:
    window_shape: the window, an int (repeated over ``num_spatial_dims``) or a tuple
      per dim (default 3).
    strides: the step between windows, an int or a tuple per dim (default 1).
    padding: reflect padding, an int (both sides of every dim), an int per dim or a
      ``(low, high)`` pair per dim, each shorter than its dim (default 0).
    same: pad by TF's ``'SAME'`` rule, ``ceil(L / stride)`` outputs (default False).
    in_features: the channel count, checked against the last axis when given
      (default None).
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3; keyword-only, 2
      unless a tuple argument sets it by its length.
  """

  @flax_names
  def __init__(self, window_shape: SizeLike = 3, strides: SizeLike = 1,
               padding: PaddingLike = 0, *,
               same: bool = False, in_features: int | None = None,
               num_spatial_dims: int | None = None):
    self.window, self.padding, self.same, self.in_features = _configure(
        window_shape, strides, padding, same, num_spatial_dims, in_features)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Pools ``(*batch, *spatial, C)`` to ``(*batch, *out, C)``.

    ``out = (length + low + high - window) // stride + 1`` per dim; with
    ``same=True``, ``ceil(length / stride)``.
    """
    return _median(inputs, self.window, self.padding, self.same, self.in_features,
                   type(self).__name__, self)
