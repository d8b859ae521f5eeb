"""How far bfloat16 and float16 rounding moves a model: ``python -m benchmarks.tolerance_lowp``.

The measurement behind the regression kit's scaled tolerance of a user's arrays in low
precision (:mod:`nnx_pool.regression.tolerance`, ``LOW_PRECISION_ULPS``), the sibling of
:mod:`benchmarks.tolerance_scale` (float32). Each model has its floating state and its input
cast to the dtype and runs in eval mode; its results are the logits (``output``), the map
its head's pool takes (``features``: the model with its pool and classifier taken out), the
cross-entropy (``loss``) and its gradient with respect to every parameter
(:func:`benchmarks.tolerance_scale._results`). The jit run is compared with

* ``eager``: the same run op by op (other fusions);
* ``split``: the batch in two halves, logits and features concatenated, the rest averaged;
* ``pool``: the head's global average pool taken as a mean of the rows' means (another
  order, one more rounding to the dtype, as a user's refactor would do);
* ``channels``: the input's channels reversed, with the first convolution's kernel (its
  sum over the input channels in the other order);
* ``float32``: the same model in float32 (the low-precision weights and input, exact in
  float32): all the rounding the dtype carries, where the modules accumulate in float32;
* ``release``: another jax release on the same inputs and weights (``--save`` there,
  ``--against`` here);

and, for scale, with two real changes: ``kernel x1.05`` (the classifier's kernel, rounded
to the dtype) and ``output x1.05`` (the jit logits times 1.05, rounded to the dtype).
Each array's difference is given two ways, printed as ``max/norm``: ``max|a - b| / (eps *
S)``, ``S`` the scale the kit gives the baseline array
(:func:`nnx_pool.regression.tolerance.scales`, at least the dtype's smallest normal
number), and the relative norm ``||a - b|| / ||b||`` in units of ``eps`` (an aggregate:
rounding that moves elements at random moves it less than its worst element; a change of
scale moves both by the same fraction). Each comparison's line shows the forward arrays,
and the worst gradient leaf by each measure with the median.

The models: ``cnn6``, six 3x3 convolutions (stride 2 every other), each followed by
BatchNorm and ReLU, a global average pool and a linear head, on 4x32x32x3;
``res_small`` and ``res_full`` (``tests/_resnet.py``: 34 k and 8.0 M parameters, on
2x32x32x3 and 2x64x64x3); ``eff_small`` and ``eff_full`` (``tests/_effnet.py``: width
0.25 with one block per stage, 122,868 parameters, and the full 4,020,358, on 2x32x32x3;
their eval-mode logits are of order 1e-8, and underflow in float16). All are initialised
from NumPy, so every jax release runs the same weights. ``eff_full`` skips the eager run
(its eager gradient alone takes minutes). The default is all of them in bfloat16 and
float16: 25 minutes of 2 CPU cores under load, most of it the EfficientNets.

To compare two releases, run ``--save`` with the other one and ``--against`` its file here::

    python -m benchmarks.tolerance_lowp --save other.npz      # in the other release's venv
    python -m benchmarks.tolerance_lowp --against other.npz   # here

``--save`` runs the jit results only and writes them with a digest of the inputs and
weights, which ``--against`` checks. The other venv needs jax, flax and this checkout
(``pip install -e . --no-deps``).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import runpy
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

# tolerance_scale turns jax_enable_x64 on when imported (before any computation runs).
from benchmarks.tolerance_scale import TESTS, _cast, _images, _results, _split, add_models, models
from nnx_pool import GlobalAvgPool

MODELS = ("cnn6", "res_small", "res_full", "eff_small", "eff_full")
DTYPES = ("bfloat16", "float16")
COMPARISONS = ("eager", "split", "pool", "channels", "float32", "release", "kernel x1.05",
               "output x1.05")


class _Cnn6(nnx.Module):
  """Six 3x3 convolutions (stride 2 every other), BatchNorm and ReLU after each, a global
  average pool and a linear head."""

  def __init__(self, rngs: nnx.Rngs):
    widths = (3, 16, 16, 32, 32, 64, 64)
    self.convs = nnx.List([nnx.Conv(cin, cout, (3, 3), strides=1 + i % 2, rngs=rngs)
                           for i, (cin, cout) in enumerate(itertools.pairwise(widths))])
    self.bns = nnx.List([nnx.BatchNorm(c, rngs=rngs) for c in widths[1:]])
    self.pool = GlobalAvgPool()
    self.fc = nnx.Linear(64, 10, rngs=rngs)

  def __call__(self, x: jax.Array, training: bool = False) -> jax.Array:
    for conv, bn in zip(self.convs, self.bns, strict=True):
      x = jax.nn.relu(bn(conv(x), use_running_average=not training))
    return self.fc(self.pool(x))


class _RowMeans(nnx.Module):
  """A global average pool taken as the mean of the rows' means, each rounded to the dtype."""

  def __call__(self, x: jax.Array) -> jax.Array:
    return jnp.mean(jnp.mean(x, axis=2), axis=1)


