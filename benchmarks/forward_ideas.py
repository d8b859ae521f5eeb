"""The rows above 1.0, tried other ways: ``python -m benchmarks.forward_ideas``.

Issue 31 left these rows of the solo table above the faster peer: the whole-map reductions
(GlobalAvgPool, AdaptiveAvgPool 56->7, the SE gate's mean), AvgPool 2x2/2, AvgPool 3x3/1
pad 1 excluding padding, and BlurPool. This times each formulation below in a fresh
process of its own (:func:`benchmarks.solo.contestant_process`), in rounds whose order
rotates, and prints medians, spreads, minor page faults per call, compile time and XLA's
temporaries. Every formulation is checked against the shipped module (within 1e-5 of
its output, or of its gradient for a ``bwd`` row) after it is timed; a failing check fails
the run. ``-k`` picks formulations by name.

The roads to a sum tried, each against the shipped kernel:

* ``dot ones``: a ``dot_general`` against a vector of ones, which XLA:CPU runs on its
  GEMM library (Eigen) rather than its reduction loop;
* ``bin matrices``: the adaptive average as two small matrix products with the
  bin-averaging matrices (rows, then columns). Their zeros turn one NaN or infinity
  into NaN across its whole row of bins (``0 * inf``), so it could not ship even if it
  were faster; it is timed to know;
* ``slices``: the reduction unrolled into one strided slice per cell, added in one loop;
* ``reshape mean``: the reshape and ``mean`` a Flax user writes;
* ``reduce_window``: XLA's own window reduction (the ``"xla"`` implementation);
* for the window sums and the blur, the previous kernels: every tap read through a pad
  (``padded taps``, ``BOX_MIN_POSITIONS`` raised past the map) or from one padded copy
  (``pad once``, and the blur's ``padded copy``: ``F.pad`` then one strided pass per dim),
  and the blur as the depthwise convolution PyTorch runs (``depthwise conv``).

Formulations named ``... small`` and ``... large`` run the shipped kernel and its
predecessor on a smaller and a larger map than the benchmark row's, to check that what
wins there wins across shapes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

import numpy as np

AVG3 = (8, 112, 112, 64)
BLUR = (8, 56, 56, 128)
GLOBAL = (32, 7, 7, 512)
ADAPTIVE = (8, 56, 56, 64)
SE = (32, 14, 14, 256)
SIZES = {"small": {AVG3: (8, 56, 56, 64), BLUR: (8, 28, 28, 128)},
         "large": {AVG3: (8, 224, 224, 64), BLUR: (8, 112, 112, 128)}}


def _no_boxes() -> None:
  """The kernels as they were before the box split: every tap read through a pad."""
  import nnx_pool._taps

  nnx_pool._taps.BOX_MIN_POSITIONS = 2**62


def _counts(h: int, w: int):
  """Real cells in each 3x3/1 pad 1 window, ``(1, h, w, 1)``."""
  rows = np.minimum(np.minimum(np.arange(h) + 2, h + 1 - np.arange(h)), 3)
  cols = np.minimum(np.minimum(np.arange(w) + 2, w + 1 - np.arange(w)), 3)
  return np.outer(rows, cols)[None, :, :, None].astype(np.float32)


def _avg3(x):
  import nnx_pool

  return nnx_pool.AvgPool(3, 1, 1, count_include_pad=False)(x)


def _avg3_pad_once(x):
  import jax.numpy as jnp

  from nnx_pool._numerics import true_divide

  p = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  h, w = x.shape[1:3]
  return true_divide(sum(p[:, i:i + h, j:j + w] for i in range(3) for j in range(3)),
                     _counts(h, w))


def _avg3_reduce_window(x):
  from nnx_pool import use_implementation

  with use_implementation("xla"):
    return _avg3(x)


def _blur(x):
  import nnx_pool

  return nnx_pool.BlurPool(3, 2)(x)


def _blur_padded_copy(x):
  """The blur before issue 31: ``F.pad`` (reflect) materialised, one strided pass per dim."""
  from nnx_pool._blur import binomial_filter, strided_sum, torch_pad

  y = torch_pad(x, ((1, 1), (1, 1)), "reflect")
  for axis in (1, 2):
    y = strided_sum(y, axis, binomial_filter(3), 2)
  return y


def _blur_depthwise(x):
  import jax.numpy as jnp
  from jax import lax

  taps = np.outer([1.0, 2.0, 1.0], [1.0, 2.0, 1.0]).astype(np.float32) / 16
  kernel = np.broadcast_to(taps[:, :, None, None], (3, 3, 1, x.shape[-1])).copy()
  padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="reflect")
  return lax.conv_general_dilated(padded, kernel, (2, 2), "VALID",
                                  dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                  feature_group_count=x.shape[-1])


def _dot_ones(x, axes: tuple[int, ...]):
  """Sum over ``axes`` as a ``dot_general`` against ones (the GEMM library), then the mean."""
  import jax.numpy as jnp
  from jax import lax

  ones = jnp.ones([x.shape[a] for a in axes], x.dtype)
  total = lax.dot_general(x, ones, ((axes, tuple(range(len(axes)))), ((), ())))
  return total / float(np.prod([x.shape[a] for a in axes]))


def _global_slices(x):
  n, h, w, c = x.shape
  total = None
  for i in range(h):
    for j in range(w):
      total = x[:, i, j] if total is None else total + x[:, i, j]
  return total / float(h * w)


def _bin_matrix(length: int, out: int) -> np.ndarray:
  """``(out, length)``: row ``i`` averages PyTorch's adaptive bin ``i``."""
  from nnx_pool._geometry import adaptive_bins

  start, end = adaptive_bins(length, out)
  m = np.zeros((out, length), np.float32)
  for i, (a, b) in enumerate(zip(start, end, strict=True)):
    m[i, a:b] = 1.0 / (b - a)
  return m


