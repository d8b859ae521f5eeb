"""One process of a two-process JAX run; tests/test_processes.py and
tests/regression/processes/test_faults.py start two of it with ``nnx-pool-regression launch``.

Run as ``python tests/_processes_worker.py MODE DIR``, under the launcher (whose variables
it initializes the runtime from), it prints one line ``RESULT {json}`` at the end; the
tests assert on it. It never asserts: every comparison is returned as data. Modes:

* ``main``: the modules batch-sharded over a 4-device mesh that spans both processes, then
  the guard on a small model whose inputs are global arrays: baselines recorded in one process
  (by the test, in ``DIR/p0/b``) checked here (one with stored weights, which only process 0
  can read), baselines recorded here, a check that fails,
  a check during which process 1 raises, a check whose baseline directory process 0 cannot
  write, and a last passing check (the processes are still in step). Each process keeps its
  own directory (``DIR/p<i>``, its baselines in ``b/``): they share no file.
* ``spatial``: the modules with H split over a mesh axis whose two devices lie in different
  processes (the halo crosses the process boundary).
* ``kill``, ``hang``: process 1 is killed, or sleeps, inside a check; process 0 reports how
  its check ended, and when.

The model and the inputs are this file's (:func:`model`, :func:`inputs`), shared with the
tests, which load it by path.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import signal
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import nnx_pool

HERE = Path(__file__).resolve().parent
_CHEAP = runpy.run_path(str(HERE / "_cheap.py"))
BATCH, SIZE, CHANNELS = 4, 8, 3
_COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


class SmallModel(nnx.Module):
  """MaxPool -> SqueezeExcitation -> GlobalAvgPool -> linear.

  No convolution before the pool (there was one, 3 -> 4 channels): it was in every one of the
  guard's programs, and the test's parent (its three records) and both processes took 13.5 s
  of CPU with it, 12.1 s without (the parent's process time and each RESULT's cpu_seconds, two
  runs each, 2 cores). Its parameters took no path that the gate's and the head's do not:
  seeded, stored and sent from the lead, fingerprinted, their gradients summed over the batch
  across the processes (one_grad fails when the two-process loss differs by 1e-3).
  """

  def __init__(self, *, rngs: nnx.Rngs):
    self.pool = nnx_pool.MaxPool(2)
    self.se = nnx_pool.SqueezeExcitation(CHANNELS, rngs=rngs)
    self.gap = nnx_pool.GlobalAvgPool()
    self.head = nnx.Linear(CHANNELS, 3, rngs=rngs)

  def __call__(self, x):
    return self.head(self.gap(self.se(self.pool(x))))


def model(seed: int = 0) -> SmallModel:
  """The guarded model, with seeded weights (the same in every process)."""
  return _CHEAP["build"](SmallModel, seed=seed)


def inputs() -> np.ndarray:
  """The model's input: a batch of 4 (one example per device), distinct values."""
  values = np.random.default_rng(7).permutation(BATCH * SIZE * SIZE * CHANNELS)
  return (values.reshape(BATCH, SIZE, SIZE, CHANNELS) / values.size - 0.5).astype(np.float32)


def loss_fn(m, x):
  return jnp.mean(m(x) ** 2)


# ---------------------------------------------------------------- the modules

# name -> (factory, exact): one of each family; the exact ones only select values.
MODULES = {
    "MaxPool 3x3/2 p1": (lambda: nnx_pool.MaxPool(3, 2, 1), True),
    "AvgPool 3x3/1 p1": (lambda: nnx_pool.AvgPool(3, 1, 1), False),
    "GlobalAvgPool": (lambda: nnx_pool.GlobalAvgPool(), False),
    "AdaptiveAvgPool 16->4": (lambda: nnx_pool.AdaptiveAvgPool(4), False),
    "BlurPool": (lambda: nnx_pool.BlurPool(), False),
    "MedianPool 3x3": (lambda: nnx_pool.MedianPool(3, 1, 1), True),
    "SqueezeExcitation": (lambda: _CHEAP["build"](nnx_pool.SqueezeExcitation, 8), False),
}
# With H split too (integration): the window pools, the whole-map reductions and the gates.
SPATIAL = {
    **{name: MODULES[name] for name in ("MaxPool 3x3/2 p1", "AvgPool 3x3/1 p1", "GlobalAvgPool",
                                        "AdaptiveAvgPool 16->4", "SqueezeExcitation")},
    "MinPool 2x2/2": (lambda: nnx_pool.MinPool(2), True),
    "GlobalMaxPool": (lambda: nnx_pool.GlobalMaxPool(), True),
    "EfficientChannelAttention": (
        lambda: _CHEAP["build"](nnx_pool.EfficientChannelAttention, 8), False),
}
GATES = ("SqueezeExcitation", "EfficientChannelAttention")
MAP = (4, 16, 16, 8)
# float32 reordering of a window's or a map's sum (the kit's window and gate numbers), and a
# gradient summed over the sharded batch (tests/_sharding_worker.py's numbers).
RTOL, GATE_TOL, PARAM_TOL = 1e-6, 1e-5, 4e-5


