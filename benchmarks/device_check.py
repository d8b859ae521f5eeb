"""The accelerator check: every pooling module against PyTorch on the device, then the benchmarks.

Run on a machine with one GPU (``benchmarks/device_check.sh`` wraps it, with a
5-minute limit), it writes ``device_check.json`` and ``benchmarks.json`` to
``--out``:

* parity: each pooling module (and one squeeze-excitation gate), forward and
  gradient, on JAX's default device, against PyTorch on the CPU (and PyTorch on
  ``cuda``, when it sees one, recorded beside it), once per kernel implementation
  (``"taps"`` and ``"xla"``, see :mod:`nnx_pool._backend`): the largest absolute
  difference and whether it is within the tolerance (exact for max, min and
  unpooling; 1e-5 for averages, LP and the gate, whose sums may be ordered
  differently on a GPU);
* benchmarks: the rows of ``python -m benchmarks`` (ours, flax.nnx, PyTorch on
  the same device), once per implementation, as the table that sets the
  per-backend defaults in ``nnx_pool._backend.IMPLEMENTATION_DEFAULTS``; with
  ``--batch 64 256``, once per implementation and batch size instead
  (``benchmarks-taps-b64.json``, ...): at the rows' own batch (8 for most) a GPU
  times its launches (0.08-0.26 ms for every row on 2026-12-04), not its kernels.

``--dry-run`` runs the same on CPU with tiny shapes and one round, which the test
suite does, so the script cannot rot between the rare runs on a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import nnx_pool
from benchmarks import run as bench
from nnx_pool.regression.cli.parser import positive_int

EXACT, CLOSE = 0.0, 1e-5


def _cases(torch) -> list[tuple[str, Callable, Callable, float, bool]]:
  """``(name, ours(x), theirs(x_nchw), tolerance, positive_input)`` per module."""
  f = torch.nn.functional
  se = nnx_pool.SqueezeExcitation(8, 4, rngs=nnx.Rngs(0))
  w1 = np.asarray(se.fc1.kernel.value).T[:, :, None, None]
  w2 = np.asarray(se.fc2.kernel.value).T[:, :, None, None]
  b1, b2 = np.asarray(se.fc1.bias.value), np.asarray(se.fc2.bias.value)

  def torch_se(x):
    t = lambda a: torch.as_tensor(a, device=x.device)  # noqa: E731
    s = f.conv2d(x.mean((2, 3), keepdim=True), t(w1), t(b1))
    return x * torch.sigmoid(f.conv2d(torch.relu(s), t(w2), t(b2)))

  def unpool(x):
    return nnx_pool.MaxUnpool(2)(*nnx_pool.MaxPool(2, return_indices=True)(x))

  def torch_unpool(x):
    return f.max_unpool2d(*f.max_pool2d(x, 2, return_indices=True), 2, output_size=x.shape[2:])

  return [
      ("AvgPool", nnx_pool.AvgPool(3, 2, 1, count_include_pad=False),
       lambda x: f.avg_pool2d(x, 3, 2, 1, count_include_pad=False), CLOSE, False),
      ("MaxPool", nnx_pool.MaxPool(3, 2, 1), lambda x: f.max_pool2d(x, 3, 2, 1), EXACT, False),
      ("MinPool", nnx_pool.MinPool(3, 2, 1), lambda x: -f.max_pool2d(-x, 3, 2, 1), EXACT, False),
      ("LPPool", nnx_pool.LPPool(2, 3, 2), lambda x: f.lp_pool2d(x, 2, 3, 2), CLOSE, True),
      ("MaxUnpool", unpool, torch_unpool, EXACT, False),
      ("GlobalAvgPool", nnx_pool.GlobalAvgPool(), lambda x: x.mean((2, 3)), CLOSE, False),
      ("GlobalMaxPool", nnx_pool.GlobalMaxPool(), lambda x: x.amax((2, 3)), EXACT, False),
      ("AdaptiveAvgPool", nnx_pool.AdaptiveAvgPool(5),
       lambda x: f.adaptive_avg_pool2d(x, 5), CLOSE, False),
      ("AdaptiveMaxPool", nnx_pool.AdaptiveMaxPool(5),
       lambda x: f.adaptive_max_pool2d(x, 5), EXACT, False),
      ("SelectAdaptivePool", nnx_pool.SelectAdaptivePool(1, pool_type="catavgmax", flatten=True),
       lambda x: torch.cat([x.mean((2, 3)), x.amax((2, 3))], 1), CLOSE, False),
      ("SqueezeExcitation", se, torch_se, CLOSE, False),
  ]


def _nhwc(t) -> np.ndarray:
  a = t.detach().cpu().numpy()
  return np.moveaxis(a, 1, -1) if a.ndim == 4 else a


def _loss(f):
  return lambda a: jnp.sum(f(a) ** 2)


def _torch_run(torch, theirs, x: np.ndarray, device: str) -> tuple[np.ndarray, np.ndarray]:
  """PyTorch's ``y`` and the gradient of ``sum(y**2)`` on ``device``, as NHWC arrays."""
  xt = torch.tensor(np.moveaxis(x, -1, 1), device=device, requires_grad=True)
  yt = theirs(xt)
  (yt ** 2).sum().backward()
  return _nhwc(yt), _nhwc(xt.grad)


