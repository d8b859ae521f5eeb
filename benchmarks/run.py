"""CPU benchmark: nnx_pool against flax.nnx and PyTorch (channels_last), in one process.

Each case times the forward pass and the forward+backward pass (the gradient
of ``sum(y ** 2)`` with respect to the input) for three implementations:

* ``ours``: the nnx_pool module under ``jax.jit``;
* ``flax``: the ``flax.nnx`` function (or the plain jnp equivalent) under
  ``jax.jit``, differentiated by ``jax.grad``;
* ``torch``: PyTorch CPU on a ``channels_last`` tensor (the NHWC memory our
  inputs have), under ``torch.no_grad`` for the forward.

Compile time (``lower`` + ``compile``) is measured once and reported apart.
Steady-state times are medians over rounds that run the three implementations
of one pass in turn (the order rotating from round to round), after warmup,
with ``block_until_ready``, so load on a shared machine hits them alike. The
memory floor is the bytes a pass must read and write at least, over the copy
bandwidth measured in the same process.

Run ``python -m benchmarks`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import nnx_pool
from benchmarks.cases import CASES, Case
from nnx_pool.regression.cli.parser import positive_int

try:
  import torch
except ImportError:  # the torch column is then left out
  torch = None


_CALLS_PER_VISIT = 3


def _median_ms(samples: Sequence[float]) -> float:
  return statistics.median(samples) * 1e3


def copy_bandwidth(nbytes: int = 256 * 2**20, rounds: int = 9) -> float:
  """Bytes per second of a jitted copy (read + write) of a ``nbytes`` float32 array."""
  x = jnp.ones((nbytes // 4,), jnp.float32)
  copy = jax.jit(lambda a: a + 1.0)
  jax.block_until_ready(copy(x))
  samples = []
  for _ in range(rounds):
    start = time.perf_counter()
    jax.block_until_ready(copy(x))
    samples.append(time.perf_counter() - start)
  return 2 * nbytes / statistics.median(samples)


@dataclasses.dataclass
class Timer:
  """One implementation of one pass: a zero-argument callable that blocks until done."""

  name: str
  run: Callable[[], object]
  compile_s: float | None = None
  samples: list[float] = dataclasses.field(default_factory=list)


def _jax_timer(name: str, fn, x) -> Timer:
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(x).compile()
  compile_s = time.perf_counter() - start
  return Timer(name, lambda: jax.block_until_ready(compiled(x)), compile_s)


# Where the torch column runs: "cpu" here, "cuda" in benchmarks/device_check.py.
TORCH_DEVICE = "cpu"


def _torch_timers(case: Case, x_np: np.ndarray) -> tuple[Timer, Timer] | None:
  if torch is None or case.torch is None:
    return None
  with torch.device(TORCH_DEVICE):  # a case's own weights are made on the device too
    fn = case.torch(torch)
  # NHWC memory seen as NCHW: exactly torch's channels_last layout.
  x = torch.from_numpy(np.array(x_np)).to(TORCH_DEVICE)
  x = x.permute(0, case.ndim + 1, *range(1, case.ndim + 1))
  x_grad = x.detach().clone().requires_grad_(True)
  sync = torch.cuda.synchronize if TORCH_DEVICE.startswith("cuda") else (lambda: None)

  def forward():
    with torch.no_grad():
      y = fn(x)
    sync()
    return y

  def backward():
    x_grad.grad = None
    (fn(x_grad) ** 2).sum().backward()
    sync()
    return x_grad.grad

  return Timer("torch", forward), Timer("torch", backward)


def run_case(case: Case, rounds: int, warmup: int, bandwidth: float) -> dict:
  """Times one case; returns its row for the table and the JSON report."""
  rng = np.random.default_rng(0)
  x_np = rng.standard_normal(case.shape, dtype=np.float32)
  x = jnp.asarray(x_np)
  ours, peer = case.ours(), case.flax
  def grad_of_square(f):
    return jax.grad(lambda a: jnp.sum(f(a) ** 2))

  forward = [_jax_timer("ours", ours, x), _jax_timer("flax", peer, x)]
  backward = [_jax_timer("ours", grad_of_square(ours), x),
              _jax_timer("flax", grad_of_square(peer), x)]
  torch_timers = _torch_timers(case, x_np)
  if torch_timers is not None:
    forward.append(torch_timers[0])
    backward.append(torch_timers[1])
  # The same numbers, or the comparison means nothing.
  np.testing.assert_allclose(
      np.asarray(jax.jit(ours)(x)), np.asarray(jax.jit(peer)(x)), rtol=1e-5, atol=1e-5
  )
  for timer in forward + backward:
    for _ in range(warmup):
      timer.run()
  # Each pass is timed on its own, in rounds that visit its implementations in turn,
  # so load drift hits all alike. The order rotates from round to round: whatever
  # runs first after the previous pass (or round) pays for it, and with a fixed order
  # it was always the same one (measured: a 0.75 ms forward took 1.8 ms right after
  # a 70 ms backward, for ours and Flax alike). Within a visit, one untimed call
  # first: switching between runtimes leaves the other's thread pool spinning or
  # asleep, and PyTorch pays about 6 ms to wake its OpenMP threads after a JAX call
  # here; only the calls after that are timed.
  for timers in (forward, backward):
    for round_ in range(rounds):
      shift = round_ % len(timers)
      for timer in timers[shift:] + timers[:shift]:
        timer.run()
        for _ in range(_CALLS_PER_VISIT):
          start = time.perf_counter()
          timer.run()
          timer.samples.append(time.perf_counter() - start)
  out_shape = jax.eval_shape(ours, x).shape
  in_bytes, out_bytes = x.size * 4, int(np.prod(out_shape)) * 4
  floors = {
      # Forward reads x and writes y; backward also reads the cotangent and writes dx.
      "forward": (in_bytes + out_bytes) / bandwidth * 1e3,
      "backward": (2 * in_bytes + 2 * out_bytes) / bandwidth * 1e3,
  }
  row = {"case": case.name, "shape": list(case.shape), "out_shape": list(out_shape)}
  for pass_name, timers in (("forward", forward), ("backward", backward)):
    row[pass_name] = {
        **summary({t.name: _median_ms(t.samples) for t in timers}, floors[pass_name]),
        "compile_s": {t.name: t.compile_s for t in timers if t.compile_s is not None},
    }
  return row


def summary(medians: dict[str, float], floor_ms: float) -> dict:
  """One pass of a row: the medians, ours over the faster peer, ours over the memory floor."""
  best_peer = min(v for k, v in medians.items() if k != "ours")
  return {"median_ms": medians, "ratio_to_best_peer": medians["ours"] / best_peer,
          "floor_ms": floor_ms, "ratio_to_floor": medians["ours"] / floor_ms}


def environment() -> dict:
  return {
      "python": platform.python_version(),
      "jax": jax.__version__,
      "jaxlib": importlib.metadata.version("jaxlib"),
      "flax": importlib.metadata.version("flax"),
      "torch": None if torch is None else torch.__version__,
      "torch_threads": None if torch is None else torch.get_num_threads(),
      "backend": jax.default_backend(),
      "implementation": nnx_pool.current_implementation(),
      "device": jax.devices()[0].device_kind,
      "cpu_count": os.cpu_count(),
      "machine": platform.machine(),
      "processor": _cpu_model(),
      "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  }


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor()


def format_table(rows: list[dict], env: dict, bandwidth: float) -> str:
  lines = [
      f"jax {env['jax']}, flax {env['flax']}, torch {env['torch']} "
      f"({env['torch_threads']} threads), {env['processor']}, {env['cpu_count']} CPUs",
      f"copy bandwidth {bandwidth / 1e9:.1f} GB/s; medians in ms; ratio = ours / faster peer "
      f"(<= 1.00 meets the target); floor = ours / memory floor",
      "",
      f"{'case':34} {'pass':8} {'ours':>8} {'flax':>8} {'torch':>8} {'ratio':>6} "
      f"{'floor':>6} {'compile s (ours/flax)':>22}",
  ]
  for row in rows:
    for pass_name in ("forward", "backward"):
      r = row[pass_name]
      m, c = r["median_ms"], r["compile_s"]
      torch_ms = f"{m['torch']:8.2f}" if "torch" in m else f"{'-':>8}"
      lines.append(
          f"{row['case']:34} {'fwd' if pass_name == 'forward' else 'fwd+bwd':8} "
          f"{m['ours']:8.2f} {m['flax']:8.2f} {torch_ms} {r['ratio_to_best_peer']:6.2f} "
          f"{r['ratio_to_floor']:6.1f} {c['ours']:10.2f} / {c['flax']:<9.2f}"
      )
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
  parser.add_argument("--json", default=None, help="write the report here as JSON")
  parser.add_argument("-k", default="", help="only cases whose name contains this")
  parser.add_argument("--rounds", type=int, default=15, help="timed rounds per case (default 15)")
  parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
  parser.add_argument("--quick", action="store_true", help="tiny shapes, for the smoke test")
  parser.add_argument("--torch-device", default="cpu", help='where PyTorch runs (default "cpu")')
  parser.add_argument("--batch", type=positive_int, default=None,
                      help="every row at this batch size (default: each row's own)")
  parser.add_argument("--implementation", choices=nnx_pool.IMPLEMENTATIONS, default=None,
                      help="our window kernels (default: this backend's, nnx_pool._backend)")
  args = parser.parse_args(argv)
  cases = [c for c in CASES if args.k in c.name]
  if not cases:
    parser.error(f"no case name contains {args.k!r}")
  if args.batch is not None:
    cases = [c.with_batch(args.batch) for c in cases]
  global TORCH_DEVICE
  TORCH_DEVICE = args.torch_device
  with nnx_pool.use_implementation(args.implementation or nnx_pool.current_implementation()):
    return _run(args, cases)


def _run(args, cases: list[Case]) -> int:
  if args.quick:
    cases = [c.tiny() for c in cases]
  bandwidth = copy_bandwidth(4 * 2**20 if args.quick else 256 * 2**20)
  env = environment()
  rows = []
  for case in cases:
    rows.append(run_case(case, args.rounds, args.warmup, bandwidth))
    print(f"  done {case.name}", file=sys.stderr, flush=True)
  print(format_table(rows, env, bandwidth))
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"environment": env, "copy_bandwidth_Bps": bandwidth, "rows": rows}, f, indent=2)
  return 0
