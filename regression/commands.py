"""The four commands behind the CLI: ``record``, ``check``, ``diff`` and ``info``.

Each takes plain arguments, returns a :class:`~nnx_pool.regression.report.Report`, and
never prints; :mod:`nnx_pool.regression.cli` renders it. ``record`` and ``check`` call
an optional ``progress(n, total, case_name)`` before each case (the CLI's progress
line). Baseline arrays are keyed ``<case>/<key>``: the stored inputs (``input``,
``cotangent``, ``weights/<path>``) and the results (``output``, ``output_eager``,
``indices``, ``indices_eager``, ``grad/input``, ``grad/params/<path>``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nnx_pool.regression import store
from nnx_pool.regression.batch import Case, matches, select
from nnx_pool.regression.batch_runner import UNBATCHED_INPUTS, make_mesh, run_case
from nnx_pool.regression.compare import Verdict, compare_arrays
from nnx_pool.regression.constants import BATCH_AXIS
from nnx_pool.regression.report import FAILING, FailedArray, Report, Row, Timing, recorded_label
from nnx_pool.regression.runner import Execution, compare_results, role_of, split_copies
from nnx_pool.regression.stamp import collect_stamp, stamp_changes
from nnx_pool.regression.store import Baseline, BaselineError
from nnx_pool.regression.tolerance import Tolerance, policy_table

KIND = "batch"
_INPUT_KEYS = ("input", "cotangent", "weights/")
_CASE_FIELDS = ("declaration", "inputs", "results", "jit_eager_agree", "timing", "raises")
# Called as progress(n, total, case_name) before the n-th of total cases runs (n from 1).
Progress = Callable[[int, int, str], None]


def _is_input(key: str) -> bool:
  return key.startswith(_INPUT_KEYS)


# ------------------------------------------------------------------ loading


def load(path: str | os.PathLike) -> Baseline:
  """Reads a batch baseline and checks it is one this version can compare with.

  Raises:
    BaselineError: see :func:`nnx_pool.regression.store.read_baseline`; also when the
      manifest is not a batch baseline or a case entry is malformed.
  """
  base = store.read_baseline(path)
  manifest = base.manifest
  if manifest.get("kind") != KIND:
    raise BaselineError(
        f"baseline {base.path}: holds kind {manifest.get('kind')!r}, not a {KIND!r} baseline"
        + (f"; it is a pytest fixture baseline: its test checks it, and `nnx-pool-regression "
           f"report {base.path} --html OUT` draws its last failure" if manifest.get("kind") ==
           "pytest" else "") + "."
    )
  cases = manifest.get("cases")
  if not isinstance(cases, dict) or not isinstance(manifest.get("stamp"), dict):
    raise BaselineError(f"baseline {base.path}: manifest lacks 'cases' or 'stamp'.")
  for name, entry in cases.items():
    missing = [f for f in _CASE_FIELDS if not isinstance(entry, dict) or f not in entry]
    if missing:
      raise BaselineError(f"baseline {base.path}: case {name!r} lacks {missing[0]!r}.")
    for key in [*entry["inputs"], *entry["results"]]:
      if f"{name}/{key}" not in base.arrays:
        raise BaselineError(f"baseline {base.path}: case {name!r} refers to missing array {key!r}.")
  return base


def _case_arrays(base: Baseline, name: str) -> dict[str, np.ndarray]:
  prefix = f"{name}/"
  return {k[len(prefix):]: v for k, v in base.arrays.items() if k.startswith(prefix)}


# ------------------------------------------------------------------- record


def record(
    cases: Sequence[Case],
    out: str | os.PathLike,
    *,
    force: bool = False,
    notes: Sequence[str] = (),
    reps: int = 20,
    progress: Progress | None = None,
) -> Report:
  """Runs every case and writes a baseline atomically.

  Inputs are generated, except that a case whose declaration is unchanged
  reuses the inputs stored in the baseline being replaced, so inputs stay
  fixed across re-recordings.

  Args:
    cases: the batch.
    out: the baseline directory.
    force: replace an existing baseline.
    notes: lines to carry into the report and manifest (e.g. skipped builders).
    reps: the most timed steady-state calls per case.
    progress: called as ``progress(n, len(cases), name)`` before each case runs.

  Returns:
    The report; exit code 2 if ``out`` may not be written (it exists without
    ``force``, holds other files or a newer-format baseline, or the disk
    refused the write, which leaves any previous baseline intact), 1 if a
    case failed (nothing is written then), else 0.
  """
  out = Path(out)
  report = Report(command="record", baseline=str(out), notes=list(notes))
  try:
    store.check_writable(out, force=force)
  except FileExistsError as e:
    report.exit_code, report.error = 2, str(e)
    return report
  if not cases:
    report.exit_code = 2
    report.error = "no cases to record" + (f" ({'; '.join(notes)})" if notes else "") + "."
    return report
  old = None
  if out.exists():
    try:
      old = load(out)
    except BaselineError:
      old = None
  stamp = collect_stamp()
  report.stamp = stamp
  entries: dict[str, Any] = {}
  arrays: dict[str, np.ndarray] = {}
  for n, case in enumerate(cases, 1):
    if progress is not None:
      progress(n, len(cases), case.name)
    stored = None
    if old is not None:
      entry = old.manifest["cases"].get(case.name)
      if entry is not None and not _declaration_changes(entry["declaration"], case.describe()):
        stored = {k: v for k, v in _case_arrays(old, case.name).items() if _is_input(k)}
    run = run_case(case, stored, reps=reps)
    if run.error:
      report.rows.append(Row(case.name, "ERROR", details=[run.error]))
      continue
    label = _label(case, run.tolerances)
    report.rows.append(Row(case.name, "RECORDED", tolerance=label))
    x = run.inputs["input"]
    entries[case.name] = {
        "declaration": case.describe(),
        "input_digest": store.digest(x),
        "input_shape": list(x.shape),
        "input_dtype": x.dtype.name,
        "inputs": sorted(run.inputs),
        "results": {k: t.to_json() for k, t in sorted(run.tolerances.items())},
        "jit_eager_agree": run.jit_eager_agree,
        "timing": {"compile_s": run.compile_s, "steady_s": run.steady_s},
        "raises": run.raised,
    }
    for key, value in {**run.inputs, **run.results}.items():
      arrays[f"{case.name}/{key}"] = value
  if any(r.status == "ERROR" for r in report.rows):
    report.exit_code = 1
    report.notes.append("nothing was written: fix the failing cases first")
    return report
  fields = {
      "kind": KIND,
      "stamp": stamp,
      "cases": entries,
      "notes": list(notes),
      "tolerance_policy": policy_table(),
  }
  try:
    store.write_baseline(out, fields, arrays, force=force)
  except FileExistsError as e:  # also another writer's baseline appearing meanwhile
    report.exit_code, report.error = 2, str(e)
  except OSError as e:  # a full disk, a read-only directory: nothing was swapped in
    kept = "the previous baseline is unchanged" if out.exists() else "nothing was written"
    report.exit_code = 2
    report.error = f"could not write baseline {out} ({_os_reason(e)}); {kept}."
  return report


def _os_reason(e: OSError) -> str:
  name = errno.errorcode.get(e.errno or 0)
  reason = e.strerror or str(e)
  return f"{name}: {reason}" if name else reason


def _label(case: Case, tolerances: Mapping[str, Tolerance]) -> str:
  if case.raises is not None:
    return f"raises {case.raises.type}"
  tol = tolerances.get("output")
  return tol.describe() if tol else "-"


# -------------------------------------------------------------------- check


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
      with the baseline (see :mod:`nnx_pool.regression.batch_runner`). None: one device.
    axis_types: the mesh's axis type when ``devices`` is given,
      ``"explicit"`` (default) or ``"auto"``.
    progress: called as ``progress(n, total, name)`` before each selected case runs.

  Returns:
    The report; exit code 2 for an unusable baseline or too few devices, 1
    for any failing row (0 with ``dry_run``), else 0.
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
  report.recorded = recorded_label(manifest)
  report.stamp = collect_stamp()
  report.baseline_stamp = manifest["stamp"]
  report.stamp_changes = stamp_changes(manifest["stamp"], report.stamp)
  entries = manifest["cases"]
  selected = select(cases, pattern)
  placements: dict[str, int] = {}
  for n, case in enumerate(selected, 1):
    if progress is not None:
      progress(n, len(selected), case.name)
    entry = entries.get(case.name)
    if entry is None:
      report.rows.append(Row(case.name, "NEW", details=["not in the baseline; re-record it"]))
      continue
    stored = _case_arrays(base, case.name)
    changed = _declaration_changes(entry["declaration"], case.describe())
    if changed:
      row, run = _stale_row(case, entry, changed, stored, reps=reps, mesh=mesh)
      report.rows.append(row)
      if run is not None:
        placements[run.placement] = placements.get(run.placement, 0) + 1
      continue
    run = run_case(case, {k: v for k, v in stored.items() if _is_input(k)}, reps=reps, mesh=mesh)
    row = _compare_run(case, entry, run, stored)
    placements[run.placement] = placements.get(run.placement, 0) + 1
    report.rows.append(row)
    timing = entry["timing"]
    report.timings.append(Timing(
        case.name, timing.get("compile_s"), run.compile_s, timing.get("steady_s"), run.steady_s))
  names = {c.name for c in cases}
  for name in entries:
    if name not in names and matches(name, pattern):
      report.rows.append(Row(name, "GONE", details=["in the baseline but no longer in the batch"]))
  if pattern and not selected:
    report.notes.append(f"-k {pattern!r} selected no cases")
  if mesh is not None:
    report.notes.append(
        f"sharded run: mesh axis {BATCH_AXIS!r} over {devices} {_platform(mesh)} devices "
        f"({axis_types} axes); every copy of a repeated batch is compared with the baseline")
    report.notes.extend(f"  {count} case(s): {placement}" for placement, count in sorted(
        placements.items(), key=lambda item: (item[0].startswith("replicated"), -item[1])))
  failing = any(r.status in FAILING for r in report.rows)
  if failing and dry_run:
    report.notes.append("dry run: the drift above is reported, exit code 0")
  report.exit_code = 1 if failing and not dry_run else 0
  return report


def _platform(mesh: Any) -> str:
  return str(mesh.devices.flat[0].platform)


def _declaration_changes(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
  """What changed in a case's declaration; a reworded ``note`` is not a change."""
  return [
      f"declaration changed: {key} {before.get(key)!r} -> {now.get(key)!r}; re-record it"
      for key in sorted(set(before) | set(now))
      if key != "note" and before.get(key) != now.get(key)
  ]


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
  row = Row(case.name, "PASS", 0.0, 0.0, _label(case, run.tolerances))
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
  run = run_case(case, {k: v for k, v in stored.items() if _is_input(k)}, reps=reps, mesh=mesh)
  if run.error:
    row.details.append(f"no numbers: the case does not run on the stored inputs ({run.error})")
    return row, run
  row.tolerance = _label(case, run.tolerances)
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
    if stale and not _same_layout(split_copies(key, run.results[key], run.copies)[0],
                                  stored[key]):
      row.details.append(f"{key}: {verdict.message}; no numbers for it")
      continue
    _add_verdict(row, key, verdict, tol)
    if not verdict.passed:
      failed = _failed_array(case, run, key, stored[key])
      if failed is not None:
        row.failed[key] = failed
  if entry["jit_eager_agree"] and run.jit_eager_agree is False:
    row.details.append("jit and eager results agreed in the baseline and now disagree")
  return len(row.details) > found


