"""An EfficientNet-style network written here for the regression kit's tests.

Inverted-residual (MBConv) blocks with squeeze-excitation, BatchNorm and Dropout, in the
style of EfficientNet-B0 (Tan and Le, 2019, https://arxiv.org/abs/1905.11946), with the
one habit that matters to a guard: **``training`` is passed on every call**
(``model(x, training=True)``), as many ported models do, instead of being set on the
modules with ``model.train()``. BatchNorm gets ``use_running_average=not training`` and
Dropout ``deterministic=not training`` at call time.

The squeeze-excitation block is written by hand (:class:`SqueezeExcite`, timm's key names
``conv_reduce``/``conv_expand``, as linear maps of the pooled vector), so that a test can
swap it for :class:`nnx_pool.SqueezeExcitation` holding the same weights (``fc1``/``fc2``):
a refactor that renames state and keeps every number.

Random-init logits are tiny in eval mode, as those of the random-init EfficientNet-B0 the
kit was first tried on were (at most 1.45e-7): BatchNorm's running statistics still hold
their initial values (mean 0, variance 1), so nothing renormalises the activations, which
the SiLUs and the SE gates shrink block after block (in ``EffNet(width=0.25, depth=1)``
they stay of order 1 through ``blocks.1``, then lose about 10x a block). Measured (jax
0.10.2, CPU) on ``images(2, 32)``, seeds 0 to 3: 2.7e-8 to 7.4e-8 for
``EffNet(width=0.25, depth=1)``, 8.2e-9 for ``EffNet()``; with ``training=True`` the same
models give logits of order 1. A guard whose absolute tolerance is fixed at 1e-5 passes
any change of the eval-mode logits.

``EffNet()`` is the real-sized one (the stage widths and depths of EfficientNet-B0 up to
320 channels, a 1280-wide head and 10 classes: 4,020,358 parameters);
``EffNet(width=0.25, depth=1)`` (122,868 parameters) is the same code on a quarter of the
widths with one block per stage. The guard's unit tests use a shorter one still, since
compiling a gradient costs CPU in proportion to the layers (4.4 s for these 7 blocks, 2.2 s
for 3, 1.6 s for 2, 1.4 s for 2 without the 1x1 head):
``effnet_cheaply(width=0.25, depth=1, stages=2, tail_gain=1e-3, head_conv=False)``, the
first two blocks of the same code (a residual MBConv with Dropout and a strided, expanded
one; the hand-written SE, BatchNorm), then the pool, Dropout and the classifier (2,182
parameters). Two blocks shrink less (eval-mode logits 0.023 to 0.038 at LeCun's scale), so
the kernels after ``blocks.0`` are drawn at a thousandth of LeCun's variance, standing for
the blocks left out: eval-mode logits 1.8e-8 to 4.5e-8 (seeds 0 to 3, ``images(2, 32)``),
0.007 to 0.02 with ``training=True``, while the stem and ``blocks.0`` (whose SE a test
changes) work at the scale they have in the deeper models. Channels-last, as nnx-pool.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_pool import GlobalAvgPool

# (expansion, output channels, blocks, stride, kernel) per stage: EfficientNet-B0's.
STAGES = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3),
          (6, 112, 3, 1, 5), (6, 192, 4, 2, 5), (6, 320, 1, 1, 3))


def _channels(c: int, width: float) -> int:
  return max(8, int(c * width + 4) // 8 * 8)


class SqueezeExcite(nnx.Module):
  """Global mean, ``conv_reduce`` (C -> C/4 of the block's input), SiLU, ``conv_expand``,
  sigmoid, and the input scaled by the result."""

  def __init__(self, channels: int, reduced: int, *, rngs: nnx.Rngs):
    self.conv_reduce = nnx.Linear(channels, reduced, rngs=rngs)
    self.conv_expand = nnx.Linear(reduced, channels, rngs=rngs)
    self.act = jax.nn.silu

  def __call__(self, x: jax.Array) -> jax.Array:
    s = jnp.mean(x, axis=(1, 2))
    s = jax.nn.sigmoid(self.conv_expand(self.act(self.conv_reduce(s))))
    return x * s[:, None, None, :]


class MBConv(nnx.Module):
  """1x1 expansion, depthwise kxk (carrying the stride), squeeze-excitation, 1x1 projection,
  each convolution with BatchNorm; Dropout and a residual where the shape is kept."""

  def __init__(self, cin: int, cout: int, expansion: int, stride: int, kernel: int,
               drop: float, *, rngs: nnx.Rngs):
    mid = cin * expansion
    self.expanded = expansion != 1
    if self.expanded:
      self.expand = nnx.Conv(cin, mid, (1, 1), use_bias=False, rngs=rngs)
      self.bn0 = nnx.BatchNorm(mid, rngs=rngs)
    self.dw = nnx.Conv(mid, mid, (kernel, kernel), strides=stride, padding=kernel // 2,
                       feature_group_count=mid, use_bias=False, rngs=rngs)
    self.bn1 = nnx.BatchNorm(mid, rngs=rngs)
    self.se = SqueezeExcite(mid, max(1, cin // 4), rngs=rngs)
    self.project = nnx.Conv(mid, cout, (1, 1), use_bias=False, rngs=rngs)
    self.bn2 = nnx.BatchNorm(cout, rngs=rngs)
    self.residual = stride == 1 and cin == cout
    self.drop = nnx.Dropout(drop, rngs=rngs)

  def __call__(self, x: jax.Array, training: bool = False) -> jax.Array:
    eval_ = not training
    y = x
    if self.expanded:
      y = jax.nn.silu(self.bn0(self.expand(y), use_running_average=eval_))
    y = jax.nn.silu(self.bn1(self.dw(y), use_running_average=eval_))
    y = self.bn2(self.project(self.se(y)), use_running_average=eval_)
    if self.residual:
      y = x + self.drop(y, deterministic=eval_)
    return y


class EffNet(nnx.Module):
  """Stem (3x3, stride 2), the MBConv stages, a 1x1 head, global average pool, Dropout and a
  linear classifier; ``__call__(x, training=False)``. ``depth`` caps the blocks per stage,
  ``stages`` keeps the first that many stages of :data:`STAGES` (None: all), ``head_conv=False``
  leaves out the 1x1 head (convolution, BatchNorm, SiLU): the pool takes the last block's
  output."""

  def __init__(self, *, width: float = 1.0, depth: int | None = None,
               stages: int | None = None, num_classes: int = 10, drop: float = 0.2,
               head_conv: bool = True, rngs: nnx.Rngs):
    stem = _channels(32, width)
    self.stem = nnx.Conv(3, stem, (3, 3), strides=2, padding=1, use_bias=False, rngs=rngs)
    self.stem_bn = nnx.BatchNorm(stem, rngs=rngs)
    blocks, cin = [], stem
    for expansion, c, n, stride, kernel in STAGES[:stages]:
      cout = _channels(c, width)
      for i in range(n if depth is None else min(n, depth)):
        blocks.append(MBConv(cin, cout, expansion, stride if i == 0 else 1, kernel, drop,
                             rngs=rngs))
        cin = cout
    self.blocks = nnx.List(blocks) if hasattr(nnx, "List") else blocks
    self.head_conv = head_conv
    head = _channels(1280, width) if head_conv else cin
    if head_conv:
      self.head = nnx.Conv(cin, head, (1, 1), use_bias=False, rngs=rngs)
      self.head_bn = nnx.BatchNorm(head, rngs=rngs)
    self.pool = GlobalAvgPool()
    self.head_drop = nnx.Dropout(drop, rngs=rngs)
    self.classifier = nnx.Linear(head, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, training: bool = False) -> jax.Array:
    eval_ = not training
    x = jax.nn.silu(self.stem_bn(self.stem(x), use_running_average=eval_))
    for block in self.blocks:
      x = block(x, training=training)
    if self.head_conv:
      x = jax.nn.silu(self.head_bn(self.head(x), use_running_average=eval_))
    x = self.head_drop(self.pool(x), deterministic=eval_)
    return self.classifier(x)


def effnet_cheaply(*, width: float = 1.0, depth: int | None = None,
                   stages: int | None = None, seed: int = 0, tail_gain: float = 1.0,
                   **kwargs) -> EffNet:
  """An :class:`EffNet` whose variables come from NumPy (LeCun-scaled normals, Flax's
  default kernel initialisation; biases 0, BatchNorm's statistics 0 and 1) instead of its
  JAX initialisers, which compile once per shape (about 70 compiles, 8 to 25 s of CPU even
  at width 0.25); for tests of the guard, which need the model's layers and scale, not
  Flax's initialisation.

  ``tail_gain`` scales the variance of every kernel after ``blocks.0`` (the later blocks,
  the head and the classifier; the stem and the first block keep LeCun's): a short model's
  stand-in for the blocks a deep one adds, which shrink the activations (see the module's
  docstring). The kernels are the same draws, scaled by ``sqrt(tail_gain)``."""
  fill = runpy.run_path(str(Path(__file__).with_name("_resnet.py")))["numpy_initialised"]
  model = fill(lambda: EffNet(width=width, depth=depth, stages=stages, rngs=nnx.Rngs(seed),
                              **kwargs), seed, gain=1.0)
  if tail_gain != 1.0:
    for path, kernel in nnx.to_flat_state(nnx.state(model, nnx.Param)):
      if path[-1] == "kernel" and path[0] != "stem" and tuple(path[:2]) != ("blocks", 0):
        kernel[...] = kernel[...] * np.float32(np.sqrt(tail_gain))
  return model


def parameter_count(model: nnx.Module) -> int:
  """How many numbers the model's ``nnx.Param`` variables hold."""
  return sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))


def images(n: int = 2, size: int = 32) -> jax.Array:
  """A fixed ``(n, size, size, 3)`` batch of smooth values in [-1, 1] (no PRNG: the same
  numbers under every JAX version)."""
  grid = np.arange(n * size * size * 3, dtype=np.float64).reshape(n, size, size, 3)
  return jnp.asarray(np.sin(grid * 0.0137) * np.cos(grid * 0.0031), jnp.float32)
