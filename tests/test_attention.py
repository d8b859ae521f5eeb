"""Tests for the attention pooling heads (nnx_pool._attention_pool, nnx_pool._latent_pool).

Each expectation says where it comes from: a hand computation, a float64 NumPy
statement of the head written here, or PyTorch 2.13 CPU running a re-statement
of the peer's forward written here from its source: timm 1.0.31
``timm/layers/attention_pool2d.py`` (``AttentionPool2d.forward``),
``timm/layers/pos_embed.py`` (``resample_abs_pos_embed``),
``timm/layers/attention_pool.py`` (``AttentionPoolLatent.forward``, with the
``norm_layer``/``act_layer`` that ``timm/models/vision_transformer.py`` passes
for ``global_pool='map'``: timm's ``LayerNorm``, eps 1e-6, and ``nn.GELU``), and
open_clip 3.3.0 ``open_clip/modified_resnet.py`` (``AttentionPool2d.forward``).
timm cannot be imported here (it imports torchvision, which has no CPU build
for torch 2.13 in the index). timm runs ``F.scaled_dot_product_attention``
(``use_fused_attn()`` is on by default), and so do the re-statements. The
PyTorch tests skip cleanly when torch is absent.
"""

from __future__ import annotations

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_pool import AttentionPool, AttentionPoolLatent
from nnx_pool._attention import attend
from nnx_pool._pos_embed import antialiased_bicubic_weights, resample_pos_embed

_TORCH_REASON = "PyTorch parity needs torch==2.13.0 (the parity extra)"
_TOL = 1e-5  # the bound, values and gradients


def distinct(shapes: dict[str, tuple[int, ...]], seed: int, scale: float = 0.5
             ) -> dict[str, np.ndarray]:
  """A PyTorch-layout state dict: float32 uniform(-scale, scale) tensors of these shapes."""
  rng = np.random.default_rng(seed)
  return {key: rng.uniform(-scale, scale, shape).astype(np.float32)
          for key, shape in shapes.items()}


def linear_keys(name: str, out: int, features: int, bias: bool = True) -> dict:
  return {f"{name}.weight": (out, features), **({f"{name}.bias": (out,)} if bias else {})}


# ----------------------------------------------------------------------------
# PyTorch re-statements of the peers' forwards.
# ----------------------------------------------------------------------------


def timm_resample_abs_pos_embed(torch, posemb, new_size, old_size, num_prefix_tokens=1):
  """timm 1.0.31 timm/layers/pos_embed.py resample_abs_pos_embed (interpolation='bicubic',
  antialias=True, align_corners=None), not exporting."""
  functional = torch.nn.functional
  num_new_tokens = new_size[0] * new_size[1] + num_prefix_tokens
  if num_new_tokens == posemb.shape[1] and tuple(old_size) == tuple(new_size):
    return posemb
  prefix, posemb = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
  embed_dim, orig_dtype = posemb.shape[-1], posemb.dtype
  posemb = posemb.float().reshape(1, old_size[0], old_size[1], -1).permute(0, 3, 1, 2)
  posemb = functional.interpolate(posemb, size=new_size, mode="bicubic", align_corners=None,
                                  antialias=True)
  posemb = posemb.permute(0, 2, 3, 1).reshape(1, -1, embed_dim).to(orig_dtype)
  return torch.cat([prefix, posemb], dim=1)


