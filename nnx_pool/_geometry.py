"""Window geometry: the one place that turns pooling arguments into shapes.

Every module resolves its window here (:class:`Window`, from arguments whose forms
:mod:`nnx_pool._spatial_args` checks): an input shape into the output shape, the
padding actually applied, and the per-cell counts that the average divisors and the
argmax bookkeeping need; and the adaptive pools' bins. All of it is static NumPy and
Python arithmetic on shapes; nothing here touches a traced array.

The rules are PyTorch's (``aten/src/ATen/native/Pool.h``) for explicit padding
and lax/Flax's for ``"SAME"``:

* effective window ``e = d * (k - 1) + 1``;
* floor mode ``out = (L + lo + hi - e) // s + 1``;
* ceil mode ``out = ceil((L + lo + hi - e) / s) + 1``, minus one when the last
  window would start at or after ``L + lo`` (it must start inside the input or
  the left padding); the window may overhang the padded input by less than a
  stride, even when it is the only one;
* ``"SAME"``: ``out = ceil(L / s)``, total padding
  ``max((out - 1) * s + e - L, 0)``, split with the extra cell on the high side.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np

from ._args import check_bool, is_int
from ._layout import rank_message
from ._spatial_args import (
  PADDING_FORMS,
  PaddingLike,
  PaddingSpec,
  SizeLike,
  as_tuple,
  parse_padding,
  refuse_flat_padding,
  spatial_dims,
)

# The longest padded spatial dim: coordinates inside the kernels are int32.
MAX_COORDINATE = 2**31 - 1
# The most elements a padded input may have. XLA sizes an array in int64 bytes, and an element
# takes up to 8 (float64 and int64 under jax_enable_x64); past that it aborts the interpreter
# ("overflow in static extent product", exit 134) instead of raising.
MAX_ELEMENTS = 2**60


def effective_window(window: int, dilation: int) -> int:
  """The span of a dilated window, ``dilation * (window - 1) + 1`` cells."""
  return dilation * (window - 1) + 1


def check_padded_size(shape: Sequence[int], pads: Sequence[tuple[int, int]], prefix: str,
                      fix: str) -> None:
  """Refuses ``pads`` that make a batched channels-last ``shape`` too large for XLA to size.

  ``prefix`` starts the message (the layer), ``fix`` ends it (what to change).
  """
  padded = (shape[0], *(n + lo + hi for n, (lo, hi) in zip(shape[1:-1], pads, strict=True)),
            shape[-1])
  elements = math.prod(max(n, 1) for n in padded)  # an empty axis does not shrink XLA's product
  if elements > MAX_ELEMENTS:
    raise ValueError(
        f"{prefix}: the input of shape {tuple(shape)} padded to {padded} would be an array of "
        f"{elements} elements, more than the 2**60 that XLA can size (an int64 count of bytes, "
        f"up to 8 an element); XLA would abort the interpreter. {fix}")


@dataclasses.dataclass(frozen=True)
class Window:
  """A validated window configuration: shape, strides, dilation, padding, ceil mode.

  Strides default to the window (PyTorch, Keras and TF), not to 1 (Flax).
  """

  shape: tuple[int, ...]
  strides: tuple[int, ...]
  dilation: tuple[int, ...]
  padding: PaddingSpec
  ceil_mode: bool

  @classmethod
  def create(
      cls, window_shape: SizeLike, strides: SizeLike | None = None,
      padding: PaddingLike = "VALID", *, dilation: SizeLike = 1, ceil_mode: bool = False,
      num_spatial_dims: int | None = None, layer: str | None = None,
  ) -> Window:
    """Validates pooling arguments; the number of dims follows :func:`spatial_dims`.

    ``layer``, the module or function being built, prefixes the padding-limit error.
    """
    refuse_flat_padding(padding, PADDING_FORMS)
    ndim = spatial_dims(num_spatial_dims, window_shape=window_shape, strides=strides,
                        padding=padding, dilation=dilation)
    shape = as_tuple(window_shape, ndim, "window_shape")
    strides = shape if strides is None else as_tuple(strides, ndim, "strides")
    dilation = as_tuple(dilation, ndim, "dilation")
    ceil_mode = check_bool(ceil_mode, "ceil_mode")
    spec = parse_padding(padding, ndim)
    if spec == "SAME" and ceil_mode:
      raise ValueError(
          '`ceil_mode=True` cannot be combined with padding="SAME": SAME already rounds '
          "the output size up (out = ceil(L / stride)). Use ceil_mode=False."
      )
    window = cls(shape, strides, dilation, spec, ceil_mode)
    if not isinstance(spec, str):
      for dim, ((lo, hi), k, d) in enumerate(zip(spec, shape, dilation, strict=True)):
        half = effective_window(k, d) // 2
        if lo > half or hi > half:
          prefix = f"{window.describe(layer)}: " if layer else ""
          raise ValueError(
              f"{prefix}`padding` must be at most half the effective window on each side "
              f"(dim {dim}: window {k}, dilation {d}, so at most {half}); got {padding!r}. "
              "PyTorch refuses it too. Ways out: padding of at most "
              f"{half} there, or pad the input first with jnp.pad (-inf for a max pool, "
              "+inf for a min pool, 0 for an average that counts padding) and pool it "
              "with less padding."
          )
    return window

  def describe(self, layer: str) -> str:
    """``layer`` called with this window's arguments, those not at their defaults.

    ``MaxPool(window_shape=(3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))``: what
    an error shows to say which layer of a model it is.
    """
    args = [f"window_shape={self.shape}", f"strides={self.strides}"]
    if self.padding == "SAME" or (self.padding != "VALID" and any(map(any, self.padding))):
      args.append(f"padding={self.padding!r}")
    if any(d != 1 for d in self.dilation):
      args.append(f"dilation={self.dilation}")
    if self.ceil_mode:
      args.append("ceil_mode=True")
    return f"{layer}({', '.join(args)})"

  @property
  def ndim(self) -> int:
    return len(self.shape)

  @property
  def size(self) -> int:
    """The number of taps in one window, ``prod(window_shape)``."""
    return math.prod(self.shape)

  def resolve(self, spatial_shape: Sequence[int], layer: str | None = None, *,
              takes_padding: bool = True, adaptive: str | None = None) -> Geometry:
    """The geometry of this window over an input with ``spatial_shape``.

    Where the window does not fit, the ValueError starts with ``layer`` and its
    arguments (:meth:`describe`) and lists the ways out: padding (when the layer
    ``takes_padding``), ``ceil_mode``, a smaller window and the ``adaptive``
    pool of the same kind, each only where it would fit.
    """
    shape = tuple(int(n) for n in spatial_shape)
    try:
      return _resolve(self, shape)
    except _WindowDoesNotFit as error:
      if layer is None:
        raise ValueError(str(error)) from None
      message = f"{self.describe(layer)} on spatial shape {shape}: {error}"
      ways = error.ways_out(self, takes_padding=takes_padding, adaptive=adaptive)
      if ways:
        message += " Ways out: " + ", ".join(ways[:-1]) + (", or " if ways[:-1] else "") + (
            ways[-1] + ".")
      raise ValueError(message) from None


@dataclasses.dataclass(frozen=True)
class DimGeometry:
  """One spatial dim of a window placed over an input of length ``length``.

  ``window`` counts the taps that can reach ``[-pad_low, L + pad_high)``, at
  most the window asked for (fewer only for a ceil-mode window overhanging the
  padded input); ``stride`` is 1 when ``out`` is 1. Neither changes a result.
  """

  length: int
  window: int
  stride: int
  dilation: int
  pad_low: int
  pad_high: int  # the padding the user asked for (resolved for SAME)
  out: int

  @property
  def effective_window(self) -> int:
    return effective_window(self.window, self.dilation)

  @property
  def applied_high(self) -> int:
    """High-side padding the taps actually reach: covers ceil-mode overhang, never negative."""
    reach = (self.out - 1) * self.stride + self.effective_window
    return max(reach - self.length - self.pad_low, 0)

  def _taps_within(self, low: int, high: int) -> tuple[np.ndarray, np.ndarray]:
    """Per output position: the first tap at a coordinate in ``[low, high)`` and how many are.

    Tap ``j`` of window ``i`` sits at ``i * stride - pad_low + j * dilation``; the
    taps inside an interval are a contiguous run of ``j``, found in closed form
    (no ``(out, window)`` array, so a window of any length costs ``O(out)``).
    """
    starts = np.arange(self.out, dtype=np.int64) * self.stride - self.pad_low
    first = np.maximum(-((starts - low) // self.dilation), 0)  # ceil((low - start) / d)
    last = np.minimum((high - 1 - starts) // self.dilation, self.window - 1)
    count = np.maximum(last - first + 1, 0)
    return np.where(count > 0, first, 0), count

  def real_count(self) -> np.ndarray:
    """Taps per output position that fall on real input cells."""
    return self._taps_within(0, self.length)[1]

  def padded_count(self) -> np.ndarray:
    """Taps inside ``[-pad_low, L + pad_high)``: PyTorch's count_include_pad divisor.

    Explicit padding counts; the ceil-mode overhang past it does not.
    """
    return self._taps_within(-self.pad_low, self.length + self.pad_high)[1]

  def first_real_tap(self) -> np.ndarray:
    """Index of the first tap on a real cell, per output position."""
    return self._taps_within(0, self.length)[0]


@dataclasses.dataclass(frozen=True)
class Geometry:
  """A window over a concrete input: per-dim geometry and the derived static arrays."""

  dims: tuple[DimGeometry, ...]

  @property
  def out_shape(self) -> tuple[int, ...]:
    return tuple(d.out for d in self.dims)

  @property
  def in_shape(self) -> tuple[int, ...]:
    return tuple(d.length for d in self.dims)

  @property
  def window(self) -> tuple[int, ...]:
    return tuple(d.window for d in self.dims)

  @property
  def size(self) -> int:
    """The number of taps in one window."""
    return math.prod(self.window)

  @property
  def pads(self) -> tuple[tuple[int, int], ...]:
    """``(low, high)`` padding to apply before taking strided taps."""
    return tuple((d.pad_low, d.applied_high) for d in self.dims)

  def outer(self, per_dim: Sequence[np.ndarray]) -> np.ndarray:
    """Combines per-dim vectors into an array of ``out_shape`` by outer product."""
    result = np.ones((), dtype=np.int64)
    for vec in per_dim:
      result = np.multiply.outer(result, vec)
    return result

  def divisor(self, *, count_include_pad: bool) -> np.ndarray:
    """The average-pool divisor per output position (PyTorch's rule), shape ``out_shape``."""
    if count_include_pad:
      return self.outer([d.padded_count() for d in self.dims])
    return self.outer([d.real_count() for d in self.dims])

  def first_real_offset(self) -> np.ndarray:
    """Row-major window offset of each window's first real cell, shape ``out_shape``."""
    offset = np.zeros((), dtype=np.int64)
    for d in self.dims:
      offset = np.add.outer(offset * d.window, d.first_real_tap())
    return offset

  @property
  def needs_real_offset(self) -> bool:
    """Whether some window starts on a padding cell."""
    return bool(self.first_real_offset().any())


def _out_size(length: int, k: int, s: int, d: int, lo: int, hi: int, ceil_mode: bool) -> int:
  span = length + lo + hi - effective_window(k, d)
  if not ceil_mode:
    return span // s + 1 if span >= 0 else 0
  # Ceil mode may overhang the padded input by less than a stride, even with one
  # window (PyTorch: L=2, k=3, s=2 gives ceil(-1 / 2) + 1 = 1).
  out = -(-span // s) + 1
  if (out - 1) * s >= length + lo:
    out -= 1
  return out


class _WindowDoesNotFit(ValueError):
  """A window that gives no output along ``axis``, or a window of padding only."""

  def __init__(self, message: str, axis: int, length: int, pads: tuple[int, int], *,
               empty_window: bool = False):
    super().__init__(message)
    self.axis, self.length, self.pads, self.empty_window = axis, length, pads, empty_window

  def ways_out(self, window: Window, *, takes_padding: bool, adaptive: str | None) -> list[str]:
    """What would make the window fit, each checked with the output-size rule."""
    if self.length == 0:
      return ["an input with cells along every spatial dim"]
    axis, length, (lo, hi) = self.axis, self.length, self.pads
    k, s, d = window.shape[axis], window.strides[axis], window.dilation[axis]
    e = effective_window(k, d)
    if self.empty_window:
      return []  # the message says it: less padding or dilation
    ways = []
    need = -(-(e - length) // 2)  # symmetric padding that makes one window fit
    if takes_padding and window.padding != "SAME" and max(lo, hi) < need <= e // 2:
      ways.append(f"padding of {need} on each side of dim {axis}")
    if not window.ceil_mode and window.padding != "SAME" and _out_size(
        length, k, s, d, lo, hi, True) >= 1:
      ways.append("ceil_mode=True")
    ways.append(f"a window of at most {(length + lo + hi - 1) // d + 1} along dim {axis}"
                + (f" (dilation {d})" if d > 1 else ""))
    if adaptive:
      ways.append(f"{adaptive}(output_size), which fits any input")
    return ways


@functools.lru_cache(maxsize=512)
def _resolve(window: Window, spatial_shape: tuple[int, ...]) -> Geometry:
  dims = []
  for axis, (length, k, s, d) in enumerate(
      zip(spatial_shape, window.shape, window.strides, window.dilation, strict=True)
  ):
    e = effective_window(k, d)
    if window.padding == "VALID":
      lo = hi = 0
    elif window.padding == "SAME":
      out = -(-length // s)
      total = max((out - 1) * s + e - length, 0)
      lo, hi = total // 2, total - total // 2
    else:
      lo, hi = window.padding[axis]
    if length + lo + hi > MAX_COORDINATE:
      raise ValueError(
          f"Spatial dim {axis} of length {length} with padding ({lo}, {hi}) is {length + lo + hi} "
          f"cells long padded; the kernels' int32 coordinates address at most 2**31 - 1."
      )
    out = _out_size(length, k, s, d, lo, hi, window.ceil_mode)
    if out < 1:
      raise _WindowDoesNotFit(
          f"Output size is too small: spatial dim {axis} of length {length} with "
          f"window {k}, dilation {d} (effective {e}), stride {s} and padding ({lo}, {hi}) "
          f"gives {out} outputs. The window must fit in the padded input.",
          axis, length, (lo, hi),
      )
    # Only taps in [-lo, L + hi) can matter: later ones read the ceil-mode
    # overhang, which holds the identity and counts in no divisor. Keeping the
    # taps that reach it and (with one window) a unit stride bounds every
    # number below by the padded input, whatever the window or stride asked.
    dim = DimGeometry(length, min(k, (length + lo + hi - 1) // d + 1), 1 if out == 1 else s,
                      d, lo, hi, out)
    if not dim.real_count().all():
      empty = int(np.argmin(dim.real_count()))
      raise _WindowDoesNotFit(
          f"Window {empty} along spatial dim {axis} covers only padding (length {length}, "
          f"window {k}, dilation {d}, padding ({lo}, {hi})). Reduce the padding or dilation.",
          axis, length, (lo, hi), empty_window=True,
      )
    dims.append(dim)
  return Geometry(tuple(dims))


def output_shape(
    input_shape: Sequence[int], window_shape: SizeLike, strides: SizeLike | None = None,
    padding: PaddingLike = "VALID", *, dilation: SizeLike = 1, ceil_mode: bool = False,
    num_spatial_dims: int | None = None,
) -> tuple[int, ...]:
  """The shape a window pool returns for ``input_shape``, with the modules' own checks.

  ``input_shape`` is channels-last, batched ``(N, *spatial, C)`` or unbatched
  ``(*spatial, C)``; the arguments are those of :class:`~nnx_pool.MaxPool`
  (AvgPool, MinPool and LPPool take the same geometry, LPPool without
  padding). Batch and channel sizes pass through.

  Example usage::

    >>> from nnx_pool import output_shape
    >>> output_shape((8, 112, 112, 64), 3, 2, 1)  # ResNet's stem pool
    (8, 56, 56, 64)
    >>> output_shape((10, 3), 2, ceil_mode=True, num_spatial_dims=1)
    (5, 3)

  Raises:
    ValueError, TypeError: as the module would, for the arguments or the shape.
  """
  window = Window.create(window_shape, strides, padding, dilation=dilation,
                         ceil_mode=ceil_mode, num_spatial_dims=num_spatial_dims)
  shape = tuple(input_shape)
  if not all(is_int(n) and n >= 0 for n in shape):
    raise TypeError(f"`input_shape` must be a tuple of non-negative ints; got {input_shape!r}.")
  if len(shape) not in (window.ndim + 1, window.ndim + 2):
    raise ValueError(rank_message("output_shape", "input_shape", shape, window.ndim))
  spatial = shape[-window.ndim - 1:-1]
  return (*shape[:-window.ndim - 1], *window.resolve(spatial).out_shape, shape[-1])


# ----------------------------------------------------------------------------
# Adaptive bins.
# ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=512)
def adaptive_bins(length: int, out: int) -> tuple[np.ndarray, np.ndarray]:
  """PyTorch's adaptive bins ``[start, end)``: ``out`` bins over ``length`` cells.

  Bin ``i`` covers ``[floor(i * L / T), ceil((i + 1) * L / T))``, in exact integer
  arithmetic (PyTorch computes it in float32, which can round differently for
  huge sizes). Bins may overlap, and ``T > L`` is allowed.
  """
  i = np.arange(out, dtype=np.int64)
  return (i * length) // out, -((-(i + 1) * length) // out)


def adaptive_window(spatial: tuple[int, ...], out_shape: tuple[int, ...],
                    max_cells: int) -> Geometry | None:
  """The window pool an adaptive pool equals, when every dim divides and the window is small.

  With ``L % T == 0`` in every dim the bins are non-overlapping windows of
  ``L // T`` cells at stride ``L // T``; above ``max_cells`` cells per window,
  or when a dim does not divide, None.
  """
  if any(length % out for length, out in zip(spatial, out_shape, strict=True)):
    return None
  window = tuple(length // out for length, out in zip(spatial, out_shape, strict=True))
  if math.prod(window) > max_cells:
    return None
  return Window.create(window).resolve(spatial)
