"""What each way of running costs a real model's guard: ``python -m benchmarks.guard_cost``.

The numbers behind docs/regression.md, "Three ways to run". ``EffNet()`` of
``tests/_effnet.py`` (4,020,358 parameters, NumPy-initialised) on 2x64x64x3 images, guarded
as guide 10 does: its eval-mode logits (``check``) and the gradient of a cross-entropy
(``check_grad``), recorded into a new directory and then rechecked, by default (one jitted
program that also returns the layers' outputs), with the eager run too (``eager=True``) and
under jit only (``eager=False``). Each of the six phases runs in a process of its own (a
fresh compile cache, as a new pytest session has), ``--rounds`` times in rotation; it prints
the median and the spread of each phase's wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PHASE = """
import runpy, sys, time
t0 = time.perf_counter()
import jax, jax.numpy as jnp
from nnx_pool.regression.guard import Guard
e = runpy.run_path(sys.argv[1])
model = e["effnet_cheaply"]()
x, labels = e["images"](2, 64), jnp.array([3, 7])
def loss(model, x, labels, training=False):
  logits = model(x, training=training)
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))
eager = {"default": None, "eager": True, "jit": False}[sys.argv[3]]
t1 = time.perf_counter()
guard = Guard(sys.argv[2])
a = guard.check("logits", model, x, training=False, eager=eager).status
b = guard.check_grad("grads", loss, model, x, labels, training=False, eager=eager).status
print(a, b, round(time.perf_counter() - t1, 3), round(t1 - t0, 3))
"""


def _phase(directory: Path, mode: str, expect: str) -> float:
  out = subprocess.run([sys.executable, "-c", PHASE, str(ROOT / "tests" / "_effnet.py"),
                        str(directory), mode], capture_output=True, text=True, check=True,
                       cwd=ROOT)
  first, second, seconds, _ = out.stdout.split()
  if (first, second) != (expect, expect):
    raise SystemExit(f"{mode}: expected {expect}, got {first} {second}")
  return float(seconds)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args()
  times: dict[str, list[float]] = {}
  for _ in range(args.rounds):
    for mode in ("default", "eager", "jit"):
      with tempfile.TemporaryDirectory() as tmp:
        times.setdefault(f"record, {mode}", []).append(_phase(Path(tmp), mode, "written"))
        times.setdefault(f"recheck, {mode}", []).append(_phase(Path(tmp), mode, "passed"))
  for phase, values in times.items():
    print(f"{phase:18} median {statistics.median(values):6.1f} s  "
          f"(min {min(values):.1f}, max {max(values):.1f}, {len(values)} runs)")
  print(json.dumps({"date": time.strftime("%Y-%m-%d"), "seconds": times}))


if __name__ == "__main__":
  main()
