"""The regression kit under stress: concurrent records, a full disk, a newer format, many devices.

Each failure must end with a one-line message and leave the previous baseline
byte for byte as it was. ``check --devices N`` runs the batch sharded over N
simulated CPU devices, which needs a fresh interpreter (this one initialised
JAX with one device): the tests run it in subprocesses.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import nnx_pool.regression
from nnx_pool.regression import cli, commands, runner, store
from nnx_pool.regression.batch import Batch, Case, load_batch
from nnx_pool.regression.cli.devices import with_device_count
from nnx_pool.regression.compare import compare_arrays
from nnx_pool.regression.store import BaselineError, read_baseline
from nnx_pool.regression.tolerance import tolerance_for

REPO = Path(nnx_pool.regression.__file__).resolve().parents[1]
FORKING = Path(__file__).resolve().parents[1] / "_forking.py"
fork_together = runpy.run_path(str(FORKING))["fork_together"]
FAST = 3  # timed steady-state calls per case


def _env() -> dict:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
  return env


def _double(tag: str) -> Case:
  return Case(f"double_{tag}", lambda: (lambda x: 2 * x), input="one", module="fn")


def _snapshot(path: Path) -> dict:
  return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.fixture
def baseline(tmp_path) -> Path:
  out = tmp_path / "base"
  report = commands.record([_double("old")], out, reps=FAST)
  assert report.exit_code == 0, report.rows
  return out


# ------------------------------------------------------------- a full disk


def _full_disk(partial: bool, on: str = "arrays"):
  """A ``store.write._write_file`` for a full disk: it fails writing the arrays or the manifest."""
  real = store.write._write_file

  def write(path, data):
    if data.startswith(b"PK") != (on == "arrays"):  # an .npz is a zip: it starts with PK
      return real(path, data)
    if partial:  # a real full disk fails after part of the file is written
      path.write_bytes(data[:20])
    raise OSError(28, "No space left on device")

  return write


@pytest.mark.parametrize("on", ["arrays", "manifest"])
def test_regression_record_on_a_full_disk_keeps_the_previous_baseline(
    baseline, tmp_path, monkeypatch, capsys, on):
  before = _snapshot(baseline)
  monkeypatch.setattr(store.write, "_write_file", _full_disk(partial=True, on=on))
  code = cli.main(["record", "--out", str(baseline), "--force"],
                  batch=lambda: Batch([_double("new")]))
  err = capsys.readouterr().err
  assert code == 2
  assert err == (
      f"error: could not write baseline {baseline} (ENOSPC: No space left on device); "
      "the previous baseline is unchanged.\n")
  monkeypatch.undo()
  after = _snapshot(baseline)
  # Failing on the manifest leaves the new arrays file (named by no manifest) for the next
  # record to delete; everything the old manifest names is unchanged.
  assert {k: v for k, v in after.items() if k in before} == before
  assert len(after) == len(before) + (on == "manifest")
  assert not [name for name in after if name.startswith(".tmp-")]  # no temp file left
  assert list(read_baseline(baseline).manifest["cases"]) == ["double_old"]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]


def test_regression_record_on_a_full_disk_writes_nothing_new(tmp_path, monkeypatch, capsys):
  out = tmp_path / "fresh"
  monkeypatch.setattr(store.write, "_write_file", _full_disk(partial=False))
  code = cli.main(["record", "--out", str(out)], batch=lambda: Batch([_double("new")]))
  assert code == 2
  assert capsys.readouterr().err == (
      f"error: could not write baseline {out} (ENOSPC: No space left on device); "
      "nothing was written.\n")
  assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------- a newer format


def _bump_format(path: Path, version: int) -> None:
  manifest = json.loads((path / "manifest.json").read_text())
  manifest["format_version"] = version
  (path / "manifest.json").write_text(json.dumps(manifest))


def test_regression_record_refuses_to_replace_a_newer_format_baseline(baseline, capsys):
  _bump_format(baseline, store.FORMAT_VERSION + 1)
  before = _snapshot(baseline)
  code = cli.main(["record", "--out", str(baseline), "--force"],
                  batch=lambda: Batch([_double("new")]))
  assert code == 2
  assert capsys.readouterr().err == (
      f"error: baseline {baseline} has format version {store.FORMAT_VERSION + 1}, newer than "
      f"this nnx-pool writes ({store.FORMAT_VERSION}); refusing to replace it, even with "
      "--force. Upgrade nnx-pool, or record to another directory with --out.\n")
  assert _snapshot(baseline) == before


@pytest.mark.parametrize("command", ["check", "diff"])
def test_regression_reading_a_newer_format_baseline_exits_2(baseline, capsys, command):
  _bump_format(baseline, store.FORMAT_VERSION + 1)
  before = _snapshot(baseline)
  argv = (["check", "--baseline", str(baseline)] if command == "check"
          else ["diff", str(baseline), str(baseline)])
  code = cli.main(argv, batch=lambda: Batch([_double("old")]))
  assert code == 2
  assert capsys.readouterr().err == (
      f"error: baseline {baseline}: format version {store.FORMAT_VERSION + 1} is newer than "
      f"this nnx-pool reads ({store.FORMAT_VERSION}); upgrade nnx-pool or re-record the "
      "baseline.\n")
  assert _snapshot(baseline) == before


# ------------------------------------------------------ concurrent records

# The children below share this start: arguments, a slowed-down array write (so
# that the writers overlap), and a wait until every child is ready.
def _child(delay: float, imports: str, body: str) -> str:
  return textwrap.dedent("""
      import sys, time
      from pathlib import Path
      from nnx_pool.regression import store
  """) + textwrap.dedent(imports) + textwrap.dedent(f"""

      out, tag, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
      real = store.write._write_file

      def slow_write(path, data):
        real(path, data)
        time.sleep({delay})

      store.write._write_file = slow_write
      while not go.exists():
        time.sleep(0.01)
  """) + textwrap.dedent(body)


# Each child records its own one-case batch into the same new directory with the
# real `record` command.
_RECORDER = _child(0.3, """
    from nnx_pool.regression import cli
    from nnx_pool.regression.batch import Batch, Case
