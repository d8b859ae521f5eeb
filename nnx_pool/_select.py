"""PyTorch's rule for choosing a max or min, and where the chosen element lies.

One rule picks a max or min everywhere, PyTorch's scan ``val > best or isnan(val)``
(:func:`replaces`): strictly better replaces, so ties keep the first; any NaN
replaces, so NaN propagates and the last NaN wins.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Kind = Literal["max", "min"]


def identity(dtype, kind: Kind):
  """The padding value of a max (min) pool: the dtype's lowest (highest) value.

  -inf (+inf) for floats that hold it. Floats without infinities (float8
  ``e4m3fn``, the ``fnuz`` family, ``e8m0fnu``, ``float4_e2m1fn``) cast inf to NaN,
  which would win every padded window: they get their finite extreme, as integers
  do. A real cell equal to it ties with the padding and keeps its index, since the
  scan starts at the window's first real cell.
  """
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.floating):
    if np.isinf(np.array(np.inf).astype(dtype)):
      return -np.inf if kind == "max" else np.inf
    info = jnp.finfo(dtype)
  else:
    info = jnp.iinfo(dtype)
  return info.min if kind == "max" else info.max


def replaces(candidate: jax.Array, best: jax.Array, kind: Kind) -> jax.Array:
  """PyTorch's scan rule: ``candidate`` replaces the running ``best`` when better or NaN.

  Strictly better (``>`` for max, ``<`` for min), so ties keep the first; any NaN
  replaces, so NaN propagates and the last NaN wins.
  """
  better = (lax.gt if kind == "max" else lax.lt)(candidate, best)
  if jnp.issubdtype(candidate.dtype, jnp.floating):
    better = better | jnp.isnan(candidate)
  return better


def extremum(x: jax.Array, axis, kind: Kind, *, keepdims: bool = False) -> jax.Array:
  """``jnp.max`` (``jnp.min``) over ``axis`` with NaN propagated; ties share the gradient.

  NaN is propagated explicitly: on CPU, jaxlib 0.10.2 lowers some float
  ``reduce_max`` calls to a YNNPACK fusion that drops NaN (even returning -inf).
  """
  best = (jnp.max if kind == "max" else jnp.min)(x, axis=axis, keepdims=keepdims)
  if jnp.issubdtype(x.dtype, jnp.floating):
    best = jnp.where(jnp.any(jnp.isnan(x), axis=axis, keepdims=keepdims),
                     jnp.asarray(jnp.nan, best.dtype), best)
  return best


def arg_extremum(x: jax.Array, axis: int, kind: Kind) -> tuple[jax.Array, jax.Array]:
  """:func:`replaces` as a reduction over ``axis``: the extremum and its slot (int32).

  The slot is the first extremum along ``axis``, or the last NaN when there is
  one, as the scan would leave it; plain min/max reductions, which fuse, not a
  scan or an argmax.
  """
  k = x.shape[axis]
  slot = lax.broadcasted_iota(jnp.int32, x.shape, axis)
  best = extremum(x, axis, kind)
  winner = jnp.min(jnp.where(x == jnp.expand_dims(best, axis), slot, k), axis=axis)
  if jnp.issubdtype(x.dtype, jnp.floating):
    nan = jnp.isnan(x)
    winner = jnp.where(jnp.any(nan, axis=axis), jnp.max(jnp.where(nan, slot, -1), axis=axis),
                       winner)
  return best, winner
