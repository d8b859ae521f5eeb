"""The benchmark harness: its arithmetic by hand, a smoke run on tiny shapes (no timing
claims), the model step's three losses, and a guard on XLA's temporaries."""

import contextlib
import importlib
import importlib.util
import io
import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from benchmarks import model_step, solo
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


def test_batch_option_times_every_row_at_that_batch(tmp_path):
  out = tmp_path / "bench.json"
  assert main(["--quick", "--rounds", "1", "--warmup", "0", "-k", "GlobalAvgPool",
               "--batch", "3", "--json", str(out)]) == 0
  (row,) = json.loads(out.read_text())["rows"]
  # The quick GlobalAvgPool row is (1, 7, 7, 4) at its own batch; 3 images of it here.
  assert (row["shape"], row["out_shape"]) == ([3, 7, 7, 4], [3, 4])
  with pytest.raises(SystemExit):
    main(["--batch", "0"])


def test_device_check_runs_the_rows_once_per_batch_and_implementation(tmp_path, monkeypatch):
  pytest.importorskip("torch", reason="the device check needs torch==2.13.0 (the parity extra)")
  from benchmarks import device_check

  calls = []
  monkeypatch.setattr(device_check, "parity", lambda torch, device, shape: [])
  monkeypatch.setattr(device_check.bench, "main", lambda argv: calls.append(argv) or 0)
  assert device_check.main(["--out", str(tmp_path), "--batch", "64", "256", "-k", "Max"]) == 0
  report = json.loads((tmp_path / "device_check.json").read_text())
  assert report["benchmarks"] == {
      "taps-b64": "benchmarks-taps-b64.json", "xla-b64": "benchmarks-xla-b64.json",
      "taps-b256": "benchmarks-taps-b256.json", "xla-b256": "benchmarks-xla-b256.json"}
  asked = [(argv[argv.index("--batch") + 1], argv[argv.index("--implementation") + 1],
            argv[argv.index("-k") + 1]) for argv in calls]
  assert asked == [("64", "taps", "Max"), ("64", "xla", "Max"), ("256", "taps", "Max"),
                   ("256", "xla", "Max")]
  with pytest.raises(SystemExit):
    device_check.main(["--out", str(tmp_path), "--batch", "0"])


def test_allocator_settings_send_xla_threads_to_the_main_heap():
  # glibc's tunables by their documented names (glibc 2.36 manual, "Memory Allocation
  # Tunables"): one arena, and both thresholds past any buffer of a row.
  from benchmarks.allocators import settings

  found = settings()
  assert found["MALLOC_ARENA_MAX=1"] == {"MALLOC_ARENA_MAX": "1"}
  assert found["ARENA_MAX=1, both thresholds 1GiB"] == {
      "MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(2**30),
      "MALLOC_TRIM_THRESHOLD_": str(2**30)}


def test_torch_contestant_counts_page_faults_when_asked():
  # benchmarks.allocators --contestant torch read a count the torch contestant never made.
  torch = pytest.importorskip("torch", reason="PyTorch is not installed (the parity extra)")
  from benchmarks.contestant import _torch

  x = torch.ones(64, 64)
  counted = _torch(lambda t: t * 2, x, True, calls=3, warmup=1, device="cpu", faults=True)
  plain = _torch(lambda t: t * 2, x, True, calls=3, warmup=1, device="cpu")
  assert counted["faults_per_call"] >= 0 and "faults_per_call" not in plain
  # t * 2 saves nothing; the loss's square saves its 64 x 64 float32 input.
  assert counted["saved_bytes"] == plain["saved_bytes"] == 64 * 64 * 4


def test_backward_formulations_equal_the_numpy_mirror():
  # Every candidate adjoint of benchmarks/formulations.py against the mirror's
  # max-pool gradient (PyTorch's rule: first max wins, nothing to padding).
  import jax
  import numpy as np

  from benchmarks import formulations
  from nnx_pool import reference
  from nnx_pool._geometry import Window
  from nnx_pool._select import arg_select

  shape = (2, 9, 10, 3)  # an odd and an even length
  rng = np.random.default_rng(3)
  x = rng.integers(-3, 4, shape).astype(np.float32)  # small integers: many ties
  geom = Window.create(3, 2, 1, num_spatial_dims=2).resolve(shape[1:-1])
  values, arg = arg_select(x, geom, "max", shared_pad=True)
  ct = rng.standard_normal(values.shape).astype(np.float32)
  want = reference.max_pool_grad(x, ct, (3, 3), (2, 2), ((1, 1), (1, 1)))
  for name, got in [
      ("interior", jax.jit(formulations.interior, static_argnums=2)(ct, arg, geom)),
      ("gather", jax.jit(formulations.gather, static_argnums=2)(ct, arg, geom)),
      ("recompute", jax.jit(formulations.recompute, static_argnums=2)(ct, x, geom)),
  ]:
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=name)


