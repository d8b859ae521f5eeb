"""Tests for nnx_pool._layout: several batch axes, and the channels-first warning.

Expected arrays come from the NumPy mirror (nnx_pool.reference), which pools one
``(N, *spatial, C)`` batch: a result over ``(B1, B2, *spatial, C)`` must be the
mirror's over the ``B1 * B2`` examples, reshaped back.
"""

from __future__ import annotations

import runpy
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import nnx_pool
from nnx_pool import (
  CBAM,
  AdaptiveAvgPool,
  AdaptiveMaxPool,
  AvgPool,
  ChannelsFirstWarning,
  EffectiveSqueezeExcitation,
  EfficientChannelAttention,
  GlobalAvgPool,
  GlobalMaxPool,
  LPPool,
  MaxPool,
  MaxUnpool,
  MinPool,
  SelectAdaptivePool,
  SqueezeExcitation,
  reference,
)
from nnx_pool import functional as F
from nnx_pool._layout import looks_channels_first

# Modules with seeded uniform parameters, built from shapes: no initialiser compiles.
build = runpy.run_path(str(Path(__file__).parent / "_cheap.py"))["build"]

RNG = np.random.default_rng(21)
# Two batch axes, an 8x8 map, 4 channels: distinct values, so no ties.
X = RNG.permutation(2 * 3 * 8 * 8 * 4).reshape(2, 3, 8, 8, 4).astype(np.float32)
FLAT = X.reshape(6, 8, 8, 4).astype(np.float64)


def _batched(a):
  """The mirror's (6, ...) result with the two batch axes back."""
  return np.asarray(a).reshape(2, 3, *np.asarray(a).shape[1:])


# (name, call on X, the mirror's result on FLAT)
CASES = [
    ("AvgPool", lambda x: AvgPool(3, 2, 1, count_include_pad=False)(x),
     lambda: reference.avg_pool(FLAT, (3, 3), (2, 2), ((1, 1), (1, 1)), count_include_pad=False)),
    ("avg_pool", lambda x: F.avg_pool(x, 2, 2),
     lambda: reference.avg_pool(FLAT, (2, 2), (2, 2), "VALID")),
    ("MaxPool", lambda x: MaxPool(3, 2, 1, return_indices=True)(x),
     lambda: reference.max_pool(FLAT, (3, 3), (2, 2), ((1, 1), (1, 1)))),
    ("max_pool", lambda x: F.max_pool(x, 2, 1, return_indices=True),
     lambda: reference.max_pool(FLAT, (2, 2), (1, 1), "VALID")),
    ("MinPool", lambda x: MinPool(2, ceil_mode=True)(x),
     lambda: reference.min_pool(FLAT, (2, 2), (2, 2), "VALID", ceil_mode=True)[0]),
    ("min_pool", lambda x: F.min_pool(x, 3, 3, ceil_mode=True),
     lambda: reference.min_pool(FLAT, (3, 3), (3, 3), "VALID", ceil_mode=True)[0]),
    ("LPPool", lambda x: LPPool(2, 2)(x), lambda: reference.lp_pool(FLAT, 2, (2, 2), (2, 2))),
    ("lp_pool", lambda x: F.lp_pool(x, 2, 3, 2),
     lambda: reference.lp_pool(FLAT, 2, (3, 3), (2, 2))),
    ("GlobalAvgPool", lambda x: GlobalAvgPool()(x), lambda: reference.global_avg_pool(FLAT)),
    ("global_max_pool", lambda x: F.global_max_pool(x), lambda: reference.global_max_pool(FLAT)),
    ("GlobalMaxPool keepdims", lambda x: GlobalMaxPool(keepdims=True)(x),
     lambda: reference.global_max_pool(FLAT)[:, None, None, :]),
    ("AdaptiveAvgPool", lambda x: AdaptiveAvgPool((3, 5))(x),
     lambda: reference.adaptive_avg_pool(FLAT, (3, 5))),
    ("adaptive_avg_pool", lambda x: F.adaptive_avg_pool(x, 3),
     lambda: reference.adaptive_avg_pool(FLAT, (3, 3))),
    ("AdaptiveMaxPool", lambda x: AdaptiveMaxPool(3, return_indices=True)(x),
     lambda: reference.adaptive_max_pool(FLAT, (3, 3))),
    ("adaptive_max_pool", lambda x: F.adaptive_max_pool(x, (None, 3)),
     lambda: reference.adaptive_max_pool(FLAT, (None, 3))[0]),
    ("SelectAdaptivePool flatten", lambda x: SelectAdaptivePool(2, flatten=True)(x),
     lambda: reference.adaptive_avg_pool(FLAT, (2, 2)).reshape(6, 16)),
]


