"""Sharding checks on 8 simulated CPU devices; run by tests/test_sharding.py in a subprocess.

The parent pytest process has already initialised JAX with one CPU device, and
the device count cannot change after that, so this script runs in a fresh
interpreter: run as a script, it sets ``--xla_force_host_platform_device_count=8``
before importing JAX (importing it, as pytest's doctest collection does, changes
nothing), runs every check, and prints one JSON object on its last line.
It never asserts: every comparison is returned as data, and the test asserts.

For every public module it compares, on a mesh with ``Explicit`` axes (the
default of ``jax.make_mesh`` in jax 0.10), and for a subset (``AUTO``) on one
with ``Auto`` axes:

* the output (and indices) and the gradients with respect to the input and the
  parameters, for a fixed small-integer cotangent, against the same program run
  on one device (the independent source: the single-device run);
* whether the output and the input gradient keep the input's sharding;
* which collectives the compiled forward and backward programs contain.

Every window pool (``WINDOW_SPATIAL``) also runs on both axis types with H split
over the second axis of a (data=2, space=4) mesh: its output, gradient, their
partition specs and the compiled programs' collectives.

Then a data-parallel training step of a small CNN (nnx.Conv, MaxPool,
SqueezeExcitation, GlobalAvgPool, nnx.Linear) with optax, against the same
step on one device.
"""

from __future__ import annotations

import os
import re
import sys

DEVICES = 8
_FLAG = "--xla_force_host_platform_device_count"
if __name__ == "__main__":  # never on import (pytest's --doctest-modules imports this file)
  os.environ["XLA_FLAGS"] = " ".join(
      [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(_FLAG)]
      + [f"{_FLAG}={DEVICES}"]
  )

import json  # noqa: E402
import time  # noqa: E402

_IMPORTED = time.perf_counter()
import traceback  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402  (a dependency of flax)
from flax import nnx  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import nnx_pool  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")  # as the suite's conftest.py

BATCH, SIZE, CHANNELS = 16, 8, 8
_COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def _input(shape, seed):
  """Distinct continuous values (no ties), so a selection has one winner everywhere."""
  values = np.random.default_rng(seed).permutation(np.prod(shape)).reshape(shape)
  return jnp.asarray(values / np.prod(shape) - 0.5 + 1e-3, jnp.float32)


def _cotangent(shape):
  """Small integers 1..5: a max-pool gradient that scatters them is exact in any order."""
  return jnp.asarray((np.arange(np.prod(shape)) * 7 % 5 + 1).reshape(shape), jnp.float32)


def _rngs():
  return nnx.Rngs(0)


class _WithSamples(nnx.Module):
  """A FractionalMaxPool called as ``module(x, samples)``: the cases pass arrays positionally,
  and the samples are batched like ``x`` (PyTorch's ``_random_samples``, (N, C, 2))."""

  def __init__(self, pool):
    self.pool = pool

  def __call__(self, x, samples):
    return self.pool(x, samples=samples)


