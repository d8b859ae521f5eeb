"""Tests for ``check --html``: the self-contained page and its heatmaps.

One baseline of three real cases is recorded once per module; a copy with one
float output and one index array changed is checked once with ``--html``, and
most tests read that one page.
"""

import base64
import contextlib
import errno
import io
import json
import re
import shutil
import sys

import numpy as np
import pytest

from nnx_pool.regression import cli, commands, store
from nnx_pool.regression.batch import Batch, load_batch
from nnx_pool.regression.report import FailedArray, Report, Row, html
from nnx_pool.regression.tolerance import Tolerance

NAMES = ("max_k2_one", "avg_k2_one", "max_k2_indices_bf16_one")
FAILING = {"avg_k2_one": "output", "max_k2_indices_bf16_one": "indices"}


class _Terminal(io.StringIO):
  def isatty(self) -> bool:
    return True


def _never_built():
  raise AssertionError("the batch must not be built")


@pytest.fixture(scope="module")
def cases():
  return [c for c in load_batch().cases if c.name in NAMES]


@pytest.fixture(scope="module")
def checked(tmp_path_factory, cases):
  """The page, stdout, stderr (a terminal), JSON report and exit code of one failing check."""
  tmp = tmp_path_factory.mktemp("html")
  assert commands.record(cases, tmp / "baseline", reps=3).exit_code == 0
  base = store.read_baseline(tmp / "baseline")
  arrays = dict(base.arrays)
  output = arrays["avg_k2_one/output"].copy()
  output[0, 1, 2, 1] += np.float32(1e-3)  # far over rtol=atol=1e-6
  indices = arrays["max_k2_indices_bf16_one/indices"].copy()
  indices[0, 2, 0, 0] = (indices[0, 2, 0, 0] + 1) % 36  # another cell of the 6x6 map
  arrays["avg_k2_one/output"], arrays["max_k2_indices_bf16_one/indices"] = output, indices
  fields = {k: v for k, v in base.manifest.items()
            if k not in ("format", "format_version", "arrays", "manifest_sha256")}
  fields["stamp"]["versions"]["jax"] = "0.0.1"
  store.write_baseline(tmp / "baseline", fields, arrays, force=True)

  out, err = io.StringIO(), _Terminal()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main(["check", "--baseline", str(tmp / "baseline"), "--html", str(tmp / "r.html"),
                     "--json", str(tmp / "r.json")], batch=lambda: Batch(cases=cases))
  return {"page": (tmp / "r.html").read_text(), "out": out.getvalue(), "err": err.getvalue(),
          "json": json.loads((tmp / "r.json").read_text()), "code": code, "dir": tmp}


def _section(page: str, case: str) -> str:
  start = page.index(f'<section id="case-{case}">')
  return page[start:page.index("</section>", start)]


def test_html_page_is_written_and_named(checked):
  assert checked["code"] == 1
  assert checked["out"].rstrip().endswith(
      f"(the HTML report, with heatmaps of the failing arrays, is in {checked['dir'] / 'r.html'})")
  assert sorted(p.name for p in checked["dir"].iterdir()) == ["baseline", "r.html", "r.json"]


def test_html_page_is_self_contained(checked):
  page = checked["page"]
  assert page.startswith("<!DOCTYPE html>")
  assert "http://" not in page and "https://" not in page
  assert "<script" not in page.lower() and "<link" not in page.lower() and "url(" not in page
  for ref in re.findall(r'(?:src|href)="([^"]*)"', page):
    assert ref.startswith(("data:image/png;base64,", "#case-")), ref


def test_html_draws_one_image_per_failing_array(checked):
  page = checked["page"]
  images = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)">', page)
  assert len(images) == page.count("<img") == len(FAILING)
  for case, key in FAILING.items():
    section = _section(page, case)
    (alt, png), = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)">', section)
    assert alt.startswith(f"{key}: baseline, new and difference of {key}[")
    assert base64.b64decode(png).startswith(b"\x89PNG\r\n\x1a\n")


def test_html_names_the_failing_case_its_slice_and_tolerance(checked):
  avg = _section(checked["page"], "avg_k2_one")
  assert "avg_k2_one <span class=\"FAIL\">FAIL</span>" in avg
  assert "output: 1 of 18 elements differ (first at (0, 1, 2, 1)" in avg
  # The slice through the failing element: sample 0, channel 1 of the (1, 3, 3, 2) output.
  assert "Shown: <code>output[0, :, :, 1] (sample 0, channel 1)</code>" in avg
  assert "<code>rtol=1e-06 atol=1e-06</code>; outlined in blue: the cells where |new" in avg
  indices = _section(checked["page"], "max_k2_indices_bf16_one")
  assert "Shown: <code>indices[0, :, :, 0] (sample 0, channel 0)</code>" in indices
  assert "the right panel marks the cells that differ" in indices


