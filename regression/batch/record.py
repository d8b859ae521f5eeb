"""``record``: runs every case (or those ``-k`` selects) and writes a batch baseline atomically.

``record -k PATTERN`` records only the cases it selects. Into a new directory that makes a
partial baseline, which says so (a note in its manifest and the report: ``check`` against it
reports the other cases NEW unless given the same ``-k``). Into an existing baseline, with
``--force`` as any replacement needs, it merges: the selected cases are recorded again and
every other case is kept as it was, so the result is what a whole record would give for
the names the pattern selects and the old baseline for the rest. A merge is refused where
the baseline was recorded in another environment (other versions, platform, JAX
configuration or ``JAX_*``/``XLA_*`` variables; a git revision apart), since its kept cases
would then stand under this run's stamp; the note names the recording the kept cases come
from.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import store
from ..compare.tolerance import policy_table
from ..constants import PARTIAL_NOTE
from ..report import Report, Row, recorded_label
from ..stamp import SHIPPED, collect_stamp, git_revision, labelled_changes, source_checkout
from ..store import Baseline, BaselineError
from .baseline import KIND, Progress, case_arrays, case_label, declaration_changes, is_input, load
from .declare import Case, matches, select, selects_none
from .programs import recorded
from .runner import run_case


def record(
    cases: Sequence[Case],
    out: str | os.PathLike,
    *,
    force: bool = False,
    pattern: str | None = None,
    notes: Sequence[str] = (),
    reps: int = 20,
    progress: Progress | None = None,
) -> Report:
  """Runs every case (or those ``pattern`` selects) and writes a baseline atomically.

  Inputs are generated, except that a case whose declaration is unchanged
  reuses the inputs stored in the baseline being replaced, so inputs stay
  fixed across re-recordings.

  Args:
    cases: the batch.
    out: the baseline directory.
    force: replace an existing baseline (with ``pattern``: merge into it).
    pattern: record only the cases whose name contains it or matches it as a glob; into
      an existing baseline, merged (see the module docstring).
    notes: lines to carry into the report and manifest (e.g. skipped builders).
    reps: the most timed steady-state calls per case.
    progress: called as ``progress(n, total, name)`` before each selected case runs.

  Returns:
    The report; exit code 2 if ``out`` may not be written (it exists without
    ``force``, holds other files or a newer-format baseline, is the shipped baseline of a
    checkout with uncommitted changes, or the disk refused the write, which leaves any
    previous baseline intact), if ``pattern`` selects no case, or if a merge is refused; 1
    if a case failed (nothing is written then), else 0.
  """
  out = Path(out)
  report = Report(command="record", baseline=str(out), notes=list(notes))
  unselected = selects_none(pattern, [c.name for c in cases]) if cases else None
  problem = f"record: {unselected}" if unselected else _dirty_shipped(out)
  try:
    store.check_writable(out, force=force)
  except FileExistsError as e:
    problem = problem or str(e)
  if problem:
    report.exit_code, report.error = 2, problem
    return report
  if not cases:
    report.exit_code = 2
    report.error = "no cases to record" + (f" ({'; '.join(notes)})" if notes else "") + "."
    return report
  old = None
  if out.exists():
    try:
      old = load(out)
    except BaselineError as e:
      if pattern:
        report.exit_code, report.error = 2, (
            f"record -k: {e} A partial record merges into a baseline it can read; record "
            "it whole, without -k.")
        return report
      old = None
  stamp = collect_stamp()
  report.stamp = stamp
  if pattern and old is not None:
    moved = [line for label, line in labelled_changes(old.manifest["stamp"], stamp)
             if not label.startswith("git ")]
    if moved:
      report.exit_code, report.error = 2, (
          f"record -k: baseline {out} was recorded in another environment ({', '.join(moved)}); "
          "merging would put its other cases under this run's stamp. Record it whole, "
          "without -k, or record the selection into another --out.")
      return report
  selected = select(cases, pattern)
  entries: dict[str, Any] = {}
  arrays: dict[str, np.ndarray] = {}
  for n, case in enumerate(selected, 1):
    if progress is not None:
      progress(n, len(selected), case.name)
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
    field, members = recorded(run)
    if field is not None:
      entries[case.name]["program"] = field
    run.call = None  # the case's module and device arrays are no longer needed
    for key, value in {**run.inputs, **run.results, **members}.items():
      arrays[f"{case.name}/{key}"] = value
  if any(r.status == "ERROR" for r in report.rows):
    report.exit_code = 1
    report.notes.append("nothing was written: fix the failing cases first")
    return report
  if pattern:
    report.notes.append(_partial(report, pattern, old, entries, arrays, len(cases)))
  fields = {
      "kind": KIND,
      "stamp": stamp,
      "cases": entries,
      "notes": [*notes, *(_merges(old) if pattern else []), *report.notes[len(notes):]],
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


def _dirty_shipped(out: Path) -> str | None:
  """The refusal to record the shipped baseline from a checkout with uncommitted changes: its
  stamp's git revision must name the code that produced it (and a clean clone would read
  ``git dirty True -> False`` as a change)."""
  root = source_checkout()
  if root is None or out.resolve() != SHIPPED.resolve():
    return None
  if not git_revision(root).get("dirty"):
    return None
  return (f"record: the shipped baseline is recorded from a clean tree, so that its stamp's git "
          f"revision names the code that produced it; {root} has uncommitted changes (git "
          "status lists them): commit or stash them first, or record elsewhere with --out.")


def _partial(report: Report, pattern: str, old: Baseline | None, entries: dict[str, Any],
             arrays: dict[str, np.ndarray], batch: int) -> str:
  """A partial record's note; merging, the old baseline's other cases added to ``entries``
  and ``arrays``."""
  recorded = len(entries)
  if old is None:
    return (f"{PARTIAL_NOTE} {pattern!r}: a partial baseline, {recorded} of the batch's "
            f"{batch} cases; `check` against it reports the others NEW unless given the same -k")
  kept = [name for name in old.manifest["cases"] if not matches(name, pattern)]
  for name in kept:
    entries[name] = old.manifest["cases"][name]
    arrays.update({f"{name}/{key}": value for key, value in case_arrays(old, name).items()})
  when = recorded_label({"stamp": report.stamp or {}})
  return (f"{PARTIAL_NOTE} {pattern!r}: {recorded} case(s) recorded {when}, merged into "
          f"{old.path}; its other {len(kept)} case(s) kept from the recording of "
          f"{recorded_label(old.manifest)}")


def _merges(old: Baseline | None) -> list[str]:
  """The notes of earlier merges into the baseline being replaced (a merge keeps them)."""
  if old is None:
    return []
  notes = old.manifest.get("notes") or []
  return [n for n in notes if isinstance(n, str) and n.startswith(PARTIAL_NOTE)]


def _os_reason(e: OSError) -> str:
  name = errno.errorcode.get(e.errno or 0)
  reason = e.strerror or str(e)
  return f"{name}: {reason}" if name else reason