# name -> (factory, kind of comparison, what is passed). "exact": max/min/indices;
# "close": averages, gates. Unpooling takes the values and indices of a max pool.
CASES = {
    "AvgPool": (lambda: nnx_pool.AvgPool((3, 3), 2, 1, ceil_mode=True, count_include_pad=False),
                "close"),
    "MaxPool": (lambda: nnx_pool.MaxPool((3, 3), 2, "SAME", return_indices=True), "exact"),
    "MaxPool_dilated": (lambda: nnx_pool.MaxPool((2, 2), 1, 1, dilation=2), "exact"),
    "MinPool": (lambda: nnx_pool.MinPool((2, 2), 1, return_indices=True), "exact"),
    "LPPool": (lambda: nnx_pool.LPPool(2, (2, 2)), "close"),
    "MaxUnpool": (lambda: nnx_pool.MaxUnpool((2, 2)), "exact"),
    "GlobalAvgPool": (lambda: nnx_pool.GlobalAvgPool(), "close"),
    "GlobalMaxPool": (lambda: nnx_pool.GlobalMaxPool(), "exact"),
    "AdaptiveAvgPool": (lambda: nnx_pool.AdaptiveAvgPool((3, 5)), "close"),
    "AdaptiveMaxPool": (lambda: nnx_pool.AdaptiveMaxPool((3, 5), return_indices=True), "exact"),
    "SelectAdaptivePool": (
        lambda: nnx_pool.SelectAdaptivePool(1, pool_type="catavgmax", flatten=True), "close"),
    "SqueezeExcitation": (lambda: nnx_pool.SqueezeExcitation(CHANNELS, rngs=_rngs()), "close"),
    "EffectiveSqueezeExcitation": (
        lambda: nnx_pool.EffectiveSqueezeExcitation(CHANNELS, rngs=_rngs()), "close"),
    "EfficientChannelAttention": (
        lambda: nnx_pool.EfficientChannelAttention(CHANNELS, rngs=_rngs()), "close"),
    "CBAM": (lambda: nnx_pool.CBAM(CHANNELS, rngs=_rngs()), "close"),
    "LightCBAM": (lambda: nnx_pool.LightCBAM(CHANNELS, rngs=_rngs()), "close"),
    "GlobalContext": (lambda: nnx_pool.GlobalContext(CHANNELS, fuse_add=True, rngs=_rngs()),
                      "close"),
    "GeMPool": (lambda: nnx_pool.GeMPool(), "close"),
    "LsePlusPool": (lambda: nnx_pool.LsePlusPool(), "close"),
    "AttentionPool": (lambda: nnx_pool.AttentionPool(CHANNELS, feat_size=4, num_heads=2,
                                                     rngs=_rngs()), "close"),
    "AttentionPoolLatent": (lambda: nnx_pool.AttentionPoolLatent(CHANNELS, num_heads=2,
                                                                 rngs=_rngs()), "close"),
    "BlurPool": (lambda: nnx_pool.BlurPool(), "close"),
    "MedianPool": (lambda: nnx_pool.MedianPool(3, 1, 1), "exact"),
    "FractionalMaxPool": (
        lambda: _WithSamples(nnx_pool.FractionalMaxPool(2, 5, return_indices=True)), "exact"),
}
# The input of a case that does not take the (BATCH, SIZE, SIZE, CHANNELS) map: tokens.
INPUT_SHAPES = {"AttentionPoolLatent": (BATCH, SIZE * SIZE, CHANNELS)}
# Spatial sharding (H over the second mesh axis): where it is meaningful, a
# reduction over the whole map or a gate built on one.
SPATIAL = (
    "GlobalAvgPool", "GlobalMaxPool", "SelectAdaptivePool", "SqueezeExcitation",
    "EffectiveSqueezeExcitation", "EfficientChannelAttention",
)
# Window pools with H split over the second mesh axis (2 x 4), on both axis types:
# name -> (factory, kind, spatial dims). Every output length here is a multiple of
# 4, so the output can keep the input's (data, space) sharding.
WINDOW_SPATIAL = {
    "AvgPool 3x3/1 p1": (lambda: nnx_pool.AvgPool(3, 1, 1), "close", 2),
    "AvgPool 2x2/2": (lambda: nnx_pool.AvgPool(2), "close", 2),
    "AvgPool 3x3/2 p1": (lambda: nnx_pool.AvgPool(3, 2, 1, count_include_pad=False), "close", 2),
    "MaxPool 3x3/2 p1": (lambda: nnx_pool.MaxPool(3, 2, 1, return_indices=True), "exact", 2),
    "MaxPool 2x2/2": (lambda: nnx_pool.MaxPool(2), "exact", 2),
    "MaxPool 2x2 dilation 2 p1": (lambda: nnx_pool.MaxPool(2, 1, 1, dilation=2), "exact", 2),
    "MinPool 3x3/1 p1": (lambda: nnx_pool.MinPool(3, 1, 1), "exact", 2),
    "LPPool 2x2/2": (lambda: nnx_pool.LPPool(2, 2), "close", 2),
    "AvgPool 3x3x3/2 p1": (lambda: nnx_pool.AvgPool(3, 2, 1, num_spatial_dims=3), "close", 3),
    "MaxPool 3x3x3/2 p1": (lambda: nnx_pool.MaxPool(3, 2, 1, num_spatial_dims=3), "exact", 3),
    "AdaptiveAvgPool 16->4": (lambda: nnx_pool.AdaptiveAvgPool(4), "close", 2),
    "AdaptiveMaxPool 16->4": (lambda: nnx_pool.AdaptiveMaxPool(4), "exact", 2),
}
WINDOW_MAP = {2: (2, 16, 16, 4), 3: (2, 8, 8, 8, 4)}
# On an Auto mesh (the compiler propagates shardings, as with a hand-built Mesh):
# the modules that fail on an Explicit mesh today, and one of each family.
AUTO = ("AvgPool", "MaxPool", "MaxUnpool", "AdaptiveMaxPool", "SqueezeExcitation", "CBAM")
AUTO_SPATIAL = ("GlobalMaxPool", "SelectAdaptivePool", "SqueezeExcitation")
# Modules whose forward pass couples the examples of a batch: CBAM starts in
# training mode, so its BatchNorm takes batch statistics (an all-reduce).
BATCH_COUPLED = ("CBAM", "LightCBAM")
# allclose tolerances (rtol = atol) for averages: float32 reordering of a window or
# a map's sum; the regression kit's "window" and "gate" float32 numbers
# (docs/regression.md). CBAM's BatchNorm reduces over the sharded batch, in
# another order than on one device, so it gets the gate numbers (forward, gradient).
RTOL = 1e-6
TOLERANCES = {"CBAM": (1e-5, 4e-5), "LightCBAM": (1e-5, 4e-5),
              # softmax-weighted sums over the map: the gate numbers too
              "GlobalContext": (1e-5, 4e-5), "AttentionPool": (1e-5, 4e-5),
              "AttentionPoolLatent": (1e-5, 4e-5)}
