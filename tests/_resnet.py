"""A bottleneck ResNet with BatchNorm, written here for the regression kit's tests and guide 10.

``ResNet()`` is the real-sized one: bottleneck blocks ``[1, 1, 1, 1]`` on widths 64, 128,
256 and 512 (expansion 4), a 7x7 stem, nnx-pool's ``MaxPool(3, 2, 1)`` and
``GlobalAvgPool()``, and a 10-class head: 8,036,426 parameters (``parameter_count``), 32 MB
in float32. ``ResNet(width=4)`` is the same code at 1/16 of the width, for tests of the
logic. Channels-last, as nnx-pool.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_pool import GlobalAvgPool, MaxPool

EXPANSION = 4


def _conv(cin: int, cout: int, k: int, stride: int, rngs: nnx.Rngs) -> nnx.Conv:
  return nnx.Conv(cin, cout, (k, k), strides=stride, padding=k // 2, use_bias=False, rngs=rngs)


class Stem(nnx.Module):
  """7x7 convolution (stride 2), BatchNorm, ReLU, 3x3 max pool (stride 2, padding 1)."""

  def __init__(self, width: int, *, rngs: nnx.Rngs):
    self.conv = _conv(3, width, 7, 2, rngs)
    self.bn = nnx.BatchNorm(width, rngs=rngs)
    self.pool = MaxPool(3, 2, 1)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.pool(jax.nn.relu(self.bn(self.conv(x))))


class Bottleneck(nnx.Module):
  """1x1 reduce, 3x3 (carrying the stride), 1x1 expand, each with BatchNorm; a projected
  shortcut where the shape changes."""

  def __init__(self, cin: int, width: int, stride: int, *, rngs: nnx.Rngs):
    cout = width * EXPANSION
    self.conv1, self.bn1 = _conv(cin, width, 1, 1, rngs), nnx.BatchNorm(width, rngs=rngs)
    self.conv2, self.bn2 = _conv(width, width, 3, stride, rngs), nnx.BatchNorm(width, rngs=rngs)
    self.conv3, self.bn3 = _conv(width, cout, 1, 1, rngs), nnx.BatchNorm(cout, rngs=rngs)
    self.project = stride != 1 or cin != cout
    if self.project:
      self.proj = _conv(cin, cout, 1, stride, rngs)
      self.proj_bn = nnx.BatchNorm(cout, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    y = jax.nn.relu(self.bn1(self.conv1(x)))
    y = jax.nn.relu(self.bn2(self.conv2(y)))
    y = self.bn3(self.conv3(y))
    shortcut = self.proj_bn(self.proj(x)) if self.project else x
    return jax.nn.relu(y + shortcut)


class Stage(nnx.Module):
  """``blocks`` bottlenecks, the first carrying the stride; named ``block0``, ``block1``..."""

  def __init__(self, cin: int, width: int, blocks: int, stride: int, *, rngs: nnx.Rngs):
    self.blocks = blocks
    for i in range(blocks):
      setattr(self, f"block{i}", Bottleneck(cin if i == 0 else width * EXPANSION, width,
                                            stride if i == 0 else 1, rngs=rngs))

  def __call__(self, x: jax.Array) -> jax.Array:
    for i in range(self.blocks):
      x = getattr(self, f"block{i}")(x)
    return x


class ResNet(nnx.Module):
  """Stem, up to four stages (strides 1, 2, 2, 2, or ``strides``; ``blocks`` gives each
  stage's bottlenecks, and as many stages as it has entries), global average pool, linear
  head."""

  def __init__(self, blocks=(1, 1, 1, 1), *, width: int = 64, num_classes: int = 10,
               strides=None, rngs: nnx.Rngs):
    self.stem = Stem(width, rngs=rngs)
    self.stages = len(blocks)
    cin = width
    strides = (1, 2, 2, 2)[:len(blocks)] if strides is None else strides
    for i, (n, stride) in enumerate(zip(blocks, strides, strict=True)):
      setattr(self, f"layer{i + 1}", Stage(cin, width * 2**i, n, stride, rngs=rngs))
      cin = width * 2**i * EXPANSION
    self.pool = GlobalAvgPool()
    self.fc = nnx.Linear(cin, num_classes, rngs=rngs)

  def features(self, x: jax.Array) -> jax.Array:
    x = self.stem(x)
    for i in range(self.stages):
      x = getattr(self, f"layer{i + 1}")(x)
    return x

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.fc(self.pool(self.features(x)))


def parameter_count(model: nnx.Module) -> int:
  """How many numbers the model's ``nnx.Param`` variables hold."""
  return sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))


def images(n: int = 2, size: int = 64) -> jax.Array:
  """A fixed ``(n, size, size, 3)`` batch of smooth values in [-1, 1] (no PRNG: the same
  numbers under every JAX version)."""
  grid = np.arange(n * size * size * 3, dtype=np.float64).reshape(n, size, size, 3)
  return jnp.asarray(np.sin(grid * 0.0137) * np.cos(grid * 0.0031), jnp.float32)


def cross_entropy(model: nnx.Module, x: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy of ``model(x)`` against integer ``labels``."""
  logits = model(x)
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


def resnet_cheaply(width: int = 64, num_classes: int = 10, seed: int = 0,
                   blocks=(1, 1, 1, 1), strides=None) -> ResNet:
  """A :class:`ResNet` whose parameters come from NumPy (He-scaled normals) instead of its
  JAX initialisers, which take about 8 s of CPU at full width; for tests that need the
  model's size and layout, not Flax's initialisation. In eval mode."""
  model = numpy_initialised(
      lambda: ResNet(blocks, width=width, num_classes=num_classes, strides=strides,
                     rngs=nnx.Rngs(0)), seed, gain=2.0)
  model.eval()
  return model


def numpy_initialised(build, seed: int, *, gain: float):
  """The module ``build()`` makes, its variables filled from NumPy instead of its JAX
  initialisers (which compile once per shape, seconds on CPU): kernels normal with variance
  ``gain / fan_in``, BatchNorm scale and variance 1, biases, means and counts 0, PRNG keys
  ``jax.random.key(seed)``."""
  model = nnx.eval_shape(build)
  rng = np.random.default_rng(seed)
  _, state = nnx.split(model)
  filled = {}
  for path, var in nnx.to_flat_state(state):
    leaf = jax.tree_util.tree_leaves(var)[0]
    name = path[-1]
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      value = jax.random.key(seed)
    elif name in ("scale", "var"):
      value = np.ones(leaf.shape, leaf.dtype)
    elif name in ("bias", "mean", "count"):
      value = np.zeros(leaf.shape, leaf.dtype)
    else:  # a kernel: fan-in scaled normals
      fan_in = int(np.prod(leaf.shape[:-1]))
      value = (rng.standard_normal(leaf.shape) * np.sqrt(gain / fan_in)).astype(leaf.dtype)
    filled[path] = jax.tree_util.tree_map(lambda _, v=value: jnp.asarray(v), var)
  nnx.update(model, nnx.from_flat_state(filled))
  return model
