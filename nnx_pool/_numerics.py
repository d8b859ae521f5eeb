"""Rounding as PyTorch rounds: the accumulation dtype, a true division, and a mean.

PyTorch sums float16 and bfloat16 in float32 and divides once, correctly rounded.
XLA:CPU may rewrite a division by a constant into a multiplication by its
reciprocal, which is one ULP off for some quotients; :func:`true_divide` keeps the
division. :func:`mean` is the two together, and :func:`spatial_mean` the kernel
that the global average pool and the channel gates run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from ._jit import kernel


def accumulation_dtype(dtype) -> jnp.dtype:
  """float32 for float16/bfloat16 (sums accumulate in float32), else ``dtype`` itself."""
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
    return jnp.dtype(jnp.float32)
  return dtype


def true_divide(total: jax.Array, divisor) -> jax.Array:
  """``total / divisor``, correctly rounded, for a ``divisor`` (static or traced) broadcastable
  to ``total``.

  XLA CPU rewrites ``x / broadcast(d)`` into ``x * broadcast(1 / d)``, even for a
  runtime scalar (jaxlib 0.10; 0.7 still divided): one ULP away from PyTorch's
  division for some sums. A divisor materialised at the full shape behind an
  optimisation barrier keeps a true division, and a barrier on the quotient
  stops XLA merging ``a / b / c`` into ``a / (b * c)`` (PyTorch rounds twice).
  Measured on the benchmark shapes: no cost beyond run-to-run noise.
  """
  full = jnp.broadcast_to(jnp.asarray(divisor, total.dtype), total.shape)
  return lax.optimization_barrier(total / lax.optimization_barrier(full))


def mean(x: jax.Array, axes: Sequence[int]) -> jax.Array:
  """Mean of ``x`` over ``axes``, kept as size-1 axes, as PyTorch's ``x.mean(axes, keepdim=True)``.

  The sum accumulates in :func:`accumulation_dtype` and is divided by the cell
  count with :func:`true_divide` (correctly rounded), then cast back to ``x``'s dtype.
  """
  axes = tuple(axes)
  total = jnp.sum(x, axis=axes, keepdims=True, dtype=accumulation_dtype(x.dtype))
  return true_divide(total, math.prod(x.shape[a] for a in axes)).astype(x.dtype)


@kernel()
def spatial_mean(x: jax.Array) -> jax.Array:
  """:func:`mean` over every spatial axis of a batched ``(N, *spatial, C)`` ``x``.

  PyTorch's ``x.mean((2, 3))`` and ``adaptive_avg_pool2d(x, 1)``, as ``(N, 1, 1, C)``.
  """
  return mean(x, range(1, x.ndim - 1))
