"""The max-pool adjoint, four ways: the evidence for the one ``nnx_pool._adjoint`` ships.

A differentiated max stores each output's winning window offset; the backward
adds each output's cotangent to the input cell its offset names. Four exact
formulations of that adjoint, timed side by side in one process on the
ResNet stem's max pool (3x3, stride 2, padding 1) and counted in fusions of
the optimized HLO:

* ``phase`` (shipped): per stride phase, the taps that land on it summed, each
  phase then placed on its cells by a ``lax.pad`` with interior ``stride - 1``;
* ``interior``: every tap's masked cotangent interior-padded into place, and
  the taps summed;
* ``gather``: each input cell reads the few windows that contain it
  (cotangent and offsets upsampled by repetition) and keeps those whose
  offset names it;
* ``recompute``: no stored offset; the backward recomputes each window's
  winner from the input, then gathers.

Every one is checked bit for bit against the shipped adjoint before it is
timed. The shipped forward+backward is then timed whole, with the size of its
temporaries and the minor page faults each call takes (a temporary faulted in
again on every call costs as much as the pooling itself). Run
``python -m benchmarks.formulations`` (``--shape 8,56,56,64`` for another input);
docs/benchmarks.md quotes a run.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from nnx_pool import MaxPool
from nnx_pool._adjoint import scatter
from nnx_pool._geometry import Window, effective_window
from nnx_pool._select import arg_select


def interior(ct, arg, geom):
  zero = jnp.zeros((), ct.dtype)
  total = None
  for offsets in itertools.product(*(range(d.window) for d in geom.dims)):
    offset, config = 0, [(0, 0, 0)]
    for j, d in zip(offsets, geom.dims, strict=True):
      offset = offset * d.window + j
      low = j * d.dilation - d.pad_low
      config.append((low, d.length - low - (d.out - 1) * d.stride - 1, d.stride - 1))
    config.append((0, 0, 0))
    term = lax.pad(jnp.where(arg == offset, ct, zero), zero, config)
    total = term if total is None else total + term
  return total


def _repeat(a, geom):
  """``a[q]`` at every padded position ``q * s + r``: each dim repeated ``stride`` times."""
  for axis, d in enumerate(geom.dims, start=1):
    a = jnp.repeat(a, d.stride, axis=axis)
  return a


def gather(ct, arg, geom):
  zero = jnp.zeros((), ct.dtype)
  dims = geom.dims
  # Position P of the padded input is tap j of window q = P // s - m when
  # j * dilation = P % s + m * s < the effective window.
  shifts = [range(-(-effective_window(d.window, d.dilation) // d.stride)) for d in dims]
  windows = [-(-(d.pad_low + d.length) // d.stride) for d in dims]
  config = [(0, 0, 0), *((len(m) - 1, max(0, q - d.out), 0)
                         for d, m, q in zip(dims, shifts, windows, strict=True)), (0, 0, 0)]
  ct = lax.pad(ct, zero, config)
  arg = lax.pad(arg, jnp.asarray(-1, arg.dtype), config)
  crop_start = (0, *(d.pad_low for d in dims), 0)
  crop_limit = (ct.shape[0], *(d.pad_low + d.length for d in dims), ct.shape[-1])
  total = None
  for ms in itertools.product(*shifts):
    start = (0, *(len(m) - 1 - k for m, k in zip(shifts, ms, strict=True)), 0)
    limit = (ct.shape[0], *(s + q for s, q in zip(start[1:-1], windows, strict=True)),
             ct.shape[-1])
    c = lax.slice(_repeat(lax.slice(ct, start, limit), geom), crop_start, crop_limit)
    a = lax.slice(_repeat(lax.slice(arg, start, limit), geom), crop_start, crop_limit)
    want, valid = None, None
    for axis, (d, k) in enumerate(zip(dims, ms, strict=True), start=1):
      shape = (1,) * axis + (d.length,) + (1,) * (len(dims) - axis + 1)
      tap = (lax.broadcasted_iota(jnp.int32, shape, axis) + d.pad_low) % d.stride + k * d.stride
      j = tap // d.dilation
      ok = (tap % d.dilation == 0) & (j < d.window)
      want = j if want is None else want * d.window + j
      valid = ok if valid is None else valid & ok
    term = jnp.where(a == jnp.where(valid, want, -2).astype(arg.dtype), c, zero)
    total = term if total is None else total + term
  return total


def recompute(ct, x, geom):
  _, arg = arg_select(x, geom, "max", shared_pad=True)
  return gather(ct, arg, geom)


def _timed_call(fn, *args) -> float:
  """Seconds of one call after an untimed one, ended by ``block_until_ready``."""
  jax.block_until_ready(fn(*args))
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def fusions(compiled) -> int:
  """Fusion computations in the entry of an optimized HLO module."""
  return sum(1 for line in compiled.as_text().splitlines()
             if " fusion(" in line and "calls=" in line)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shape", default="8,112,112,64", help="N,H,W,C (default %(default)s)")
  parser.add_argument("--rounds", type=int, default=15)
  args = parser.parse_args(argv)
  shape = tuple(int(v) for v in args.shape.split(","))
  geom = Window.create(3, 2, 1, num_spatial_dims=2).resolve(shape[1:-1])
  x = jax.random.normal(jax.random.key(0), shape, jnp.float32)
  values, arg = jax.jit(lambda x: arg_select(x, geom, "max", shared_pad=True))(x)
  ct = jax.random.normal(jax.random.key(1), values.shape, jnp.float32)
  candidates = {
      "phase": (lambda ct, arg: scatter(ct, geom, arg), arg),
      "interior": (functools.partial(interior, geom=geom), arg),
      "gather": (functools.partial(gather, geom=geom), arg),
      "recompute": (functools.partial(recompute, geom=geom), x),
  }
  want = np.asarray(scatter(ct, geom, arg))
  compiled = {}
  for name, (fn, second) in candidates.items():
    start = time.perf_counter()
    compiled[name] = jax.jit(fn).lower(ct, second).compile()
    compile_s = time.perf_counter() - start
    np.testing.assert_array_equal(compiled[name](ct, second), want,
                                  err_msg=f"{name} is not the shipped adjoint")
    print(f"{name:9s} compile {compile_s:5.2f} s  fusions {fusions(compiled[name])}")
  times = {name: [] for name in candidates}
  names = list(candidates)
  for round_ in range(args.rounds):  # the order rotates, so load hits every formulation alike
    for name in names[round_ % len(names):] + names[:round_ % len(names)]:
      times[name].append(_timed_call(compiled[name], ct, candidates[name][1]))
  print(f"backward of MaxPool 3x3/2 pad 1 on {shape}, median of {args.rounds} rounds:")
  for name in names:
    print(f"  {name:9s} {statistics.median(times[name]) * 1e3:7.2f} ms")
  pool = MaxPool(3, 2, 1)
  # The cotangent is an argument: a closed-over one would be constant-folded.
  full = jax.jit(jax.grad(lambda x, ct: jnp.vdot(pool(x), ct))).lower(x, ct).compile()
  steady = [_timed_call(full, x, ct) for _ in range(args.rounds)]
  print(f"forward+backward of the shipped MaxPool: {statistics.median(steady) * 1e3:.2f} ms, "
        f"fusions {fusions(full)}, temporaries {temp_bytes(full) / 1e6:.1f} MB, "
        f"{minor_faults_per_call(full, x, ct):.0f} minor page faults per call")


def temp_bytes(compiled) -> int:
  """Bytes of the temporaries XLA allocates for each call of a compiled program."""
  return compiled.memory_analysis().temp_size_in_bytes


def minor_faults_per_call(fn, *args, calls: int = 10) -> float:
  """Minor page faults of this process per call of ``fn``, after one warm call.

  A temporary that the allocator hands back to the system between calls is faulted
  in again, page by page, on every call (Linux; 0 where ``resource`` is missing).
  """
  try:
    import resource
  except ImportError:  # not on Windows
    return 0.0
  jax.block_until_ready(fn(*args))
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  for _ in range(calls):
    jax.block_until_ready(fn(*args))
  return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


if __name__ == "__main__":
  main()
