"""Window pooling modules: average, max, min and LP pooling over 1, 2 or 3 spatial dims.

Inputs are channels-last, ``(N, *spatial, C)`` or unbatched ``(*spatial, C)``.
An int window, stride, padding or dilation is repeated over
``num_spatial_dims`` (keyword-only, default 2: ``MaxPool(3, 2, 1)`` is PyTorch's
``MaxPool2d(3, 2, 1)``); a tuple sets the dims by its length, and one that
disagrees with ``num_spatial_dims`` is a ValueError. 1-D is
``MaxPool(3, num_spatial_dims=1)`` or ``MaxPool((3,))``.

Each module has a functional twin (:mod:`nnx_pool.functional`) with the same
arguments; both run the same implementation (:mod:`nnx_pool._window_kernels`).

**Strides default to the window**, as in PyTorch, Keras and TF. Flax's
``nnx.avg_pool``/``nnx.max_pool`` default to stride 1: pass ``strides=1`` to get
that behaviour.

Output sizes, ceil mode, border divisors, padding values, ties, NaN and the
flat indices follow PyTorch (see :mod:`nnx_pool._geometry`). ``padding="SAME"``
places padding as lax and Flax do.
"""

from __future__ import annotations

import functools
import inspect
import textwrap
from collections.abc import Callable
from typing import Any, Generic, Literal, Protocol, TypedDict, TypeVar, Unpack, cast, overload

import jax
from flax import nnx

from ._args import check_bool, check_number, check_positive_int, flax_names
from ._geometry import Window
from ._layout import check_in_features
from ._select import Kind, Out, ValuesAndIndices
from ._spatial_args import MAX_SIZE, PaddingLike, SizeLike
from ._window_kernels import run_average, run_extremum, run_lp_norm


def _check_divisor_override(value) -> int | None:
  value = check_positive_int(value, "divisor_override", optional=True)
  if value is not None and value > MAX_SIZE:
    raise ValueError(f"`divisor_override` must be at most 2**63 - 1 (int64); got {value}.")
  return value


# ----------------------------------------------------------------------------
# Functions.
# ----------------------------------------------------------------------------


def _check_strides_given(strides, window_shape, kind: str) -> None:
  """Refuses an omitted (or None) ``strides``, whose default Flax and PyTorch disagree on."""
  if strides is not _OMITTED and strides is not None:
    return
  got = "got None" if strides is None else "was omitted"
  module = {"avg": "AvgPool", "max": "MaxPool", "min": "MinPool"}[kind]
  raise TypeError(
      f"{kind}_pool: `strides` has no default in nnx_pool.functional, and {got}. "
      f"flax.nnx.{kind}_pool defaults it to 1 (and reads None as 1); PyTorch's pools and "
      f"nnx_pool.{module} to the window. Pass it: strides={window_shape!r} for PyTorch's "
      "convention, strides=1 for Flax's."
  )


_OMITTED = object()
_F = TypeVar("_F", bound=Callable[..., Any])


def _strides_required(fn: _F) -> _F:
  """``fn``, whose ``strides`` (its third argument) is required in its signature, with an
  omitted one refused by :func:`_check_strides_given`'s message rather than Python's."""
  kind = fn.__name__.removesuffix("_pool")

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    if len(args) < 3 and "strides" not in kwargs:
      window_shape = args[1] if len(args) > 1 else kwargs.get("window_shape")
      _check_strides_given(_OMITTED, window_shape, kind)
    return fn(*args, **kwargs)

  return cast(_F, wrapper)


@flax_names
@_strides_required
def avg_pool(
    inputs: jax.Array, window_shape: SizeLike, strides: SizeLike,
    padding: PaddingLike = "VALID", *,
    num_spatial_dims: int | None = None, ceil_mode: bool = False,
    count_include_pad: bool = True, divisor_override: int | None = None,
    in_features: int | None = None,
) -> jax.Array:
  """The function form of :class:`AvgPool`: the same arguments and checks; ``strides`` required.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import functional as F
    >>> F.avg_pool(jnp.arange(16.0).reshape(1, 4, 4, 1), 2, 2)[0, ..., 0]
    Array([[ 2.5,  4.5],
           [10.5, 12.5]], dtype=float32)
  """
  _check_strides_given(strides, window_shape, "avg")
  window = Window.create(window_shape, strides, padding, ceil_mode=ceil_mode,
                         num_spatial_dims=num_spatial_dims, layer="avg_pool")
  return run_average(inputs, window, check_bool(count_include_pad, "count_include_pad"),
              _check_divisor_override(divisor_override), check_in_features(in_features),
              "avg_pool")


