"""Tests for the report's stamp headers and its quiet timing section, and for unknown values."""

import json

import pytest

from nnx_pool.regression import cli, stamp, store
from nnx_pool.regression.report import (
  NOISE,
  Report,
  Row,
  Timing,
  aligned,
  render,
  shown_rows,
  table,
  timing_lines,
  write_json,
)

STAMP_A = {
    "versions": {"python": "3.11.7", "numpy": "2.4.6", "jax": "0.10.2", "jaxlib": "0.10.2",
                 "flax": "0.12.8", "chex": "0.1.92"},
    "backend": {"platform": "gpu", "device_kind": "NVIDIA H200", "device_count": 1},
    "git": {"revision": "eb143693f648a1b2c3d4", "dirty": False},
}
STAMP_B = {
    "versions": {"python": "3.11.7", "numpy": "2.4.6", "jax": "0.9.2", "jaxlib": "0.9.2",
                 "flax": "0.12.5", "chex": "0.1.92"},
    "backend": {"platform": "cpu", "device_kind": "cpu", "device_count": 1},
    "git": {"revision": None, "dirty": None},  # an installed wheel: no checkout to ask
}
# Each stamp's header, written out: the versions, the platform with its device, the revision.
HEADER_A = ("python 3.11.7, numpy 2.4.6, jax 0.10.2, jaxlib 0.10.2, flax 0.12.8, "
            "gpu (NVIDIA H200), git eb143693f648")
HEADER_B = ("python 3.11.7, numpy 2.4.6, jax 0.9.2, jaxlib 0.9.2, flax 0.12.5, cpu (cpu), "
            "git unknown")


def test_stamp_header_names_versions_platform_device_and_git():
  assert stamp.stamp_header(STAMP_A) == HEADER_A
  assert stamp.stamp_header(STAMP_B) == HEADER_B
  assert stamp.stamp_header({}) == (
      "python unknown, numpy unknown, jax unknown, jaxlib unknown, flax unknown, "
      "unknown (unknown), git unknown")


def test_stamp_rows_put_every_value_side_by_side_and_mark_the_changes():
  # By hand from STAMP_A and STAMP_B: versions, then backend, then git, each by key; a value
  # one side does not know (the wheel's git) is shown as unknown and is no change.
  assert stamp.stamp_rows(STAMP_A, STAMP_B) == [
      ("chex", "0.1.92", "0.1.92", False),
      ("flax", "0.12.8", "0.12.5", True),
      ("jax", "0.10.2", "0.9.2", True),
      ("jaxlib", "0.10.2", "0.9.2", True),
      ("numpy", "2.4.6", "2.4.6", False),
      ("python", "3.11.7", "3.11.7", False),
      ("device_count", "1", "1", False),
      ("device_kind", "NVIDIA H200", "cpu", True),
      ("platform", "gpu", "cpu", True),
      ("git dirty", "False", "unknown", False),
      ("git revision", "eb143693f648", "unknown", False),
  ]
  assert stamp.stamp_changes(STAMP_A, STAMP_B) == [
      "flax 0.12.8 -> 0.12.5", "jax 0.10.2 -> 0.9.2", "jaxlib 0.10.2 -> 0.9.2",
      "device_kind NVIDIA H200 -> cpu", "platform gpu -> cpu"]


def test_an_unknown_value_is_shown_but_never_a_change():
  changes = stamp.stamp_changes(STAMP_A, STAMP_B)
  assert "jax 0.10.2 -> 0.9.2" in changes and "platform gpu -> cpu" in changes
  assert not [c for c in changes if c.startswith("git")]
  # An environment variable set on one side only is a change ("unset").
  with_env = {**STAMP_B, "env": {"XLA_FLAGS": "--x"}}
  assert stamp.stamp_changes(STAMP_B, with_env) == ["env XLA_FLAGS unset -> --x"]
  known = {**STAMP_B, "git": {"revision": "0123456789abcdef", "dirty": True}}
  assert stamp.stamp_changes(known, {**known, "git": {"revision": "fedcba", "dirty": True}}) == [
      "git revision 0123456789ab (with uncommitted changes) -> fedcba (with uncommitted changes)"]