def test_stable_after_by_hand():
  # Running medians of 1.0, 2.0, 1.1, 1.05, 1.08: 1.0, 1.5, 1.1, 1.075, 1.08. Within 5% of
  # the final 1.08 from the third round on.
  assert solo.stable_after([1.0, 2.0, 1.1, 1.05, 1.08]) == 3
  assert solo.stable_after([1.0, 1.0, 1.0]) == 1
  assert solo.stable_after([3.0, 1.0]) == 2  # the median of both is 2.0; 3.0 is 50% off


def _process(call, null=0.01, floor=0.5, **extra):
  return {"call_ms": call, "null_ms": null, "floor_ms": floor, **extra}


def test_summarise_by_hand():
  # Three rounds. Ours 2, 3, 4 ms (median 3); Flax 6, 6, 6; PyTorch 5, 4, 2 (median 4).
  # The faster peer by median is PyTorch: 3 / 4 = 0.75. Per round, ours over the faster
  # peer of that round: 2/5, 3/4, 4/2 = 0.4, 0.75, 2.0. Floor 0.5: 3 / 0.5 = 6.
  per_round = {
      "ours": [_process(2, temp_bytes=10), _process(3, temp_bytes=10), _process(4, temp_bytes=10)],
      "flax": [_process(6), _process(6), _process(6)],
      "torch": [_process(5, saved_bytes=7), _process(4, saved_bytes=7), _process(2, saved_bytes=7)],
  }
  out = solo.summarise(per_round)
  assert out["best_peer"] == "torch"
  assert (out["ratio"], out["ratio_min"], out["ratio_max"]) == (0.75, 0.4, 2.0)
  assert out["floor_ratio"] == 6.0
  assert out["contestants"]["ours"].items() >= {"median_ms": 3, "min_ms": 2, "max_ms": 4,
                                                "temp_bytes": 10}.items()
  assert out["contestants"]["torch"]["saved_bytes"] == 7


def test_a_step_whose_losses_differ_is_not_reported():
  per_round = {"ours": [_process(1, loss=2.30)], "flax": [_process(1, loss=2.30)],
               "torch": [_process(1, loss=2.31)]}
  with pytest.raises(RuntimeError, match="losses differ"):
    solo.check_same_loss("step", per_round)
  per_round["torch"][0]["loss"] = 2.30 * (1 + 1e-6)
  solo.check_same_loss("step", per_round)


def _loaded_builds(config: dict) -> tuple[dict, object]:
  """``(weights, build)``: the ``ours`` model's seed-0 state as NumPy arrays by path, and a
  ``build(config, ours)`` that loads them into either model's abstract shell.

  One initialiser program, compiled without XLA's optimisations: 1.6 s instead of 12 s for
  the benchmark's two optimised ones, the same draws to within a float32 rounding.
  """
  widths, classes = config["widths"], config["classes"]

  def init(ours: bool):
    return nnx.state(model_step.SEResNet(widths, classes, ours=ours, rngs=nnx.Rngs(0)))

  program = jax.jit(lambda: init(True)).lower().compile(
      compiler_options={"xla_backend_optimization_level": 0})
  weights = {path: np.asarray(var[...]) for path, var in nnx.to_flat_state(program())}

  def build(_config: dict, ours: bool) -> model_step.SEResNet:
    model = nnx.eval_shape(
        lambda: model_step.SEResNet(widths, classes, ours=ours, rngs=nnx.Rngs(0)))
    # By path, so a variable the drawn state lacks fails here.
    nnx.update(model, nnx.from_flat_state({
        path: jax.tree_util.tree_map(lambda _, v=weights[path]: jax.numpy.asarray(v), var)
        for path, var in nnx.to_flat_state(nnx.state(model))}))
    return model

  return weights, build


