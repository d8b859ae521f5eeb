"""Multi-head attention pooling with a learned latent query: the MAP head of SigLIP and ViT.

:class:`AttentionPoolLatent`: a learned latent query attends over tokens ``(N, L, C)``,
then a projection and a residual MLP after a LayerNorm (Zhai et al., "Sigmoid Loss for
Language Image Pre-Training", ICCV 2023, https://arxiv.org/abs/2303.15343; Lee et al.,
"Set Transformer", ICML 2019, https://arxiv.org/abs/1810.00825), as timm's
``AttentionPoolLatent`` (``timm/layers/attention_pool.py``) in a ViT with
``global_pool='map'``. The attention and its dtypes are :mod:`nnx_pool._attention`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.typing import Dtype

from ._args import check_bool, check_choice, check_number, check_positive_int, flax_names
from ._attention import attend, check_heads, variable_value
from ._layout import as_array, check_dtype, check_features
from ._numerics import mean
from ._torch_keys import TORCH_KEYS
from ._torch_state import load

# timm's LayerNorm (timm/layers/norm.py), the norm_layer a ViT gives its MAP head.
_LAYER_NORM_EPS = 1e-6
# PyTorch's nn.LayerNorm, timm's q/k norm when the head has no norm_layer.
_TORCH_LAYER_NORM_EPS = 1e-5


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
    self.num_heads, self.head_dim = check_heads(self.embed_dim, num_heads, None, module)
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
    self.pool_type = check_choice(pool_type, "pool_type", _LATENT_POOL_TYPES)
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
    q = self.q(variable_value(self.latent)[0]).reshape(self.latent_len, heads, d)
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
