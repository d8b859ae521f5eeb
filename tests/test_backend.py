"""The per-backend kernel table: both implementations agree on CPU, and the device check runs.

The "xla" implementation (XLA's reduce_window, differentiated by JAX) is checked
against "taps" (the tested kernels) and against the NumPy mirror; where the
docs say they may differ (a NaN's gradient), the test says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nnx_pool
from benchmarks.cases import CASES
from nnx_pool import AvgPool, LPPool, MaxPool, MinPool, reference, use_implementation

ROOT = Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(5)
X = RNG.permutation(2 * 9 * 8 * 3).reshape(2, 9, 8, 3).astype(np.float32) / 8.0

MODULES = {
    "avg_k3s2p1_ceil_nopad": AvgPool(3, 2, 1, ceil_mode=True, count_include_pad=False),
    "avg_k2_same": AvgPool(2, 1, "SAME"),
    "avg_1d": AvgPool(2, num_spatial_dims=1),
    "max_k3s2p1": MaxPool(3, 2, 1),
    "max_k2s1_dil2_pairs": MaxPool(2, 1, ((1, 0), (0, 1)), dilation=2),
    "max_k3_ceil": MaxPool(3, 2, ceil_mode=True),
    "min_k2": MinPool(2),
    "lp2_k3s2": LPPool(2, 3, 2),
}


def _run(module, x):
  """{implementation: (values, gradient of sum(values ** 2))} for "taps" and "xla".

  One jitted program: the implementation is chosen while tracing, so each block traces its
  own. (A program per implementation and pass, 4 a module: 5.9 s of pytest time for this
  file alone on 2 cores; one a module: 2.5 s. `pytest tests/test_backend.py`.)
  """
  @jax.jit
  def run(x):
    results = {}
    for implementation in ("taps", "xla"):
      with use_implementation(implementation):
        g, y = jax.grad(lambda a: (jnp.sum(module(a) ** 2), module(a)), has_aux=True)(x)
      results[implementation] = (y, g)
    return results

  return jax.tree.map(np.asarray, run(x))


@pytest.mark.parametrize("name", list(MODULES))
def test_xla_and_taps_agree_on_cpu(name):
  module = MODULES[name]
  x = np.abs(X) + 0.5 if name.startswith("lp") else X - X.mean()
  x = x.reshape(2, 9 * 8, 3) if name == "avg_1d" else x
  ran = _run(module, x)
  (y_taps, g_taps), (y_xla, g_xla) = ran["taps"], ran["xla"]
  if name.startswith(("max", "min")):  # tie-free input: one winner per window
    np.testing.assert_array_equal(y_xla, y_taps)
    np.testing.assert_array_equal(g_xla, g_taps)
  else:
    np.testing.assert_allclose(y_xla, y_taps, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(g_xla, g_taps, rtol=1e-5, atol=1e-5)


def test_xla_max_matches_the_mirror_and_first_max_on_ties():
  # Seed 003's grid (every window tie-free) and an all-equal plane (ties): the mirror's
  # values, and the gradient on the first maximum in row-major order for both.
  grid = np.array([[1, 2, 5, 6], [3, 4, 8, 7], [0, -1, -3, -2], [-4, 9, -6, -5]], np.float32)
  x = grid[None, :, :, None]
  want, _ = reference.max_pool(x, (2, 2), (2, 2), "VALID")
  y, _ = _run(MaxPool(2), x)["xla"]
  np.testing.assert_array_equal(y, want)
  ties = np.ones((1, 2, 2, 1), np.float32)
  for implementation, (_, g) in _run(MaxPool(2), ties).items():
    # d(y**2) = 2y, on the first cell.
    np.testing.assert_array_equal(g[0, ..., 0], [[2, 0], [0, 0]], err_msg=implementation)


def test_xla_nan_values_agree_and_return_indices_stays_on_taps():
  x = np.array([1.0, np.nan, 3.0, np.nan])[None, :, None].astype(np.float32)
  pool = MaxPool((4,), return_indices=True)
  with use_implementation("xla"):
    values, indices = pool(x)
    plain = MaxPool((4,))(x)
  assert np.isnan(plain[0, 0, 0]) and np.isnan(values[0, 0, 0])
  assert int(indices[0, 0, 0]) == 3  # PyTorch's last NaN: indices always come from "taps"


def test_the_table_and_the_override():
  assert set(nnx_pool.IMPLEMENTATION_DEFAULTS) >= {"cpu", "gpu", "tpu"}
  assert nnx_pool.current_implementation() == nnx_pool.IMPLEMENTATION_DEFAULTS["cpu"] == "taps"
  with use_implementation("xla"):
    assert nnx_pool.current_implementation() == "xla"
    with use_implementation("taps"):
      assert nnx_pool.current_implementation() == "taps"
    jaxpr = str(jax.make_jaxpr(MaxPool(2))(X))
  assert "reduce_window_max" in jaxpr
  assert "reduce_window" not in str(jax.make_jaxpr(MaxPool(2))(X))
  with pytest.raises(ValueError, match=r"`implementation` must be one of \('taps', 'xla'\); "
                                       r"got 'cuda'\."):
    with use_implementation("cuda"):
      pass


def test_the_defaults_are_read_only_and_set_by_one_function():
  with pytest.raises(TypeError):
    nnx_pool.IMPLEMENTATION_DEFAULTS["cpu"] = "xla"
  assert nnx_pool.IMPLEMENTATION_DEFAULTS["cpu"] == "taps"
  try:
    nnx_pool.set_default_implementation("cpu", "xla")
    assert nnx_pool.IMPLEMENTATION_DEFAULTS["cpu"] == "xla"
    assert nnx_pool.current_implementation() == "xla"
    assert "reduce_window_max" in str(jax.make_jaxpr(MaxPool(2))(X))
    with use_implementation("taps"):  # a block still overrides the default
      assert nnx_pool.current_implementation() == "taps"
  finally:
    nnx_pool.set_default_implementation("cpu", "taps")
  assert nnx_pool.current_implementation() == "taps"
  assert "reduce_window" not in str(jax.make_jaxpr(MaxPool(2))(X))
  with pytest.raises(ValueError, match=r"^`implementation` must be one of \('taps', 'xla'\); "
                                       r"got 'XLA'\.$"):
    nnx_pool.set_default_implementation("cpu", "XLA")
  with pytest.raises(TypeError, match=r"^`backend` must be a JAX backend's name as "
                                      r"jax\.default_backend\(\) gives it, .*; got None\.$"):
    nnx_pool.set_default_implementation(None, "xla")
  assert dict(nnx_pool.IMPLEMENTATION_DEFAULTS) == {"cpu": "taps", "gpu": "taps", "tpu": "taps"}


def test_a_threads_use_implementation_does_not_reach_another_thread():
  # Thread A enters use_implementation("xla") and holds it open while thread B (and this
  # thread) trace a MaxPool: they keep the default "taps"; A's own trace uses "xla".
  entered, traced = threading.Event(), threading.Event()
  seen = {}

  def inside_block():
    with use_implementation("xla"):
      entered.set()
      seen["a"] = str(jax.make_jaxpr(MaxPool(2))(X))
      traced.wait(timeout=60)

  def elsewhere():
    entered.wait(timeout=60)
    seen["b"] = (nnx_pool.current_implementation(), str(jax.make_jaxpr(MaxPool(2))(X)))

  a, b = threading.Thread(target=inside_block), threading.Thread(target=elsewhere)
  a.start()
  b.start()
  b.join(timeout=60)
  assert entered.is_set()
  here = nnx_pool.current_implementation()  # while A still holds its block open
  traced.set()
  a.join(timeout=60)
  assert "reduce_window_max" in seen["a"]
  implementation, jaxpr = seen["b"]
  assert (implementation, here) == ("taps", "taps")
  assert "reduce_window" not in jaxpr


@pytest.mark.slow
@pytest.mark.integration  # its own CI step (`make test-integration`)
def test_device_check_dry_run_writes_parity_and_benchmarks(tmp_path):
  pytest.importorskip("torch", reason="the device check needs torch==2.13.0 (the parity extra)")
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "OUT": str(tmp_path), "PYTHON": sys.executable}
  done = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_check.sh"), "--dry-run"],
                        capture_output=True, text=True, env=env, timeout=600, check=False)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  report = json.loads((tmp_path / "device_check.json").read_text())
  assert report["torch_device"] == "cpu"
  modules = {row["module"] for row in report["parity"]}
  assert modules >= {"AvgPool", "MaxPool", "MinPool", "LPPool", "MaxUnpool", "GlobalAvgPool",
                     "GlobalMaxPool", "AdaptiveAvgPool", "AdaptiveMaxPool"}
  assert all(row["pass"] for row in report["parity"]), report["parity"]
  assert {row["implementation"] for row in report["parity"]} == {"taps", "xla"}
  # The benchmark rows (`python -m benchmarks --quick`), once per implementation: every
  # case timed for us and both peers, and the table printed with its versions. (How the
  # ratio to the faster peer is computed is tests/test_benchmarks.py's, on a worked example.)
  for implementation, name in report["benchmarks"].items():
    bench = json.loads((tmp_path / name).read_text())
    assert [row["case"] for row in bench["rows"]] == [case.name for case in CASES], name
    for row in bench["rows"]:
      for pass_name in ("forward", "backward"):
        medians = row[pass_name]["median_ms"]
        assert set(medians) >= {"ours", "flax", "torch"}
        assert all(v > 0 for v in medians.values()), (row["case"], pass_name)
        assert row[pass_name]["ratio_to_best_peer"] > 0, (row["case"], pass_name)
    assert f"jax {bench['environment']['jax']}" in done.stdout, implementation
  assert all(case.name in done.stdout for case in CASES)
  assert "parity: 22 of 22 pass" in done.stdout
