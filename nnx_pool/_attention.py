"""Attention pooling heads: CLIP's attention pool over a map, and the latent-query (MAP) head.

* :class:`AttentionPool`: multi-head attention over the ``1 + H*W`` tokens of a
  map, the first being its mean (or a learned class token), with a learned
  absolute position embedding (Radford et al., "Learning Transferable Visual
  Models From Natural Language Supervision", ICML 2021,
  https://arxiv.org/abs/2103.00020), as timm's ``AttentionPool2d``
  (``timm/layers/attention_pool2d.py``) and open_clip's ``ModifiedResNet``
  head (``open_clip/modified_resnet.py``);
* :class:`AttentionPoolLatent`: a learned latent query attends over tokens
  ``(N, L, C)``, then a projection and a residual MLP after a LayerNorm
  (Zhai et al., "Sigmoid Loss for Language Image Pre-Training", ICCV 2023,
  https://arxiv.org/abs/2303.15343; Lee et al., "Set Transformer", ICML 2019,
  https://arxiv.org/abs/1810.00825), as timm's ``AttentionPoolLatent``
  (``timm/layers/attention_pool.py``) in a ViT with ``global_pool='map'``.

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

import functools
import math
from collections.abc import Mapping
from typing import Any, overload

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.typing import Dtype

from ._args import check_bool, check_number, check_positive_int, flax_names, is_int
from ._layout import (
  as_array,
  check_dtype,
  check_features,
  check_nonempty_spatial,
  prepare,
  unbatch,
)
from ._numerics import accumulation_dtype, mean
from ._torch_state import TORCH_KEYS, load

# timm's LayerNorm (timm/layers/norm.py), the norm_layer a ViT gives its MAP head.
_LAYER_NORM_EPS = 1e-6
# PyTorch's nn.LayerNorm, timm's q/k norm when the head has no norm_layer.
_TORCH_LAYER_NORM_EPS = 1e-5

# ----------------------------------------------------------------------------
# Position-embedding resampling: timm's resample_abs_pos_embed.
# ----------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------
# Shared pieces.
# ----------------------------------------------------------------------------


@overload
def _value(variable: None) -> None: ...
@overload
def _value(variable: nnx.Variable) -> jax.Array: ...
def _value(variable) -> jax.Array | None:
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


def _check_heads(embed_dim: int, num_heads, head_dim, module: str) -> tuple[int, int]:
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


def _check_choice(value, name: str, choices: dict[str, str]) -> str:
  accepted = ", ".join(f"{choice!r} ({meaning})" for choice, meaning in choices.items())
  if not isinstance(value, str):
    raise TypeError(f"`{name}` must be one of {accepted}; got {value!r}.")
  if value not in choices:
    raise ValueError(f"`{name}` must be one of {accepted}; got {value!r}.")
  return value


def _check_out_features(value) -> int | None:
  """None, 0 (no projection, timm's pre-logits mode) or a positive width."""
  if value is None:
    return None
  if not is_int(value):
    raise TypeError(
        f"`out_features` must be None, 0 (no output projection) or a positive int; got {value!r}.")
  if value < 0:
    raise ValueError(
        f"`out_features` must be None, 0 (no output projection) or a positive int; got {value!r}.")
  return int(value)


def _check_feat_size(value) -> tuple[int, int]:
  expected = "a positive int or a pair (h, w) of them"
  pair = (value, value) if is_int(value) else value
  if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(map(is_int, pair)):
    raise TypeError(f"`feat_size` must be {expected}; got {value!r}.")
  if min(pair) < 1:
    raise ValueError(f"`feat_size` must be {expected}; got {value!r}.")
  return int(pair[0]), int(pair[1])


def _normal(stddev: float):
  """timm's ``trunc_normal_(std=stddev)``: cut at +-2 absolute, a plain normal at these widths."""
  return nnx.initializers.normal(stddev)


# ----------------------------------------------------------------------------
# AttentionPool.
# ----------------------------------------------------------------------------

_POOL_TYPES = {"token": "the first token, (N, out)",
               "": "the attended map without the token, (N, H, W, out)"}


class AttentionPool(nnx.Module):
  """CLIP's attention pooling of a map: multi-head attention over its mean token and its cells.

  Radford et al., "Learning Transferable Visual Models From Natural Language
  Supervision", ICML 2021, https://arxiv.org/abs/2103.00020, as timm 1.0.31's
  ``AttentionPool2d`` (``timm/layers/attention_pool2d.py``; ``resnet50_clip`` and
  the other ``attn_abs`` heads) and open_clip 3.3.0's ``AttentionPool2d``
  (``open_clip/modified_resnet.py``, the head of ``ModifiedResNet``). The ``H*W``
  cells become tokens, the first token is their mean (or a learned class token),
  a learned position embedding is added, and multi-head attention runs over the
  ``1 + H*W`` tokens; ``proj`` maps the result to ``out_features``.

  The embedding is learned for a ``feat_size`` map; another map size resamples it
  as timm does (:func:`resample_pos_embed`: antialiased bicubic, the first token
  kept). With ``pool_type="token"`` only the first token's query is computed (the
  other tokens' outputs are not returned), as in CLIP's original ``query=x[:1]``.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from nnx_pool import AttentionPool
    >>> pool = AttentionPool(4, feat_size=(1, 3), out_features=3, num_heads=2,
    ...                      rngs=nnx.Rngs(0))
    >>> pool.q.kernel.shape, pool.pos_embed.shape  # 1 + 1*3 tokens
    ((4, 4), (4, 4))
    >>> # Zero position embedding, zero q and k: uniform attention, so the output is the
    >>> # projected mean of v over the 4 tokens; with v and proj the identity, the mean
    >>> # of (the mean cell, the 3 cells) is the mean cell, [4, 5, 6, 7].
    >>> pool.pos_embed[...] = jnp.zeros((4, 4))
    >>> pool.q.kernel[...] = pool.k.kernel[...] = jnp.zeros((4, 4))
    >>> pool.v.kernel[...] = jnp.eye(4)
    >>> pool.proj.kernel[...] = jnp.eye(4)[:, :3]
    >>> pool.proj.bias[...] = jnp.zeros(3)
    >>> pool(jnp.arange(12.0).reshape(1, 1, 3, 4))  # NHWC
    Array([[4., 5., 6.]], dtype=float32)

  Args:
    in_features: the channel count ``C`` of the map.
    feat_size: the map size ``(H, W)`` (or ``H`` for a square) the position embedding
      is learned for (default 7).
    out_features: the output width (default None: ``in_features``); 0 leaves out the
      projection (timm's pre-logits mode), so the output is ``embed_dim`` wide.
    embed_dim: the width of q, k and v (default None: ``in_features``).
    head_dim: the width of a head, used when ``num_heads`` is None (default 64).
    num_heads: the number of heads (default None: ``embed_dim // head_dim``).
    qkv_bias: whether the q, k and v projections have biases (default True).
    qkv_separate: the PyTorch layout mirrored: timm's separate ``q``, ``k`` and ``v``
      instead of one fused ``qkv`` (default False). The head holds ``q``, ``k`` and
      ``v`` as three Linear layers either way (a fused ``qkv`` is split on loading):
      a fused kernel would be cut by columns on every call, a copy of it.
    pool_type: ``"token"`` for the first token, ``(N, out)``, or ``""`` for the
      attended map without it, ``(N, H, W, out)`` (default ``"token"``).
    class_token: a learned first token (zeros at init) instead of the mean (default False).
    dtype: the computation dtype (default None: the promotion of the input and the
      parameters); the output keeps the input's dtype.
    param_dtype: the parameter dtype (default float32).
    rngs: random number streams for the initial parameters.
  """

  @flax_names
  def __init__(
      self, in_features: int, *, feat_size: int | tuple[int, int] = 7,
      out_features: int | None = None, embed_dim: int | None = None, head_dim: int | None = 64,
      num_heads: int | None = None, qkv_bias: bool = True, qkv_separate: bool = False,
      pool_type: str = "token", class_token: bool = False, dtype: Dtype | None = None,
      param_dtype: Dtype = jnp.float32, rngs: nnx.Rngs,
  ):
    module = "AttentionPool"
    self.in_features = check_positive_int(in_features, "in_features")
    self.feat_size = _check_feat_size(feat_size)
    out_features = _check_out_features(out_features)
    self.embed_dim = check_positive_int(embed_dim, "embed_dim", optional=True) or in_features
    self.num_heads, self.head_dim = _check_heads(self.embed_dim, num_heads, head_dim, module)
    qkv_bias = check_bool(qkv_bias, "qkv_bias")
    self.qkv_separate = check_bool(qkv_separate, "qkv_separate")
    self.pool_type = _check_choice(pool_type, "pool_type", _POOL_TYPES)
    class_token = check_bool(class_token, "class_token")
    self.dtype = dtype
    self.out_features = (self.in_features if out_features is None
                         else out_features or self.embed_dim)

    # timm's init_weights: q, k, v (or qkv) and the embedding ~ N(0, 1/C), biases zero.
    std = self.in_features ** -0.5
    layer: dict[str, Any] = dict(use_bias=qkv_bias, dtype=dtype, param_dtype=param_dtype,
                                 kernel_init=_normal(std), rngs=rngs)
    self.q, self.k, self.v = (nnx.Linear(self.in_features, self.embed_dim, **layer)
                              for _ in range(3))
    self.proj = (nnx.Linear(self.embed_dim, self.out_features, dtype=dtype,
                            param_dtype=param_dtype, rngs=rngs) if out_features != 0 else None)
    tokens = self.feat_size[0] * self.feat_size[1] + 1
    self.pos_embed = nnx.Param(_normal(std)(rngs.params(), (tokens, self.in_features),
                                            param_dtype))
    # timm's cls_token is (1, embed_dim), concatenated with the (N, HW, in_features) tokens:
    # it runs only when embed_dim == in_features, where the two agree.
    self.cls_token = (nnx.Param(jnp.zeros((1, self.in_features), param_dtype))
                      if class_token else None)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Pools ``(N, H, W, C)`` (or unbatched ``(H, W, C)``, or several batch axes).

    Returns ``(N, out)`` for ``pool_type="token"``, ``(N, H, W, out)`` for ``""``,
    in the input's dtype; ``out`` is ``out_features`` (``embed_dim`` when 0).
    """
    module = type(self).__name__
    x = as_array(inputs)
    if x.ndim < 3:  # prepare's message would suggest a num_spatial_dims this module lacks
      raise ValueError(
          f"{module}: `inputs` must be a channels-last map (N, H, W, C), (H, W, C) or "
          f"(*batch, H, W, C); got shape {tuple(x.shape)} (rank {x.ndim}).")
    x, batch = prepare(x, 2, kind="float", module=module, in_features=self.in_features,
                       owner=self)
    check_nonempty_spatial(x, module)
    with jax.named_scope("nnx_pool.attention_pool"):
      out = self._pool(x)
    return unbatch(out.astype(x.dtype), batch)

  def _pool(self, x: jax.Array) -> jax.Array:
    n, h, w, c = x.shape
    tokens = x.reshape(n, h * w, c)
    if self.cls_token is None:
      first = mean(tokens, (1,))  # (n, 1, c), float32 sums, the input's dtype
    else:
      first = jnp.broadcast_to(_value(self.cls_token)[None], (n, 1, c))
    pos_embed = resample_pos_embed(_value(self.pos_embed), self.feat_size, (h, w))
    compute = self.dtype or jnp.promote_types(x.dtype, pos_embed.dtype)
    seq = jnp.concatenate([first.astype(compute), tokens.astype(compute)], axis=1)
    seq = seq + pos_embed.astype(compute)[None]

    # Queries: the first token's alone when only it is returned.
    queries = seq[:, :1] if self.pool_type == "token" else seq
    e = self.embed_dim
    q, k, v = self.q(queries), self.k(seq), self.v(seq)
    heads = lambda a: a.reshape(*a.shape[:-1], self.num_heads, self.head_dim)  # noqa: E731
    out = attend(heads(q), heads(k), heads(v))
    out = out.reshape(*out.shape[:2], e)
    if self.pool_type == "token":
      out = out[:, 0]
    else:
      out = out[:, 1:].reshape(n, h, w, e)
    return out if self.proj is None else self.proj(out)

  @classmethod
  def from_torch(cls, state_dict: Mapping, *, num_heads: int, **options):
    """Builds the head from timm's or open_clip's ``AttentionPool2d`` state dict.

    Accepted keys: timm's ``pos_embed`` ``(1 + H*W, C)``, ``qkv.weight``
    ``(3 E, C)`` (rows q, then k, then v) or ``q.*``, ``k.*``, ``v.*``, with or
    without biases, ``proj.*`` (absent when timm's ``out_features=0``) and
    ``cls_token`` when ``class_token=True``; or open_clip's
    ``positional_embedding``, ``q_proj.*``, ``k_proj.*``, ``v_proj.*`` and
    ``c_proj.*`` (loaded as ``qkv_separate=True``; open_clip's forward returns
    the first token, ``pool_type="token"``). A fused ``qkv`` is split into ``q``,
    ``k`` and ``v``. ``in_features``, ``embed_dim``, ``out_features``, ``qkv_bias``
    and ``class_token`` come from the weights, ``qkv_separate`` from the keys;
    ``feat_size`` from the embedding when its map is square (pass ``feat_size=(h, w)``
    otherwise).

    Args:
      state_dict: the PyTorch module's ``state_dict()``, keys without a prefix.
      num_heads: the peer's head count (timm: ``embed_dim // head_dim``, 64-wide heads by
        default; open_clip: ``num_heads``, e.g. 32 for RN50's 2048 channels).
      **options: other constructor arguments (``pool_type``, ``feat_size``, ``dtype``...).
    """
    if "qkv_separate" in options:
      raise TypeError(f"{cls.__name__}.from_torch: do not pass qkv_separate; it comes from the "
                      "keys (qkv.* fused, or q.*, k.*, v.* separate).")
    if isinstance(state_dict, Mapping):
      options = dict(options, qkv_separate="qkv.weight" not in state_dict)
    if "feat_size" not in options:
      feat_size = _square_feat_size(state_dict, cls.__name__)
      if feat_size is not None:
        options = dict(options, feat_size=feat_size)
    return load(cls, TORCH_KEYS["AttentionPool"], state_dict, dict(options, num_heads=num_heads))


def _square_feat_size(state_dict, module: str) -> int | None:
  """The side of the square map that a state dict's position embedding is for, if it has one."""
  if not isinstance(state_dict, Mapping):
    return None  # load() refuses it with its own message
  for key in ("pos_embed", "positional_embedding"):
    if key in state_dict:
      shape = tuple(getattr(state_dict[key], "shape", np.shape(state_dict[key])))
      if len(shape) != 2:
        raise ValueError(
            f"{module}.from_torch: `{key}` must be (1 + H*W, C); got shape {shape}.")
      cells = shape[0] - 1
      side = math.isqrt(max(cells, 0))
      if cells < 1 or side * side != cells:
        raise ValueError(
            f"{module}.from_torch: `{key}` of shape {shape} holds {cells} map positions, not a "
            f"square number; pass feat_size=(h, w) with h * w = {cells}.")
      return side
  return None


# ----------------------------------------------------------------------------
# AttentionPoolLatent.
# ----------------------------------------------------------------------------

_LATENT_POOL_TYPES = {"token": "the first latent, (N, out)", "avg": "the latents' mean, (N, out)",
                      "": "every latent, (N, latent_len, out)"}


class _Mlp(nnx.Module):
  """timm's ``Mlp``: ``fc2(gelu(fc1(x)))`` with PyTorch's exact (erf) GELU."""

  def __init__(self, features: int, hidden: int, *, dtype, param_dtype, rngs: nnx.Rngs):
    self.fc1 = nnx.Linear(features, hidden, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.fc2 = nnx.Linear(hidden, features, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


def _layer_norm(features: int, epsilon: float, dtype, param_dtype,
                rngs: nnx.Rngs) -> nnx.LayerNorm:
  # Two-pass variance, as PyTorch's layer_norm (Flax's default E[x^2] - E[x]^2 loses digits).
  return nnx.LayerNorm(features, epsilon=epsilon, use_fast_variance=False, dtype=dtype,
                       param_dtype=param_dtype, rngs=rngs)


class AttentionPoolLatent(nnx.Module):
  """Multi-head attention pooling with a learned latent query (the MAP head of SigLIP and ViT).

  Zhai et al., "Sigmoid Loss for Language Image Pre-Training", ICCV 2023,
  https://arxiv.org/abs/2303.15343 (after Lee et al.'s pooling by multi-head
  attention, "Set Transformer", ICML 2019, https://arxiv.org/abs/1810.00825),
  as timm 1.0.31's ``AttentionPoolLatent`` (``timm/layers/attention_pool.py``)
  composed by a ViT with ``global_pool='map'``: ``latent_len`` learned queries
  (projected by ``q``) attend over the tokens (projected by the fused ``kv``),
  optionally with LayerNorms on each head's q and k (``qk_norm``); ``proj`` maps
  the result to ``out_features``, and ``x + mlp(norm(x))`` follows, with timm's
  LayerNorm (eps 1e-6) and an MLP ``fc1``, exact (erf) GELU, ``fc2`` of hidden
  width ``int(out_features * mlp_ratio)``. ``norm=False`` is timm's own default,
  ``norm_layer=None``: ``x + mlp(x)`` without the norm, and ``qk_norm``'s norms are
  PyTorch's ``nn.LayerNorm`` (eps 1e-5).

  Example usage::

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from nnx_pool import AttentionPoolLatent
    >>> head = AttentionPoolLatent(4, num_heads=2, rngs=nnx.Rngs(0))
    >>> head.latent.shape, head.kv.kernel.shape, head.mlp.fc1.kernel.shape
    ((1, 1, 4), (4, 8), (4, 16))
    >>> # A zero q makes the attention uniform, so before the MLP the output is the
    >>> # projected mean of v; with v and proj the identity and a zero fc2, it is the
    >>> # mean token.
    >>> head.q.kernel[...] = jnp.zeros((4, 4))
    >>> head.kv.kernel[...] = jnp.concatenate([jnp.zeros((4, 4)), jnp.eye(4)], axis=1)
    >>> head.proj.kernel[...] = jnp.eye(4)
    >>> head.mlp.fc2.kernel[...] = jnp.zeros((16, 4))
    >>> head(jnp.arange(16.0).reshape(1, 4, 4))  # (N, L, C) tokens
    Array([[6., 7., 8., 9.]], dtype=float32)

  Args:
    in_features: the token width ``C``.
    out_features: the output width (default None: ``in_features``).
    embed_dim: the width of q, k and v (default None: ``in_features``).
    num_heads: the number of heads; it must divide ``embed_dim`` (default 8).
    mlp_ratio: the MLP's hidden width over ``out_features`` (default 4.0).
    qkv_bias: whether ``q`` and ``kv`` have biases (default True).
    qk_norm: a LayerNorm over each head's q and k (default False).
    norm: the LayerNorm before the MLP, as a ViT builds the head (default True); False
      is timm's default ``norm_layer=None`` (no norm; ``qk_norm``'s eps is then 1e-5).
    latent_len: the number of latent queries (default 1).
    pool_type: ``"token"`` for the first latent, ``(N, out)``; ``"avg"`` for the
      latents' mean, ``(N, out)``; ``""`` for all of them, ``(N, latent_len, out)``
      (default ``"token"``).
    dtype, param_dtype, rngs: the computation dtype, the parameter dtype and the random
      streams for the initial parameters, as :class:`AttentionPool` takes them (the
      defaults too; the output keeps the input's dtype).
  """

  @flax_names
  def __init__(
      self, in_features: int, *, out_features: int | None = None,
      embed_dim: int | None = None, num_heads: int = 8, mlp_ratio: float = 4.0,
      qkv_bias: bool = True, qk_norm: bool = False, norm: bool = True, latent_len: int = 1,
      pool_type: str = "token", dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
      rngs: nnx.Rngs,
  ):
    module = "AttentionPoolLatent"
    self.in_features = check_positive_int(in_features, "in_features")
    self.out_features = check_positive_int(out_features, "out_features",
                                           optional=True) or self.in_features
    self.embed_dim = check_positive_int(embed_dim, "embed_dim", optional=True) or in_features
    if num_heads is None:
      raise TypeError(f"`num_heads` must be a positive int dividing embed_dim={self.embed_dim}; "
                      "got None.")
    self.num_heads, self.head_dim = _check_heads(self.embed_dim, num_heads, None, module)
    mlp_ratio = check_number(mlp_ratio, "mlp_ratio", positive=True)
    hidden = int(self.out_features * mlp_ratio)  # timm's Mlp width
    if hidden < 1:
      raise ValueError(
          f"`mlp_ratio` must make the MLP at least 1 wide (int(out_features * mlp_ratio) with "
          f"out_features={self.out_features}); got {mlp_ratio!r}.")
    self.mlp_ratio = mlp_ratio
    qkv_bias = check_bool(qkv_bias, "qkv_bias")
    qk_norm = check_bool(qk_norm, "qk_norm")
    norm = check_bool(norm, "norm")
    self.latent_len = check_positive_int(latent_len, "latent_len")
    self.pool_type = _check_choice(pool_type, "pool_type", _LATENT_POOL_TYPES)
    self.dtype = dtype

    options: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    # timm's init_weights: the latent ~ N(0, 1/embed_dim) (trunc_normal_tf_ at +-2 std).
    self.latent = nnx.Param(nnx.initializers.truncated_normal(self.embed_dim ** -0.5)(
        rngs.params(), (1, self.latent_len, self.embed_dim), param_dtype))
    self.q = nnx.Linear(self.embed_dim, self.embed_dim, use_bias=qkv_bias, **options)
    self.kv = nnx.Linear(self.in_features, 2 * self.embed_dim, use_bias=qkv_bias, **options)
    qk_eps = _LAYER_NORM_EPS if norm else _TORCH_LAYER_NORM_EPS  # timm: norm_layer or LayerNorm
    self.q_norm = _layer_norm(self.head_dim, qk_eps, **options) if qk_norm else None
    self.k_norm = _layer_norm(self.head_dim, qk_eps, **options) if qk_norm else None
    self.proj = nnx.Linear(self.embed_dim, self.out_features, **options)
    self.norm = _layer_norm(self.out_features, _LAYER_NORM_EPS, **options) if norm else None
    self.mlp = _Mlp(self.out_features, hidden, **options)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Pools tokens ``(N, L, C)`` (or unbatched ``(L, C)``).

    Returns ``(N, out)`` for ``pool_type`` ``"token"`` and ``"avg"``,
    ``(N, latent_len, out)`` for ``""``, in the input's dtype. A feature map
    ``(N, H, W, C)`` is refused: flatten it to tokens first,
    ``x.reshape(n, h * w, c)``.
    """
    x = self._check(inputs)
    unbatched = x.ndim == 2
    if unbatched:
      x = x[None]
    with jax.named_scope("nnx_pool.attention_pool_latent"):
      out = self._pool(x).astype(x.dtype)
    return out[0] if unbatched else out

  def _check(self, inputs) -> jax.Array:
    module = type(self).__name__
    x = as_array(inputs)
    check_dtype(x, "float", module)
    if x.ndim not in (2, 3):
      message = (f"{module}: `inputs` must be tokens (N, L, C) or unbatched (L, C); got shape "
                 f"{tuple(x.shape)} (rank {x.ndim}).")
      if x.ndim == 4:
        message += (" A feature map (N, H, W, C) must be flattened to tokens first: "
                    "n, h, w, c = x.shape; x.reshape(n, h * w, c). For several batch axes, "
                    "merge them (x.reshape(-1, L, C)) or use jax.vmap.")
      raise ValueError(message)
    check_features(x, self.in_features, 1, module)
    if x.shape[-2] == 0:
      raise ValueError(f"{module}: `inputs` needs at least one token to attend to; got shape "
                       f"{tuple(x.shape)}.")
    return x

  def _pool(self, x: jax.Array) -> jax.Array:
    n, length, _ = x.shape
    e, heads, d = self.embed_dim, self.num_heads, self.head_dim
    # The latent's queries are the same for every input: computed once, shared by the batch.
    q = self.q(_value(self.latent)[0]).reshape(self.latent_len, heads, d)
    kv = self.kv(x).reshape(n, length, 2, heads, d)
    k, v = kv[:, :, 0], kv[:, :, 1]
    if self.q_norm is not None:
      # k_norm is set whenever q_norm is (both follow qk_norm).
      q, k = self.q_norm(q), self.k_norm(k)  # pyright: ignore[reportOptionalCall]
    compute = jnp.promote_types(q.dtype, v.dtype)
    out = attend(q.astype(compute), k.astype(compute), v.astype(compute))
    out = self.proj(out.reshape(n, self.latent_len, e))
    out = out + self.mlp(out if self.norm is None else self.norm(out))
    if self.pool_type == "token":
      return out[:, 0]
    if self.pool_type == "avg":
      return mean(out, (1,))[:, 0]
    return out

  @classmethod
  def from_torch(cls, state_dict: Mapping, *, num_heads: int, **options):
    """Builds the head from timm's ``AttentionPoolLatent`` state dict (a ViT's ``attn_pool.*``).

    Accepted keys: ``latent`` ``(1, latent_len, E)``, ``q.*``, ``kv.*`` (``(2 E, C)``:
    rows k, then v), with or without biases, ``q_norm.*`` and ``k_norm.*`` when
    ``qk_norm=True``, ``proj.*``, ``norm.*`` (a ViT's head), ``mlp.fc1.*`` and
    ``mlp.fc2.*``.
    Without ``norm.*`` it is timm's default ``AttentionPoolLatent(C, num_heads=h)``
    (``norm_layer=None``), loaded as ``norm=False``. ``in_features``, ``embed_dim``,
    ``out_features``, ``mlp_ratio``, ``qkv_bias``, ``qk_norm``, ``norm`` and
    ``latent_len`` come from the weights. timm's ``out_features=0``, ``q_proj=False``
    and ``pos_embed='abs'`` are not supported.

    Args:
      state_dict: the PyTorch module's ``state_dict()``, keys without a prefix
        (``attn_pool.`` stripped for a ViT).
      num_heads: the peer's head count (a ViT's ``num_heads``, e.g. 12 for ViT-B).
      **options: other constructor arguments (``pool_type``, ``dtype``...).
    """
    return load(cls, TORCH_KEYS["AttentionPoolLatent"], state_dict,
                dict(options, num_heads=num_heads))

