"""Tests for timm's remaining gates (issue 25): circular ECA, SE's add_maxpool and norm,
LightCBAM and GlobalContext (nnx_pool._eca, ._squeeze_excite, ._cbam, ._context_gates).

Each expectation says where it comes from: a hand computation written out beside it, or
PyTorch 2.13 CPU running the timm 1.0.31 modules re-stated here from their sources
(``timm/layers/eca.py`` CecaModule, ``squeeze_excite.py`` SEModule, ``cbam.py``
LightCbamModule with ``conv_bn_act.py`` ConvNormAct, ``global_context.py``
GlobalContext with ``mlp.py`` ConvMlp and ``norm.py`` LayerNorm2d): timm itself
cannot be imported here (it imports torchvision). The PyTorch tests skip cleanly
when torch is absent.
"""

from __future__ import annotations

import functools
import math
import re
import runpy
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_pool._cbam import LightCBAM
from nnx_pool._context_gates import GlobalContext
from nnx_pool._eca import EfficientChannelAttention
from nnx_pool._squeeze_excite import SqueezeExcitation

_cheap_build = runpy.run_path(str(Path(__file__).parent / "_cheap.py"))["build"]

_TORCH_REASON = "PyTorch parity needs torch==2.13.0 (the parity extra)"


def identity(v):
  return v


@nnx.jit
def apply(module, x):
  return module(x)


@nnx.jit
def apply_both(a, b, x):
  """``a(x)`` and ``b(x)`` in one compiled program (each program has a set-up cost)."""
  return a(x), b(x)


def build(cls, *args, seed=0, **kwargs):
  """``cls(*args, **kwargs)`` with seeded uniform(-1, 1) parameters, batch statistics in
  [0.5, 1.5]; built from shapes, so no initialiser is compiled (tests/_cheap.py)."""
  return _cheap_build(cls, *args, seed=seed, stats=(0.5, 1.5), **kwargs)


def set_param(variable, value):
  # Cast by NumPy and placed: jnp.asarray(float64, float32) compiles a conversion per shape.
  variable[...] = jax.device_put(np.asarray(value, np.float32))


def _flat(tree) -> dict[str, np.ndarray]:
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(path, simple=True, separator=".").removesuffix(".value"):
          np.asarray(leaf) for path, leaf in leaves}


# ----------------------------------------------------------------------------
# Hand-computed gates on small maps.
# ----------------------------------------------------------------------------


def test_circular_eca_hand_computed():
  # Channel means [1, 2, 3, 4] cross-correlated with [1, 10, 100], padded circularly (timm
  # CecaModule: F.pad(y, (1, 1), mode='circular')): out[c] = p[c-1] + 10 p[c] + 100 p[c+1]
  # with p[-1] = p[3] = 4 and p[4] = p[0] = 1: [4 + 10 + 200, 1 + 20 + 300, 2 + 30 + 400,
  # 3 + 40 + 100] = [214, 321, 432, 143]; identity gate; the input (L=1) is scaled by that.
  # Zero padding (EcaModule) would give 210 and 43 at the ends.
  eca = build(EfficientChannelAttention, 4, 3, gate=identity, circular=True, num_spatial_dims=1)
  set_param(eca.conv.kernel, np.array([1.0, 10.0, 100.0]).reshape(3, 1, 1))
  x = np.array([[[1.0, 2.0, 3.0, 4.0]]], np.float32)  # (N, L, C) = (1, 1, 4)
  np.testing.assert_array_equal(apply(eca, x), [[[214.0, 642.0, 1296.0, 572.0]]])


def test_se_add_maxpool_and_norm_hand_computed():
  # x (1, 2, 2, 2): channel 0 = [1, 2, 3, 6] (mean 3, max 6), channel 1 = [0, 4, 0, 4]
  # (mean 2, max 4). add_maxpool squeezes to 0.5 mean + 0.5 max = [4.5, 3]. fc1 = [[1], [-1]]
  # + 0.5 -> 2. BatchNorm in eval mode, mean 1, var 4 - 1e-5 (so var + eps = 4), scale 3,
  # bias -1: (2 - 1) / 2 * 3 - 1 = 0.5; relu 0.5; fc2 = [[2, -1]] + [0, 1.5] -> [1, 1];
  # identity gate: y = x.
  se = build(SqueezeExcitation, 2, 1, gate=identity, add_maxpool=True, norm=True)
  set_param(se.fc1.kernel, [[1.0], [-1.0]])
  set_param(se.fc1.bias, [0.5])
  set_param(se.fc2.kernel, [[2.0, -1.0]])
  set_param(se.fc2.bias, [0.0, 1.5])
  for variable, value in ((se.bn.mean, 1.0), (se.bn.var, np.float32(4) - np.float32(1e-5)),
                          (se.bn.scale, 3.0), (se.bn.bias, -1.0)):
    set_param(variable, [value])
  x = np.array([[[1.0, 0.0], [2.0, 4.0]], [[3.0, 0.0], [6.0, 4.0]]], np.float32)[None]
  se.eval()
  # Without the norm the hidden value 2 goes through as is: fc2 -> [4, -0.5].
  plain = build(SqueezeExcitation, 2, 1, gate=identity, add_maxpool=True)
  for name in ("fc1", "fc2"):
    for part in ("kernel", "bias"):
      set_param(getattr(getattr(plain, name), part), getattr(getattr(se, name), part)[...])
  normed, unnormed = apply_both(se, plain, x)
  np.testing.assert_allclose(normed, x, rtol=1e-6)
  np.testing.assert_array_equal(unnormed, x * [4.0, -0.5])