def test_html_passing_cases_take_one_line_each(checked):
  page = checked["page"]
  cases = page[page.index("<h2>Cases</h2>"):page.index("<h2>Failures</h2>")]
  (line,) = [line for line in cases.splitlines() if "max_k2_one" in line]
  assert line.endswith('<span class="PASS">PASS</span>') and "<a " not in line
  # Nothing else about it (the timing section may list it among the movers).
  rest = page.replace(cases, "").split("<h2>Timing</h2>")[0]
  assert "max_k2_one" not in rest


def test_html_lists_failures_first(checked):
  # The batch ran max_k2_one (PASS), then the two failing cases; the page leads with those.
  page = checked["page"]
  cases = page[page.index("<h2>Cases</h2>"):page.index("<h2>Failures</h2>")]
  shown = [line.split()[0] for line in re.sub(r"<[^>]+>", "", cases).splitlines()[2:-1]]
  assert shown == ["max_k2_indices_bf16_one", "avg_k2_one", "max_k2_one"]


def test_html_orders_cases_by_status_then_batch_order():
  statuses = {"a": "PASS", "b": "GONE", "c": "FAIL", "d": "NEW", "e": "STALE", "f": "ERROR",
              "g": "PASS", "h": "FAIL"}  # in batch order
  report = Report(command="check", exit_code=1, rows=[
      Row(name, status, details=[] if status == "PASS" else [f"{name} failed"])
      for name, status in statuses.items()])
  page = html.render_html(report)
  cases = page[page.index("<h2>Cases</h2>"):page.index("<h2>Failures</h2>")]
  shown = [line.split()[0] for line in re.sub(r"<[^>]+>", "", cases).splitlines()[2:-1]]
  assert shown == ["c", "h", "f", "e", "d", "b", "a", "g"]  # FAIL ERROR STALE NEW GONE PASS
  sections = re.findall(r'<section id="case-(\w+)">', page)
  assert sections == ["c", "h", "f", "e", "d", "b"]
  assert [r.case for r in report.rows] == list(statuses)  # the report itself keeps batch order


def test_html_closing_line_speaks_of_heatmaps_only_when_the_page_has_one(checked, tmp_path):
  drawn = checked["dir"] / "r.html"
  assert html.closing_line(drawn) == (
      f"(the HTML report, with heatmaps of the failing arrays, is in {drawn})")
  # Every case passes, or fails without an array to draw (STALE, NEW): no heatmap on the page.
  for rows in ([Row("a", "PASS", 0.0, 0.0, "exact")],
               [Row("a", "STALE", details=["declaration changed"]), Row("b", "NEW")]):
    path = tmp_path / "r.html"
    html.write_html(Report(command="check", rows=rows), path)
    assert "<img" not in path.read_text()
    assert html.closing_line(path) == f"(the HTML report is in {path})"


def test_html_holds_both_stamps_the_changes_and_the_table(checked):
  page, out = checked["page"], checked["out"]
  assert "this run: python " in page and "baseline: python " in page
  assert "  jax 0.0.1 -&gt; " in page
  assert re.search(r'<tr class="changed"><td>jax</td><td class="v">0.0.1</td>', page)
  table = [line for line in out.splitlines() if line.startswith(NAMES)]
  assert len(table) == 3
  for line in table:  # the CLI's table line, escaped, with the name linked or not
    assert re.sub(r"<[^>]+>", "", next(p for p in page.splitlines() if line.split()[0] in p
                                       and p.endswith("</span>"))) == line


def test_html_json_report_does_not_carry_the_arrays(checked):
  rows = {r["case"]: r for r in checked["json"]["rows"]}
  assert "failed" not in rows["avg_k2_one"]
  assert set(rows["avg_k2_one"]["arrays"]["output"]) >= {"passed", "max_abs", "tolerance"}


def test_html_progress_on_a_terminal_names_each_case_and_figure(checked):
  shown = [p.rstrip() for p in checked["err"].split("\r") if p.strip()]
  assert shown == ["check: case 1/3 max_k2_one ...", "check: case 2/3 max_k2_indices_bf16_one ...",
                   "check: case 3/3 avg_k2_one ...",
                   "check --html: figure 1/2 max_k2_indices_bf16_one/indices ...",
                   "check --html: figure 2/2 avg_k2_one/output ..."]