""", """
    batch = lambda: Batch([Case("double_" + tag, lambda: (lambda x: 2 * x), input="one")])
    sys.exit(cli.main(["record", "--out", str(out)], batch=batch))
""")

# The store alone (no JAX): each child replaces the same baseline with --force.
_FORCED_WRITER = _child(0.2, """
    import numpy as np
""", """
    store.write_baseline(out, {"kind": tag}, {tag: np.full(1000, ord(tag), np.int32)}, force=True)
""")


# The recorders where os.fork exists: one interpreter imports the kit (and so JAX: an import
# starts no backend and none of JAX's threads), then forks a recorder per tag (tests/_forking.py);
# each is its own process, initialises JAX itself and records with the real `record` command,
# its stderr its own. The children's CPU in this test (getrusage(RUSAGE_CHILDREN) around it,
# 2 cores): two interpreters, each importing the kit (1.7 s), 4.3 s; one forking two, 2.1 s.
_FORKED_RECORDERS = textwrap.dedent("""
    import json, runpy, sys, time
    from pathlib import Path

    from nnx_pool.regression import cli, store
    from nnx_pool.regression.batch import Batch, Case

    forking, out, tags = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    real = store.write._write_file

    def slow_write(path, data):
      real(path, data)
      time.sleep(0.3)

    def record(out, tag):
      batch = lambda: Batch([Case("double_" + tag, lambda: (lambda x: 2 * x), input="one")])
      return cli.main(["record", "--out", str(out)], batch=batch)

    store.write._write_file = slow_write
    print(json.dumps(runpy.run_path(forking)["fork_together"](record, out, tags)))
""")


def _record_together(out: Path, tags: list[str]) -> list:
  """Each tag's recorder, released together; ``[(code, "", stderr)]``."""
  if not hasattr(os, "fork"):
    return _run_together(_RECORDER, out, tags)
  done = subprocess.run([sys.executable, "-c", _FORKED_RECORDERS, str(FORKING), str(out), *tags],
                        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120,
                        check=False)
  assert done.returncode == 0, done.stdout + done.stderr
  return [tuple(result) for result in json.loads(done.stdout.splitlines()[-1])]


def _forced_write(out: Path, tag: str) -> None:
  """:data:`_FORCED_WRITER`'s body, in a forked child: the same slowed-down write."""
  real = store.write._write_file

  def slow_write(path, data):
    real(path, data)
    time.sleep(0.2)

  store.write._write_file = slow_write
  store.write_baseline(out, {"kind": tag}, {tag: np.full(1000, ord(tag), np.int32)}, force=True)


def _run_together(script: str, out: Path, tags: list[str]) -> list:
  go = out.parent / "go"
  children = [
      subprocess.Popen([sys.executable, "-c", script, str(out), tag, str(go)], cwd=REPO,
                       env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for tag in tags
  ]
  go.touch()
  results = []
  for child in children:
    stdout, stderr = child.communicate(timeout=120)
    results.append((child.returncode, stdout, stderr))
  go.unlink()
  return results


def test_regression_concurrent_records_one_wins_the_others_refuse(tmp_path):
  out = tmp_path / "base"
  tags = ["a", "b"]
  results = _record_together(out, tags)
  codes = [code for code, _, _ in results]
  assert sorted(codes) == [0, 2], results
  winner = tags[codes.index(0)]
  for code, _, stderr in results:
    if code == 2:  # a loser found the winner's baseline, whole, and says so
      assert stderr == f"error: baseline {out} exists; pass --force to replace it.\n"
  final = read_baseline(out)
  assert list(final.manifest["cases"]) == [f"double_{winner}"]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]
  assert sorted(os.listdir(out)) == [store.arrays_name(final.manifest), "manifest.json"]


