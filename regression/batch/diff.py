"""``diff``: compares two recorded batch baselines, each result under the tolerance ``check``
gives it (its case's kind, its role and the first baseline's dtype), computed again: the
numbers a manifest stores beside it can be edited, and where they are looser, the report
says so, naming the array."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import store
from ..compare import compare_arrays
from ..compare.stored import looser_lines
from ..compare.tolerance import Tolerance, tolerance_for
from ..report import FAILING, Report, Row, Timing, recorded_label
from ..runner import role_of
from ..stamp import stamp_changes
from ..store import BaselineError
from .baseline import add_verdict, case_arrays, declaration_changes, load, same_layout


def diff(a: str | os.PathLike, b: str | os.PathLike) -> Report:
  """Compares two recorded baselines, each result under the tolerance ``check`` gives it.

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
    arrays_a, arrays_b = case_arrays(base_a, name), case_arrays(base_b, name)
    tolerances = _tolerances(ea, arrays_a)
    report.notes += looser_lines(ea["results"], tolerances, str(a), prefix=f"{name}:")
    report.rows.append(_diff_case(name, ea, eb, arrays_a, arrays_b, tolerances))
    report.timings.append(Timing(
        name, ea["timing"].get("compile_s"), eb["timing"].get("compile_s"),
        ea["timing"].get("steady_s"), eb["timing"].get("steady_s")))
  report.exit_code = 1 if any(r.status in FAILING for r in report.rows) else 0
  return report


def _tolerances(entry: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
                ) -> dict[str, Tolerance]:
  """The tolerance of each of a case's results, as ``check`` computes it; where the case's
  kind is not one the kit knows (a baseline from another version), the stored one."""
  kind = entry["declaration"].get("tolerance_kind")
  out = {}
  for key, stored in entry["results"].items():
    try:
      out[key] = tolerance_for(kind, role_of(key), arrays[key].dtype)
    except (KeyError, ValueError):
      out[key] = Tolerance.from_json(stored)
  return out


def _diff_case(
    name: str, ea: Mapping[str, Any], eb: Mapping[str, Any],
    arrays_a: Mapping[str, np.ndarray], arrays_b: Mapping[str, np.ndarray],
    tolerances: Mapping[str, Tolerance],
) -> Row:
  changed = declaration_changes(ea["declaration"], eb["declaration"])
  raises = ea["declaration"].get("raises")
  if changed:
    return _diff_stale(name, changed, ea, eb, arrays_a, arrays_b, tolerances)
  if raises:
    label = f"raises {raises['type']}"
    same = (ea["raises"] or {}).get("type") == (eb["raises"] or {}).get("type")
    return Row(name, "PASS" if same else "FAIL", tolerance=label,
               details=[] if same else [f"raised {ea['raises']} vs {eb['raises']}"])
  inputs_differ = _inputs_differ(ea, eb, arrays_a, arrays_b)
  if inputs_differ:
    detail = f"inputs differ ({', '.join(inputs_differ)}): not comparable"
    return Row(name, "FAIL", details=[detail])
  row = Row(name, "PASS", 0.0, 0.0, _tolerance_label(tolerances))
  if _diff_into(row, ea, eb, arrays_a, arrays_b, tolerances):
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


def _tolerance_label(tolerances: Mapping[str, Tolerance]) -> str:
  return tolerances["output"].describe() if "output" in tolerances else "-"


def _diff_stale(
    name: str, changed: list[str], ea: Mapping[str, Any], eb: Mapping[str, Any],
    arrays_a: Mapping[str, np.ndarray], arrays_b: Mapping[str, np.ndarray],
    tolerances: Mapping[str, Tolerance],
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
  row.tolerance = _tolerance_label(tolerances)
  if not _diff_into(row, ea, eb, arrays_a, arrays_b, tolerances, stale=True):
    row.details.append("every result of B is within its tolerance of A's")
  return row


def _diff_into(
    row: Row, ea: Mapping[str, Any], eb: Mapping[str, Any],
    arrays_a: Mapping[str, np.ndarray], arrays_b: Mapping[str, np.ndarray],
    tolerances: Mapping[str, Tolerance], *, stale: bool = False,
) -> bool:
  """Compares B's results with A's under ``tolerances``, into ``row`` (see
  :func:`_compare_into`).

  Returns:
    Whether anything differs (a detail was added).
  """
  found = len(row.details)
  for key in sorted(set(ea["results"]) | set(eb["results"])):
    if key not in ea["results"] or key not in eb["results"]:
      row.details.append(f"{key}: present in only one baseline")
      continue
    tol = tolerances[key]
    verdict = compare_arrays(arrays_b[key], arrays_a[key], tol)
    if stale and not same_layout(arrays_b[key], arrays_a[key]):
      row.details.append(f"{key}: {verdict.message}; no numbers for it")
      continue
    add_verdict(row, key, verdict, tol)
  if ea["jit_eager_agree"] != eb["jit_eager_agree"]:
    row.details.append(f"jit/eager agreement {ea['jit_eager_agree']} -> {eb['jit_eager_agree']}")
  return len(row.details) > found