def test_light_cbam_hand_computed():
  # Channel gate: zero kernels, fc2 bias [log 3, 0] -> sigmoid = [0.75, 0.5]. x (1, 1, 2, 2)
  # has cells a = [4, 2], b = [8, 6], gated to a = [3, 1], b = [6, 3]. Spatial map, 0.5 mean
  # + 0.5 max over channels: a 0.5 * 2 + 0.5 * 3 = 2.5, b 0.5 * 4.5 + 0.5 * 6 = 5.25. A 1x1
  # conv w = 2 log 3 / 2.75 and the eval BatchNorm (mean 0, var + eps = 1, scale 1, bias
  # -log 3 - 2.5 w) give a -log 3 and b +log 3: sigmoids 0.25 and 0.75. y: a = [0.75, 0.25],
  # b = [4.5, 2.25].
  cbam = build(LightCBAM, 2, 1, spatial_kernel_size=1, use_bias=True)
  set_param(cbam.fc1.kernel, np.zeros((2, 1)))
  set_param(cbam.fc1.bias, [0.0])
  set_param(cbam.fc2.kernel, np.zeros((1, 2)))
  set_param(cbam.fc2.bias, [math.log(3), 0.0])
  w = 2 * math.log(3) / 2.75
  set_param(cbam.spatial_conv.kernel, np.full((1, 1, 1, 1), w))
  norm = cbam.spatial_norm
  for variable, value in ((norm.mean, 0.0), (norm.var, np.float32(1) - np.float32(1e-5)),
                          (norm.scale, 1.0), (norm.bias, -math.log(3) - 2.5 * w)):
    set_param(variable, [value])
  cbam.eval()
  x = np.array([[[[4.0, 2.0], [8.0, 6.0]]]], np.float32)
  np.testing.assert_allclose(apply(cbam, x), [[[[0.75, 0.25], [4.5, 2.25]]]], rtol=1e-6)


def _gc_hand(use_attn):
  """GlobalContext(2) with hand-set parameters (see the test)."""
  gc = build(GlobalContext, 2, use_attn=use_attn, fuse_add=True, squeeze_features=2)
  if use_attn:
    set_param(gc.conv_attn.kernel, [[1.0], [0.0]])  # the logit is channel 0
    set_param(gc.conv_attn.bias, [0.0])
  for mlp, last in ((gc.mlp_scale, [[0.0, 0.0], [0.0, math.log(3)]]),
                    (gc.mlp_add, [[0.0, 0.0], [1.0, -2.0]])):
    set_param(mlp.fc1.kernel, np.eye(2))
    set_param(mlp.fc1.bias, [0.0, 0.0])
    set_param(mlp.norm.scale, [1.0, 1.0])
    set_param(mlp.norm.bias, [0.0, 0.0])
    set_param(mlp.fc2.kernel, last)
    set_param(mlp.fc2.bias, [0.0, 0.0])
  return gc


def test_global_context_hand_computed():
  # Two cells a = [0, 4], b = [log 3, 8]. Attention logits (channel 0) [0, log 3] give the
  # softmax weights [1/4, 3/4], so the context is [3/4 log 3, 1 + 6] = [0.824, 7]. Each MLP:
  # fc1 = identity; the LayerNorm over 2 channels maps [u, v] (u < v) to [-1, 1] (times
  # 1 / sqrt(1 + 1e-6 / var), var = ((v - u) / 2)^2 = 9.5, within 1e-7 of 1); relu -> [0, 1];
  # fc2's last row: mlp_scale -> [0, log 3], sigmoid [0.5, 0.75]; mlp_add -> [1, -2].
  # y = x * [0.5, 0.75] + [1, -2]: a = [1, 1], b = [log 3 / 2 + 1, 4].
  x = np.array([[[[0.0, 4.0], [math.log(3), 8.0]]]], np.float32)  # (1, 1, 2, 2)
  expected = [[[[1.0, 1.0], [math.log(3) / 2 + 1, 4.0]]]]
  attn, mean = apply_both(_gc_hand(True), _gc_hand(False), x)
  np.testing.assert_allclose(attn, expected, rtol=1e-6)
  # The mean (use_attn=False) gives the context [log 3 / 2, 6], also u < v: the same y.
  np.testing.assert_allclose(mean, expected, rtol=1e-6)


