"""One contestant of one benchmark row, alone in this process: ``python -m benchmarks.contestant``.

:mod:`benchmarks.solo` starts this module once per contestant per round, so that
no other framework's thread pool or freed memory shares the process (interleaving
JAX and PyTorch call by call in one process distorted both by up to 2x, measured:
docs/benchmarks.md). It prints one JSON object:

* ``compile_s`` (JAX): ``lower`` + ``compile`` of the program;
* ``call_ms``: the median of single calls after warmup, each ended by
  ``block_until_ready`` (PyTorch: ``torch.cuda.synchronize`` on a GPU): what a user's
  call costs, dispatch included;
* ``null_ms``: the same for a program that does nothing with the same argument (JAX:
  a jitted one-element slice; PyTorch: a one-element slice). ``call_ms - null_ms`` is
  the kernel, ``null_ms`` the dispatch overhead: what rows under a millisecond
  measure as much as their kernel;
* ``temp_bytes`` (JAX): XLA's temporaries of the program
  (``compiled.memory_analysis().temp_size_in_bytes``), deterministic;
  ``saved_bytes`` (PyTorch, forward+backward): the tensors autograd saves for the
  backward (``torch.autograd.graph.saved_tensors_hooks``), the input's storage left out;
* ``floor_ms``: the time of the row's unavoidable memory traffic, measured in this
  process as a jitted copy of as many bytes as the pass reads and writes once (forward:
  the input and the output; forward+backward: also the cotangent and the gradient).

Timing ten calls inside one jitted program, to take dispatch out, was tried and
dropped (docs/benchmarks.md): XLA:CPU compiles ``lax.map`` of a pool 7-10x slower
than the pool alone, removes unrolled calls whose results are unused (through an
``optimization_barrier``), and runs independent ones side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np


def _median_ms(samples: list[float]) -> float:
  return statistics.median(samples) * 1e3


def _timed(run: Callable[[], object], calls: int) -> list[float]:
  samples = []
  for _ in range(calls):
    start = time.perf_counter()
    run()
    samples.append(time.perf_counter() - start)
  return samples


def faults_per_call(run: Callable[[], object], calls: int) -> float:
  """Minor page faults of this process per call of ``run`` (every thread counts)."""
  import resource

  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  for _ in range(calls):
    run()
  return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def floor_ms(nbytes: int, calls: int = 9) -> float:
  """Milliseconds of a jitted copy that reads and writes ``nbytes`` in all."""
  import jax
  import jax.numpy as jnp

  x = jnp.ones((max(nbytes // 8, 1),), jnp.float32)  # half read, half written
  copy = jax.jit(lambda a: a + 1.0).lower(x).compile()
  jax.block_until_ready(copy(x))
  return _median_ms(_timed(lambda: jax.block_until_ready(copy(x)), calls))


def _jax(fn, x, calls: int, warmup: int, faults: bool = False) -> dict:
  """Times a jitted ``fn`` of one array, and a jitted program that does nothing with it."""
  import jax

  start = time.perf_counter()
  program = jax.jit(fn).lower(x).compile()
  compile_s = time.perf_counter() - start
  null = jax.jit(lambda a: a.reshape(-1)[:1]).lower(x).compile()

  def call():
    return jax.block_until_ready(program(x))

  for _ in range(warmup):
    call()
    jax.block_until_ready(null(x))
  result = {"compile_s": compile_s, "call_ms": _median_ms(_timed(call, calls)),
            "null_ms": _median_ms(_timed(lambda: jax.block_until_ready(null(x)), calls)),
            "temp_bytes": int(program.memory_analysis().temp_size_in_bytes)}
  if faults:
    result["faults_per_call"] = faults_per_call(call, calls)
  return result


def _torch(fn, x, backward: bool, calls: int, warmup: int, device: str,
           faults: bool = False) -> dict:
  """Times a PyTorch ``fn`` of one tensor, and a one-element slice of it."""
  import torch

  sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
  if backward:
    leaf = x.detach().clone().requires_grad_(True)

    def step():
      leaf.grad = None
      (fn(leaf) ** 2).sum().backward()
      sync()
      return leaf.grad
  else:
    def step():
      with torch.no_grad():
        out = fn(x)
      sync()
      return out

  def null():
    out = x.reshape(-1)[:1].clone()
    sync()
    return out

  for _ in range(warmup):
    step()
    null()
  result = {"call_ms": _median_ms(_timed(step, calls)),
            "null_ms": _median_ms(_timed(null, calls))}
  if faults:
    result["faults_per_call"] = faults_per_call(step, calls)
  if backward:
    result["saved_bytes"] = saved_bytes(fn, leaf)
  return result


def saved_bytes(fn, x) -> int:
  """Bytes of the tensors autograd saves for ``sum(fn(x) ** 2)``'s backward, x's left out."""
  import torch

  storages: dict[int, int] = {}
  own = x.untyped_storage().data_ptr()

  def pack(t):
    storage = t.untyped_storage()
    if storage.data_ptr() != own:
      storages[storage.data_ptr()] = storage.nbytes()
    return t

  with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    loss = (fn(x) ** 2).sum()
  del loss
  return sum(storages.values())


def measure(case_name: str, contestant: str, pass_name: str, *, quick: bool, calls: int,
            warmup: int, torch_device: str = "cpu", faults: bool = False) -> dict:
  """One contestant's figures for one pass of one row (see the module docstring)."""
  from benchmarks.cases import by_name

  case = by_name(case_name, quick=quick)
  backward = pass_name == "backward"
  x = np.random.default_rng(0).standard_normal(case.shape, dtype=np.float32)
  nbytes = 4 * (case.size() + case.out_size()) * (2 if backward else 1)
  if contestant == "torch":
    import torch

    fn, (tensor,) = case.torch_inputs(torch, [x], torch_device)
    result = _torch(fn, tensor, backward, calls, warmup, torch_device, faults)
  else:
    import jax
    import jax.numpy as jnp

    fn = case.ours() if contestant == "ours" else case.flax
    if backward:
      fn = jax.grad(lambda a, f=fn: jnp.sum(f(a) ** 2))
    result = _jax(fn, jnp.asarray(x), calls, warmup, faults)
  result["floor_ms"] = floor_ms(nbytes)
  return result


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.contestant",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("case")
  parser.add_argument("contestant", choices=("ours", "flax", "torch"))
  parser.add_argument("pass_name", choices=("forward", "backward"))
  parser.add_argument("--calls", type=int, default=40)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--torch-device", default="cpu")
  parser.add_argument("--faults", action="store_true", help="also count minor page faults")
  args = parser.parse_args(argv)
  result = measure(args.case, args.contestant, args.pass_name, quick=args.quick,
                   calls=args.calls, warmup=args.warmup, torch_device=args.torch_device,
                   faults=args.faults)
  json.dump(result, sys.stdout)
  print()
  return 0


if __name__ == "__main__":
  sys.exit(main())