# Parameter gradients sum over the sharded batch (an all-reduce) in another order.
PARAM_GRAD_TOL = 4e-5


def _count(hlo: str) -> dict[str, int]:
  return {c: len(re.findall(rf"\b{c}(?:-start)?\(", hlo)) for c in _COLLECTIVES}


def _args(name: str, x: jax.Array) -> tuple[jax.Array, ...]:
  if name == "FractionalMaxPool":  # fixed samples, one (W, H) pair per (example, channel)
    samples = np.random.default_rng(0).uniform(size=(x.shape[0], x.shape[-1], 2))
    return x, jnp.asarray(samples, jnp.float32)
  if name != "MaxUnpool":
    return (x,)
  # The values and indices of a max pool (computed on one device, then placed).
  values, indices = nnx_pool.MaxPool((2, 2), return_indices=True)(np.asarray(x))
  return values, indices


def _first(out):
  return out[0] if isinstance(out, tuple) else out


def _forward(module, *args):
  return module(*args)


def _loss(module, x, rest, ct):
  out = module(x, *rest)
  return jnp.sum(_first(out) * ct), out


def _value_and_grads(module, x, rest, ct):
  """The output and the gradients (params, input) of ``sum(output * ct)``, in one program."""
  (_, out), grads = nnx.value_and_grad(_loss, argnums=(0, 1), has_aux=True)(module, x, rest, ct)
  return out, grads


_forward_jit = nnx.jit(_forward)
_grads_jit = nnx.jit(_value_and_grads)


def _leaves(tree) -> list[np.ndarray]:
  return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def _compare(actual, expected, exact: bool, tol: float) -> dict:
  a, e = _leaves(actual), _leaves(expected)
  if len(a) != len(e) or any(
      x.shape != y.shape or x.dtype != y.dtype for x, y in zip(a, e, strict=True)):
    return {"equal": False, "max_abs": None, "why": "structure, shape or dtype differs"}
  max_abs = max(
      [float(np.max(np.abs(x.astype(np.float64) - y)))
       for x, y in zip(a, e, strict=True) if x.size] or [0.0])
  if exact:
    equal = all(np.array_equal(x, y) for x, y in zip(a, e, strict=True))
  else:
    equal = all(np.allclose(x, y, rtol=tol, atol=tol) for x, y in zip(a, e, strict=True))
  return {"equal": bool(equal), "max_abs": max_abs, "tolerance": 0.0 if exact else tol}


def _keeps(array: jax.Array, sharding: NamedSharding) -> bool:
  return bool(array.sharding.is_equivalent_to(sharding, array.ndim))


def _batch_axis(array: jax.Array):
  """The mesh axis the leading (batch) axis is sharded over, or None."""
  spec = getattr(array.sharding, "spec", None)
  if not spec or array.ndim == 0:
    return None
  return spec[0]


def _hlo(jitted, *args) -> str:
  """The compiled program of an nnx.jit function already called with ``args`` (cached)."""
  return jitted.lower(*args).compile().as_text()


def _replicate(module, mesh):
  nnx.update(module, jax.device_put(nnx.state(module), NamedSharding(mesh, P())))
  return module


_REFERENCE: dict[str, tuple] = {}


def _single_device(name: str, factory, args) -> tuple:
  """The single-device run (forward, then output and gradients), computed once per case."""
  if name not in _REFERENCE:
    out = _forward_jit(factory(), *args)
    ct = _cotangent(_first(out).shape)
    _REFERENCE[name] = (out, ct, *_grads_jit(factory(), args[0], args[1:], ct))
  return _REFERENCE[name]