def test_a_tree_with_changes_is_said_on_the_revision_line_where_the_revision_moved():
  # Issue 36, item 14: a clean clone against the shipped baseline (recorded from a tree with
  # changes) listed "git dirty True -> False" beside the revision, as a change of its own.
  def side(revision, dirty):
    return {**STAMP_B, "git": {"revision": revision, "dirty": dirty}}

  assert stamp.stamp_changes(side("fe60abbedbcb096e", True), side("41e1838716d1aaaa", False)) == [
      "git revision fe60abbedbcb (with uncommitted changes) -> 41e1838716d1"]
  assert stamp.stamp_changes(side("fe60abbedbcb096e", False), side("41e1838716d1aaaa", True)) == [
      "git revision fe60abbedbcb -> 41e1838716d1 (with uncommitted changes)"]
  # The same revision with and without changes: the one thing that moved, said as it is.
  assert stamp.stamp_changes(side("fe60abbedbcb096e", False), side("fe60abbedbcb096e", True)) == [
      "git dirty False -> True"]


def test_git_revision_is_unknown_outside_a_source_checkout(monkeypatch, tmp_path):
  monkeypatch.setattr(stamp, "source_checkout", lambda: None)
  assert stamp.git_revision() == {"revision": None, "dirty": None}
  assert stamp.git_revision(tmp_path) == {"revision": None, "dirty": None}  # not a repository


def test_every_check_opens_with_one_header_per_side():
  report = Report(command="check", stamp=STAMP_B, baseline_stamp=STAMP_A,
                  rows=[Row("c", "PASS", 0.0, 0.0, "exact")])
  lines = render(report).splitlines()
  assert lines[:2] == [f"this run: {HEADER_B}", f"baseline: {HEADER_A}"]
  assert lines[3].startswith("case ")
  diff = render(Report(command="diff", stamp=STAMP_B, baseline_stamp=STAMP_A)).splitlines()
  assert diff[:2] == [f"A:        {HEADER_A}", f"B:        {HEADER_B}"]


def test_table_cells_are_the_texts_that_both_renderers_lay_out():
  rows = [Row("max_k2_one", "PASS", 0.0, 0.0, "exact"),
          Row("avg", "FAIL", float("inf"), 2.5e-6, "rtol=1e-06 atol=1e-06"),
          Row("gone_case", "GONE")]
  assert table(rows) == [
      ("case", "max abs err", "max rel err", "tolerance", "status"),
      ("max_k2_one", "0", "0", "exact", "PASS"),
      ("avg", "inf", "2.5e-06", "rtol=1e-06 atol=1e-06", "FAIL"),
      ("gone_case", "-", "-", "", "GONE"),
  ]
  assert aligned(table(rows)) == [
      "case        max abs err  max rel err  tolerance              status",
      "max_k2_one  0            0            exact                  PASS",
      "avg         inf          2.5e-06      rtol=1e-06 atol=1e-06  FAIL",
      "gone_case   -            -                                   GONE",
  ]
  # A cell's markup (the page's link or colour) is not counted in its column's width.
  assert aligned([("a", "bb"), ("ccc", "d")], lambda row, column, text: f"<{text}>") == [
      "<a>    <bb>", "<ccc>  <d>"]


def _timings(n_noisy: int) -> list[Timing]:
  """Cases whose steady time moves within the noise, plus two real movers."""
  noisy = [Timing(f"noisy{i}", 0.05, 0.08, 10e-6, 70e-6) for i in range(n_noisy)]  # x1.6, x7
  return noisy + [
      Timing("slow_compile", 0.1, 0.25, 10e-6, 10e-6),  # compile x2.5
      Timing("slow_steady", 0.1, 0.1, 10e-6, 150e-6),  # steady x15
  ]


def test_timing_by_default_counts_the_movers_and_names_no_time():
  # Issue 36, item 14: `make check` on a fresh clone printed "largest mover: ...: compile
  # 75.4 ms -> 361.0 ms (x4.79)", the shipped baseline's machine against the user's.
  assert timing_lines(_timings(13)) == [
      "  2 cases timed past the noise (compile x2, steady x10); --timing lists them and the "
      "totals (times from another machine differ for that alone)"]
  assert timing_lines(_timings(13)[:13]) == []  # noise only: nothing


