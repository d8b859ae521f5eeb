"""The table of PyTorch key sets each module's ``from_torch`` accepts: :data:`TORCH_KEYS`.

One :class:`~nnx_pool._torch_state.Loader` a module, read by
:func:`~nnx_pool._torch_state.load` (which says what an entry holds). A new module's
loader is a few rows. CLIP's attention pooling head (:class:`~nnx_pool.AttentionPool`:
``q``, ``k`` and ``v`` or a fused ``qkv``, and ``proj``, all :class:`flax.nnx.Linear`,
and a ``pos_embed`` parameter) reads open_clip's ``AttentionPool2d`` with one key set,
renaming each layer::

  (*linear("q_proj", "q"), *linear("k_proj", "k"), *linear("v_proj", "v"),
   *linear("c_proj", "proj"), Row("positional_embedding", "pos_embed"))

and timm's fused ``qkv`` with another, splitting the weight (and bias) into
three: ``Row("qkv.weight", ("q.kernel", "k.kernel", "v.kernel"), linear_weight())``.
``sizes`` reads the constructor arguments back from the converted weights
(``in_features=p["pos_embed"].shape[1]``...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ._torch_state import (
  Loader,
  Requirement,
  Row,
  as_is,
  batch_norm,
  conv_weight,
  layer_norm,
  linear,
  linear_weight,
  rank_is,
  shape_is,
)


def _mlp(reduce: str, expand: str, *, bias: bool) -> tuple[Row, ...]:
  """A gate's reduce and expand maps into ``fc1`` and ``fc2``: both weights, then both biases."""
  rows = (Row(f"{reduce}.weight", "fc1.kernel", linear_weight()),
          Row(f"{expand}.weight", "fc2.kernel", linear_weight()))
  return rows + ((Row(f"{reduce}.bias", "fc1.bias"), Row(f"{expand}.bias", "fc2.bias"))
                 if bias else ())


def _mlp_sizes(p: Mapping[str, np.ndarray]) -> dict:
  return dict(in_features=p["fc1.kernel"].shape[0], squeeze_features=p["fc1.kernel"].shape[1],
              use_bias="fc1.bias" in p)


def _square(shape: tuple[int, ...]) -> str | None:
  return None if shape[0] == shape[1] else f"must be C-to-C; got {shape[:2]}."


def _eca_conv(shape: tuple[int, ...]) -> str | None:
  if len(shape) != 3 or shape[:2] != (1, 1):
    return (f"must be a Conv1d(1, 1, k) weight of shape (1, 1, k); got {shape}. "
            "(timm's use_mlp=True variant is not supported.)")
  return None


def _cbam_conv(maps: int) -> Requirement:
  """CBAM's spatial convolution from ``maps`` maps (2: mean and max; LightCBAM's 1) to one."""
  def requirement(shape: tuple[int, ...]) -> str | None:
    if not (3 <= len(shape) <= 5 and shape[:2] == (1, maps)):
      return f"must have shape (1, {maps}, k, ...) with 1 to 3 spatial dims; got {shape}."
    return None
  return requirement


def _cbam_rows(bias: bool, maps: int = 2) -> tuple[Row, ...]:
  return (*_mlp("channel.fc1", "channel.fc2", bias=bias),
          Row("spatial.conv.conv.weight", "spatial_conv.kernel", conv_weight(_cbam_conv(maps))),
          *batch_norm("spatial.conv.bn", "spatial_norm"))


def _conv_mlp(key: str) -> tuple[Row, ...]:
  """timm's ConvMlp with LayerNorm2d (fc1, norm, fc2) into a module of the same names."""
  return (*linear(f"{key}.fc1", f"{key}.fc1"), *layer_norm(f"{key}.norm", f"{key}.norm"),
          *linear(f"{key}.fc2", f"{key}.fc2"))


def _context_sizes(p: Mapping[str, np.ndarray]) -> dict:
  fc1 = p["mlp_scale.fc1.kernel" if "mlp_scale.fc1.kernel" in p else "mlp_add.fc1.kernel"]
  return dict(in_features=fc1.shape[0], squeeze_features=fc1.shape[1],
              use_attn="conv_attn.kernel" in p, fuse_scale="mlp_scale.fc1.kernel" in p,
              fuse_add="mlp_add.fc1.kernel" in p)


# Issue 25, the attention pooling heads: AttentionPool, AttentionPoolLatent.


# The position embedding, whose width and length the loader reads.
_POS = as_is(rank_is(2, "(1 + H*W, C)"))


def _stacked(parts: int, what: str) -> Requirement:
  """A fused projection's weight ``(parts * E, C)``: ``what`` stacked along its rows."""
  def requirement(shape: tuple[int, ...]) -> str | None:
    if shape[0] % parts:
      return (f"must stack {what} along its first axis, so a multiple of {parts} rows; got "
              f"shape {shape}.")
    return None
  return requirement


