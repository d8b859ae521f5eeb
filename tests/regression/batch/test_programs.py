"""Tests for the batch's recorded programs: ``record`` keeps each case's forward program, and a
failing ``check`` runs it again to say whether the program or the compiler moved the case.

One stand-in case (an ``nnx.Linear`` followed by a reduction over the spatial axes) is
recorded with a max reduction and checked with a sum: the recorded program still gives the
recorded numbers, so the move is the program's, and the StableHLO that differs is the
reduction (``stablehlo.maximum`` recorded, ``stablehlo.add`` now), which is what the test
changed.
"""

import json

import numpy as np
import pytest
from flax import nnx
from packaging.version import Version

from nnx_pool.regression import store
from nnx_pool.regression.batch import Case
from nnx_pool.regression.batch.check import check
from nnx_pool.regression.batch.record import record
from nnx_pool.regression.cli import main
from nnx_pool.regression.report import Report, Row, render
from nnx_pool.regression.upgrade import bisect, rehearse
from nnx_pool.regression.upgrade.bisect_steps import Bisected, Step

FAST = 3  # timed steady-state calls per case
REDUCE = {"now": "max"}


class Head(nnx.Module):
  """A dense layer, then the reduction ``REDUCE`` names over the spatial axes."""

  def __init__(self):
    self.dense = nnx.Linear(2, 3, rngs=nnx.Rngs(0))

  def __call__(self, x):
    y = self.dense(x)
    return y.max(axis=(1, 2)) if REDUCE["now"] == "max" else y.sum(axis=(1, 2))


CASE = Case("head", Head, input="one", params=True, module="Head", config="Head()")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
  REDUCE["now"] = "max"
  out = tmp_path_factory.mktemp("programs") / "base"
  report = record([CASE], out, reps=FAST)
  assert report.exit_code == 0, report.error
  return out


@pytest.fixture
def summed():
  REDUCE["now"] = "sum"
  yield
  REDUCE["now"] = "max"


def _rewritten(base_dir, out, change):
  """The baseline at ``base_dir`` written to ``out`` after ``change(manifest, arrays)``."""
  base = store.read_baseline(base_dir)
  manifest = {k: v for k, v in base.manifest.items()
              if k not in ("format", "format_version", "arrays", "manifest_sha256")}
  arrays = dict(base.arrays)
  change(manifest, arrays)
  store.write_baseline(out, manifest, arrays)
  return out


def test_batch_record_keeps_each_case_program_beside_its_arrays(recorded):
  base = store.read_baseline(recorded)
  field = base.manifest["cases"]["head"]["program"]
  assert field["member"] == "program.jax" and field["results"] == ["output"]
  assert field["arguments"][-1] == "input/0"
  assert {"dense.kernel", "dense.bias"} <= set(field["arguments"])
  size = base.arrays["head/program.jax"].size
  assert base.arrays["head/program.jax"].dtype == np.uint8 and 0 < size < 100_000
  passing = check([CASE], recorded, reps=FAST)
  assert passing.exit_code == 0 and passing.attribution is None
  assert passing.rows[0].details == []


def test_batch_check_attributes_a_changed_reduction_to_the_program(recorded, summed):
  report = check([CASE], recorded, reps=FAST)
  row = report.rows[0]
  assert report.exit_code == 1 and row.status == "FAIL"
  said = report.attribution
  assert said is not None and said["kind"] == "program"
  assert said["line"].startswith("the program changed, not the compiler")
  assert said["line"] not in row.details  # shown once, above the table
  assert row.attribution == said
  text = render(report)
  assert text.count(said["line"]) == 1 and text.index(said["line"]) < text.index("head ")
  removed = [line for line in said["diff"] if line.startswith("- ")]
  added = [line for line in said["diff"] if line.startswith("+ ")]
  assert any("stablehlo.maximum" in line for line in removed), said["diff"]
  assert any("stablehlo.add" in line for line in added), said["diff"]
  assert report.to_json()["attribution"]["kind"] == "program"
  json.dumps(report.to_json())