def test_global_context_initialisation():
  # timm's reset_parameters zeroes mlp_add.fc2.weight; init_last_zero also zeroes
  # mlp_scale's last kernel (GCNet's last_zero_init). Everything else is Flax's initialiser.
  def make():
    return (GlobalContext(16, fuse_add=True, rngs=nnx.Rngs(0)),
            GlobalContext(16, fuse_add=True, init_last_zero=True, rngs=nnx.Rngs(0)))

  default, zeroed = nnx.jit(make)()
  assert default.squeeze_features == 2  # make_divisible(16 / 8, 1, round_limit=0)
  np.testing.assert_array_equal(default.mlp_add.fc2.kernel[...], np.zeros((2, 16)))
  assert np.all(np.asarray(default.mlp_scale.fc2.kernel[...]) != 0)
  np.testing.assert_array_equal(zeroed.mlp_scale.fc2.kernel[...], np.zeros((2, 16)))
  np.testing.assert_array_equal(zeroed.mlp_scale.fc1.kernel[...], default.mlp_scale.fc1.kernel[...])


# ----------------------------------------------------------------------------
# PyTorch 2.13 parity: timm 1.0.31's modules re-stated, values and the gradients of the
# input and every parameter; state dicts loaded both ways.
# ----------------------------------------------------------------------------


