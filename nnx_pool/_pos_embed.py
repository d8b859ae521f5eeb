"""timm's resampling of a learned position embedding to another map size, as PyTorch computes it.

timm 1.0.31's ``resample_abs_pos_embed`` (``timm/layers/pos_embed.py``) resizes the
embedding's grid with PyTorch's antialiased bicubic interpolation; the weights of that
resize are computed here in float32 exactly as PyTorch 2.13 computes them
(:func:`antialiased_bicubic_weights`), so a resampled embedding is PyTorch's bit for bit.
:class:`~nnx_pool.AttentionPool` resamples its embedding for a map of another size.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def _f32(value: float | np.floating) -> float:
  """``value`` rounded to float32, as a Python float."""
  return float(np.float32(value))


def _fma32(a: float, b: float, c: float) -> float:
  """float32 ``a * b + c`` with one rounding (a float32 product is exact in float64)."""
  return _f32(a * b + c)


def _keys_cubic32(x: float) -> float:
  """Keys' cubic kernel with a = -0.5 (PyTorch's antialiased bicubic filter), in float32.

  Written as PyTorch 2.13's ``cubic_convolution1/2`` compile on x86-64, with fused
  multiply-adds: so the weights are PyTorch's bit for bit.
  """
  a = -0.5
  x = abs(x)
  if x < 1.0:
    return _fma32(_f32(_fma32(a + 2.0, x, -(a + 3.0)) * x), x, 1.0)
  if x < 2.0:
    return _fma32(_fma32(_fma32(a, x, -5.0 * a), x, 8.0 * a), x, -4.0 * a)
  return 0.0


@functools.lru_cache(maxsize=64)
def antialiased_bicubic_weights(in_size: int, out_size: int) -> np.ndarray:
  """The ``(out_size, in_size)`` float32 matrix of PyTorch's antialiased bicubic resize of a dim.

  ``F.interpolate(mode="bicubic", antialias=True, align_corners=False)`` along one
  dim (PyTorch 2.13, ``aten/src/ATen/native/cpu/UpSampleKernel.cpp``,
  ``_compute_indices_min_size_weights_aa``): output ``i`` is centred at
  ``scale * (i + 0.5)`` with ``scale = in / out``; the kernel, Keys' cubic with
  a = -0.5 (PIL's; without antialias PyTorch uses -0.75), is stretched by
  ``scale`` when downsampling; the input cells within its support are weighted
  and the weights normalised to sum to 1. Computed in float32 as PyTorch does.
  ``jax.image.resize(..., "bicubic", antialias=True)`` uses the same kernel but
  rounds the scale differently, a few float32 ULPs away.
  """
  scale = _f32(np.float32(in_size) / np.float32(out_size))
  support = _f32(2.0 * scale) if scale >= 1.0 else 2.0
  inv_scale = _f32(1.0 / scale) if scale >= 1.0 else 1.0
  weights = np.zeros((out_size, in_size), np.float32)
  for i in range(out_size):
    center = _f32(scale * (i + 0.5))
    start = max(int(_f32(center - support) + 0.5), 0)
    stop = min(int(_f32(center + support) + 0.5), in_size)
    taps = [_keys_cubic32(_f32((_f32(j - center) + 0.5) * inv_scale)) for j in range(start, stop)]
    total = np.float32(0.0)
    for tap in taps:
      total = np.float32(total + np.float32(tap))
    if total != 0.0:
      # np.float32 of a list is an array at run time; NumPy's stub takes scalars only.
      weights[i, start:stop] = np.float32(taps) / total  # pyright: ignore[reportArgumentType]
  weights.flags.writeable = False
  return weights


def resample_pos_embed(pos_embed: jax.Array, old_size: tuple[int, int],
                       new_size: tuple[int, int]) -> jax.Array:
  """A ``(1 + h*w, C)`` position embedding for an ``old_size`` map resampled to ``new_size``.

  timm 1.0.31's ``resample_abs_pos_embed(posemb, new_size, old_size,
  num_prefix_tokens=1)`` (``timm/layers/pos_embed.py``): the first (prefix) token
  is kept, the ``(h, w, C)`` grid is resized with PyTorch's antialiased bicubic
  (:func:`antialiased_bicubic_weights`) in float32, width first and then height
  as PyTorch does, and cast back to the embedding's dtype. The same size
  returns the embedding unchanged.
  """
  if tuple(old_size) == tuple(new_size):
    return pos_embed
  (h0, w0), (h1, w1) = old_size, new_size
  channels = pos_embed.shape[-1]
  grid = pos_embed[1:].astype(jnp.float32).reshape(h0, w0, channels)
  if w1 != w0:
    grid = jnp.einsum("xw,hwc->hxc", antialiased_bicubic_weights(w0, w1), grid,
                      precision=jax.lax.Precision.HIGHEST)
  if h1 != h0:
    grid = jnp.einsum("yh,hxc->yxc", antialiased_bicubic_weights(h0, h1), grid,
                      precision=jax.lax.Precision.HIGHEST)
  grid = grid.reshape(h1 * w1, channels).astype(pos_embed.dtype)
  return jnp.concatenate([pos_embed[:1], grid], axis=0)
