"""PyTorch's padding modes (``F.pad``): names, PyTorch's limits on them, and the padding itself.

``"reflect"`` mirrors a dim without repeating its edge, ``"replicate"`` repeats the edge,
``"circular"`` wraps around and ``"constant"`` pads zeros. :class:`~nnx_pool.BlurPool`
takes any of them, :class:`~nnx_pool.MedianPool` reflects, as timm's layers do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# F.pad's mode names and jnp.pad's for the same padding.
PAD_MODES = {"reflect": "reflect", "constant": "constant", "replicate": "edge",
             "circular": "wrap"}

Pads = tuple[tuple[int, int], ...]


def check_pad_mode(value) -> str:
  if not isinstance(value, str) or value not in PAD_MODES:
    error = ValueError if isinstance(value, str) else TypeError
    raise error(
        f"`pad_mode` must be one of {', '.join(map(repr, PAD_MODES))} (F.pad's modes); "
        f"got {value!r}.")
  return value


def check_torch_pads(spatial: tuple[int, ...], pads: Pads, mode: str, module: str) -> None:
  """PyTorch's limits on ``F.pad``: reflect padding shorter than the dim, circular at most it."""
  for axis, (length, (lo, hi)) in enumerate(zip(spatial, pads, strict=True)):
    pad = max(lo, hi)
    if mode == "reflect" and pad >= length:
      raise ValueError(
          f"{module}: reflect padding must be shorter than the dim it pads (PyTorch's F.pad "
          f"rule: it mirrors the dim without its edge); spatial dim {axis} has length "
          f"{length} and padding ({lo}, {hi}). Use an input at least {pad + 1} long there, "
          "or less padding.")
    if mode == "circular" and pad > length:
      raise ValueError(
          f"{module}: circular padding must be at most the length of the dim it pads "
          f"(PyTorch's F.pad rule: it would wrap around more than once); spatial dim {axis} "
          f"has length {length} and padding ({lo}, {hi}). Use an input at least {pad} long "
          "there, or less padding.")


def torch_pad(x: jax.Array, pads: Pads, mode: str) -> jax.Array:
  """``F.pad(x, ..., mode=mode)`` of the spatial dims of a batched channels-last ``x``."""
  if not any(lo or hi for lo, hi in pads):
    return x
  return jnp.pad(x, ((0, 0), *pads, (0, 0)), mode=PAD_MODES[mode])