def test_regression_concurrent_forced_writes_leave_one_whole_baseline(baseline, tmp_path):
  # Three writers: while one holds the lock, two wait for it and contend when it is released.
  # (Each is an interpreter importing the store, 0.6 s of CPU; a fourth proved nothing more.)
  tags = ["a", "b", "c"]
  results = (fork_together(_forced_write, baseline, tags) if hasattr(os, "fork") else
             _run_together(_FORCED_WRITER, baseline, tags))
  assert [code for code, _, _ in results] == [0, 0, 0], results
  # One writer's baseline, complete and consistent (digests and checksum verified).
  final = read_baseline(baseline)
  tag = final.manifest["kind"]
  assert tag in tags
  assert list(final.arrays) == [tag]
  np.testing.assert_array_equal(final.arrays[tag], np.full(1000, ord(tag), np.int32))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]
  assert sorted(os.listdir(baseline)) == [store.arrays_name(final.manifest), "manifest.json"]


def test_regression_writer_waits_for_the_lock_then_gives_a_clear_message(
    baseline, monkeypatch):
  # Another writer holds the directory (an open file description of its own, as another
  # process would); this one gives up after the timeout.
  import fcntl

  holder = os.open(baseline.parent, os.O_RDONLY)
  fcntl.flock(holder, fcntl.LOCK_EX)
  before = _snapshot(baseline)
  monkeypatch.setattr(store.write, "LOCK_TIMEOUT_S", 0.2)
  try:
    with pytest.raises(store.BaselineLockedError, match=(
        r"another process has been writing a baseline in .* for over 0\.2 s; try again")):
      store.write_baseline(baseline, {"kind": "x"}, {"a": np.zeros(1)}, force=True)
  finally:
    os.close(holder)
  assert _snapshot(baseline) == before


# --------------------------------------------------------- sharded checks

# Real batch cases across the module families: selections with indices, window
# and whole-map averages, bfloat16, an unbatched input, an error case, gates
# with stored weights and parameter gradients (summed over the sharded batch).
SHARDED_CASES = (
    "max_k2_indices_int32_ints", "avg_k3s2_same_batch", "lp2_k2_bf16_batch",
    "avg_k23_s12_pairs_unbatched", "max_bad_rank", "se_gate_map",
)


@pytest.fixture(scope="module")
def sharded_baseline(tmp_path_factory) -> Path:
  out = tmp_path_factory.mktemp("sharded") / "base"
  cases = [c for c in load_batch().cases if c.name in SHARDED_CASES]
  assert sorted(c.name for c in cases) == sorted(SHARDED_CASES)
  report = commands.record(cases, out, reps=FAST)  # on this process's single device
  assert report.exit_code == 0, [(r.case, r.details) for r in report.rows]
  return out


_SHARDED_CHECK = textwrap.dedent("""
    import sys
    from nnx_pool.regression import cli

    assert "jax" not in sys.modules  # the CLI imports no JAX: it can set XLA_FLAGS first
    from nnx_pool.regression.batch import Batch, load_batch  # imports JAX, does not initialise it
    names = sys.argv[1].split(",")
    batch = lambda: Batch([c for c in load_batch().cases if c.name in names])
    sys.exit(cli.main(sys.argv[2:], batch=batch))
""")


def test_regression_check_devices_shards_the_batch_and_matches_one_device(
    sharded_baseline, tmp_path):
  report_path = tmp_path / "report.json"
  done = subprocess.run(
      [sys.executable, "-c", _SHARDED_CHECK, ",".join(SHARDED_CASES), "check", "--devices",
       "4", "--baseline", str(sharded_baseline), "--json", str(report_path)],
      cwd=REPO, env=_env(), capture_output=True, text=True, timeout=180, check=False)
  assert done.returncode == 0, done.stdout + done.stderr
  report = json.loads(report_path.read_text())
  assert report["counts"] == {"PASS": len(SHARDED_CASES)}
  # Expected: the single-device baseline; the stamp says what changed.
  assert "device_count 1 -> 4" in report["stamp_changes"]
  assert report["notes"][0] == (
      "sharded run: mesh axis 'batch' over 4 cpu devices (explicit axes); every copy of a "
      "repeated batch is compared with the baseline")
  assert report["notes"][1:] == [
      "  2 case(s): batch of 2 repeated 4 times, sharded over 4 devices",
      "  2 case(s): batch of 3 repeated 4 times, sharded over 4 devices",
      "  1 case(s): replicated on 4 devices (an error case)",
      "  1 case(s): replicated on 4 devices (no batch axis)",
  ]
  se = next(r for r in report["rows"] if r["case"] == "se_gate_map")
  assert {"output", "grad/input", "grad/params/fc1/kernel"} <= set(se["arrays"])


