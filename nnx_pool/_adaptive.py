"""Adaptive and selectable pooling over 1, 2 or 3 spatial dims, channels-last.

Inputs are ``(N, *spatial, C)`` or unbatched ``(*spatial, C)``. The number of
spatial dims is never guessed from the rank; it follows the rule of every
module (:func:`nnx_pool._spatial_args.spatial_dims`): a tuple ``output_size`` sets
it by its length, an int is repeated over ``num_spatial_dims``, default 2 (the
``AdaptiveAvgPool2d(1)`` case). A rank of ``num_spatial_dims + 2`` is batched,
``num_spatial_dims + 1`` unbatched.

Adaptive bins are PyTorch's (:func:`nnx_pool._geometry.adaptive_bins`): bin
``i`` of ``T`` over a length ``L`` covers ``[floor(i*L/T), ceil((i+1)*L/T))``.
Bins may overlap, ``T > L`` is allowed, and ``None`` keeps a dim. These are not
Equinox's bins, which partition the input without overlap.

How it is computed (all bin geometry is static, known at trace time):

* an output of 1 in every dim is a global pool: one reduction;
* when every dim divides (``L % T == 0``) and a bin has at most 64 cells, the
  bins are the windows of a strided pool (stride = window), run on the shared
  window kernels (:mod:`nnx_pool._separable`);
* otherwise each spatial dim is grouped into ``(T, K)`` bin slots (``K`` the
  longest bin: a reshape when the dim divides, else a gather along that dim
  alone) and the slots are reduced, one dim after another. A bin box is the
  product of its per-dim bins, so this is exact for max and a regrouping of
  the sum for average. Above 64 cells it beats the unrolled window kernels,
  whose compile time grows with the window.

Average pooling sums in float32 (float16/bfloat16 inputs) or the input's own
float dtype and divides as PyTorch does: a global pool by the cell count, other
outputs by each dim's bin length in turn (``sum / kh / kw``), each a true,
correctly rounded division. On inputs whose sums are exact (integer-valued
data), the result is bit-identical to PyTorch's; otherwise it agrees to a few
float32 ULPs (the summation order differs).

Max pooling follows PyTorch's scan, ``val > max or isnan(val)``: on ties the
first maximum in row-major order wins, and the last NaN wins. Returned indices
are PyTorch's flat per-plane indices (``h * W + w`` in 2-D), int32, in the
output's channels-last shape. The derivative of each output is that of the
cell its index names: one cell per output, also on ties (``jnp.max`` would
split it between them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Generic, Literal, cast, overload

import jax
import jax.numpy as jnp
from flax import nnx

from ._adjoint import bins_select
from ._args import check_bool, flax_names, is_int
from ._geometry import adaptive_bins, adaptive_window
from ._jit import kernel
from ._layout import DtypeKind, check_in_features, prepare_map, unbatch
from ._numerics import accumulation_dtype, mean, true_divide
from ._select import Out, ValuesAndIndices, arg_extremum_over_bins, flat_indices
from ._separable import select, window_sum
from ._spatial_args import OutputSizeLike, spatial_dims
from ._taps import along, bin_slots

_POOL_TYPES = ("avg", "max", "avgmax", "catavgmax")
# The largest window (in cells) for which a divisible adaptive pool runs on the
# shared window kernels, which unroll one strided slice per window cell: fastest
# for small windows, but compile time grows with the window.
_MAX_WINDOW_CELLS = 64


# ----------------------------------------------------------------------------
# Argument checks.
# ----------------------------------------------------------------------------


def _parse_output_size(output_size, num_spatial_dims) -> tuple[int | None, ...]:
  """Returns one entry per spatial dim: a positive int, or None to keep that dim."""
  forms = (
      "an int (repeated over `num_spatial_dims`, default 2) or a tuple of 1 to 3 "
      "entries, each a positive int or None (keep that dim)"
  )
  ndim = spatial_dims(num_spatial_dims, output_size=output_size)
  if is_int(output_size):
    sizes = (output_size,) * ndim
  elif isinstance(output_size, Sequence) and not isinstance(output_size, str):
    sizes = tuple(output_size)
    if not all(s is None or is_int(s) for s in sizes):
      raise TypeError(f"`output_size` must be {forms}; got {output_size!r}.")
  else:
    raise TypeError(f"`output_size` must be {forms}; got {output_size!r}.")
  if any(s is not None and s < 1 for s in sizes):
    raise ValueError(f"`output_size` must be {forms}; got {output_size!r}.")
  return tuple(None if s is None else int(s) for s in sizes)


def _resolve_out_shape(sizes: tuple[int | None, ...], spatial: tuple[int, ...]) -> tuple[int, ...]:
  return tuple(length if t is None else t for t, length in zip(sizes, spatial, strict=True))


# ----------------------------------------------------------------------------
# Reductions on batched (N, *spatial, C) arrays.
# ----------------------------------------------------------------------------


@kernel(static_argnums=1)
def adaptive_avg(x: jax.Array, out_shape: tuple[int, ...]) -> jax.Array:
  """PyTorch's adaptive average pool of a batched float ``x`` to ``out_shape``."""
  spatial = x.shape[1:-1]
  if all(t == 1 for t in out_shape):
    return mean(x, range(1, x.ndim - 1))
  total = x.astype(accumulation_dtype(x.dtype))
  geom = adaptive_window(spatial, out_shape, _MAX_WINDOW_CELLS)
  if geom is not None:
    total = window_sum(total, geom)
  else:
    for axis, (length, out) in enumerate(zip(spatial, out_shape, strict=True), start=1):
      if length != out:
        grouped, _, _, valid = bin_slots(total, axis, length, out)
        if valid is not None:  # surplus slots repeat a cell: drop them from the sum
          mask = valid.reshape((1,) * axis + valid.shape + (1,) * (grouped.ndim - axis - 2))
          grouped = jnp.where(mask, grouped, jnp.zeros((), grouped.dtype))
        total = grouped.sum(axis=axis + 1)
  # PyTorch divides by each dim's bin length in turn: sum / kd / kh / kw.
  for axis, (length, out) in enumerate(zip(spatial, out_shape, strict=True), start=1):
    if length != out:
      start, end = adaptive_bins(length, out)
      total = true_divide(total, along(end - start, axis, total.ndim))
  return total.astype(x.dtype)


