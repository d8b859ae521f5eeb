"""Smoke test: the benchmark entry point runs end to end on tiny shapes (no timing claims)."""

import importlib.util
import json

import pytest

from benchmarks.cases import CASES
from benchmarks.run import main, summary


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None,
    reason="with torch, the device check's dry run (tests/test_backend.py) makes this run, "
    "once per implementation, and checks the same",
)
def test_benchmarks_quick_run_writes_every_row(tmp_path, capsys):
  out = tmp_path / "bench.json"
  assert main(["--quick", "--rounds", "1", "--warmup", "0", "--json", str(out)]) == 0
  report = json.loads(out.read_text())
  assert [row["case"] for row in report["rows"]] == [case.name for case in CASES]
  for row in report["rows"]:
    for pass_name in ("forward", "backward"):
      assert set(row[pass_name]["median_ms"]) >= {"ours", "flax"}
  table = capsys.readouterr().out
  assert all(case.name in table for case in CASES)
  assert f"jax {report['environment']['jax']}" in table


def test_benchmarks_ratios_by_hand():
  # Written out: ours 3 ms, Flax 6 ms, PyTorch 2 ms, a floor of 0.5 ms. The faster peer is
  # PyTorch, so ours takes 1.5 of its time and 6 times the floor; without PyTorch, 0.5.
  row = summary({"ours": 3.0, "flax": 6.0, "torch": 2.0}, 0.5)
  assert (row["ratio_to_best_peer"], row["ratio_to_floor"]) == (1.5, 6.0)
  assert summary({"ours": 3.0, "flax": 6.0}, 0.5)["ratio_to_best_peer"] == 0.5


def test_benchmarks_unknown_filter_is_an_error():
  with pytest.raises(SystemExit):
    main(["-k", "no such case"])


def test_backward_formulations_equal_the_numpy_mirror():
  # Every candidate adjoint of benchmarks/formulations.py against the mirror's
  # max-pool gradient (PyTorch's rule: first max wins, nothing to padding).
  import jax
  import numpy as np

  from benchmarks import formulations
  from nnx_pool import _kernels, reference
  from nnx_pool._geometry import Window

  shape = (2, 9, 10, 3)  # an odd and an even length
  rng = np.random.default_rng(3)
  x = rng.integers(-3, 4, shape).astype(np.float32)  # small integers: many ties
  geom = Window.create(3, 2, 1, num_spatial_dims=2).resolve(shape[1:-1])
  values, arg = _kernels._arg_select(x, geom, "max", shared_pad=True)
  ct = rng.standard_normal(values.shape).astype(np.float32)
  want = reference.max_pool_grad(x, ct, (3, 3), (2, 2), ((1, 1), (1, 1)))
  for name, got in [
      ("interior", jax.jit(formulations.interior, static_argnums=2)(ct, arg, geom)),
      ("gather", jax.jit(formulations.gather, static_argnums=2)(ct, arg, geom)),
      ("recompute", jax.jit(formulations.recompute, static_argnums=2)(ct, x, geom)),
  ]:
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=name)