def _model(name: str) -> tuple[nnx.Module, jax.Array, Callable[[nnx.Module], Any]]:
  """``(model, x, first convolution)`` of a named model, in float32."""
  resnet = runpy.run_path(str(TESTS / "_resnet.py"))
  if name == "cnn6":
    model = resnet["numpy_initialised"](lambda: _Cnn6(nnx.Rngs(0)), 0, gain=2.0)
    return model, _images(4, 32), lambda m: m.convs[0]
  if name.startswith("res"):
    model = resnet["resnet_cheaply"](**({"width": 4} if name == "res_small" else {}))
    return (model, resnet["images"](2, 32 if name == "res_small" else 64),
            lambda m: m.stem.conv)
  effnet = runpy.run_path(str(TESTS / "_effnet.py"))
  model = effnet["effnet_cheaply"](**({"width": 0.25, "depth": 1} if name == "eff_small" else {}))
  return model, effnet["images"](2, 32), lambda m: m.stem


def _head(m: nnx.Module) -> str:
  """The name of the model's classifier (a Linear after its pool)."""
  return "classifier" if hasattr(m, "classifier") else "fc"


def _call(m: nnx.Module, x: jax.Array, training: bool) -> jax.Array:
  if isinstance(m, _Cnn6) or hasattr(m, "classifier"):  # training passed per call
    return m(x, training=training)
  m.train() if training else m.eval()
  return m(x)


def _copy(model: nnx.Module) -> nnx.Module:
  return nnx.merge(*nnx.split(model), copy=True)


class _Identity(nnx.Module):
  def __call__(self, x: jax.Array) -> jax.Array:
    return x


def _features(model: nnx.Module, x: jax.Array, *, jit: bool = True) -> np.ndarray:
  """The map the head's pool takes (thousands of numbers, where the logits are 20 or 40):
  the model with its pool and its classifier taken out."""
  model = _copy(model)
  model.pool = _Identity()
  setattr(model, _head(model), _Identity())

  def call(m, x):
    return _call(m, x, False)

  return np.asarray((nnx.jit(call) if jit else call)(model, x))


def _run(model: nnx.Module, x: jax.Array, *, jit: bool = True) -> dict[str, np.ndarray]:
  """The logits, the features, the loss and its gradient leaves, under jit or eagerly."""
  labels = jnp.arange(x.shape[0]) % 10
  out = _results(model, _call, x, labels, False, jit=jit, with_loss=True)
  return {**out, "features": _features(model, x, jit=jit)}


def _halves(model: nnx.Module, x: jax.Array) -> dict[str, np.ndarray]:
  """The batch in two halves: logits and features concatenated, the rest averaged."""
  out = _split(model, _call, x, jnp.arange(x.shape[0]) % 10, with_loss=True)
  half = x.shape[0] // 2
  return {**out, "features": np.concatenate([_features(model, x[:half]),
                                             _features(model, x[half:])])}