@pytest.fixture(scope="module")
def pooled():
  """Every case's call on X, all in one jitted program (eager, each op compiles alone)."""
  return jax.jit(lambda x: {name: call(x) for name, call, _ in CASES})(X)


@pytest.mark.parametrize(("name", "mirror"), [(c[0], c[2]) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_several_batch_axes_pool_each_example(pooled, name, mirror):
  got = pooled[name]
  want = mirror()
  if isinstance(want, tuple) and not isinstance(got, tuple):
    want = want[0]
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, _batched(w), rtol=1e-6, atol=1e-6),
               got, want)


def test_several_batch_axes_match_flax_max_pool():
  # flax.nnx.max_pool reads every axis before the window as a batch axis.
  got, want = jax.jit(lambda x: (MaxPool(2)(x), nnx.max_pool(x, (2, 2), strides=(2, 2))))(X)
  np.testing.assert_array_equal(got, want)
  assert want.shape == (2, 3, 4, 4, 4)


def test_several_batch_axes_unpool_and_gradients():
  @jax.jit  # one program (eager: each op compiled alone)
  def run(x):
    values, indices = MaxPool(2, return_indices=True)(x)
    return values, indices, MaxUnpool(2)(values, indices), jax.grad(
        lambda v: MaxPool(2)(v).sum())(x)

  values, indices, unpooled, grad = run(X)
  want = reference.max_unpool(*(np.asarray(a).reshape(6, 4, 4, 4) for a in (values, indices)),
                              (2, 2), (2, 2))
  np.testing.assert_array_equal(unpooled, _batched(want))
  # The gradient of a sum of maxima is 1 at each window's maximum (the mirror's indices).
  flat_index = np.asarray(indices).reshape(6, 16, 4)
  expected = np.zeros((6, 64, 4))
  np.put_along_axis(expected, flat_index, 1.0, axis=1)
  np.testing.assert_array_equal(grad, expected.reshape(X.shape))


GATES = [SqueezeExcitation, EffectiveSqueezeExcitation, EfficientChannelAttention, CBAM]


def test_several_batch_axes_gate_each_example():
  # A gate pools each example's own map: the (2, 3) batch gives what each (H, W, C) does.
  # Each example's own result: the examples one after the other along one batch axis.
  # The four gates built from shapes with NumPy values (tests/_cheap.py: no initialiser
  # compiles) and run in one jitted program (an eager gate compiles each of its steps).
  gates = [build(gate, 4) for gate in GATES]
  for module in gates:
    module.eval()

  @nnx.jit
  def both(gates, x):
    return [(m(x), jax.vmap(m)(x.reshape(6, 1, 8, 8, 4))) for m in gates]  # (6, 1, H, W, C)

  for gate, (got, each) in zip(GATES, both(gates, jnp.asarray(X)), strict=True):
    assert got.shape == X.shape, gate.__name__
    np.testing.assert_allclose(got, each.reshape(X.shape), rtol=1e-6, atol=1e-6,
                               err_msg=gate.__name__)


def test_a_rank_that_fits_no_reading_is_refused():
  with pytest.raises(ValueError, match=r"rank 3 or more; got shape \(8, 4\) \(rank 2\)\. .*"
                                       r"For this shape set num_spatial_dims=1"):
    MaxPool(2)(jax.device_put(np.ones((8, 4), np.float32)))  # refused from its shape


# ----------------------------------------------------------------------------
# The channels-first warning.
# ----------------------------------------------------------------------------


# The warning is given when a call is traced: these calls are traced alone (jax.eval_shape),
# nothing compiled; test_nchw_warning_points_at_the_callers_line runs one eagerly.
def _spec(*shape):
  return jax.ShapeDtypeStruct(shape, jnp.float32)


