"""The table every command prints.

A report opens with one line per side naming its versions and device (this
run, the baseline), lists one row per case (case, max abs error, max rel
error, tolerance, status), the failure details below the table, the
environment changes since the baseline (``jax 0.9.2 -> 0.10.2``), and timing
(compile time apart from steady-state time). Timing is never a failure, and times are
the machine's as much as the code's: by default one line counts the cases that moved past
the noise threshold (:data:`~.data.NOISE`), and ``--timing`` lists them with the totals.

The table lists rows in the batch's order, as the progress line ran them, so that the
tables of two runs compare line by line; the details below it name every row that did
not pass. The HTML page lists failures first (:data:`nnx_pool.regression.report.html.ORDER`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from ..stamp import stamp_header
from .data import FAILING, NOISE, Report, Row, Timing, _float, attribution_lines


def _num(value: float | None) -> str:
  if value is None:
    return "-"
  if value == 0:
    return "0"
  if math.isinf(value):
    return "inf"
  return f"{value:.3g}"


COLUMNS = ("case", "max abs err", "max rel err", "tolerance", "status")


def table(rows: Sequence[Row]) -> list[tuple[str, ...]]:
  """The table's cells: the header (:data:`COLUMNS`), then one tuple of texts per row."""
  return [COLUMNS] + [
      (r.case, _num(r.max_abs), _num(r.max_rel), r.tolerance, r.status) for r in rows
  ]


def aligned(cells: Sequence[Sequence[str]],
            markup: Callable[[int, int, str], str] | None = None) -> list[str]:
  """One line per row of ``cells``, each column as wide as its widest text, two spaces apart.

  Args:
    cells: rows of texts (:func:`table`).
    markup: ``markup(row, column, text)`` writes a cell (the HTML page escapes it and links
      it); the column is padded after it by the width of the text itself.
  """
  widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
  write = markup or (lambda row, column, text: text)
  return ["  ".join(write(r, i, text) + " " * (widths[i] - len(text))
                    for i, text in enumerate(row)).rstrip() for r, row in enumerate(cells)]


def _seconds(value: float | None) -> str:
  if value is None:
    return "-"
  if value >= 1:
    return f"{value:.2f} s"
  if value >= 1e-3:
    return f"{value * 1e3:.1f} ms"
  return f"{value * 1e6:.0f} us"


def timing_lines(timings: Sequence[Timing], *, every: bool = False) -> list[str]:
  """With ``every`` (``--timing``), the compile and steady totals, then every case that moved
  past :data:`~.data.NOISE`; by default, one line counting those cases, or none.

  Compile and steady times are the machine's as much as the code's: against a baseline
  recorded on another machine (the shipped one, a colleague's, CI's), or on a busy one, cases
  compile several times slower for that alone, so no time is shown unless asked for.

  Args:
    timings: per-case timing.
    every: list the totals and every case that moved (``--timing``).
  """
  both = [t for t in timings if t.compile_before is not None and t.compile_now is not None]
  moved = sorted(
      ((abs(math.log(t.ratios()[what])), t, what) for t in both for what in t.changed()),
      key=lambda item: item[0], reverse=True)
  if not every:
    cases = len({t.case for _, t, _ in moved})
    return [f"  {cases} case{'s' * (cases != 1)} timed past the noise (compile "
            f"x{NOISE['compile']:g}, steady x{NOISE['steady']:g}); --timing lists them and the "
            "totals (times from another machine differ for that alone)"] if moved else []
  if not both:
    return []
  lines = []
  # `both` holds the timings whose compile times are not None (pyright does not narrow them).
  for what, before, now in (
      ("compile (lower+compile)", sum(t.compile_before for t in both),  # pyright: ignore[reportCallIssue, reportArgumentType]
       sum(t.compile_now for t in both)),  # pyright: ignore[reportCallIssue, reportArgumentType]
      ("steady median, summed", sum(t.steady_before or 0 for t in both),
       sum(t.steady_now or 0 for t in both)),
  ):
    ratio = f" (x{now / before:.2f})" if before else ""
    lines.append(f"  {what}: {_seconds(before)} -> {_seconds(now)}{ratio}")
  for _, t, what in moved:
    before, now = (t.compile_before, t.compile_now) if what == "compile" else (
        t.steady_before, t.steady_now)
    # what is in t.changed(), so its before and now are both known (Timing.ratios).
    lines.append(f"  {t.case}: {what} {_seconds(before)} -> {_seconds(now)} "
                 f"(x{now / before:.2f})")  # pyright: ignore[reportOperatorIssue]
  return lines


