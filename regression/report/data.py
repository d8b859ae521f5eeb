"""What a report holds: one row per case, timings, both stamps; and the same content as JSON.

Statuses:

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

Timing (compile time apart from steady-state time) is never a failure; a case's timing
moved when it is past the noise threshold (:data:`NOISE`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..compare import json_float
from ..compare.tolerance import Tolerance
from ..store import write_atomic

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
    attribution: of a failing batch case whose baseline keeps its program, whether the
      program or the compiler moved it (as :attr:`Report.attribution`); its line is among
      ``details`` too.
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
  attribution: dict[str, Any] | None = None

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
    pytest: what the user's tests found where ``rehearse --pytest`` ran them: ``command``,
      ``exit_status``, ``meaning``, ``counts`` (tests by outcome; None where pytest stopped
      before the end) and ``failed`` (the ids that failed or errored); None otherwise.
    cause: of a failing fixture check, what the kit knows made it fail, in a few words (the
      initialisation, the schema, a mode, a configuration change), for the failure's first
      line; None when it does not know.
    attribution: of a failing fixture check whose baseline keeps its program, whether the
      program or the compiler moved it (:mod:`~nnx_pool.regression.fixture.attribution`):
      ``{"kind": "program" | "compiler" | "both" | "none", "line", "diff" (the first
      differing StableHLO lines), "seconds"}``, printed after the headline; None otherwise.
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
  pytest: dict[str, Any] | None = None
  cause: str | None = None
  attribution: dict[str, Any] | None = None

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
        "cause": self.cause,
        "attribution": self.attribution,
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
        "pytest": self.pytest,
    }


def attribution_lines(report: Report) -> list[str]:
  """The attribution's line and its StableHLO lines, indented, as a report prints them."""
  return _said_lines(report.attribution)


def _said_lines(said: dict[str, Any] | None, before: str = "") -> list[str]:
  return [before + said["line"], *(f"    {line}" for line in said.get("diff") or ())] if (
      said) else []


def moved_lines(report: Report, who: str) -> list[str]:
  """The attribution of the first failing row that has one, as its own line and its
  StableHLO lines (``bisect: why max_k2_one moved: the program changed, ...``); none where the
  report shows it above its table already (:attr:`Report.attribution`) or no row has one."""
  if report.attribution:
    return []
  for row in report.rows:
    if row.status in FAILING and row.attribution:
      return _said_lines(row.attribution, f"{who}: why {row.case} moved: ")
  return []


def _float(value: float | str | None) -> float | None:
  """The inverse of :func:`~nnx_pool.regression.compare.json_float` (``"inf"`` -> inf)."""
  return None if value is None else float(value)


def write_json(report: Report, path: str | Path) -> None:
  """Writes the JSON report to ``path``, whole or not at all (``-`` is not stdout: the table
  goes there)."""
  text = json.dumps(report.to_json(), indent=1, allow_nan=False) + "\n"
  write_atomic(path, text.encode())


def recorded_label(manifest: Mapping[str, Any]) -> str | None:
  """``2026-01-01T00:00:00+00:00 at git abc123`` from a manifest's stamp."""
  stamp = manifest.get("stamp") or {}
  date = stamp.get("date")
  git = (stamp.get("git") or {}).get("revision")
  if not date:
    return None
  return f"{date}" + (f" at git {git[:12]}" if git else "")
