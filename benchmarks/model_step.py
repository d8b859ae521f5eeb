"""A whole training step of a small SE-ResNet, three ways: ``python -m benchmarks.model_step``.

The row a user sees: one SGD step (forward, backward, update) of the same network at
batch 8, 112x112, written

* ``ours``: with nnx-pool's layers (``MaxPool(3, 2, 1)``, a ResNet-D shortcut
  ``AvgPool(2, ceil_mode=True, count_include_pad=False)``, ``SqueezeExcitation``,
  ``GlobalAvgPool``);
* ``flax``: with ``flax.nnx`` built-ins (``nnx.max_pool``, ``nnx.avg_pool``,
  ``jnp.mean``) and a hand-written squeeze-excitation, the way a Flax user writes it;
* ``torch``: in PyTorch on ``channels_last`` tensors.

The network: a 7x7/2 stem convolution with BatchNorm and ReLU, the 3x3/2 pad 1 max
pool, two bottleneck stages with squeeze-excitation gates (the second with stride 2
and the ResNet-D average-pool shortcut), a global average pool and a Linear. All
three hold the same weights (the JAX ones are built from one seed, PyTorch's are
copied from them) and take the same batch, so their losses agree
(:func:`losses`), which the benchmark checks before it times anything. BatchNorm runs
in training mode, on batch statistics.

Run as a module, it times one contestant alone (:mod:`benchmarks.solo` starts it):
``python -m benchmarks.model_step "SE-ResNet step" ours step`` prints the JSON of
:mod:`benchmarks.contestant` plus the step's ``loss``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import nnx_pool
from benchmarks.contestant import _median_ms, _timed, floor_ms

NAME = "SE-ResNet step"
BATCH, SIDE, CLASSES = 8, 112, 100
QUICK = dict(batch=2, side=32, widths=(8, 4, 16, 8, 32), classes=10)
FULL = dict(batch=BATCH, side=SIDE, widths=(64, 64, 256, 128, 512), classes=CLASSES)
LEARNING_RATE = 0.01


class HandSqueezeExcitation(nnx.Module):
  """Squeeze-excitation as a Flax user writes it: mean, Linear, ReLU, Linear, sigmoid."""

  def __init__(self, channels: int, squeeze: int, *, rngs: nnx.Rngs):
    self.fc1 = nnx.Linear(channels, squeeze, rngs=rngs)
    self.fc2 = nnx.Linear(squeeze, channels, rngs=rngs)

  def __call__(self, x):
    s = jnp.mean(x, axis=(1, 2))
    return x * nnx.sigmoid(self.fc2(nnx.relu(self.fc1(s))))[:, None, None, :]


class Pools:
  """The network's pooling layers and gate, from nnx-pool or from flax.nnx built-ins."""

  def __init__(self, ours: bool):
    self.ours = ours
    if ours:
      self.stem_pool = nnx_pool.MaxPool(3, 2, 1)
      self.shortcut_pool = nnx_pool.AvgPool(2, ceil_mode=True, count_include_pad=False)
      self.global_pool = nnx_pool.GlobalAvgPool()
    else:
      self.stem_pool = lambda x: nnx.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)))
      # Even maps here, so ceil mode changes nothing and Flax's floor is the same.
      self.shortcut_pool = lambda x: nnx.avg_pool(x, (2, 2), (2, 2))
      self.global_pool = lambda x: jnp.mean(x, axis=(1, 2))

  def gate(self, channels: int, rngs: nnx.Rngs):
    if self.ours:
      return nnx_pool.SqueezeExcitation(channels, channels // 16, rngs=rngs)
    return HandSqueezeExcitation(channels, channels // 16, rngs=rngs)


def _bn(channels: int, rngs: nnx.Rngs) -> nnx.BatchNorm:
  return nnx.BatchNorm(channels, momentum=0.9, epsilon=1e-5, rngs=rngs)


class Bottleneck(nnx.Module):
  def __init__(self, cin: int, mid: int, cout: int, stride: int, pools: Pools, rngs: nnx.Rngs):
    self.conv1, self.bn1 = nnx.Conv(cin, mid, (1, 1), use_bias=False, rngs=rngs), _bn(mid, rngs)
    self.conv2 = nnx.Conv(mid, mid, (3, 3), strides=stride, padding=((1, 1), (1, 1)),
                          use_bias=False, rngs=rngs)
    self.bn2 = _bn(mid, rngs)
    self.conv3, self.bn3 = nnx.Conv(mid, cout, (1, 1), use_bias=False, rngs=rngs), _bn(cout, rngs)
    self.se = pools.gate(cout, rngs)
    self.down = nnx.Conv(cin, cout, (1, 1), use_bias=False, rngs=rngs)
    self.down_bn = _bn(cout, rngs)
    self.pool = pools.shortcut_pool if stride == 2 else None

  def __call__(self, x):
    y = nnx.relu(self.bn1(self.conv1(x)))
    y = nnx.relu(self.bn2(self.conv2(y)))
    y = self.se(self.bn3(self.conv3(y)))
    shortcut = self.pool(x) if self.pool is not None else x
    return nnx.relu(y + self.down_bn(self.down(shortcut)))


class SEResNet(nnx.Module):
  def __init__(self, widths: tuple[int, ...], classes: int, *, ours: bool, rngs: nnx.Rngs):
    stem, mid1, out1, mid2, out2 = widths
    pools = Pools(ours)
    self.stem = nnx.Conv(3, stem, (7, 7), strides=2, padding=((3, 3), (3, 3)), use_bias=False,
                         rngs=rngs)
    self.stem_bn = _bn(stem, rngs)
    self.stem_pool = pools.stem_pool
    self.stage1 = Bottleneck(stem, mid1, out1, 1, pools, rngs)
    self.stage2 = Bottleneck(out1, mid2, out2, 2, pools, rngs)
    self.global_pool = pools.global_pool
    self.head = nnx.Linear(out2, classes, rngs=rngs)

  def __call__(self, x):
    x = self.stem_pool(nnx.relu(self.stem_bn(self.stem(x))))
    return self.head(self.global_pool(self.stage2(self.stage1(x))))


def build(config: dict, ours: bool) -> SEResNet:
  """The model of ``config`` from seed 0, its initialisers compiled as one program.

  Built eagerly, each initialiser's ops compile one by one for every new shape (5.1 s
  for the quick model's first build, 3.1 s as one program, cached for the next build);
  the weights are the same bit for bit.
  """
  return _build(config["widths"], config["classes"], ours)


@functools.partial(nnx.jit, static_argnums=(0, 1, 2))
def _build(widths: tuple[int, ...], classes: int, ours: bool) -> SEResNet:
  return SEResNet(widths, classes, ours=ours, rngs=nnx.Rngs(0))


def batch(config: dict) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  x = rng.standard_normal((config["batch"], config["side"], config["side"], 3), np.float32)
  return x, rng.integers(0, config["classes"], config["batch"]).astype(np.int32)


def jax_step(config: dict, ours: bool):
  """``(step, state)``: a jitted SGD step of the JAX model, and its first state."""
  model = build(config, ours)
  graphdef, params, stats = nnx.split(model, nnx.Param, nnx.BatchStat)
  tx = optax.sgd(LEARNING_RATE)

  def loss_fn(params, stats, x, y):
    # All state comes in as arguments, merged into fresh Variables (copy=True):
    # BatchNorm updates its statistics inside the gradient's trace, which Variables
    # made outside it refuse ("Cannot mutate BatchStat from a different trace level").
    m = nnx.merge(graphdef, params, stats, copy=True)
    loss = optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()
    return loss, nnx.state(m, nnx.BatchStat)

  def step(params, stats, opt_state, x, y):
    (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_stats, opt_state, loss

  return jax.jit(step), (params, stats, tx.init(params)), model


def torch_model(config: dict, model: SEResNet):
  """The PyTorch network, channels_last, holding ``model``'s weights."""
  import torch
  from torch import nn

  def conv(c: nnx.Conv, stride=1, padding=0) -> nn.Conv2d:
    kernel = np.asarray(c.kernel[...])  # (kh, kw, in, out)
    layer = nn.Conv2d(kernel.shape[2], kernel.shape[3], kernel.shape[:2], stride, padding,
                      bias=False)
    layer.weight.data = torch.from_numpy(np.array(kernel.transpose(3, 2, 0, 1)))
    return layer

  def bn(b: nnx.BatchNorm) -> nn.BatchNorm2d:
    layer = nn.BatchNorm2d(b.scale.shape[0], eps=1e-5, momentum=0.1)
    layer.weight.data = torch.from_numpy(np.array(b.scale[...]))
    layer.bias.data = torch.from_numpy(np.array(b.bias[...]))
    return layer

  def linear(lin: nnx.Linear) -> nn.Linear:
    kernel = np.asarray(lin.kernel[...])
    layer = nn.Linear(*kernel.shape)
    layer.weight.data = torch.from_numpy(np.array(kernel.T))
    layer.bias.data = torch.from_numpy(np.array(lin.bias[...]))
    return layer

  class Gate(nn.Module):
    def __init__(self, se):
      super().__init__()
      self.fc1, self.fc2 = linear(se.fc1), linear(se.fc2)

    def forward(self, x):
      s = self.fc2(torch.relu(self.fc1(x.mean((2, 3)))))
      return x * torch.sigmoid(s)[:, :, None, None]

  class Block(nn.Module):
    def __init__(self, b: Bottleneck):
      super().__init__()
      stride = b.conv2.strides if isinstance(b.conv2.strides, int) else b.conv2.strides[0]
      self.conv1, self.bn1 = conv(b.conv1), bn(b.bn1)
      self.conv2, self.bn2 = conv(b.conv2, stride, 1), bn(b.bn2)
      self.conv3, self.bn3 = conv(b.conv3), bn(b.bn3)
      self.se = Gate(b.se)
      self.pool = (nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False)
                   if b.pool is not None else nn.Identity())
      self.down, self.down_bn = conv(b.down), bn(b.down_bn)

    def forward(self, x):
      y = torch.relu(self.bn1(self.conv1(x)))
      y = torch.relu(self.bn2(self.conv2(y)))
      y = self.se(self.bn3(self.conv3(y)))
      return torch.relu(y + self.down_bn(self.down(self.pool(x))))

  net = nn.Sequential(conv(model.stem, 2, 3), bn(model.stem_bn), nn.ReLU(),
                      nn.MaxPool2d(3, 2, 1), Block(model.stage1), Block(model.stage2),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), linear(model.head))
  return net.to(memory_format=torch.channels_last)


def torch_step(config: dict, model: SEResNet):
  """``(step, net)``: one PyTorch SGD step on the batch, returning the loss."""
  import torch

  net = torch_model(config, model)
  opt = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE)
  x_np, y_np = batch(config)
  x = torch.from_numpy(x_np).permute(0, 3, 1, 2)  # NHWC memory: channels_last
  y = torch.from_numpy(y_np).long()

  def step():
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    return loss.detach()

  return step, net, x, y