def _count(hlo: str) -> dict[str, int]:
  return {c: len(re.findall(rf"\b{c}(?:-start)?\(", hlo)) for c in _COLLECTIVES}


def _map(seed: int) -> np.ndarray:
  """Distinct values (no ties), so that a selection has one winner everywhere."""
  values = np.random.default_rng(seed).permutation(int(np.prod(MAP))).reshape(MAP)
  return (values / values.size - 0.5 + 1e-3).astype(np.float32)


def _cotangent(shape) -> np.ndarray:
  """Small integers 1..5: a max pool's gradient that scatters them is exact in any order."""
  return ((np.arange(int(np.prod(shape))) * 7 % 5 + 1).reshape(shape)).astype(np.float32)


def _global(x: np.ndarray, sharding) -> jax.Array:
  """A global array from the same host values in every process (each places its shards)."""
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def _host(x) -> np.ndarray:
  from jax.experimental import multihost_utils

  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


def _compare(actual, expected, exact: bool, tol: float) -> dict:
  a = [np.asarray(v) for v in jax.tree.leaves(actual)]
  e = [np.asarray(v) for v in jax.tree.leaves(expected)]
  if [x.shape for x in a] != [y.shape for y in e]:
    return {"equal": False, "max_abs": None}
  max_abs = max([float(np.max(np.abs(x.astype(np.float64) - y)))
                 for x, y in zip(a, e, strict=True) if x.size] or [0.0])
  equal = all(np.array_equal(x, y) if exact else np.allclose(x, y, rtol=tol, atol=tol)
              for x, y in zip(a, e, strict=True))
  return {"equal": bool(equal), "max_abs": max_abs}


