"""The multi-head attention that both attention pooling heads run, and their shared checks.

The heads are :class:`~nnx_pool.AttentionPool` (:mod:`nnx_pool._attention_pool`, CLIP's
attention pool over a map) and :class:`~nnx_pool.AttentionPoolLatent`
(:mod:`nnx_pool._latent_pool`, the latent-query MAP head).

The attention is softmax(q k^T / sqrt(head_dim)) v per head, PyTorch's
``F.scaled_dot_product_attention`` without a mask or dropout. It runs in the
layers' computation dtype: ``dtype`` when given, else the promotion of the
input and the parameters, so float32 for a bfloat16 input with the default
``param_dtype=float32``. The logits and the softmax are float32 for float16
and bfloat16, and the products accumulate in float32; the mean token
accumulates in float32 and is rounded to the input's dtype. The output has
the input's dtype.

Both heads load PyTorch state dicts with ``from_torch(state_dict, *, num_heads,
**options)`` (torch tensors or NumPy arrays; torch itself is not imported):
sizes come from the weights, ``num_heads`` from the caller (no weight says it).
"""

from __future__ import annotations

from typing import overload

import jax
import jax.numpy as jnp
from flax import nnx

from ._args import check_positive_int
from ._numerics import accumulation_dtype


@overload
def variable_value(variable: None) -> None: ...
@overload
def variable_value(variable: nnx.Variable) -> jax.Array: ...
def variable_value(variable) -> jax.Array | None:
  """A variable's array, or None for an absent one (a Linear without a bias)."""
  if variable is None:
    return None
  return variable.get_value() if hasattr(variable, "get_value") else variable.value


def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """Multi-head scaled dot-product attention: ``softmax(q k^T / sqrt(d)) v`` per head.

  ``q`` is ``(N, Lq, heads, d)`` (or ``(Lq, heads, d)``, shared by the batch), ``k``
  and ``v`` ``(N, L, heads, d)``; the result is ``(N, Lq, heads, d)`` in ``v``'s
  dtype. The logits and the softmax are float32 for half-precision inputs, and
  the products accumulate in float32.
  """
  wide = accumulation_dtype(v.dtype)
  q_axes = "qhd" if q.ndim == 3 else "nqhd"
  logits = jnp.einsum(f"{q_axes},nkhd->nhqk", q, k, preferred_element_type=wide)
  logits = logits.astype(wide) * (q.shape[-1] ** -0.5)
  probabilities = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  out = jnp.einsum("nhqk,nkhd->nqhd", probabilities, v, preferred_element_type=wide)
  return out.astype(v.dtype)


def check_heads(embed_dim: int, num_heads, head_dim, module: str) -> tuple[int, int]:
  """``(num_heads, head_dim)``: from ``num_heads`` when given, else from ``head_dim``, as timm."""
  if num_heads is not None:
    num_heads = check_positive_int(num_heads, "num_heads")
    if embed_dim % num_heads:
      raise ValueError(
          f"{module}: `num_heads` must divide embed_dim={embed_dim} (each head takes "
          f"embed_dim // num_heads channels); got num_heads={num_heads}. Pick a divisor of "
          f"{embed_dim}.")
    return num_heads, embed_dim // num_heads
  if head_dim is None:
    raise ValueError(f"{module} needs `num_heads` or `head_dim`; got neither.")
  head_dim = check_positive_int(head_dim, "head_dim")
  if embed_dim % head_dim:
    raise ValueError(
        f"{module}: `head_dim` must divide embed_dim={embed_dim} (num_heads is embed_dim // "
        f"head_dim); got head_dim={head_dim}. Pass num_heads=... or a head_dim that divides "
        f"{embed_dim}.")
  return embed_dim // head_dim, head_dim


def trunc_normal(stddev: float):
  """timm's ``trunc_normal_(std=stddev)``: cut at +-2 absolute, a plain normal at these widths."""
  return nnx.initializers.normal(stddev)
