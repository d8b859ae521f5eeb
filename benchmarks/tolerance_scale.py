"""How far float32 rounding moves a model's results: ``python -m benchmarks.tolerance_scale``.

The measurement behind the regression kit's scaled ``atol`` for a user's model
(:mod:`nnx_pool.regression.tolerance`, "The scale of a user's arrays"). For each model,
in eval and in train mode, it computes the logits and the gradient of a cross-entropy
with respect to every parameter, under ``jax.jit``, and compares

* float32 with the same model in float64 (the rounding float32 carries),
* the eager float32 run with the jit one (another fusion, another order),
* float32 on the batch split in two with float32 on the whole batch (eval mode only:
  train-mode BatchNorm couples the samples),

each array in units of ``eps * S``: ``max|a - b| / (eps * S)``, with ``S`` the scale the
kit gives the baseline array (:func:`nnx_pool.regression.tolerance.scales`). The kit's
default ``atol`` is ``SCALE_ULPS * eps * S`` (1024): a ratio of 100 leaves a margin of
10x. It prints the worst array of each comparison and the median.

The models: ``tests/_effnet.py`` (``eff_small``: width 0.25, one block per stage,
122,868 parameters; ``eff_full``: 4,020,358) on a 2x32x32x3 batch, ``tests/_resnet.py``
(``res_small``: width 4; ``res_full``: 8,036,426 parameters, on 2x64x64x3), with Flax's
own initialisation for the EfficientNet and NumPy's for the ResNet, and ``cnn``, three
convolutions with a bias in front of a BatchNorm each, on batches of 2x8x8, 8x16x16 and
16x32x32 (in train mode, the gradient of those biases is 0 in exact arithmetic: float32
leaves rounding noise alone).

``python -m benchmarks.tolerance_scale eff_small res_full cnn`` measures those; the
default is all five (about 10 minutes of 2 CPU cores, most of it the float64 and eager
gradients of ``eff_full``). It enables ``jax_enable_x64`` for itself.
"""

from __future__ import annotations

import argparse
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402 - after x64 is on
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from nnx_pool.regression.tolerance import scales  # noqa: E402

TESTS = Path(__file__).resolve().parent.parent / "tests"
MODELS = ("eff_small", "eff_full", "res_small", "res_full", "cnn")


class _Cnn(nnx.Module):
  """Three 3x3 convolutions with a bias, each followed by BatchNorm and ReLU, a mean and a
  linear head."""

  def __init__(self, rngs: nnx.Rngs):
    self.convs = nnx.List([nnx.Conv(cin, cout, (3, 3), rngs=rngs)
                           for cin, cout in ((3, 16), (16, 32), (32, 32))])
    self.bns = nnx.List([nnx.BatchNorm(c, rngs=rngs) for c in (16, 32, 32)])
    self.fc = nnx.Linear(32, 10, rngs=rngs)

  def __call__(self, x: jax.Array, training: bool = False) -> jax.Array:
    for conv, bn in zip(self.convs, self.bns, strict=True):
      x = jax.nn.relu(bn(conv(x), use_running_average=not training))
    return self.fc(x.mean((1, 2)))


def _images(n: int, size: int) -> jax.Array:
  grid = np.arange(n * size * size * 3, dtype=np.float64).reshape(n, size, size, 3)
  return jnp.asarray(np.sin(grid * 0.0137) * np.cos(grid * 0.0031), jnp.float32)


def _cases(name: str) -> list[tuple[str, nnx.Module, Callable[..., Any], jax.Array]]:
  """``(label, model, call(model, x, training), x)`` for one named model."""
  if name.startswith("eff"):
    effnet = runpy.run_path(str(TESTS / "_effnet.py"))
    kw = {"width": 0.25, "depth": 1} if name == "eff_small" else {}
    model = effnet["EffNet"](rngs=nnx.Rngs(0), **kw)
    return [(name, model, lambda m, x, t: m(x, training=t), effnet["images"](2, 32))]
  if name.startswith("res"):
    resnet = runpy.run_path(str(TESTS / "_resnet.py"))
    model = resnet["resnet_cheaply"](**({"width": 4} if name == "res_small" else {}))

    def call(m, x, training):
      m.train() if training else m.eval()
      return m(x)

    return [(name, model, call, resnet["images"](2, 32 if name == "res_small" else 64))]
  return [(f"cnn {n}x{s}x{s}", _Cnn(nnx.Rngs(0)), lambda m, x, t: m(x, training=t),
           _images(n, s)) for n, s in ((2, 8), (8, 16), (16, 32))]


