"""Tests for PyTorch state-dict loading (nnx_pool._torch_state).

Every key set of every gate is loaded from a state dict whose elements are all
distinct (consecutive integers across the keys), and each parameter is read
back and compared with the PyTorch tensor it must come from, with the layout
change written out here: a Linear or 1x1 convolution weight ``(out, in[, 1, 1])``
is transposed to Flax's ``(in, out)``; a convolution weight ``(out, in, *k)``
becomes Flax's ``(*k, in, out)``; biases and BatchNorm's affine terms and
running statistics are copied. The layouts are PyTorch 2.13's (``nn.Linear``,
``nn.ConvNd``, ``nn.BatchNormNd``: ``weight``, ``bias``, ``running_mean``,
``running_var``, ``num_batches_tracked``) and Flax NNX's (``nnx.Linear``,
``nnx.Conv``, ``nnx.BatchNorm``: ``kernel``, ``bias``, ``scale``, ``mean``, ``var``).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_pool._attention_pool import AttentionPool
from nnx_pool._cbam import CBAM, LightCBAM
from nnx_pool._context_gates import GlobalContext
from nnx_pool._eca import EfficientChannelAttention
from nnx_pool._generalized import GeMPool, LsePlusPool
from nnx_pool._latent_pool import AttentionPoolLatent
from nnx_pool._squeeze_excite import EffectiveSqueezeExcitation, SqueezeExcitation
from nnx_pool._torch_keys import TORCH_KEYS
from nnx_pool._torch_state import (
  Loader,
  Row,
  conv_weight,
  layer_norm,
  linear,
  linear_weight,
  load,
)


def distinct_state(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
  """float32 tensors of these shapes holding 1, 2, 3, ... in key order: no two elements equal."""
  state, start = {}, 1
  for key, shape in shapes.items():
    size = int(np.prod(shape))
    state[key] = np.arange(start, start + size, dtype=np.float32).reshape(shape)
    start += size
  return state


def params(module: nnx.Module) -> dict[str, np.ndarray]:
  """Every parameter and batch statistic of ``module`` by its dotted path ("fc1.kernel")."""
  leaves = jax.tree_util.tree_flatten_with_path(nnx.state(module))[0]
  return {".".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)):
          np.asarray(leaf) for path, leaf in leaves}


# The layout changes, written out per rank.
def t_linear(w):  # (out, in) or (out, in, 1, 1) -> (in, out)
  return w.reshape(w.shape[0], w.shape[1]).T


def t_conv1(w):  # (out, in, k) -> (k, in, out)
  return w.transpose(2, 1, 0)


def t_conv2(w):  # (out, in, kh, kw) -> (kh, kw, in, out)
  return w.transpose(2, 3, 1, 0)


def t_conv3(w):  # (out, in, kd, kh, kw) -> (kd, kh, kw, in, out)
  return w.transpose(2, 3, 4, 1, 0)


_BN = {"spatial.conv.bn.weight": (1,), "spatial.conv.bn.bias": (1,),
       "spatial.conv.bn.running_mean": (1,), "spatial.conv.bn.running_var": (1,)}


def _bn_expected(sd):
  return {"spatial_norm.scale": sd["spatial.conv.bn.weight"],
          "spatial_norm.bias": sd["spatial.conv.bn.bias"],
          "spatial_norm.mean": sd["spatial.conv.bn.running_mean"],
          "spatial_norm.var": sd["spatial.conv.bn.running_var"]}


def _mlp_expected(sd, reduce, expand, bias):
  expected = {"fc1.kernel": t_linear(sd[f"{reduce}.weight"]),
              "fc2.kernel": t_linear(sd[f"{expand}.weight"])}
  if bias:
    expected |= {"fc1.bias": sd[f"{reduce}.bias"], "fc2.bias": sd[f"{expand}.bias"]}
  return expected


def _cbam(conv_shape, transpose, bias, tracked, cls=CBAM):
  shapes = {"channel.fc1.weight": (2, 8, 1, 1), "channel.fc2.weight": (8, 2, 1, 1)}
  if bias:
    shapes |= {"channel.fc1.bias": (2,), "channel.fc2.bias": (8,)}
  shapes |= {"spatial.conv.conv.weight": conv_shape, **_BN}
  if tracked:
    shapes["spatial.conv.bn.num_batches_tracked"] = ()
  return (cls, shapes, lambda sd: {
      **_mlp_expected(sd, "channel.fc1", "channel.fc2", bias),
      "spatial_conv.kernel": transpose(sd["spatial.conv.conv.weight"]), **_bn_expected(sd)})


def _se_with_norm(bias, tracked):
  # timm SEModule(norm_layer=nn.BatchNorm2d): fc1, bn (rd_channels), act, fc2.
  shapes = {"fc1.weight": (2, 8, 1, 1), "fc2.weight": (8, 2, 1, 1)}
  if bias:
    shapes |= {"fc1.bias": (2,), "fc2.bias": (8,)}
  shapes |= {f"bn.{name}": (2,) for name in ("weight", "bias", "running_mean", "running_var")}
  if tracked:
    shapes["bn.num_batches_tracked"] = ()
  return (SqueezeExcitation, shapes, lambda sd: {
      **_mlp_expected(sd, "fc1", "fc2", bias), "bn.scale": sd["bn.weight"],
      "bn.bias": sd["bn.bias"], "bn.mean": sd["bn.running_mean"], "bn.var": sd["bn.running_var"]})


def _conv_mlp(key):
  # timm ConvMlp(C=8, hidden=2, norm_layer=LayerNorm2d): fc1 and fc2 1x1 convs with biases.
  return {f"{key}.fc1.weight": (2, 8, 1, 1), f"{key}.fc1.bias": (2,), f"{key}.norm.weight": (2,),
          f"{key}.norm.bias": (2,), f"{key}.fc2.weight": (8, 2, 1, 1), f"{key}.fc2.bias": (8,)}


def _conv_mlp_expected(sd, key):
  return {f"{key}.fc1.kernel": t_linear(sd[f"{key}.fc1.weight"]),
          f"{key}.fc1.bias": sd[f"{key}.fc1.bias"],
          f"{key}.norm.scale": sd[f"{key}.norm.weight"], f"{key}.norm.bias": sd[f"{key}.norm.bias"],
          f"{key}.fc2.kernel": t_linear(sd[f"{key}.fc2.weight"]),
          f"{key}.fc2.bias": sd[f"{key}.fc2.bias"]}


def _global_context(attn, mlps):
  shapes = {"conv_attn.weight": (1, 8, 1, 1), "conv_attn.bias": (1,)} if attn else {}
  for key in mlps:
    shapes |= _conv_mlp(key)

  def expected(sd):
    out = ({"conv_attn.kernel": t_linear(sd["conv_attn.weight"]),
            "conv_attn.bias": sd["conv_attn.bias"]} if attn else {})
    for key in mlps:
      out |= _conv_mlp_expected(sd, key)
    return out

  return (GlobalContext, shapes, expected)


# (class, {state-dict key: shape}, state dict -> {NNX path: expected value}): every key set
# of every gate, with the sizes the module must take from them.
_CASES = {
    "torchvision/timm SE, 1x1 convs with bias": (
        SqueezeExcitation, {"fc1.weight": (2, 8, 1, 1), "fc1.bias": (2,),
                            "fc2.weight": (8, 2, 1, 1), "fc2.bias": (8,)},
        lambda sd: _mlp_expected(sd, "fc1", "fc2", True)),
    "timm SE bias=False, Linear weights": (
        SqueezeExcitation, {"fc1.weight": (3, 8), "fc2.weight": (8, 3)},
        lambda sd: _mlp_expected(sd, "fc1", "fc2", False)),
    "timm EfficientNet SqueezeExcite": (
        SqueezeExcitation, {"conv_reduce.weight": (2, 6, 1, 1), "conv_reduce.bias": (2,),
                            "conv_expand.weight": (6, 2, 1, 1), "conv_expand.bias": (6,)},
        lambda sd: _mlp_expected(sd, "conv_reduce", "conv_expand", True)),
    "EfficientNet SqueezeExcite without biases": (
        SqueezeExcitation, {"conv_reduce.weight": (2, 6, 1, 1), "conv_expand.weight": (6, 2, 1, 1)},
        lambda sd: _mlp_expected(sd, "conv_reduce", "conv_expand", False)),
    "timm EffectiveSEModule": (
        EffectiveSqueezeExcitation, {"fc.weight": (4, 4, 1, 1), "fc.bias": (4,)},
        lambda sd: {"fc.kernel": t_linear(sd["fc.weight"]), "fc.bias": sd["fc.bias"]}),
    "timm EcaModule": (
        EfficientChannelAttention, {"conv.weight": (1, 1, 5)},
        lambda sd: {"conv.kernel": t_conv1(sd["conv.weight"])}),
    "timm CbamModule": _cbam((1, 2, 3, 3), t_conv2, bias=False, tracked=True),
    "timm CbamModule mlp_bias, no num_batches_tracked": _cbam(
        (1, 2, 5, 5), t_conv2, bias=True, tracked=False),
    "CBAM 1-D": _cbam((1, 2, 3), t_conv1, bias=False, tracked=False),
    "CBAM 3-D": _cbam((1, 2, 3, 3, 3), t_conv3, bias=True, tracked=True),
    # Issue 25.
    "timm SEModule norm_layer=BatchNorm2d (rexnet SEWithNorm)": _se_with_norm(True, True),
    "timm SEModule bias=False with BatchNorm, no num_batches_tracked": _se_with_norm(False, False),
    "cnnimageretrieval GeM": (GeMPool, {"p": (1,)}, lambda sd: {"p": sd["p"]}),
    "timm LsePlus2d": (LsePlusPool, {"r": ()}, lambda sd: {"r": sd["r"]}),
    "timm LightCbamModule": _cbam((1, 1, 3, 3), t_conv2, bias=False, tracked=True, cls=LightCBAM),
    "timm LightCbamModule mlp_bias": _cbam((1, 1, 5, 5), t_conv2, bias=True, tracked=False,
                                           cls=LightCBAM),
    "LightCBAM 1-D": _cbam((1, 1, 3), t_conv1, bias=False, tracked=False, cls=LightCBAM),
    "timm GlobalContext (default: attention, scale)": _global_context(True, ("mlp_scale",)),
    "timm GlobalContext attention, add": _global_context(True, ("mlp_add",)),
    "timm GlobalContext attention, scale and add": _global_context(True, ("mlp_scale", "mlp_add")),
    "timm GlobalContext mean, scale": _global_context(False, ("mlp_scale",)),
    "timm GlobalContext mean, add": _global_context(False, ("mlp_add",)),
    "timm GlobalContext mean, scale and add": _global_context(False, ("mlp_scale", "mlp_add")),
}


# Issue 25, the attention heads (_attention_pool, _latent_pool): every key set, with num_heads.
def _attention_pool(separate, bias, proj, cls):
  e = 4  # embed_dim == in_features (timm's cls_token is (1, embed_dim))
  if separate:
    shapes = {f"{n}.weight": (e, e) for n in "qkv"} | (
        {f"{n}.bias": (e,) for n in "qkv"} if bias else {})
  else:
    shapes = {"qkv.weight": (3 * e, e)} | ({"qkv.bias": (3 * e,)} if bias else {})
  shapes |= ({"proj.weight": (3, e), "proj.bias": (3,)} if proj else {}) | {"pos_embed": (5, e)}
  shapes |= {"cls_token": (1, e)} if cls else {}

  def expected(sd):  # a fused qkv's rows are q, then k, then v
    out = {"pos_embed": sd["pos_embed"]} | ({"cls_token": sd["cls_token"]} if cls else {})
    for i, n in enumerate("qkv"):
      rows = slice(e * i, e * (i + 1))
      out[f"{n}.kernel"] = t_linear(sd[f"{n}.weight"] if separate else sd["qkv.weight"][rows])
      if bias:
        out[f"{n}.bias"] = sd[f"{n}.bias"] if separate else sd["qkv.bias"][rows]
    if proj:
      out |= {"proj.kernel": t_linear(sd["proj.weight"]), "proj.bias": sd["proj.bias"]}
    return out
  return AttentionPool, shapes, expected, {"num_heads": 2}


def _latent(bias, qk_norm, norm):
  # norm=False: timm 1.0.31's default AttentionPoolLatent (norm_layer=None), no norm.* keys.
  shapes = {"latent": (1, 2, 4), "q.weight": (4, 4), "kv.weight": (8, 4)}
  shapes |= {"q.bias": (4,), "kv.bias": (8,)} if bias else {}
  shapes |= ({f"{n}.{p}": (2,) for n in ("q_norm", "k_norm") for p in ("weight", "bias")}
             if qk_norm else {})
  shapes |= {"proj.weight": (3, 4), "proj.bias": (3,)}
  shapes |= {"norm.weight": (3,), "norm.bias": (3,)} if norm else {}
  shapes |= {"mlp.fc1.weight": (7, 3), "mlp.fc1.bias": (7,), "mlp.fc2.weight": (3, 7),
             "mlp.fc2.bias": (3,)}

  def expected(sd):
    out = {}
    for key, value in sd.items():
      layer, _, leaf = key.rpartition(".")
      if not layer:
        out[key] = value
      elif leaf == "weight":
        out[f"{layer}.kernel" if value.ndim == 2 else f"{layer}.scale"] = (
            t_linear(value) if value.ndim == 2 else value)
      else:
        out[key] = value
    return out
  return AttentionPoolLatent, shapes, expected, {"num_heads": 2}


_CASES |= {
    **{f"timm AttentionPool2d {'separate' if s else 'fused'} bias={b} proj={p} cls={c}":
       _attention_pool(s, b, p, c)
       for s in (False, True) for b in (True, False) for p in (True, False) for c in (False, True)},
    "open_clip ModifiedResNet AttentionPool2d": (
        AttentionPool, {**{f"{n}_proj.{p}": (4, 4) if p == "weight" else (4,)
                           for n in "qkvc" for p in ("weight", "bias")},
                        "positional_embedding": (5, 4)},
        lambda sd: {"pos_embed": sd["positional_embedding"],
                    **{f"{'proj' if n == 'c' else n}.kernel": t_linear(sd[f"{n}_proj.weight"])
                       for n in "qkvc"},
                    **{f"{'proj' if n == 'c' else n}.bias": sd[f"{n}_proj.bias"] for n in "qkvc"}},
        {"num_heads": 2}),
    **{f"timm AttentionPoolLatent bias={b} qk_norm={q} norm={n}": _latent(b, q, n)
       for b in (True, False) for q in (False, True) for n in (True, False)},
}


@pytest.mark.parametrize("case", list(_CASES))
def test_every_key_set_loads_each_tensor_to_its_place(case):
  cls, shapes, expected_of, *options = _CASES[case]
  sd = distinct_state(shapes)
  for key in sd:
    if key.endswith("num_batches_tracked"):
      sd[key] = np.int64(123)  # accepted, ignored
  got = params(cls.from_torch(sd, **(options[0] if options else {})))
  expected = expected_of(sd)
  assert sorted(got) == sorted(expected), case  # every parameter assigned, nothing else
  for path, value in expected.items():
    assert got[path].dtype == np.float32, path
    np.testing.assert_array_equal(got[path], value, err_msg=f"{case}: {path}")


def test_every_key_set_of_the_table_is_tested():
  # A key set added to the table without a case above fails here.
  table = {(name, frozenset(row.key for row in rows if row.target is not None))
           for name, loader in TORCH_KEYS.items() for rows in loader.key_sets}
  tested = {(cls.__name__, frozenset(k for k in shapes if not k.endswith("num_batches_tracked")))
            for cls, shapes, *_ in _CASES.values()}
  assert table == tested  # (CBAM's and LightCBAM's ranks share their key sets)


def test_linear_and_conv_layouts_written_out():
  # Hand-written: a Linear (out=2, in=3) weight is the transposed (in, out) kernel; a Conv1d
  # (out=2, in=1, k=3) weight is (k, in, out): kernel[j, 0, o] = weight[o, 0, j].
  weight = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
  np.testing.assert_array_equal(linear_weight()(weight, "fc.weight", "M"),
                                [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]])
  conv = np.array([[[1.0, 2.0, 3.0]], [[4.0, 5.0, 6.0]]], np.float32)
  np.testing.assert_array_equal(conv_weight()(conv, "conv.weight", "M"),
                                [[[1.0, 4.0]], [[2.0, 5.0]], [[3.0, 6.0]]])
  with pytest.raises(ValueError, match=re.escape(
      "M.from_torch: `conv.weight` must be a convolution weight (out, in, *kernel); got shape "
      "(2, 3).")):
    conv_weight()(np.zeros((2, 3)), "conv.weight", "M")


_SE_BN = ("bn.bias, bn.running_mean, bn.running_var, bn.weight, {fc} (optional: "
          "bn.num_batches_tracked)")
_SE_KEYS = ("fc1.weight, fc2.weight; fc1.bias, fc1.weight, fc2.bias, fc2.weight; "
            "conv_expand.weight, conv_reduce.weight; conv_expand.bias, conv_expand.weight, "
            "conv_reduce.bias, conv_reduce.weight; "
            + _SE_BN.format(fc="fc1.weight, fc2.weight") + "; "
            + _SE_BN.format(fc="fc1.bias, fc1.weight, fc2.bias, fc2.weight"))
_PREFIX_HINT = ("Strip any parent prefix first, e.g. {k.removeprefix('se.'): v for k, v in "
                "sd.items() if k.startswith('se.')}.")


@pytest.mark.parametrize(("state", "message"), [
    ({"fc1.weight": np.zeros((2, 8)), "fc2.weight": np.zeros((8, 2)), "se.weight": np.zeros(2)},
     f"SqueezeExcitation.from_torch: unexpected state-dict keys. Expected one of: {_SE_KEYS}. "
     f"Received: fc1.weight, fc2.weight, se.weight. {_PREFIX_HINT}"),
    ({"fc1.weight": np.zeros((2, 8)), "fc2.weight": np.zeros((8, 2)), "bn.weight": np.zeros(2)},
     f"SqueezeExcitation.from_torch: unexpected state-dict keys. Expected one of: {_SE_KEYS}. "
     f"Received: bn.weight, fc1.weight, fc2.weight. {_PREFIX_HINT}"),
    ({"fc1.weight": np.zeros((2, 8)), "fc1.bias": np.zeros(2), "fc2.weight": np.zeros((8, 2))},
     f"SqueezeExcitation.from_torch: unexpected state-dict keys. Expected one of: {_SE_KEYS}. "
     f"Received: fc1.bias, fc1.weight, fc2.weight. {_PREFIX_HINT}"),
    ({},
     f"SqueezeExcitation.from_torch: unexpected state-dict keys. Expected one of: {_SE_KEYS}. "
     f"Received: no keys. {_PREFIX_HINT}"),
    ({"fc1.weight": np.zeros((2, 8)), "fc1.bias": np.zeros(3), "fc2.weight": np.zeros((8, 2)),
      "fc2.bias": np.zeros(8)},
     "SqueezeExcitation.from_torch: `fc1.bias` has shape (3,); expected (2,)."),
], ids=["an unknown key", "a BatchNorm without its statistics", "a missing key", "no keys",
        "a mis-shaped bias"])
def test_one_error_names_expected_and_received_keys(state, message):
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    SqueezeExcitation.from_torch(state)


def test_cbam_error_lists_the_optional_key():
  bn = "spatial.conv.bn.bias, spatial.conv.bn.running_mean, spatial.conv.bn.running_var, " \
       "spatial.conv.bn.weight"
  optional = "(optional: spatial.conv.bn.num_batches_tracked)"
  message = (
      f"CBAM.from_torch: unexpected state-dict keys. Expected one of: channel.fc1.weight, "
      f"channel.fc2.weight, {bn}, spatial.conv.conv.weight {optional}; channel.fc1.bias, "
      f"channel.fc1.weight, channel.fc2.bias, channel.fc2.weight, {bn}, "
      f"spatial.conv.conv.weight {optional}. Received: spatial.conv.bn.num_batches_tracked. "
      f"{_PREFIX_HINT}")
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    CBAM.from_torch({"spatial.conv.bn.num_batches_tracked": np.int64(0)})


class _Tensor:
  """A stand-in for a torch tensor (``detach().cpu()``, a dtype, ``.float()``, ``__array__``)."""

  def __init__(self, values, dtype="torch.float32"):
    self.values, self.dtype, self.calls = np.asarray(values, np.float32), dtype, []

  def detach(self):
    self.calls.append("detach")
    return self

  def cpu(self):
    self.calls.append("cpu")
    return self

  def float(self):
    self.calls.append("float")
    return _Tensor(self.values)

  def __array__(self, dtype=None, copy=None):
    return self.values if dtype is None else self.values.astype(dtype)


def test_tensors_are_read_without_torch():
  # Duck typing: detached, moved to the CPU, bfloat16 widened to float32 (NumPy has no
  # bfloat16), then read as an array. torch itself is never imported by the loader.
  weight = _Tensor([[[0.5, -1.0, 2.0]]], dtype="torch.bfloat16")
  eca = EfficientChannelAttention.from_torch({"conv.weight": weight})
  assert weight.calls == ["detach", "cpu", "float"]
  np.testing.assert_array_equal(eca.conv.kernel[...][:, 0, 0], [0.5, -1.0, 2.0])


@pytest.mark.parametrize(("value", "error", "message"), [
    # Issue 30: cast without a word before (int64 and bool to float32, complex to its real part).
    (np.array([3], np.int64), TypeError,
     "GeMPool.from_torch: `p` must hold floating weights; got dtype int64."),
    (np.array([True]), TypeError,
     "GeMPool.from_torch: `p` must hold floating weights; got dtype bool."),
    (np.array([3 + 1j], np.complex64), TypeError,
     "GeMPool.from_torch: `p` must hold floating weights; got dtype complex64."),
    (np.array([np.nan], np.float32), ValueError,
     "GeMPool.from_torch: `p` holds 1 non-finite values (NaN or inf) of 1; a module built from "
     "it would compute NaN."),
    (_Tensor([3.0], dtype="torch.int64"), TypeError,
     "GeMPool.from_torch: `p` must hold floating weights; got dtype torch.int64."),
])
def test_weights_must_be_finite_floats_named_by_key(value, error, message):
  with pytest.raises(error, match=f"^{re.escape(message)}$"):
    GeMPool.from_torch({"p": value})


def test_batch_norms_int64_counter_is_not_read():
  # timm's SEModule(norm_layer=BatchNorm2d): num_batches_tracked is int64, accepted and ignored.
  sd = {"fc1.weight": np.ones((2, 8), np.float32), "fc2.weight": np.ones((8, 2), np.float32),
        "bn.weight": np.ones(2, np.float32), "bn.bias": np.zeros(2, np.float32),
        "bn.running_mean": np.zeros(2, np.float32), "bn.running_var": np.ones(2, np.float32),
        "bn.num_batches_tracked": np.array(7, np.int64)}
  assert SqueezeExcitation.from_torch(sd).bn is not None


def test_real_torch_float8_meta_and_packed_tensors():
  torch = pytest.importorskip("torch", reason="PyTorch parity needs torch==2.13.0 (the parity "
                                              "extra)")
  # float8 widens to float32 exactly (3 is a float8_e4m3fn value); a meta tensor has no data
  # and float4_e2m1fn_x2 no float32 conversion: each reached torch's own error before.
  gem = GeMPool.from_torch({"p": torch.full((1,), 3.0).to(torch.float8_e4m3fn)})
  np.testing.assert_array_equal(gem.p[...], [3.0])
  with pytest.raises(ValueError, match=re.escape(
      "GeMPool.from_torch: `p` is a meta tensor, which holds no data")):
    GeMPool.from_torch({"p": torch.empty(1, device="meta")})
  with pytest.raises(TypeError, match=re.escape(
      "GeMPool.from_torch: `p` has dtype torch.float4_e2m1fn_x2, which PyTorch cannot widen to "
      "float32 (a packed format); unpack it to a float dtype first.")):
    GeMPool.from_torch({"p": torch.empty(1, dtype=torch.float4_e2m1fn_x2)})


def test_real_torch_tensors_bfloat16_included():
  torch = pytest.importorskip("torch", reason="PyTorch parity needs torch==2.13.0 (the parity "
                                              "extra)")
  # bfloat16 holds 0.5, -1.25 and 3 exactly, so they arrive unchanged.
  weight = torch.tensor([[[0.5, -1.25, 3.0]]], dtype=torch.bfloat16)
  eca = EfficientChannelAttention.from_torch({"conv.weight": weight})
  np.testing.assert_array_equal(eca.conv.kernel[...][:, 0, 0], [0.5, -1.25, 3.0])


# ----------------------------------------------------------------------------
# The rows the attention heads to come need: q/k/v or a fused qkv, LayerNorm, an embedding.
# ----------------------------------------------------------------------------


class _Head(nnx.Module):
  """A stand-in for an attention-pooling head: its parameters, not its computation."""

  def __init__(self, in_features: int, out_features: int, *, rngs: nnx.Rngs):
    self.q, self.k, self.v = (nnx.Linear(in_features, in_features, rngs=rngs) for _ in range(3))
    self.out = nnx.Linear(in_features, out_features, rngs=rngs)
    self.norm = nnx.LayerNorm(in_features, rngs=rngs)
    self.pos_embed = nnx.Param(jnp.zeros((5, in_features)))


# The module docstring's example, plus a LayerNorm.
_HEAD = Loader(
    inferred=("in_features", "out_features"),
    key_sets=(
        (*linear("q_proj", "q"), *linear("k_proj", "k"), *linear("v_proj", "v"),
         *linear("c_proj", "out"), Row("positional_embedding", "pos_embed"),
         *layer_norm("ln", "norm")),
        (Row("qkv.weight", ("q.kernel", "k.kernel", "v.kernel"), linear_weight()),
         Row("qkv.bias", ("q.bias", "k.bias", "v.bias")),
         *linear("proj", "out"), Row("pos_embed", "pos_embed"), *layer_norm("ln", "norm")),
    ),
    sizes=lambda p: dict(in_features=p["q.kernel"].shape[0], out_features=p["out.kernel"].shape[1]),
)


def test_separate_qkv_layer_norm_and_embedding():
  sd = distinct_state({"q_proj.weight": (4, 4), "q_proj.bias": (4,), "k_proj.weight": (4, 4),
                       "k_proj.bias": (4,), "v_proj.weight": (4, 4), "v_proj.bias": (4,),
                       "c_proj.weight": (3, 4), "c_proj.bias": (3,),
                       "positional_embedding": (5, 4), "ln.weight": (4,), "ln.bias": (4,)})
  got = params(load(_Head, _HEAD, sd, {}))
  expected = {"pos_embed": sd["positional_embedding"], "norm.scale": sd["ln.weight"],
              "norm.bias": sd["ln.bias"], "out.kernel": sd["c_proj.weight"].T,
              "out.bias": sd["c_proj.bias"]}
  for ours in "qkv":
    expected |= {f"{ours}.kernel": sd[f"{ours}_proj.weight"].T,
                 f"{ours}.bias": sd[f"{ours}_proj.bias"]}
  assert sorted(got) == sorted(expected)
  for path, value in expected.items():
    np.testing.assert_array_equal(got[path], value, err_msg=path)


def test_fused_qkv_splits_in_order():
  # timm AttentionPool2d's qkv is nn.Linear(C, 3C): rows 0..C-1 are q, C..2C-1 k, 2C..3C-1 v.
  sd = distinct_state({"qkv.weight": (12, 4), "qkv.bias": (12,), "proj.weight": (3, 4),
                       "proj.bias": (3,), "pos_embed": (5, 4), "ln.weight": (4,),
                       "ln.bias": (4,)})
  got = params(load(_Head, _HEAD, sd, {}))
  for i, ours in enumerate("qkv"):
    np.testing.assert_array_equal(got[f"{ours}.kernel"], sd["qkv.weight"][4 * i:4 * i + 4].T)
    np.testing.assert_array_equal(got[f"{ours}.bias"], sd["qkv.bias"][4 * i:4 * i + 4])
  np.testing.assert_array_equal(got["out.kernel"], sd["proj.weight"].T)
  np.testing.assert_array_equal(got["pos_embed"], sd["pos_embed"])


def test_fused_errors_options_and_unassigned_parameters():
  sd = distinct_state({"qkv.weight": (10, 4), "qkv.bias": (10,), "proj.weight": (3, 4),
                       "proj.bias": (3,), "pos_embed": (5, 4), "ln.weight": (4,),
                       "ln.bias": (4,)})
  with pytest.raises(ValueError, match=re.escape(
      "_Head.from_torch: `qkv.weight (transposed)` must split into 3 equal parts along its "
      "last axis; got shape (4, 10).")):
    load(_Head, _HEAD, sd, {})
  with pytest.raises(TypeError, match=re.escape(
      "_Head.from_torch: do not pass in_features, rngs; sizes come from the weights and no "
      "initialiser runs.")):
    load(_Head, _HEAD, sd, {"rngs": nnx.Rngs(0), "in_features": 4})
  # Without the rows of the embedding and the LayerNorm, their parameters stay shapes only.
  no_embedding = Loader(_HEAD.inferred, (_HEAD.key_sets[0][:-3],), _HEAD.sizes)
  sd = distinct_state({f"{name}.{kind}": (4, 4) if kind == "weight" else (4,)
                       for name in ("q_proj", "k_proj", "v_proj", "c_proj")
                       for kind in ("weight", "bias")})
  with pytest.raises(RuntimeError, match=re.escape(
      "_Head.from_torch left a parameter unassigned.")):
    load(_Head, no_embedding, sd, {})
