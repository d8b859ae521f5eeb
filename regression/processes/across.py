"""One check of the guard run by several processes at once (``Guard._run`` hands it here).

Each process runs the model on the same global arrays; only process 0, the lead, touches
the baseline. In order:

1. the lead reads the baseline (or finds it must write one, or must refuse);
2. with ``store_params``, the processes agree, and the lead sends the stored weights to the
   others (``broadcast_one_to_all``);
3. each process traces and compiles the call; at the gate, before anything runs across
   processes, all agree on the check's name, on whether each got there, and on the lead's
   plan (:mod:`~nnx_pool.regression.processes.group`); a process that failed tells the
   others there, so none waits in a collective;
4. each runs it; the results are gathered whole in every process
   (:mod:`~nnx_pool.regression.processes.arrays`);
5. the lead compares or writes, and posts its verdict; the others wait for it and end the
   check as it did: passed, written, failed or refused, with the lead's message.

The other processes never read or write a file, so the processes need not share one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..describe import error_line
from .gate import gated
from .group import Group, ProcessesError

if TYPE_CHECKING:
  from ..guard import Guard, Outcome, Plan


class _Refused(Exception):
  """The lead refused the check before it ran (its message)."""


def run_across(guard: Guard, group: Group, name: str, allow_nonfinite: bool,
               store_params: bool, execute: Any) -> Outcome:
  """Runs one check in this process as one of ``group`` (see the module's docstring)."""
  __tracebackhide__ = True
  from ..guard import Outcome, Plan, RegressionFailure

  path = guard.path_for(name)

  def refused(message: str) -> RegressionFailure:
    where = f"process {group.index} of {group.count}"
    return RegressionFailure(Outcome("refused", path, f"nnx_regression: {name!r} ({where}): "
                                                      f"{message}"))

  try:
    number = group.begin(name)
  except ProcessesError as e:
    raise refused(str(e)) from None
  plan, told = Plan(path, False, False), {}
  if group.lead:
    try:
      plan = guard._plan(name, store_params)
      told = {"weights": _shapes(plan.weights)} if plan.weights is not None else {}
    except RegressionFailure as f:
      told = {"refused": f.outcome.message}
    except Exception as e:  # noqa: BLE001 - the others must hear of it, not wait
      told = {"refused": f"nnx_regression: {name!r}: process 0 (the lead) could not read what "
                         f"the check needs: {error_line(e)}"}

  def agree(stage: str, error: str | None = None) -> dict[str, Any]:
    posts = group.agree(number, name, stage, error=error, plan=told if group.lead else None)
    lead = posts[0]["plan"] or {}
    if lead.get("refused"):
      raise _Refused(lead["refused"])
    return lead

  try:
    if store_params:
      lead = agree("weights")
      if lead.get("weights") is not None:
        plan.weights = _share(plan.weights, lead["weights"], group.lead)
    with gated(lambda error: agree("ready", error)) as gate:
      try:
        rec = guard._execute(name, plan, execute)
        gate()  # a call that ran nothing across processes agrees here
      except (ProcessesError, _Refused):
        raise
      except BaseException as e:
        if not gate.passed:  # tell the others before they wait in a collective
          try:
            gate(error_line(e))
          except (ProcessesError, _Refused):
            pass
        raise
  except _Refused as e:
    raise RegressionFailure(Outcome("refused", path, _heard(str(e), group.lead))) from None
  except ProcessesError as e:
    raise refused(str(e)) from None
  if group.lead:
    return _lead_finishes(guard, group, number, name, plan, rec, allow_nonfinite,
                          store_params)
  try:
    verdict = group.hear(number, "verdict", name)
  except ProcessesError as e:
    raise refused(str(e)) from None
  return _as_outcome(verdict, rec)


def _lead_finishes(guard: Guard, group: Group, number: int, name: str, plan: Plan, rec: Any,
                   allow_nonfinite: bool, store_params: bool) -> Outcome:
  """The lead compares or writes, posts the verdict, and ends as it says."""
  __tracebackhide__ = True
  from ..guard import RegressionFailure

  failure = None
  try:
    outcome = guard._finish(name, plan, rec, allow_nonfinite, store_params)
  except RegressionFailure as f:
    outcome, failure = f.outcome, f
  except BaseException as e:
    group.tell(number, "verdict", {"status": "refused", "path": str(plan.path), "message": (
        f"nnx_regression: {name!r}: process 0 (the lead) failed while comparing or writing: "
        f"{error_line(e)}")})
    raise
  obtained = None if outcome.obtained is None else str(outcome.obtained)
  verdict: dict[str, Any] = {"status": outcome.status, "path": str(outcome.path),
                             "message": outcome.message, "obtained": obtained}
  if outcome.report is not None:
    verdict["headline"] = list(outcome.report.headline)
  if outcome.written is not None:
    written = outcome.written
    verdict["written"] = {"size": written.size, "weights_size": written.weights_size,
                          "weights": None if written.weights is None else str(written.weights),
                          "weights_new": written.weights_new,
                          "weights_note": written.weights_note}
  group.tell(number, "verdict", verdict)
  if failure is not None:
    raise failure
  return outcome


def _as_outcome(verdict: dict[str, Any], rec: Any) -> Outcome:
  """The lead's verdict as this process's outcome (raised where it failed)."""
  __tracebackhide__ = True
  from ..fixture.files import Written
  from ..guard import Outcome, RegressionFailure
  from ..report import Report

  outcome = Outcome(verdict["status"], Path(verdict["path"]), _heard(verdict["message"], False))
  if verdict.get("obtained"):
    outcome.obtained = Path(verdict["obtained"])
  if "headline" in verdict:
    outcome.report = Report(command="check", unit="arrays", headline=list(verdict["headline"]))
  if verdict.get("written"):
    written = dict(verdict["written"])
    weights = written.pop("weights")
    outcome.written = Written(weights=None if weights is None else Path(weights), **written)
  if outcome.status in ("failed", "refused"):
    raise RegressionFailure(outcome)
  return outcome


def _heard(message: str, lead: bool) -> str:
  """The lead's message as another process tells it: marked as the lead's verdict."""
  if lead:
    return message
  return message.replace("nnx_regression: ", "nnx_regression (process 0's verdict): ", 1)


def _shapes(weights: Any) -> dict[str, list[Any]]:
  return {key: [list(value.shape), value.dtype.name] for key, value in weights.items()}


def _share(weights: Any, shapes: dict[str, list[Any]], lead: bool) -> dict[str, Any]:
  """The lead's stored weights, in every process (a collective, after an agreement)."""
  import ml_dtypes  # noqa: F401 - registers bfloat16 and the other names with NumPy
  import numpy as np
  from jax.experimental import multihost_utils

  if not lead:
    weights = {key: np.zeros(shape, np.dtype(dtype)) for key, (shape, dtype) in shapes.items()}
  shared = multihost_utils.broadcast_one_to_all(weights, is_source=lead)
  return {key: np.asarray(value) for key, value in shared.items()}