def modules(mode: str) -> dict:
  """Every module's output and gradients (input, parameters) for ``sum(output * ct)``, in one
  program compiled twice: on the global mesh, and, in process 1, on one of its devices (the
  single-process result it must equal; process 1 compares, as process 0 has the guard's
  reading and writing to do)."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  devices = np.array(jax.devices())  # process 0's devices first, then process 1's
  if mode == "main":
    cases, mesh, spec = MODULES, jax.sharding.Mesh(devices, ("data",)), P("data")
  else:  # (data=2, space=2), the two devices along `space` in different processes
    cases = SPATIAL
    mesh, spec = jax.sharding.Mesh(devices.reshape(2, 2).T, ("data", "space")), P("data", "space")
  built = {name: nnx.split(factory()) for name, (factory, _) in cases.items()}
  xs = {name: _map(seed=i) for i, name in enumerate(cases)}
  cts = {name: _cotangent(jax.eval_shape(nnx.merge(*built[name]), xs[name]).shape)
         for name in cases}

  def program(states, xs, cts):
    found = {}
    for name, (graphdef, _) in built.items():
      def loss(state, x, graphdef=graphdef, ct=cts[name]):
        out = nnx.merge(graphdef, state)(x)
        return jnp.sum(out * ct), out
      (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(states[name],
                                                                                xs[name])
      found[name] = {"output": out, "grad_input": grads[1], "grad_params": grads[0]}
    return found

  states = {name: state for name, (_, state) in built.items()}
  start, cpu = time.perf_counter(), time.process_time()
  compares = jax.process_index() == 1
  reference = jax.jit(program)(states, xs, cts) if compares else None  # one device
  replicated = NamedSharding(mesh, P())
  g_states = jax.device_put(states, replicated)
  g_xs = {name: _global(x, NamedSharding(mesh, spec)) for name, x in xs.items()}
  g_cts = {name: _global(ct, NamedSharding(mesh, spec if ct.ndim == 4 else P(spec[0])))
           for name, ct in cts.items()}
  compiled = jax.jit(program).lower(g_states, g_xs, g_cts).compile()
  found = compiled(g_states, g_xs, g_cts)
  specs = {name: {key: str(tuple(found[name][key].sharding.spec))
                  for key in ("output", "grad_input")} for name in cases}
  found = jax.tree.map(_host, found)  # every process gathers (a collective), process 1 compares
  report = {"mesh": dict(mesh.shape), "spec": str(tuple(spec)), "cases": [],
            "collectives": _count(compiled.as_text())}
  for name, (_, exact) in cases.items():
    tol = GATE_TOL if name in GATES else RTOL
    case = {"case": name, "exact": exact, "output_spec": specs[name]["output"],
            "grad_input_spec": specs[name]["grad_input"]}
    for key, key_tol in (("output", tol), ("grad_input", PARAM_TOL if name in GATES else tol),
                         ("grad_params", PARAM_TOL)):
      if reference is not None:
        case[key] = _compare(found[name][key], reference[name][key],
                             exact and key != "grad_params", key_tol)
    report["cases"].append(case)
  report["seconds"] = round(time.perf_counter() - start, 2)
  report["cpu_seconds"] = round(time.process_time() - cpu, 2)
  return report


# ---------------------------------------------------------------- the guard

def _attempt(step: str, call) -> dict:
  """Runs one check; what it did: status, message, which warnings, seconds."""
  import warnings

  from nnx_pool.regression.guard import RegressionFailure

  start, cpu = time.perf_counter(), time.process_time()
  found: dict = {"step": step}
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
      outcome = call()
      found.update(status=outcome.status, message=outcome.message)
    except RegressionFailure as e:
      found.update(status=e.outcome.status, message=str(e), obtained=str(e.outcome.obtained))
    except Exception as e:  # noqa: BLE001 - a process's own error, reported
      found.update(status="raised", message=f"{type(e).__name__}: {e}")
  found["notes"] = [str(w.message) for w in caught if "nnx_regression" in str(w.message)]
  found["seconds"] = round(time.perf_counter() - start, 2)
  found["cpu_seconds"] = round(time.process_time() - cpu, 2)
  return found


# Below jax 0.10 a sharded gradient trips a custom_jvp shape/dtype check (docs/limits.md).
GRAD_FLOOR = f"sharded gradients need jax >= 0.10; this is jax {jax.__version__}"


def _raises_in_process_1(x):
  if jax.process_index() == 1:
    raise ValueError("process 1's own failure, while tracing")
  return x * 2.0


def guard(root: Path) -> list[dict]:
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from nnx_pool.regression.guard import Guard

  index = jax.process_index()
  mine = root / f"p{index}"
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  x = _global(inputs(), NamedSharding(mesh, P("data")))
  guard = Guard(mine / "b")  # weight sets go beside it, to mine / "_weights"
  blocked = mine / "blocked"  # a file where process 0's directory should be: cannot write
  if index == 0:
    blocked.write_text("not a directory\n")
  m = model()
  steps = [
      _attempt("one_fwd", lambda: guard.check("one_fwd", m, x)),
      _attempt("one_grad", lambda: guard.check_grad("one_grad", loss_fn, m, x, eager=False))
      if jax.__version_info__ >= (0, 10) else {"step": "one_grad", "status": "skipped",
                                               "message": GRAD_FLOOR},
      _attempt("two_fwd", lambda: guard.check("two_fwd", m, x, eager=False)),
      # Other fresh weights: the stored ones, which process 0 reads and sends, make it pass.
      _attempt("stored", lambda: guard.check("stored", model(seed=2), x, store_params=True,
                                             eager=False)),
      _attempt("raises", lambda: guard.check("raises", _raises_in_process_1, x, eager=False)),
      _attempt("moved", lambda: guard.check("one_fwd", model(seed=1), x, eager=False)),
      _attempt("unwritable", lambda: Guard(blocked / "sub").check("new", m, x, eager=False)),
  ]
  return steps


def faults(mode: str) -> list[dict]:
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from nnx_pool.regression.guard import Guard

  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  x = _global(inputs(), NamedSharding(mesh, P("data")))
  index = jax.process_index()

  def stop(y):
    if index == 1:
      if mode == "kill":  # as a scheduler or the OOM killer would
        os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))
      time.sleep(3600)
    return y + 1.0

  print(f"process {index} (pid {os.getpid()}) starts the check", flush=True)
  return [_attempt(mode, lambda: Guard(Path(sys.argv[2]) / f"p{index}").check(
      mode, stop, x, eager=False))]


def main() -> None:
  from nnx_pool.regression.processes import initialize

  start = time.perf_counter()
  initialize()
  mode, root = sys.argv[1], Path(sys.argv[2])
  report: dict = {"process": jax.process_index(), "processes": jax.process_count(),
                  "devices": jax.device_count(), "jax": jax.__version__}
  if mode in ("main", "spatial"):
    if jax.__version_info__ >= (0, 10):
      report["modules"] = modules(mode)
    else:
      report["modules_skipped"] = f"sharded use needs jax >= 0.10; this is jax {jax.__version__}"
  if mode == "main":
    report["guard"] = guard(root)
    mine = root / f"p{jax.process_index()}"
    report["files"] = sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*"))
  if mode in ("kill", "hang"):
    report["guard"] = faults(mode)
  report["seconds"] = round(time.perf_counter() - start, 2)
  report["cpu_seconds"] = round(time.process_time(), 2)  # since the interpreter started
  print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
  main()