def test_timing_flag_lists_the_totals_and_every_mover_past_the_noise():
  lines = timing_lines(_timings(13), every=True)
  assert lines[:2] == ["  compile (lower+compile): 850.0 ms -> 1.39 s (x1.64)",
                       "  steady median, summed: 150 us -> 1.1 ms (x7.13)"]
  assert lines[2:] == [
      "  slow_steady: steady 10 us -> 150 us (x15.00)",
      "  slow_compile: compile 100.0 ms -> 250.0 ms (x2.50)",
  ]


@pytest.mark.parametrize("ratio, moved", [(NOISE["steady"] * 0.99, False), (NOISE["steady"], True),
                                          (1 / NOISE["steady"], True)])
def test_noise_threshold_is_the_documented_one(ratio, moved):
  t = Timing("c", 1.0, 1.0, 1e-5, 1e-5 * ratio)
  assert (t.changed() == ["steady"]) is moved


def test_json_is_named_only_when_written():
  report = Report(command="check", rows=[Row("c", "PASS")], timings=_timings(13))
  assert "json" not in render(report).lower()
  assert "json" not in render(report, timing=True).lower()
  assert render(report, json_path="r.json").endswith(
      "(the full report, per-array verdicts and every timing, is in r.json)")


def test_cli_timing_flag_is_parsed():
  assert cli.make_parser().parse_args(["check", "--timing"]).timing is True
  assert cli.make_parser().parse_args(["check"]).timing is False


def test_from_json_reads_back_what_to_json_wrote():
  # rehearse reads the report its check wrote in the other environment.
  report = Report(
      command="check", exit_code=1, baseline="base", stamp=STAMP_B, baseline_stamp=STAMP_A,
      rows=[Row("a", "FAIL", float("inf"), 0.5, "exact", ["output: differs"],
                {"output": {"max_abs": "inf"}}), Row("b", "PASS", 0.0, None, "exact")],
      stamp_changes=["jax 0.10.2 -> 0.9.2"], recorded="2026-12-03", notes=["n"], dry_run=False,
      timings=_timings(2),
  )
  back = Report.from_json(json.loads(json.dumps(report.to_json())))
  assert back == report
  assert render(back) == render(report)
  with pytest.raises(KeyError):
    Report.from_json({"command": "check"})


def test_write_json_is_whole_or_not_at_all(tmp_path, monkeypatch):
  path = tmp_path / "report.json"
  path.write_text("the earlier report\n")

  def crash(target, data):  # the disk fills halfway through the new file
    target.write_bytes(data[: len(data) // 2])
    raise OSError("No space left on device")

  monkeypatch.setattr(store.write, "_write_file", crash)
  with pytest.raises(OSError, match="No space left"):
    write_json(Report(command="check", exit_code=0, rows=[Row("a", "PASS")]), path)
  assert path.read_text() == "the earlier report\n"
  assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary left
  monkeypatch.undo()
  write_json(Report(command="check", exit_code=0, rows=[Row("a", "PASS")]), path)
  assert json.loads(path.read_text())["rows"][0]["case"] == "a"


def test_a_long_report_lists_the_worst_failing_rows_by_how_far_over_tolerance():
  # Hand-built rows: excess 3, 50, inf (an exact rule) and 1.5 times the tolerance, one pass.
  def row(case, status, excess, max_abs):
    return Row(case, status, max_abs, 0.0, "t", arrays={"result": {"excess": excess}})

  rows = [row("a", "FAIL", 3.0, 1.0), row("b", "FAIL", 50.0, 0.1), row("c", "FAIL", "inf", 0.0),
          row("d", "FAIL", 1.5, 9.0), row("e", "PASS", 0.0, 0.0)]
  shown, line = shown_rows(rows, 2)
  assert [r.case for r in shown] == ["b", "c"]  # in their order, the two worst
  assert line == ("(and 2 more failing, 1 passing not listed: the 2 worst failing rows are "
                  "shown; every row is in the JSON and HTML reports)")
  assert shown_rows(rows, 5) == (rows, None)