def excess(row: Row) -> float:
  """How many times its tolerance the worst element of a row is off (inf: exact rule, moved
  NaN, changed shape); 0 for a row without numbers."""
  values = [_float(v.get("excess")) for v in row.arrays.values() if isinstance(v, Mapping)]
  values = [v for v in values if v is not None]
  if not values:
    return math.inf if row.status in FAILING else 0.0
  return max(values)


def shown_rows(rows: Sequence[Row], limit: int | None) -> tuple[list[Row], str | None]:
  """The rows a text report lists, and the line that says what it left out.

  With more than ``limit`` rows, only the failing ones are listed, the ``limit`` worst
  (:func:`excess`, the largest error breaking ties), in their order; the rest are counted.
  """
  if limit is None or len(rows) <= limit:
    return list(rows), None
  failing = [r for r in rows if r.status in FAILING]
  worst = sorted(failing, key=lambda r: (excess(r), r.max_abs or 0.0), reverse=True)[:limit]
  keep = {id(r) for r in worst}
  shown = [r for r in rows if id(r) in keep]
  more = len(failing) - len(shown)
  passing = len(rows) - len(failing)
  parts = ([f"and {more} more failing"] if more else []) + (
      [f"{passing} passing"] if passing else [])
  return shown, (f"({', '.join(parts)} not listed: the {len(shown)} worst failing "
                 f"{'row is' if len(shown) == 1 else 'rows are'} shown; every row is in the "
                 "JSON and HTML reports)")


def render(report: Report, *, timing: bool = False, json_path: str | None = None,
           limit: int | None = None) -> str:
  """The human-readable report.

  Args:
    report: the report.
    timing: list the timing totals and every case whose timing moved (default: one line
      counting those cases).
    json_path: where the JSON report is written, if it is (named in the last line).
    limit: with more rows than this, list only the ``limit`` worst failing rows
      (:func:`shown_rows`); None lists every row.
  """
  if report.error:
    return f"error: {report.error}"
  lines: list[str] = []
  if report.command in ("check", "diff") and (report.stamp or report.baseline_stamp):
    sides = [("this run", report.stamp), ("baseline", report.baseline_stamp)]
    if report.command == "diff":
      sides = [("A", report.baseline_stamp), ("B", report.stamp)]
    lines += [f"{side + ':':<10}{stamp_header(stamp or {})}" for side, stamp in sides]
    lines.append("")
  if report.headline or report.attribution:
    lines += report.headline + attribution_lines(report)
    lines.append("")
  rows, left_out = shown_rows(report.rows, limit)
  if report.rows:
    lines += aligned(table(rows)) if rows else []
    counts = report.counts()
    summary = ", ".join(f"{n} {status.lower()}" for status, n in sorted(counts.items()))
    lines.append(f"{len(report.rows)} {report.unit}: {summary}")
    if left_out:
      lines.append(left_out)
  details = [(r.case, d) for r in rows for d in r.details]
  if details:
    lines.append("")
    lines.append("details:")
    lines += [f"  {case}: {d}" for case, d in details]
  if report.command in ("check", "diff"):
    lines.append("")
    where = f" (baseline recorded {report.recorded})" if report.recorded else ""
    lines.append(f"environment changes{where}:")
    lines += [f"  {c}" for c in report.stamp_changes] or ["  (none)"]
    timed = timing_lines(report.timings, every=timing)
    if timed:
      lines.append("")
      lines.append("timing (baseline -> now; reported, never failed):")
      lines += timed
  if report.notes:
    lines.append("")
    lines += [f"note: {n}" for n in report.notes]
  if json_path:
    lines.append(f"(the full report, per-array verdicts and every timing, is in {json_path})")
  return "\n".join(lines)