def _select_pool(kind: Kind, inputs, window_shape, strides, padding, num_spatial_dims,
                 dilation, ceil_mode, return_indices, in_features
                 ) -> jax.Array | tuple[jax.Array, jax.Array]:
  _check_strides_given(strides, window_shape, kind)
  window = Window.create(window_shape, strides, padding, dilation=dilation, ceil_mode=ceil_mode,
                         num_spatial_dims=num_spatial_dims, layer=f"{kind}_pool")
  return run_extremum(inputs, window, kind, check_bool(return_indices, "return_indices"),
                 check_in_features(in_features), f"{kind}_pool")


class _SelectFunction(Protocol):
  """:func:`max_pool`'s and :func:`min_pool`'s signature, written once: the result type
  follows a literal ``return_indices`` (True: ``(values, indices)``); a bool variable gives
  the union."""

  @overload
  def __call__(
      self, inputs: jax.Array, window_shape: SizeLike, strides: SizeLike,
      padding: PaddingLike = "VALID", *, num_spatial_dims: int | None = None,
      dilation: SizeLike = 1, ceil_mode: bool = False, return_indices: Literal[False] = False,
      in_features: int | None = None) -> jax.Array: ...
  @overload
  def __call__(
      self, inputs: jax.Array, window_shape: SizeLike, strides: SizeLike,
      padding: PaddingLike = "VALID", *, num_spatial_dims: int | None = None,
      dilation: SizeLike = 1, ceil_mode: bool = False, return_indices: Literal[True],
      in_features: int | None = None) -> ValuesAndIndices: ...
  @overload
  def __call__(
      self, inputs: jax.Array, window_shape: SizeLike, strides: SizeLike,
      padding: PaddingLike = "VALID", *, num_spatial_dims: int | None = None,
      dilation: SizeLike = 1, ceil_mode: bool = False, return_indices: bool,
      in_features: int | None = None) -> jax.Array | ValuesAndIndices: ...


def _select_function(fn: Callable[..., Any]) -> _SelectFunction:
  """``fn`` with :func:`~nnx_pool._args.flax_names` and :func:`_strides_required`, typed with
  :class:`_SelectFunction`'s overloads."""
  return flax_names(_strides_required(fn))


@_select_function
def max_pool(inputs: jax.Array, window_shape: SizeLike, strides: SizeLike,
             padding: PaddingLike = "VALID", *, num_spatial_dims: int | None = None,
             dilation: SizeLike = 1, ceil_mode: bool = False, return_indices: bool = False,
             in_features: int | None = None) -> jax.Array | ValuesAndIndices:
  """The function form of :class:`MaxPool`: the same arguments and checks; ``strides`` required.

  With ``return_indices=True`` the result is ``(values, indices)``; type checkers read the
  result's type from a literal True or False.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import functional as F
    >>> x = jnp.arange(25.0).reshape(1, 5, 5, 1)
    >>> values, indices = F.max_pool(x, 3, 2, 1, ceil_mode=True, return_indices=True)
    >>> indices[0, ..., 0]
    Array([[ 6,  8,  9],
           [16, 18, 19],
           [21, 23, 24]], dtype=int32)
  """
  return _select_pool("max", inputs, window_shape, strides, padding, num_spatial_dims, dilation,
                      ceil_mode, return_indices, in_features)


@_select_function
def min_pool(inputs: jax.Array, window_shape: SizeLike, strides: SizeLike,
             padding: PaddingLike = "VALID", *, num_spatial_dims: int | None = None,
             dilation: SizeLike = 1, ceil_mode: bool = False, return_indices: bool = False,
             in_features: int | None = None) -> jax.Array | ValuesAndIndices:
  """Min pooling, :class:`MinPool`'s function: :func:`max_pool` with ``<`` for ``>``.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import functional as F
    >>> F.min_pool(jnp.array([[3.], [1.], [4.], [1.], [5.], [9.]]), 2, 2, num_spatial_dims=1)
    Array([[1.],
           [1.],
           [5.]], dtype=float32)
  """
  return _select_pool("min", inputs, window_shape, strides, padding, num_spatial_dims, dilation,
                      ceil_mode, return_indices, in_features)


@flax_names
def lp_pool(
    inputs: jax.Array, norm_type: float, window_shape: SizeLike,
    strides: SizeLike | None = None, *, num_spatial_dims: int | None = None,
    ceil_mode: bool = False, in_features: int | None = None,
) -> jax.Array:
  """The function form of :class:`LPPool`: the same arguments, defaults and checks."""
  norm_type = check_number(norm_type, "norm_type", positive=True)
  window = Window.create(window_shape, strides, 0, ceil_mode=ceil_mode,
                         num_spatial_dims=num_spatial_dims)
  return run_lp_norm(inputs, window, norm_type, check_in_features(in_features), "lp_pool")