def _attention_pool_rows(separate: bool, bias: bool, proj: bool, cls: bool) -> tuple[Row, ...]:
  """timm AttentionPool2d: fused ``qkv`` or separate ``q``/``k``/``v``, ``proj``, ``pos_embed``."""
  if separate:
    qkv = tuple(row for name in "qkv" for row in linear(name, name, bias=bias))
  else:
    qkv = (Row("qkv.weight", ("q.kernel", "k.kernel", "v.kernel"),
               linear_weight(_stacked(3, "q, k and v (E rows each)"))),
           *((Row("qkv.bias", ("q.bias", "k.bias", "v.bias")),) if bias else ()))
  return (*qkv, *(linear("proj", "proj") if proj else ()), Row("pos_embed", "pos_embed", _POS),
          *((Row("cls_token", "cls_token"),) if cls else ()))


def _attention_pool_sizes(p: Mapping[str, np.ndarray]) -> dict:
  # qkv_separate (the layout, not the computation) comes from the keys: AttentionPool.from_torch.
  return dict(in_features=p["pos_embed"].shape[1], embed_dim=p["q.kernel"].shape[1],
              out_features=p["proj.kernel"].shape[1] if "proj.kernel" in p else 0,
              qkv_bias="q.bias" in p, class_token="cls_token" in p)


def mlp_ratio_for(out_features: int, hidden: int) -> float:
  """The ``mlp_ratio`` whose ``int(out_features * mlp_ratio)`` is ``hidden`` (timm's Mlp width).

  ``hidden / out_features`` is sometimes a hair short (11 * (15 / 11) < 15), so
  it is nudged up to the next float until the product reaches ``hidden``.

  >>> ratio = mlp_ratio_for(11, 15)
  >>> int(11 * (15 / 11)), int(11 * ratio)
  (14, 15)
  """
  ratio = hidden / out_features
  while int(out_features * ratio) < hidden:
    ratio = math.nextafter(ratio, math.inf)
  return ratio


def _latent_rows(bias: bool, qk_norm: bool, norm: bool) -> tuple[Row, ...]:
  """timm AttentionPoolLatent: latent, q, fused kv, q/k norms, proj, the norm (a ViT's
  LayerNorm; none with timm's default norm_layer=None), mlp."""
  latent = as_is(rank_is(3, "(1, latent_len, E)"))
  return (Row("latent", "latent", latent), *linear("q", "q", bias=bias),
          *linear("kv", "kv", bias=bias,
                  weight=linear_weight(_stacked(2, "k and v (E rows each)"))),
          *((*layer_norm("q_norm", "q_norm"), *layer_norm("k_norm", "k_norm")) if qk_norm else ()),
          *linear("proj", "proj"), *(layer_norm("norm", "norm") if norm else ()),
          *linear("mlp.fc1", "mlp.fc1"), *linear("mlp.fc2", "mlp.fc2"))


def _latent_sizes(p: Mapping[str, np.ndarray]) -> dict:
  out_features = p["proj.kernel"].shape[1]
  return dict(in_features=p["kv.kernel"].shape[0], embed_dim=p["q.kernel"].shape[1],
              out_features=out_features,
              mlp_ratio=mlp_ratio_for(out_features, p["mlp.fc1.kernel"].shape[1]),
              qkv_bias="q.bias" in p, qk_norm="q_norm.scale" in p, norm="norm.scale" in p,
              latent_len=p["latent"].shape[1])


