"""The modules and the guard on a model whose arrays span two processes.

``nnx-pool-regression launch -n 2`` starts tests/_processes_worker.py twice: two JAX
processes with two simulated CPU devices each (gloo collectives), one 4-device mesh. One
launch serves every test below but the last two:

* the modules (a window, global and adaptive pool, BlurPool, MedianPool, a gate), batch
  sharded over the mesh, forward and gradients, equal the same program on one device of
  process 1 (the independent source: the single-process run), exactly where they only
  select values, keep the batch sharding, and compile with no all-gather;
* the guard: baselines this test records in one process check in two, and one recorded
  in two checks here in one; only process 0 writes (each process has a directory of its
  own, so they share no file); a failure, a raise in process 1 and an unwritable baseline
  directory end the check in both processes with the same verdict.

Marked ``integration`` (``make test-integration``): H split over a mesh axis whose two
devices lie in different processes (the halo crosses the boundary), and the kit's own
``check --devices 4`` across the two processes.
"""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from nnx_pool.regression.guard import Guard, RegressionNote

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_processes_worker.py"
_W = runpy.run_path(str(WORKER))
launch = runpy.run_path(str(HERE / "_launching.py"))["launch"]
SHARDED = jax.__version_info__ >= (0, 10)
# Below jax 0.10 sharded use is not supported (docs/limits.md): the worker skips the modules
# and the sharded gradient there, and says so.
NEEDS_010 = pytest.mark.skipif(not SHARDED, reason=f"sharded use needs jax >= 0.10; this is "
                               f"jax {jax.__version__}")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
  root = tmp_path_factory.mktemp("processes")
  guard = Guard(root / "p0" / "b")  # process 0's directory; process 1's stays its own
  model, x = _W["model"](), jnp.asarray(_W["inputs"]())
  assert guard.check("one_fwd", model, x).status == "written"
  assert guard.check("stored", model, x, store_params=True, eager=False).status == "written"
  if SHARDED:
    assert guard.check_grad("one_grad", _W["loss_fn"], model, x, eager=False).status == "written"
  found = launch("python", str(WORKER), "main", str(root))
  if sorted(found["results"]) != [0, 1]:
    pytest.fail(f"the processes did not both report (exit {found['status']}):\n"
                f"{found['out'][-4000:]}")
  found["root"] = root
  return found


def _steps(run, index) -> dict:
  return {step["step"]: step for step in run["results"][index]["guard"]}


def test_two_processes_form_one_run_of_four_devices(run):
  assert run["status"] == 0, run["out"][-3000:]
  for index in (0, 1):
    result = run["results"][index]
    assert (result["process"], result["processes"], result["devices"]) == (index, 2, 4)
  assert "launch: 2 processes" in run["out"]  # the launcher's closing line
  assert re.search(r"^\[1\] ", run["out"], re.M)  # each process's lines carry its id


@NEEDS_010
def test_modules_across_processes_equal_the_single_process_run(run):
  report = run["results"][1]["modules"]  # process 1 compares
  assert [c["case"] for c in report["cases"]] == list(_W["MODULES"])
  for case in report["cases"]:
    for key in ("output", "grad_input", "grad_params"):
      assert case[key]["equal"], (case["case"], key, case[key])
    if case["exact"]:  # max and median select values: bit for bit
      assert case["output"]["max_abs"] == case["grad_input"]["max_abs"] == 0.0, case
    # The output and the input gradient keep the batch split over the 4 devices.
    assert case["output_spec"].startswith("('data'"), case
    assert case["grad_input_spec"].startswith("('data'"), case


@NEEDS_010
def test_modules_across_processes_compile_without_an_all_gather(run):
  for index in (0, 1):
    collectives = run["results"][index]["modules"]["collectives"]
    assert collectives["all-gather"] == 0, collectives
    # Examples are independent: only the gate's parameter gradient sums over the batch.
    assert {k for k, v in collectives.items() if v} <= {"all-reduce"}, collectives


def test_guard_checks_a_one_process_baseline_in_two_naming_the_layout(run):
  for index in (0, 1):
    step = _steps(run, index)["one_fwd"]
    assert step["status"] == "passed", step
    (note,) = step["notes"]
    assert "layout changed (processes 1 -> 2; mesh none -> data=4" in note


@NEEDS_010
def test_guard_checks_a_one_process_gradient_baseline_in_two(run):
  for index in (0, 1):
    assert _steps(run, index)["one_grad"]["status"] == "passed", _steps(run, index)


def test_guard_stored_weights_reach_every_process_from_the_lead(run):
  # Fresh weights of another seed: the check passes only on the stored weights, which
  # process 1 has no file of (process 0 reads them and sends them).
  for index in (0, 1):
    step = _steps(run, index)["stored"]
    assert step["status"] == "passed", step


def test_guard_only_the_lead_writes_and_the_others_hear_its_verdict(run):
  lead, other = _steps(run, 0)["two_fwd"], _steps(run, 1)["two_fwd"]
  assert lead["status"] == other["status"] == "written"
  assert other["message"] == lead["message"].replace(
      "nnx_regression: ", "nnx_regression (process 0's verdict): ", 1)
  assert run["results"][1]["files"] == []  # process 1 wrote nothing at all
  assert "b/two_fwd/manifest.json" in run["results"][0]["files"]


def test_guard_baseline_recorded_in_two_processes_checks_in_one(run):
  with pytest.warns(RegressionNote, match=r"processes 2 -> 1; mesh data=4 -> none"):
    outcome = Guard(run["root"] / "p0" / "b").check("two_fwd", _W["model"](),
                                              jnp.asarray(_W["inputs"]()), eager=False)
  assert outcome.status == "passed"