def timm_attention_pool2d(torch, sd, x, *, num_heads, feat_size, pool_type):
  """timm 1.0.31 timm/layers/attention_pool2d.py AttentionPool2d.forward (eval, fused_attn)."""
  functional = torch.nn.functional
  batch, _, h, w = x.shape
  n = h * w
  x = x.flatten(2).transpose(1, 2)
  if "cls_token" in sd:
    x = torch.cat([sd["cls_token"].expand(x.shape[0], -1, -1), x], dim=1)
  else:
    x = torch.cat([x.mean(1, keepdim=True), x], dim=1)
  x = x + timm_resample_abs_pos_embed(torch, sd["pos_embed"].unsqueeze(0), (h, w), feat_size)
  if "qkv.weight" in sd:
    embed_dim = sd["qkv.weight"].shape[0] // 3
    head_dim = embed_dim // num_heads
    x = functional.linear(x, sd["qkv.weight"], sd.get("qkv.bias"))
    q, k, v = x.reshape(batch, -1, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
  else:
    embed_dim = sd["q.weight"].shape[0]
    head_dim = embed_dim // num_heads
    q, k, v = (functional.linear(x, sd[f"{name}.weight"], sd.get(f"{name}.bias"))
               .reshape(batch, n + 1, num_heads, head_dim).transpose(1, 2) for name in "qkv")
  x = functional.scaled_dot_product_attention(q, k, v)
  x = x.transpose(1, 2).reshape(batch, n + 1, -1)
  if "proj.weight" in sd:  # out_features=0 makes proj an nn.Identity
    x = functional.linear(x, sd["proj.weight"], sd["proj.bias"])
  if pool_type == "token":
    return x[:, 0]
  return x[:, 1:].reshape(batch, h, w, -1).permute(0, 3, 1, 2)


def open_clip_attention_pool2d(torch, sd, x, *, num_heads):
  """open_clip 3.3.0 open_clip/modified_resnet.py AttentionPool2d.forward (eval)."""
  functional = torch.nn.functional
  x = x.reshape(x.shape[0], x.shape[1], x.shape[2] * x.shape[3]).permute(2, 0, 1)  # (HW)NC
  x = torch.cat([x.mean(dim=0, keepdim=True), x], dim=0)  # (HW+1)NC
  x = x + sd["positional_embedding"][:, None, :].to(x.dtype)
  x, _ = functional.multi_head_attention_forward(
      query=x, key=x, value=x, embed_dim_to_check=x.shape[-1], num_heads=num_heads,
      q_proj_weight=sd["q_proj.weight"], k_proj_weight=sd["k_proj.weight"],
      v_proj_weight=sd["v_proj.weight"], in_proj_weight=None,
      in_proj_bias=torch.cat([sd["q_proj.bias"], sd["k_proj.bias"], sd["v_proj.bias"]]),
      bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0,
      out_proj_weight=sd["c_proj.weight"], out_proj_bias=sd["c_proj.bias"],
      use_separate_proj_weight=True, training=False, need_weights=False)
  return x[0]


def timm_attention_pool_latent(torch, sd, x, *, num_heads, pool_type):
  """timm 1.0.31 timm/layers/attention_pool.py AttentionPoolLatent.forward (eval, fused_attn), as
  vision_transformer.py builds it: norm_layer timm LayerNorm (eps 1e-6), act_layer nn.GELU.
  Without norm.* keys, timm's default norm_layer=None: self.norm is nn.Identity and the q/k
  norms are nn.LayerNorm (``qk_norm_layer = norm_layer or nn.LayerNorm``, eps 1e-5)."""
  functional = torch.nn.functional
  batch, n, c = x.shape
  latent_len, embed_dim = sd["latent"].shape[1:]
  head_dim = embed_dim // num_heads
  q = functional.linear(sd["latent"].expand(batch, -1, -1), sd["q.weight"], sd.get("q.bias"))
  q = q.reshape(batch, latent_len, num_heads, head_dim).transpose(1, 2)
  kv = functional.linear(x, sd["kv.weight"], sd.get("kv.bias"))
  k, v = kv.reshape(batch, n, 2, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
  eps = 1e-6 if "norm.weight" in sd else 1e-5
  if "q_norm.weight" in sd:
    q = functional.layer_norm(q, (head_dim,), sd["q_norm.weight"], sd["q_norm.bias"], eps)
    k = functional.layer_norm(k, (head_dim,), sd["k_norm.weight"], sd["k_norm.bias"], eps)
  x = functional.scaled_dot_product_attention(q, k, v)
  x = x.transpose(1, 2).reshape(batch, latent_len, c)
  x = functional.linear(x, sd["proj.weight"], sd["proj.bias"])
  normed = (functional.layer_norm(x, (x.shape[-1],), sd["norm.weight"], sd["norm.bias"], 1e-6)
            if "norm.weight" in sd else x)
  hidden = functional.gelu(functional.linear(normed, sd["mlp.fc1.weight"], sd["mlp.fc1.bias"]))
  x = x + functional.linear(hidden, sd["mlp.fc2.weight"], sd["mlp.fc2.bias"])
  if pool_type == "token":
    return x[:, 0]
  if pool_type == "avg":
    return x.mean(1)
  return x


# ----------------------------------------------------------------------------
# Float64 NumPy statements of the heads (no torch needed).
# ----------------------------------------------------------------------------


def np_attend(q, k, v):
  """(..., Lq, heads, d), (..., L, heads, d) -> (..., Lq, heads, d), softmax(q k^T / sqrt d) v."""
  logits = np.einsum("...qhd,...khd->...hqk", q, k) / math.sqrt(q.shape[-1])
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("...hqk,...khd->...qhd", weights, v)


def np_linear(x, sd, name):
  y = x @ sd[f"{name}.weight"].astype(np.float64).T
  return y + sd[f"{name}.bias"] if f"{name}.bias" in sd else y


def np_layer_norm(x, weight, bias, eps=1e-6):
  centred = x - x.mean(-1, keepdims=True)
  return centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + eps) * weight + bias


def np_attention_pool(sd, x, *, num_heads, pool_type):
  """timm's AttentionPool2d in float64, NHWC, for a map of the embedding's own size."""
  n, h, w, c = x.shape
  tokens = x.reshape(n, h * w, c).astype(np.float64)
  first = (np.broadcast_to(sd["cls_token"], (n, 1, c)) if "cls_token" in sd
           else tokens.mean(1, keepdims=True))
  seq = np.concatenate([first, tokens], axis=1) + sd["pos_embed"]
  if "qkv.weight" in sd:
    q, k, v = np.split(np_linear(seq, sd, "qkv"), 3, axis=-1)
  else:
    q, k, v = (np_linear(seq, sd, name) for name in "qkv")
  split = lambda a: a.reshape(*a.shape[:-1], num_heads, -1)  # noqa: E731
  out = np_attend(split(q), split(k), split(v)).reshape(n, h * w + 1, -1)
  if "proj.weight" in sd:
    out = np_linear(out, sd, "proj")
  return out[:, 0] if pool_type == "token" else out[:, 1:].reshape(n, h, w, -1)


def np_attention_pool_latent(sd, x, *, num_heads, pool_type):
  """timm's AttentionPoolLatent (a ViT's, or without norm.* timm's default) in float64."""
  x = x.astype(np.float64)
  n, length, _ = x.shape
  q = np_linear(sd["latent"][0].astype(np.float64), sd, "q")
  q = q.reshape(q.shape[0], num_heads, -1)
  k, v = np.split(np_linear(x, sd, "kv"), 2, axis=-1)
  k, v = k.reshape(n, length, num_heads, -1), v.reshape(n, length, num_heads, -1)
  eps = 1e-6 if "norm.weight" in sd else 1e-5
  if "q_norm.weight" in sd:
    q = np_layer_norm(q, sd["q_norm.weight"], sd["q_norm.bias"], eps)
    k = np_layer_norm(k, sd["k_norm.weight"], sd["k_norm.bias"], eps)
  out = np_attend(np.broadcast_to(q, (n, *q.shape)), k, v)
  out = np_linear(out.reshape(n, q.shape[0], -1), sd, "proj")
  normed = (np_layer_norm(out, sd["norm.weight"], sd["norm.bias"]) if "norm.weight" in sd
            else out)
  hidden = np_linear(normed, sd, "mlp.fc1")
  hidden = 0.5 * hidden * (1 + np.vectorize(math.erf)(hidden / math.sqrt(2)))  # exact GELU
  out = out + np_linear(hidden, sd, "mlp.fc2")
  return {"token": out[:, 0], "avg": out.mean(1), "": out}[pool_type]


# ----------------------------------------------------------------------------
# The cases: a state dict, the constructor's options, the input.
# ----------------------------------------------------------------------------

_C = 8  # channels; 2 heads of 4


def _pool_state(seed, *, separate=False, bias=True, out=6, cls=False, embed=_C, tokens=10):
  shapes = {}
  if separate:
    for name in "qkv":
      shapes |= linear_keys(name, embed, _C, bias)
  else:
    shapes |= linear_keys("qkv", 3 * embed, _C, bias)
  if out:
    shapes |= linear_keys("proj", out, embed)
  shapes["pos_embed"] = (tokens, _C)
  if cls:
    shapes["cls_token"] = (1, embed)
  return distinct(shapes, seed)


# name: (state dict, AttentionPool.from_torch options, input shape NHWC, peer)
_POOL_CASES = {
    "timm separate q/k/v, class token, map": (
        _pool_state(1, separate=True, cls=True, out=5), dict(pool_type=""), (2, 3, 3, _C),
        "timm"),
    "timm no qkv bias, out_features=0, map resized 3x3 to 2x4": (
        _pool_state(2, bias=False, out=0), dict(pool_type=""), (2, 2, 4, _C), "timm"),
    "timm fused qkv, embed_dim 12, mean token, map resized 3x3 to 4x5, token": (
        _pool_state(3, embed=12), dict(pool_type="token"), (2, 4, 5, _C), "timm"),
    "open_clip ModifiedResNet keys": (
        distinct({**linear_keys("q_proj", _C, _C), **linear_keys("k_proj", _C, _C),
                  **linear_keys("v_proj", _C, _C), **linear_keys("c_proj", 6, _C),
                  "positional_embedding": (10, _C)}, 4), {}, (2, 3, 3, _C), "open_clip"),
}


def _latent_state(seed, *, bias=True, qk_norm=False, latent_len=1, out=_C, hidden=4 * _C,
                  norm=True):
  shapes = {"latent": (1, latent_len, _C), **linear_keys("q", _C, _C, bias),
            **linear_keys("kv", 2 * _C, _C, bias)}
  if qk_norm:
    shapes |= {"q_norm.weight": (4,), "q_norm.bias": (4,), "k_norm.weight": (4,),
               "k_norm.bias": (4,)}
  shapes |= {**linear_keys("proj", out, _C), **linear_keys("mlp.fc1", hidden, out),
             **linear_keys("mlp.fc2", out, hidden)}
  shapes |= {"norm.weight": (out,), "norm.bias": (out,)} if norm else {}
  return distinct(shapes, seed)


_LATENT_CASES = {
    "ViT MAP head, token": (_latent_state(5), dict(pool_type="token"), (2, 5, _C)),
    "qk_norm, no biases, 3 latents, out 6, mlp_ratio 15/6, avg": (
        _latent_state(6, bias=False, qk_norm=True, latent_len=3, out=6, hidden=15),
        dict(pool_type="avg"), (2, 5, _C)),
    # Issue 30: timm's own default, norm_layer=None (no norm.*), was refused.
    "timm's default (no norm), qk_norm (eps 1e-5), token": (
        _latent_state(7, qk_norm=True, norm=False), dict(pool_type="token"), (2, 5, _C)),
}

# PyTorch key -> NNX path: open_clip's layer names are ours renamed.
_RENAME = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "c_proj": "proj",
           "positional_embedding": "pos_embed"}