def _same_layout(a: np.ndarray, b: np.ndarray) -> bool:
  return a.dtype == b.dtype and a.shape == b.shape


def _add_verdict(row: Row, key: str, verdict: Verdict, tol: Tolerance) -> None:
  """One array's numbers into ``row``: its verdict, the row's largest errors, a detail if it
  failed."""
  row.arrays[key] = {**verdict.to_json(), "tolerance": tol.to_json()}
  row.max_abs = max(row.max_abs or 0.0, verdict.max_abs)
  row.max_rel = max(row.max_rel or 0.0, verdict.max_rel)
  if not verdict.passed:
    row.details.append(f"{key}: {verdict.message} [{tol.describe()}]")


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


# --------------------------------------------------------------------- diff


def diff(a: str | os.PathLike, b: str | os.PathLike) -> Report:
  """Compares two recorded baselines, with the first one's tolerances.

  Returns:
    The report; exit code 2 if either baseline is unusable, 1 if any case
    differs, is missing from one side, or was run on different inputs.
  """
  report = Report(command="diff", baseline=str(a), other=str(b))
  try:
    base_a, base_b = load(a), load(b)
  except BaselineError as e:
    report.exit_code, report.error = 2, str(e)
    return report
  report.recorded = recorded_label(base_a.manifest)
  report.baseline_stamp, report.stamp = base_a.manifest["stamp"], base_b.manifest["stamp"]
  # Both stamps were set on the line above (pyright keeps their declared Optional type).
  report.stamp_changes = stamp_changes(report.baseline_stamp, report.stamp)  # pyright: ignore[reportArgumentType]
  cases_a, cases_b = base_a.manifest["cases"], base_b.manifest["cases"]
  for name in sorted(set(cases_a) | set(cases_b)):
    if name not in cases_b:
      report.rows.append(Row(name, "GONE", details=[f"only in {a}"]))
      continue
    if name not in cases_a:
      report.rows.append(Row(name, "NEW", details=[f"only in {b}"]))
      continue
    ea, eb = cases_a[name], cases_b[name]
    arrays_a, arrays_b = _case_arrays(base_a, name), _case_arrays(base_b, name)
    report.rows.append(_diff_case(name, ea, eb, arrays_a, arrays_b))
    report.timings.append(Timing(
        name, ea["timing"].get("compile_s"), eb["timing"].get("compile_s"),
        ea["timing"].get("steady_s"), eb["timing"].get("steady_s")))
  report.exit_code = 1 if any(r.status in FAILING for r in report.rows) else 0
  return report