def test_batch_check_says_a_corrupt_program_cannot_be_loaded(recorded, summed, tmp_path):
  def corrupt(manifest, arrays):
    arrays["head/program.jax"] = np.frombuffer(b"not a jax.export program" * 4, np.uint8)

  report = check([CASE], _rewritten(recorded, tmp_path / "corrupt", corrupt), reps=FAST)
  assert report.rows[0].status == "FAIL"
  said = report.attribution
  assert said is not None and said["kind"] == "none"
  assert said["line"].startswith("no attribution: the recorded program cannot be loaded here")


def test_batch_check_of_a_baseline_without_programs_attributes_nothing(recorded, summed,
                                                                       tmp_path):
  def older(manifest, arrays):
    del manifest["cases"]["head"]["program"]
    del arrays["head/program.jax"]

  report = check([CASE], _rewritten(recorded, tmp_path / "older", older), reps=FAST)
  assert report.exit_code == 1 and report.rows[0].status == "FAIL"
  assert report.attribution is None
  assert not any("attribution" in d or "changed, not the" in d for d in report.rows[0].details)


COMPILER = {"kind": "compiler", "line": "the compiler changed, not the program: the same "
            "StableHLO compiles to new numbers under jaxlib 0.9.2 -> 0.10.0", "diff": [],
            "seconds": 0.1}


def _two_failures():
  """A check report in which two cases failed, the second one attributed."""
  return Report(command="check", exit_code=1, rows=[
      Row("plain", "FAIL", details=["output: moved"]),
      Row("head", "FAIL", details=["output: moved", COMPILER["line"]], attribution=COMPILER)])


def test_batch_row_attribution_survives_the_json_report(recorded, summed):
  report = check([CASE], recorded, reps=FAST)
  again = Report.from_json(json.loads(json.dumps(report.to_json())))
  assert again.rows[0].attribution["kind"] == "program"
  assert again.attribution["kind"] == "program"


def test_bisect_prints_the_first_moved_release_attribution_on_its_own_line(monkeypatch, capsys):
  moved = Step(Version("0.10.0"), verdict="MOVED", label="jax 0.10.0", report=_two_failures())
  found = Bisected(exit_code=1, answer="first moved: jax 0.10.0, last good: jax 0.9.2",
                   steps=[moved], moved=moved)
  monkeypatch.setattr(bisect, "bisect", lambda *args, **kwargs: found)
  assert main(["bisect", "--good", "jax==0.9.2", "--bad", "jax==0.10.0"]) == 1
  out = capsys.readouterr().out.splitlines()
  assert ("bisect: jax 0.10.0: why head moved: the compiler changed, not the program: the same "
          "StableHLO compiles to new numbers under jaxlib 0.9.2 -> 0.10.0") in out


def test_rehearse_prints_the_attribution_once_and_keeps_it_in_its_json(monkeypatch, capsys,
                                                                       tmp_path):
  monkeypatch.setattr(rehearse, "rehearse", lambda *args, **kwargs: _two_failures())
  assert main(["rehearse", "jax==0.10.0", "--json", str(tmp_path / "r.json")]) == 1
  out = capsys.readouterr().out
  assert out.count(COMPILER["line"]) == 2  # the row's detail, and the line of its own
  assert f"rehearse: why head moved: {COMPILER['line']}" in out.splitlines()
  written = json.loads((tmp_path / "r.json").read_text())
  assert written["rows"][1]["attribution"]["kind"] == "compiler"
  single = Report(command="check", exit_code=1, attribution=COMPILER,
                  rows=[Row("head", "FAIL", attribution=COMPILER)])
  monkeypatch.setattr(rehearse, "rehearse", lambda *args, **kwargs: single)
  main(["rehearse", "jax==0.10.0"])
  assert capsys.readouterr().out.count(COMPILER["line"]) == 1  # above the table only
