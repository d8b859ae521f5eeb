"""Window pooling modules: average, max, min and LP pooling over 1, 2 or 3 spatial dims.

Inputs are channels-last, ``(N, *spatial, C)`` or unbatched ``(*spatial, C)``;
the number of spatial dims is ``len(window_shape)`` (1 for an int window).

**Strides default to the window**, as in PyTorch, Keras and TF. Flax's
``nnx.avg_pool``/``nnx.max_pool`` default to stride 1: pass ``strides=1`` to get
that behaviour.

Output sizes, ceil mode, border divisors, padding values, ties, NaN and the
flat indices follow PyTorch (see :mod:`nnx_pool._geometry`). ``padding="SAME"``
places padding as lax and Flax do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from nnx_pool import _kernels
from nnx_pool._args import check_bool, check_number, check_positive_int
from nnx_pool._geometry import MAX_SIZE, PaddingLike, Window
from nnx_pool._layout import DtypeKind, check_in_features, check_plane_indexable, prepare


class _WindowPool(nnx.Module):
  """Shared plumbing: the validated window, the optional channel check, batching."""

  _dtype_kind: DtypeKind = "float"

  def __init__(self, window: Window, in_features):
    self.window = window
    self.in_features = check_in_features(in_features)

  def _prepare(self, inputs) -> tuple[jax.Array, bool]:
    return prepare(
        inputs, self.window.ndim, kind=self._dtype_kind, module=type(self).__name__,
        in_features=self.in_features,
    )


def _spatial(divisor: np.ndarray) -> np.ndarray:
  """A divisor of shape ``out_shape`` as ``(1, *out_shape, 1)``, to broadcast over N and C."""
  return divisor.reshape(1, *divisor.shape, 1) if divisor.ndim else divisor


class AvgPool(_WindowPool):
  """Average pooling with PyTorch's border rules, channels-last.

  Each output is the sum of its window divided by:

  * ``divisor_override`` when given;
  * else, with ``count_include_pad=True`` (the default), the window clipped to
    ``[-pad_low, L + pad_high)``: explicit padding counts, the ceil-mode overhang
    does not (PyTorch). With ``padding="SAME"`` this is ``prod(window_shape)``,
    Flax's default;
  * else the number of real input cells in the window (PyTorch with
    ``count_include_pad=False``; Keras and TF for ``"SAME"``).

  Divisors are computed from the geometry, not by pooling an array of ones.
  float16 and bfloat16 inputs are summed in float32 and the result cast back.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import AvgPool
    >>> x = jnp.arange(16.0).reshape(1, 4, 4, 1)
    >>> AvgPool((2, 2))(x)[0, ..., 0]  # strides default to the window
    Array([[ 2.5,  4.5],
           [10.5, 12.5]], dtype=float32)

  Args:
    window_shape: the window, an int (1-D) or a tuple of 1 to 3 ints.
    strides: an int or a tuple; defaults to ``window_shape`` (not 1).
    padding: ``"VALID"`` (default) or ``"SAME"`` (any case), an int, a tuple of
      ints (symmetric per dim) or a tuple of ``(low, high)`` pairs. Explicit
      padding may be at most half the window on each side.
    ceil_mode: round the output size up, as PyTorch (default False).
    count_include_pad: whether padding cells count in the divisor (default True).
    divisor_override: a positive int to divide every window by (default None).
    in_features: the channel count, checked against the last axis when given.
  """

  def __init__(
      self,
      window_shape,
      strides=None,
      padding: PaddingLike = "VALID",
      *,
      ceil_mode: bool = False,
      count_include_pad: bool = True,
      divisor_override: int | None = None,
      in_features: int | None = None,
  ):
    window = Window.create(window_shape, strides, padding, ceil_mode=ceil_mode)
    super().__init__(window, in_features)
    self.count_include_pad = check_bool(count_include_pad, "count_include_pad")
    divisor_override = check_positive_int(divisor_override, "divisor_override", optional=True)
    if divisor_override is not None and divisor_override > MAX_SIZE:
      raise ValueError(
          f"`divisor_override` must be at most 2**63 - 1 (int64); got {divisor_override}.")
    self.divisor_override = divisor_override

  def __call__(self, inputs) -> jax.Array:
    """Pools ``(N, *spatial, C)`` or ``(*spatial, C)`` to ``(N, *out, C)`` or ``(*out, C)``."""
    x, batched = self._prepare(inputs)
    geom = self.window.resolve(x.shape[1:-1])
    total = _kernels.window_sum(x.astype(_kernels.accumulation_dtype(x.dtype)), geom)
    if self.divisor_override is not None:
      divisor = np.asarray(self.divisor_override)
    else:
      divisor = geom.divisor(count_include_pad=self.count_include_pad)
    y = _kernels.true_divide(total, _spatial(divisor)).astype(x.dtype)
    return y if batched else y[0]


class _SelectPool(_WindowPool):
  """Max or min pooling: the extremum of each window, optionally with its index."""

  _dtype_kind: DtypeKind = "ordered"
  _kind: _kernels.Kind

  def __init__(
      self,
      window_shape,
      strides=None,
      padding: PaddingLike = "VALID",
      *,
      dilation=1,
      ceil_mode: bool = False,
      return_indices: bool = False,
      in_features: int | None = None,
  ):
    window = Window.create(window_shape, strides, padding, dilation=dilation, ceil_mode=ceil_mode)
    super().__init__(window, in_features)
    self.return_indices = check_bool(return_indices, "return_indices")

  def __call__(self, inputs) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Pools ``(N, *spatial, C)`` or ``(*spatial, C)``.

    Returns:
      The pooled array, ``(N, *out, C)`` or ``(*out, C)``; with
      ``return_indices=True``, also the int32 flat per-plane index of each
      selected element (PyTorch's convention, ``h * W + w`` in 2-D) in the same shape.
    """
    x, batched = self._prepare(inputs)
    if self.return_indices:
      check_plane_indexable(
          x.shape[1:-1], type(self).__name__, " Pool without return_indices, or tile the map.")
    geom = self.window.resolve(x.shape[1:-1])
    values, arg = _kernels.select(x, geom, self._kind, self.return_indices)
    out = (values, _kernels.flat_indices(arg, geom)) if self.return_indices else values
    return out if batched else jax.tree.map(lambda a: a[0], out)