@kernel(static_argnums=(1, 2))
def adaptive_max(x: jax.Array, out_shape: tuple[int, ...], return_indices: bool = False):
  """PyTorch's adaptive max pool of a batched ``x``: values, and int32 flat indices if asked.

  The gradient of each value goes to exactly the cell its index names (one
  cell per output, also on ties), in forward and reverse mode. Without
  ``return_indices`` and a derivative, the index work is compiled away.
  """
  geom = (None if all(t == 1 for t in out_shape)
          else adaptive_window(x.shape[1:-1], out_shape, _MAX_WINDOW_CELLS))
  if geom is not None:
    values, offset = select(x, geom, "max", return_indices)
    return (values, flat_indices(offset, geom)) if return_indices else values
  if jnp.issubdtype(x.dtype, jnp.floating):
    values, index = bins_select(x, out_shape, "max")
  else:
    values, index = arg_extremum_over_bins(x, out_shape, "max")
  return (values, index) if return_indices else values


# ----------------------------------------------------------------------------
# Functions: the one implementation, which the modules below call.
# ----------------------------------------------------------------------------


def _adaptive(inputs, sizes, pool_type: str, return_indices: bool, in_features, name,
              owner=None, *, flatten: bool = False):
  """Adaptive pooling of ``inputs`` to ``sizes`` (None keeps a dim), by ``pool_type``.

  ``flatten``: everything after the batch axes flattened, channels-last order.
  """
  kind: DtypeKind = "ordered" if pool_type == "max" else "float"
  x, batch = prepare_map(inputs, len(sizes), kind, in_features, name, owner,
                         indexed=pool_type != "avg")
  out_shape = _resolve_out_shape(sizes, x.shape[1:-1])
  if pool_type == "avg":
    y = adaptive_avg(x, out_shape)
  elif pool_type == "max":
    y = adaptive_max(x, out_shape, return_indices)
  elif pool_type == "avgmax":
    y = 0.5 * (adaptive_avg(x, out_shape) + adaptive_max(x, out_shape))
  else:
    y = jnp.concatenate([adaptive_avg(x, out_shape), adaptive_max(x, out_shape)], axis=-1)
  if flatten:
    y = y.reshape(y.shape[0], math.prod(y.shape[1:]))
  return unbatch(y, batch)


@flax_names
def adaptive_avg_pool(inputs: jax.Array, output_size: OutputSizeLike, *,
                      num_spatial_dims: int | None = None,
                      in_features: int | None = None) -> jax.Array:
  """The function form of :class:`AdaptiveAvgPool`, with the same arguments and checks.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import functional as F
    >>> F.adaptive_avg_pool(jnp.arange(14.0).reshape(1, 14, 1), (4,))[0, :, 0]
    Array([ 1.5,  4.5,  8.5, 11.5], dtype=float32)
  """
  return _adaptive(inputs, _parse_output_size(output_size, num_spatial_dims), "avg", False,
                   check_in_features(in_features), "adaptive_avg_pool")


# With return_indices=True the result is (values, indices), as for functional.max_pool.
@overload
def adaptive_max_pool(inputs: jax.Array, output_size: OutputSizeLike, *,
                      num_spatial_dims: int | None = None, return_indices: Literal[False] = False,
                      in_features: int | None = None) -> jax.Array: ...