def our_path(key: str, ndim: int) -> tuple[str, bool]:
  """The NNX path of a PyTorch key, and whether the value is transposed (a Linear weight)."""
  *layer, leaf = key.split(".")
  if not layer:
    return _RENAME.get(leaf, leaf), False
  layer = ".".join(_RENAME.get(part, part) for part in layer)
  if leaf == "weight":
    return (f"{layer}.kernel", True) if ndim == 2 else (f"{layer}.scale", False)
  return f"{layer}.bias", False


def flat(tree) -> dict[str, np.ndarray]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {".".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)):
          np.asarray(leaf) for path, leaf in leaves}


@nnx.jit
def apply(module, x):
  return module(x)


@nnx.jit
def apply_both(a, b, xa, xb):
  """``a(xa)`` and ``b(xb)`` in one compiled program (each program has a set-up cost)."""
  return a(xa), b(xb)


def theirs_with_gradients(torch, forward, sd, x, cotangent):
  tensors = {k: torch.tensor(v, requires_grad=True) for k, v in sd.items()}
  x_t = torch.tensor(np.ascontiguousarray(x), requires_grad=True)
  out = forward(torch, tensors, x_t)
  (out * torch.tensor(cotangent)).sum().backward()
  return (out.detach().numpy(), {k: t.grad.numpy() for k, t in tensors.items()},
          x_t.grad.numpy())


# The largest errors measured by the parity tests (read by the report; asserted below _TOL).
LARGEST_ERRORS: dict[str, float] = {}


def check_parity(case, sd, x, torch_forward, numpy_forward, *, nchw: bool):
  """Values and the gradients of the input and every parameter, ours against PyTorch's.

  Ours are compiled once for every case (_ours_with_gradients); their values are first
  compared with the float64 NumPy statement (``numpy_forward``, None for a resampled map),
  which needs no torch.
  """
  ours, our_grads, our_x_grad, cotangent = _ours_with_gradients()[case]
  if numpy_forward is not None:
    np.testing.assert_allclose(ours, numpy_forward(x), rtol=_TOL, atol=_TOL,
                               err_msg=f"{case}: float64 NumPy")
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  to_peer = (lambda a: np.moveaxis(a, -1, 1)) if nchw else (lambda a: a)
  # A map output is (N, H, W, out) here, (N, out, H, W) for the peer.
  cotangent_t = to_peer(cotangent) if nchw and cotangent.ndim == 4 else cotangent
  theirs, their_grads, their_x_grad = theirs_with_gradients(
      torch, torch_forward, sd, to_peer(x), np.ascontiguousarray(cotangent_t))
  if nchw:
    their_x_grad = np.moveaxis(their_x_grad, 1, -1)
    if theirs.ndim == 4:
      theirs = np.moveaxis(theirs, 1, -1)
  errors = {"value": np.abs(ours - theirs).max(),
            "input gradient": np.abs(our_x_grad - their_x_grad).max()}
  np.testing.assert_allclose(ours, theirs, rtol=_TOL, atol=_TOL, err_msg=f"{case}: value")
  np.testing.assert_allclose(our_x_grad, their_x_grad, rtol=_TOL, atol=_TOL,
                             err_msg=f"{case}: input gradient")
  fused = sum(key.startswith("qkv.") for key in their_grads)  # each is three of ours
  assert len(our_grads) == len(their_grads) + 2 * fused, (sorted(our_grads), sorted(their_grads))
  for key, their_grad in their_grads.items():
    if key.startswith("qkv."):  # timm's fused projection, held as q, k and v (rows in order)
      leaf = "kernel" if key.endswith("weight") else "bias"
      our_grad = np.concatenate([our_grads[f"{name}.{leaf}"] for name in "qkv"], axis=-1)
      our_grad = our_grad.T if key.endswith("weight") else our_grad
    else:
      path, transposed = our_path(key, their_grad.ndim)
      our_grad = our_grads[path].T if transposed else our_grads[path]
    errors[key] = np.abs(our_grad - their_grad).max()
    np.testing.assert_allclose(our_grad, their_grad, rtol=_TOL, atol=_TOL,
                               err_msg=f"{case}: gradient of {key}")
  LARGEST_ERRORS[case] = errors


# ----------------------------------------------------------------------------
# The position embedding's resampling.
# ----------------------------------------------------------------------------


def test_resample_weights_hand_computed():
  # PyTorch's antialiased bicubic (aten/src/ATen/native/cpu/UpSampleKernel.cpp,
  # _compute_indices_min_size_weights_aa with Keys' a = -0.5), by hand. Keys' kernel:
  # k(0.25) = 111/128, k(0.75) = 29/128, k(1.25) = -9/128.
  # 2 -> 4 (scale 1/2, support 2): output i is centred at (i + 0.5) / 2 in input cells, at
  # distances 0.25 and 1.25 (i = 0), 0.25 and 0.75 (i = 1) from the two cell centres, so
  # the weights are (111, -9) / 102 and (111, 29) / 140, and their mirrors.
  up = np.array([[111 / 102, -9 / 102], [111 / 140, 29 / 140], [29 / 140, 111 / 140],
                 [-9 / 102, 111 / 102]])
  np.testing.assert_allclose(antialiased_bicubic_weights(2, 4), up, rtol=2e-7)
  # 4 -> 2 (scale 2): the kernel is stretched 2x, so the four cell centres at distances
  # 0.5, 0.5, 1.5, 2.5 from output 0's centre (1) weigh k(0.25), k(0.25), k(0.75),
  # k(1.25), normalised by their sum 242/128.
  down = np.array([[111, 111, 29, -9], [-9, 29, 111, 111]]) / 242
  np.testing.assert_allclose(antialiased_bicubic_weights(4, 2), down, rtol=2e-7)


