"""A batch baseline, and what its three commands share: reading one, a case's entry and arrays.

Baseline arrays are keyed ``<case>/<key>``: the stored inputs (``input``, ``cotangent``,
``weights/<path>``) and the results (``output``, ``output_eager``, ``indices``,
``indices_eager``, ``grad/input``, ``grad/params/<path>``). A case's entry in the manifest
holds its declaration (:meth:`~nnx_pool.regression.batch.declare.Case.describe`), the keys
of its inputs and results, its results' tolerances, its timing and what it raised.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .. import store
from ..compare import Verdict
from ..compare.tolerance import Tolerance
from ..report import Row
from ..store import Baseline, BaselineError
from .declare import Case

KIND = "batch"
_INPUT_KEYS = ("input", "cotangent", "weights/")
_CASE_FIELDS = ("declaration", "inputs", "results", "jit_eager_agree", "timing", "raises")
# Called as progress(n, total, case_name) before the n-th of total cases runs (n from 1).
Progress = Callable[[int, int, str], None]


def is_input(key: str) -> bool:
  """Whether a case's array ``key`` is a stored input (reused by the next run), not a result."""
  return key.startswith(_INPUT_KEYS)


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


def case_arrays(base: Baseline, name: str) -> dict[str, np.ndarray]:
  """The arrays of case ``name`` in ``base``, keyed without the ``<case>/`` prefix."""
  prefix = f"{name}/"
  return {k[len(prefix):]: v for k, v in base.arrays.items() if k.startswith(prefix)}


def case_label(case: Case, tolerances: Mapping[str, Tolerance]) -> str:
  """A row's tolerance column: ``raises ValueError``, the output's tolerance, or ``-``."""
  if case.raises is not None:
    return f"raises {case.raises.type}"
  tol = tolerances.get("output")
  return tol.describe() if tol else "-"


def declaration_changes(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
  """What changed in a case's declaration; a reworded ``note`` is not a change."""
  return [
      f"declaration changed: {key} {before.get(key)!r} -> {now.get(key)!r}; re-record it"
      for key in sorted(set(before) | set(now))
      if key != "note" and before.get(key) != now.get(key)
  ]


def same_layout(a: np.ndarray, b: np.ndarray) -> bool:
  """Whether two arrays have one dtype and one shape (numbers between them mean something)."""
  return a.dtype == b.dtype and a.shape == b.shape


def add_verdict(row: Row, key: str, verdict: Verdict, tol: Tolerance) -> None:
  """One array's numbers into ``row``: its verdict, the row's largest errors, a detail if it
  failed."""
  row.arrays[key] = {**verdict.to_json(), "tolerance": tol.to_json()}
  row.max_abs = max(row.max_abs or 0.0, verdict.max_abs)
  row.max_rel = max(row.max_rel or 0.0, verdict.max_rel)
  if not verdict.passed:
    row.details.append(f"{key}: {verdict.message} [{tol.describe()}]")
