"""The numeric half of the ``nnx_regression`` fixture: run, store, compare.

Kept apart from :mod:`nnx_pool.regression.pytest_plugin` so that loading the plugin
does not import JAX; this module is imported on the first ``check`` call.

Arrays are keyed ``input/<i>``, ``weights/<path>`` (the module's
``nnx.Param`` leaves), ``output[/<path>]`` (the jit result, one per output
leaf) and ``output_eager[/<path>]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from nnx_pool.regression import store
from nnx_pool.regression.compare import compare_arrays
from nnx_pool.regression.report import Report, Row, Timing, recorded_label, render
from nnx_pool.regression.runner import compile_and_time, param_arrays, split_callable, to_numpy
from nnx_pool.regression.stamp import stamp_changes
from nnx_pool.regression.store import BaselineError
from nnx_pool.regression.tolerance import Tolerance, tolerance_for

KIND = "pytest"


@dataclasses.dataclass
class FixtureRun:
  """One evaluation of a user's module or function."""

  inputs: dict[str, np.ndarray]
  weights: dict[str, np.ndarray]
  results: dict[str, np.ndarray]
  tolerances: dict[str, Tolerance]
  jit_eager_agree: bool
  compile_s: float
  steady_s: float


def _flatten(prefix: str, tree: Any) -> dict[str, np.ndarray]:
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  out = {}
  for path, leaf in leaves:
    suffix = jax.tree_util.keystr(path, simple=True, separator="/")
    out[f"{prefix}/{suffix}" if suffix else prefix] = to_numpy(leaf)
  return out


def _as_input(value: Any, index: int) -> jax.Array:
  if isinstance(value, (jax.Array, np.ndarray, np.generic, int, float, bool)):
    return jnp.asarray(value)
  raise TypeError(
      f"`inputs[{index}]` must be an array; got {type(value).__name__}. "
      "Pass arrays positionally: check(name, module, x, y)."
  )


def execute(
    module_or_fn: Any, inputs: Sequence[Any], *, rtol: float | None, atol: float | None
) -> FixtureRun:
  """Runs ``module_or_fn(*inputs)`` under jit (after warmup) and eagerly."""
  xs = tuple(_as_input(x, i) for i, x in enumerate(inputs))
  apply, params = split_callable(module_or_fn)
  out_jit, compile_s, steady_s = compile_and_time(apply, (params, *xs))
  out_eager = apply(params, *xs)
  results = {**_flatten("output", out_jit), **_flatten("output_eager", out_eager)}
  tolerances = {
      key: tolerance_for("model", "output", value.dtype, rtol=rtol, atol=atol)
      for key, value in results.items()
  }
  agree = True
  for key, value in results.items():
    eager = key.replace("output", "output_eager", 1)
    if not key.startswith("output_eager") and eager in results:
      agree = agree and compare_arrays(results[eager], value, tolerances[key]).passed
  return FixtureRun(
      inputs={f"input/{i}": to_numpy(x) for i, x in enumerate(xs)},
      weights={f"weights/{k}": v for k, v in param_arrays(params).items()},
      results=results, tolerances=tolerances, jit_eager_agree=agree,
      compile_s=compile_s, steady_s=steady_s,
  )


def stamp_label(stamp: Mapping[str, Any]) -> str:
  """``jax 0.10.2, cpu`` for messages."""
  versions = stamp.get("versions", {})
  backend = stamp.get("backend", {})
  return f"jax {versions.get('jax')}, flax {versions.get('flax')}, {backend.get('platform')}"


def write(path: Path, run: FixtureRun, stamp: Mapping[str, Any], *, nodeid: str, name: str) -> None:
  """Writes (or replaces) the baseline at ``path``."""
  fields = {
      "kind": KIND,
      "stamp": dict(stamp),
      "test": nodeid,
      "name": name,
      "inputs": sorted(run.inputs),
      "weights": sorted(run.weights),
      "results": {k: t.to_json() for k, t in sorted(run.tolerances.items())},
      "jit_eager_agree": run.jit_eager_agree,
      "timing": {"compile_s": run.compile_s, "steady_s": run.steady_s},
  }
  store.write_baseline(path, fields, {**run.inputs, **run.weights, **run.results}, force=True)


def compare(path: Path, run: FixtureRun, stamp: Mapping[str, Any], *, name: str) -> str | None:
  """Compares a run with the baseline at ``path``; returns a failure report or None."""
  try:
    base = store.read_baseline(path)
  except BaselineError as e:
    return f"nnx_regression: {e}"
  manifest = base.manifest
  if manifest.get("kind") != KIND:
    return f"nnx_regression: baseline {path} is not a pytest fixture baseline."
  report = Report(
      command="check", baseline=str(path), recorded=recorded_label(manifest), unit="arrays"
  )
  report.stamp_changes = stamp_changes(manifest.get("stamp", {}), stamp)
  timing = manifest.get("timing", {})
  report.timings.append(
      Timing(name, timing.get("compile_s"), run.compile_s, timing.get("steady_s"), run.steady_s)
  )
  problems = []
  base_inputs = {k for k in base.arrays if k.startswith("input/")}
  if base_inputs != set(run.inputs):
    problems.append(
        f"the test passes {len(run.inputs)} input(s); the baseline has {len(base_inputs)}"
    )
  for key in sorted(base_inputs & set(run.inputs)):
    if store.digest(run.inputs[key]) != store.digest(base.arrays[key]):
      problems.append(
          f"{key} differs from the baseline's (shape, dtype or values); the comparison needs "
          "the same inputs. Pass --nnx-regression-update if the change is deliberate."
      )
  changed_weights = sorted(
      k for k in set(run.weights) | {k for k in base.arrays if k.startswith("weights/")}
      if k not in run.weights or k not in base.arrays
      or store.digest(run.weights[k]) != store.digest(base.arrays[k])
  )
  if changed_weights:
    problems.append(
        f"parameters differ from the baseline ({', '.join(changed_weights[:3])}"
        f"{', ...' if len(changed_weights) > 3 else ''}): did initialisation change (PRNG "
        "defaults, shapes)? Outputs are compared anyway."
    )
  expected = {k for k in base.arrays if k.startswith("output")}
  for key in sorted(expected | set(run.results)):
    row = Row(f"{name}:{key}", "PASS", 0.0, 0.0)
    if key not in run.results or key not in expected:
      row.status = "FAIL"
      row.max_abs = row.max_rel = None
      row.details.append("in the baseline but not produced now" if key in expected
                         else "produced now but not in the baseline")
    else:
      tol = run.tolerances[key]
      verdict = compare_arrays(run.results[key], base.arrays[key], tol)
      row.tolerance = tol.describe()
      row.max_abs, row.max_rel = verdict.max_abs, verdict.max_rel
      if not verdict.passed:
        row.status = "FAIL"
        row.details.append(verdict.message)
    report.rows.append(row)
  if manifest.get("jit_eager_agree") and not run.jit_eager_agree:
    problems.append("jit and eager results agreed in the baseline and now disagree")
  if not problems and not any(r.status != "PASS" for r in report.rows):
    return None
  report.notes = problems
  return f"nnx_regression: {name!r} differs from its baseline {path}\n{render(report)}"
