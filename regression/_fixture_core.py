"""The numeric half of the ``nnx_regression`` fixture: run, store, compare.

Kept apart from :mod:`nnx_pool.regression.pytest_plugin` so that loading the plugin
does not import JAX; this module is imported on the first ``check`` call. It
runs and compares through the same pipeline as the CLI
(:func:`~nnx_pool.regression.runner.evaluate`, ``settle``, ``compare_results``).

Arrays are keyed ``input/<i>``, ``weights/<path>`` (the module's
``nnx.Param`` leaves), ``output[/<path>]`` (the jit result, one per output
leaf) and ``output_eager[/<path>]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from nnx_pool.regression import store
from nnx_pool.regression.report import Report, Row, Timing, recorded_label, render
from nnx_pool.regression.runner import (
    Execution,
    compare_results,
    evaluate,
    param_arrays,
    settle,
    split_callable,
    to_numpy,
)
from nnx_pool.regression.stamp import stamp_changes
from nnx_pool.regression.store import BaselineError
from nnx_pool.regression.tolerance import tolerance_for

KIND = "pytest"


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
) -> Execution:
  """Runs ``module_or_fn(*inputs)`` under jit (after warmup) and eagerly.

  The run's ``inputs`` hold ``input/<i>`` and ``weights/<path>``.
  """
  xs = tuple(_as_input(x, i) for i, x in enumerate(inputs))
  apply, params = split_callable(module_or_fn)
  run = Execution()
  run.inputs = {f"input/{i}": to_numpy(x) for i, x in enumerate(xs)}
  run.inputs.update({f"weights/{k}": v for k, v in param_arrays(params).items()})
  evaluate(run, apply, (params, *xs), lambda out: _flatten("output", out))
  settle(run, lambda key, dtype: tolerance_for("model", "output", dtype, rtol=rtol, atol=atol))
  return run


def nonfinite_outputs(run: Execution) -> str | None:
  """Why a run's outputs are not all finite (chex's message), or None when they are."""
  floats = {k: v for k, v in run.results.items() if np.issubdtype(v.dtype, np.inexact)
            or v.dtype.name == "bfloat16"}
  try:
    chex.assert_tree_all_finite(floats)
  except AssertionError as e:
    return str(e).strip().splitlines()[0]
  return None


def stamp_label(stamp: Mapping[str, Any]) -> str:
  """``jax 0.10.2, cpu`` for messages."""
  versions = stamp.get("versions", {})
  backend = stamp.get("backend", {})
  return f"jax {versions.get('jax')}, flax {versions.get('flax')}, {backend.get('platform')}"


def _inputs(run: Execution, prefix: str) -> dict[str, np.ndarray]:
  return {k: v for k, v in run.inputs.items() if k.startswith(prefix)}


def write(path: Path, run: Execution, stamp: Mapping[str, Any], *, nodeid: str, name: str) -> None:
  """Writes (or replaces) the baseline at ``path``."""
  fields = {
      "kind": KIND,
      "stamp": dict(stamp),
      "test": nodeid,
      "name": name,
      "inputs": sorted(_inputs(run, "input/")),
      "weights": sorted(_inputs(run, "weights/")),
      "results": {k: t.to_json() for k, t in sorted(run.tolerances.items())},
      "jit_eager_agree": run.jit_eager_agree,
      "timing": {"compile_s": run.compile_s, "steady_s": run.steady_s},
  }
  store.write_baseline(path, fields, {**run.inputs, **run.results}, force=True)


def compare(path: Path, run: Execution, stamp: Mapping[str, Any], *, name: str) -> str | None:
  """Compares a run with the baseline at ``path``; returns a failure report or None."""
  try:
    base = store.read_baseline(path)
  except BaselineError as e:
    return f"nnx_regression: {e}"
  manifest = base.manifest
  if manifest.get("kind") != KIND:
    return f"nnx_regression: baseline {path} is not a pytest fixture baseline."
  report = Report(
      command="check", baseline=str(path), recorded=recorded_label(manifest), unit="arrays",
      stamp=dict(stamp), baseline_stamp=manifest.get("stamp", {}),
  )
  report.stamp_changes = stamp_changes(manifest.get("stamp", {}), stamp)
  timing = manifest.get("timing", {})
  report.timings.append(
      Timing(name, timing.get("compile_s"), run.compile_s, timing.get("steady_s"), run.steady_s)
  )
  problems = _input_problems(base.arrays, run)
  expected = [k for k in base.arrays if k.startswith("output")]
  for key, verdict in compare_results(run, base.arrays, expected).items():
    if isinstance(verdict, str):
      report.rows.append(Row(f"{name}:{key}", "FAIL", details=[verdict]))
      continue
    row = Row(f"{name}:{key}", "PASS" if verdict.passed else "FAIL", verdict.max_abs,
              verdict.max_rel, run.tolerances[key].describe())
    row.details += [] if verdict.passed else [verdict.message]
    report.rows.append(row)
  if manifest.get("jit_eager_agree") and not run.jit_eager_agree:
    problems.append("jit and eager results agreed in the baseline and now disagree")
  if not problems and all(r.status == "PASS" for r in report.rows):
    return None
  report.notes = problems
  return f"nnx_regression: {name!r} differs from its baseline {path}\n{render(report)}"


def _input_problems(stored: Mapping[str, np.ndarray], run: Execution) -> list[str]:
  """What differs between the inputs and weights of the baseline and of this run."""
  problems = []
  inputs, base_inputs = _inputs(run, "input/"), {k for k in stored if k.startswith("input/")}
  if base_inputs != set(inputs):
    problems.append(
        f"the test passes {len(inputs)} input(s); the baseline has {len(base_inputs)}"
    )
  for key in sorted(base_inputs & set(inputs)):
    if store.digest(inputs[key]) != store.digest(stored[key]):
      problems.append(
          f"{key} differs from the baseline's (shape, dtype or values); the comparison needs "
          "the same inputs. Pass --nnx-regression-update if the change is deliberate."
      )
  weights = _inputs(run, "weights/")
  changed_weights = sorted(
      k for k in set(weights) | {k for k in stored if k.startswith("weights/")}
      if k not in weights or k not in stored or store.digest(weights[k]) != store.digest(stored[k])
  )
  if changed_weights:
    problems.append(
        f"parameters differ from the baseline ({', '.join(changed_weights[:3])}"
        f"{', ...' if len(changed_weights) > 3 else ''}): did initialisation change (PRNG "
        "defaults, shapes)? Outputs are compared anyway."
    )
  return problems