def _timm_modules(torch):
  """The timm 1.0.31 modules, forward passes and attribute (state-dict key) names as timm's."""
  nn, F = torch.nn, torch.nn.functional

  class CecaModule(nn.Module):  # timm/layers/eca.py (act_layer=None, gate 'sigmoid')
    def __init__(self, channels=None, kernel_size=3, gamma=2, beta=1):
      super().__init__()
      if channels is not None:
        t = int(abs(math.log(channels, 2) + beta) / gamma)
        kernel_size = max(t if t % 2 else t + 1, 3)
      self.padding = (kernel_size - 1) // 2
      self.conv = nn.Conv1d(1, 1, kernel_size=kernel_size, padding=0, bias=False)

    def forward(self, x):
      y = x.mean((2, 3)).view(x.shape[0], 1, -1)
      y = F.pad(y, (self.padding, self.padding), mode='circular')
      y = self.conv(y)
      y = torch.sigmoid(y).view(x.shape[0], -1, 1, 1)
      return x * y.expand_as(x)

  class SEModule(nn.Module):  # timm/layers/squeeze_excite.py (rd_channels given)
    def __init__(self, channels, rd_channels, add_maxpool=False, bias=True, norm_layer=None):
      super().__init__()
      self.add_maxpool = add_maxpool
      self.fc1 = nn.Conv2d(channels, rd_channels, kernel_size=1, bias=bias)
      self.bn = norm_layer(rd_channels) if norm_layer else nn.Identity()
      self.act = nn.ReLU(inplace=True)
      self.fc2 = nn.Conv2d(rd_channels, channels, kernel_size=1, bias=bias)

    def forward(self, x):
      x_se = x.mean((2, 3), keepdim=True)
      if self.add_maxpool:
        x_se = 0.5 * x_se + 0.5 * x.amax((2, 3), keepdim=True)
      x_se = self.fc1(x_se)
      x_se = self.act(self.bn(x_se))
      x_se = self.fc2(x_se)
      return x * torch.sigmoid(x_se)

  class ConvNormAct(nn.Module):
    # timm/layers/conv_bn_act.py ConvNormAct(1, 1, k, apply_act=False): create_conv2d with
    # padding '' (symmetric (k - 1) // 2, no bias), then BatchNormAct2d(apply_act=False),
    # which is BatchNorm2d (eps 1e-5, momentum 0.1) with an identity activation.
    def __init__(self, k):
      super().__init__()
      self.conv = nn.Conv2d(1, 1, k, padding=(k - 1) // 2, bias=False)
      self.bn = nn.BatchNorm2d(1)

    def forward(self, x):
      return self.bn(self.conv(x))

  class LightChannelAttn(nn.Module):  # timm/layers/cbam.py (its ChannelAttn.__init__)
    def __init__(self, channels, rd_channels, mlp_bias=False):
      super().__init__()
      self.fc1 = nn.Conv2d(channels, rd_channels, 1, bias=mlp_bias)
      self.act = nn.ReLU(inplace=True)
      self.fc2 = nn.Conv2d(rd_channels, channels, 1, bias=mlp_bias)

    def forward(self, x):
      x_pool = 0.5 * x.mean((2, 3), keepdim=True) + 0.5 * x.amax((2, 3), keepdim=True)
      x_attn = self.fc2(self.act(self.fc1(x_pool)))
      return x * F.sigmoid(x_attn)

  class LightSpatialAttn(nn.Module):  # timm/layers/cbam.py (gate 'sigmoid')
    def __init__(self, kernel_size=7):
      super().__init__()
      self.conv = ConvNormAct(kernel_size)

    def forward(self, x):
      x_attn = 0.5 * x.mean(dim=1, keepdim=True) + 0.5 * x.amax(dim=1, keepdim=True)
      x_attn = self.conv(x_attn)
      return x * torch.sigmoid(x_attn)

  class LightCbamModule(nn.Module):  # timm/layers/cbam.py
    def __init__(self, channels, rd_channels, spatial_kernel_size=7, mlp_bias=False):
      super().__init__()
      self.channel = LightChannelAttn(channels, rd_channels, mlp_bias=mlp_bias)
      self.spatial = LightSpatialAttn(spatial_kernel_size)

    def forward(self, x):
      return self.spatial(self.channel(x))

  class LayerNorm2d(nn.LayerNorm):  # timm/layers/norm.py (eps 1e-6, not the fast norm)
    def __init__(self, num_channels, eps=1e-6):
      super().__init__(num_channels, eps=eps)

    def forward(self, x):
      x = x.permute(0, 2, 3, 1)
      x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
      return x.permute(0, 3, 1, 2)

  class ConvMlp(nn.Module):  # timm/layers/mlp.py (act ReLU, norm LayerNorm2d, drop 0)
    def __init__(self, in_features, hidden_features):
      super().__init__()
      self.fc1 = nn.Conv2d(in_features, hidden_features, kernel_size=1, bias=True)
      self.norm = LayerNorm2d(hidden_features)
      self.act = nn.ReLU()
      self.fc2 = nn.Conv2d(hidden_features, in_features, kernel_size=1, bias=True)

    def forward(self, x):
      return self.fc2(self.act(self.norm(self.fc1(x))))

  class TimmGlobalContext(nn.Module):  # timm/layers/global_context.py (rd_channels given)
    def __init__(self, channels, use_attn=True, fuse_add=False, fuse_scale=True, rd_channels=2):
      super().__init__()
      self.conv_attn = nn.Conv2d(channels, 1, kernel_size=1, bias=True) if use_attn else None
      self.mlp_add = ConvMlp(channels, rd_channels) if fuse_add else None
      self.mlp_scale = ConvMlp(channels, rd_channels) if fuse_scale else None

    def forward(self, x):
      B, C, H, W = x.shape
      if self.conv_attn is not None:
        attn = self.conv_attn(x).reshape(B, 1, H * W)
        attn = F.softmax(attn, dim=-1).unsqueeze(3)
        context = x.reshape(B, C, H * W).unsqueeze(1) @ attn
        context = context.view(B, C, 1, 1)
      else:
        context = x.mean(dim=(2, 3), keepdim=True)
      if self.mlp_scale is not None:
        x = x * torch.sigmoid(self.mlp_scale(context))
      if self.mlp_add is not None:
        x = x + self.mlp_add(context)
      return x

  return dict(eca=CecaModule, se=SEModule, light_cbam=LightCbamModule, gc=TimmGlobalContext,
              bn=nn.BatchNorm2d)


# The state-dict key of each NNX path (the layout change is written in _to_torch_value).
_KEYS = {
    "eca": {"conv.kernel": "conv.weight"},
    "se": {"fc1.kernel": "fc1.weight", "fc1.bias": "fc1.bias", "fc2.kernel": "fc2.weight",
           "fc2.bias": "fc2.bias", "bn.scale": "bn.weight", "bn.bias": "bn.bias",
           "bn.mean": "bn.running_mean", "bn.var": "bn.running_var"},
    "light_cbam": {"fc1.kernel": "channel.fc1.weight", "fc1.bias": "channel.fc1.bias",
                   "fc2.kernel": "channel.fc2.weight", "fc2.bias": "channel.fc2.bias",
                   "spatial_conv.kernel": "spatial.conv.conv.weight",
                   "spatial_norm.scale": "spatial.conv.bn.weight",
                   "spatial_norm.bias": "spatial.conv.bn.bias",
                   "spatial_norm.mean": "spatial.conv.bn.running_mean",
                   "spatial_norm.var": "spatial.conv.bn.running_var"},
    "gc": {"conv_attn.kernel": "conv_attn.weight", "conv_attn.bias": "conv_attn.bias",
           **{f"{mlp}.{layer}.{ours}": f"{mlp}.{layer}.{theirs}"
              for mlp in ("mlp_scale", "mlp_add") for layer in ("fc1", "norm", "fc2")
              for ours, theirs in (("kernel", "weight"), ("bias", "bias"), ("scale", "weight"))
              if not (layer == "norm" and ours == "kernel")
              and not (layer != "norm" and ours == "scale")}},
}


def _to_torch_value(path, value):
  """An NNX value in PyTorch's layout: a Linear kernel (in, out) is a 1x1 Conv2d weight
  (out, in, 1, 1); ECA's Conv kernel (k, 1, 1) is Conv1d's (1, 1, k); the spatial Conv
  kernel (kh, kw, 1, 1) is Conv2d's (1, 1, kh, kw); the rest as they are."""
  if path.endswith("kernel"):
    if value.ndim == 2:
      return value.T[:, :, None, None]
    return np.moveaxis(value, (-1, -2), (0, 1))
  return value


# kind -> (our class, constructor arguments, timm constructor arguments, input shape NCHW)
_PARITY = {
    "ceca k5 C8": ("eca", EfficientChannelAttention, dict(in_features=8, kernel_size=5,
                                                           circular=True),
                   dict(kernel_size=5), (2, 8, 4, 5)),
    "ceca k5 C3 (the pad wraps to the far end)": (
        "eca", EfficientChannelAttention, dict(in_features=3, kernel_size=5, circular=True),
        dict(kernel_size=5), (2, 3, 4, 5)),
    "se add_maxpool norm": ("se", SqueezeExcitation, dict(in_features=8, squeeze_features=3,
                                                          add_maxpool=True, norm=True),
                            dict(channels=8, rd_channels=3, add_maxpool=True, norm_layer="bn"),
                            (3, 8, 4, 5)),
    "se norm bias=False": ("se", SqueezeExcitation, dict(in_features=8, squeeze_features=3,
                                                         use_bias=False, norm=True),
                           dict(channels=8, rd_channels=3, bias=False, norm_layer="bn"),
                           (3, 8, 4, 5)),
    "light_cbam k3": ("light_cbam", LightCBAM, dict(in_features=8, squeeze_features=2,
                                                    spatial_kernel_size=3),
                      dict(channels=8, rd_channels=2, spatial_kernel_size=3), (2, 8, 5, 6)),
    "light_cbam k5 mlp_bias": ("light_cbam", LightCBAM,
                               dict(in_features=8, squeeze_features=2, spatial_kernel_size=5,
                                    use_bias=True),
                               dict(channels=8, rd_channels=2, spatial_kernel_size=5,
                                    mlp_bias=True), (2, 8, 5, 6)),
    # A hidden width of 4: the LayerNorm of 2 channels [u, v] is +-1 with a derivative of
    # order 1e-6 / |u - v|^3, too ill-conditioned to compare gradients at 1e-5.
    "gc attn scale": ("gc", GlobalContext, dict(in_features=8, squeeze_features=4),
                      dict(channels=8, rd_channels=4), (2, 8, 5, 6)),
    "gc attn scale add": ("gc", GlobalContext, dict(in_features=8, squeeze_features=4,
                                                    fuse_add=True),
                          dict(channels=8, fuse_add=True, rd_channels=4), (2, 8, 5, 6)),
    "gc mean add": ("gc", GlobalContext, dict(in_features=8, squeeze_features=4,
                                              use_attn=False, fuse_add=True, fuse_scale=False),
                    dict(channels=8, use_attn=False, fuse_add=True, fuse_scale=False,
                         rd_channels=4), (2, 8, 5, 6)),
}
# (SE with add_maxpool and no norm took paths kept here and in tests/test_gates.py again: the
# add_maxpool squeeze in "se add_maxpool norm", SE without a norm in test_gates.py's parity
# with timm's SEModule, the load of ours into timm's SE keys in "se norm bias=False";
# without it the one program's compile went from 2.99 s to 2.61 s of CPU, compile census.)
# Which cases load ours from the timm module's state dict (from_torch); the others load the
# timm module from ours (load_state_dict, strict).
_FROM_TORCH = {"ceca k5 C8", "se add_maxpool norm", "light_cbam k3", "gc attn scale add",
               "gc mean add"}


def _randomised(torch, module, seed):
  """``module`` with every float tensor of its state uniform in [-1, 1] (running variances
  in [0.5, 1.5]), so no zero initialisation hides a term; in eval mode."""
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for key, tensor in module.state_dict().items():
      if tensor.is_floating_point():
        low = 0.5 if key.endswith("running_var") else -1.0
        tensor.copy_(torch.rand(tensor.shape, generator=generator) * (1.0 if low > 0 else 2.0)
                     + low)
  return module.eval()


@pytest.fixture(scope="module")
def parity():
  """Every case of _PARITY: the timm module run by PyTorch (output and gradients of
  sum(y * g)), and ours, loaded from it or into it, with all of ours in one compiled call."""
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  peers = _timm_modules(torch)
  runs, ours_all, xs, gs = {}, [], [], []
  for case, (kind, cls, ours_args, theirs_args, shape) in _PARITY.items():
    theirs_args = {k: peers["bn"] if v == "bn" else v for k, v in theirs_args.items()}
    theirs = _randomised(torch, peers[kind](**theirs_args), seed=len(case))
    if case in _FROM_TORCH:
      # The options that the weights do not hold.
      options = {k: ours_args[k] for k in ("circular", "add_maxpool") if k in ours_args}
      ours = cls.from_torch(theirs.state_dict(), precision="highest", **options)
    else:
      ours = build(cls, **ours_args, precision="highest", seed=len(case))
      state = {_KEYS[kind][path]: torch.tensor(_to_torch_value(path, value))
               for path, value in _flat(nnx.state(ours)).items()}
      state |= {key: value for key, value in theirs.state_dict().items()
                if key.endswith("num_batches_tracked")}
      theirs.load_state_dict(state, strict=True)
    ours.eval()
    rng = np.random.default_rng(len(case))
    x = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    yt = theirs(xt)
    yt.backward(torch.tensor(g))
    runs[case] = dict(kind=kind, y=_nhwc(yt.detach().numpy()), grad_x=_nhwc(xt.grad.numpy()),
                      grads={name: p.grad.numpy() for name, p in theirs.named_parameters()})
    ours_all.append(ours)
    xs.append(_nhwc(x))
    gs.append(_nhwc(g))

  def loss(gate, x, g):
    y = gate(x)
    return jnp.sum(y * g), y

  @nnx.jit
  def run(gates, xs, gs):
    step = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    return [step(gate, x, g) for gate, x, g in zip(gates, xs, gs, strict=True)]

  for run_, ((_, y), (grad_ours, grad_x)) in zip(runs.values(), run(ours_all, xs, gs),
                                                   strict=True):
    run_["ours"] = dict(y=np.asarray(y), grad_x=np.asarray(grad_x), grads=_flat(grad_ours))
  return runs


def _nhwc(a):
  return np.moveaxis(a, 1, -1)


@pytest.mark.parametrize("case", list(_PARITY))
def test_matches_timm_values_and_gradients(parity, case):
  run = parity[case]
  ours, keys = run["ours"], _KEYS[run["kind"]]
  np.testing.assert_allclose(ours["y"], run["y"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ours["grad_x"], run["grad_x"], rtol=1e-5, atol=1e-5)
  assert sorted(keys[path] for path in ours["grads"]) == sorted(run["grads"])  # every parameter
  for path, grad in ours["grads"].items():
    np.testing.assert_allclose(_to_torch_value(path, grad), run["grads"][keys[path]],
                               rtol=1e-5, atol=1e-5, err_msg=path)


# ----------------------------------------------------------------------------
# Ranks, batch axes, dtypes, training mode.
# ----------------------------------------------------------------------------


def test_one_and_three_spatial_dims_match_two():
  # A 1-D map (N, L, C) is the 2-D map (N, 1, L, C), and a 3-D map of depth 1 the 2-D map,
  # when the spatial kernel is the 2-D kernel's middle row (1-D) or the 2-D kernel in the
  # middle of a zero 3x3x3 (3-D): zero padding leaves only those taps.
  x = np.random.default_rng(3).standard_normal((2, 4, 5, 6)).astype(np.float32)

  def gates(nd):  # (SE's squeeze is a reduction over the spatial axes, as in test_gates.py)
    return [build(LightCBAM, 6, 2, spatial_kernel_size=3, num_spatial_dims=nd, seed=1),
            build(GlobalContext, 6, fuse_add=True, num_spatial_dims=nd, seed=2)]

  gates1, gates2, gates3 = gates(1), gates(2), gates(3)
  for lower, upper in zip(gates1 + gates3, gates2 + gates2, strict=True):
    # The same parameters: every variable of the 2-D gate whose shape fits.
    nnx.update(lower, jax.tree.map(lambda a, b: a if a.shape == b.shape else b,
                                   nnx.state(upper), nnx.state(lower)))
  kernel2 = np.asarray(gates2[0].spatial_conv.kernel[...])  # (3, 3, 1, 1)
  set_param(gates1[0].spatial_conv.kernel, kernel2[1])
  kernel3 = np.zeros((3, 3, 3, 1, 1), np.float32)
  kernel3[1] = kernel2
  set_param(gates3[0].spatial_conv.kernel, kernel3)
  for gate in (*gates1, *gates2, *gates3):
    gate.eval()
  rows = x[:, :1]  # (2, 1, 5, 6): the 1-D case's 2-D twin
  two, one, three, two_rows = jax.device_get(nnx.jit(lambda g1, g2, g3: (
      [g(x) for g in g2], [g(rows[:, 0]) for g in g1], [g(x[:, None]) for g in g3],
      [g(rows) for g in g2]))(gates1, gates2, gates3))  # NumPy: slicing a jax.Array compiles
  for i in range(2):
    np.testing.assert_allclose(three[i][:, 0], two[i], rtol=1e-6, atol=1e-7, err_msg=str(i))
    np.testing.assert_allclose(one[i], two_rows[i][:, 0], rtol=1e-6, atol=1e-7, err_msg=str(i))


def _eval_gates():
  """LightCBAM, GlobalContext (scale and add) and SE with add_maxpool and norm, in eval mode.

  (Circular ECA differs from ECA, which tests/test_gates.py runs in every dtype and layout,
  in its padding alone.)"""
  gates = [build(LightCBAM, 8, 2, spatial_kernel_size=3), build(GlobalContext, 8, fuse_add=True),
           build(SqueezeExcitation, 8, 2, add_maxpool=True, norm=True)]
  for gate in gates:
    gate.eval()
  return gates


@functools.cache
def _eval_gates_run():
  """The three gates of _eval_gates on one float32 map with two batch axes, merged, unbatched,
  and on its two halves in bfloat16 and float16, all in one compiled program.

  The map is (2, 2, 5, 6, 8): its first batch axis is one standard normal (2, 5, 6, 8) input
  rounded to bfloat16, then to float16, held in float32, so that the merged call (4, 5, 6, 8)
  is also the float32 twin of each half-precision call. Apart, 21 gate calls in two programs;
  so, 15 in one (measured: this file's lambdas 3.3 s -> 3.0 s of compile CPU).
  """
  x32 = np.random.default_rng(5).standard_normal((2, 5, 6, 8)).astype(np.float32)
  halves = [x32.astype(jnp.bfloat16), x32.astype(np.float16)]  # NumPy rounds, to nearest even
  x = np.stack([h.astype(np.float32) for h in halves])
  out = nnx.jit(lambda gates: [(g(x), g(x.reshape(4, 5, 6, 8)), g(x[1, 1]), [g(h) for h in halves])
                               for g in gates])(_eval_gates())
  return x, halves, out


def test_several_batch_axes_and_unbatched():
  x, _, out = _eval_gates_run()
  for i, (several, flat, single, _) in enumerate(out):
    assert several.shape == x.shape
    np.testing.assert_array_equal(several, np.asarray(flat).reshape(x.shape), err_msg=str(i))
    np.testing.assert_allclose(single, np.asarray(flat)[3], rtol=1e-6, atol=1e-7,
                               err_msg=str(i))


def test_half_precision_stays_half():
  # The output keeps the input's dtype, and agrees with the float32 gate on the same values
  # within the rounding of the half-precision steps: the summaries and the output are
  # rounded to the dtype (1 ULP each, LightCBAM's two gated maps 2), the scale is float32.
  _, halves, out = _eval_gates_run()
  for i, (_, flat, _, half) in enumerate(out):
    full = np.asarray(flat).reshape(2, 2, 5, 6, 8)
    for k, (h, x) in enumerate(zip(half, halves, strict=True)):
      eps = float(jnp.finfo(x.dtype).eps)
      assert h.dtype == x.dtype, (i, k)
      np.testing.assert_allclose(np.asarray(h, np.float32), full[k], rtol=4 * eps, atol=4 * eps,
                                 err_msg=f"{x.dtype} {i}")


@functools.partial(nnx.jit, static_argnames="use_running_average")
def _call(gates, x, use_running_average=None):
  """Each gate on ``x``, one compiled program for all."""
  return [gate(x, use_running_average=use_running_average) for gate in gates]


def test_batch_norm_gates_train_and_eval():
  # As CBAM: built in training mode (batch statistics; a call updates the running ones),
  # .eval() and use_running_average=True use the running statistics, and the per-call
  # argument leaves the module's mode alone. Both gates in each program (3 programs, not 6).
  x = np.random.default_rng(6).standard_normal((4, 3, 3, 8)).astype(np.float32)
  gates = [build(SqueezeExcitation, 8, 2, norm=True), build(LightCBAM, 8, 2, spatial_kernel_size=3)]
  norms = [gates[0].bn, gates[1].spatial_norm]
  before = [np.asarray(bn.mean[...]) for bn in norms]
  evaluated = _call(gates, x, use_running_average=True)
  for bn, mean in zip(norms, before, strict=True):
    np.testing.assert_array_equal(bn.mean[...], mean)
    assert bn.use_running_average is False
  _call(gates, x)
  for bn, mean in zip(norms, before, strict=True):
    assert not np.allclose(bn.mean[...], mean)  # a training call updates the running mean
  for gate in gates:
    gate.eval()
  running = _call(gates, x)
  for i, (bn, y, y_eval) in enumerate(zip(norms, running, evaluated, strict=True)):
    assert bn.use_running_average is True, i
    assert not np.allclose(y, y_eval), i  # the running mean moved in between


def test_channels_first_inputs_are_named():
  for cls in (LightCBAM, GlobalContext):
    gate = build(cls, 16)
    with pytest.raises(ValueError, match=re.escape(
        f"{cls.__name__}: `inputs` must be channels-last with in_features=16 on the last axis; "
        "got shape (2, 16, 5, 5). It looks channels-first (NCHW: 16 on axis 1); use "
        "jnp.moveaxis(x, 1, -1).")):
      gate(np.ones((2, 16, 5, 5), np.float32))  # NumPy: jnp.ones compiles a broadcast


# ----------------------------------------------------------------------------
# Errors.
# ----------------------------------------------------------------------------


def _sd(shapes):
  return {key: np.zeros(shape, np.float32) for key, shape in shapes.items()}


_GC_MLP = {"fc1.weight": (2, 8, 1, 1), "fc1.bias": (2,), "norm.weight": (2,), "norm.bias": (2,),
           "fc2.weight": (8, 2, 1, 1), "fc2.bias": (8,)}
_WRAP = ("EfficientChannelAttention: circular padding of (kernel_size - 1) // 2 = 3 channels a "
         "side wraps more than once around 2 channels, which PyTorch's circular padding "
         "refuses; use a kernel_size of at most 5.")

_ERRORS = [
    (lambda: EfficientChannelAttention(2, 7, circular=True, rngs=nnx.Rngs(0)), ValueError, _WRAP),
    (lambda: build(EfficientChannelAttention, None, 7, circular=True)(
        np.ones((1, 3, 3, 2), np.float32)),
     ValueError, _WRAP),
    (lambda: EfficientChannelAttention(8, circular=1, rngs=nnx.Rngs(0)), TypeError,
     "`circular` must be a bool; got 1."),
    (lambda: SqueezeExcitation(8, add_maxpool="yes", rngs=nnx.Rngs(0)), TypeError,
     "`add_maxpool` must be a bool; got 'yes'."),
    (lambda: SqueezeExcitation(8, norm=None, rngs=nnx.Rngs(0)), TypeError,
     "`norm` must be a bool; got None."),
    (lambda: build(SqueezeExcitation, 8)(np.ones((1, 2, 2, 8), np.float32),
                                          use_running_average=1),
     TypeError, "SqueezeExcitation: `use_running_average` must be True, False or None (None: "
     "the module's mode, set by .eval() and .train()); got 1."),
    (lambda: LightCBAM(8, spatial_kernel_size=4, rngs=nnx.Rngs(0)), ValueError,
     "`spatial_kernel_size` must be odd (to keep the size); got 4."),
    (lambda: LightCBAM(8, gate_layer=jax.nn.hard_sigmoid, rngs=nnx.Rngs(0)), TypeError,
     "LightCBAM got an unexpected keyword argument `gate_layer`; LightCBAM takes (in_features, "
     "squeeze_features, *, rd_ratio, rd_divisor, spatial_kernel_size, activation, use_bias, "
     "num_spatial_dims, dtype, param_dtype, precision, kernel_init, bias_init, rngs)."),
    (lambda: GlobalContext(8, fuse_scale=False, rngs=nnx.Rngs(0)), ValueError,
     "GlobalContext needs fuse_scale=True or fuse_add=True (or both); with neither it would "
     "return its input unchanged. Got fuse_scale=False, fuse_add=False."),
    (lambda: GlobalContext(8, use_attn="no", rngs=nnx.Rngs(0)), TypeError,
     "`use_attn` must be a bool; got 'no'."),
    (lambda: GlobalContext(8, channels=8, rngs=nnx.Rngs(0)), TypeError,
     "GlobalContext takes `in_features` (Flax's name), not `channels` (timm's): write "
     "in_features=... instead."),
    (lambda: LightCBAM.from_torch(_sd({
        "channel.fc1.weight": (2, 8, 1, 1), "channel.fc2.weight": (8, 2, 1, 1),
        "spatial.conv.conv.weight": (1, 2, 3, 3), "spatial.conv.bn.weight": (1,),
        "spatial.conv.bn.bias": (1,), "spatial.conv.bn.running_mean": (1,),
        "spatial.conv.bn.running_var": (1,)})), ValueError,
     "LightCBAM.from_torch: `spatial.conv.conv.weight` must have shape (1, 1, k, ...) with 1 to "
     "3 spatial dims; got (1, 2, 3, 3)."),
    (lambda: GlobalContext.from_torch(_sd({f"mlp_scale.{k}": s for k, s in _GC_MLP.items()}),
                                      fuse_add=True), TypeError,
     "GlobalContext.from_torch: do not pass fuse_add; sizes come from the weights and no "
     "initialiser runs."),
    (lambda: SqueezeExcitation.from_torch(_sd({
        "fc1.weight": (2, 8), "fc2.weight": (8, 2), "bn.weight": (2,), "bn.bias": (2,),
        "bn.running_mean": (2,), "bn.running_var": (2,)}), norm=True), TypeError,
     "SqueezeExcitation.from_torch: do not pass norm; sizes come from the weights and no "
     "initialiser runs."),
]


@pytest.mark.parametrize("i", range(len(_ERRORS)))
def test_errors(i):
  call, error, message = _ERRORS[i]
  with pytest.raises(error, match=f"^{re.escape(message)}$"):
    call()


def test_global_context_from_torch_lists_its_key_sets():
  attn = "conv_attn.bias, conv_attn.weight"
  mlp = {key: ", ".join(f"{key}.{part}" for part in (
      "fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight", "norm.bias", "norm.weight"))
         for key in ("mlp_scale", "mlp_add")}
  sets = [f"{attn}, {mlp['mlp_scale']}", f"{attn}, {mlp['mlp_add']}",
          f"{attn}, {mlp['mlp_add']}, {mlp['mlp_scale']}", mlp["mlp_scale"], mlp["mlp_add"],
          f"{mlp['mlp_add']}, {mlp['mlp_scale']}"]
  message = (f"GlobalContext.from_torch: unexpected state-dict keys. Expected one of: "
             f"{'; '.join(sets)}. Received: conv_attn.bias, conv_attn.weight. Strip any parent "
             "prefix first, e.g. {k.removeprefix('se.'): v for k, v in sd.items() if "
             "k.startswith('se.')}.")
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    GlobalContext.from_torch(_sd({"conv_attn.weight": (1, 8, 1, 1), "conv_attn.bias": (1,)}))