def test_resample_same_size_is_unchanged_and_keeps_the_prefix_token():
  # timm's early return for the same size; the first token is never resampled.
  pos = jnp.asarray(np.arange(20.0, dtype=np.float32).reshape(10, 2))  # placed, not computed
  assert resample_pos_embed(pos, (3, 3), (3, 3)) is pos
  # Results as NumPy arrays: slicing a jax.Array compiles a program per shape.
  resized = np.asarray(jax.jit(resample_pos_embed, static_argnums=(1, 2))(pos, (3, 3), (2, 4)))
  assert resized.shape == (9, 2)
  np.testing.assert_array_equal(resized[0], [0.0, 1.0])
  # A constant grid stays constant (the weights of each output sum to 1).
  ones = np.concatenate([np.zeros((1, 2)), np.full((49, 2), 1.5)]).astype(np.float32)
  resized = np.asarray(jax.jit(resample_pos_embed, static_argnums=(1, 2))(ones, (7, 7), (5, 9)))
  np.testing.assert_allclose(resized[1:], 1.5, rtol=1e-6)


@pytest.mark.parametrize("new_size", [(5, 5), (9, 11), (14, 14)])
def test_resample_matches_timm_resample_abs_pos_embed(new_size):
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  pos = np.random.default_rng(11).standard_normal((50, 6)).astype(np.float32)
  theirs = timm_resample_abs_pos_embed(torch, torch.tensor(pos)[None], new_size, (7, 7))[0]
  ours = jax.jit(resample_pos_embed, static_argnums=(1, 2))(pos, (7, 7), new_size)
  # Measured: at most 2.4e-7 (the sums' order; the weights themselves are PyTorch's exactly).
  np.testing.assert_allclose(ours, theirs.numpy(), rtol=0, atol=1e-6)
  # The weights: PyTorch's resize of one-hot rows gives each weight alone.
  for n_in, n_out in ((7, new_size[0]), (7, new_size[1])):
    eye = torch.eye(n_in)[:, None, None, :]
    peer = torch.nn.functional.interpolate(eye, size=(1, n_out), mode="bicubic",
                                           antialias=True, align_corners=False)
    np.testing.assert_array_equal(antialiased_bicubic_weights(n_in, n_out),
                                  peer[:, 0, 0, :].numpy().T)


# ----------------------------------------------------------------------------
# Hand-computed heads.
# ----------------------------------------------------------------------------


def _uniform_pool(pool_type):
  # Zero q and k rows: every logit is 0, so each query attends uniformly (1/4 each).
  # v = (x + pos) diag(1, 2) + (1, -1); proj (in, out) [[1, 0, 1], [0, 1, 1]] + (0, 0, 0.5).
  sd = {"qkv.weight": np.array([[0, 0]] * 4 + [[1, 0], [0, 2]], np.float32),
        "qkv.bias": np.array([0, 0, 0, 0, 1, -1], np.float32),
        "proj.weight": np.array([[1, 0], [0, 1], [1, 1]], np.float32),
        "proj.bias": np.array([0, 0, 0.5], np.float32),
        "pos_embed": np.array([[0, 0], [1, 0], [0, 1], [-1, -1]], np.float32)}
  return AttentionPool.from_torch(sd, num_heads=2, feat_size=(1, 3), pool_type=pool_type)


def test_attention_pool_uniform_attention_by_hand():
  # Cells (1, 2), (3, -2), (5, 6): mean token (3, 2). The 4 tokens plus pos sum to 4 * (3, 2)
  # (the pos rows sum to 0), so every output is the mean v: (3, 2) diag(1, 2) + (1, -1) =
  # (4, 3), projected: (4, 3, 4 + 3 + 0.5).
  x = np.array([[[[1.0, 2.0], [3.0, -2.0], [5.0, 6.0]]]], np.float32)  # (1, 1, 3, 2)
  token, grid = apply_both(_uniform_pool("token"), _uniform_pool(""), x, x)
  np.testing.assert_array_equal(token, [[4.0, 3.0, 7.5]])
  np.testing.assert_array_equal(grid, np.full((1, 1, 3, 3), [4, 3, 7.5]))


def test_attention_pool_latent_uniform_attention_by_hand():
  # Zero q: uniform attention over the 4 tokens, mean (2, 2). v = x diag(1, 2) + (1, -1), mean
  # (3, 3); proj [[1, 1], [0, 1]] (PyTorch's (out, in)) + (0, 1): (6, 4). A zero fc2 makes the
  # MLP its bias (0.5, -0.5): (6.5, 3.5), the same for both latents.
  sd = {"latent": np.ones((1, 2, 2), np.float32), "q.weight": np.zeros((2, 2), np.float32),
        "q.bias": np.zeros(2, np.float32),
        "kv.weight": np.array([[0, 0], [0, 0], [1, 0], [0, 2]], np.float32),
        "kv.bias": np.array([0, 0, 1, -1], np.float32),
        "proj.weight": np.array([[1, 1], [0, 1]], np.float32),
        "proj.bias": np.array([0, 1], np.float32),
        "norm.weight": np.ones(2, np.float32), "norm.bias": np.zeros(2, np.float32),
        "mlp.fc1.weight": np.ones((8, 2), np.float32), "mlp.fc1.bias": np.zeros(8, np.float32),
        "mlp.fc2.weight": np.zeros((2, 8), np.float32),
        "mlp.fc2.bias": np.array([0.5, -0.5], np.float32)}
  x = np.array([[[1.0, 2.0], [3.0, -2.0], [5.0, 6.0], [-1.0, 2.0]]], np.float32)
  head = AttentionPoolLatent.from_torch(sd, num_heads=1, pool_type="")  # every latent
  np.testing.assert_array_equal(apply(head, x), [[[6.5, 3.5], [6.5, 3.5]]])


# ----------------------------------------------------------------------------
# Parity: PyTorch (values and gradients) and float64 NumPy (values).
# ----------------------------------------------------------------------------


def _timm_keys(sd):
  """open_clip's keys as timm's separate q/k/v (for the NumPy statement)."""
  def rename(key):
    layer, _, leaf = key.partition(".")
    return f"{_RENAME.get(layer, layer)}.{leaf}" if leaf else _RENAME.get(key, key)
  return {rename(k): v for k, v in sd.items()}