def test_html_without_matplotlib_exits_2_naming_the_install_command(monkeypatch, capsys, tmp_path):
  monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
  assert not html.available()
  assert cli.main(["check", "--html", str(tmp_path / "r.html")], batch=_never_built) == 2
  captured = capsys.readouterr()
  assert captured.out == ""
  assert captured.err == "error: --html needs matplotlib: pip install 'nnx-pool[report]'\n"
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("where", "message"), [
    ("missing/r.html", "directory {tmp}/missing does not exist."),
    (".", "is a directory; name the file to write."),
])
def test_html_refuses_an_unwritable_path_before_running(tmp_path, capsys, where, message):
  out = tmp_path / where
  assert cli.main(["check", "--html", str(out)], batch=_never_built) == 2
  (line,) = capsys.readouterr().err.splitlines()
  assert line == f"error: --html {out}: " + message.format(tmp=tmp_path)


def test_html_refuses_the_json_path(tmp_path, capsys):
  out = str(tmp_path / "r")
  assert cli.main(["check", "--html", out, "--json", out], batch=_never_built) == 2
  assert "--html and --json name the same file" in capsys.readouterr().err


def test_html_write_is_atomic_and_a_failed_write_keeps_the_old_page(checked, cases, monkeypatch,
                                                                    capsys, tmp_path):
  page = tmp_path / "r.html"
  page.write_text("the previous page")

  def full_disk(path, data):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(store.write, "_write_file", full_disk)
  shutil.copytree(checked["dir"] / "baseline", tmp_path / "b")
  code = cli.main(["check", "--baseline", str(tmp_path / "b"), "-k", "max_k2_one",
                   "--html", str(page)], batch=lambda: Batch(cases=cases))
  assert code == 2
  assert capsys.readouterr().err == (
      f"error: --html {page}: could not write it (No space left on device); any earlier file "
      "there is unchanged.\n")
  assert page.read_text() == "the previous page"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "r.html"]  # no temporary file left


def test_html_escapes_every_text():
  report = Report(command="check", baseline="<b>dir</b>", exit_code=1, rows=[
      Row("pass<i>", "PASS", 0.0, 0.0, "exact"),
      Row("bad&<case>", "ERROR", details=["<script>alert('x')</script>"]),
  ], notes=['"quoted" & <tagged>'])
  page = html.render_html(report)
  assert "<script" not in page and "<i>" not in page and "<b>dir" not in page
  assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
  assert '<a href="#case-bad%26%3Ccase%3E">bad&amp;&lt;case&gt;</a>' in page
  assert "&quot;quoted&quot; &amp; &lt;tagged&gt;" in page


def _failing_cases(names, excess=None):
  tol = Tolerance("exact", reason="hand-made")
  rows = []
  for i, name in enumerate(names):
    row = Row(name, "FAIL", details=[f"output: differs [{tol.describe()}]"])
    row.arrays["result"] = {"excess": (excess or [1.0] * len(names))[i]}
    for key in ("output", "output_eager"):
      row.failed[key] = FailedArray(np.zeros((1, 2, 2, 1)), np.ones((1, 2, 2, 1)), tol, (1, 2))
    rows.append(row)
  return rows


def test_html_draws_every_failing_case_and_caps_the_other_arrays(monkeypatch):
  monkeypatch.setattr(html, "MAX_FIGURES", 2)
  page = html.render_html(Report(command="check", exit_code=1,
                                 rows=_failing_cases(("first", "second"))))
  # Each case's first array ("output") is drawn; the two others are named.
  assert page.count("<img") == 2
  assert "4 arrays failed; 2 are drawn, at least one of every failing case." in page
  assert _section(page, "first").count("<img") == _section(page, "second").count("<img") == 1
  assert "output: differs [exact]" in _section(page, "second")


def test_html_draws_at_most_max_figures_the_worst_cases_first(monkeypatch):
  # Issue 38, item 6: one failing test's page drew 126 figures (7.4 MB) where the docs said
  # 48 at most. Three cases, two figures: those of the two worst cases.
  monkeypatch.setattr(html, "MAX_FIGURES", 2)
  page = html.render_html(Report(command="check", exit_code=1, rows=_failing_cases(
      ("mild", "worst", "bad"), excess=[2.0, 9.0, 5.0])))
  assert page.count("<img") == 2
  assert [_section(page, name).count("<img") for name in ("mild", "worst", "bad")] == [0, 1, 1]
  assert ("6 arrays failed; 2 are drawn (at most 2): one of each of the failing cases whose "
          "worst element is furthest off.") in page


def test_html_of_an_unusable_baseline_is_its_error():
  page = html.render_html(Report(command="check", exit_code=2, error="baseline b: no <such>"))
  assert '<p class="ERROR">error: baseline b: no &lt;such&gt;</p>' in page and "<img" not in page