def _adaptive_bin_matrices(x):
  import jax.numpy as jnp

  rows, cols = _bin_matrix(x.shape[1], 7), _bin_matrix(x.shape[2], 7)
  return jnp.einsum("ih,nhwc,jw->nijc", rows, x, cols)


def _adaptive_dot_ones(x):
  n, h, w, c = x.shape
  return _dot_ones(x.reshape(n, 7, h // 7, 7, w // 7, c), (2, 4))


def _se():
  """The benchmark row's gate, built outside any trace (benchmarks.cases shares it)."""
  from benchmarks.cases import _se as se

  return se(SE[-1])


def _se_dot_ones():
  """The SE gate with its squeeze a dot against ones (the shipped gate's weights)."""
  from flax import nnx

  gate = _se()

  def run(x):
    hidden = nnx.relu(gate.fc1(_dot_ones(x, (1, 2))))
    return x * nnx.sigmoid(gate.fc2(hidden))[:, None, None, :]

  return run


def _module(name: str) -> Callable:
  import nnx_pool

  return {"global": nnx_pool.GlobalAvgPool(), "adaptive": nnx_pool.AdaptiveAvgPool(7),
          "avg2": nnx_pool.AvgPool(2)}[name]


# name -> (input shape, builder of the function, its reference's name, backward?, setup)
Formulation = tuple[tuple[int, ...], Callable[[], Callable], str, bool, Callable[[], None] | None]


def formulations() -> dict[str, Formulation]:
  import jax.numpy as jnp

  table: dict[str, Formulation] = {
      "avg3 shipped (boxes)": (AVG3, lambda: _avg3, "", False, None),
      "avg3 padded taps": (AVG3, lambda: _avg3, "avg3 shipped (boxes)", False, _no_boxes),
      "avg3 pad once": (AVG3, lambda: _avg3_pad_once, "avg3 shipped (boxes)", False, None),
      "avg3 reduce_window": (AVG3, lambda: _avg3_reduce_window, "avg3 shipped (boxes)", False,
                             None),
      "avg3 bwd shipped (boxes)": (AVG3, lambda: _avg3, "", True, None),
      "avg3 bwd padded taps": (AVG3, lambda: _avg3, "avg3 bwd shipped (boxes)", True, _no_boxes),
      "blur shipped (boxes)": (BLUR, lambda: _blur, "", False, None),
      "blur views, one box": (BLUR, lambda: _blur, "blur shipped (boxes)", False, _no_boxes),
      "blur padded copy": (BLUR, lambda: _blur_padded_copy, "blur shipped (boxes)", False, None),
      "blur depthwise conv": (BLUR, lambda: _blur_depthwise, "blur shipped (boxes)", False, None),
      "blur bwd shipped (boxes)": (BLUR, lambda: _blur, "", True, None),
      "blur bwd views, one box": (BLUR, lambda: _blur, "blur bwd shipped (boxes)", True,
                                  _no_boxes),
      "blur bwd padded copy": (BLUR, lambda: _blur_padded_copy, "blur bwd shipped (boxes)", True,
                               None),
      "global shipped": (GLOBAL, lambda: _module("global"), "", False, None),
      "global jnp.mean": (GLOBAL, lambda: lambda x: jnp.mean(x, axis=(1, 2)), "global shipped",
                          False, None),
      "global dot ones": (GLOBAL, lambda: lambda x: _dot_ones(x, (1, 2)), "global shipped",
                          False, None),
      "global slices": (GLOBAL, lambda: _global_slices, "global shipped", False, None),
      "adaptive shipped": (ADAPTIVE, lambda: _module("adaptive"), "", False, None),
      "adaptive reshape mean": (ADAPTIVE, lambda: lambda x: x.reshape(
          8, 7, 8, 7, 8, x.shape[-1]).mean(axis=(2, 4)), "adaptive shipped", False, None),
      "adaptive dot ones": (ADAPTIVE, lambda: _adaptive_dot_ones, "adaptive shipped", False,
                            None),
      "adaptive bin matrices": (ADAPTIVE, lambda: _adaptive_bin_matrices, "adaptive shipped",
                                False, None),
      "se shipped": (SE, _se, "", False, None),
      "se dot ones": (SE, _se_dot_ones, "se shipped", False, None),
      "avg2 shipped": (AVG3, lambda: _module("avg2"), "", False, None),
      "avg2 reshape mean": (AVG3, lambda: lambda x: x.reshape(
          8, 56, 2, 56, 2, x.shape[-1]).mean(axis=(2, 4)), "avg2 shipped", False, None),
      "avg2 dot ones": (AVG3, lambda: lambda x: _dot_ones(
          x.reshape(8, 56, 2, 56, 2, x.shape[-1]), (2, 4)), "avg2 shipped", False, None),
  }
  for size, shapes in SIZES.items():  # the kept formulations against their predecessors
    for name in ("avg3 shipped (boxes)", "avg3 padded taps", "blur shipped (boxes)",
                 "blur padded copy", "blur bwd shipped (boxes)", "blur bwd padded copy"):
      shape, build, reference, backward, setup = table[name]
      reference = reference and f"{reference} {size}"
      table[f"{name} {size}"] = (shapes[shape], build, reference, backward, setup)
  return table


def measure(name: str, calls: int, warmup: int) -> dict:
  """One formulation alone in this process: timed (benchmarks.contestant), then checked."""
  import jax
  import jax.numpy as jnp

  from benchmarks.contestant import _jax

  shape, build, reference, backward, setup = formulations()[name]
  if setup is not None:
    setup()
  x = jnp.asarray(np.random.default_rng(0).standard_normal(shape, dtype=np.float32))

  def program(f):
    return jax.grad(lambda a: jnp.sum(f(a) ** 2)) if backward else f

  fn = program(build())
  result = _jax(fn, x, calls, warmup, faults=True)  # first, so that its compile is a real one
  if reference:
    want = jax.jit(program(formulations()[reference][1]()))(x)
    np.testing.assert_allclose(np.asarray(jax.jit(fn)(x)), np.asarray(want), rtol=1e-5,
                               atol=1e-5)
  return result


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.forward_ideas",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--one", help="time one formulation in this process (internal)")
  parser.add_argument("-k", default="", help="only formulations whose name contains this")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--calls", type=int, default=40)
  parser.add_argument("--warmup", type=int, default=3)
  args = parser.parse_args(argv)
  if args.one:
    json.dump(measure(args.one, args.calls, args.warmup), sys.stdout)
    print()
    return 0
  import os

  from benchmarks.solo import contestant_process

  names = [name for name in formulations() if args.k in name]
  results: dict[str, list[dict]] = {name: [] for name in names}
  print(f"load average at the start: {os.getloadavg()[0]:.2f}", flush=True)
  for round_ in range(args.rounds):
    shift = round_ % len(names)
    for name in names[shift:] + names[:shift]:
      results[name].append(contestant_process("benchmarks.forward_ideas", [
          "--one", name, "--calls", str(args.calls), "--warmup", str(args.warmup)]))
  print(f"load average at the end: {os.getloadavg()[0]:.2f}")
  print(f"{args.rounds} processes per formulation, {args.calls} calls each; medians over "
        "processes [min-max]; faults: minor page faults per call, median")
  print(f"{'formulation':34} {'ms per call':>22} {'faults':>7} {'compile s':>9} {'temp MB':>8}")
  for name, rows in results.items():
    ms = [r["call_ms"] for r in rows]
    print(f"{name:34} {statistics.median(ms):8.3f} [{min(ms):.3f}-{max(ms):.3f}] "
          f"{statistics.median(r['faults_per_call'] for r in rows):7.0f} "
          f"{statistics.median(r['compile_s'] for r in rows):9.2f} "
          f"{rows[0]['temp_bytes'] / 2**20:8.1f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