def run_case(name: str, mesh, spec: P, axis_type: str) -> dict:
  factory, kind = CASES[name]
  exact = kind == "exact"
  tol, grad_tol = TOLERANCES.get(name, (RTOL, RTOL))
  x = _input(INPUT_SHAPES.get(name, (BATCH, SIZE, SIZE, CHANNELS)), seed=len(name))
  args = _args(name, x)
  in_sharding = NamedSharding(mesh, spec)
  batch_sharding = NamedSharding(mesh, P(spec[0]))
  result = {"case": name, "axis_type": axis_type, "spec": str(spec), "kind": kind}
  start = time.perf_counter()
  try:
    ref_out, ct, ref_out2, ref_grads = _single_device(name, factory, args)
    sharded_args = tuple(jax.device_put(a, in_sharding) for a in args)
    ct_sharded = jax.device_put(ct, batch_sharding)
    module = _replicate(factory(), mesh)
    out = _forward_jit(module, *sharded_args)
    result["output"] = _compare(out, ref_out, exact, tol)
    result["output_batch_axis"] = [_batch_axis(o) for o in jax.tree.leaves(out)]
    result["output_only_batch"] = all(_keeps(o, batch_sharding) for o in jax.tree.leaves(out))
    first = _first(out)
    # A shape-preserving output (the gates) keeps the input's whole sharding.
    result["output_keeps_input"] = first.shape == args[0].shape and _keeps(first, in_sharding)
    result["output_sharding"] = str(first.sharding.spec)
    result["forward_collectives"] = _count(_hlo(_forward_jit, module, *sharded_args))

    grad_module = _replicate(factory(), mesh)
    out2, grads = _grads_jit(grad_module, sharded_args[0], sharded_args[1:], ct_sharded)
    result["output_in_grad_program"] = _compare(out2, ref_out2, exact, tol)
    result["grad_input"] = _compare(grads[1], ref_grads[1], exact, grad_tol)
    result["grad_params"] = _compare(grads[0], ref_grads[0], False, PARAM_GRAD_TOL)
    result["num_params"] = len(jax.tree.leaves(grads[0]))
    result["grad_input_batch_axis"] = _batch_axis(grads[1])
    result["grad_input_sharding"] = str(grads[1].sharding.spec)
    result["grad_collectives"] = _count(_hlo(
        _grads_jit, grad_module, sharded_args[0], sharded_args[1:], ct_sharded))
  except Exception as e:  # noqa: BLE001 - reported to the test, which fails with it
    result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    result["traceback"] = traceback.format_exc(limit=-6)
  result["seconds"] = time.perf_counter() - start
  return result


def run_window_case(name: str, mesh, axis_type: str) -> dict:
  """A window pool on an input whose H is split over ``space``: values, gradient, shardings."""
  factory, kind, ndim = WINDOW_SPATIAL[name]
  exact = kind == "exact"
  x = _input(WINDOW_MAP[ndim], seed=len(name))
  spec = P("data", "space", *([None] * ndim))
  result = {"case": name, "axis_type": axis_type, "spec": str(spec), "kind": kind}
  start = time.perf_counter()
  try:
    module = factory()
    ref_out = _forward_jit(module, x)
    ct = _cotangent(_first(ref_out).shape)
    ref_out2, ref_grads = _grads_jit(module, x, (), ct)
    in_sharding = NamedSharding(mesh, spec)
    xs, cts = jax.device_put(x, in_sharding), jax.device_put(ct, in_sharding)
    out = _forward_jit(module, xs)
    result["output"] = _compare(out, ref_out, exact, RTOL)
    result["output_specs"] = [str(o.sharding.spec) for o in jax.tree.leaves(out)]
    result["forward_collectives"] = _count(_hlo(_forward_jit, module, xs))
    out2, grads = _grads_jit(module, xs, (), cts)
    result["output_in_grad_program"] = _compare(out2, ref_out2, exact, RTOL)
    result["grad_input"] = _compare(grads[1], ref_grads[1], exact, RTOL)
    result["grad_input_spec"] = str(grads[1].sharding.spec)
    result["grad_collectives"] = _count(_hlo(_grads_jit, module, xs, (), cts))
  except Exception as e:  # noqa: BLE001 - reported to the test, which fails with it
    result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    result["traceback"] = traceback.format_exc(limit=-6)
  result["seconds"] = time.perf_counter() - start
  return result