TORCH_KEYS: dict[str, Loader] = {
    # torchvision SqueezeExcitation, timm SEModule (fc1/fc2), timm EfficientNet SqueezeExcite
    # (conv_reduce/conv_expand), with or without biases.
    # timm SEModule(norm_layer=nn.BatchNorm2d) (rexnet's SEWithNorm): bn between fc1 and act.
    "SqueezeExcitation": Loader(
        inferred=("in_features", "squeeze_features", "use_bias", "norm"),
        key_sets=(*(_mlp(reduce, expand, bias=bias)
                    for reduce, expand in (("fc1", "fc2"), ("conv_reduce", "conv_expand"))
                    for bias in (False, True)),
                  *((*_mlp("fc1", "fc2", bias=bias), *batch_norm("bn", "bn"))
                    for bias in (False, True))),
        sizes=lambda p: dict(_mlp_sizes(p), norm="bn.scale" in p),
    ),
    # timm EffectiveSEModule.
    "EffectiveSqueezeExcitation": Loader(
        inferred=("in_features",),
        key_sets=(linear("fc", "fc", weight=linear_weight(_square)),),
        sizes=lambda p: dict(in_features=p["fc.kernel"].shape[0]),
    ),
    # timm EcaModule (use_mlp=False).
    "EfficientChannelAttention": Loader(
        inferred=("kernel_size",),
        key_sets=((Row("conv.weight", "conv.kernel", conv_weight(_eca_conv)),),),
        sizes=lambda p: dict(kernel_size=p["conv.kernel"].shape[0]),
    ),
    # timm CbamModule: ChannelAttn (mlp_bias False or True) and SpatialAttn's ConvNormAct.
    "CBAM": Loader(
        inferred=("in_features", "squeeze_features", "use_bias", "spatial_kernel_size",
                  "num_spatial_dims"),
        key_sets=(_cbam_rows(bias=False), _cbam_rows(bias=True)),
        sizes=lambda p: dict(_mlp_sizes(p), spatial_kernel_size=p["spatial_conv.kernel"].shape[0],
                             num_spatial_dims=p["spatial_conv.kernel"].ndim - 2),
    ),
    # Issue 25, the generalized pools (nnx_pool._generalized) and timm's remaining gates
    # (nnx_pool._cbam, nnx_pool._context_gates); SqueezeExcitation's bn key sets are in its
    # entry above.
    # GeM as cnnimageretrieval-pytorch defines it: p = Parameter(torch.ones(1) * p). The
    # constructor reads p (and r below), so that its check holds for loaded weights too.
    "GeMPool": Loader(
        inferred=("p",),
        key_sets=((Row("p", "p", as_is(shape_is((1,)))),),),
        sizes=lambda p: dict(p=float(p["p"][0])),
    ),
    # timm LsePlus2d: r, a scalar Parameter or (r_learnable=False) buffer.
    "LsePlusPool": Loader(
        inferred=("r",),
        key_sets=((Row("r", "r", as_is(shape_is(()))),),),
        sizes=lambda p: dict(r=float(p["r"])),
    ),
    # timm LightCbamModule: LightChannelAttn (mlp_bias False or True) and LightSpatialAttn's
    # ConvNormAct(1, 1, k).
    "LightCBAM": Loader(
        inferred=("in_features", "squeeze_features", "use_bias", "spatial_kernel_size",
                  "num_spatial_dims"),
        key_sets=(_cbam_rows(bias=False, maps=1), _cbam_rows(bias=True, maps=1)),
        sizes=lambda p: dict(_mlp_sizes(p), spatial_kernel_size=p["spatial_conv.kernel"].shape[0],
                             num_spatial_dims=p["spatial_conv.kernel"].ndim - 2),
    ),
    # timm GlobalContext: conv_attn (use_attn) and mlp_scale and/or mlp_add, each a ConvMlp
    # (fc1, LayerNorm2d norm, act, fc2).
    "GlobalContext": Loader(
        inferred=("in_features", "squeeze_features", "use_attn", "fuse_scale", "fuse_add"),
        key_sets=tuple((*(linear("conv_attn", "conv_attn") if attn else ()),
                        *(_conv_mlp("mlp_scale") if scale else ()),
                        *(_conv_mlp("mlp_add") if add else ()))
                       for attn in (True, False)
                       for scale, add in ((True, False), (False, True), (True, True))),
        sizes=_context_sizes,
    ),
    # Issue 25, the attention pooling heads (nnx_pool._attention_pool, _latent_pool).
    # timm AttentionPool2d (fused qkv, split into q/k/v, or separate q/k/v, with or without
    # their biases; proj
    # absent for out_features=0; cls_token for class_token=True), and open_clip ModifiedResNet's
    # AttentionPool2d (q_proj/k_proj/v_proj/c_proj, positional_embedding) as separate q/k/v.
    "AttentionPool": Loader(
        inferred=("in_features", "embed_dim", "head_dim", "out_features", "qkv_bias",
                  "class_token"),
        key_sets=(*(_attention_pool_rows(separate, bias, proj, cls)
                    for separate in (False, True) for bias in (True, False)
                    for proj in (True, False) for cls in (False, True)),
                  (*linear("q_proj", "q"), *linear("k_proj", "k"), *linear("v_proj", "v"),
                   *linear("c_proj", "proj"), Row("positional_embedding", "pos_embed", _POS))),
        sizes=_attention_pool_sizes,
    ),
    # timm AttentionPoolLatent as a ViT builds it (global_pool='map', norm_layer=LayerNorm)
    # or with timm's default norm_layer=None (no norm), with or without q/kv biases and
    # q_norm/k_norm.
    "AttentionPoolLatent": Loader(
        inferred=("in_features", "embed_dim", "out_features", "mlp_ratio", "qkv_bias",
                  "qk_norm", "norm", "latent_len"),
        key_sets=tuple(_latent_rows(bias, qk_norm, norm) for norm in (True, False)
                       for bias in (True, False) for qk_norm in (False, True)),
        sizes=_latent_sizes,
    ),
}
