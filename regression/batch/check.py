"""``check``: runs the batch (after JIT warmup) and compares it with a batch baseline.

A case runs on the inputs its baseline stores; every result is compared under the tolerance
the case gives it now. A case whose declaration changed is STALE, and still runs, so that
its row says how far its results moved; a case only one side has is NEW or GONE.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..compare import compare_arrays
from ..constants import BATCH_AXIS
from ..report import FAILING, FailedArray, Report, Row, Timing, recorded_label
from ..runner import Execution, compare_results, role_of, split_copies
from ..stamp import collect_stamp, stamp_changes
from ..store import BaselineError
from .baseline import (
  Progress,
  add_verdict,
  case_arrays,
  case_label,
  declaration_changes,
  is_input,
  load,
  same_layout,
)
from .declare import Case, matches, select, selects_none
from .programs import attribute, lines
from .runner import UNBATCHED_INPUTS, make_mesh, run_case


def check(
    cases: Sequence[Case],
    baseline: str | os.PathLike,
    *,
    pattern: str | None = None,
    dry_run: bool = False,
    notes: Sequence[str] = (),
    reps: int = 20,
    devices: int | None = None,
    axis_types: str = "explicit",
    progress: Progress | None = None,
) -> Report:
  """Runs the batch (after JIT warmup) and compares it with a baseline.

  Args:
    cases: the batch.
    baseline: the baseline directory.
    pattern: run only cases whose name contains it or matches it as a glob.
    dry_run: report drift but exit 0.
    notes: lines to carry into the report.
    reps: the most timed steady-state calls per case.
    devices: run sharded over this many devices (a mesh axis ``batch``): each
      stored batch is repeated once per device and every copy is compared
      with the baseline (see :mod:`nnx_pool.regression.batch.runner`). None: one device.
    axis_types: the mesh's axis type when ``devices`` is given,
      ``"explicit"`` (default) or ``"auto"``.
    progress: called as ``progress(n, total, name)`` before each selected case runs.

  Returns:
    The report; exit code 2 for an unusable baseline, too few devices or a ``pattern`` that
    selects no case (of the batch or the baseline), 1 for any failing row (0 with
    ``dry_run``), else 0.
  """
  report = Report(command="check", baseline=str(baseline), dry_run=dry_run, notes=list(notes))
  try:
    base = load(baseline)
  except BaselineError as e:
    report.exit_code, report.error = 2, str(e)
    return report
  mesh = None
  if devices is not None:
    try:
      mesh = make_mesh(devices, axis_types)
    except ValueError as e:
      report.exit_code, report.error = 2, str(e)
      return report
  manifest = base.manifest
  names = {c.name for c in cases}
  report.recorded = recorded_label(manifest)
  report.stamp = collect_stamp()
  report.baseline_stamp = manifest["stamp"]
  report.stamp_changes = stamp_changes(manifest["stamp"], report.stamp)
  entries = manifest["cases"]
  unselected = selects_none(pattern, [*(c.name for c in cases),
                                      *(name for name in entries if name not in names)])
  if unselected:  # a typo would otherwise pass, having compared nothing
    report.exit_code, report.error = 2, f"check: {unselected}"
    return report
  selected = select(cases, pattern)
  placements: dict[str, int] = {}
  for n, case in enumerate(selected, 1):
    if progress is not None:
      progress(n, len(selected), case.name)
    entry = entries.get(case.name)
    if entry is None:
      report.rows.append(Row(case.name, "NEW", details=["not in the baseline; re-record it"]))
      continue
    stored = case_arrays(base, case.name)
    changed = declaration_changes(entry["declaration"], case.describe())
    if changed:
      row, run = _stale_row(case, entry, changed, stored, reps=reps, mesh=mesh)
      report.rows.append(row)
      if run is not None:
        placements[run.placement] = placements.get(run.placement, 0) + 1
      continue
    run = run_case(case, {k: v for k, v in stored.items() if is_input(k)}, reps=reps, mesh=mesh)
    row = _compare_run(case, entry, run, stored)
    said = attribute(entry, stored, run, row, (manifest["stamp"], report.stamp)
                     ) if row.status == "FAIL" else None
    if said is not None:
      row.details += lines(said)
      row.attribution = said
    placements[run.placement] = placements.get(run.placement, 0) + 1
    report.rows.append(row)
    timing = entry["timing"]
    report.timings.append(Timing(
        case.name, timing.get("compile_s"), run.compile_s, timing.get("steady_s"), run.steady_s))
  for name in entries:
    if name not in names and matches(name, pattern):
      report.rows.append(Row(name, "GONE", details=["in the baseline but no longer in the batch"]))
  if mesh is not None:
    report.notes.append(
        f"sharded run: mesh axis {BATCH_AXIS!r} over {devices} {_platform(mesh)} devices "
        f"({axis_types} axes); every copy of a repeated batch is compared with the baseline")
    report.notes.extend(f"  {count} case(s): {placement}" for placement, count in sorted(
        placements.items(), key=lambda item: (item[0].startswith("replicated"), -item[1])))
  failed = [r for r in report.rows if r.status in FAILING]
  failing = bool(failed)
  if len(failed) == 1 and failed[0].attribution:
    # The report shows a lone failure's attribution above its table, so not in its details too.
    report.attribution = failed[0].attribution
    shown = lines(report.attribution)
    failed[0].details = [d for d in failed[0].details if d not in shown]
  if failing and dry_run:
    report.notes.append("dry run: the drift above is reported, exit code 0")
  report.exit_code = 1 if failing and not dry_run else 0
  return report


def _platform(mesh: Any) -> str:
  return str(mesh.devices.flat[0].platform)


def _compare_run(
    case: Case, entry: Mapping[str, Any], run: Any, stored: Mapping[str, np.ndarray]
) -> Row:
  if case.raises is not None:
    label = f"raises {case.raises.type}"
    if run.error:
      return Row(case.name, "FAIL", tolerance=label, details=[run.error])
    return Row(case.name, "PASS", tolerance=label)
  if run.error:
    return Row(case.name, "ERROR", details=[run.error])
  row = Row(case.name, "PASS", 0.0, 0.0, case_label(case, run.tolerances))
  if _compare_into(row, case, entry, run, stored):
    row.status = "FAIL"
  return row


def _stale_row(
    case: Case, entry: Mapping[str, Any], changed: list[str], stored: Mapping[str, np.ndarray],
    *, reps: int, mesh: Any,
) -> tuple[Row, Execution | None]:
  """A STALE row: what changed in the declaration, then how far the results moved.

  The case runs on the stored inputs and its results are compared with the stored
  ones as a FAIL's are, under the case's tolerance now, so the row shows whether the
  change mattered before anyone re-records; the status stays STALE. An array whose
  dtype or shape changed is named, without numbers; where the output's shape changed,
  the gradient is taken for a fresh cotangent of its new shape, as re-recording would.
  Nothing runs where no result can correspond: an error case on either side, or
  another input or dtype declared.

  Returns:
    ``(row, the run or None)``.
  """
  row = Row(case.name, "STALE", details=list(changed))
  before = entry["declaration"]
  if case.raises is not None or before.get("raises"):
    row.details.append("no numbers: an error case has no results to compare")
    return row, None
  if (before.get("input"), before.get("dtype")) != (case.input, case.dtype):
    row.details.append(
        f"no numbers: the baseline's results are of input {before.get('input')!r} "
        f"{before.get('dtype')}, the case now takes {case.input!r} {case.dtype}")
    return row, None
  run = run_case(case, {k: v for k, v in stored.items() if is_input(k)}, reps=reps, mesh=mesh)
  if run.error:
    row.details.append(f"no numbers: the case does not run on the stored inputs ({run.error})")
    return row, run
  row.tolerance = case_label(case, run.tolerances)
  if not _compare_into(row, case, entry, run, stored, stale=True):
    row.details.append(
        "run on the stored inputs, every result is within its tolerance of the baseline's")
  return row, run


def _compare_into(
    row: Row, case: Case, entry: Mapping[str, Any], run: Any, stored: Mapping[str, np.ndarray],
    *, stale: bool = False,
) -> bool:
  """Compares every result of ``run`` with the baseline's, into ``row``'s numbers and details.

  Args:
    stale: the row is STALE: an array whose dtype or shape changed adds a detail but no
      numbers (for a FAIL it counts as an infinite error).

  Returns:
    Whether anything differs (a detail was added).
  """
  found = len(row.details)
  for key, verdict in compare_results(run, stored, entry["results"]).items():
    if isinstance(verdict, str):
      row.details.append(f"{key}: {verdict}")
      continue
    tol = run.tolerances[key]
    if stale and not same_layout(split_copies(key, run.results[key], run.copies)[0],
                                 stored[key]):
      row.details.append(f"{key}: {verdict.message}; no numbers for it")
      continue
    add_verdict(row, key, verdict, tol)
    if not verdict.passed:
      failed = _failed_array(case, run, key, stored[key])
      if failed is not None:
        row.failed[key] = failed
  if entry["jit_eager_agree"] and run.jit_eager_agree is False:
    row.details.append("jit and eager results agreed in the baseline and now disagree")
  return len(row.details) > found


def _failed_array(case: Case, run: Any, key: str, expected: np.ndarray) -> FailedArray | None:
  """A failing result beside the baseline's, for the HTML report; None if dtype or shape moved."""
  tol = run.tolerances[key]
  copies = split_copies(key, run.results[key], run.copies)
  for i, actual in enumerate(copies):
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
      return None
    if compare_arrays(actual, expected, tol).passed:
      continue
    x = run.inputs["input"]
    spatial: tuple[int, ...] = ()
    if role_of(key) != "grad_params" and actual.ndim == x.ndim:  # laid out as the input
      first = 0 if case.input in UNBATCHED_INPUTS else 1
      spatial = tuple(range(first, x.ndim - 1))
    return FailedArray(expected, actual, tol, spatial,
                       (i, len(copies)) if len(copies) > 1 else None)
  return None