def _diff_case(
    name: str, ea: Mapping[str, Any], eb: Mapping[str, Any],
    arrays_a: Mapping[str, np.ndarray], arrays_b: Mapping[str, np.ndarray],
) -> Row:
  changed = _declaration_changes(ea["declaration"], eb["declaration"])
  raises = ea["declaration"].get("raises")
  if changed:
    return _diff_stale(name, changed, ea, eb, arrays_a, arrays_b)
  if raises:
    label = f"raises {raises['type']}"
    same = (ea["raises"] or {}).get("type") == (eb["raises"] or {}).get("type")
    return Row(name, "PASS" if same else "FAIL", tolerance=label,
               details=[] if same else [f"raised {ea['raises']} vs {eb['raises']}"])
  inputs_differ = _inputs_differ(ea, eb, arrays_a, arrays_b)
  if inputs_differ:
    detail = f"inputs differ ({', '.join(inputs_differ)}): not comparable"
    return Row(name, "FAIL", details=[detail])
  row = Row(name, "PASS", 0.0, 0.0, _tolerance_label(ea))
  if _diff_into(row, ea, eb, arrays_a, arrays_b):
    row.status = "FAIL"
  return row


def _inputs_differ(ea: Mapping[str, Any], eb: Mapping[str, Any],
                   arrays_a: Mapping[str, np.ndarray], arrays_b: Mapping[str, np.ndarray],
                   ) -> list[str]:
  empty = np.zeros(0)
  return [
      k for k in sorted(set(ea["inputs"]) | set(eb["inputs"]))
      if store.digest(arrays_a.get(k, empty)) != store.digest(arrays_b.get(k, empty))
  ]


