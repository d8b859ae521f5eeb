"""Reports: the table every command prints, and the same content as JSON.

A report lists one row per case (case, max abs error, max rel error,
tolerance, status), the failure details below the table, the environment
changes since the baseline (``jax 0.9.2 -> 0.10.2``), and timing changes
(compile time apart from steady-state time). Statuses:

* ``PASS``: within tolerance. ``FAIL``: a number moved, or an error case stopped
  raising. ``ERROR``: the case could not run.
* ``NEW``: the batch has a case the baseline lacks. ``GONE``: the baseline has a
  case the batch no longer produces. ``STALE``: the case's declaration changed
  since recording. All three mean the baseline must be re-recorded.
* ``RECORDED``: written by ``record``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nnx_pool.regression.compare import json_float

FAILING = ("FAIL", "ERROR", "NEW", "GONE", "STALE")
# A timing change is shown when it is this many times slower or faster ...
TIMING_RATIO = 2.0
# ... and larger than this many seconds (compile, steady), to mute noise.
TIMING_FLOOR = (0.1, 2e-5)
# At most this many per-case timing lines are printed (all are in the JSON).
TIMING_LINES = 10


@dataclasses.dataclass
class Row:
  """One case in a report.

  Attributes:
    case: the case name.
    status: one of PASS, FAIL, ERROR, NEW, GONE, STALE, RECORDED.
    max_abs: the largest absolute error over the case's arrays (None: not compared).
    max_rel: the largest relative error.
    tolerance: a label for the tolerance of the case's main output.
    details: one line per problem (array, what differs).
    arrays: per-array verdicts and tolerances, for JSON.
  """

  case: str
  status: str
  max_abs: float | None = None
  max_rel: float | None = None
  tolerance: str = ""
  details: list[str] = dataclasses.field(default_factory=list)
  arrays: dict[str, Any] = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict[str, Any]:
    """A JSON-safe dict."""
    data = dataclasses.asdict(self)
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
    """Which of ``compile``/``steady`` moved beyond the ratio and the noise floor."""
    out = []
    for what, before, now, floor in (
        ("compile", self.compile_before, self.compile_now, TIMING_FLOOR[0]),
        ("steady", self.steady_before, self.steady_now, TIMING_FLOOR[1]),
    ):
      if before and now and abs(now - before) > floor:
        ratio = now / before
        if ratio > TIMING_RATIO or ratio < 1 / TIMING_RATIO:
          out.append(what)
    return out


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
    recorded: when and at which git revision the baseline was recorded.
    timings: per-case timing, baseline and now.
    notes: extra lines (skipped builders, dry run, uncovered modules).
    stamp: the current environment stamp (``info`` and ``record``).
    dry_run: whether failures were reported without failing.
    unit: what a row is, for the summary line (``cases``; ``arrays`` in the fixture).
  """

  command: str
  exit_code: int = 0
  error: str | None = None
  baseline: str | None = None
  other: str | None = None
  rows: list[Row] = dataclasses.field(default_factory=list)
  stamp_changes: list[str] = dataclasses.field(default_factory=list)
  recorded: str | None = None
  timings: list[Timing] = dataclasses.field(default_factory=list)
  notes: list[str] = dataclasses.field(default_factory=list)
  stamp: dict[str, Any] | None = None
  dry_run: bool = False
  unit: str = "cases"

  def counts(self) -> dict[str, int]:
    """How many rows have each status."""
    counts: dict[str, int] = {}
    for row in self.rows:
      counts[row.status] = counts.get(row.status, 0) + 1
    return counts

  def to_json(self) -> dict[str, Any]:
    """The report as a JSON-safe dict."""
    return {
        "command": self.command,
        "exit_code": self.exit_code,
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
    }


def write_json(report: Report, path: str | Path) -> None:
  """Writes the JSON report to ``path`` (``-`` for stdout is not used: the table goes there)."""
  Path(path).write_text(json.dumps(report.to_json(), indent=1, allow_nan=False) + "\n")


def _num(value: float | None) -> str:
  if value is None:
    return "-"
  if value == 0:
    return "0"
  if math.isinf(value):
    return "inf"
  return f"{value:.3g}"


def table(rows: Sequence[Row]) -> list[str]:
  """The aligned table of rows."""
  header = ("case", "max abs err", "max rel err", "tolerance", "status")
  cells = [header] + [
      (r.case, _num(r.max_abs), _num(r.max_rel), r.tolerance, r.status) for r in rows
  ]
  widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
  return ["  ".join(c[i].ljust(widths[i]) for i in range(len(header))).rstrip() for c in cells]


def _seconds(value: float | None) -> str:
  if value is None:
    return "-"
  if value >= 1:
    return f"{value:.2f} s"
  if value >= 1e-3:
    return f"{value * 1e3:.1f} ms"
  return f"{value * 1e6:.0f} us"


def timing_lines(timings: Sequence[Timing]) -> list[str]:
  """Totals, then each case whose compile or steady time moved."""
  both = [t for t in timings if t.compile_before is not None and t.compile_now is not None]
  if not both:
    return []
  lines = []
  for what, before, now in (
      ("compile (lower+compile)", sum(t.compile_before for t in both),
       sum(t.compile_now for t in both)),
      ("steady median, summed", sum(t.steady_before or 0 for t in both),
       sum(t.steady_now or 0 for t in both)),
  ):
    ratio = f" (x{now / before:.2f})" if before else ""
    lines.append(f"  {what}: {_seconds(before)} -> {_seconds(now)}{ratio}")
  moved = []
  for t in both:
    for what in t.changed():
      before = t.compile_before if what == "compile" else t.steady_before
      now = t.compile_now if what == "compile" else t.steady_now
      moved.append((abs(math.log(now / before)), t.case, what, before, now))
  moved.sort(reverse=True)
  for _, case, what, before, now in moved[:TIMING_LINES]:
    lines.append(f"  {case}: {what} {_seconds(before)} -> {_seconds(now)} (x{now / before:.2f})")
  if len(moved) > TIMING_LINES:
    lines.append(f"  ... and {len(moved) - TIMING_LINES} more (see --json)")
  return lines


def render(report: Report) -> str:
  """The human-readable report."""
  if report.error:
    return f"error: {report.error}"
  lines: list[str] = []
  if report.rows:
    lines += table(report.rows)
    counts = report.counts()
    summary = ", ".join(f"{n} {status.lower()}" for status, n in sorted(counts.items()))
    lines.append(f"{len(report.rows)} {report.unit}: {summary}")
  details = [(r.case, d) for r in report.rows for d in r.details]
  if details:
    lines.append("")
    lines.append("details:")
    lines += [f"  {case}: {d}" for case, d in details]
  if report.command in ("check", "diff"):
    lines.append("")
    where = f" (baseline recorded {report.recorded})" if report.recorded else ""
    lines.append(f"environment changes{where}:")
    lines += [f"  {c}" for c in report.stamp_changes] or ["  (none)"]
    timing = timing_lines(report.timings)
    if timing:
      lines.append("")
      lines.append("timing (baseline -> now; reported, never failed):")
      lines += timing
  if report.notes:
    lines.append("")
    lines += [f"note: {n}" for n in report.notes]
  return "\n".join(lines)


def recorded_label(manifest: Mapping[str, Any]) -> str | None:
  """``2026-01-01T00:00:00+00:00 at git abc123`` from a manifest's stamp."""
  stamp = manifest.get("stamp") or {}
  date = stamp.get("date")
  git = (stamp.get("git") or {}).get("revision")
  if not date:
    return None
  return f"{date}" + (f" at git {git[:12]}" if git else "")