def test_nchw_looking_input_warns_once_per_module():
  pool = MaxPool(2)
  with pytest.warns(ChannelsFirstWarning, match=r"MaxPool: `inputs` of shape \(2, 3, 32, 32\) "
                    r"looks channels-first \(NCHW: 3 channels on axis 1\).*"
                    r"jnp\.moveaxis\(x, 1, -1\).*in_features=32"):
    y = jax.eval_shape(pool, _spec(2, 3, 32, 32))
  assert y.shape == (2, 1, 16, 32)  # not refused: it is valid NHWC, as in Flax
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    jax.eval_shape(pool, _spec(2, 3, 32, 32))  # the same module: no second warning
    jax.eval_shape(MaxPool(2, in_features=32), _spec(2, 3, 32, 32))  # in_features silences it
    jax.eval_shape(MaxPool(2), _spec(2, 32, 32, 3))  # NHWC


def test_nchw_warning_from_every_module_and_function():
  calls = [AvgPool(2), lambda x: F.avg_pool(x, 2, 2), lambda x: F.max_pool(x, 2, 2),
           GlobalAvgPool(), AdaptiveMaxPool(2)]
  for call in calls:
    with pytest.warns(ChannelsFirstWarning):
      jax.eval_shape(call, _spec(1, 3, 16, 16))


def test_nchw_warning_points_at_the_callers_line():
  with pytest.warns(ChannelsFirstWarning) as record:
    MaxPool(2)(jnp.ones((1, 4, 8, 8)))
  assert record[0].filename == __file__


def test_nchw_warning_under_jit():
  with pytest.warns(ChannelsFirstWarning):
    jax.jit(GlobalAvgPool())(jnp.ones((2, 1, 8, 8)))


# Stage outputs (N, H, W, C) of common vision models, channels-last, at common input
# sizes; none of them may look channels-first.
def _stages(widths, sizes, strides):
  shapes = []
  for size in sizes:
    side = size
    for stride, width in zip(strides, widths, strict=True):
      side = -(-side // stride)
      shapes.append((8, side, side, width))
  return shapes


COMMON_STAGES = (
    # ResNet-18/34 and ResNet-50 (stem, pool, 4 stages).
    _stages([64, 64, 64, 128, 256, 512], [32, 64, 96, 128, 224, 256, 384, 512],
            [1, 2, 2, 2, 2, 2])
    + _stages([64, 64, 256, 512, 1024, 2048], [64, 96, 128, 224, 256, 384, 512],
              [2, 2, 1, 2, 2, 2])
    # VGG-16, MobileNetV2, EfficientNet-B0, ConvNeXt-T, ViT-B/16 patch grid.
    + _stages([64, 128, 256, 512, 512], [32, 64, 224, 256], [1, 2, 2, 2, 2])
    + _stages([32, 16, 24, 32, 64, 96, 160, 320, 1280], [96, 128, 160, 192, 224],
              [2, 1, 2, 2, 2, 1, 2, 1, 1])
    + _stages([32, 16, 24, 40, 80, 112, 192, 320], [224, 240, 260, 300],
              [2, 1, 2, 2, 2, 1, 2, 1])
    + _stages([96, 192, 384, 768], [224, 256, 384], [4, 2, 2, 2])
    + _stages([768], [224, 384], [16])
    # The inputs themselves: RGB, grey and RGBA images.
    + [(8, s, s, c) for s in (28, 32, 64, 224, 256, 512) for c in (1, 3, 4)]
)


def test_the_channels_first_rule_flags_no_common_cnn_stage():
  assert len(COMMON_STAGES) > 200
  false_positives = [s for s in COMMON_STAGES if looks_channels_first(s, 2)]
  assert false_positives == []


def test_the_channels_first_rule_flags_pytorch_layout_images():
  # The same images in PyTorch's layout, (N, C, H, W), 2-D and 3-D; 1-D is never flagged.
  images = [(8, c, s, s) for s in (8, 28, 32, 64, 224, 256, 512) for c in (1, 3, 4)]
  assert all(looks_channels_first(s, 2) for s in images)
  assert all(looks_channels_first((s[0], s[1], 16, *s[2:]), 3) for s in images)
  assert not looks_channels_first((8, 3, 100), 1)
  assert not looks_channels_first((8, 3, 6, 6), 2)  # smaller than 8: too small to tell
  assert not looks_channels_first((8, 3, 32, 64), 2)  # not square


def test_channels_first_warning_is_public_and_a_user_warning():
  assert nnx_pool.ChannelsFirstWarning is ChannelsFirstWarning
  assert issubclass(ChannelsFirstWarning, UserWarning)