def _tolerance_label(entry: Mapping[str, Any]) -> str:
  out_tol = entry["results"].get("output")
  return Tolerance.from_json(out_tol).describe() if out_tol else "-"


def _diff_stale(
    name: str, changed: list[str], ea: Mapping[str, Any], eb: Mapping[str, Any],
    arrays_a: Mapping[str, np.ndarray], arrays_b: Mapping[str, np.ndarray],
) -> Row:
  """A STALE row of ``diff``: the declaration changes, then how far B's results are from A's
  where both were computed from the same inputs (as :func:`_stale_row` for ``check``)."""
  row = Row(name, "STALE", details=list(changed))
  if ea["declaration"].get("raises") or eb["declaration"].get("raises"):
    row.details.append("no numbers: an error case has no results to compare")
    return row
  # The cotangent follows the output's shape: when that changed, the details name it.
  differ = [k for k in _inputs_differ(ea, eb, arrays_a, arrays_b)
            if k != "cotangent" or np.shape(arrays_a.get(k, ())) == np.shape(arrays_b.get(k, ()))]
  if differ:
    row.details.append(f"no numbers: inputs differ ({', '.join(differ)})")
    return row
  row.tolerance = _tolerance_label(ea)
  if not _diff_into(row, ea, eb, arrays_a, arrays_b, stale=True):
    row.details.append("every result of B is within its tolerance of A's")
  return row


def _diff_into(
    row: Row, ea: Mapping[str, Any], eb: Mapping[str, Any],
    arrays_a: Mapping[str, np.ndarray], arrays_b: Mapping[str, np.ndarray], *, stale: bool = False,
) -> bool:
  """Compares B's results with A's under A's tolerances, into ``row`` (see :func:`_compare_into`).

  Returns:
    Whether anything differs (a detail was added).
  """
  found = len(row.details)
  for key in sorted(set(ea["results"]) | set(eb["results"])):
    if key not in ea["results"] or key not in eb["results"]:
      row.details.append(f"{key}: present in only one baseline")
      continue
    tol = Tolerance.from_json(ea["results"][key])
    verdict = compare_arrays(arrays_b[key], arrays_a[key], tol)
    if stale and not _same_layout(arrays_b[key], arrays_a[key]):
      row.details.append(f"{key}: {verdict.message}; no numbers for it")
      continue
    _add_verdict(row, key, verdict, tol)
  if ea["jit_eager_agree"] != eb["jit_eager_agree"]:
    row.details.append(f"jit/eager agreement {ea['jit_eager_agree']} -> {eb['jit_eager_agree']}")
  return len(row.details) > found


# --------------------------------------------------------------------- info


def info() -> Report:
  """The current environment stamp."""
  return Report(command="info", stamp=collect_stamp())