def test_regression_check_devices_reruns_itself_when_jax_is_initialised(
    sharded_baseline, tmp_path):
  # This process initialised JAX with one device: the command re-runs in a fresh
  # interpreter with XLA_FLAGS set, and returns its exit code.
  report_path = tmp_path / "report.json"
  code = cli.main(["check", "--devices", "2", "--baseline", str(sharded_baseline), "-k",
                   "avg_k3s2_same_batch", "--json", str(report_path)])
  assert code == 0
  report = json.loads(report_path.read_text())
  assert report["counts"] == {"PASS": 1}
  assert report["notes"][-1] == "  1 case(s): batch of 3 repeated 2 times, sharded over 2 devices"


def test_regression_check_devices_with_a_custom_batch_needs_the_flag_set_first(
    baseline, capsys):
  have = jax.device_count()  # this process initialised JAX (one device under plain pytest)
  code = cli.main(["check", "--devices", str(have + 3), "--baseline", str(baseline)],
                  batch=lambda: Batch([_double("old")]))
  assert code == 2
  assert capsys.readouterr().err == (
      f"error: --devices {have + 3}: JAX is already initialised with {have} device(s) and a "
      "custom batch cannot be re-run in a fresh interpreter; set "
      f"XLA_FLAGS=--xla_force_host_platform_device_count={have + 3} before importing JAX.\n")


def test_regression_check_with_more_devices_than_jax_sees_exits_2(baseline):
  have = jax.device_count()
  report = commands.check([_double("old")], baseline, devices=have + 3, reps=FAST)
  assert report.exit_code == 2
  assert report.error.startswith(
      f"--devices {have + 3}: JAX sees {have} cpu device(s). Simulated CPU devices need "
      f"XLA_FLAGS=--xla_force_host_platform_device_count={have + 3}")


def test_regression_devices_must_be_a_positive_integer(capsys):
  with pytest.raises(SystemExit) as info:
    cli.main(["check", "--devices", "0"])
  assert info.value.code == 2
  assert "argument --devices: must be a positive integer; got '0'" in capsys.readouterr().err


def test_regression_xla_flags_keep_other_flags_and_replace_the_device_count():
  flags = "--xla_cpu_use_thunk_runtime=false --xla_force_host_platform_device_count=2"
  assert with_device_count(flags, 8) == (
      "--xla_cpu_use_thunk_runtime=false --xla_force_host_platform_device_count=8")
  assert with_device_count("", 4) == "--xla_force_host_platform_device_count=4"


def test_regression_split_copies_divides_parameter_gradients_by_the_copies():
  tiled = np.arange(12.0, dtype=np.float32).reshape(6, 2)  # 3 copies of a batch of 2
  pieces = runner.split_copies("output", tiled, 3)
  assert [p.tolist() for p in pieces] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10, 11]]]
  (grad,) = runner.split_copies("grad/params/fc1/kernel", np.array([3.0, 6.0], np.float32), 3)
  assert grad.dtype == np.float32 and grad.tolist() == [1.0, 2.0]


def test_regression_a_copy_that_differs_fails_the_case():
  expected = np.ones((2, 3), np.float32)
  tiled = np.ones((8, 3), np.float32)
  tiled[5, 1] = 1.5  # copy 2, row 1
  tol = tolerance_for("select", "output", np.dtype(np.float32))
  verdict = runner._compare_copies("output", tiled, expected, tol, 4)
  assert not verdict.passed
  assert verdict.message == (
      "1 of 4 copies differ; copy 2: 1 of 6 elements differ (first at (1, 1): 1.5 vs "
      "baseline 1)")
  assert verdict.max_abs == 0.5 and verdict.size == 24
  assert compare_arrays(tiled[:2], expected, tol).passed


def test_regression_check_after_a_failed_record_still_reads_the_old_baseline(
    baseline, monkeypatch):
  monkeypatch.setattr(store.write, "_write_file", _full_disk(partial=True, on="manifest"))
  report = commands.record([_double("new")], baseline, force=True, reps=FAST)
  assert report.exit_code == 2
  monkeypatch.undo()
  check = commands.check([_double("old")], baseline, reps=FAST)
  assert check.exit_code == 0 and [r.status for r in check.rows] == ["PASS"]
  with pytest.raises(BaselineError, match="no such directory"):
    read_baseline(baseline.parent / "elsewhere")