@pytest.mark.slow
def test_model_step_three_ways_has_one_loss(monkeypatch):
  # The same weights and batch: nnx-pool's layers, flax.nnx built-ins, PyTorch (if there).
  weights, build = _loaded_builds(model_step.QUICK)
  for ours in (True, False):
    state = dict(nnx.to_flat_state(nnx.state(build(model_step.QUICK, ours))))
    assert state.keys() == weights.keys(), ours
    for path, array in weights.items():
      np.testing.assert_array_equal(np.asarray(state[path][...]), array, err_msg=str(path))
  monkeypatch.setattr(model_step, "build", build)
  losses = model_step.losses(model_step.QUICK)
  # A fresh 10-class head starts near chance: -log(1/10) = 2.30.
  assert abs(losses["ours"] - np.log(10)) < 0.2
  for name, value in losses.items():
    assert value == pytest.approx(losses["ours"], rel=1e-5), (name, losses)


def _contestant_here(module: str, args) -> dict:
  """:func:`benchmarks.solo.contestant_process` in this process: the module's ``main``, its
  JSON line read back."""
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    assert importlib.import_module(module).main(list(args)) == 0
  return json.loads(printed.getvalue().strip().splitlines()[-1])


def test_contestant_process_runs_a_contestant_in_a_fresh_process():
  # The one launch a row's contestants take, for real: the harness's row test below runs
  # them in this process (six interpreters starting jax, and torch, took 18 s of its 18).
  result = solo.contestant_process("benchmarks.contestant", [
      "GlobalAvgPool", "ours", "forward", "--calls", "2", "--warmup", "0", "--quick"])
  assert result.keys() >= {"compile_s", "call_ms", "null_ms", "temp_bytes", "floor_ms"}
  assert result["temp_bytes"] >= 0 and result["call_ms"] > 0


@pytest.mark.slow
def test_solo_harness_runs_one_row_alone(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(solo, "contestant_process", _contestant_here)
  out = tmp_path / "bench.json"
  assert solo.main(["-k", "GlobalAvgPool", "--rounds", "1", "--calls", "2", "--warmup", "0",
                    "--quick", "--no-model", "--json", str(out)]) == 0
  report = json.loads(out.read_text())
  (row,) = report["rows"]
  assert row["case"] == "GlobalAvgPool"
  contestants = {"ours", "flax"} | ({"torch"} if importlib.util.find_spec("torch") else set())
  for pass_name in ("forward", "backward"):
    assert set(row[pass_name]["contestants"]) == contestants
    assert row[pass_name]["contestants"]["ours"]["temp_bytes"] >= 0
  assert "GlobalAvgPool" in capsys.readouterr().out


RECORDED = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.json"


def _recorded() -> dict:
  return json.loads(RECORDED.read_text()) if RECORDED.exists() else {}


def _shell(factory):
  """``factory()`` built from shapes where it is a module: its weights go in as abstract
  arguments, so no initialiser compiles (1.9 s of this test's 6.9 s); a plain function
  (FractionalMaxPool's row) as it is."""
  try:
    return nnx.eval_shape(factory)
  except TypeError:  # it returned a function: no arrays to trace
    return factory()


@pytest.mark.skipif(
    _recorded().get("environment", {}).get("jax") != jax.__version__,
    reason=f"docs/benchmarks.json records XLA's temporaries for jax "
    f"{_recorded().get('environment', {}).get('jax')}; this is jax {jax.__version__}")
def test_xla_temporaries_do_not_grow_past_the_recorded_benchmark():
  # Deterministic, so they hold on a noisy machine: a change that doubles a row's memory
  # fails here without timing anything. 10% of slack for XLA's layout choices.
  # A layer's weights go in as arguments, not as constants of the program (the harness's
  # closure): the same temporaries on every row (measured against docs/benchmarks.json,
  # jax 0.10.2), without XLA folding constants of up to 16 MB (this test: 12.2 s -> 5.2 s).
  rows = {row["case"]: row for row in _recorded()["rows"]}
  grown = []
  for case in CASES:
    recorded = rows[case.name]
    x = jax.ShapeDtypeStruct(case.shape, np.float32)
    ours = _shell(case.ours)
    graphdef, state = nnx.split(ours) if isinstance(ours, nnx.Module) else (None, ())

    def forward(state, a, ours=ours, graphdef=graphdef):
      return (nnx.merge(graphdef, state) if graphdef is not None else ours)(a)

    def backward(state, a, forward=forward):
      return jax.grad(lambda a: (forward(state, a) ** 2).sum())(a)

    for pass_name, fn in (("forward", forward), ("backward", backward)):
      now = jax.jit(fn).lower(state, x).compile().memory_analysis().temp_size_in_bytes
      limit = recorded[pass_name]["contestants"]["ours"]["temp_bytes"]
      if now > 1.10 * limit + 4096:
        grown.append(f"{case.name} {pass_name}: {now} bytes, recorded {limit}")
  assert not grown, "XLA's temporaries grew: " + "; ".join(grown)
