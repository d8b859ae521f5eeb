"""What keeping the program costs a guard: ``python -m benchmarks.program_cost [small|full]``.

The numbers behind docs/regression.md, "The program or the compiler". Each check of
guide 10 (``full``: the 8 M-parameter ResNet of ``tests/_resnet.py``, its logits and stem
with ``store_params=True`` and its gradient) or of the small test models (``small``: the
narrow ResNet's logits and gradient, a small EfficientNet's logits, and one failure of each
narrow-ResNet check, its max pool replaced by an average pool) is recorded into a new
directory; it prints the baseline's bytes, the program member's (raw and as stored,
deflated), the check's wall time, the time the export took (the program is exported when a
baseline is written) and, for the failures, the time the attribution took.
"""

from __future__ import annotations

import runpy
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import jax.numpy as jnp

from nnx_pool import AvgPool
from nnx_pool.regression.fixture import files, program
from nnx_pool.regression.guard import Guard, RegressionFailure

ROOT = Path(__file__).resolve().parent.parent
_EXPORTS: list[float] = []
_exported = program.Program.exported


def _timed(self):  # the export's own seconds, as the Program measured them
  out = _exported(self)
  _EXPORTS.append(out[2])
  return out


def _member(path: Path) -> tuple[int, int]:
  with zipfile.ZipFile(next(path.glob("arrays-*.npz"))) as z:
    info = next(i for i in z.infolist() if i.filename.startswith(program.PROGRAM_KEY))
    return info.file_size, info.compress_size


def _record(label: str, root: Path, name: str, check) -> None:
  start = time.perf_counter()
  check(Guard(root))
  total = time.perf_counter() - start
  size = files.size_of(root / name)
  raw, packed = _member(root / name)
  print(f"{label:24s} baseline {size / 1e3:8.1f} KB, program {raw / 1e3:5.1f} KB "
        f"({packed / 1e3:4.1f} KB deflated, {100 * packed / size:4.1f}% of the baseline); "
        f"check {total:5.2f} s, export {_EXPORTS[-1]:4.2f} s")


def _fail(label: str, root: Path, check) -> None:
  try:
    check(Guard(root))
  except RegressionFailure as e:
    said = e.outcome.report.attribution or {}
    print(f"{label:24s} attribution {said.get('seconds', float('nan')):4.2f} s: "
          f"{said.get('line', '')[:60]}")


def main(which: str) -> None:
  program.Program.exported = _timed  # pyright: ignore[reportAttributeAccessIssue]
  r = runpy.run_path(str(ROOT / "tests" / "_resnet.py"))
  labels = jnp.array([3, 7])
  root = Path(tempfile.mkdtemp(prefix="program-cost-"))
  if which == "full":
    model, x = r["resnet_cheaply"](), r["images"](2, 64)
    _record("resnet 8M logits", root, "logits",
            lambda g: g.check("logits", model, x, store_params=True))
    _record("resnet 8M stem", root, "stem",
            lambda g: g.check("stem", model.stem, x, store_params=True))
    _record("resnet 8M grads", root, "grads", lambda g: g.check_grad(
        "grads", r["cross_entropy"], model, x, labels, store_params=True))
    weights = sum(files.size_of(p) for p in (root / "_weights").iterdir())
    print(f"weight set {weights / 1e6:.1f} MB")
    return
  e = runpy.run_path(str(ROOT / "tests" / "_effnet.py"))
  model, x = r["resnet_cheaply"](width=4, blocks=(1, 1)), r["images"](2, 32)
  _record("resnet width 4 logits", root, "logits", lambda g: g.check("logits", model, x))
  _record("resnet width 4 grads", root, "grads",
          lambda g: g.check_grad("grads", r["cross_entropy"], model, x, labels))
  small, xe = e["effnet_cheaply"](width=0.25, depth=1), e["images"](2, 32)
  _record("effnet small logits", root, "eff", lambda g: g.check("eff", small, xe))
  other = r["resnet_cheaply"](width=4, blocks=(1, 1))
  other.stem.pool = AvgPool(3, 2, 1)
  _fail("resnet width 4 logits", root, lambda g: g.check("logits", other, x))
  _fail("resnet width 4 grads", root,
        lambda g: g.check_grad("grads", r["cross_entropy"], other, x, labels))


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "small")