def _parity_case(case):
  """The module of a parity case and its input (uniform(-1, 1), seed 21 for AttentionPool's
  cases, 22 for AttentionPoolLatent's)."""
  if case in _POOL_CASES:
    sd, options, shape, _ = _POOL_CASES[case]
    module, seed = AttentionPool.from_torch(sd, num_heads=2, **options), 21
  else:
    sd, options, shape = _LATENT_CASES[case]
    module, seed = AttentionPoolLatent.from_torch(sd, num_heads=2, **options), 22
  return module, np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


@functools.cache
def _ours_with_gradients() -> dict[str, tuple]:
  """Every parity case: our output, the gradients of sum(output * cotangent) by parameter
  path and for the input, and the cotangent (uniform(-1, 1), seed 99), from one compiled
  program for all seven (the backend compile alone, jax.jit(...).lower(...) and then
  .compile() timed with time.process_time on 2 cores: 5.8-6.0 s of CPU in a program each,
  5.5 s in one)."""
  cases = [*_POOL_CASES, *_LATENT_CASES]
  graphdefs, params, xs, cotangents = [], [], [], []
  for case in cases:
    module, x = _parity_case(case)
    graphdef, state = nnx.split(module)
    shape = jax.eval_shape(module, x).shape
    graphdefs.append(graphdef)
    params.append(state)
    xs.append(x)
    cotangents.append(np.random.default_rng(99).uniform(-1, 1, shape).astype(np.float32))

  @jax.jit
  def run(params, xs, cotangents):
    out = []
    for graphdef, state, x, cotangent in zip(graphdefs, params, xs, cotangents, strict=True):
      def loss(state, x, graphdef=graphdef, cotangent=cotangent):
        y = nnx.merge(graphdef, state)(x)
        return jnp.sum(y * cotangent), y
      (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(state, x)
      out.append((y, grads))
    return out

  results = jax.device_get(run(params, xs, cotangents))
  return {case: (np.asarray(y), flat(param_grads), np.asarray(x_grad), cotangent)
          for case, (y, (param_grads, x_grad)), cotangent in zip(cases, results, cotangents,
                                                                  strict=True)}


@pytest.mark.parametrize("case", list(_POOL_CASES))
def test_attention_pool_matches_pytorch_and_numpy(case):
  sd, options, shape, peer = _POOL_CASES[case]
  _, x = _parity_case(case)
  pool_type = options.get("pool_type", "token")

  def forward(torch, tensors, x):
    if peer == "open_clip":
      return open_clip_attention_pool2d(torch, tensors, x, num_heads=2)
    return timm_attention_pool2d(torch, tensors, x, num_heads=2, feat_size=(3, 3),
                                 pool_type=pool_type)

  numpy_forward = None if shape[1:3] != (3, 3) else (  # a resized map: PyTorch's alone
      lambda x: np_attention_pool(_timm_keys(sd), x, num_heads=2, pool_type=pool_type))
  check_parity(case, sd, x, forward, numpy_forward, nchw=True)


@pytest.mark.parametrize("case", list(_LATENT_CASES))
def test_attention_pool_latent_matches_pytorch_and_numpy(case):
  sd, options, _ = _LATENT_CASES[case]
  _, x = _parity_case(case)

  def forward(torch, tensors, x):
    return timm_attention_pool_latent(torch, tensors, x, num_heads=2,
                                      pool_type=options["pool_type"])

  check_parity(case, sd, x, forward,
               lambda x: np_attention_pool_latent(sd, x, num_heads=2,
                                                  pool_type=options["pool_type"]),
               nchw=False)


# ----------------------------------------------------------------------------
# timm's pre_logits and reset (AttentionPool2d.forward(x, pre_logits=True), .reset).
# ----------------------------------------------------------------------------


def _without_proj(sd):
  return {k: v for k, v in sd.items() if not k.startswith("proj.")}


@pytest.mark.parametrize("case", ["timm separate q/k/v, class token, map",
                                  "open_clip ModifiedResNet keys"])
def test_pre_logits_is_the_input_of_the_projection(case):
  # timm 1.0.31 returns the pooled tokens before self.proj; so is the float64 NumPy statement
  # without proj.*, and PyTorch's re-statement of timm's forward without proj.* when torch is
  # here. The projection of those features is the ordinary output.
  sd, options, shape, _ = _POOL_CASES[case]
  head = AttentionPool.from_torch(sd, num_heads=2, **options)
  x = np.random.default_rng(23).uniform(-1, 1, shape).astype(np.float32)
  pool_type = options.get("pool_type", "token")
  features, logits = features_and_logits(head, x)
  timm_sd = _timm_keys(sd)
  want = np_attention_pool(_without_proj(timm_sd), x, num_heads=2, pool_type=pool_type)
  assert features.shape == want.shape == (*shape[:1], *(shape[1:3] if pool_type == "" else ()),
                                          head.embed_dim)
  np.testing.assert_allclose(features, want, rtol=_TOL, atol=_TOL)
  np.testing.assert_allclose(logits, np_linear(want, timm_sd, "proj"), rtol=_TOL, atol=_TOL)
  assert head.proj is not None  # kept for the next call without pre_logits
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  theirs = timm_attention_pool2d(
      torch, {k: torch.from_numpy(v) for k, v in _without_proj(timm_sd).items()},
      torch.from_numpy(np.moveaxis(x, -1, 1).copy()), num_heads=2, feat_size=(3, 3),
      pool_type=pool_type).numpy()
  theirs = np.moveaxis(theirs, 1, -1) if theirs.ndim == 4 else theirs  # PyTorch 2.13 CPU
  np.testing.assert_allclose(features, theirs, rtol=_TOL, atol=_TOL)


@nnx.jit
def features_and_logits(module, x):
  """``module(x, pre_logits=True)`` and ``module(x)``, one compiled program (called eagerly,
  each operation compiles alone: the reset test took 2.0 s so, see its commit)."""
  return module(x, pre_logits=True), module(x)


def _leaves(module) -> dict[str, np.ndarray]:
  """Every parameter of ``module`` by its path, as NumPy arrays."""
  return flat(nnx.to_pure_dict(nnx.state(module)))


def test_reset_gives_a_new_projection_and_keeps_every_other_weight_bit_for_bit():
  # The map head of test_pre_logits_is_the_input_of_the_projection, so that the first call
  # shares its program; the last reset turns it into a token head.
  sd, options, shape, _ = _POOL_CASES["timm separate q/k/v, class token, map"]
  head = AttentionPool.from_torch(sd, num_heads=2, **options)
  assert head.pool_type == ""
  x = np.random.default_rng(24).uniform(-1, 1, shape).astype(np.float32)
  before = _leaves(head)
  features, _ = features_and_logits(head, x)

  head.reset(10, rngs=nnx.Rngs(3))
  after = _leaves(head)
  kept = {k for k in before if not k.startswith("proj.")}
  assert kept == {k for k in after if not k.startswith("proj.")}
  assert {"q.kernel", "k.bias", "v.kernel", "pos_embed", "cls_token"} <= kept
  for key in kept:
    np.testing.assert_array_equal(after[key], before[key], err_msg=key, strict=True)
  assert head.out_features == 10 and after["proj.kernel"].shape == (_C, 10)
  # Initialised as the constructor's proj: a Flax Linear from those streams.
  fresh = nnx.Linear(_C, 10, rngs=nnx.Rngs(3))
  np.testing.assert_array_equal(after["proj.kernel"], fresh.kernel[...])
  kept_features, logits = features_and_logits(head, x)
  np.testing.assert_array_equal(kept_features, features)  # the rest unchanged
  np.testing.assert_allclose(
      logits, np.asarray(features) @ after["proj.kernel"] + after["proj.bias"], rtol=1e-6,
      atol=1e-6)

  head.reset(0, pool_type="token")  # no projection: the features themselves, of the token
  assert head.proj is None and head.out_features == _C and head.pool_type == "token"
  token_features, output = features_and_logits(head, x)
  np.testing.assert_array_equal(output, token_features)
  assert output.shape == (shape[0], _C)


@pytest.mark.parametrize("call, error, message", [
    (lambda h: h.reset(10), TypeError,
     "AttentionPool.reset(10) builds a new projection, which needs `rngs`; got None. Pass "
     "rngs=nnx.Rngs(0) (any seed), or num_classes=0 for no projection."),
    (lambda h: h.reset(10, pool_type=""), TypeError,  # the pool type is not set either
     "AttentionPool.reset(10) builds a new projection, which needs `rngs`"),
    (lambda h: h.reset(-1, rngs=nnx.Rngs(0)), ValueError,
     "`num_classes` must be None, 0 (no output projection) or a positive int; got -1."),
    (lambda h: h.reset(pool_type="avg"), ValueError, "`pool_type` must be one of 'token' ("),
    (lambda h: h(np.ones((1, 3, 3, _C), np.float32), pre_logits=1), TypeError,
     "`pre_logits` must be a bool; got 1."),
])
def test_reset_and_pre_logits_refuse(call, error, message):
  # Loaded, not initialised: no random program to compile.
  head = AttentionPool.from_torch(_POOL_CASES["open_clip ModifiedResNet keys"][0], num_heads=2)
  with pytest.raises(error) as info:
    call(head)
  assert str(info.value).startswith(message)
  assert head.proj is not None and head.out_features == 6  # nothing changed
  assert head.pool_type == "token"


# ----------------------------------------------------------------------------
# Layout, batching, transforms and dtypes.
# ----------------------------------------------------------------------------


@nnx.jit
def batchings(pool, head, pool_x, head_x):
  """Each module on its ``(A, B, ...)`` input: merged to ``(A * B, ...)``, ``x[0, 0]`` alone,
  vmapped, and (AttentionPool) as given, with two batch axes; both modules in one program
  (one each: 1.69 s of compile CPU, compile census)."""
  def each(module, x):
    merged = module(x.reshape(-1, *x.shape[2:]))
    several = module(x) if isinstance(module, AttentionPool) else None
    return merged, module(x[0, 0]), jax.vmap(module)(x), several

  return each(pool, pool_x), each(head, head_x)


def test_batch_axes_unbatched_and_vmap():
  x = np.random.default_rng(3).uniform(-1, 1, (2, 3, 3, 3, _C)).astype(np.float32)
  sd, options, _, _ = _POOL_CASES["open_clip ModifiedResNet keys"]
  pool = AttentionPool.from_torch(sd, num_heads=2, **options)
  head = AttentionPoolLatent.from_torch(_LATENT_CASES["ViT MAP head, token"][0], num_heads=2)
  # As NumPy arrays: slicing a jax.Array compiles a program per shape.
  results = jax.device_get(batchings(pool, head, x, x.reshape(2, 3, 9, _C)))
  for name, (merged, single, vmapped, several) in zip(("AttentionPool", "AttentionPoolLatent"),
                                                      results, strict=True):
    np.testing.assert_allclose(single, merged[0], rtol=1e-6, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(vmapped.reshape(merged.shape), merged, rtol=1e-6, atol=1e-6,
                               err_msg=name)
    if several is not None:  # the latent head takes (N, L, C) or (L, C): see test_inputs_refused
      np.testing.assert_array_equal(several.reshape(merged.shape), merged)


def _np_bf16(x):
  """``x`` rounded to bfloat16 values, held in float32 (by NumPy: jnp compiles per shape)."""
  return np.asarray(x, np.float32).astype(jnp.bfloat16).astype(np.float32)


_HEAD_DTYPES = [None, jnp.bfloat16]


@functools.cache
def _bfloat16_heads():
  """The open_clip head and the ViT MAP head on bfloat16 inputs, with each dtype of
  _HEAD_DTYPES: the inputs' bfloat16 values (held in float32) and the four outputs, from one
  compiled program (a program per dtype: 1.31 s of compile CPU, compile census)."""
  rng = np.random.default_rng(8)
  sd, options, shape, _ = _POOL_CASES["open_clip ModifiedResNet keys"]
  x = _np_bf16(rng.uniform(-1, 1, shape))
  latent_sd, latent_options, latent_shape = _LATENT_CASES["ViT MAP head, token"]
  latent_x = _np_bf16(rng.uniform(-1, 1, latent_shape))
  heads = [(AttentionPool.from_torch(sd, num_heads=2, dtype=dtype, **options),
            AttentionPoolLatent.from_torch(latent_sd, num_heads=2, dtype=dtype, **latent_options))
           for dtype in _HEAD_DTYPES]
  outputs = nnx.jit(lambda heads, x, latent_x: [(pool(x), head(latent_x)) for pool, head in heads])(
      heads, x.astype(jnp.bfloat16), latent_x.astype(jnp.bfloat16))
  return x, latent_x, dict(zip(_HEAD_DTYPES, jax.device_get(outputs), strict=True))


@pytest.mark.parametrize("dtype", _HEAD_DTYPES)
def test_bfloat16_input_keeps_its_dtype(dtype):
  # The same heads on a bfloat16 input (computed in float32 by default, in bfloat16 with
  # dtype=bfloat16) against float64 NumPy on the same (bfloat16) input values; bfloat16
  # keeps 8 significant bits, so 2**-8 relative per rounding.
  x, latent_x, outputs = _bfloat16_heads()
  out, latent_out = outputs[dtype]
  sd = _POOL_CASES["open_clip ModifiedResNet keys"][0]
  latent_sd = _LATENT_CASES["ViT MAP head, token"][0]
  assert out.dtype == jnp.bfloat16
  expected = np_attention_pool(_timm_keys(sd), x, num_heads=2, pool_type="token")
  tol = 2e-2 if dtype else 8e-3
  np.testing.assert_allclose(out.astype(np.float32), expected, rtol=tol, atol=tol)

  assert latent_out.dtype == jnp.bfloat16
  expected = np_attention_pool_latent(latent_sd, latent_x, num_heads=2, pool_type="token")
  np.testing.assert_allclose(latent_out.astype(np.float32), expected, rtol=4 * tol,
                             atol=4 * tol)


def test_attend_softmax_and_sums_in_float32_for_bfloat16():
  # 512 keys: a bfloat16 softmax or sum (8 significant bits) would be off by far more than
  # the one rounding of each probability and of the result that float32 work leaves.
  rng = np.random.default_rng(9)
  q, k, v = (_np_bf16(rng.uniform(-1, 1, s)) for s in ((2, 1, 2, 4), (2, 512, 2, 4),
                                                       (2, 512, 2, 4)))
  out = np.asarray(jax.jit(attend)(*(a.astype(jnp.bfloat16) for a in (q, k, v))))
  assert out.dtype == jnp.bfloat16  # (NumPy's cast below: jax.Array.astype compiles)
  np.testing.assert_allclose(out.astype(np.float32), np_attend(q, k, v), rtol=0, atol=4e-3)


def shaped(cls, *args, **options):
  """``cls(*args, **options)`` with its parameters as shapes only: for checks before any compute."""
  return nnx.eval_shape(lambda: cls(*args, **options, rngs=nnx.Rngs(0)))


def test_nchw_input_is_named():
  pool = shaped(AttentionPool, 3, feat_size=8, num_heads=1)
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPool: `inputs` must be channels-last with in_features=3 on the last axis; got "
      "shape (2, 3, 8, 8). It looks channels-first (NCHW: 3 on axis 1); use "
      "jnp.moveaxis(x, 1, -1).")):
    pool(np.zeros((2, 3, 8, 8), np.float32))
  head = shaped(AttentionPoolLatent, 4, num_heads=2)
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPoolLatent: `inputs` must be channels-last with in_features=4 on the last axis; "
      "got shape (2, 4, 9). It looks channels-first (NCHW: 4 on axis 1); use "
      "jnp.moveaxis(x, 1, -1).")):
    head(np.zeros((2, 4, 9), np.float32))