# ---------------------------------------------------------------- training


class SmallCNN(nnx.Module):
  """conv -> relu -> MaxPool -> SqueezeExcitation -> GlobalAvgPool -> linear."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.conv = nnx.Conv(3, CHANNELS, (3, 3), rngs=rngs)
    self.pool = nnx_pool.MaxPool((2, 2))
    self.se = nnx_pool.SqueezeExcitation(CHANNELS, rngs=rngs)
    self.gap = nnx_pool.GlobalAvgPool()
    self.head = nnx.Linear(CHANNELS, 10, rngs=rngs)

  def __call__(self, x):
    x = self.pool(nnx.relu(self.conv(x)))
    return self.head(self.gap(self.se(x)))


def _loss_fn(model, x, labels):
  logits = model(x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _train_step(model, opt_state, x, labels, tx):
  loss, grads = nnx.value_and_grad(_loss_fn)(model, x, labels)
  params = nnx.state(model, nnx.Param)
  updates, opt_state = tx.update(grads, opt_state, params)
  nnx.update(model, optax.apply_updates(params, updates))
  return loss, opt_state


_TX = optax.adam(1e-2)
_STEP = nnx.jit(_train_step, static_argnums=4)
_SINGLE: list = []


def _single_training(x, labels, steps: int):
  """The same steps on one device, run once: (losses, final model)."""
  if not _SINGLE:
    single = SmallCNN(rngs=nnx.Rngs(0))
    opt_state = _TX.init(nnx.state(single, nnx.Param))
    losses = []
    for _ in range(steps):
      loss, opt_state = _STEP(single, opt_state, x, labels, _TX)
      losses.append(float(loss))
    _SINGLE.extend([losses, single])
  return _SINGLE


def run_training(mesh, axis_type: str, steps: int = 3) -> dict:
  result = {"case": "train_step", "axis_type": axis_type}
  try:
    tx, step = _TX, _STEP
    x = _input((BATCH, SIZE, SIZE, 3), seed=99)
    labels = jnp.asarray(np.arange(BATCH) % 10, jnp.int32)
    single_losses, single = _single_training(x, labels, steps)

    model = _replicate(SmallCNN(rngs=nnx.Rngs(0)), mesh)
    opt_state = jax.device_put(tx.init(nnx.state(model, nnx.Param)), NamedSharding(mesh, P()))
    data = NamedSharding(mesh, P("data"))
    xs, ls = jax.device_put(x, data), jax.device_put(labels, data)
    losses = []
    for _ in range(steps):
      loss, opt_state = step(model, opt_state, xs, ls, tx)
      losses.append(float(loss))
    result["single_losses"] = single_losses
    result["sharded_losses"] = losses
    result["params"] = _compare(
        nnx.state(model, nnx.Param), nnx.state(single, nnx.Param), False, PARAM_GRAD_TOL)
    result["params_replicated"] = all(
        leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(nnx.state(model)))

    result["collectives"] = _count(step.lower(model, opt_state, xs, ls, tx).compile().as_text())
  except Exception as e:  # noqa: BLE001 - reported to the test
    result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    result["traceback"] = traceback.format_exc(limit=-4)
  return result


def main() -> None:
  start = time.perf_counter()
  report = {"devices": jax.device_count(), "platform": jax.devices()[0].platform,
            "public": sorted(nnx_pool.__all__), "cases": [], "windows": [], "training": []}
  devices = jax.devices()[:DEVICES]
  for axis_type in ("Explicit", "Auto"):
    kind = getattr(AxisType, axis_type)
    data = jax.make_mesh((DEVICES,), ("data",), axis_types=(kind,), devices=devices)
    grid = jax.make_mesh((2, DEVICES // 2), ("data", "space"), axis_types=(kind, kind),
                         devices=devices)
    explicit = axis_type == "Explicit"
    for name in CASES if explicit else AUTO:
      report["cases"].append(run_case(name, data, P("data"), axis_type))
    for name in SPATIAL if explicit else AUTO_SPATIAL:
      report["cases"].append(run_case(name, grid, P("data", "space"), axis_type))
    for name in WINDOW_SPATIAL:
      report["windows"].append(run_window_case(name, grid, axis_type))
    report["training"].append(run_training(data, axis_type))
  report["seconds"] = time.perf_counter() - start
  report["import_seconds"] = start - _IMPORTED
  print(json.dumps(report))


if __name__ == "__main__":
  sys.exit(main())