class MaxPool(_SelectPool):
  """Max pooling with PyTorch's semantics and an exact gradient, channels-last.

  Padding holds -inf (an integer dtype's minimum) and never wins. On ties the
  first maximum in row-major window order wins; NaN propagates (the last NaN
  in the window wins, as in PyTorch). The gradient of each output goes to
  exactly the element that ``return_indices`` reports, and accumulates where
  windows overlap; it works with dilation, ceil mode, every padding form,
  forward and reverse mode, and to any order (the second derivative is zero).

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import MaxPool
    >>> grid = jnp.array([[1., 2, 5, 6], [3, 4, 8, 7], [0, -1, -3, -2], [-4, 9, -6, -5]])
    >>> values, indices = MaxPool((2, 2), return_indices=True)(grid[None, :, :, None])
    >>> values[0, ..., 0]
    Array([[ 4.,  8.],
           [ 9., -2.]], dtype=float32)
    >>> indices[0, ..., 0]
    Array([[ 5,  6],
           [13, 11]], dtype=int32)

  Args:
    window_shape: the window, an int (1-D) or a tuple of 1 to 3 ints.
    strides: an int or a tuple; defaults to ``window_shape`` (not 1).
    padding: ``"VALID"`` (default), ``"SAME"``, an int, a tuple of ints or a
      tuple of ``(low, high)`` pairs; at most half the effective window per side.
    dilation: spacing between window taps, an int or a tuple (default 1).
    ceil_mode: round the output size up, as PyTorch (default False).
    return_indices: also return the flat per-plane indices (default False).
    in_features: the channel count, checked against the last axis when given.
  """

  _kind = "max"


class MinPool(_SelectPool):
  """Min pooling: :class:`MaxPool` with ``<`` in place of ``>``.

  Padding holds +inf (an integer dtype's maximum); the first minimum wins on
  ties, NaN propagates, and ``return_indices`` reports the argmin. Unlike
  ``-max_pool(-x)``, integer minima do not overflow.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import MinPool
    >>> MinPool(2)(jnp.array([[3.], [1.], [4.], [1.], [5.], [9.]]))[:, 0]
    Array([1., 1., 5.], dtype=float32)

  Args: as :class:`MaxPool`.
  """

  _kind = "min"


class LPPool(_WindowPool):
  """Power-average pooling, ``(sum over the window of x**p) ** (1/p)``, as PyTorch.

  As in PyTorch there is no padding, ``x**p`` is taken without an absolute
  value (odd ``p`` over negative sums gives NaN), and with ``ceil_mode`` a
  partial window's sum is scaled by ``prod(window_shape) / cells``.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import LPPool
    >>> LPPool(2, 2)(jnp.array([[3.], [4.], [6.], [8.]]))[:, 0]
    Array([ 5., 10.], dtype=float32)

  Args:
    norm_type: the power ``p``, a positive finite number.
    window_shape: the window, an int (1-D) or a tuple of 1 to 3 ints.
    strides: an int or a tuple; defaults to ``window_shape`` (not 1).
    ceil_mode: round the output size up, as PyTorch (default False).
    in_features: the channel count, checked against the last axis when given.
  """

  def __init__(
      self,
      norm_type: float,
      window_shape,
      strides=None,
      *,
      ceil_mode: bool = False,
      in_features: int | None = None,
  ):
    norm_type = check_number(norm_type, "norm_type", positive=True)
    super().__init__(Window.create(window_shape, strides, 0, ceil_mode=ceil_mode), in_features)
    self.norm_type = norm_type

  def __call__(self, inputs) -> jax.Array:
    """Pools ``(N, *spatial, C)`` or ``(*spatial, C)`` to ``(N, *out, C)`` or ``(*out, C)``."""
    x, batched = self._prepare(inputs)
    geom = self.window.resolve(x.shape[1:-1])
    p = self.norm_type
    xa = x.astype(_kernels.accumulation_dtype(x.dtype))
    powered = lax.integer_pow(xa, int(p)) if p.is_integer() else jnp.power(xa, p)
    # PyTorch: avg_pool(x**p) * prod(window), so partial windows scale by k / cells.
    cells = _spatial(geom.divisor(count_include_pad=True))
    mean = _kernels.true_divide(_kernels.window_sum(powered, geom), cells)
    y = jnp.power(mean * float(self.window.size), 1.0 / p).astype(x.dtype)
    return y if batched else y[0]