# ----------------------------------------------------------------------------
# Modules.
# ----------------------------------------------------------------------------

_Module = TypeVar("_Module", bound=nnx.Module)

# Each argument's text, written once: every module's ``Args:`` section is made from the
# entries its __init__ takes, in order (_document).
_ARGS = {
    "norm_type": "the power ``p``, a positive finite number.",
    "window_shape": (
        "the window, an int (repeated over ``num_spatial_dims``) or a tuple of 1 to 3 "
        "ints, one per spatial dim."),
    "strides": (
        "the step between windows, an int or a tuple; omitted (None), it is the window "
        "(PyTorch's default; Flax's functions default to 1)."),
    "padding": (
        'cells added around the input: ``"VALID"`` (none, the default) or ``"SAME"`` (any '
        "case), an int (both sides of every dim), a tuple of ints (symmetric per dim) or a "
        "tuple of ``(low, high)`` pairs; at most half the (dilated) window on a side."),
    "num_spatial_dims": (
        "how many dims an int argument stands for, 1, 2 or 3; keyword-only, 2 unless a "
        "tuple argument sets it by its length."),
    "dilation": "the spacing between the cells a window reads, an int or a tuple (default 1).",
    "ceil_mode": (
        "keep a last, partial window, as PyTorch's ``ceil_mode`` rounds the output size "
        "up (default False)."),
    "count_include_pad": "whether padding cells count in the divisor (default True).",
    "divisor_override": "a positive int to divide every window by (default None).",
    "return_indices": (
        "also return the int32 flat per-plane index of each selected element (default "
        "False). Type checkers read it: the module is generic in what a call returns, "
        "``tuple[jax.Array, jax.Array]`` when built with a literal True, else ``jax.Array`` "
        "(what a bare ``MaxPool`` or ``MinPool`` annotation means)."),
    "in_features": (
        "the channel count, checked against the last axis when given (default None: not "
        "checked)."),
}


def _document(cls: type[_Module]) -> type[_Module]:
  """Appends to ``cls``'s docstring an ``Args:`` section: the :data:`_ARGS` entries of the
  arguments its ``__init__`` takes, in their order. (``python -OO`` drops docstrings.)"""
  if cls.__doc__ is None:
    return cls
  names = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
  entries = (textwrap.fill(f"{name}: {_ARGS[name]}", 88, initial_indent="  ",
                           subsequent_indent="    ") for name in names)
  cls.__doc__ = "\n".join([inspect.cleandoc(cls.__doc__), "", "Args:", *entries, ""])
  return cls


@_document
class AvgPool(nnx.Module):
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

  """

  @flax_names
  def __init__(
      self, window_shape: SizeLike, strides: SizeLike | None = None,
      padding: PaddingLike = "VALID", *, num_spatial_dims: int | None = None,
      ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None,
      in_features: int | None = None,
  ):
    self.window = Window.create(window_shape, strides, padding, ceil_mode=ceil_mode,
                                num_spatial_dims=num_spatial_dims, layer=type(self).__name__)
    self.count_include_pad = check_bool(count_include_pad, "count_include_pad")
    self.divisor_override = _check_divisor_override(divisor_override)
    self.in_features = check_in_features(in_features)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Pools ``(N, *spatial, C)`` or ``(*spatial, C)`` to ``(N, *out, C)`` or ``(*out, C)``."""
    return run_average(inputs, self.window, self.count_include_pad, self.divisor_override,
                self.in_features, type(self).__name__, self)


class _SelectOptions(TypedDict, total=False):
  """:class:`MaxPool`'s and :class:`MinPool`'s keyword-only options other than
  ``return_indices``, for their constructors' overloads."""

  num_spatial_dims: int | None
  dilation: SizeLike
  ceil_mode: bool
  in_features: int | None


