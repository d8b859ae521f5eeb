"""Tests for STALE rows: a case whose declaration changed still shows how far its results moved.

A baseline of small stand-in cases (plain JAX functions and one ``nnx.Linear``) is
recorded once; the same names are then declared anew (another ``config``, and for
one case another dtype, for another an error case) and checked against it. Expected
numbers come from NumPy on the stored input and the stored results.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_pool.regression import commands, store
from nnx_pool.regression.batch import Case, ErrorSpec
from nnx_pool.regression.report import Report, html, render

FAST = 3  # timed steady-state calls per case
RTOL = ATOL = 1e-6  # the "window" tolerance of a float32 output (tolerance.py's table)


def _refuse(x):
  raise ValueError(f"refused shape {x.shape}")


BEFORE = [
    Case("scaled", lambda: (lambda x: x * 3), input="one", module="fn", config="x * 3"),
    Case("same", lambda: (lambda x: x * 2), input="one", module="fn", config="x * 2"),
    Case("cropped", lambda: (lambda x: x * 2), input="one", module="fn", config="x * 2"),
    Case("retyped", lambda: (lambda x: x * 2), input="one", module="fn", config="x * 2"),
    Case("linear", lambda: nnx.Linear(2, 3, rngs=nnx.Rngs(0)), input="one", tolerance="gate",
         params=True, module="Linear", config="Linear(2, 3)"),
    Case("refused", lambda: _refuse, input="bad_rank", module="fn", config="refuse",
         raises=ErrorSpec("ValueError", "refused")),
]
AFTER = [
    # Moves every output above 0.5 by 1e-3, far past rtol=atol=1e-6; the gradient is unchanged.
    Case("scaled", lambda: (lambda x: x * 3 + jnp.float32(1e-3) * (x > 0.5)), input="one",
         module="fn", config="x * 3 + 1e-3 * (x > 0.5)"),
    Case("same", lambda: (lambda x: x + x), input="one", module="fn", config="x + x"),
    # The output loses half its rows; the stored cotangent no longer fits it.
    Case("cropped", lambda: (lambda x: x[:, :3] * 2), input="one", module="fn",
         config="x[:, :3] * 2"),
    Case("retyped", lambda: (lambda x: x * 2), input="one", dtype="bfloat16", module="fn",
         config="x * 2"),
    Case("linear", lambda: nnx.Linear(2, 4, rngs=nnx.Rngs(0)), input="one", tolerance="gate",
         params=True, module="Linear", config="Linear(2, 4)"),
    Case("refused", lambda: _refuse, input="bad_rank", module="fn", config="refuse, reworded",
         raises=ErrorSpec("ValueError", "refused")),
]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
  out = tmp_path_factory.mktemp("stale") / "before"
  assert commands.record(BEFORE, out, reps=FAST).exit_code == 0
  return out


@pytest.fixture(scope="module")
def checked(recorded):
  report = commands.check(AFTER, recorded, reps=FAST)
  return report, {row.case: row for row in report.rows}, store.read_baseline(recorded).arrays


def _bump_numbers(arrays):
  """max abs, max rel and count over rtol=atol=1e-6 of "scaled": NumPy on the stored arrays."""
  x = arrays["scaled/input"]
  old = arrays["scaled/output"].astype(np.float64)
  new = (x * np.float32(3) + np.float32(1e-3) * (x > 0.5)).astype(np.float32).astype(np.float64)
  diff = np.abs(new - old)
  over = int((diff > ATOL + RTOL * np.abs(old)).sum())
  return float(diff.max()), float((diff[diff > 0] / np.abs(old[diff > 0])).max()), over


def test_stale_row_shows_how_far_the_results_moved(checked):
  report, rows, arrays = checked
  row = rows["scaled"]
  assert row.status == "STALE" and report.exit_code == 1
  max_abs, max_rel, over = _bump_numbers(arrays)
  # The grid is (rank - 36) / 8 over ranks 0..71 (inputs.distinct_grid): ranks 41..71 are > 0.5.
  assert over == int((arrays["scaled/input"] > 0.5).sum()) == 31
  assert row.max_abs == pytest.approx(max_abs, rel=1e-12)
  assert row.max_rel == pytest.approx(max_rel, rel=1e-12)
  assert row.tolerance == "rtol=1e-06 atol=1e-06"
  assert row.details[0] == ("declaration changed: config 'x * 3' -> "
                            "'x * 3 + 1e-3 * (x > 0.5)'; re-record it")
  assert row.details[1].startswith(f"output: {over} of 72 elements differ (first at ")
  assert row.details[1].endswith("[rtol=1e-06 atol=1e-06]")
  assert row.arrays["output"]["mismatches"] == row.arrays["output_eager"]["mismatches"] == over
  # The gradient does not see the bump (its derivative is 0): compared, and within tolerance.
  assert row.arrays["grad/input"]["passed"] is True and row.arrays["grad/input"]["max_abs"] == 0
  assert not [d for d in row.details if d.startswith("grad/")]
  assert sorted(row.failed) == ["output", "output_eager"]  # the HTML page draws them


def test_stale_row_says_when_the_change_moved_nothing(checked):
  row = checked[1]["same"]
  assert (row.status, row.max_abs, row.max_rel) == ("STALE", 0.0, 0.0)
  assert row.details == [
      "declaration changed: config 'x * 2' -> 'x + x'; re-record it",
      "run on the stored inputs, every result is within its tolerance of the baseline's"]


def test_stale_row_names_a_changed_shape_without_numbers_for_it(checked):
  row, arrays = checked[1]["cropped"], checked[2]
  assert row.status == "STALE"
  assert "output: shape (1, 3, 6, 2) != baseline (1, 6, 6, 2); no numbers for it" in row.details
  assert "output_eager: shape (1, 3, 6, 2) != baseline (1, 6, 6, 2); no numbers for it" in (
      row.details)
  assert "output" not in row.arrays and "output" not in row.failed
  # The gradient keeps the input's shape, so it is compared: 2 * cotangent on the first three
  # rows now (a fresh cotangent of the new output's shape, 1..5 as make_cotangent documents),
  # 0 on the others, against 2 * the stored cotangent everywhere.
  ct = ((np.arange(36) * 7) % 5 + 1).reshape(1, 3, 6, 2)
  now = np.zeros((1, 6, 6, 2))
  now[:, :3] = 2 * ct
  before = arrays["cropped/grad/input"].astype(np.float64)
  assert np.array_equal(before, 2 * arrays["cropped/cotangent"])
  assert row.max_abs == np.abs(now - before).max() == 10.0
  assert row.arrays["grad/input"]["mismatches"] == int((now != before).sum())


@pytest.mark.parametrize(("name", "detail"), [
    ("retyped", "no numbers: the baseline's results are of input 'one' float32, the case now "
                "takes 'one' bfloat16"),
    ("refused", "no numbers: an error case has no results to compare"),
])
def test_stale_row_without_corresponding_results_says_why(checked, name, detail):
  row = checked[1][name]
  assert (row.status, row.max_abs, row.max_rel, row.details[-1]) == ("STALE", None, None, detail)


def test_stale_row_of_a_case_that_no_longer_runs_on_the_stored_weights(checked):
  row = checked[1]["linear"]
  assert (row.status, row.max_abs) == ("STALE", None)
  assert row.details[-1].startswith(
      "no numbers: the case does not run on the stored inputs (ValueError: stored weight ")


def test_stale_numbers_reach_the_table_the_json_and_the_page(checked):
  report, rows, arrays = checked
  max_abs, max_rel, over = _bump_numbers(arrays)
  (line,) = [line for line in render(report).splitlines() if line.startswith("scaled ")]
  assert line.split() == ["scaled", f"{max_abs:.3g}", f"{max_rel:.3g}", "rtol=1e-06",
                          "atol=1e-06", "STALE"]
  data = json.loads(json.dumps(report.to_json(), allow_nan=False))
  (scaled,) = [r for r in data["rows"] if r["case"] == "scaled"]
  assert scaled["max_abs"] == pytest.approx(max_abs, rel=1e-12)
  assert scaled["arrays"]["output"]["mismatches"] == over
  back = Report.from_json(data)
  assert back == report and render(back) == render(report)
  page = html.render_html(report)
  start = page.index('<section id="case-scaled">')
  section = page[start:page.index("</section>", start)]
  assert '<span class="STALE">STALE</span>' in section
  assert "declaration changed: config" in section
  assert section.count("<img") == 2  # output and output_eager, the two arrays that moved


@pytest.fixture(scope="module")
def after(tmp_path_factory):
  # B without "linear", which the diff below does not read (its STALE row without numbers is
  # check's, above): recording it ran the layer jit, eager and its parameter gradients again.
  out = tmp_path_factory.mktemp("stale") / "after"
  assert commands.record([c for c in AFTER if c.name != "linear"], out,
                         reps=FAST).exit_code == 0
  return out


def test_diff_stale_row_shows_how_far_b_is_from_a(recorded, after):
  report = commands.diff(recorded, after)
  rows = {row.case: row for row in report.rows}
  arrays = store.read_baseline(recorded).arrays
  max_abs, max_rel, over = _bump_numbers(arrays)
  scaled = rows["scaled"]
  assert scaled.status == "STALE" and report.exit_code == 1
  assert scaled.max_abs == pytest.approx(max_abs, rel=1e-12)
  assert scaled.max_rel == pytest.approx(max_rel, rel=1e-12)
  assert scaled.arrays["output"]["mismatches"] == over
  assert rows["same"].details[-1] == "every result of B is within its tolerance of A's"
  assert "output: shape (1, 3, 6, 2) != baseline (1, 6, 6, 2); no numbers for it" in (
      rows["cropped"].details)
  # B's cotangent follows its output's shape; the gradients are compared (see the check above).
  assert rows["cropped"].max_abs == 10.0 and "grad/input" in rows["cropped"].arrays
  assert rows["retyped"].details[-1] == "no numbers: inputs differ (cotangent, input)"
  assert rows["refused"].details[-1] == "no numbers: an error case has no results to compare"


def test_an_output_that_changed_shape_fails_naming_the_shape_not_inside_the_gradient(recorded):
  # The declaration is unchanged, the module is not: the stored cotangent no longer fits the
  # output, and the check says what moved instead of an ERROR from jax.vjp.
  cropped = Case("cropped", lambda: (lambda x: x[:, :3] * 2), input="one", module="fn",
                 config="x * 2")
  (row,) = commands.check([cropped], recorded, pattern="cropped", reps=FAST).rows
  assert row.status == "FAIL"
  assert "output: shape (1, 3, 6, 2) != baseline (1, 6, 6, 2) [rtol=1e-06 atol=1e-06]" in (
      row.details)
  assert row.max_abs == float("inf")
