"""A small network written the way ported models are, for the guard's tests (issue 38).

The habits of jax-ml/bonsai's EfficientNet-B0 and DenseNet-121 that matter to a guard, in a
model written here: an MBConv-style block whose squeeze-excitation holds **1x1 convolutions**
(``se.conv1``, ``se.conv2``, kernels ``(1, 1, C, S)``) applied to the pooled map, BatchNorm
after each convolution, a **``functools.partial``** of ``nnx.max_pool`` as the stem's pool
and a ``partial`` of ``jnp.mean`` as the head's pool (static attributes, not modules), and
**``training`` passed on every call**.

Its variables come from NumPy (:func:`ported_cheaply`, as ``tests/_resnet.py``'s models),
and the classifier's kernel is drawn at ``head_gain`` times LeCun's variance (default
1e-12): the eval-mode logits are then below 1e-7 (6.8e-8 on :func:`images`), as those of
bonsai's randomly initialised EfficientNet-B0 are of order 1e-7 (1.5e-7 on 2x224x224
images), while the loss of a cross-entropy is about log(10): a layer compared at the loss's
tolerance would not see them move. Channels-last; one block, 8 -> 16 channels, 692
parameters (:class:`Ported`).
"""

from __future__ import annotations

import functools
import runpy
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


class ConvSE(nnx.Module):
  """Squeeze-excitation as ported models write it: the mean over the map (kept as a 1x1 map),
  a 1x1 convolution down (``conv1``), SiLU, a 1x1 convolution up (``conv2``), sigmoid."""

  def __init__(self, channels: int, squeezed: int, *, rngs: nnx.Rngs):
    self.conv1 = nnx.Conv(channels, squeezed, (1, 1), rngs=rngs)
    self.conv2 = nnx.Conv(squeezed, channels, (1, 1), rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    s = jnp.mean(x, axis=(1, 2), keepdims=True)
    return x * jax.nn.sigmoid(self.conv2(jax.nn.silu(self.conv1(s))))


class Block(nnx.Module):
  """Depthwise 3x3 (carrying the stride), :class:`ConvSE`, 1x1 projection, each convolution
  with BatchNorm; a residual where the shape is kept. An MBConv without the 1x1 expansion, as
  EfficientNet's first stage: with it, the guard's gradient program of :class:`Ported`
  compiled in 1.4 s of CPU, without it in 1.1 s (``jax.jit(jax.value_and_grad(...))``, lowered
  and compiled)."""

  def __init__(self, cin: int, cout: int, stride: int, *, rngs: nnx.Rngs):
    mid = cin
    self.dw = nnx.Conv(mid, mid, (3, 3), strides=stride, feature_group_count=mid,
                       use_bias=False, rngs=rngs)
    self.bn1 = nnx.BatchNorm(mid, rngs=rngs)
    self.se = ConvSE(mid, max(1, cin // 4), rngs=rngs)
    self.project = nnx.Conv(mid, cout, (1, 1), use_bias=False, rngs=rngs)
    self.bn2 = nnx.BatchNorm(cout, rngs=rngs)
    self.residual = stride == 1 and cin == cout

  def __call__(self, x: jax.Array, training: bool) -> jax.Array:
    eval_ = not training
    y = jax.nn.silu(self.bn1(self.dw(x), use_running_average=eval_))
    y = self.bn2(self.project(self.se(y)), use_running_average=eval_)
    return x + y if self.residual else y


class Ported(nnx.Module):
  """Stem (3x3, stride 2, BatchNorm, SiLU), a ``partial`` max pool, one strided
  :class:`Block` (8 -> 16 channels), a ``partial`` mean over the map and a linear classifier;
  ``__call__(x, training=False)``.

  One block: the guard's tests change its SE, the pools and the head, none a second block
  (the grouping of several blocks' renamed leaves is tested on ``tests/_effnet.py``'s two
  blocks). Measured (tests/regression/fixture/test_ported.py with tools/compile_census.py):
  the gradient program of the two-block model with a 1x1 head convolution compiled in 2.4 s
  of CPU, this one's in 1.2 s."""

  def __init__(self, *, num_classes: int = 10, rngs: nnx.Rngs):
    self.stem = nnx.Conv(3, 8, (3, 3), strides=2, use_bias=False, rngs=rngs)
    self.stem_bn = nnx.BatchNorm(8, rngs=rngs)
    self.pool = functools.partial(nnx.max_pool, window_shape=(3, 3), strides=(2, 2),
                                  padding="SAME")
    blocks = [Block(8, 16, 2, rngs=rngs)]
    self.blocks = nnx.List(blocks) if hasattr(nnx, "List") else blocks
    self.gap = functools.partial(jnp.mean, axis=(1, 2))
    self.classifier = nnx.Linear(16, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, training: bool = False) -> jax.Array:
    eval_ = not training
    x = jax.nn.silu(self.stem_bn(self.stem(x), use_running_average=eval_))
    x = self.pool(x)
    for block in self.blocks:
      x = block(x, training=training)
    return self.classifier(self.gap(x))


def ported_cheaply(*, seed: int = 0, head_gain: float = 1e-12) -> Ported:
  """A :class:`Ported` filled from NumPy (LeCun-scaled normal kernels, zero biases, BatchNorm
  at its initial statistics), the classifier's kernel at ``head_gain`` times that variance."""
  fill = runpy.run_path(str(Path(__file__).with_name("_resnet.py")))["numpy_initialised"]
  model = fill(lambda: Ported(rngs=nnx.Rngs(seed)), seed, gain=1.0)
  kernel = model.classifier.kernel
  kernel[...] = kernel[...] * np.float32(np.sqrt(head_gain))
  return model


def images(n: int = 2, size: int = 16) -> jax.Array:
  """A fixed ``(n, size, size, 3)`` batch of smooth values in [-1, 1] (no PRNG)."""
  grid = np.arange(n * size * size * 3, dtype=np.float64).reshape(n, size, size, 3)
  return jnp.asarray(np.sin(grid * 0.0137) * np.cos(grid * 0.0031), jnp.float32)


def cross_entropy(model: nnx.Module, x: jax.Array, labels: jax.Array,
                  training: bool = False) -> jax.Array:
  """Mean softmax cross-entropy of ``model(x, training=training)`` against ``labels``."""
  logits = model(x, training=training)
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))