class _SelectPool(nnx.Module, Generic[Out]):
  """Max or min pooling: the extremum of each window, optionally with its index.

  Generic in what a call returns (:data:`~nnx_pool._select.Out`): ``MaxPool(2)`` is a
  ``MaxPool[jax.Array]``, ``MaxPool(2, return_indices=True)`` a
  ``MaxPool[tuple[jax.Array, jax.Array]]``, and a bare ``MaxPool`` annotation means the
  first.
  """

  _kind: Kind

  # A literal return_indices picks the type; a bool variable gives the union. Each overload
  # names the class it builds (a type checker specialises a constructor's class only from a
  # `self` of that very class), so both classes' are here, written once, in turn.
  @overload
  def __init__(self: MaxPool[jax.Array], window_shape: SizeLike, strides: SizeLike | None = None,
               padding: PaddingLike = "VALID", *, return_indices: Literal[False] = False,
               **options: Unpack[_SelectOptions]) -> None: ...
  @overload
  def __init__(self: MinPool[jax.Array], window_shape: SizeLike, strides: SizeLike | None = None,
               padding: PaddingLike = "VALID", *, return_indices: Literal[False] = False,
               **options: Unpack[_SelectOptions]) -> None: ...
  @overload
  def __init__(self: MaxPool[ValuesAndIndices], window_shape: SizeLike,
               strides: SizeLike | None = None, padding: PaddingLike = "VALID", *,
               return_indices: Literal[True], **options: Unpack[_SelectOptions]) -> None: ...
  @overload
  def __init__(self: MinPool[ValuesAndIndices], window_shape: SizeLike,
               strides: SizeLike | None = None, padding: PaddingLike = "VALID", *,
               return_indices: Literal[True], **options: Unpack[_SelectOptions]) -> None: ...
  @overload
  def __init__(self: MaxPool[jax.Array | ValuesAndIndices], window_shape: SizeLike,
               strides: SizeLike | None = None, padding: PaddingLike = "VALID", *,
               return_indices: bool, **options: Unpack[_SelectOptions]) -> None: ...
  @overload
  def __init__(self: MinPool[jax.Array | ValuesAndIndices], window_shape: SizeLike,
               strides: SizeLike | None = None, padding: PaddingLike = "VALID", *,
               return_indices: bool, **options: Unpack[_SelectOptions]) -> None: ...
  @flax_names
  def __init__(
      self, window_shape: SizeLike, strides: SizeLike | None = None,
      padding: PaddingLike = "VALID", *, num_spatial_dims: int | None = None,
      dilation: SizeLike = 1, ceil_mode: bool = False, return_indices: bool = False,
      in_features: int | None = None,
  ):
    self.window = Window.create(window_shape, strides, padding, dilation=dilation,
                                ceil_mode=ceil_mode, num_spatial_dims=num_spatial_dims,
                                layer=type(self).__name__)
    self.return_indices = check_bool(return_indices, "return_indices")
    self.in_features = check_in_features(in_features)

  def __call__(self, inputs: jax.Array) -> Out:
    """Pools ``(N, *spatial, C)`` or ``(*spatial, C)``.

    Returns:
      The pooled array, ``(N, *out, C)`` or ``(*out, C)``; with
      ``return_indices=True``, also the int32 flat per-plane index of each
      selected element (PyTorch's convention, ``h * W + w`` in 2-D) in the same shape.
    """
    return cast(Out, run_extremum(inputs, self.window, self._kind, self.return_indices,
                             self.in_features, type(self).__name__, self))


@_document
class MaxPool(_SelectPool[Out]):
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

  """

  _kind = "max"


@_document
class MinPool(_SelectPool[Out]):
  """Min pooling: :class:`MaxPool` with ``<`` in place of ``>``.

  Padding holds +inf (an integer dtype's maximum); the first minimum wins on
  ties, NaN propagates, and ``return_indices`` reports the argmin. Unlike
  ``-max_pool(-x)``, integer minima do not overflow.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import MinPool
    >>> MinPool(2, num_spatial_dims=1)(jnp.array([[3.], [1.], [4.], [1.], [5.], [9.]]))[:, 0]
    Array([1., 1., 5.], dtype=float32)

  """

  _kind = "min"


@_document
class LPPool(nnx.Module):
  """Power-average pooling, ``(sum over the window of x**p) ** (1/p)``, as PyTorch.

  As in PyTorch there is no padding, ``x**p`` is taken without an absolute
  value (odd ``p`` over negative sums gives NaN), and with ``ceil_mode`` a
  partial window's sum is scaled by ``prod(window_shape) / cells``.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import LPPool
    >>> LPPool(2, (2,))(jnp.array([[3.], [4.], [6.], [8.]]))[:, 0]
    Array([ 5., 10.], dtype=float32)

  """

  @flax_names
  def __init__(
      self, norm_type: float, window_shape: SizeLike, strides: SizeLike | None = None, *,
      num_spatial_dims: int | None = None, ceil_mode: bool = False,
      in_features: int | None = None,
  ):
    self.norm_type = check_number(norm_type, "norm_type", positive=True)
    self.window = Window.create(window_shape, strides, 0, ceil_mode=ceil_mode,
                                num_spatial_dims=num_spatial_dims)
    self.in_features = check_in_features(in_features)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Pools ``(N, *spatial, C)`` or ``(*spatial, C)`` to ``(N, *out, C)`` or ``(*out, C)``."""
    return run_lp_norm(inputs, self.window, self.norm_type, self.in_features,
                       type(self).__name__, self)