def _error(got, want) -> float:
  return float(np.max(np.abs(np.asarray(got) - want)))


def parity(torch, device: str, shape: Sequence[int]) -> list[dict]:
  """Every case under both implementations: forward and gradient of ``sum(y**2)``.

  Both sides compute in full float32: TF32 is off in PyTorch (cuDNN convolutions use
  it by default) and JAX's matmuls run at "highest". The reference is PyTorch on
  the CPU, which the suite checks bit for bit; PyTorch on ``device`` is recorded
  beside it (``torch_device_grad_vs_cpu``), since it is not always the same.
  """
  torch.backends.cudnn.allow_tf32 = False
  torch.backends.cuda.matmul.allow_tf32 = False
  rows = []
  rng = np.random.default_rng(0)
  base = rng.permutation(int(np.prod(shape))).reshape(shape).astype(np.float32) / 7.0
  for name, ours, theirs, tolerance, positive in _cases(torch):
    x = np.abs(base) + 1.0 if positive else base - base.mean()
    want_y, want_g = _torch_run(torch, theirs, x, "cpu")
    device_y, device_g = _torch_run(torch, theirs, x, device)
    for implementation in nnx_pool._backend.IMPLEMENTATIONS:
      with nnx_pool.use_implementation(implementation), jax.default_matmul_precision("highest"):
        y = jax.jit(ours)(x)
        g = jax.jit(jax.grad(_loss(ours)))(x)
      err_y, err_g = _error(y, want_y), _error(g, want_g)
      scale = max(1.0, float(np.max(np.abs(want_g))))
      rows.append({
          "module": name, "implementation": implementation, "tolerance": tolerance,
          "max_abs_err": err_y, "grad_max_abs_err": err_g,
          "torch_device_vs_cpu": _error(device_y, want_y),
          "torch_device_grad_vs_cpu": _error(device_g, want_g),
          "pass": err_y <= tolerance * max(1.0, float(np.max(np.abs(want_y))))
          and err_g <= tolerance * scale,
      })
  return rows


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.device_check",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="directory for the JSON files")
  parser.add_argument("--dry-run", action="store_true",
                      help="CPU, tiny shapes, one round: the suite's check that this runs")
  parser.add_argument("--rounds", type=int, default=7, help="timed rounds per benchmark row")
  parser.add_argument("--batch", type=positive_int, nargs="+", default=None,
                      help="benchmark rows at these batch sizes (default: each row's own)")
  parser.add_argument("-k", default="", help="only benchmark rows whose name contains this")
  args = parser.parse_args(argv)
  import torch  # the device image has it; the suite's dry run skips without it

  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
  report = {"environment": bench.environment(), "torch_device": device,
            "parity": parity(torch, device, (2, 10, 12, 8))}
  bench_args = ["--torch-device", device, "--rounds", "1" if args.dry_run else str(args.rounds),
                "--warmup", "0" if args.dry_run else "3", "-k", args.k]
  bench_args += ["--quick"] if args.dry_run else []
  report["benchmarks"] = {}
  for batch in args.batch or [None]:
    for implementation in nnx_pool._backend.IMPLEMENTATIONS:
      key = implementation if batch is None else f"{implementation}-b{batch}"
      path = out / f"benchmarks-{key}.json"
      batch_args = [] if batch is None else ["--batch", str(batch)]
      bench.main([*bench_args, *batch_args, "--implementation", implementation,
                  "--json", str(path)])
      report["benchmarks"][key] = path.name
  (out / "device_check.json").write_text(json.dumps(report, indent=1) + "\n")
  failed = [f"{r['module']} ({r['implementation']})" for r in report["parity"] if not r["pass"]]
  print(f"parity: {len(report['parity']) - len(failed)} of {len(report['parity'])} pass"
        + (f"; failed: {', '.join(failed)}" if failed else ""))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