@overload
def adaptive_max_pool(inputs: jax.Array, output_size: OutputSizeLike, *,
                      num_spatial_dims: int | None = None, return_indices: Literal[True],
                      in_features: int | None = None) -> tuple[jax.Array, jax.Array]: ...
@overload
def adaptive_max_pool(inputs: jax.Array, output_size: OutputSizeLike, *,
                      num_spatial_dims: int | None = None, return_indices: bool,
                      in_features: int | None = None
                      ) -> jax.Array | tuple[jax.Array, jax.Array]: ...
@flax_names
def adaptive_max_pool(inputs: jax.Array, output_size: OutputSizeLike, *,
                      num_spatial_dims: int | None = None, return_indices: bool = False,
                      in_features: int | None = None) -> jax.Array | tuple[jax.Array, jax.Array]:
  """The function form of :class:`AdaptiveMaxPool`, with the same arguments and checks."""
  return _adaptive(inputs, _parse_output_size(output_size, num_spatial_dims), "max",
                   check_bool(return_indices, "return_indices"), check_in_features(in_features),
                   "adaptive_max_pool")


# ----------------------------------------------------------------------------
# Modules.
# ----------------------------------------------------------------------------

class AdaptiveAvgPool(nnx.Module):
  """Average over PyTorch's adaptive bins, channels-last, in 1, 2 or 3 spatial dims.

  Output ``j`` of ``T`` along a dim of length ``L`` averages input cells
  ``floor(j*L/T)`` to ``ceil((j+1)*L/T) - 1``; bins may overlap and ``T`` may
  exceed ``L``. Divisions are PyTorch's (see the module notes), so
  integer-valued inputs match PyTorch bit for bit.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import AdaptiveAvgPool
    >>> x = jnp.arange(14.0).reshape(1, 14, 1)  # (N, L, C)
    >>> AdaptiveAvgPool((4,))(x)[0, :, 0]  # bins [0,4) [3,7) [7,11) [10,14)
    Array([ 1.5,  4.5,  8.5, 11.5], dtype=float32)

  Args:
    output_size: the output spatial shape: a tuple of 1 to 3 entries, each a
      positive int or None (keep that dim), or an int for every one of
      ``num_spatial_dims`` dims.
    num_spatial_dims: the number of spatial dims, 1, 2 or 3 (default None: the
      length of a tuple ``output_size``, or 2 for an int).
    in_features: the channel count, checked against the last axis when given
      (default None).
  """

  @flax_names
  def __init__(self, output_size: OutputSizeLike, *, num_spatial_dims: int | None = None,
               in_features: int | None = None):
    self.output_size = _parse_output_size(output_size, num_spatial_dims)
    self.num_spatial_dims = len(self.output_size)
    self.in_features = check_in_features(in_features)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Pools ``(N, *spatial, C)`` or ``(*spatial, C)`` to ``(N, *out, C)`` or ``(*out, C)``."""
    return _adaptive(inputs, self.output_size, "avg", False, self.in_features,
                     type(self).__name__, self)


class AdaptiveMaxPool(nnx.Module, Generic[Out]):
  """Max over PyTorch's adaptive bins, channels-last, in 1, 2 or 3 spatial dims.

  Bins as :class:`AdaptiveAvgPool`. On ties the first maximum in row-major
  order wins; NaN propagates and the last NaN wins. The gradient of each
  output goes to exactly the cell its index names. Integer inputs are accepted.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import AdaptiveMaxPool
    >>> x = jnp.array([3., 1., 4., 1., 5.]).reshape(5, 1)  # unbatched (L, C)
    >>> values, indices = AdaptiveMaxPool((3,), return_indices=True)(x)  # bins [0,2) [1,4) [3,5)
    >>> values[:, 0], indices[:, 0]
    (Array([3., 4., 5.], dtype=float32), Array([0, 2, 4], dtype=int32))

  Args:
    output_size: how many bins per spatial dim: an int for each of
      ``num_spatial_dims`` dims, or a tuple of 1 to 3 entries, each a positive
      int or None (that dim keeps its length).
    num_spatial_dims: 1, 2 or 3, keyword-only (default None: a tuple
      ``output_size`` gives its length, an int means 2).
    return_indices: also return PyTorch's int32 flat per-plane index of each
      selected cell (``h * W + w`` in 2-D), in the output's shape (default False). Type
      checkers read it: built with a literal True the module is an
      ``AdaptiveMaxPool[tuple[jax.Array, jax.Array]]``, else an
      ``AdaptiveMaxPool[jax.Array]`` (what a bare ``AdaptiveMaxPool`` means).
    in_features: the channel count, checked against the last axis when given
      (default None).
  """

  # A literal return_indices picks what a call returns (AdaptiveMaxPool[jax.Array] or
  # AdaptiveMaxPool[tuple[jax.Array, jax.Array]]); a bool variable gives the union.
  @overload
  def __init__(self: AdaptiveMaxPool[jax.Array], output_size: OutputSizeLike, *,
               num_spatial_dims: int | None = None, return_indices: Literal[False] = False,
               in_features: int | None = None) -> None: ...
  @overload
  def __init__(self: AdaptiveMaxPool[ValuesAndIndices], output_size: OutputSizeLike, *,
               num_spatial_dims: int | None = None, return_indices: Literal[True],
               in_features: int | None = None) -> None: ...
  @overload
  def __init__(self: AdaptiveMaxPool[jax.Array | ValuesAndIndices], output_size: OutputSizeLike,
               *, num_spatial_dims: int | None = None, return_indices: bool,
               in_features: int | None = None) -> None: ...
  @flax_names
  def __init__(self, output_size: OutputSizeLike, *, num_spatial_dims: int | None = None,
               return_indices: bool = False, in_features: int | None = None):
    self.output_size = _parse_output_size(output_size, num_spatial_dims)
    self.num_spatial_dims = len(self.output_size)
    self.return_indices = check_bool(return_indices, "return_indices")
    self.in_features = check_in_features(in_features)

  def __call__(self, inputs: jax.Array) -> Out:
    """Pools ``(N, *spatial, C)`` or ``(*spatial, C)`` to ``(N, *out, C)`` or ``(*out, C)``.

    Returns:
      The pooled array; with ``return_indices=True``, ``(values, indices)``.
    """
    return cast(Out, _adaptive(inputs, self.output_size, "max", self.return_indices,
                               self.in_features, type(self).__name__, self))


class SelectAdaptivePool(nnx.Module):
  """Adaptive pooling chosen by name, as timm's ``SelectAdaptivePool2d``, channels-last.

  ``pool_type`` is one of:

  * ``"avg"``: :class:`AdaptiveAvgPool`;
  * ``"max"``: :class:`AdaptiveMaxPool` (values only);
  * ``"avgmax"``: ``0.5 * (avg + max)``;
  * ``"catavgmax"``: ``concatenate([avg, max])`` on the channel axis, which
    doubles the channels (:meth:`feat_mult` is 2).

  With ``flatten=True`` everything after the batch axis is flattened in
  channels-last order; for ``output_size`` 1 that is ``(N, C)`` as in timm,
  for larger outputs the order differs from timm's channels-first flatten.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import SelectAdaptivePool
    >>> x = jnp.array([[[1., 10.], [3., 20.]]])  # (N, L, C) = (1, 2, 2)
    >>> pool = SelectAdaptivePool(1, pool_type="catavgmax", flatten=True, num_spatial_dims=1)
    >>> pool(x), pool.feat_mult()
    (Array([[ 2., 15.,  3., 20.]], dtype=float32), 2)

  Args:
    output_size: as :class:`AdaptiveAvgPool` (default 1).
    pool_type: ``"avg"`` (default), ``"max"``, ``"avgmax"`` or ``"catavgmax"``.
    flatten: flatten the pooled output to ``(N, features)`` (default False).
    num_spatial_dims: the number of spatial dims, 1, 2 or 3 (default None: the
      length of a tuple ``output_size``, or 2 for an int).
    in_features: the channel count, checked against the last axis when given
      (default None).
  """

  @flax_names
  def __init__(self, output_size: OutputSizeLike = 1, *, pool_type: str = "avg",
               flatten: bool = False, num_spatial_dims: int | None = None,
               in_features: int | None = None):
    if not isinstance(pool_type, str) or pool_type not in _POOL_TYPES:
      raise ValueError(f"`pool_type` must be one of {_POOL_TYPES}; got {pool_type!r}.")
    self.output_size = _parse_output_size(output_size, num_spatial_dims)
    self.num_spatial_dims = len(self.output_size)
    self.pool_type = pool_type
    self.flatten = check_bool(flatten, "flatten")
    self.in_features = check_in_features(in_features)

  def feat_mult(self) -> int:
    """How many times the input channels the output has: 2 for ``"catavgmax"``, else 1."""
    return 2 if self.pool_type == "catavgmax" else 1

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Pools ``(N, *spatial, C)`` to ``(N, *out, C * feat_mult())``, or ``(N, features)``.

    Unbatched ``(*spatial, C)`` gives ``(*out, C * feat_mult())`` or ``(features,)``.
    """
    return _adaptive(inputs, self.output_size, self.pool_type, False, self.in_features,
                     type(self).__name__, self, flatten=self.flatten)
