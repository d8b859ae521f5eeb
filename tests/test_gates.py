"""Tests for the channel gates (nnx_pool._gates, ._squeeze_excite, ._eca, ._cbam).

Each expectation says where it comes from: a hand computation, a seed fixture,
the peer's source (timm 1.0.31 ``timm/layers/``, torchvision 0.28
``torchvision/ops/misc.py``) or paper, a float64 NumPy computation from the
module's own parameters, or PyTorch 2.13 CPU running a module or function
written here as its peer defines it. The PyTorch tests skip cleanly when torch
is absent.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import runpy
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from nnx_pool._cbam import CBAM
from nnx_pool._eca import EfficientChannelAttention, eca_kernel_size
from nnx_pool._gates import make_divisible
from nnx_pool._squeeze_excite import EffectiveSqueezeExcitation, SqueezeExcitation

_TORCH_REASON = "PyTorch parity needs torch==2.13.0 (the parity extra)"


def identity(v):
  return v


@nnx.jit
def apply(module, x):
  """One compiled call (eager calls compile each operation separately, which is slower)."""
  return module(x)


@functools.partial(nnx.jit, static_argnames="use_running_average")
def apply_cbam(module, x, use_running_average):
  return module(x, use_running_average=use_running_average)


# Gates with seeded uniform(-1, 1) parameters and batch statistics of 1, built from shapes
# (tests/_cheap.py): running each initialiser eagerly would compile it for every new shape,
# which dominates a small test.
build = runpy.run_path(str(Path(__file__).parent / "_cheap.py"))["build"]


def set_param(variable, value):
  # Cast by NumPy and placed: jnp.asarray(float64, float32) compiles a conversion per shape.
  variable[...] = jax.device_put(np.asarray(value, np.float32))


def seed000_map(h, w, c, n=1):
  """Integer-generated (n, h, w, c) maps, values in [-7, 7]: every partial sum is exact."""
  n_, i, j, k = np.meshgrid(np.arange(n), np.arange(h), np.arange(w), np.arange(c), indexing="ij")
  return ((n_ * 5 + i * 7 + j * 3 + k * 11) % 15 - 7).astype(np.float32)


# ----------------------------------------------------------------------------
# Sizes.
# ----------------------------------------------------------------------------


def test_make_divisible_timm_vectors():
  # timm 1.0.31, timm/layers/helpers.py make_divisible: max(min_value or divisor,
  # int(v + divisor / 2) // divisor * divisor), plus divisor below round_limit * v; SEModule
  # (timm/layers/squeeze_excite.py) calls it as make_divisible(C * 1/16, 8, round_limit=0.).
  # By hand: C=64: int(4 + 4) // 8 * 8 = 8; C=480: int(30 + 4) // 8 * 8 = 32; C=16:
  # int(1 + 4) // 8 * 8 = 0, so the floor, 8.
  assert make_divisible(64 / 16, 8, round_limit=0.0) == 8
  assert make_divisible(480 / 16, 8, round_limit=0.0) == 32
  assert make_divisible(16 / 16, 8, round_limit=0.0) == 8
  # Hand computation with the default round_limit 0.9: 10 -> int(14) // 8 * 8 = 8 < 9, so 16.
  assert make_divisible(10, 8) == 16
  assert build(SqueezeExcitation, 480).squeeze_features == 32


def test_eca_kernel_size_vectors():
  # timm 1.0.31, timm/layers/eca.py EcaModule.__init__: t = int(abs(math.log(C, 2) + beta) /
  # gamma), kernel_size = max(t if t % 2 else t + 1, 3), with gamma=2, beta=1; the paper's
  # eq. 12 (Wang et al. 2020, https://arxiv.org/abs/1910.03151), |log2(C) / 2 + 1 / 2| made odd.
  # By hand: 64: int(7 / 2) = 3; 128: int(8 / 2) = 4 -> 5; 2048: int(12 / 2) = 6 -> 7.
  assert [eca_kernel_size(c) for c in (64, 128, 2048)] == [3, 5, 7]
  assert eca_kernel_size(2) == 3  # int(2 / 2) = 1, odd, but at least 3
  assert build(EfficientChannelAttention, 2048).conv.kernel.shape == (7, 1, 1)


def test_effective_se_default_gate_is_the_hard_sigmoid():
  # timm 1.0.31 EffectiveSEModule's gate_layer 'hard_sigmoid' is nn.Hardsigmoid
  # (timm/layers/create_act.py), relu6(v + 3) / 6 (CenterMask, Lee & Park 2020). A zero
  # kernel makes the projection its bias v, and a map of ones makes the output the gate of v;
  # by hand: -4 and -3 give 0, 0 gives 0.5, 1.5 gives 0.75, 3 and 9 give 1.
  ese = build(EffectiveSqueezeExcitation, 6)
  set_param(ese.fc.kernel, np.zeros((6, 6)))
  set_param(ese.fc.bias, [-4.0, -3.0, 0.0, 1.5, 3.0, 9.0])
  expected = np.tile([0.0, 0.0, 0.5, 0.75, 1.0, 1.0], (2, 3, 1))
  np.testing.assert_array_equal(apply(ese, np.ones((2, 3, 6), np.float32)), expected)


# ----------------------------------------------------------------------------
# Hand-computed gates on small maps.
# ----------------------------------------------------------------------------


def test_squeezeexcitation_hand_computed():
  # Hand computation. x is (1, 2, 2, 2): channel 0 = [1, 2, 3, 6] (mean 3), channel 1 =
  # [0, 4, 0, 4] (mean 2). fc1 = [[1], [-1]] + 0.5 -> 3 - 2 + 0.5 = 1.5, relu 1.5;
  # fc2 = [[2, -1]] + [0, 1.5] -> [3, 0]; identity gate; y = x * [3, 0].
  se = build(SqueezeExcitation, 2, 1, gate=identity)
  set_param(se.fc1.kernel, [[1.0], [-1.0]])
  set_param(se.fc1.bias, [0.5])
  set_param(se.fc2.kernel, [[2.0, -1.0]])
  set_param(se.fc2.bias, [0.0, 1.5])
  x = np.array([[[1.0, 0.0], [2.0, 4.0]], [[3.0, 0.0], [6.0, 4.0]]], np.float32)[None]
  y = apply(se, x)
  np.testing.assert_array_equal(y[0, ..., 0], [[3.0, 6.0], [9.0, 18.0]])
  np.testing.assert_array_equal(y[0, ..., 1], [[0.0, 0.0], [0.0, 0.0]])


def test_squeezeexcitation_seed000_one_pixel_gate_12x20():
  # seed 000: a one-pixel gate multiplying a 12x20 map with equal channel counts. With
  # identity maps the gate is the pooled mean itself, so the output is bit-exact against
  # the closed form x * (float32(sum) / float32(240)) per channel.
  c = 4
  se = build(SqueezeExcitation, c, c, activation=identity, gate=identity, use_bias=False)
  set_param(se.fc1.kernel, np.eye(c))
  set_param(se.fc2.kernel, np.eye(c))
  x = seed000_map(12, 20, c)
  pooled = x.astype(np.int64).sum(axis=(1, 2), keepdims=True).astype(np.float32) / np.float32(240)
  np.testing.assert_array_equal(se(x), x * pooled)
  np.testing.assert_array_equal(apply(se, x), x * pooled)


def test_effectivesqueezeexcitation_hand_computed():
  # Hand computation: channel means [3, -6] (unbatched 1x2 map), fc = identity with bias
  # [0, 4.5] -> [3, -1.5]; hard sigmoid relu6(v + 3) / 6 -> [1, 0.25].
  ese = build(EffectiveSqueezeExcitation, 2)
  set_param(ese.fc.kernel, np.eye(2))
  set_param(ese.fc.bias, [0.0, 4.5])
  x = np.array([[[2.0, -4.0], [4.0, -8.0]]], np.float32)  # (H, W, C) = (1, 2, 2)
  np.testing.assert_array_equal(apply(ese, x), [[[2.0, -1.0], [4.0, -2.0]]])


def test_efficientchannelattention_hand_computed():
  # Hand computation: channel means [1, 2, 3, 4] convolved (cross-correlation, zero
  # padding 1) with [1, 10, 100]: out[c] = p[c-1] + 10 p[c] + 100 p[c+1]
  # = [210, 321, 432, 43]; identity gate; the 1-D input (L=1) is scaled by that.
  eca = build(EfficientChannelAttention, 4, 3, gate=identity, num_spatial_dims=1)
  set_param(eca.conv.kernel, np.array([1.0, 10.0, 100.0]).reshape(3, 1, 1))
  x = np.array([[[1.0, 2.0, 3.0, 4.0]]], np.float32)  # (N, L, C) = (1, 1, 4)
  np.testing.assert_array_equal(apply(eca, x), [[[210.0, 642.0, 1296.0, 172.0]]])


def test_cbam_hand_computed():
  # Hand computation, identity gates. x (1, 1, 2, 2) has cells a = [2, 4] and b = [6, 10].
  # MLP: fc1 = [[1], [0]] (channel 0), relu, fc2 = [[1, 1]]. Channel 0 has mean 4 and max 6,
  # so both channels scale by 4 + 6 = 10: a = [20, 40], b = [60, 100]. Spatial maps
  # [mean, max] are a: [30, 40], b: [80, 100]; a 1x1 conv [1, 0] keeps the mean; the norm in
  # eval mode (mean 0, var 1) divides by sqrt(1 + 1e-5): a * 30 and b * 80, over that root.
  cbam = build(CBAM, 2, 1, spatial_kernel_size=1, gate=identity)
  set_param(cbam.fc1.kernel, [[1.0], [0.0]])
  set_param(cbam.fc2.kernel, [[1.0, 1.0]])
  set_param(cbam.spatial_conv.kernel, np.array([1.0, 0.0]).reshape(1, 1, 2, 1))
  for variable, value in ((cbam.spatial_norm.scale, 1.0), (cbam.spatial_norm.bias, 0.0),
                          (cbam.spatial_norm.mean, 0.0), (cbam.spatial_norm.var, 1.0)):
    set_param(variable, [value])
  cbam.eval()
  x = np.array([[[[2.0, 4.0], [6.0, 10.0]]]], np.float32)
  expected = np.array([[[[600.0, 1200.0], [4800.0, 8000.0]]]]) / np.sqrt(1 + 1e-5)
  np.testing.assert_allclose(apply(cbam, x), expected, rtol=1e-6)


def test_gates_unbatched_equals_batched():
  # Each gate on one (5, 6, 16) map and on it as a batch of one, in one compiled call
  # (_gates_in_every_dtype's); CBAM in eval and in training mode.
  unbatched = _gates_in_every_dtype()[2]
  assert sorted(unbatched) == sorted([*_GATES, "cbam_training"])
  for name, (single, batched) in unbatched.items():
    assert single.shape == (5, 6, 16)
    np.testing.assert_array_equal(single, batched, err_msg=name)


# ----------------------------------------------------------------------------
# Eager and jit, errors.
# ----------------------------------------------------------------------------


_GATES = {
    "se": SqueezeExcitation,
    "ese": EffectiveSqueezeExcitation,
    "eca": EfficientChannelAttention,
    "cbam": CBAM,
}


@pytest.mark.parametrize("name", ["se_1d", "ese_3d", "eca_1d", "cbam_3d"])
def test_gates_eager_equals_jit(ranked, name):
  # The jitted output is the fixture's (below), which is checked against NumPy and PyTorch.
  r = ranked[name]
  with jax.disable_jit():  # the pooling kernels jit themselves: this runs them op by op
    eager = r["gate"](r["x"])
  assert eager.shape == r["x"].shape
  np.testing.assert_allclose(eager, r["y"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", list(_GATES))
def test_gates_refuse_channels_first(name):
  gate = build(_GATES[name], 16)
  with pytest.raises(ValueError, match=r"NCHW.*jnp.moveaxis\(x, 1, -1\)"):
    gate(np.ones((2, 16, 5, 5), np.float32))
  with pytest.raises(ValueError, match="in_features=16"):
    gate(np.ones((2, 5, 5, 8), np.float32))


def test_gates_argument_errors():
  with pytest.raises(TypeError, match="`in_features`"):
    SqueezeExcitation(8.0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="`squeeze_features`"):
    SqueezeExcitation(8, 0, rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match="`gate`"):
    EffectiveSqueezeExcitation(8, gate="sigmoid", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="`kernel_size` must be odd"):
    EfficientChannelAttention(8, 4, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="`in_features` or `kernel_size`"):
    EfficientChannelAttention(rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="`spatial_kernel_size` must be odd"):
    CBAM(8, spatial_kernel_size=6, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"so rank 3 or more; got shape \(8,\)"):
    build(SqueezeExcitation, 8)(np.ones((8,), np.float32))


def test_from_torch_key_errors():
  w = np.zeros((2, 8, 1, 1), np.float32)
  expected = r"Expected one of: fc1\.weight, fc2\.weight.*Received: fc1\.weight"
  with pytest.raises(ValueError, match=expected):
    SqueezeExcitation.from_torch({"fc1.weight": w})
  with pytest.raises(ValueError, match="Received: .*se.fc1.weight"):
    SqueezeExcitation.from_torch({"se.fc1.weight": w, "se.fc2.weight": w})
  with pytest.raises(ValueError, match="Received: extra, fc.bias, fc.weight"):
    EffectiveSqueezeExcitation.from_torch(
        {"fc.weight": np.zeros((4, 4, 1, 1)), "fc.bias": np.zeros(4), "extra": np.zeros(1)})
  with pytest.raises(ValueError, match=r"shape \(1, 1, k\)"):
    EfficientChannelAttention.from_torch({"conv.weight": np.zeros((1, 3))})
  with pytest.raises(ValueError, match="1x1 convolution"):
    SqueezeExcitation.from_torch({"fc1.weight": np.zeros((2, 8, 3, 3)),
                                  "fc2.weight": np.zeros((8, 2, 1, 1))})
  with pytest.raises(TypeError, match="do not pass in_features"):
    SqueezeExcitation.from_torch({"fc1.weight": w, "fc2.weight": np.zeros((8, 2, 1, 1))},
                                 in_features=8)


def test_from_torch_numpy_state_dict():
  # Hand computation: ECA weights from a NumPy array land in the kernel as (k, 1, 1).
  eca = EfficientChannelAttention.from_torch({"conv.weight": np.array([[[1.0, 2.0, 3.0]]])},
                                             in_features=6)
  assert eca.kernel_size == 3 and eca.in_features == 6
  np.testing.assert_array_equal(eca.conv.kernel[...][:, 0, 0], [1.0, 2.0, 3.0])


# ----------------------------------------------------------------------------
# Float64 NumPy references read from the modules' parameters, any spatial rank.
# ----------------------------------------------------------------------------


def _flat(tree) -> dict[str, np.ndarray]:
  """A state's arrays as float64, by dotted path ("fc1.kernel", "spatial_norm.mean")."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(path, simple=True, separator=".").removesuffix(".value"):
          np.asarray(leaf, np.float64) for path, leaf in leaves}