def _cast(model: nnx.Module, dtype: Any) -> nnx.Module:
  graphdef, state = nnx.split(model)
  return nnx.merge(graphdef, jax.tree_util.tree_map(
      lambda v: v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v, state))


def _results(model, call, x, labels, training, *, jit=True,
             with_loss=False) -> dict[str, np.ndarray]:
  """The logits and the cross-entropy's gradient leaves, keyed as the kit keys them (and the
  cross-entropy itself, ``loss``, where asked)."""

  def loss(m, x, labels):
    logits = call(m, x, training)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

  def run(m, x, labels):
    if with_loss:
      return call(m, x, training), nnx.value_and_grad(loss)(m, x, labels)
    return call(m, x, training), (None, nnx.grad(loss)(m, x, labels))

  fn = nnx.jit(run) if jit else run
  logits, (value, grads) = fn(nnx.merge(*nnx.split(model), copy=True), x, labels)
  out = {"output": np.asarray(logits)}
  if with_loss:
    out["loss"] = np.asarray(value)
  for path, leaf in nnx.to_flat_state(grads):
    out["grad/" + "/".join(map(str, path))] = np.asarray(jax.tree_util.tree_leaves(leaf)[0])
  return out


def _split(model, call, x, labels, *, with_loss=False) -> dict[str, np.ndarray]:
  """Eval mode on each half of the batch: logits concatenated, gradients (and losses)
  averaged in float64, rounded once to their dtype."""
  half = x.shape[0] // 2
  a = _results(model, call, x[:half], labels[:half], False, with_loss=with_loss)
  b = _results(model, call, x[half:], labels[half:], False, with_loss=with_loss)
  return {k: np.concatenate([a[k], b[k]]) if k == "output" else
          ((a[k].astype(np.float64) + b[k].astype(np.float64)) / 2).astype(a[k].dtype)
          for k in a}


def _ratios(new: dict[str, np.ndarray], ref: dict[str, np.ndarray],
            base: dict[str, np.ndarray]) -> dict[str, float]:
  """``max|new - ref| / (eps * S)`` per array, ``eps`` that of ``base``'s array's dtype and
  ``S`` the kit's scale of it."""
  scale = scales(base)
  return {k: float(np.abs(new[k].astype(np.float64) - ref[k].astype(np.float64)).max())
          / (float(ml_dtypes.finfo(base[k].dtype).eps) * scale[k])
          for k in base if scale[k] > 0}


def _line(label: str, ratios: dict[str, float]) -> str:
  worst = max(ratios, key=ratios.get)
  return (f"  {label:<22} worst {ratios[worst]:9.3g} ({worst}), median "
          f"{np.median(list(ratios.values())):.3g}, {len(ratios)} arrays")


def add_models(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
  """The positional model names (argparse's ``choices`` rejects an empty ``nargs="*"``'s
  default list on Python 3.11, so :func:`models` checks them)."""
  parser.add_argument("models", nargs="*", metavar="MODEL",
                      help=f"some of {', '.join(names)} (default: all)")


def models(parser: argparse.ArgumentParser, args: argparse.Namespace,
           names: tuple[str, ...]) -> list[str]:
  """The models asked for, all of ``names`` when none; an unknown one is an error."""
  unknown = [name for name in args.models if name not in names]
  if unknown:
    parser.error(f"unknown model {unknown[0]!r}; choose from {', '.join(names)}")
  return args.models or list(names)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_models(parser, MODELS)
  args = parser.parse_args(argv)
  for name in models(parser, args, MODELS):
    for label, model, call, x in _cases(name):
      labels = jnp.arange(x.shape[0]) % 10
      for training in (False, True):
        print(f"{label}, {'train' if training else 'eval'} mode")
        base = _results(model, call, x, labels, training)
        ref = _results(_cast(model, jnp.float64), call, x.astype(jnp.float64), labels, training)
        print(_line("float32 vs float64", _ratios(base, ref, base)))
        if name != "eff_full":  # its eager gradient alone takes minutes
          print(_line("eager vs jit", _ratios(
              _results(model, call, x, labels, training, jit=False), base, base)))
        if not training and x.shape[0] == 2:
          print(_line("batch split vs whole", _ratios(_split(model, call, x, labels), base,
                                                      base)))


if __name__ == "__main__":
  main()
