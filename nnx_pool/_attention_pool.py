"""CLIP's attention pooling of a map: multi-head attention over its mean token and its cells.

:class:`AttentionPool`: multi-head attention over the ``1 + H*W`` tokens of a map, the
first being its mean (or a learned class token), with a learned absolute position
embedding (Radford et al., "Learning Transferable Visual Models From Natural Language
Supervision", ICML 2021, https://arxiv.org/abs/2103.00020), as timm's ``AttentionPool2d``
(``timm/layers/attention_pool2d.py``) and open_clip's ``ModifiedResNet`` head
(``open_clip/modified_resnet.py``). The attention and its dtypes are
:mod:`nnx_pool._attention`'s; the embedding's resampling, :mod:`nnx_pool._pos_embed`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, overload

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.typing import Dtype

from ._args import check_bool, check_choice, check_positive_int, flax_names, is_int
from ._attention import attend, check_heads, trunc_normal, variable_value
from ._layout import as_array, check_nonempty_spatial, prepare, unbatch
from ._numerics import mean
from ._pos_embed import resample_pos_embed
from ._torch_keys import TORCH_KEYS
from ._torch_state import load


def _check_width(value, name: str) -> int | None:
  """``out_features`` or ``reset``'s ``num_classes``: None, 0 (no projection) or a width."""
  if value is None:
    return None
  expected = "None, 0 (no output projection) or a positive int"
  if not is_int(value):
    raise TypeError(f"`{name}` must be {expected}; got {value!r}.")
  if value < 0:
    raise ValueError(f"`{name}` must be {expected}; got {value!r}.")
  return int(value)