def _np_params(gate) -> dict[str, np.ndarray]:
  """The gate's parameters and batch statistics (float64, by path)."""
  return _flat(nnx.state(gate))


def _sigmoid(z):
  return 1 / (1 + np.exp(-z))


def _rounder(dtype):
  """Rounds a float64 array to ``dtype`` (once, to nearest even) and back to float64."""
  return lambda a: np.asarray(a, np.float64).astype(dtype).astype(np.float64)


def _np_conv_same(maps, kernel):
  """Cross-correlation as nnx.Conv, zero padding (k - 1) // 2: (N, *S, I) x (*K, I, O)."""
  ks, spatial = kernel.shape[:-2], maps.shape[1:-1]
  padded = np.pad(maps, [(0, 0), *(((k - 1) // 2,) * 2 for k in ks), (0, 0)])
  return sum(padded[(slice(None), *(slice(o, o + n) for o, n in zip(offset, spatial, strict=True)))]
             @ kernel[offset] for offset in itertools.product(*map(range, ks)))


def _np_gate(kind, p, x, rnd=lambda a: a, batch_statistics=False):
  """The gate ``kind`` in float64 NumPy, from its parameters ``p``, on (N, *spatial, C).

  ``rnd`` rounds where the module documents rounding to the input's dtype (the means
  and the product; the scale stays in full precision). CBAM normalises with the running
  statistics, or with the batch's (biased variance) when ``batch_statistics``.
  """
  space = tuple(range(1, x.ndim - 1))
  mean = rnd(x.mean(axis=space, keepdims=True))

  def mlp(v):
    hidden = np.maximum(v @ p["fc1.kernel"] + p.get("fc1.bias", 0.0), 0)
    return hidden @ p["fc2.kernel"] + p.get("fc2.bias", 0.0)

  if kind == "se":  # Hu et al. 2018: x * sigmoid(W2 relu(W1 mean + b1) + b2)
    return rnd(x * _sigmoid(mlp(mean)))
  if kind == "ese":  # Lee & Park 2020: x * hard_sigmoid(W mean + b), relu6(v + 3) / 6
    return rnd(x * np.clip(mean @ p["fc.kernel"] + p["fc.bias"] + 3, 0, 6) / 6)
  if kind == "eca":  # Wang et al. 2020: cross-correlation over channels, zero padded
    w = p["conv.kernel"][:, 0, 0]
    k, c = len(w), x.shape[-1]
    padded = np.pad(mean, [(0, 0)] * (x.ndim - 1) + [((k - 1) // 2,) * 2])
    return rnd(x * _sigmoid(sum(w[j] * padded[..., j:j + c] for j in range(k))))
  # Woo et al. 2018, as timm's CbamModule: a channel gate from mean and max, then a spatial
  # gate from [mean over C, max over C], a zero-padded convolution and a BatchNorm.
  x1 = rnd(x * _sigmoid(mlp(mean) + mlp(x.max(axis=space, keepdims=True))))
  maps = np.concatenate([rnd(x1.mean(-1, keepdims=True)), x1.max(-1, keepdims=True)], -1)
  conv = _np_conv_same(maps, p["spatial_conv.kernel"])
  mu, var = ((conv.mean(), conv.var()) if batch_statistics
             else (p["spatial_norm.mean"], p["spatial_norm.var"]))
  z = (conv - mu) / np.sqrt(var + 1e-5) * p["spatial_norm.scale"] + p["spatial_norm.bias"]
  return rnd(x1 * _sigmoid(z))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason=(
    "XLA:GPU's float32 division is not correctly rounded (H200, jax 0.11.2: x / 5 one ULP "
    "off for 1 integer x in 5), so neither is the mean"))
def test_cbam_channel_mean_is_a_correctly_rounded_division():
  # CBAM's spatial gate reads the mean over channels. It is the float32 sum divided by C,
  # correctly rounded (PyTorch's x.mean(dim=1)); jnp.mean is XLA:CPU's sum * (1/C), one ULP
  # off for about 1 sum in 5 when C = 5. Set up so that the output is x * mean exactly:
  # zero MLP kernels and biases 0.5 give a channel scale of 1 (identity gate); the 1x1
  # convolution [1, 0] keeps the mean; the norm has mean 0, var + 1e-5 = 1 in float32
  # (rsqrt 1), scale 1, bias 0. Integer x makes every sum exact, so the expectation is
  # NumPy's float32 division, rounded once more by the product.
  cbam = build(CBAM, 5, 1, spatial_kernel_size=1, gate=identity, use_bias=True)
  set_param(cbam.fc1.kernel, np.zeros((5, 1)))
  set_param(cbam.fc2.kernel, np.zeros((1, 5)))
  set_param(cbam.fc1.bias, [0.0])
  set_param(cbam.fc2.bias, np.full(5, 0.5))
  set_param(cbam.spatial_conv.kernel, np.array([1.0, 0.0]).reshape(1, 1, 2, 1))
  norm = cbam.spatial_norm
  set_param(norm.var, [np.float32(1) - np.float32(1e-5)])
  for variable, value in ((norm.scale, 1.0), (norm.bias, 0.0), (norm.mean, 0.0)):
    set_param(variable, [value])
  cbam.eval()
  x = np.random.default_rng(2).integers(-50, 51, (1, 8, 8, 5)).astype(np.float32)
  mean = x.sum(-1, keepdims=True) / np.float32(5)  # exact sums, one correctly rounded division
  np.testing.assert_array_equal(apply(cbam, x), x * mean)


_DTYPES = [jnp.bfloat16, jnp.float16, jnp.float32]


@functools.cache
def _gates_in_every_dtype():
  """The four gates (seed 3, ``precision="highest"``, CBAM in eval mode) and ``"cbam_default"``,
  the same CBAM with ``precision=DEFAULT`` (for test_gates_precision_reaches_every_layer); one
  (2, 5, 6, 16) standard normal input (seed 7) in each dtype of _DTYPES; and from one compiled
  call for all, each gate's output in each dtype (cbam_default's in float32), and each gate's
  output (and "cbam_training"'s, CBAM in training mode) on the float32 input's first map
  unbatched and batched, (5, 6, 16) and (1, 5, 6, 16) (for test_gates_unbatched_equals_batched).
  A program per dtype and one for the unbatched maps (8-channel gates then) took 1.6 s of
  compile CPU in 4 programs (compile census)."""
  gates = {}
  for name, cls in _GATES.items():
    gates[name] = build(cls, 16, seed=3, precision="highest")
    if name == "cbam":
      gates[name].eval()  # the reference uses the running statistics (mean 1, var 1 from build)
  gates["cbam_default"] = build(CBAM, 16, seed=3, precision=lax.Precision.DEFAULT)
  gates["cbam_default"].eval()
  # CBAM as built, in training mode (batch statistics), for the unbatched maps.
  gates["cbam_training"] = build(CBAM, 16, seed=3, precision="highest")
  values = np.random.default_rng(7).standard_normal((2, 5, 6, 16))
  xs = [values.astype(dtype) for dtype in _DTYPES]

  def run(gates, xs):
    outputs = [{name: gates[name](x) for name in (*_GATES, "cbam_default")
                if name != "cbam_default" or x.dtype == jnp.float32} for x in xs]
    first = xs[_DTYPES.index(jnp.float32)][0]
    unbatched = {name: (gates[name](first), gates[name](first[None])[0])
                 for name in (*_GATES, "cbam_training")}
    return outputs, unbatched

  outputs, unbatched = jax.device_get(nnx.jit(run)(gates, xs))
  return gates, dict(zip(_DTYPES, zip(xs, outputs, strict=True), strict=True)), unbatched


def _gates_in_dtype(dtype):
  """The gates, the input in ``dtype`` and each gate's output on it (_gates_in_every_dtype)."""
  gates, by_dtype, _ = _gates_in_every_dtype()
  x, outputs = by_dtype[dtype]
  return gates, x, outputs


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("name", list(_GATES))
def test_gates_keep_the_input_dtype(name, dtype):
  # Issue 21 item 1: bfloat16 and float16 came back float32 (x * scale promoted). Expected
  # values: the gate in float64 NumPy from the module's own parameters, rounded to the
  # input's dtype where the gate rounds (documented in nnx_pool._gates).
  # Tolerance for float16/bfloat16: the module's scale is float32, the reference's float64,
  # so a product near a rounding boundary may round the other way: 1 ULP of the input's
  # dtype (rtol eps bounds 1 ULP of a normal number, atol one subnormal step). CBAM rounds
  # twice in a row (the channel-gated map, then the output): 2 ULPs. Measured over seeds
  # 3-5: at most 1 ULP for every gate, on at most 0.4% of the elements.
  # float32: the scale's own float32 arithmetic (a 7x7 convolution, exp) is a few ULPs
  # off the float64 one (measured: 3 ULPs, CBAM 14); rtol 1e-5, the regression kit's.
  # precision="highest" keeps float32 products float32 on a GPU too (DEFAULT is TF32 there).
  gates, x, outputs = _gates_in_dtype(dtype)
  gate, y = gates[name], outputs[name]
  assert y.dtype == x.dtype
  expected = _np_gate(name, _np_params(gate), np.asarray(x, np.float64), _rounder(dtype))
  ulps = 2 if name == "cbam" else 1
  info = jnp.finfo(dtype)
  rtol, atol = ((1e-5, 0.0) if dtype == jnp.float32
                else (ulps * float(info.eps), ulps * float(info.smallest_subnormal)))
  np.testing.assert_allclose(np.asarray(y, np.float64), expected, rtol=rtol, atol=atol)
  if dtype == jnp.bfloat16 and name in ("ese", "cbam"):
    # Eager (op by op, the pooling kernels' own jit disabled): the same dtype. One
    # low-precision dtype per gate: float16 takes the same promotion and cast back as
    # bfloat16. SE, ESE and ECA set the dtype in the same two places, the squeeze
    # (spatial_mean) and the rounding of x * scale (nnx_pool._gates._scaled): ESE takes them
    # eagerly for the three (with SE's, se-bfloat16 took 1.86 s, --durations; without,
    # 0.33 s). CBAM's channel mean and its two gated maps are its own. Only the dtype is the
    # point, so the op-by-op path is traced (jax.eval_shape under jax.disable_jit), not run:
    # each op's dtype is its abstract evaluation's either way, and running them compiled 54
    # programs, 1.4 s of CPU (compile census). test_gates_eager_equals_jit runs gates eagerly.
    with jax.disable_jit():
      assert jax.eval_shape(gate, x[:1]).dtype == x.dtype


# ----------------------------------------------------------------------------
# PyTorch 2.13 parity: the peers' modules written here from their sources, timm 1.0.31
# (timm/layers/squeeze_excite.py SEModule and EffectiveSEModule, eca.py EcaModule, cbam.py
# CbamModule, models/_efficientnet_blocks.py SqueezeExcite) and torchvision 0.28
# (torchvision/ops/misc.py SqueezeExcitation).
# ----------------------------------------------------------------------------


def _timm_make_divisible(v, divisor=8, min_value=None, round_limit=0.9):
  # timm 1.0.31 timm/layers/helpers.py make_divisible, copied from the source (not our copy).
  min_value = min_value or divisor
  new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
  return new_v + divisor if new_v < round_limit * v else new_v


def _timm_eca_kernel_size(channels, gamma=2, beta=1):
  # timm 1.0.31 timm/layers/eca.py EcaModule.__init__'s rule, from the source (not our copy).
  t = int(abs(math.log(channels, 2) + beta) / gamma)
  return max(t if t % 2 else t + 1, 3)


def _torch_peers(torch):
  """The peer modules, with their attribute (state-dict key) names."""
  nn, F = torch.nn, torch.nn.functional

  class TorchvisionSqueezeExcitation(nn.Module):  # torchvision.ops.SqueezeExcitation
    def __init__(self, input_channels, squeeze_channels):
      super().__init__()
      self.avgpool = nn.AdaptiveAvgPool2d(1)
      self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
      self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
      self.activation, self.scale_activation = nn.ReLU(), nn.Sigmoid()

    def forward(self, x):
      scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
      return scale * x

  class SEModule(nn.Module):  # timm.layers.squeeze_excite.SEModule
    def __init__(self, channels, rd_ratio=1 / 16, rd_divisor=8, bias=True):
      super().__init__()
      rd_channels = _timm_make_divisible(channels * rd_ratio, rd_divisor, round_limit=0.0)
      self.fc1 = nn.Conv2d(channels, rd_channels, kernel_size=1, bias=bias)
      self.act = nn.ReLU()
      self.fc2 = nn.Conv2d(rd_channels, channels, kernel_size=1, bias=bias)

    def forward(self, x):
      x_se = self.fc2(self.act(self.fc1(x.mean((2, 3), keepdim=True))))
      return x * torch.sigmoid(x_se)

  class SqueezeExcite(nn.Module):  # timm efficientnet_blocks.SqueezeExcite, SiLU as in EfficientNet
    def __init__(self, in_chs, rd_ratio=0.25):
      super().__init__()
      rd_channels = round(in_chs * rd_ratio)
      self.conv_reduce = nn.Conv2d(in_chs, rd_channels, 1, bias=True)
      self.act1 = nn.SiLU()
      self.conv_expand = nn.Conv2d(rd_channels, in_chs, 1, bias=True)

    def forward(self, x):
      x_se = self.conv_expand(self.act1(self.conv_reduce(x.mean((2, 3), keepdim=True))))
      return x * torch.sigmoid(x_se)

  class EffectiveSEModule(nn.Module):  # timm.layers.squeeze_excite.EffectiveSEModule
    def __init__(self, channels):
      super().__init__()
      self.fc = nn.Conv2d(channels, channels, kernel_size=1, padding=0)

    def forward(self, x):
      x_se = self.fc(x.mean((2, 3), keepdim=True))
      return x * (F.relu6(x_se + 3.0) / 6.0)

  class EcaModule(nn.Module):  # timm.layers.eca.EcaModule (use_mlp=False)
    def __init__(self, channels, gamma=2, beta=1):
      super().__init__()
      kernel_size = _timm_eca_kernel_size(channels, gamma, beta)
      self.conv = nn.Conv1d(1, 1, kernel_size=kernel_size, padding=(kernel_size - 1) // 2,
                            bias=False)

    def forward(self, x):
      y = x.mean((2, 3)).view(x.shape[0], 1, -1)
      y = torch.sigmoid(self.conv(y)).view(x.shape[0], -1, 1, 1)
      return x * y.expand_as(x)

  class ConvNormAct(nn.Module):  # timm ConvNormAct(2, 1, k, apply_act=False)
    def __init__(self, k):
      super().__init__()
      self.conv = nn.Conv2d(2, 1, k, padding=(k - 1) // 2, bias=False)
      self.bn = nn.BatchNorm2d(1)

    def forward(self, x):
      return self.bn(self.conv(x))

  class ChannelAttn(nn.Module):
    def __init__(self, channels, rd_ratio=1 / 16, rd_divisor=1, mlp_bias=False):
      super().__init__()
      rd_channels = _timm_make_divisible(channels * rd_ratio, rd_divisor, round_limit=0.0)
      self.fc1 = nn.Conv2d(channels, rd_channels, 1, bias=mlp_bias)
      self.act = nn.ReLU()
      self.fc2 = nn.Conv2d(rd_channels, channels, 1, bias=mlp_bias)

    def forward(self, x):
      x_avg = self.fc2(self.act(self.fc1(x.mean((2, 3), keepdim=True))))
      x_max = self.fc2(self.act(self.fc1(x.amax((2, 3), keepdim=True))))
      return x * torch.sigmoid(x_avg + x_max)

  class SpatialAttn(nn.Module):
    def __init__(self, kernel_size=7):
      super().__init__()
      self.conv = ConvNormAct(kernel_size)

    def forward(self, x):
      x_attn = torch.cat([x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1)
      return x * torch.sigmoid(self.conv(x_attn))

  class CbamModule(nn.Module):  # timm.layers.cbam.CbamModule
    def __init__(self, channels, spatial_kernel_size=7, mlp_bias=False):
      super().__init__()
      self.channel = ChannelAttn(channels, mlp_bias=mlp_bias)
      self.spatial = SpatialAttn(spatial_kernel_size)

    def forward(self, x):
      return self.spatial(self.channel(x))

  return dict(tv_se=TorchvisionSqueezeExcitation, se=SEModule, effnet_se=SqueezeExcite,
              ese=EffectiveSEModule, eca=EcaModule, cbam=CbamModule)


def _parity_cases(peers):
  """(name, torch module, ours from its state dict, input shape NCHW)."""
  return [
      ("torchvision_se", peers["tv_se"](24, 6), {}, (2, 24, 5, 7)),
      ("timm_se_c64", peers["se"](64), {}, (2, 64, 4, 4)),
      ("timm_se_nobias", peers["se"](32, bias=False), {}, (2, 32, 3, 5)),
      ("timm_effnet_se_silu", peers["effnet_se"](32), {"activation": nnx.silu}, (2, 32, 6, 6)),
      ("timm_ese", peers["ese"](24), {}, (2, 24, 5, 5)),
      ("timm_eca_c64", peers["eca"](64), {}, (2, 64, 3, 3)),
      ("timm_eca_c128", peers["eca"](128), {}, (2, 128, 3, 4)),
      ("timm_cbam", peers["cbam"](32), {}, (2, 32, 9, 8)),
      ("timm_cbam_bias_k3", peers["cbam"](16, 3, mlp_bias=True), {}, (3, 16, 5, 6)),
  ]


_FROM_TORCH = {"torchvision_se": SqueezeExcitation, "timm_se_c64": SqueezeExcitation,
               "timm_se_nobias": SqueezeExcitation, "timm_effnet_se_silu": SqueezeExcitation,
               "timm_ese": EffectiveSqueezeExcitation, "timm_eca_c64": EfficientChannelAttention,
               "timm_eca_c128": EfficientChannelAttention, "timm_cbam": CBAM,
               "timm_cbam_bias_k3": CBAM}


def test_gates_match_pytorch_peers():
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  torch.manual_seed(0)
  rng = np.random.default_rng(5)
  names, gates, inputs, expected = [], [], [], []
  for name, peer, options, shape in _parity_cases(_torch_peers(torch)):
    with torch.no_grad():  # random, non-trivial BatchNorm statistics and affine terms
      for module in peer.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
          module.running_mean.uniform_(-1, 1)
          module.running_var.uniform_(0.5, 2)
          module.weight.uniform_(0.5, 1.5)
          module.bias.uniform_(-0.5, 0.5)
    # precision="highest": float32 products stay float32 on a GPU too (DEFAULT is TF32 there)
    ours = _FROM_TORCH[name].from_torch(peer.state_dict(), precision="highest", **options)
    peer.eval()
    ours.eval()
    x = rng.standard_normal(shape).astype(np.float32)
    with torch.no_grad():
      expected.append(peer(torch.from_numpy(x)).numpy())
    names.append(name)
    gates.append(ours)
    inputs.append(np.moveaxis(x, 1, -1))
  # One compiled call for all (each compile costs more than these small gates run).
  outputs = nnx.jit(lambda gates, xs: [g(x) for g, x in zip(gates, xs, strict=True)])(gates, inputs)
  for name, got, want in zip(names, outputs, expected, strict=True):
    np.testing.assert_allclose(np.moveaxis(np.asarray(got), -1, 1), want, rtol=1e-5, atol=1e-5,
                               err_msg=name)


def test_cbam_training_mode_matches_pytorch():
  # In training mode both normalise with the batch statistics (biased variance).
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  torch.manual_seed(1)
  peer = _torch_peers(torch)["cbam"](16)
  ours = CBAM.from_torch(peer.state_dict(), precision="highest")
  x = np.random.default_rng(6).standard_normal((4, 16, 6, 6)).astype(np.float32)
  expected = peer.train()(torch.from_numpy(x)).detach().numpy()
  got = np.moveaxis(np.asarray(apply(ours, np.moveaxis(x, 1, -1))), -1, 1)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# Every gate in 1 and 3 spatial dims: values and gradients against NumPy and PyTorch (2-D:
# the parity tests above).
# ----------------------------------------------------------------------------


# (class, positional arguments, options, input shape (N, *spatial, C)).
# What depends on the rank is shared by SE, ESE and ECA (nnx_pool._gates._Gate._prepare, the
# squeeze nnx_pool._numerics.spatial_mean and the scaling _gates._scaled): se_1d and eca_1d
# cover it in 1-D, ese_3d in 3-D, values and gradients. CBAM's spatial convolution follows
# the rank: both ranks. (se_3d, ese_1d and eca_3d took those shared paths again; without
# them the one program's compile went from 2.6 s to 2.1 s of CPU, compile census.)
# se_1d and eca_1d take one input shape, so that their op-by-op runs
# (test_gates_eager_equals_jit) share the squeeze's and the scaling's programs.
_RANKED = {
    "se_1d": (SqueezeExcitation, (8, 2), {}, (2, 6, 8)),
    "ese_3d": (EffectiveSqueezeExcitation, (5,), {}, (2, 3, 2, 4, 5)),
    "eca_1d": (EfficientChannelAttention, (8, 3), {}, (2, 6, 8)),
    "cbam_1d": (CBAM, (8, 2), {"spatial_kernel_size": 5}, (2, 9, 8)),
    "cbam_3d": (CBAM, (8, 2), {"spatial_kernel_size": 3, "use_bias": True}, (2, 3, 4, 5, 8)),
}


@pytest.fixture(scope="module")
def ranked():
  return _run_gates(_RANKED)


def _run_gates(configs):
  """Each gate of ``configs`` with seeded parameters, its input ``x``, a cotangent ``g``, and
  the gate's output ``y`` with the gradients of ``sum(y * g)``, all from one compiled call."""
  rng = np.random.default_rng(11)
  gates, xs, gs = [], [], []
  for i, (cls, args, options, shape) in enumerate(configs.values()):
    gate = build(cls, *args, seed=20 + i, num_spatial_dims=len(shape) - 2,
                 precision="highest", **options)
    if cls is CBAM:  # running statistics apart from each other and from 0 and 1
      set_param(gate.spatial_norm.mean, [0.3])
      set_param(gate.spatial_norm.var, [1.7])
      gate.eval()
    gates.append(gate)
    xs.append(rng.standard_normal(shape).astype(np.float32))
    gs.append(rng.standard_normal(shape).astype(np.float32))

  def loss(gate, x, g):
    y = gate(x)
    return jnp.sum(y * g), y

  @nnx.jit
  def run(gates, xs, gs):
    step = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    return [step(gate, x, g) for gate, x, g in zip(gates, xs, gs, strict=True)]

  out = {}
  for name, gate, x, g, ((_, y), (grad_gate, grad_x)) in zip(
      configs, gates, xs, gs, run(gates, xs, gs), strict=True):
    out[name] = dict(gate=gate, x=x, g=g, y=np.asarray(y), grad_x=np.asarray(grad_x),
                     grads=_flat(grad_gate))
  return out


@pytest.mark.parametrize("name", list(_RANKED))
def test_gates_any_rank_match_numpy_values_and_gradients(ranked, name):
  # Values: the float64 NumPy gate from the module's own parameters. Gradients: each one's
  # directional derivative along a random direction, against central differences of that
  # float64 NumPy gate (step 1e-6: truncation ~1e-12, cancellation ~1e-10).
  r, kind = ranked[name], name.split("_")[0]
  p, x, g = _np_params(r["gate"]), r["x"].astype(np.float64), r["g"].astype(np.float64)
  np.testing.assert_allclose(r["y"], _np_gate(kind, p, x), rtol=1e-5, atol=1e-6)
  trainable = sorted(_flat(nnx.state(r["gate"], nnx.Param)))
  assert sorted(r["grads"]) == trainable  # a gradient for every parameter

  def loss(params, inputs):
    return float(np.sum(_np_gate(kind, params, inputs) * g))

  rng, h = np.random.default_rng(12), 1e-6
  dx = rng.standard_normal(x.shape)
  numeric = (loss(p, x + h * dx) - loss(p, x - h * dx)) / (2 * h)
  np.testing.assert_allclose(np.sum(r["grad_x"] * dx), numeric, rtol=1e-4, atol=1e-5)
  for path in trainable:
    d = rng.standard_normal(p[path].shape)
    numeric = (loss({**p, path: p[path] + h * d}, x) - loss({**p, path: p[path] - h * d}, x)) / (
        2 * h)
    np.testing.assert_allclose(np.sum(r["grads"][path] * d), numeric, rtol=1e-4, atol=1e-5,
                               err_msg=path)


def _torch_layout(nd):
  """NNX path -> (PyTorch name, NNX value -> PyTorch layout, PyTorch grad -> NNX layout).

  Written out: an (in, out) kernel is the (out, in, 1, ...) weight of a 1x1 convolution in
  ``nd`` dims; a convolution kernel (*k, in, out) is PyTorch's (out, in, *k); ECA's (k, 1, 1)
  is Conv1d's (1, 1, k); the BatchNorm's scale, bias, mean and var are weight, bias,
  running_mean and running_var.
  """
  def pointwise(k):
    return k.T.reshape(*k.T.shape, *(1,) * nd)

  def from_pointwise(w):
    return w.reshape(w.shape[:2]).T

  def conv(k):
    return np.moveaxis(k, (-1, -2), (0, 1))

  def from_conv(w):
    return np.moveaxis(w, (0, 1), (-1, -2))

  def same(v):
    return v

  layout = {f"{layer}.kernel": (f"{layer}.weight", pointwise, from_pointwise)
            for layer in ("fc1", "fc2", "fc")}
  layout |= {f"{layer}.bias": (f"{layer}.bias", same, same) for layer in ("fc1", "fc2", "fc")}
  layout["conv.kernel"] = ("conv.weight", lambda k: k.transpose(2, 1, 0),
                           lambda w: w.transpose(2, 1, 0))
  layout["spatial_conv.kernel"] = ("spatial.weight", conv, from_conv)
  layout |= {f"spatial_norm.{ours}": (f"bn.{theirs}", same, same) for ours, theirs in
             (("scale", "weight"), ("bias", "bias"), ("mean", "running_mean"),
              ("var", "running_var"))}
  return layout


def _torch_gate(torch, kind, p, x):
  """The peers' forward passes, written with torch.nn.functional in 1, 2 or 3 spatial dims.

  Each is its source's forward with Conv2d generalised to ConvNd and the mean over (2, 3)
  to the mean over every spatial dim; the sources are timm 1.0.31 and torchvision 0.28.
  """
  F = torch.nn.functional
  nd = x.ndim - 2
  conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
  space = tuple(range(2, x.ndim))

  def mlp(v):  # fc1 (1x1 conv), ReLU, fc2 (1x1 conv)
    return conv(F.relu(conv(v, p["fc1.weight"], p.get("fc1.bias"))), p["fc2.weight"],
                p.get("fc2.bias"))

  if kind == "se":  # timm/layers/squeeze_excite.py SEModule.forward; torchvision/ops/misc.py
    return x * torch.sigmoid(mlp(x.mean(space, keepdim=True)))  # SqueezeExcitation.forward
  if kind == "ese":  # squeeze_excite.py EffectiveSEModule.forward, gate nn.Hardsigmoid
    return x * F.hardsigmoid(conv(x.mean(space, keepdim=True), p["fc.weight"], p["fc.bias"]))
  if kind == "eca":  # timm/layers/eca.py EcaModule.forward (use_mlp=False)
    k = p["conv.weight"].shape[-1]
    y = F.conv1d(x.mean(space).view(x.shape[0], 1, -1), p["conv.weight"], padding=(k - 1) // 2)
    return x * torch.sigmoid(y).view(x.shape[0], -1, *(1,) * nd).expand_as(x)
  # timm/layers/cbam.py CbamModule.forward: ChannelAttn.forward, then SpatialAttn.forward
  # (ConvNormAct(2, 1, k, apply_act=False): a conv without bias, then BatchNorm, eval mode).
  x = x * torch.sigmoid(mlp(x.mean(space, keepdim=True)) + mlp(x.amax(space, keepdim=True)))
  maps = torch.cat([x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1)
  k = p["spatial.weight"].shape[-1]
  z = F.batch_norm(conv(maps, p["spatial.weight"], padding=(k - 1) // 2), p["bn.running_mean"],
                   p["bn.running_var"], p["bn.weight"], p["bn.bias"], training=False, eps=1e-5)
  return x * torch.sigmoid(z)


@pytest.mark.parametrize("name", list(_RANKED))
def test_gates_any_rank_match_pytorch_values_and_gradients(ranked, name):
  # PyTorch 2.13 CPU, float32: the output and the gradients of sum(y * g) with respect to
  # the input and every parameter, from autograd.
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  r, kind = ranked[name], name.split("_")[0]
  layout = _torch_layout(r["x"].ndim - 2)
  trainable = set(r["grads"])
  theirs = {layout[path][0]: torch.tensor(layout[path][1](value), dtype=torch.float32,
                                          requires_grad=path in trainable)
            for path, value in _np_params(r["gate"]).items()}
  x = torch.tensor(np.moveaxis(r["x"], -1, 1), requires_grad=True)
  y = _torch_gate(torch, kind, theirs, x)
  y.backward(torch.tensor(np.moveaxis(r["g"], -1, 1)))
  np.testing.assert_allclose(r["y"], np.moveaxis(y.detach().numpy(), 1, -1), rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(r["grad_x"], np.moveaxis(x.grad.numpy(), 1, -1), rtol=1e-5,
                             atol=1e-5)
  for path in trainable:
    name_there, _, back = layout[path]
    np.testing.assert_allclose(r["grads"][path], back(theirs[name_there].grad.numpy()),
                               rtol=1e-5, atol=1e-5, err_msg=path)


# ----------------------------------------------------------------------------
# Flax's layer options: kernel_init, bias_init, precision, use_running_average.
# ----------------------------------------------------------------------------


def _layers(gate):
  """The gate's Linear and Conv layers."""
  return [layer for name in ("fc1", "fc2", "fc", "conv", "spatial_conv")
          if (layer := getattr(gate, name, None)) is not None]


def test_gates_kernel_init_and_bias_init_reach_every_layer():
  # Issue 21 item 12: constant initializers give exactly those constants in every kernel
  # and bias (EfficientChannelAttention has no bias, so no bias_init). CBAM's BatchNorm
  # keeps Flax's scale 1 and bias 0.
  inits = dict(kernel_init=nnx.initializers.constant(0.25),
               bias_init=nnx.initializers.constant(-0.5))
  gates = nnx.jit(lambda: [  # one compiled program: eager initialisers compile one by one
      SqueezeExcitation(8, 2, **inits, rngs=nnx.Rngs(0)),
      EffectiveSqueezeExcitation(4, **inits, rngs=nnx.Rngs(0)),
      EfficientChannelAttention(8, 3, kernel_init=inits["kernel_init"], rngs=nnx.Rngs(0)),
      CBAM(8, 2, spatial_kernel_size=3, use_bias=True, **inits, rngs=nnx.Rngs(0))])()
  assert [len(_layers(gate)) for gate in gates] == [2, 1, 1, 3]
  for gate in gates:
    for layer in _layers(gate):
      kernel = np.asarray(layer.kernel[...])
      np.testing.assert_array_equal(kernel, np.full(kernel.shape, 0.25))
      if layer.bias is not None:
        np.testing.assert_array_equal(layer.bias[...], np.full(layer.bias.shape, -0.5))
  np.testing.assert_array_equal(gates[3].spatial_norm.scale[...], [1.0])
  np.testing.assert_array_equal(gates[3].spatial_norm.bias[...], [0.0])


def test_gates_default_initializers_are_flax_layers():
  # The defaults are Flax's own: the same seed gives the same parameters as nnx.Linear and
  # nnx.Conv with their defaults, built in the gate's order from one Rngs.
  def make():  # one compiled program: eager initialisers compile one by one
    rngs = nnx.Rngs(3)
    flax_layers = (nnx.Linear(8, 2, rngs=rngs), nnx.Linear(2, 8, rngs=rngs),
                   nnx.Conv(1, 1, (3,), use_bias=False, rngs=nnx.Rngs(4)))
    gates = (SqueezeExcitation(8, 2, rngs=nnx.Rngs(3)),
             EfficientChannelAttention(8, 3, rngs=nnx.Rngs(4)))
    return flax_layers, gates

  (fc1, fc2, conv), (se, eca) = nnx.jit(make)()
  for ours, flax_layer in ((se.fc1, fc1), (se.fc2, fc2)):
    np.testing.assert_array_equal(ours.kernel[...], flax_layer.kernel[...])
    np.testing.assert_array_equal(ours.bias[...], flax_layer.bias[...])
  np.testing.assert_array_equal(eca.conv.kernel[...], conv.kernel[...])


def _jax_accepts_precision(precision) -> bool:
  """JAX's own verdict: lax.dot traced (not run) with ``precision``."""
  try:
    jax.eval_shape(lambda: lax.dot(jnp.ones((2, 2)), jnp.ones((2, 2)), precision=precision))
  except (TypeError, ValueError):
    return False
  return True


_PRECISIONS_ACCEPTED = [None, "highest", "float32", "tensorfloat32", lax.Precision.HIGH,
                        ("highest", "default"), (lax.Precision.HIGH, lax.Precision.DEFAULT),
                        lax.DotAlgorithmPreset.F32_F32_F32, "F32_F32_F32"]
_PRECISIONS_REFUSED = [("hihgest", ValueError), ("HIGHEST", ValueError),
                       (("highest",), ValueError), ((lax.Precision.HIGH, "highest"), ValueError),
                       (3, TypeError), (1.0, TypeError)]


def test_gates_precision_reaches_every_layer():
  # Issue 21 item 12: precision is passed to every Linear and Conv, as Flax takes it (the
  # accepted and refused forms are checked against JAX's own lax.dot), and checked when the
  # gate is built, not when it first runs.
  for precision in _PRECISIONS_ACCEPTED:
    assert _jax_accepts_precision(precision), precision
    for cls in (SqueezeExcitation, EffectiveSqueezeExcitation, EfficientChannelAttention, CBAM):
      gate = build(cls, 8, precision=precision)
      assert all(layer.precision == precision for layer in _layers(gate)), (cls, precision)
  for precision, error in _PRECISIONS_REFUSED:
    assert not _jax_accepts_precision(precision), precision
    expected = rf"`precision` must be None.*; got {re.escape(repr(precision))}\."
    with pytest.raises(error, match=expected):
      build(CBAM, 8, precision=precision)
  # Both run. The gate's output agrees within TF32's rounding (a GPU's DEFAULT); on CPU,
  # where precision does not change float32 arithmetic, exactly. The same CBAM with
  # precision "highest" and DEFAULT, run in test_gates_keep_the_input_dtype's float32 program.
  gates, x, outputs = _gates_in_dtype(jnp.float32)
  assert gates["cbam_default"].spatial_conv.precision == lax.Precision.DEFAULT
  highest, default = outputs["cbam"], outputs["cbam_default"]
  assert highest.shape == default.shape == x.shape
  np.testing.assert_allclose(highest, default, rtol=1e-2, atol=1e-2)


def test_gates_initializer_errors():
  with pytest.raises(TypeError, match=r"`kernel_init` must be an initializer.*got 'lecun'\."):
    SqueezeExcitation(8, kernel_init="lecun", rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match=r"`bias_init` must be an initializer.*got None\."):
    EffectiveSqueezeExcitation(8, bias_init=None, rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match="`kernel_init` must be an initializer"):
    EfficientChannelAttention(8, kernel_init=0.1, rngs=nnx.Rngs(0))


def test_cbam_use_running_average_at_call_time():
  # Issue 21 item 12: as nnx.BatchNorm.__call__(x, use_running_average=...), the argument
  # overrides the module's mode for one call. Expected values: the float64 NumPy CBAM from
  # the module's parameters and the BatchNorm's stored statistics (running or batch).
  cbam = build(CBAM, 8, seed=4)  # training mode, as built
  norm = cbam.spatial_norm
  for variable, value in ((norm.mean, 0.3), (norm.var, 2.0), (norm.scale, 1.5),
                          (norm.bias, -0.2)):
    set_param(variable, [value])
  x = np.random.default_rng(8).standard_normal((2, 5, 6, 8)).astype(np.float32)
  x64, rnd = np.asarray(x, np.float64), _rounder(np.float32)
  np.testing.assert_allclose(apply_cbam(cbam, x, True),
                             _np_gate("cbam", _np_params(cbam), x64, rnd), rtol=1e-5, atol=1e-6)
  assert norm.use_running_average is False  # the module's mode is unchanged...
  np.testing.assert_array_equal(norm.mean[...], np.float32([0.3]))  # ...and so are the stats
  cbam.eval()
  expected = _np_gate("cbam", _np_params(cbam), x64, rnd, batch_statistics=True)
  np.testing.assert_allclose(apply_cbam(cbam, x, False), expected, rtol=1e-5, atol=1e-6)
  assert norm.use_running_average is True
  assert not np.allclose(norm.mean[...], 0.3)  # a training call updates the running mean
  with pytest.raises(TypeError, match=r"`use_running_average` must be True, False or None.*"
                                      r"got 'yes'\."):
    cbam(x, use_running_average="yes")