# ----------------------------------------------------------------------------
# Errors.
# ----------------------------------------------------------------------------

_POOL_ERRORS = [
    (dict(num_heads=2, pool_type="avg"), ValueError,
     "`pool_type` must be one of 'token' (the first token, (N, out)), '' (the attended map "
     "without the token, (N, H, W, out)); got 'avg'."),
    (dict(num_heads=2, pool_type=None), TypeError,
     "`pool_type` must be one of 'token' (the first token, (N, out)), '' (the attended map "
     "without the token, (N, H, W, out)); got None."),
    (dict(feat_size=(7, 7, 7)), TypeError,
     "`feat_size` must be a positive int or a pair (h, w) of them; got (7, 7, 7)."),
    (dict(feat_size=0), ValueError,
     "`feat_size` must be a positive int or a pair (h, w) of them; got 0."),
    (dict(out_features=-1), ValueError,
     "`out_features` must be None, 0 (no output projection) or a positive int; got -1."),
    (dict(out_features=2.0), TypeError,
     "`out_features` must be None, 0 (no output projection) or a positive int; got 2.0."),
    (dict(num_heads=3), ValueError,
     "AttentionPool: `num_heads` must divide embed_dim=8 (each head takes embed_dim // "
     "num_heads channels); got num_heads=3. Pick a divisor of 8."),
    (dict(), ValueError,
     "AttentionPool: `head_dim` must divide embed_dim=8 (num_heads is embed_dim // head_dim); "
     "got head_dim=64. Pass num_heads=... or a head_dim that divides 8."),
    (dict(head_dim=None), ValueError,
     "AttentionPool needs `num_heads` or `head_dim`; got neither."),
    (dict(num_heads=2, qkv_separate=1), TypeError, "`qkv_separate` must be a bool; got 1."),
    (dict(num_heads=2, drop_rate=0.0), TypeError,
     "AttentionPool got an unexpected keyword argument `drop_rate`; AttentionPool takes "
     "(in_features, *, feat_size, out_features, embed_dim, head_dim, num_heads, qkv_bias, "
     "qkv_separate, pool_type, class_token, dtype, param_dtype, rngs)."),
]