def test_guard_a_failure_is_the_same_verdict_in_every_process(run):
  lead, other = _steps(run, 0)["moved"], _steps(run, 1)["moved"]
  assert lead["status"] == other["status"] == "failed"
  assert "the initialisation changed" in lead["message"]
  assert other["message"].endswith(lead["message"].partition("nnx_regression: ")[2])
  # What the run obtained is written once, by process 0, beside its baseline.
  obtained = run["root"] / "p0" / "b" / "one_fwd.obtained"
  assert lead["obtained"] == other["obtained"] == str(obtained)
  assert "b/one_fwd.obtained/manifest.json" in run["results"][0]["files"]


def test_guard_a_raise_in_one_process_ends_the_check_in_both_at_once(run):
  own, told = _steps(run, 1)["raises"], _steps(run, 0)["raises"]
  assert own["status"] == "raised"
  assert own["message"] == "ValueError: process 1's own failure, while tracing"
  assert told["status"] == "refused"
  assert ("process 1 failed before check 'raises' could be compared: ValueError: process 1's "
          "own failure, while tracing. Nothing was compared or written.") in told["message"]
  assert told["seconds"] < 10  # told at the gate, not after a wait (30 s here)


def test_guard_an_unwritable_lead_directory_refuses_in_both_and_writes_nothing(run):
  lead, other = _steps(run, 0)["unwritable"], _steps(run, 1)["unwritable"]
  assert lead["status"] == other["status"] == "refused"
  assert "'new' was not recorded: could not write" in lead["message"]
  assert "nothing was replaced" in other["message"]
  blocked = run["root"] / "p0" / "blocked"
  assert blocked.read_text() == "not a directory\n"  # left as it was
  # Nothing half-written anywhere: the baselines, the one obtained file, the blocking file.
  assert {Path(f).parts[0] for f in run["results"][0]["files"]} == {"blocked", "b", "_weights"}
  assert {Path(f).parts[1] for f in run["results"][0]["files"] if f.startswith("b/")} == {
      "one_fwd", "one_fwd.obtained", "two_fwd", "stored", *(("one_grad",) if SHARDED else ())}


@pytest.mark.integration
@NEEDS_010
def test_modules_split_across_the_process_boundary_equal_the_single_process_run(tmp_path):
  found = launch("python", str(WORKER), "spatial", str(tmp_path))
  assert found["status"] == 0, found["out"][-3000:]
  report = found["results"][1]["modules"]  # process 1 compares
  assert report["mesh"] == {"data": 2, "space": 2} and report["spec"] == "('data', 'space')"
  assert [c["case"] for c in report["cases"]] == list(_W["SPATIAL"])
  for case in report["cases"]:
    for key in ("output", "grad_input", "grad_params"):
      assert case[key]["equal"], (case["case"], key, case[key])
    if case["exact"]:
      assert case["output"]["max_abs"] == case["grad_input"]["max_abs"] == 0.0, case
    if case["case"].startswith("Global"):  # reduced over the map: the batch split stays
      assert case["output_spec"] == case["grad_input_spec"] == "('data',)", case
    else:  # the output and the gradient keep the (data, space) split: nothing gathered back
      assert case["output_spec"] == case["grad_input_spec"] == "('data', 'space')", case
  for index in (0, 1):
    collectives = found["results"][index]["modules"]["collectives"]
    assert collectives["all-gather"] == 0, collectives
    # The windows' halos travel between the processes' devices (collective-permute).
    assert collectives["collective-permute"] > 0, collectives


# Real batch cases across the families (tests/regression/test_stress.py's, and more): indices,
# averages, bfloat16, an unbatched input, an error case, gates with parameter gradients, a
# NaN input, unpooling (eager, on indices that span processes), BlurPool and MedianPool.
KIT_CASES = (
    "max_k2_indices_int32_ints", "avg_k3s2_same_batch", "lp2_k2_bf16_batch",
    "avg_k23_s12_pairs_unbatched", "max_bad_rank", "se_gate_map", "eca_gate_map",
    "global_max_nonfinite", "unpool_k2_one", "blur_f3s2_one", "median_k3_same_one",
    "adaptive_max_34_indices_asym",
)
_KIT_CHECK = (
    "import sys\n"
    "from nnx_pool.regression import cli\n"
    "from nnx_pool.regression.batch import Batch, load_batch\n"
    "names = sys.argv[1].split(',')\n"
    "sys.exit(cli.main(sys.argv[2:], batch=lambda: Batch([c for c in load_batch().cases "
    "if c.name in names])))\n")


@pytest.mark.integration
@NEEDS_010
def test_the_kits_check_runs_across_two_processes(tmp_path):
  from nnx_pool.regression import commands
  from nnx_pool.regression.batch import load_batch

  # Expected: the same cases recorded here, in one process on one device.
  cases = [c for c in load_batch().cases if c.name in KIT_CASES]
  assert commands.record(cases, tmp_path / "base", reps=3).exit_code == 0
  out = tmp_path / "report.json"
  found = launch("python", "-c", _KIT_CHECK, ",".join(KIT_CASES), "check", "--devices", "4",
                 "--baseline", str(tmp_path / "base"), "--json", str(out))
  assert found["status"] == 0, found["out"][-3000:]
  report = json.loads(out.read_text())
  assert report["exit_code"] == 0 and report["counts"] == {"PASS": len(KIT_CASES)}, report
  assert "device_count 1 -> 4" in report["stamp_changes"]
  assert report["notes"][-1] == "2 processes ran it, over 4 devices; this is process 0's report"
  # Process 1 prints one line, and ends with process 0's exit code.
  assert "[1] process 1 of 2: ran its part; process 0 prints the report" in found["out"]
  assert "[1] case " not in found["out"]