def _pool_reordered(model: nnx.Module, x: jax.Array) -> dict[str, np.ndarray]:
  """The head's pool as the mean of the rows' means, rounded to the dtype in between."""
  model = _copy(model)
  model.pool = _RowMeans()
  return _run(model, x)


def _channels_reversed(model: nnx.Module, x: jax.Array,
                       first: Callable[[nnx.Module], Any]) -> dict[str, np.ndarray]:
  """The input's channels and the first convolution's input axis reversed: its sum over the
  channels in the other order (the same kernel gradient, reversed back)."""
  model = _copy(model)
  conv = first(model)
  conv.kernel[...] = conv.kernel[...][:, :, ::-1, :]
  out = _run(model, x[..., ::-1])
  for key in out:
    if key.endswith("kernel") and out[key].ndim == 4 and out[key].shape[2] == x.shape[-1]:
      out[key] = out[key][:, :, ::-1, :].copy()
  return out


def _kernel_changed(model: nnx.Module, x: jax.Array) -> dict[str, np.ndarray]:
  """The classifier's kernel times 1.05, rounded to the dtype."""
  model = _copy(model)
  layer = getattr(model, _head(model))
  layer.kernel[...] = (layer.kernel[...].astype(jnp.float32) * 1.05).astype(layer.kernel.dtype)
  return _run(model, x)


def _digest(model: nnx.Module, x: jax.Array) -> str:
  """The SHA-256 of the input and the state, in a fixed order: the same numbers or not."""
  h = hashlib.sha256(np.asarray(x).tobytes())
  for path, var in sorted(nnx.to_flat_state(nnx.state(model)), key=lambda p: str(p[0])):
    leaf = jax.tree_util.tree_leaves(var)[0]
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      h.update(str(path).encode() + np.asarray(leaf).tobytes())
  return h.hexdigest()


def differences(new: dict[str, np.ndarray], base: dict[str, np.ndarray]
                ) -> dict[str, tuple[float, float]]:
  """``key: (max|new - base| / (eps * S), ||new - base|| / (eps * ||base||))`` per floating
  array of ``base``, ``S`` the kit's scale of it (at least the dtype's smallest normal
  number, below which rounding is absolute) and ``eps`` its dtype's."""
  from nnx_pool.regression.tolerance import scales  # not needed by --save

  scale = scales(base)
  out = {}
  for key, b in base.items():
    if key not in scale or key not in new:  # another release's file without the loss
      continue
    info = ml_dtypes.finfo(b.dtype)
    d = np.abs(new[key].astype(np.float64) - b.astype(np.float64))
    norm = max(float(np.linalg.norm(b.astype(np.float64))), float(info.tiny))
    out[key] = (float(d.max()) / (float(info.eps) * max(scale[key], float(info.tiny))),
                float(np.linalg.norm(d)) / (float(info.eps) * norm))
  return out


def _line(label: str, diffs: dict[str, tuple[float, float]]) -> str:
  """One comparison: the forward arrays, and the worst, median and least gradient leaf."""
  grad = [k for k in diffs if k.startswith("grad/")]
  worst = max(grad, key=lambda k: diffs[k][0])
  worst_norm = max(grad, key=lambda k: diffs[k][1])
  forward = ", ".join(f"{k} {diffs[k][0]:.3g}/{diffs[k][1]:.3g}"
                      for k in ("output", "features", "loss") if k in diffs)
  return (f"  {label:<13} {forward} | gradients: worst {diffs[worst][0]:.3g} ({worst}), "
          f"median {np.median([diffs[k][0] for k in grad]):.3g}; worst norm "
          f"{diffs[worst_norm][1]:.3g} ({worst_norm})")