@pytest.mark.parametrize(("options", "error", "message"), _POOL_ERRORS)
def test_attention_pool_refuses(options, error, message):
  with pytest.raises(error, match=f"^{re.escape(message)}$"):
    AttentionPool(_C, **options, rngs=nnx.Rngs(0))


_LATENT_ERRORS = [
    (dict(num_heads=3), ValueError,
     "AttentionPoolLatent: `num_heads` must divide embed_dim=8 (each head takes embed_dim // "
     "num_heads channels); got num_heads=3. Pick a divisor of 8."),
    (dict(num_heads=None), TypeError,
     "`num_heads` must be a positive int dividing embed_dim=8; got None."),
    (dict(mlp_ratio=0.1), ValueError,
     "`mlp_ratio` must make the MLP at least 1 wide (int(out_features * mlp_ratio) with "
     "out_features=8); got 0.1."),
    (dict(mlp_ratio=-1.0), ValueError, "`mlp_ratio` must be a positive finite number; got -1.0."),
    (dict(latent_len=0), ValueError, "`latent_len` must be a positive int; got 0."),
    (dict(pool_type="max"), ValueError,
     "`pool_type` must be one of 'token' (the first latent, (N, out)), 'avg' (the latents' "
     "mean, (N, out)), '' (every latent, (N, latent_len, out)); got 'max'."),
    (dict(qk_norm="yes"), TypeError, "`qk_norm` must be a bool; got 'yes'."),
]


@pytest.mark.parametrize(("options", "error", "message"), _LATENT_ERRORS)
def test_attention_pool_latent_refuses(options, error, message):
  with pytest.raises(error, match=f"^{re.escape(message)}$"):
    AttentionPoolLatent(_C, **options, rngs=nnx.Rngs(0))


