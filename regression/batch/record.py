"""``record``: runs every case and writes a batch baseline atomically."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import store
from ..compare.tolerance import policy_table
from ..report import Report, Row
from ..stamp import collect_stamp
from ..store import BaselineError
from .baseline import KIND, Progress, case_arrays, case_label, declaration_changes, is_input, load
from .declare import Case
from .runner import run_case


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
      if entry is not None and not declaration_changes(entry["declaration"], case.describe()):
        stored = {k: v for k, v in case_arrays(old, case.name).items() if is_input(k)}
    run = run_case(case, stored, reps=reps)
    if run.error:
      report.rows.append(Row(case.name, "ERROR", details=[run.error]))
      continue
    label = case_label(case, run.tolerances)
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