def measure(name: str, dtype: str, comparisons: tuple[str, ...],
            other: dict[str, np.ndarray] | None) -> dict[str, dict[str, tuple[float, float]]]:
  """The differences of each comparison for one model in one dtype (and prints them)."""
  model32, x32, first = _model(name)
  model, x = _cast(model32, jnp.dtype(dtype)), x32.astype(dtype)
  base = _run(model, x)
  from nnx_pool.regression.tolerance import scales

  tiny = float(ml_dtypes.finfo(jnp.dtype(dtype)).tiny)
  low = sorted(k for k, s in scales(base).items() if s < tiny)
  print(f"{name}, {dtype}, eval mode: max|logits| {scales(base)['output']:.3g}, {len(base)} "
        f"arrays, {len(low)} of them under the smallest normal {tiny:.3g}"
        f"{': ' + ', '.join(low[:4]) + (' ...' if len(low) > 4 else '') if low else ''}",
        flush=True)
  runs: dict[str, Callable[[], dict[str, np.ndarray]]] = {
      "eager": lambda: _run(model, x, jit=False),
      "split": lambda: _halves(model, x),
      "pool": lambda: _pool_reordered(model, x),
      "channels": lambda: _channels_reversed(model, x, first),
      "float32": lambda: _run(_cast(model, jnp.float32), x.astype(jnp.float32)),
      "kernel x1.05": lambda: _kernel_changed(model, x),
      "output x1.05": lambda: {**base, "output": (base["output"].astype(np.float64) * 1.05)
                                .astype(base["output"].dtype)},
  }
  out = {}
  for what in comparisons:
    if what == "eager" and name == "eff_full":  # its eager gradient alone takes minutes
      continue
    if what == "release":
      prefix = f"{name}/{dtype}/"
      if other is None:
        continue
      if str(other[prefix + "digest"]) != _digest(model, x):
        raise SystemExit(f"{prefix}: the other release's inputs or weights differ from these")
      new = {k[len(prefix):]: v for k, v in other.items()
             if k.startswith(prefix) and k != prefix + "digest"}
    else:
      new = runs[what]()
    out[what] = differences(new, base)
    print(_line(what, out[what]), flush=True)
  return out


def save(path: str, models: list[str], dtypes: list[str]) -> None:
  """Writes every model's jit results in every dtype, with the digest of its inputs."""
  arrays: dict[str, Any] = {}
  for name in models:
    model32, x32, _ = _model(name)
    for dtype in dtypes:
      model, x = _cast(model32, jnp.dtype(dtype)), x32.astype(dtype)
      arrays[f"{name}/{dtype}/digest"] = np.array(_digest(model, x))
      for key, value in _run(model, x).items():
        # np.savez cannot hold bfloat16 (ml_dtypes #41): its raw bits, read back by dtype.
        arrays[f"{name}/{dtype}/{key}"] = value.view(np.uint16)
      print(f"{name}, {dtype}: saved", flush=True)
  np.savez(path, jax=np.array(jax.__version__), **arrays)


def load(path: str) -> dict[str, np.ndarray]:
  """The arrays :func:`save` wrote, with their dtypes back."""
  with np.load(path) as data:
    print(f"against jax {data['jax']} ({path})")
    out = {}
    for key in data.files:
      if key == "jax":
        continue
      dtype = key.split("/")[1]
      out[key] = data[key] if key.endswith("/digest") else data[key].view(jnp.dtype(dtype))
    return out


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_models(parser, MODELS)
  parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
  parser.add_argument("--only", nargs="+", default=list(COMPARISONS), choices=COMPARISONS,
                      metavar="COMPARISON", help=f"one or more of {', '.join(COMPARISONS)}")
  parser.add_argument("--save", metavar="NPZ", help="write the jit results, nothing else")
  parser.add_argument("--against", metavar="NPZ", help="another release's --save file")
  args = parser.parse_args(argv)
  args.models = models(parser, args, MODELS)
  print(f"jax {jax.__version__}, flax {flax.__version__}")
  if args.save:
    save(args.save, args.models, args.dtypes)
    return
  other = load(args.against) if args.against else None
  for name in args.models:
    for dtype in args.dtypes:
      measure(name, dtype, tuple(args.only), other)


if __name__ == "__main__":
  main()
