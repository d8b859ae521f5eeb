"""Max unpooling: the inverse scatter of max-pool indices, as PyTorch's MaxUnpool."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_pool._geometry import as_tuple, num_spatial_dims
from nnx_pool._layout import (
  as_array,
  check_dtype,
  check_features,
  check_in_features,
  check_plane_indexable,
  check_rank,
)


class MaxUnpool(nnx.Module):
  """Scatters pooled values back to the positions their indices name; zeros elsewhere.

  The partial inverse of :class:`MaxPool` with ``return_indices=True``. Indices
  are PyTorch's flat per-plane indices (``h * W + w`` in 2-D). The default
  output size per spatial dim is ``(in - 1) * stride - 2 * padding + window``;
  an explicit ``output_size`` must lie strictly within one stride of it, as in
  PyTorch. When several inputs name the same cell, the last one in row-major
  input order wins (PyTorch leaves this to its threads). Outside ``jax.jit``,
  indices out of range raise ``ValueError``; inside it they are dropped.

  The result is differentiable in ``inputs``: each cell's cotangent goes back to
  the input that was written there.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import MaxPool, MaxUnpool
    >>> x = jnp.array([[1., 2, 5, 6], [3, 4, 8, 7], [0, -1, -3, -2], [-4, 9, -6, -5]])
    >>> values, indices = MaxPool((2, 2), return_indices=True)(x[:, :, None])
    >>> MaxUnpool((2, 2))(values, indices)[..., 0]
    Array([[ 0.,  0.,  0.,  0.],
           [ 0.,  4.,  8.,  0.],
           [ 0.,  0.,  0., -2.],
           [ 0.,  9.,  0.,  0.]], dtype=float32)

  Args:
    window_shape: the pooling window, an int (1-D) or a tuple of 1 to 3 ints.
    strides: an int or a tuple; defaults to ``window_shape``.
    padding: the pooling's symmetric padding, an int or a tuple of ints (default 0).
    in_features: the channel count, checked against the last axis when given.
  """

  def __init__(self, window_shape, strides=None, padding=0, *, in_features: int | None = None):
    ndim = num_spatial_dims(window_shape)
    self.window_shape = as_tuple(window_shape, ndim, "window_shape")
    self.strides = self.window_shape if strides is None else as_tuple(strides, ndim, "strides")
    self.padding = as_tuple(padding, ndim, "padding", minimum=0)
    self.in_features = check_in_features(in_features)

  def default_output_size(self, input_size: Sequence[int]) -> tuple[int, ...]:
    """PyTorch's output size for a pooled spatial shape: ``(in - 1) * s - 2 * p + k``."""
    return tuple(
        (n - 1) * s - 2 * p + k
        for n, s, p, k in zip(
            input_size, self.strides, self.padding, self.window_shape, strict=True)
    )

  def _output_size(self, input_size, output_size) -> tuple[int, ...]:
    default = self.default_output_size(input_size)
    if output_size is None:
      size = default
    else:
      ndim = len(default)
      if isinstance(output_size, Sequence) and len(output_size) in (ndim + 1, ndim + 2):
        output_size = tuple(output_size)[-ndim - 1:-1]  # a full (N, *spatial, C) shape
      size = as_tuple(output_size, ndim, "output_size")
      for dim, (want, base, s) in enumerate(zip(size, default, self.strides, strict=True)):
        if not base - s < want < base + s:
          raise ValueError(
              f"`output_size` {tuple(size)} is out of range: spatial dim {dim} must lie "
              f"strictly between {base - s} and {base + s} (default {base}, stride {s})."
          )
    if any(n < 1 for n in size):
      raise ValueError(f"MaxUnpool: the output size {size} has an empty dim.")
    check_plane_indexable(size, "MaxUnpool", " The output plane is what `indices` address.")
    return size

  def __call__(self, inputs, indices, output_size=None) -> jax.Array:
    """Unpools ``(N, *in, C)`` (or ``(*in, C)``) with same-shaped integer ``indices``.

    Returns:
      ``(N, *output_size, C)`` (or ``(*output_size, C)``), zero where no index points.
    """
    name = type(self).__name__
    x = as_array(inputs)
    indices = as_array(indices, "indices")
    check_dtype(x, "ordered", name)
    batched = check_rank(x, len(self.window_shape), name)
    check_features(x, self.in_features, batched, name)
    if indices.shape != x.shape:
      raise ValueError(
          f"{name}: `indices` must have the shape of `inputs` {tuple(x.shape)}; got "
          f"{tuple(indices.shape)}."
      )
    if not jnp.issubdtype(indices.dtype, jnp.integer):
      raise TypeError(f"{name}: `indices` must be integers; got dtype {indices.dtype}.")
    if not batched:
      x, indices = x[None], indices[None]
    size = self._output_size(x.shape[1:-1], output_size)
    plane = math.prod(size)
    try:
      concrete = np.asarray(indices)
    except jax.errors.TracerArrayConversionError:  # inside jit: out-of-range indices drop
      concrete = None
    if concrete is not None and concrete.size:
      low, high = int(concrete.min()), int(concrete.max())
      if low < 0 or high >= plane:
        raise ValueError(
            f"{name}: `indices` must lie in [0, {plane}) for output size {size}; got values "
            f"in [{low}, {high}]."
        )
    y = _unpool(x, indices.astype(jnp.int32), size)
    return y if batched else y[0]


@functools.partial(jax.jit, static_argnums=2)
def _unpool(x: jax.Array, indices: jax.Array, size: tuple[int, ...]) -> jax.Array:
  n, c = x.shape[0], x.shape[-1]
  cells, plane = math.prod(x.shape[1:-1]), math.prod(size)
  # (N, P, C) -> (N, C, P): one row per plane (P spelt out: N or C may be 0).
  values = jnp.moveaxis(x.reshape(n, cells, c), -1, 1)
  targets = jnp.moveaxis(indices.reshape(n, cells, c), -1, 1)

  def winners(target):
    # The highest input position writing each cell wins; -1 where none writes.
    rank = jnp.arange(cells, dtype=jnp.int32)
    return jnp.full((plane,), -1, jnp.int32).at[target].max(rank, mode="drop")

  winner = jax.vmap(jax.vmap(winners))(targets)
  gathered = jnp.take_along_axis(values, jnp.maximum(winner, 0), axis=-1)
  y = jnp.where(winner >= 0, gathered, jnp.zeros((), x.dtype))
  return jnp.moveaxis(y, 1, -1).reshape(n, *size, c)
