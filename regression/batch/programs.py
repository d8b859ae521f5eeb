"""A batch case's exported program: written into the baseline by ``record``, run again by a
failing ``check`` to say whether the program or the compiler moved the case.

The program is the case's forward call (:mod:`~nnx_pool.regression.fixture.program`): its
weights, its other state and its input are arguments; its results are ``output`` (and
``indices``). A case's manifest entry holds it as ``program`` (the fixture's field, plus each
weight's digest), its array as ``<case>/program.jax``. The attribution itself is the fixture's
(:func:`~nnx_pool.regression.fixture.attribution.attribute`), given the case's arrays as a
baseline of its own. A baseline recorded before programs were kept has none: its cases get no
attribution, and nothing else changes. Gradients are not in the program: a case whose
forward results all pass gets no attribution.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .. import store
from ..fixture import attribution, model_state, program
from ..fixture.recording import Recording
from ..report import Row
from ..runner import Execution
from ..store import Baseline

# The program's one input argument (the fixture names inputs ``input/<i>``).
INPUT = "input/0"
_FORWARD = ("output", "indices")


def _program(run: Execution) -> program.Program | None:
  if run.call is None:
    return None
  apply, args = run.call
  made = program.Program(apply, args, [INPUT])
  made.results = [key for key in _FORWARD if key in run.results]
  return made


def recorded(run: Execution) -> tuple[dict[str, Any] | None, dict[str, np.ndarray]]:
  """A run's ``program`` field and its array (keyed ``program.jax``), or why it has none;
  ``(None, {})`` for a run that made no forward call (an error case)."""
  made = _program(run)
  field, members = program.described(made)
  if made is not None and field is not None and "member" in field:
    field["weights"] = [{"path": name, "digest": store.digest(model_state.host(leaf))}
                        for name, leaf in made.arguments().items() if name != INPUT]
  return field, members


def _none(line: str) -> dict[str, Any]:
  return {"kind": "none", "line": f"{attribution.NONE}: {line}", "diff": [], "seconds": 0.0}


def attribute(entry: Mapping[str, Any], stored: Mapping[str, np.ndarray], run: Execution,
              row: Row, stamps: tuple[Mapping[str, Any], Mapping[str, Any]]
              ) -> dict[str, Any] | None:
  """Why a failing case moved (the fixture's ``{"kind", "line", "diff", "seconds"}``), or None
  where its baseline holds no program or only its gradients moved.

  Args:
    entry, stored: the case's manifest entry and arrays (keyed without ``<case>/``).
    run: this check's run of it; row: its compared row; stamps: the baseline's and this run's.
  """
  field = entry.get("program")
  if not isinstance(field, dict):
    return None
  forward = [key for key in _FORWARD if key in row.arrays or key in entry["results"]]
  if all((row.arrays.get(key) or {}).get("passed") for key in forward):
    return None
  if run.copies != 1 or run.placement != "one device":
    return _none("a sharded run (--devices) is not attributed; check it on one device")
  made = _program(run)
  if made is None:
    return _none("this run made no forward call")
  arrays = {key: value for key, value in stored.items() if key in _FORWARD}
  arrays[INPUT] = stored["input"]
  if field.get("member") in stored:
    arrays[field["member"]] = stored[field["member"]]
  base = Baseline(Path("."), {"program": field, "model": {"weights": field.get("weights") or []},
                              "stamp": stamps[0]}, arrays)
  rec = Recording(mode="check", tolerances=dict(run.tolerances), program=made)
  return attribution.attribute(base, rec, stamps[1])


def lines(said: Mapping[str, Any]) -> list[str]:
  """The attribution as a row's details: its line, then its StableHLO lines indented."""
  return [said["line"], *(f"    {line}" for line in said.get("diff") or ())]
