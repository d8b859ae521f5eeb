"""Max unpooling: the inverse scatter of max-pool indices, as PyTorch's MaxUnpool.

The window arguments are MaxPool's, resolved by the same :class:`Window`: an int
is repeated over ``num_spatial_dims`` (default 2), and padding takes every form
MaxPool takes. So the arguments of a MaxPool, copied over, always work.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx

from ._args import check_choice, flax_names
from ._geometry import Window, effective_window
from ._jit import kernel
from ._layout import (
  as_array,
  check_in_features,
  check_plane_indexable,
  concrete_values,
  prepare,
  unbatch,
)
from ._spatial_args import IntLike, PaddingLike, SizeLike, as_tuple


def default_output_size(window: Window, input_size: Sequence[int]) -> tuple[int, ...]:
  """PyTorch's unpooled size per dim, ``(in - 1) * stride - low - high + effective window``.

  For symmetric padding ``p`` and no dilation this is PyTorch's
  ``(in - 1) * s - 2 * p + k``. ``"SAME"`` padding depends on the size it
  came from, so it has no default: pass ``output_size``.
  """
  if window.padding == "SAME":
    raise ValueError(
        'MaxUnpool with padding="SAME" needs `output_size` (the spatial shape that was '
        "pooled): SAME padding depends on it, so the default size cannot be known."
    )
  pads = ((0, 0),) * window.ndim if window.padding == "VALID" else window.padding
  return tuple(
      (n - 1) * s - lo - hi + effective_window(k, d)
      for n, s, (lo, hi), k, d in zip(
          input_size, window.strides, pads, window.shape, window.dilation, strict=True)
  )


def _output_size(window: Window, input_size: tuple[int, ...], output_size) -> tuple[int, ...]:
  """The unpooled spatial shape: the default, or ``output_size`` once checked against it."""
  ndim = window.ndim
  if output_size is None:
    size = default_output_size(window, input_size)
  else:
    if isinstance(output_size, Sequence) and len(output_size) > ndim:
      output_size = tuple(output_size)[-ndim - 1:-1]  # a full (*batch, *spatial, C) shape
    size = as_tuple(output_size, ndim, "output_size")
    if window.padding == "SAME":
      pooled = window.resolve(size).out_shape
      if pooled != input_size:
        raise ValueError(
            f'`output_size` {size} is out of range: with padding="SAME" it pools to '
            f"{pooled}, not to the input's spatial shape {input_size}."
        )
    else:
      default = default_output_size(window, input_size)
      for dim, (want, base, s) in enumerate(zip(size, default, window.strides, strict=True)):
        if not base - s < want < base + s:
          raise ValueError(
              f"`output_size` {size} is out of range: spatial dim {dim} must lie "
              f"strictly between {base - s} and {base + s} (default {base}, stride {s})."
          )
  if any(n < 1 for n in size):
    raise ValueError(f"MaxUnpool: the output size {size} has an empty dim.")
  check_plane_indexable(size, "MaxUnpool", " The output plane is what `indices` address.")
  return size


# The rules for the gradient of the inputs: MaxUnpool's `gradient` argument.
Gradient = Literal["written", "gather"]
_GRADIENTS = {"written": "each cell's cotangent to the value written there",
              "gather": "every value gets the cotangent of the cell its index names, PyTorch's"}


def _max_unpool(inputs, indices, window: Window, output_size, gradient: str, in_features,
                name, owner=None) -> jax.Array:
  shape = tuple(as_array(inputs).shape)
  indices = as_array(indices, "indices")
  x, batch = prepare(inputs, window.ndim, kind="ordered", module=name, in_features=in_features,
                     owner=owner)
  if indices.shape != shape:
    raise ValueError(
        f"{name}: `indices` must have the shape of `inputs` {shape}; got "
        f"{tuple(indices.shape)}."
    )
  if not jnp.issubdtype(indices.dtype, jnp.integer):
    raise TypeError(f"{name}: `indices` must be integers; got dtype {indices.dtype}.")
  indices = indices.reshape(x.shape)
  size = _output_size(window, tuple(x.shape[1:-1]), output_size)
  plane = math.prod(size)
  concrete = concrete_values(indices)  # None under jit, or across processes: out-of-range drop
  if concrete is not None and concrete.size:
    low, high = int(concrete.min()), int(concrete.max())
    if low < 0 or high >= plane:
      raise ValueError(
          f"{name}: `indices` must lie in [0, {plane}) for output size {size}; got values "
          f"in [{low}, {high}]."
      )
  return unbatch(_unpool(x, indices.astype(jnp.int32), size, gradient), batch)


@flax_names
def max_unpool(
    inputs: jax.Array, indices: jax.Array, window_shape: SizeLike,
    strides: SizeLike | None = None, padding: PaddingLike = "VALID", *,
    num_spatial_dims: int | None = None, dilation: SizeLike = 1,
    output_size: Sequence[IntLike] | None = None, gradient: Gradient = "written",
    in_features: int | None = None,
) -> jax.Array:
  """The function form of :class:`MaxUnpool`: the same arguments, defaults and checks.

  ``output_size`` is the one argument that :meth:`MaxUnpool.__call__` takes.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import functional as F
    >>> x = jnp.arange(25.0).reshape(1, 5, 5, 1)
    >>> values, indices = F.max_pool(x, 2, 2, return_indices=True)
    >>> F.max_unpool(values, indices, 2, output_size=(5, 5))[0, ..., 0]
    Array([[ 0.,  0.,  0.,  0.,  0.],
           [ 0.,  6.,  0.,  8.,  0.],
           [ 0.,  0.,  0.,  0.,  0.],
           [ 0., 16.,  0., 18.,  0.],
           [ 0.,  0.,  0.,  0.,  0.]], dtype=float32)
  """
  window = Window.create(window_shape, strides, padding, dilation=dilation,
                         num_spatial_dims=num_spatial_dims, layer="max_unpool")
  return _max_unpool(inputs, indices, window, output_size,
                     check_choice(gradient, "gradient", _GRADIENTS),
                     check_in_features(in_features), "max_unpool")


class MaxUnpool(nnx.Module):
  """Scatters pooled values back to the positions their indices name; zeros elsewhere.

  The partial inverse of :class:`MaxPool` with ``return_indices=True``, built
  from the same window arguments. Indices are PyTorch's flat per-plane indices
  (``h * W + w`` in 2-D). The default output size per spatial dim is
  ``(in - 1) * stride - pad_low - pad_high + dilation * (window - 1) + 1``
  (PyTorch's ``(in - 1) * s - 2 * p + k``); an explicit ``output_size`` must lie
  strictly within one stride of it, as in PyTorch. With ``padding="SAME"``
  there is no default: ``output_size`` must be given, and must pool back to
  the input's spatial shape. When several inputs name the same cell, the last
  one in row-major input order wins (PyTorch leaves this to its threads).
  Outside ``jax.jit``, indices out of range raise ``ValueError``; inside it
  they are dropped.

  The result is differentiable in ``inputs``, by one of two rules (``gradient``).
  They differ only where indices collide (overlapping pooling windows that chose the
  same cell), where one value is written and the others are not:

  * ``"written"`` (the default): each cell's cotangent goes back to the input that was
    written there, and the others get 0: the derivative of this forward.
  * ``"gather"``: every input gets the cotangent of the cell its index names, written
    or not: PyTorch's backward (``grad_output`` gathered at ``indices``), for
    gradients that match PyTorch's when porting. Forward mode gives its transpose,
    the sum of the tangents of every input naming a cell.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import MaxPool, MaxUnpool
    >>> x = jnp.array([[1., 2, 5, 6], [3, 4, 8, 7], [0, -1, -3, -2], [-4, 9, -6, -5]])
    >>> values, indices = MaxPool(2, return_indices=True)(x[:, :, None])
    >>> MaxUnpool(2)(values, indices)[..., 0]
    Array([[ 0.,  0.,  0.,  0.],
           [ 0.,  4.,  8.,  0.],
           [ 0.,  0.,  0., -2.],
           [ 0.,  9.,  0.,  0.]], dtype=float32)

  Args:
    window_shape: the pooling window, an int (repeated over ``num_spatial_dims``)
      or a tuple of 1 to 3 ints.
    strides: an int or a tuple; defaults to ``window_shape``.
    padding: the pooling's padding, any form :class:`MaxPool` takes:
      ``"VALID"`` (default), ``"SAME"`` (then ``output_size`` is required), an
      int, a tuple of ints or a tuple of ``(low, high)`` pairs.
    num_spatial_dims: 1, 2 or 3, keyword-only (default 2, unless a tuple
      argument sets it by its length).
    dilation: the pooling's dilation, an int or a tuple (default 1).
    gradient: ``"written"`` (default) or ``"gather"`` (PyTorch's), the rule above.
    in_features: the channel count, checked against the last axis when given
      (default None).
  """

  @flax_names
  def __init__(self, window_shape: SizeLike, strides: SizeLike | None = None,
               padding: PaddingLike = "VALID", *, num_spatial_dims: int | None = None,
               dilation: SizeLike = 1, gradient: Gradient = "written",
               in_features: int | None = None):
    self.window = Window.create(window_shape, strides, padding, dilation=dilation,
                                num_spatial_dims=num_spatial_dims, layer=type(self).__name__)
    self.gradient = check_choice(gradient, "gradient", _GRADIENTS)
    self.in_features = check_in_features(in_features)

  def default_output_size(self, input_size: Sequence[int]) -> tuple[int, ...]:
    """The unpooled spatial shape for a pooled spatial shape ``input_size``, when not given.

    Raises:
      ValueError: with ``padding="SAME"``, which needs an explicit ``output_size``.
    """
    return default_output_size(self.window, tuple(input_size))

  def __call__(self, inputs: jax.Array, indices: jax.Array,
               output_size: Sequence[IntLike] | None = None) -> jax.Array:
    """Unpools ``(N, *in, C)`` (or ``(*in, C)``) with same-shaped integer ``indices``.

    Args:
      inputs: the pooled values, channels-last.
      indices: the int flat per-plane indices that MaxPool returned with them.
      output_size: the spatial shape to unpool to, usually that of the map
        that was pooled: a tuple of one int per spatial dim (or a full
        ``(N, *spatial, C)`` / ``(*spatial, C)`` shape, whose spatial part is
        used), or an int for every dim. Default None: :meth:`default_output_size`.
        Required with ``padding="SAME"``.

    Returns:
      ``(N, *output_size, C)`` (or ``(*output_size, C)``), zero where no index points.
    """
    return _max_unpool(inputs, indices, self.window, output_size, self.gradient,
                       self.in_features, type(self).__name__, self)


def _written(values: jax.Array, targets: jax.Array, plane: int) -> jax.Array:
  """Each row of ``values`` ``(N, C, cells)`` written to its ``targets`` in a row of ``plane``
  cells: where several name a cell, the last in input order; zeros where none does."""
  cells = values.shape[-1]

  def winners(target):
    # The highest input position writing each cell wins; -1 where none writes.
    rank = jnp.arange(cells, dtype=jnp.int32)
    return jnp.full((plane,), -1, jnp.int32).at[target].max(rank, mode="drop")

  winner = jax.vmap(jax.vmap(winners))(targets)
  gathered = jnp.take_along_axis(values, jnp.maximum(winner, 0), axis=-1)
  return jnp.where(winner >= 0, gathered, jnp.zeros((), values.dtype))


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _gathered(values: jax.Array, targets: jax.Array, plane: int) -> jax.Array:
  """:func:`_written`, differentiated by PyTorch's rule: the transpose of its tangent map (a
  scatter-add of every value to its target) gathers each cell's cotangent to every value
  whose index names it."""
  return _written(values, targets, plane)


@_gathered.defjvp
def _gathered_jvp(plane, primals, tangents):
  values, targets = primals

  def scatter_add(tangent, target):
    return jnp.zeros((plane,), tangent.dtype).at[target].add(tangent, mode="drop")

  return _gathered(values, targets, plane), jax.vmap(jax.vmap(scatter_add))(tangents[0], targets)


@kernel(static_argnums=(2, 3))
def _unpool(x: jax.Array, indices: jax.Array, size: tuple[int, ...], gradient: str) -> jax.Array:
  n, c = x.shape[0], x.shape[-1]
  cells, plane = math.prod(x.shape[1:-1]), math.prod(size)
  # (N, P, C) -> (N, C, P): one row per plane (P spelt out: N or C may be 0).
  values = jnp.moveaxis(x.reshape(n, cells, c), -1, 1)
  targets = jnp.moveaxis(indices.reshape(n, cells, c), -1, 1)
  y = (_written if gradient == "written" else _gathered)(values, targets, plane)
  return jnp.moveaxis(y, 1, -1).reshape(n, *size, c)