@pytest.mark.parametrize(("shape", "spatial", "worst", "index", "text"), [
    # 2-D map (N, H, W, C): the map at the worst element's sample and channel.
    ((2, 4, 5, 3), (1, 2), (1, 2, 3, 2), (1, ..., ..., 2), "x[1, :, :, 2] (sample 1, channel 2)"),
    # 3-D map (N, D, H, W, C): and at its depth.
    ((1, 4, 4, 4, 2), (1, 2, 3), (0, 3, 1, 1, 1), (0, 3, ..., ..., 1),
     "x[0, 3, :, :, 1] (sample 0, depth 3, channel 1)"),
    # 1-D map (N, L, C): a strip.
    ((2, 9, 3), (1,), (1, 4, 0), (1, ..., 0), "x[1, :, 0] (sample 1, channel 0)"),
    # Unbatched (H, W, C).
    ((6, 6, 2), (0, 1), (3, 3, 1), (..., ..., 1), "x[:, :, 1] (channel 1)"),
    # No input layout (a parameter gradient, a flattened output): the last two axes.
    ((3, 4, 5), (), (2, 0, 1), (2, ..., ...), "x[2, :, :] (axis 0 index 2)"),
    ((7,), (), (3,), (...,), "x[:]"),
    ((), (), (), (), "x"),
])
def test_html_worst_slice_names_what_it_shows(shape, spatial, worst, index, text):
  got, described = html.worst_slice("x", shape, spatial, worst)
  assert tuple(... if isinstance(i, slice) else i for i in got) == index
  assert described == text


def test_check_html_of_a_passing_run_says_no_heatmaps(checked, cases, tmp_path):
  # Before, cli.py printed "with heatmaps of the failing arrays" whatever the page held.
  # The module's baseline, whose max_k2_one was left as recorded: checked alone, it passes
  # (recording the three cases afresh and checking them took 0.88 s of a full run).
  tmp = tmp_path
  out = io.StringIO()
  fresh = tmp / "fresh"
  shutil.copytree(checked["dir"] / "baseline", fresh)
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
    code = cli.main(["check", "--baseline", str(fresh), "-k", "max_k2_one",
                     "--html", str(tmp / "pass.html")], batch=lambda: Batch(cases=cases))
  assert code == 0
  assert out.getvalue().rstrip().endswith(f"(the HTML report is in {tmp / 'pass.html'})")


def test_html_puts_what_changed_first_above_the_table_and_a_long_list_after_it():
  # Issue 38, item 6: "What changed first" comes before the table (the cause first); a
  # renamed model's headline can be long (issue 29): its lines past the eighth follow it.
  report = Report(command="check", exit_code=1, unit="arrays", rows=[
      Row("m:output", "FAIL", 1.0, 0.5, "rtol=1e-05 atol=1e-05", details=["moved"])],
      headline=[f"`blocks.{i}.se.fc1.kernel`: new Param float32[8, 2] in the model's state"
                for i in range(20)], cause="the state's schema changed")
  page = html.render_html(report)
  assert page.index("exit code 1") < page.index("<h2>What changed first</h2>") < page.index(
      "<b>the state&#x27;s schema changed</b>") < page.index("`blocks.7.se.fc1.kernel`") < (
      page.index("12 more lines after the table.")) < page.index("<h2>Cases</h2>") < page.index(
      "<h2>What changed (continued)</h2>") < page.index("`blocks.8.se.fc1.kernel`")


def test_html_shows_the_users_tests_result_before_the_kits_cases():
  # Issue 36, item 13: rehearse --html held the kit's cases but not the user's pytest result.
  result = {"command": "pytest tests -k logits", "exit_status": 1, "meaning": "tests failed",
            "counts": {"failed": 1, "passed": 3, "skipped": 1},
            "failed": ["tests/test_model.py::test_logits[<bf16>]"]}
  report = Report(command="check", exit_code=0, pytest=result,
                  rows=[Row("max_k2_one", "PASS", 0.0, 0.0, "exact")])
  page = html.render_html(report)
  assert ('<h2>Your tests</h2>\n<p><code>pytest tests -k logits</code> exited <span '
          'class="FAIL">1 (tests failed)</span>: 1 failed, 3 passed, 1 skipped</p>\n'
          '<ul class="details">\n<li>tests/test_model.py::test_logits[&lt;bf16&gt;]</li>\n'
          "</ul>") in page
  assert page.index("<h2>Your tests</h2>") < page.index("<h2>Cases</h2>")
  stopped = dict(result, exit_status=2, meaning="interrupted", counts=None, failed=[])
  page = html.render_html(Report(command="check", error="check exited 2", pytest=stopped))
  assert ('exited <span class="FAIL">2 (interrupted)</span>: no counts (pytest stopped before '
          "the end)</p>") in page
