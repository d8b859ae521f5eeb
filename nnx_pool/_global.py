"""Global pools: the mean or the max over every spatial axis, optionally over a mask's cells.

Inputs are ``(*batch, *spatial, C)``, usually ``(N, *spatial, C)``, with
``num_spatial_dims`` (default 2) spatial axes; the result is ``(*batch, C)``, or
``(*batch, 1, ..., 1, C)`` with ``keepdims=True``.

Without a mask these are PyTorch's ``adaptive_avg_pool2d(x, 1)`` and
``adaptive_max_pool2d(x, 1)`` (:mod:`nnx_pool._adaptive` computes the max).

**Masks.** ``mask``, shape ``(*batch, *spatial)``, is True where a position is
valid (a padded sequence's real steps, say); it is bool, or an integer array whose
nonzero entries are valid (Keras casts its masks so). The average is the sum over the
valid positions divided by their count, Keras's rule (Keras 3's
``GlobalAveragePooling1D``, the only Keras global pool that takes a mask); the max
is PyTorch's max (first maximum, NaN propagated) over the valid positions. What
masked positions hold never reaches the result or the gradient, inf and NaN
included: they are replaced before any arithmetic, and the gradient there is 0.

Where a plane has no valid position the result is **0**, for the average and the
max alike, as PyTorch's ``embedding_bag`` gives 0 for an empty bag in its "mean"
and "max" modes (PyTorch 2.13); its gradient is 0 everywhere. Keras's average
divides 0 by 0 there (NaN), and a max over nothing would be -inf (or an integer
dtype's lowest): each poisons what follows (``0 * -inf`` is NaN), where 0 is the
value a model that drops an empty sequence would see.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from ._adaptive import adaptive_max
from ._args import check_bool, check_num_spatial_dims, flax_names
from ._jit import kernel
from ._layout import DtypeKind, as_array, check_in_features, prepare_map, unbatch
from ._numerics import accumulation_dtype, spatial_mean, true_divide
from ._select import arg_extremum, identity

# ----------------------------------------------------------------------------
# Kernels on batched (N, *spatial, C) arrays and (N, *spatial) bool masks.
# ----------------------------------------------------------------------------


@kernel()
def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """The mean of ``x`` over each plane's valid cells, ``(N, 1.., C)``; 0 where none is valid.

  Summed as :func:`nnx_pool._numerics.mean` sums (float32 for half precision), divided
  by the count with a true division; masked cells are replaced by 0 before the sum.
  """
  axes = tuple(range(1, x.ndim - 1))
  valid = mask[..., None]
  total = jnp.sum(jnp.where(valid, x, jnp.zeros((), x.dtype)), axis=axes, keepdims=True,
                  dtype=accumulation_dtype(x.dtype))
  count = jnp.sum(valid, axis=axes, keepdims=True, dtype=jnp.int32)
  return true_divide(total, jnp.maximum(count, 1)).astype(x.dtype)


@kernel()
def masked_max(x: jax.Array, mask: jax.Array) -> jax.Array:
  """PyTorch's max of ``x`` over each plane's valid cells, ``(N, 1.., C)``; 0 where none is.

  The first maximum among the valid cells wins (the last NaN), and the value is taken
  from that cell, so its gradient goes there alone, unsplit by ties.
  """
  n, c, cells = x.shape[0], x.shape[-1], math.prod(x.shape[1:-1])
  valid = mask.reshape(n, cells, 1)
  filled = jnp.where(valid, x.reshape(n, cells, c), identity(x.dtype, "max"))
  _, winner = arg_extremum(filled, 1, "max", valid=valid)
  picked = jnp.take_along_axis(filled, jnp.minimum(winner, cells - 1)[:, None], axis=1)
  result = jnp.where(jnp.any(valid, axis=1, keepdims=True), picked, jnp.zeros((), x.dtype))
  return result.reshape(n, *(1,) * (x.ndim - 2), c)


# ----------------------------------------------------------------------------
# Functions: the one implementation, which the modules below call.
# ----------------------------------------------------------------------------


def _check_mask(mask, x_shape: tuple[int, ...], name: str) -> jax.Array:
  """``mask`` as a bool array of shape ``x_shape[:-1]`` (the input's, channels dropped)."""
  mask = as_array(mask, "mask")
  expected = x_shape[:-1]
  if mask.dtype != jnp.bool_ and not jnp.issubdtype(mask.dtype, jnp.integer):
    raise TypeError(
        f"{name}: `mask` must be bool (True where a position is valid) or integers (nonzero "
        f"is valid); got dtype {mask.dtype}. For a 0/1 float mask m, pass m != 0.")
  if mask.shape != expected:
    message = (f"{name}: `mask` must have shape (*batch, *spatial) = {expected}, the input's "
               f"shape {x_shape} without its channel axis; got {tuple(mask.shape)}.")
    if mask.shape == (*expected, 1):
      message += " Drop its channel axis: mask[..., 0]."
    elif mask.shape == x_shape:
      message += (" A mask marks positions, the same for every channel: pass mask[..., 0] if "
                  "it is.")
    raise ValueError(message)
  return mask.astype(jnp.bool_)


def _global(inputs, mask, kind: DtypeKind, num_spatial_dims: int, keepdims: bool, in_features,
            name, owner=None):
  x_shape = tuple(as_array(inputs).shape)
  x, batch = prepare_map(inputs, num_spatial_dims, kind, in_features, name, owner,
                         indexed=kind == "ordered" and mask is None)
  if mask is None:
    y = spatial_mean(x) if kind == "float" else adaptive_max(x, (1,) * num_spatial_dims)
  else:
    valid = _check_mask(mask, x_shape, name).reshape(x.shape[:-1])
    y = (masked_mean if kind == "float" else masked_max)(x, valid)
  y = y if keepdims else y.reshape(y.shape[0], y.shape[-1])
  return unbatch(y, batch)


def _global_options(num_spatial_dims, keepdims, in_features) -> tuple[int, bool, int | None]:
  """The global pools' arguments, checked: the modules' and the functions' one place."""
  return (check_num_spatial_dims(num_spatial_dims), check_bool(keepdims, "keepdims"),
          check_in_features(in_features))


@flax_names
def global_avg_pool(inputs: jax.Array, mask: jax.Array | None = None, *,
                    num_spatial_dims: int = 2, keepdims: bool = False,
                    in_features: int | None = None) -> jax.Array:
  """The function form of :class:`GlobalAvgPool`, with the same arguments and checks.

  Example usage (Keras 3's masked ``GlobalAveragePooling1D`` test batch)::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import functional as F
    >>> x = jnp.arange(24.0).reshape(2, 3, 4)  # (N, L, C)
    >>> F.global_avg_pool(x, jnp.array([[1, 1, 0], [0, 1, 0]]), num_spatial_dims=1)
    Array([[ 2.,  3.,  4.,  5.],
           [16., 17., 18., 19.]], dtype=float32)
  """
  options = _global_options(num_spatial_dims, keepdims, in_features)
  return _global(inputs, mask, "float", *options, "global_avg_pool")


@flax_names
def global_max_pool(inputs: jax.Array, mask: jax.Array | None = None, *,
                    num_spatial_dims: int = 2, keepdims: bool = False,
                    in_features: int | None = None) -> jax.Array:
  """The function form of :class:`GlobalMaxPool`, with the same arguments and checks.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import functional as F
    >>> F.global_max_pool(jnp.array([[3., 1.], [4., 1.], [5., 9.]]), num_spatial_dims=1)
    Array([5., 9.], dtype=float32)
  """
  options = _global_options(num_spatial_dims, keepdims, in_features)
  return _global(inputs, mask, "ordered", *options, "global_max_pool")


# ----------------------------------------------------------------------------
# Modules.
# ----------------------------------------------------------------------------


class _GlobalPool(nnx.Module):
  """A reduction over every spatial axis; subclasses give ``_kind``."""

  _kind: DtypeKind

  @flax_names
  def __init__(
      self, *, num_spatial_dims: int = 2, keepdims: bool = False, in_features: int | None = None
  ):
    self.num_spatial_dims, self.keepdims, self.in_features = _global_options(
        num_spatial_dims, keepdims, in_features)

  def __call__(self, inputs: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Pools ``(N, *spatial, C)`` to ``(N, C)`` (unbatched ``(*spatial, C)`` to ``(C,)``).

    With ``keepdims=True`` the spatial axes stay, with size 1.

    Args:
      inputs: the map, channels-last.
      mask: None (every position), or ``(*batch, *spatial)`` (``inputs``' shape without
        its channel axis), bool or integer, true where a position is valid; a plane with
        no valid position gives 0 (see :mod:`nnx_pool._global`).
    """
    return _global(inputs, mask, self._kind, self.num_spatial_dims, self.keepdims,
                   self.in_features, type(self).__name__, self)


class GlobalAvgPool(_GlobalPool):
  """Mean over every spatial axis, channels-last: ``(N, *spatial, C) -> (N, C)``.

  This is PyTorch's ``adaptive_avg_pool2d(x, 1)`` and ``x.mean((2, 3))``: the
  sum (float32 for float16/bfloat16 inputs) divided by the number of cells, a
  correctly rounded division, so integer-valued maps give bit-exact means. With
  a ``mask`` it is the mean over the valid positions, Keras's masked
  ``GlobalAveragePooling1D`` in every rank, and 0 where none is valid.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import GlobalAvgPool
    >>> x = jnp.arange(12.0).reshape(1, 2, 3, 2)  # (N, H, W, C)
    >>> GlobalAvgPool()(x)
    Array([[5., 6.]], dtype=float32)
    >>> GlobalAvgPool(keepdims=True)(x).shape
    (1, 1, 1, 2)
    >>> GlobalAvgPool()(x, jnp.array([[[True, True, False], [False, False, False]]]))
    Array([[1., 2.]], dtype=float32)

  Args:
    num_spatial_dims: how many axes between batch and channels are spatial, 1, 2
      or 3 (default 2). A rank of ``num_spatial_dims + 2`` is batched and
      ``num_spatial_dims + 1`` unbatched.
    keepdims: keep the spatial axes with size 1 (default False).
    in_features: the channel count, checked against the last axis when given
      (default None).
  """

  _kind: DtypeKind = "float"


class GlobalMaxPool(_GlobalPool):
  """Max over every spatial axis, channels-last: ``(N, *spatial, C) -> (N, C)``.

  PyTorch's ``adaptive_max_pool2d(x, 1)``: NaN propagates, and the gradient
  goes to one cell per plane, the first maximum in row-major order (the last
  NaN if there is one), not split between ties as ``jnp.max`` splits it.
  Integer inputs are accepted. With a ``mask`` it is the max over the valid
  positions, by the same rule, and 0 where none is valid.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import GlobalMaxPool
    >>> x = jnp.array([[[3., 0.], [1., 5.]], [[2., 7.], [4., 1.]]])  # (H, W, C), unbatched
    >>> GlobalMaxPool()(x)
    Array([4., 7.], dtype=float32)
    >>> GlobalMaxPool()(x, jnp.array([[True, True], [True, False]]))
    Array([3., 7.], dtype=float32)

  Args:
    num_spatial_dims: the number of axes, between the batch and the channels,
      that the max is taken over: 1, 2 or 3 (default 2). Inputs of rank
      ``num_spatial_dims + 2`` are batched, of rank ``num_spatial_dims + 1`` not.
    keepdims: whether the result keeps each spatial axis, with length 1
      (default False: ``(N, C)``).
    in_features: when given, the length the channel axis must have (default
      None: any).
  """

  _kind: DtypeKind = "ordered"
