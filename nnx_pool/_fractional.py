"""Fractional max pooling (Graham, 2014), PyTorch's ``FractionalMaxPool2d/3d``, channels-last.

Graham, "Fractional Max-Pooling", https://arxiv.org/abs/1412.6071, as PyTorch 2.13
computes it (``aten/src/ATen/native/FractionalMaxPool2d.cpp`` and
``FractionalMaxPool3d.cpp``, ``torch/nn/functional.py``):

* the output size is ``output_size``, or ``int(length * ratio)`` per dim (Python's
  float product, truncated) from ``output_ratio``, each ratio strictly between 0
  and 1;
* every window fits: ``window + out - 1 <= length`` per dim. (PyTorch 2.13's 3-D
  check is strict, ``<``, and refuses ``window + out - 1 == length``, which its
  2-D check and the interval rule below accept; it is accepted here in every
  rank.)
* each ``(n, c)`` plane draws one sample ``u`` per dim, and window ``i`` along a
  dim of length ``L`` with ``out`` outputs and window ``k`` starts at
  ``int((i + u) * alpha) - int(u * alpha)`` with ``alpha = (L - k) / (out - 1)``;
  the last window starts at ``L - k``. The arithmetic is PyTorch's, in the
  input's dtype: for bfloat16 and float16 every operation is rounded to that
  dtype, as ``c10::BFloat16``'s are. (Where that rounding would start a window
  past ``L - k``, which PyTorch's own assert refuses, e.g. bfloat16 over 1000
  cells, the start is clamped to ``L - k``.)
* ``samples`` is ``(N, C, num_spatial_dims)``, PyTorch's ``_random_samples``; which
  sample drives which dim is PyTorch's: in 2-D the first drives W and the second
  H, in 3-D they drive T, H and W in order (1-D, which PyTorch lacks: the one
  sample). PyTorch draws them with ``torch.rand``, in ``[0, 1)``, and checks only
  their shape and dtype; here concrete samples outside ``[0, 1)`` (or NaN) are a
  ValueError. Under ``jax.jit`` the samples are tracers, whose values are not known
  when the call is traced: they are not checked there and go into PyTorch's interval
  rule as given, the window starts clamped to fit the input.
* within a window, the first maximum in row-major order wins ties, NaN propagates
  and the last NaN wins; an all ``-inf`` window reports its first cell. Indices
  are flat per plane, ``h * W + w`` (``(t * H + h) * W + w`` in 3-D), int32.

With the same samples, values and indices equal PyTorch's bit for bit. The
gradient of each output goes to exactly the cell its index names, and
accumulates where windows overlap, in the order PyTorch's backward adds them.
Inputs must be floating, as PyTorch's.

Random samples come from ``samples`` (PyTorch's ``_random_samples``), from the module's
``rngs`` or from the function's ``key`` (:mod:`nnx_pool._random_samples`); there is no
hidden global random state: with none of them, the call is an error.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Sequence
from typing import Generic, Literal, cast, overload

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax
from jax.typing import ArrayLike

from ._args import check_bool, flax_names
from ._jit import kernel
from ._layout import (
  check_in_features,
  check_nonempty_spatial,
  check_plane_indexable,
  prepare,
  unbatch,
)
from ._random_samples import check_key, key_from_rngs, samples_from
from ._select import Out, ValuesAndIndices, replaces
from ._spatial_args import SizeLike, as_tuple, spatial_dims

# Which sample of a plane (PyTorch's ``_random_samples[n, c, :]``) drives each spatial dim.
SAMPLE_OF_DIM = {1: (0,), 2: (1, 0), 3: (0, 1, 2)}


# ----------------------------------------------------------------------------
# The intervals and the max over each window.
# ----------------------------------------------------------------------------


def _rounded(value: jax.Array, dtype) -> jax.Array:
  """``value`` (float32 or wider) rounded to ``dtype``'s precision and range, kept in its
  own dtype: XLA may drop a round trip through a narrower dtype (excess precision), never
  this."""
  info = jnp.finfo(dtype)
  if info.bits >= 32:
    return value
  return lax.reduce_precision(value, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def interval_starts(samples: jax.Array, length: int, out: int, window: int) -> jax.Array:
  """PyTorch's ``generate_intervals``: where each of ``out`` windows starts, int32.

  ``samples`` has any shape ``S`` and a floating dtype, in which the arithmetic is
  done; the result is ``(*S, out)``.
  """
  dtype = samples.dtype
  last = jnp.full((*samples.shape, 1), length - window, jnp.int32)
  if out == 1:
    return last
  compute = jnp.promote_types(dtype, jnp.float32)
  alpha = np.asarray(length - window, dtype) / np.asarray(out - 1, dtype)  # rounded once
  u = samples.astype(compute)[..., None]
  i = jnp.asarray(np.arange(out - 1).astype(dtype), compute).reshape(  # int64 -> scalar_t
      (1,) * samples.ndim + (out - 1,))
  a = jnp.asarray(alpha, compute)
  starts = (_rounded(_rounded(i + u, dtype) * a, dtype).astype(jnp.int32)
            - _rounded(u * a, dtype).astype(jnp.int32))
  starts = jnp.clip(starts, 0, length - window)
  return jnp.concatenate([starts, jnp.broadcast_to(last, (*samples.shape, 1))], axis=-1)


# The most cells an image may have for :func:`_take_plane`'s flat int32 gather.
_FLAT_LIMIT = np.iinfo(np.int32).max


def _take_plane(x: jax.Array, index: jax.Array) -> jax.Array:
  """``x[n, index[n, ..., c], c]``: the cells at flat per-plane indices, ``(N, *out, C)``.

  Where an image's cells have int32 flat indices, one gather per image from its flattened
  cells at ``index * C + c``: XLA fuses that index arithmetic into the gather. Gathering
  ``(N, cells, C)`` along the cells materialised an (n, cell, c) triple per output and
  tap: 18.5 MB of temporaries against the hand-written Flax peer's 7.7 on the benchmark
  row, 0.1 MB now (docs/benchmarks.md); it is kept for images past int32.
  """
  n, plane, c = x.shape[0], math.prod(x.shape[1:-1]), x.shape[-1]
  cells = math.prod(index.shape[1:-1])  # not -1: N or C may be 0
  if plane * c <= _FLAT_LIMIT:
    channel = lax.broadcasted_iota(jnp.int32, index.shape, index.ndim - 1)
    flat = (index * c + channel).reshape(n, cells * c)
    return jnp.take_along_axis(x.reshape(n, plane * c), flat, axis=1,
                               mode="promise_in_bounds").reshape(index.shape)
  return jnp.take_along_axis(x.reshape(n, plane, c), index.reshape(n, cells, c),
                             axis=1).reshape(index.shape)


def _argmax(x: jax.Array, samples: jax.Array, window: tuple[int, ...],
            out_shape: tuple[int, ...]) -> jax.Array:
  """Flat per-plane index of each window's maximum, PyTorch's scan: ``(N, *out, C)`` int32."""
  n, spatial, c = x.shape[0], x.shape[1:-1], x.shape[-1]
  ndim = len(spatial)
  starts = []  # per dim: (N, 1.., out_d, 1.., C), the start times the dim's plane stride
  for axis, (length, out, k) in enumerate(zip(spatial, out_shape, window, strict=True)):
    start = interval_starts(samples[:, :, SAMPLE_OF_DIM[ndim][axis]], length, out, k)
    shape = [n] + [1] * ndim + [c]
    shape[axis + 1] = out
    stride = math.prod(spatial[axis + 1:])
    starts.append((jnp.swapaxes(start, 1, 2).reshape(shape), stride))
  full = (n, *out_shape, c)
  best = arg = None
  for offset in itertools.product(*(range(k) for k in window)):
    flat = None
    for (start, stride), j in zip(starts, offset, strict=True):
      term = (start + j) * stride
      flat = term if flat is None else flat + term
    flat = jnp.broadcast_to(flat, full)  # pyright: ignore[reportArgumentType]  # not None: ndim >= 1
    tap = _take_plane(x, flat)
    if best is None:
      best, arg = tap, flat
      continue
    better = replaces(tap, best, "max")
    # arg is set with best, at the first offset; pyright does not pair the two.
    best, arg = jnp.where(better, tap, best), jnp.where(better, flat, arg)  # pyright: ignore[reportArgumentType]
  return arg  # pyright: ignore[reportReturnType]  # not None: a window has an offset


@kernel(static_argnums=(2, 3, 4))
def fractional_max(x: jax.Array, samples: jax.Array, window: tuple[int, ...],
                   out_shape: tuple[int, ...], return_indices: bool):
  """Fractional max pooling of a batched float ``x`` with ``(N, C, ndim)`` ``samples``.

  The indices come from the undifferentiated scan; the values are the input's
  cells at them, a gather whose transpose adds each output's cotangent to its
  cell in output order, as PyTorch's backward does.
  """
  index = _argmax(lax.stop_gradient(x), samples.astype(x.dtype), window, out_shape)
  values = _take_plane(x, index)
  return (values, index) if return_indices else values


# ----------------------------------------------------------------------------
# Argument checks.
# ----------------------------------------------------------------------------

_RATIO_FORMS = "a number or a tuple of numbers, one per spatial dim, each strictly between 0 and 1"


def _check_ratio(value, ndim: int) -> tuple[float, ...]:
  ratios = tuple(value) if isinstance(value, Sequence) and not isinstance(value, str) else (
      (value,) * ndim)
  if not all(isinstance(r, numbers.Real) and not isinstance(r, (bool, np.bool_))
             for r in ratios):
    raise TypeError(f"`output_ratio` must be {_RATIO_FORMS}; got {value!r}.")
  if not all(0 < r < 1 for r in ratios):  # pyright: ignore[reportOperatorIssue]  # numbers, above
    raise ValueError(
        f"`output_ratio` must be {_RATIO_FORMS} (PyTorch's range); got {value!r}. For an "
        "output as large as the input, pool with output_size instead.")
  return tuple(float(r) for r in ratios)


def _configure(window_shape, output_size, output_ratio, return_indices, num_spatial_dims,
               in_features):
  """Validated ``(window, output_size or None, output_ratio or None, return_indices,
  in_features)``, one entry per spatial dim."""
  if (output_size is None) == (output_ratio is None):
    if output_size is None:
      got, fix = "neither", "Pass output_size=(out_h, out_w) or output_ratio=0.5."
    else:
      got = f"both, output_size={output_size!r} and output_ratio={output_ratio!r}"
      fix = "Drop one of them."
    raise TypeError(
        "`output_size` and `output_ratio` are alternatives: pass exactly one (as PyTorch's "
        f"FractionalMaxPool2d); got {got}. {fix}")
  ndim = spatial_dims(num_spatial_dims, window_shape=window_shape, output_size=output_size,
                      output_ratio=output_ratio)
  window = as_tuple(window_shape, ndim, "window_shape")
  sizes = None if output_size is None else as_tuple(output_size, ndim, "output_size")
  ratios = None if output_ratio is None else _check_ratio(output_ratio, ndim)
  return (window, sizes, ratios, check_bool(return_indices, "return_indices"),
          check_in_features(in_features))


def _out_shape(spatial: tuple[int, ...], window: tuple[int, ...], sizes, ratios,
               name: str) -> tuple[int, ...]:
  """The output size per dim, from ``output_size`` or PyTorch's ``int(length * ratio)``;
  checked against the window."""
  if sizes is None:
    sizes = tuple(int(length * r) for length, r in zip(spatial, ratios, strict=True))
    for axis, (out, length, r) in enumerate(zip(sizes, spatial, ratios, strict=True)):
      if out < 1:
        raise ValueError(
            f"{name}: output_ratio {r} of spatial dim {axis} of length {length} gives "
            f"int({length} * {r}) = 0 outputs; use a larger ratio or output_size.")
  for axis, (out, length, k) in enumerate(zip(sizes, spatial, window, strict=True)):
    if k + out - 1 > length:
      raise ValueError(
          f"{name}: window {k} with {out} outputs does not fit spatial dim {axis} of length "
          f"{length}: PyTorch needs window + out - 1 <= length, here {k + out - 1}. Use a "
          "smaller window_shape or fewer outputs (output_size, output_ratio).")
  return sizes


def _fractional(inputs, window: tuple[int, ...], sizes, ratios, return_indices: bool,
                in_features, samples, key, name: str, source: str, owner=None):
  x, batch = prepare(inputs, len(window), kind="float", module=name, in_features=in_features,
                     owner=owner)
  check_nonempty_spatial(x, name)
  spatial = tuple(x.shape[1:-1])
  check_plane_indexable(spatial, name)
  out_shape = _out_shape(spatial, window, sizes, ratios, name)
  samples = samples_from(samples, key, x.dtype, batch, x.shape[-1], len(window), name,
                          source)
  return unbatch(fractional_max(x, samples, window, out_shape, return_indices), batch)


# ----------------------------------------------------------------------------
# The function and the module.
# ----------------------------------------------------------------------------


# With return_indices=True the result is (values, indices), as for functional.max_pool.
@overload
def fractional_max_pool(
    inputs: jax.Array, window_shape: SizeLike, output_size: SizeLike | None = None, *,
    output_ratio: float | Sequence[float] | None = None, samples: ArrayLike | None = None,
    key: jax.Array | None = None, return_indices: Literal[False] = False,
    num_spatial_dims: int | None = None, in_features: int | None = None,
) -> jax.Array: ...
@overload
def fractional_max_pool(
    inputs: jax.Array, window_shape: SizeLike, output_size: SizeLike | None = None, *,
    output_ratio: float | Sequence[float] | None = None, samples: ArrayLike | None = None,
    key: jax.Array | None = None, return_indices: Literal[True],
    num_spatial_dims: int | None = None, in_features: int | None = None,
) -> tuple[jax.Array, jax.Array]: ...
@overload
def fractional_max_pool(
    inputs: jax.Array, window_shape: SizeLike, output_size: SizeLike | None = None, *,
    output_ratio: float | Sequence[float] | None = None, samples: ArrayLike | None = None,
    key: jax.Array | None = None, return_indices: bool,
    num_spatial_dims: int | None = None, in_features: int | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]: ...
@flax_names
def fractional_max_pool(
    inputs: jax.Array, window_shape: SizeLike, output_size: SizeLike | None = None, *,
    output_ratio: float | Sequence[float] | None = None, samples: ArrayLike | None = None,
    key: jax.Array | None = None, return_indices: bool = False,
    num_spatial_dims: int | None = None, in_features: int | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
  """Fractional max pooling, PyTorch's ``fractional_max_pool2d/3d``: :class:`FractionalMaxPool`'s
  function.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import functional as F
    >>> x = jnp.arange(25.0).reshape(1, 5, 5, 1)
    >>> samples = jnp.array([[[0.3, 0.6]]])  # (N, C, 2): W's sample, then H's
    >>> values, indices = F.fractional_max_pool(x, 2, 3, samples=samples, return_indices=True)
    >>> indices[0, ..., 0]  # windows start at rows 0, 2, 3 and columns 0, 1, 3
    Array([[ 6,  7,  9],
           [16, 17, 19],
           [21, 22, 24]], dtype=int32)

  Args:
    inputs: ``(*batch, *spatial, C)`` floats.
    window_shape: the window, an int or a tuple per dim.
    output_size: the output's spatial size, an int or a tuple per dim; or
    output_ratio: the output's size as a fraction of the input's, ``int(length *
      ratio)``, a number or a tuple per dim, each strictly between 0 and 1.
    samples: PyTorch's ``_random_samples``, ``(*batch, C, num_spatial_dims)``; or
    key: a JAX key to draw them with, ``jax.random.uniform`` in the input's dtype.
    return_indices: also return the int32 flat per-plane index of each maximum
      (default False).
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3; keyword-only, 2
      unless a tuple argument sets it by its length.
    in_features: the channel count, checked against the last axis when given
      (default None).
  """
  window, sizes, ratios, return_indices, in_features = _configure(
      window_shape, output_size, output_ratio, return_indices, num_spatial_dims, in_features)
  return _fractional(inputs, window, sizes, ratios, return_indices, in_features, samples,
                     check_key(key, "fractional_max_pool"), "fractional_max_pool", "key")


class FractionalMaxPool(nnx.Module, Generic[Out]):
  """Fractional max pooling (Graham, 2014), PyTorch's ``FractionalMaxPool2d/3d``, channels-last.

  Graham, "Fractional Max-Pooling", https://arxiv.org/abs/1412.6071. Each ``(n, c)``
  plane places its windows at pseudo-random starts drawn from one sample per
  spatial dim, so that ``output_size`` (or ``int(length * output_ratio)``) windows
  of ``window_shape`` cover the input; each output is its window's maximum. With
  PyTorch's ``_random_samples`` as ``samples``, values and indices equal PyTorch's
  bit for bit (the rules are in :mod:`nnx_pool._fractional`). The samples are
  given to each call, or drawn from ``rngs``: an ``nnx.Rngs`` (its ``dropout``
  stream, falling back to ``default``), an ``nnx.RngStream`` or a key. PyTorch's
  ``FractionalMaxPool2d(kernel_size, output_size, output_ratio, return_indices)``
  is ``FractionalMaxPool(kernel_size, output_size, output_ratio=...,
  return_indices=...)``; its ``_random_samples`` buffer is ``samples=``.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from nnx_pool import FractionalMaxPool
    >>> x = jnp.arange(25.0).reshape(1, 5, 5, 1)
    >>> pool = FractionalMaxPool(2, output_ratio=0.6)  # int(5 * 0.6) = 3 per dim
    >>> pool(x, samples=jnp.array([[[0.3, 0.6]]]))[0, ..., 0]  # W's sample, then H's
    Array([[ 6.,  7.,  9.],
           [16., 17., 19.],
           [21., 22., 24.]], dtype=float32)
    >>> pool(x, rngs=nnx.Rngs(0)).shape  # samples drawn from the stream
    (1, 3, 3, 1)

  Args:
    window_shape: the window, an int (repeated over ``num_spatial_dims``) or a tuple
      per dim.
    output_size: the output's spatial size, an int or a tuple per dim; or
    output_ratio: the output's size as a fraction of the input's, ``int(length *
      ratio)``, a number or a tuple per dim, each strictly between 0 and 1.
    return_indices: also return the int32 flat per-plane index of each maximum
      (default False). Type checkers read it: built with a literal True the module is a
      ``FractionalMaxPool[tuple[jax.Array, jax.Array]]``, else a
      ``FractionalMaxPool[jax.Array]`` (what a bare ``FractionalMaxPool`` means).
    in_features: the channel count, checked against the last axis when given
      (default None).
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3; keyword-only, 2
      unless a tuple argument sets it by its length.
  """

  # A literal return_indices picks what a call returns (FractionalMaxPool[jax.Array] or
  # FractionalMaxPool[tuple[jax.Array, jax.Array]]); a bool variable gives the union.
  @overload
  def __init__(self: FractionalMaxPool[jax.Array], window_shape: SizeLike,
               output_size: SizeLike | None = None, *,
               output_ratio: float | Sequence[float] | None = None,
               return_indices: Literal[False] = False, in_features: int | None = None,
               num_spatial_dims: int | None = None) -> None: ...
  @overload
  def __init__(self: FractionalMaxPool[ValuesAndIndices], window_shape: SizeLike,
               output_size: SizeLike | None = None, *,
               output_ratio: float | Sequence[float] | None = None,
               return_indices: Literal[True], in_features: int | None = None,
               num_spatial_dims: int | None = None) -> None: ...
  @overload
  def __init__(self: FractionalMaxPool[jax.Array | ValuesAndIndices], window_shape: SizeLike,
               output_size: SizeLike | None = None, *,
               output_ratio: float | Sequence[float] | None = None,
               return_indices: bool, in_features: int | None = None,
               num_spatial_dims: int | None = None) -> None: ...
  @flax_names
  def __init__(self, window_shape: SizeLike, output_size: SizeLike | None = None, *,
               output_ratio: float | Sequence[float] | None = None,
               return_indices: bool = False, in_features: int | None = None,
               num_spatial_dims: int | None = None):
    (self.window_shape, self.output_size, self.output_ratio, self.return_indices,
     self.in_features) = _configure(window_shape, output_size, output_ratio, return_indices,
                                    num_spatial_dims, in_features)

  @flax_names
  def __call__(self, inputs: jax.Array, *, samples: ArrayLike | None = None,
               rngs: nnx.Rngs | nnx.RngStream | jax.Array | None = None) -> Out:
    """Pools ``(*batch, *spatial, C)`` to ``(*batch, *out, C)``.

    Args:
      inputs: ``(*batch, *spatial, C)`` floats.
      samples: ``(*batch, C, num_spatial_dims)`` floats, PyTorch's ``_random_samples``
        (an unbatched input also takes PyTorch's ``(1, C, num_spatial_dims)``); or
      rngs: an ``nnx.Rngs`` (its ``dropout`` stream), an ``nnx.RngStream`` or a key to
        draw them from, uniform in ``[0, 1)`` in the input's dtype.

    Returns:
      The pooled array; with ``return_indices=True``, also the int32 flat per-plane
      index of each maximum (``h * W + w`` in 2-D) in the same shape.
    """
    name = type(self).__name__
    if samples is not None and rngs is not None:
      raise TypeError(f"{name}: pass `samples` or `rngs`, not both.")
    return cast(Out, _fractional(inputs, self.window_shape, self.output_size, self.output_ratio,
                                 self.return_indices, self.in_features, samples,
                                 key_from_rngs(rngs, name), name, "rngs", self))
