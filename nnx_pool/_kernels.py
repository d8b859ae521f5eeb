"""Windowed reductions as sums and selects over strided taps.

A window of ``k`` taps is unrolled into ``k`` strided slices of the padded
input, one per window offset, in row-major window order. XLA fuses the slices
and the elementwise reduction over them into a single loop, so a pool reads its
input once per tap from cache and writes each output once.

The arg-extremum keeps, per output, the *window offset* of the winner. That is
all the derivative needs: :func:`window_select` carries a ``jax.custom_jvp``
whose tangent picks the winning tap of the input tangent. Reverse mode is the
transpose of that linear map, a sum of strided pads, so a max-pool gradient is
exact (it lands on the element the indices report), accumulates over
overlapping windows, handles dilation, and never lowers to XLA's
``select_and_scatter``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from nnx_pool._geometry import Geometry

Kind = Literal["max", "min"]


def accumulation_dtype(dtype) -> jnp.dtype:
  """float32 for float16/bfloat16 (sums accumulate in float32), else ``dtype`` itself."""
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
    return jnp.dtype(jnp.float32)
  return dtype


def identity(dtype, kind: Kind):
  """The padding value of a max (min) pool: -inf (+inf), or the integer dtype's min (max)."""
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.floating):
    return -np.inf if kind == "max" else np.inf
  info = jnp.iinfo(dtype)
  return info.min if kind == "max" else info.max


def pad(x: jax.Array, geom: Geometry, value) -> jax.Array:
  """Pads the spatial axes of a batched channels-last ``x`` as ``geom`` requires."""
  if not any(lo or hi for lo, hi in geom.pads):
    return x
  config = [(0, 0, 0)] + [(lo, hi, 0) for lo, hi in geom.pads] + [(0, 0, 0)]
  return lax.pad(x, jnp.asarray(value, x.dtype), config)


def taps(xp: jax.Array, geom: Geometry) -> Iterator[jax.Array]:
  """Yields one strided view of the padded input per window offset, in row-major order."""
  strides = (1, *(d.stride for d in geom.dims), 1)
  for offset in itertools.product(*(range(d.window) for d in geom.dims)):
    start = (0, *(j * d.dilation for j, d in zip(offset, geom.dims)), 0)
    limit = (
        xp.shape[0],
        *(s + (d.out - 1) * d.stride + 1 for s, d in zip(start[1:-1], geom.dims)),
        xp.shape[-1],
    )
    yield lax.slice(xp, start, limit, strides)


def window_sum(x: jax.Array, geom: Geometry) -> jax.Array:
  """Sum of every window (zero padding), shape ``(N, *geom.out_shape, C)``."""
  total = None
  for tap in taps(pad(x, geom, 0), geom):
    total = tap if total is None else total + tap
  return total


def _arg_select(x: jax.Array, geom: Geometry, kind: Kind) -> tuple[jax.Array, jax.Array]:
  """Forward of the arg-extremum: values and the winning window offset (int32).

  PyTorch's rule over the real cells of each window, in row-major order: the
  running best starts at the identity with the window's first real cell, and a
  tap replaces it when ``tap > best or isnan(tap)`` (``<`` for min). Ties keep
  the first extremum; NaN propagates, and the last NaN wins. Padding holds the
  identity, so it never replaces anything.
  """
  better_than = lax.gt if kind == "max" else lax.lt
  floating = jnp.issubdtype(x.dtype, jnp.floating)
  best = arg = None
  for j, tap in enumerate(taps(pad(x, geom, identity(x.dtype, kind)), geom)):
    if best is None:
      best = tap
      first = geom.first_real_offset() if geom.needs_real_offset else np.zeros((), np.int64)
      arg = jnp.broadcast_to(
          jnp.asarray(first, jnp.int32).reshape((1, *first.shape, 1) if first.ndim else ()),
          tap.shape,
      )
      continue
    better = better_than(tap, best)
    if floating:
      better = better | jnp.isnan(tap)
    best = jnp.where(better, tap, best)
    arg = jnp.where(better, jnp.int32(j), arg)
  return best, arg


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def window_select(x: jax.Array, geom: Geometry, kind: Kind) -> tuple[jax.Array, jax.Array]:
  """Max (min) of every window and the row-major window offset it came from.

  Differentiable in ``x`` in forward and reverse mode, to any order: the
  derivative of each output is the derivative of its winning input element.
  """
  return _arg_select(x, geom, kind)


@window_select.defjvp
def _window_select_jvp(geom, kind, primals, tangents):
  (x,), (t,) = primals, tangents
  values, arg = _arg_select(x, geom, kind)
  t_out = None
  for j, tap in enumerate(taps(pad(t, geom, 0), geom)):
    picked = jnp.where(arg == j, tap, jnp.zeros((), tap.dtype))
    t_out = picked if t_out is None else t_out + picked
  return (values, arg), (t_out, np.zeros(arg.shape, jax.dtypes.float0))


def select(x: jax.Array, geom: Geometry, kind: Kind) -> tuple[jax.Array, jax.Array]:
  """:func:`window_select` for floats; the plain forward for integers (no derivative)."""
  if jnp.issubdtype(x.dtype, jnp.floating):
    return window_select(x, geom, kind)
  return _arg_select(x, geom, kind)


def flat_indices(arg: jax.Array, geom: Geometry) -> jax.Array:
  """Turns window offsets into PyTorch's flat per-plane input index (int32).

  ``h * W + w`` in 2-D, ``(d * H + h) * W + w`` in 3-D: no batch or channel term.
  """
  flat = jnp.zeros(arg.shape, jnp.int32)
  remaining = arg
  # Unravel the row-major offset from the last window dim to the first.
  plane_stride = 1
  for axis in reversed(range(len(geom.dims))):
    d = geom.dims[axis]
    tap = remaining % d.window
    remaining = remaining // d.window
    out_pos = lax.broadcasted_iota(jnp.int32, arg.shape, axis + 1)
    coord = out_pos * d.stride - d.pad_low + tap * d.dilation
    flat = flat + coord * plane_stride
    plane_stride *= d.length
  return flat