def _check_feat_size(value) -> tuple[int, int]:
  expected = "a positive int or a pair (h, w) of them"
  pair = (value, value) if is_int(value) else value
  if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(map(is_int, pair)):
    raise TypeError(f"`feat_size` must be {expected}; got {value!r}.")
  if min(pair) < 1:
    raise ValueError(f"`feat_size` must be {expected}; got {value!r}.")
  return int(pair[0]), int(pair[1])


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

  As timm's head, it gives the pooled features before ``proj`` when called with
  ``pre_logits=True`` (``proj`` kept, for a later call without it), and :meth:`reset`
  replaces ``proj`` by a new one of another width (a new class count), every other
  weight kept.

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
    out_features: the output width (default None: ``in_features``); 0 builds the head
      without ``proj`` (timm's ``out_features=0``), so the output is ``embed_dim`` wide.
      For the features before the projection of a head that has one, call it with
      ``pre_logits=True``; for another width, :meth:`reset` it.
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
    out_features = _check_width(out_features, "out_features")
    self.embed_dim = check_positive_int(embed_dim, "embed_dim", optional=True) or in_features
    self.num_heads, self.head_dim = check_heads(self.embed_dim, num_heads, head_dim, module)
    qkv_bias = check_bool(qkv_bias, "qkv_bias")
    self.qkv_separate = check_bool(qkv_separate, "qkv_separate")
    self.pool_type = check_choice(pool_type, "pool_type", _POOL_TYPES)
    class_token = check_bool(class_token, "class_token")
    self.dtype = dtype
    self.out_features = (self.in_features if out_features is None
                         else out_features or self.embed_dim)

    # timm's init_weights: q, k, v (or qkv) and the embedding ~ N(0, 1/C), biases zero.
    std = self.in_features ** -0.5
    layer: dict[str, Any] = dict(use_bias=qkv_bias, dtype=dtype, param_dtype=param_dtype,
                                 kernel_init=trunc_normal(std), rngs=rngs)
    self.q, self.k, self.v = (nnx.Linear(self.in_features, self.embed_dim, **layer)
                              for _ in range(3))
    self.proj = (self._projection(self.out_features, param_dtype, rngs) if out_features != 0
                 else None)
    tokens = self.feat_size[0] * self.feat_size[1] + 1
    self.pos_embed = nnx.Param(trunc_normal(std)(rngs.params(), (tokens, self.in_features),
                                            param_dtype))
    # timm's cls_token is (1, embed_dim), concatenated with the (N, HW, in_features) tokens:
    # it runs only when embed_dim == in_features, where the two agree.
    self.cls_token = (nnx.Param(jnp.zeros((1, self.in_features), param_dtype))
                      if class_token else None)

  def _projection(self, width: int, param_dtype, rngs: nnx.Rngs) -> nnx.Linear:
    """``proj``: a Linear from ``embed_dim`` to ``width``, with Flax's default initialisers."""
    return nnx.Linear(self.embed_dim, width, dtype=self.dtype, param_dtype=param_dtype,
                      rngs=rngs)

  # A new projection needs random streams; 0 (none) or None (the width kept) does not.
  @overload
  def reset(self, num_classes: Literal[0] | None = None, *,
            pool_type: str | None = None) -> None: ...
  @overload
  def reset(self, num_classes: int, *, rngs: nnx.Rngs, pool_type: str | None = None) -> None: ...
  def reset(self, num_classes: int | None = None, *, rngs: nnx.Rngs | None = None,
            pool_type: str | None = None) -> None:
    """timm's ``reset``: a new ``proj`` to ``num_classes`` outputs, every other weight kept.

    ``num_classes`` 0 removes ``proj`` (the output is then ``embed_dim`` wide, timm's
    ``nn.Identity``); None keeps it. The new projection is initialised as the
    constructor's, from ``rngs``, in the head's ``dtype`` and parameter dtype.
    ``pool_type``, when given, is set too. The head's graph changes, so an optimizer
    built over its parameters is to be built again (as in PyTorch).

    Example usage::

      >>> from flax import nnx
      >>> from nnx_pool import AttentionPool
      >>> pool = AttentionPool(8, feat_size=2, num_heads=2, rngs=nnx.Rngs(0))
      >>> pool.reset(10, rngs=nnx.Rngs(1))
      >>> pool.proj.kernel.shape, pool.out_features
      ((8, 10), 10)
    """
    module = type(self).__name__
    # Everything is checked, and the projection built, before the head changes.
    pool_type = (self.pool_type if pool_type is None
                 else check_choice(pool_type, "pool_type", _POOL_TYPES))
    width = _check_width(num_classes, "num_classes")
    proj = None
    if width:
      if not isinstance(rngs, nnx.Rngs):
        raise TypeError(
            f"{module}.reset({width}) builds a new projection, which needs `rngs`; got "
            f"{rngs!r}. Pass rngs=nnx.Rngs(0) (any seed), or num_classes=0 for no projection.")
      proj = self._projection(width, variable_value(self.pos_embed).dtype, rngs)
    self.pool_type = pool_type
    if width is not None:
      self.proj, self.out_features = proj, width or self.embed_dim

  def __call__(self, inputs: jax.Array, *, pre_logits: bool = False) -> jax.Array:
    """Pools ``(N, H, W, C)`` (or unbatched ``(H, W, C)``, or several batch axes).

    Returns ``(N, out)`` for ``pool_type="token"``, ``(N, H, W, out)`` for ``""``,
    in the input's dtype; ``out`` is ``out_features`` (``embed_dim`` when 0).

    Args:
      inputs: the map, channels-last.
      pre_logits: return the attended features before ``proj``, ``embed_dim`` wide, as
        timm's ``forward(x, pre_logits=True)`` (default False). A call option, as NNX
        modules take theirs (``Dropout``'s ``deterministic``): the same head gives both.
    """
    module = type(self).__name__
    pre_logits = check_bool(pre_logits, "pre_logits")
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
      if not pre_logits and self.proj is not None:
        out = self.proj(out)
    return unbatch(out.astype(x.dtype), batch)

  def _pool(self, x: jax.Array) -> jax.Array:
    """The attended tokens before ``proj``: the first, or the map's cells."""
    n, h, w, c = x.shape
    tokens = x.reshape(n, h * w, c)
    if self.cls_token is None:
      first = mean(tokens, (1,))  # (n, 1, c), float32 sums, the input's dtype
    else:
      first = jnp.broadcast_to(variable_value(self.cls_token)[None], (n, 1, c))
    pos_embed = resample_pos_embed(variable_value(self.pos_embed), self.feat_size, (h, w))
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
    return out[:, 0] if self.pool_type == "token" else out[:, 1:].reshape(n, h, w, e)

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