def losses(config: dict) -> dict[str, float]:
  """The loss of the first batch, three ways, from the same weights (BatchNorm in training).

  The forward alone: it settles that the three networks are one (the step's own loss,
  reported by every timed process, is checked again before the row is reported).
  """
  x, y = batch(config)
  out = {}
  for name in ("ours", "flax"):
    model = build(config, ours=name == "ours")
    loss = nnx.jit(lambda m, x, y: optax.softmax_cross_entropy_with_integer_labels(
        m(x), y).mean())
    out[name] = float(loss(model, x, y))
  try:
    import torch
  except ImportError:
    return out
  _, net, tx, ty = torch_step(config, build(config, ours=True))
  with torch.no_grad():
    out["torch"] = float(torch.nn.functional.cross_entropy(net(tx), ty))
  return out


def _param_bytes(model: SEResNet) -> int:
  return sum(a.size * 4 for a in jax.tree.leaves(nnx.state(model, nnx.Param)))


def measure(contestant: str, *, quick: bool, calls: int, warmup: int) -> dict:
  """One contestant's step, timed alone (the figures of :mod:`benchmarks.contestant`)."""
  config = QUICK if quick else FULL
  x, y = batch(config)
  if contestant == "torch":
    step, net, tx, ty = torch_step(config, jax_step(config, ours=True)[2])
    loss = float(step())
    for _ in range(warmup):
      step()
    result = {"call_ms": _median_ms(_timed(step, calls)),
              "null_ms": _median_ms(_timed(lambda: tx.reshape(-1)[:1].clone(), calls))}
    from benchmarks.contestant import saved_bytes

    result["saved_bytes"] = saved_bytes(lambda t: net(t), tx.detach().clone().requires_grad_())
    model = jax_step(config, ours=True)[2]
  else:
    step, state, model = jax_step(config, ours=contestant == "ours")
    args = (*state, jnp.asarray(x), jnp.asarray(y))
    start = time.perf_counter()
    compiled = step.lower(*args).compile()
    compile_s = time.perf_counter() - start
    params, stats, opt_state, loss = compiled(*args)
    loss = float(loss)
    carry = [params, stats, opt_state]

    def run() -> None:
      carry[:3] = jax.block_until_ready(compiled(*carry, args[3], args[4]))[:3]

    for _ in range(warmup):
      run()
    null = jax.jit(lambda a: a.reshape(-1)[:1]).lower(args[3]).compile()
    result = {"compile_s": compile_s, "call_ms": _median_ms(_timed(run, calls)),
              "null_ms": _median_ms(_timed(lambda: jax.block_until_ready(null(args[3])),
                                           calls)),
              "temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes)}
  result["loss"] = loss
  # The step's least traffic: read the batch, read the parameters, write them and their
  # gradients once.
  result["floor_ms"] = floor_ms(x.size * 4 + 3 * _param_bytes(model))
  return result


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.model_step",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("case", choices=(NAME,))
  parser.add_argument("contestant", choices=("ours", "flax", "torch"))
  parser.add_argument("pass_name", choices=("step",))
  parser.add_argument("--calls", type=int, default=20)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args(argv)
  calls = max(args.calls // 2, 5)  # a step takes tens of milliseconds
  json.dump(measure(args.contestant, quick=args.quick, calls=calls, warmup=args.warmup),
            sys.stdout)
  print()
  return 0

if __name__ == "__main__":
  sys.exit(main())
