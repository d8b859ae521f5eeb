"""Reports: the table every command prints, and the same content as JSON.

A report opens with one line per side naming its versions and device (this
run, the baseline), lists one row per case (case, max abs error, max rel
error, tolerance, status), the failure details below the table, the
environment changes since the baseline (``jax 0.9.2 -> 0.10.2``), and timing
(compile time apart from steady-state time). Timing is never a failure. By
default it takes at most three lines: the two totals, and the single case that
moved most if it moved past the noise threshold (:data:`NOISE`); ``--timing``
lists every case past it. Statuses:

* ``PASS``: within tolerance. ``FAIL``: a number moved, or an error case stopped
  raising. ``ERROR``: the case could not run.
* ``NEW``: the batch has a case the baseline lacks. ``GONE``: the baseline has a
  case the batch no longer produces. ``STALE``: the case's declaration changed
  since recording; the case still runs on the stored inputs, and its row carries
  how far the results moved as a FAIL's does (numbers, details, failed arrays), so
  the reader sees whether the change mattered. An array whose dtype or shape
  changed is named in the details without numbers. All three mean the baseline
  must be re-recorded.
* ``RECORDED``: written by ``record``.

The table lists rows in the batch's order, as the progress line ran them, so that the
tables of two runs compare line by line; the details below it name every row that did
not pass. The HTML page lists failures first (:data:`nnx_pool.regression.html.ORDER`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nnx_pool.regression import store
from nnx_pool.regression.compare import json_float
from nnx_pool.regression.stamp import stamp_header
from nnx_pool.regression.tolerance import Tolerance

FAILING = ("FAIL", "ERROR", "NEW", "GONE", "STALE")
# A case's timing has moved when it is this many times slower or faster than the
# baseline's. Measured run-to-run spread of the batch (4 back-to-back checks on
# 2 CPU cores, 6 pairs x 90 timed cases; docs/regression.md): compile at most
# x1.63 (median x1.12), steady state at most x8.2 (median x1.44: calls of
# 8-110 us). Each threshold clears its worst observed spread.
NOISE = {"compile": 2.0, "steady": 10.0}


@dataclasses.dataclass(eq=False)
class FailedArray:
  """A result array that failed its comparison, kept whole for the HTML report (never JSON).

  Attributes:
    baseline: the baseline's array.
    new: the array computed now (of a sharded run, the first copy that failed).
    tolerance: the tolerance it failed.
    spatial: which axes of the array are the spatial map (``(1, 2)`` for a
      batched 2-D output ``(N, H, W, C)``); empty when the array does not have
      the input's layout (a parameter gradient, a flattened output).
    copy: which copy of a sharded run ``new`` is, and how many there were;
      None for a run on one device.
  """

  baseline: np.ndarray
  new: np.ndarray
  tolerance: Tolerance
  spatial: tuple[int, ...] = ()
  copy: tuple[int, int] | None = None


@dataclasses.dataclass
class Row:
  """One case in a report.

  Attributes:
    case: the case name.
    status: one of PASS, FAIL, ERROR, NEW, GONE, STALE, RECORDED.
    max_abs: the largest absolute error over the case's arrays (None: not compared;
      a STALE row has them where its results still have the baseline's shape).
    max_rel: the largest relative error.
    tolerance: a label for the tolerance of the case's main output.
    details: one line per problem (array, what differs).
    arrays: per-array verdicts and tolerances, for JSON.
    failed: the arrays of ``check`` that failed, by key, for the HTML report;
      left out of JSON. Arrays whose dtype or shape changed are not kept.
  """

  case: str
  status: str
  max_abs: float | None = None
  max_rel: float | None = None
  tolerance: str = ""
  details: list[str] = dataclasses.field(default_factory=list)
  arrays: dict[str, Any] = dataclasses.field(default_factory=dict)
  failed: dict[str, FailedArray] = dataclasses.field(
      default_factory=dict, repr=False, compare=False)

  def to_json(self) -> dict[str, Any]:
    """A JSON-safe dict (without the arrays of :attr:`failed`)."""
    data = dataclasses.asdict(dataclasses.replace(self, failed={}))
    del data["failed"]
    data["max_abs"] = json_float(self.max_abs)
    data["max_rel"] = json_float(self.max_rel)
    return data


@dataclasses.dataclass
class Timing:
  """Compile and steady-state seconds of one case, in the baseline and now."""

  case: str
  compile_before: float | None
  compile_now: float | None
  steady_before: float | None
  steady_now: float | None

  def changed(self) -> list[str]:
    """Which of ``compile``/``steady`` moved past the noise threshold (:data:`NOISE`)."""
    return [what for what, ratio in self.ratios().items()
            if max(ratio, 1 / ratio) >= NOISE[what]]

  def ratios(self) -> dict[str, float]:
    """now / baseline for ``compile`` and ``steady``, where both are known."""
    pairs = {"compile": (self.compile_before, self.compile_now),
             "steady": (self.steady_before, self.steady_now)}
    return {what: now / before for what, (before, now) in pairs.items() if before and now}


@dataclasses.dataclass
class Report:
  """Everything a command found; rendered as text and as JSON.

  Attributes:
    command: ``check``, ``record``, ``diff`` or ``info``.
    exit_code: 0 pass, 1 numeric failure or out-of-date baseline, 2 unusable baseline.
    error: the one-line reason for exit code 2.
    baseline: the baseline compared against (or written).
    other: the second baseline of ``diff``.
    rows: one per case.
    stamp_changes: environment differences, one line each.
    baseline_stamp: the stamp of the baseline (``check``) or of the first
      baseline (``diff``).
    recorded: when and at which git revision the baseline was recorded.
    timings: per-case timing, baseline and now.
    notes: extra lines (skipped builders, dry run, uncovered modules).
    stamp: the current environment stamp (``check``, ``info`` and ``record``), or
      the second baseline's (``diff``).
    dry_run: whether failures were reported without failing.
    unit: what a row is, for the summary line (``cases``; ``arrays`` in the fixture).
    headline: what changed about a user's model before any number, one line each (its
      state's schema, its modes, its weights, its inputs, the first submodule whose output
      moved), printed before the table.
  """

  command: str
  exit_code: int = 0
  error: str | None = None
  baseline: str | None = None
  other: str | None = None
  rows: list[Row] = dataclasses.field(default_factory=list)
  stamp_changes: list[str] = dataclasses.field(default_factory=list)
  baseline_stamp: dict[str, Any] | None = None
  recorded: str | None = None
  timings: list[Timing] = dataclasses.field(default_factory=list)
  notes: list[str] = dataclasses.field(default_factory=list)
  stamp: dict[str, Any] | None = None
  dry_run: bool = False
  unit: str = "cases"
  headline: list[str] = dataclasses.field(default_factory=list)

  def counts(self) -> dict[str, int]:
    """How many rows have each status."""
    counts: dict[str, int] = {}
    for row in self.rows:
      counts[row.status] = counts.get(row.status, 0) + 1
    return counts

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Report:
    """The report that :meth:`to_json` wrote (rows without :attr:`Row.failed`, which JSON lacks).

    Raises:
      KeyError, TypeError, ValueError: ``data`` is not such a report.
    """
    rows = [Row(**{**r, "max_abs": _float(r["max_abs"]), "max_rel": _float(r["max_rel"])})
            for r in data["rows"]]
    timings = [Timing(**{k: v for k, v in t.items() if k != "changed"}) for t in data["timings"]]
    fields = {f.name for f in dataclasses.fields(cls)} - {"rows", "timings"}
    return cls(**{k: v for k, v in data.items() if k in fields}, rows=rows, timings=timings)

  def to_json(self) -> dict[str, Any]:
    """The report as a JSON-safe dict."""
    return {
        "command": self.command,
        "exit_code": self.exit_code,
        "headline": self.headline,
        "error": self.error,
        "baseline": self.baseline,
        "other": self.other,
        "dry_run": self.dry_run,
        "counts": self.counts(),
        "rows": [r.to_json() for r in self.rows],
        "stamp_changes": self.stamp_changes,
        "recorded": self.recorded,
        "timings": [
            {**dataclasses.asdict(t), "changed": t.changed()} for t in self.timings
        ],
        "notes": self.notes,
        "stamp": self.stamp,
        "baseline_stamp": self.baseline_stamp,
    }


def _float(value: float | str | None) -> float | None:
  """The inverse of :func:`~nnx_pool.regression.compare.json_float` (``"inf"`` -> inf)."""
  return None if value is None else float(value)


def write_json(report: Report, path: str | Path) -> None:
  """Writes the JSON report to ``path``, whole or not at all (``-`` is not stdout: the table
  goes there)."""
  text = json.dumps(report.to_json(), indent=1, allow_nan=False) + "\n"
  store.write_atomic(path, text.encode())


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
  """The compile and steady totals, then the cases that moved past :data:`NOISE`.

  Args:
    timings: per-case timing.
    every: list every case that moved (``--timing``); by default only the one
      that moved most, so the section is at most three lines.
  """
  both = [t for t in timings if t.compile_before is not None and t.compile_now is not None]
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
  moved = sorted(
      ((abs(math.log(t.ratios()[what])), t, what) for t in both for what in t.changed()),
      key=lambda item: item[0], reverse=True)
  shown = moved if every else moved[:1]
  for _, t, what in shown:
    before, now = (t.compile_before, t.compile_now) if what == "compile" else (
        t.steady_before, t.steady_now)
    prefix = "" if every else "largest mover: "
    more = "" if every or len(moved) == 1 else f"; {len(moved) - 1} more with --timing"
    # what is in t.changed(), so its before and now are both known (Timing.ratios).
    lines.append(f"  {prefix}{t.case}: {what} {_seconds(before)} -> {_seconds(now)} "
                 f"(x{now / before:.2f}){more}")  # pyright: ignore[reportOperatorIssue]
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
    timing: list every case whose timing moved (default: totals and the largest mover).
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
  if report.headline:
    lines += report.headline
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


def recorded_label(manifest: Mapping[str, Any]) -> str | None:
  """``2026-01-01T00:00:00+00:00 at git abc123`` from a manifest's stamp."""
  stamp = manifest.get("stamp") or {}
  date = stamp.get("date")
  git = (stamp.get("git") or {}).get("revision")
  if not date:
    return None
  return f"{date}" + (f" at git {git[:12]}" if git else "")
