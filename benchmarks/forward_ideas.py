"""The last slow forwards, tried other ways: ``python -m benchmarks.forward_ideas``.

Issue 24 left two forwards above PyTorch: AvgPool 3x3/1 pad 1 excluding padding on
(8, 112, 112, 64), and the small whole-map forwards (GlobalAvgPool on (32, 7, 7, 512),
AdaptiveAvgPool 14->7). This times each formulation below in a fresh process of its
own (:func:`benchmarks.solo.contestant_process`), in rounds whose order rotates, and
prints medians, spreads, compile time and XLA's temporaries. Every formulation is
checked against the shipped module (within 1e-6) after it is timed (a
failing check fails the run).

AvgPool 3x3/1 pad 1, ``count_include_pad=False`` (the divisor is each window's count
of real cells, a constant array folded into the program):

* ``shipped``: ``nnx_pool.AvgPool``: nine shifted stride phases, each a small
  ``lax.pad`` that XLA fuses into one loop;
* ``pad_once``: one zero-padded copy, then nine slices of it summed;
* ``separable``: the 3-tap sum along H, then the 3-tap sum of that along W (six
  taps instead of nine, an intermediate array between them);
* ``separable_pad_once``: the same from one padded copy;
* ``reduce_window``: ``lax.reduce_window`` (``"xla"``, the lowering ``nnx.avg_pool``
  gets), divided the same way.

The small forwards, where a call is mostly dispatch: ``global`` (GlobalAvgPool on
(32, 7, 7, 512), against ``jnp.mean``) and ``adaptive`` (AdaptiveAvgPool 14->7 on
(8, 14, 14, 64), against a reshape and a mean). Each process also times a program that
does nothing with the same argument (``null_ms``), so ``call_ms - null_ms`` is the
kernel and ``null_ms`` what a call costs before any work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

import numpy as np

AVG_SHAPE = (8, 112, 112, 64)
SMALL_SHAPES = {"global": (32, 7, 7, 512), "adaptive": (8, 14, 14, 64)}


def _counts(h: int, w: int):
  """Real cells in each 3x3/1 pad 1 window, ``(1, h, w, 1)``."""
  rows = np.minimum(np.minimum(np.arange(h) + 2, h + 1 - np.arange(h)), 3)
  cols = np.minimum(np.minimum(np.arange(w) + 2, w + 1 - np.arange(w)), 3)
  return np.outer(rows, cols)[None, :, :, None].astype(np.float32)


def _three(x, axis: int, padded: bool):
  """The 3-tap sums along ``axis`` (pad 1 with zeros), from a padded copy or by pads."""
  import jax.numpy as jnp
  from jax import lax

  n = x.shape[axis] - (2 if padded else 0)
  if padded:
    return sum(lax.slice_in_dim(x, j, j + n, axis=axis) for j in range(3))
  pads = [(0, 0, 0)] * x.ndim
  out = x
  for shift in (1, -1):
    config = list(pads)
    config[axis] = (shift, -shift, 0)
    out = out + lax.pad(x, jnp.zeros((), x.dtype), config)
  return out


def formulations() -> dict[str, tuple[tuple[int, ...], Callable[[], Callable]]]:
  """Each formulation's input shape and a builder of its function."""
  import jax.numpy as jnp
  from jax import lax

  import nnx_pool

  inv = 1.0 / _counts(*AVG_SHAPE[1:3])

  def pad_once(x):
    p = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    h, w = x.shape[1:3]
    return sum(p[:, i:i + h, j:j + w] for i in range(3) for j in range(3)) * inv

  def separable(x):
    return _three(_three(x, 1, False), 2, False) * inv

  def separable_pad_once(x):
    p = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    return _three(_three(p, 1, True), 2, True) * inv

  def reduce_window(x):
    total = lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 1, 1, 1),
                              ((0, 0), (1, 1), (1, 1), (0, 0)))
    return total * inv

  avg = nnx_pool.AvgPool(3, 1, 1, count_include_pad=False)
  return {
      "shipped": (AVG_SHAPE, lambda: avg),
      "pad_once": (AVG_SHAPE, lambda: pad_once),
      "separable": (AVG_SHAPE, lambda: separable),
      "separable_pad_once": (AVG_SHAPE, lambda: separable_pad_once),
      "reduce_window": (AVG_SHAPE, lambda: reduce_window),
      "global ours": (SMALL_SHAPES["global"], lambda: nnx_pool.GlobalAvgPool()),
      "global jnp.mean": (SMALL_SHAPES["global"], lambda: lambda x: jnp.mean(x, axis=(1, 2))),
      "adaptive ours": (SMALL_SHAPES["adaptive"], lambda: nnx_pool.AdaptiveAvgPool(7)),
      "adaptive reshape+mean": (SMALL_SHAPES["adaptive"], lambda: lambda x: x.reshape(
          x.shape[0], 7, 2, 7, 2, x.shape[-1]).mean(axis=(2, 4))),
  }


def measure(name: str, calls: int, warmup: int) -> dict:
  """One formulation alone in this process: checked, then timed (benchmarks.contestant)."""
  import jax
  import jax.numpy as jnp

  from benchmarks.contestant import _jax

  shape, build = formulations()[name]
  x = jnp.asarray(np.random.default_rng(0).standard_normal(shape, dtype=np.float32))
  fn = build()
  result = _jax(fn, x, calls, warmup)  # first, so that its compile time is a real one
  reference = "shipped" if shape == AVG_SHAPE else name.split()[0] + " ours"
  want = formulations()[reference][1]()(x)
  np.testing.assert_allclose(np.asarray(jax.jit(fn)(x)), np.asarray(want), rtol=1e-6,
                             atol=1e-6)
  return result


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.forward_ideas",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--one", help="time one formulation in this process (internal)")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--calls", type=int, default=40)
  parser.add_argument("--warmup", type=int, default=3)
  args = parser.parse_args(argv)
  if args.one:
    json.dump(measure(args.one, args.calls, args.warmup), sys.stdout)
    print()
    return 0
  from benchmarks.solo import contestant_process

  names = list(formulations())
  results: dict[str, list[dict]] = {name: [] for name in names}
  for round_ in range(args.rounds):
    shift = round_ % len(names)
    for name in names[shift:] + names[:shift]:
      results[name].append(contestant_process("benchmarks.forward_ideas", [
          "--one", name, "--calls", str(args.calls), "--warmup", str(args.warmup)]))
  print(f"{args.rounds} processes per formulation, {args.calls} calls each; medians over "
        "processes [min-max]")
  print(f"{'formulation':24} {'ms per call':>20} {'null ms':>8} {'kernel ms':>9} "
        f"{'compile s':>9} {'temp MB':>8}")
  for name, rows in results.items():
    ms = [r["call_ms"] for r in rows]
    null = statistics.median(r["null_ms"] for r in rows)
    call = statistics.median(ms)
    print(f"{name:24} {call:8.3f} [{min(ms):.3f}-{max(ms):.3f}] {null:8.3f} "
          f"{call - null:9.3f} {statistics.median(r['compile_s'] for r in rows):9.2f} "
          f"{rows[0]['temp_bytes'] / 2**20:8.1f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