def test_inputs_refused():
  head = shaped(AttentionPoolLatent, 4, num_heads=2)
  flatten = (
      "AttentionPoolLatent: `inputs` must be tokens (N, L, C) or unbatched (L, C); got shape "
      "(2, 3, 3, 4) (rank 4). A feature map (N, H, W, C) must be flattened to tokens first: "
      "n, h, w, c = x.shape; x.reshape(n, h * w, c). For several batch axes, merge them "
      "(x.reshape(-1, L, C)) or use jax.vmap.")
  with pytest.raises(ValueError, match=f"^{re.escape(flatten)}$"):
    head(np.zeros((2, 3, 3, 4), np.float32))
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPoolLatent: `inputs` must be tokens (N, L, C) or unbatched (L, C); got shape "
      "(4,) (rank 1).")):
    head(np.zeros(4, np.float32))
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPoolLatent: `inputs` needs at least one token to attend to; got shape (2, 0, 4).")):
    head(np.zeros((2, 0, 4), np.float32))
  with pytest.raises(TypeError, match=re.escape(
      "AttentionPoolLatent: `inputs` has dtype int32, but this pooling needs a floating dtype")):
    head(np.zeros((2, 3, 4), np.int32))
  pool = shaped(AttentionPool, 4, feat_size=2, num_heads=2)
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPool: `inputs` must be a channels-last map (N, H, W, C), (H, W, C) or "
      "(*batch, H, W, C); got shape (5, 4) (rank 2).")):
    pool(np.zeros((5, 4), np.float32))
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPool: `inputs` needs non-empty spatial dims (there is nothing to pool); got "
      "spatial shape (0, 3) in shape (1, 0, 3, 4).")):
    pool(np.zeros((1, 0, 3, 4), np.float32))


def test_from_torch_refuses():
  sd = _pool_state(0)
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPool.from_torch: `pos_embed` of shape (11, 8) holds 10 map positions, not a "
      "square number; pass feat_size=(h, w) with h * w = 10.")):
    AttentionPool.from_torch(dict(sd, pos_embed=np.zeros((11, _C), np.float32)), num_heads=2)
  pool = AttentionPool.from_torch(dict(sd, pos_embed=np.zeros((11, _C), np.float32)),
                                  num_heads=2, feat_size=(2, 5))
  assert pool.feat_size == (2, 5)
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPool.from_torch: `pos_embed` has shape (10, 8); expected (11, 8).")):
    AttentionPool.from_torch(sd, num_heads=2, feat_size=(2, 5))
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPool.from_torch: `qkv.weight` must stack q, k and v (E rows each) along its "
      "first axis, so a multiple of 3 rows; got shape (23, 8).")):
    AttentionPool.from_torch(dict(sd, **{"qkv.weight": np.zeros((23, _C), np.float32)}),
                             num_heads=2)
  with pytest.raises(TypeError, match=re.escape(
      "AttentionPool.from_torch: do not pass embed_dim, head_dim; sizes come from the weights "
      "and no initialiser runs.")):
    AttentionPool.from_torch(sd, num_heads=2, embed_dim=8, head_dim=4)
  with pytest.raises(TypeError, match=re.escape(
      "AttentionPool.from_torch: do not pass qkv_separate; it comes from the keys (qkv.* fused, "
      "or q.*, k.*, v.* separate).")):
    AttentionPool.from_torch(sd, num_heads=2, qkv_separate=True)
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPool.from_torch: unexpected state-dict keys. Expected one of: pos_embed, "
      "proj.bias, proj.weight, qkv.bias, qkv.weight; ")):
    AttentionPool.from_torch({"head." + k: v for k, v in sd.items()}, num_heads=2)
  latent = _latent_state(5)
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPoolLatent.from_torch: `num_heads` must divide embed_dim=8 (each head takes "
      "embed_dim // num_heads channels); got num_heads=3. Pick a divisor of 8.")):
    AttentionPoolLatent.from_torch(latent, num_heads=3)
  # Issue 30: a 1-D latent, or a 1-D embedding with feat_size given, raised IndexError.
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPoolLatent.from_torch: `latent` must be (1, latent_len, E); got shape (8,).")):
    AttentionPoolLatent.from_torch(dict(latent, latent=latent["latent"].reshape(-1)),
                                   num_heads=2)
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPool.from_torch: `pos_embed` must be (1 + H*W, C); got shape (80,).")):
    AttentionPool.from_torch(dict(sd, pos_embed=sd["pos_embed"].reshape(-1)), num_heads=2,
                             feat_size=(3, 3))
  with pytest.raises(ValueError, match=re.escape(
      "AttentionPoolLatent.from_torch: `kv.weight` must stack k and v (E rows each) along its "
      "first axis, so a multiple of 2 rows; got shape (15, 8).")):
    AttentionPoolLatent.from_torch(dict(latent, **{"kv.weight": np.zeros((15, _C), np.float32),
                                                   "kv.bias": np.zeros(15, np.float32)}),
                                   num_heads=2)


def test_from_torch_reads_the_sizes():
  # Each inferred argument against the state dict it comes from.
  pool = AttentionPool.from_torch(_pool_state(1, separate=True, bias=False, cls=True, out=5,
                                              embed=8), num_heads=4)
  assert (pool.in_features, pool.embed_dim, pool.out_features, pool.num_heads, pool.head_dim,
          pool.qkv_separate, pool.feat_size, pool.q.bias) == (8, 8, 5, 4, 2, True, (3, 3), None)
  assert pool.cls_token.shape == (1, 8)
  sd = _pool_state(3, embed=12, out=0)
  pool = AttentionPool.from_torch(sd, num_heads=3)
  assert (pool.embed_dim, pool.out_features, pool.head_dim, pool.proj,
          pool.qkv_separate) == (12, 12, 4, None, False)
  # The fused qkv (rows q, then k, then v) split into the three (in, out) kernels.
  for i, name in enumerate("qkv"):
    np.testing.assert_array_equal(getattr(pool, name).kernel[...],
                                  sd["qkv.weight"][12 * i:12 * (i + 1)].T)
    np.testing.assert_array_equal(getattr(pool, name).bias[...],
                                  sd["qkv.bias"][12 * i:12 * (i + 1)])
  head = AttentionPoolLatent.from_torch(
      _latent_state(6, bias=False, qk_norm=True, latent_len=3, out=6, hidden=15), num_heads=2)
  assert (head.in_features, head.embed_dim, head.out_features, head.latent_len,
          head.mlp.fc1.kernel.shape, head.q.bias) == (8, 8, 6, 3, (6, 15), None)
  assert head.q_norm.scale.shape == (4,)
  assert (head.norm.epsilon, head.q_norm.epsilon) == (1e-6, 1e-6)  # a ViT's LayerNorm
  # timm 1.0.31's default AttentionPoolLatent(8, num_heads=2): keys kv, latent, mlp, proj, q.
  default = _latent_state(7, norm=False)
  assert sorted({key.split(".")[0] for key in default}) == ["kv", "latent", "mlp", "proj", "q"]
  head = AttentionPoolLatent.from_torch(default, num_heads=2)
  assert (head.norm, head.q_norm, head.mlp.fc1.kernel.shape) == (None, None, (8, 32))
  head = AttentionPoolLatent.from_torch(_latent_state(7, qk_norm=True, norm=False), num_heads=2)
  assert head.q_norm.epsilon == head.k_norm.epsilon == 1e-5  # nn.LayerNorm's default
