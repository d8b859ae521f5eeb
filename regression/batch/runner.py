"""Runs one case of the batch through the pipeline of :mod:`nnx_pool.regression.runner`.

:func:`run_case` builds the case's module, reads its stored inputs (or generates them),
runs it under jit and eagerly, takes the gradient for the stored cotangent (and the
parameters', for gates), and gives every result its tolerance; an error case instead
checks what the module raises. This is the part of running that knows the batch's
:class:`~nnx_pool.regression.batch.declare.Case`; the ``nnx_regression`` fixture runs users'
modules through the runner without it.

Sharded runs (``check --devices N``): given a mesh of N devices with one axis,
:data:`~nnx_pool.regression.constants.BATCH_AXIS` (:func:`make_mesh`), a batched input
is repeated N times along its batch axis and sharded over the mesh, one copy per
device; the cotangent likewise; parameters are replicated. Every copy of every result
must then match the baseline (:func:`~nnx_pool.regression.runner.split_copies`).
Unbatched inputs and error cases run replicated on the mesh.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..compare.tolerance import is_float, tolerance_for
from ..constants import BATCH_AXIS
from ..describe import error_line
from ..processes.batch import ProcessesError, case_gate
from ..runner import (
  Apply,
  Execution,
  evaluate,
  param_arrays,
  role_of,
  settle,
  split_callable,
  split_copies,
  to_numpy,
  with_params,
)
from .declare import Case, ErrorSpec
from .inputs import make_cotangent, make_input

AXIS_TYPES = ("explicit", "auto")
# Inputs without a batch axis (see nnx_pool.regression.batch.inputs.INPUTS): never repeated.
UNBATCHED_INPUTS = frozenset({"unbatched"})


def make_mesh(devices: int, axis_types: str = "explicit") -> Any:
  """A one-axis mesh (``"batch"``) over the first ``devices`` devices of the default backend.

  Args:
    devices: how many devices.
    axis_types: ``"explicit"`` (sharding in types; the default of
      ``jax.make_mesh`` in jax 0.10) or ``"auto"`` (the compiler propagates
      shardings, as a ``jax.sharding.Mesh`` built by hand).

  Raises:
    ValueError: fewer devices are visible, or ``axis_types`` is unknown.
  """
  if axis_types not in AXIS_TYPES:
    raise ValueError(f"`axis_types` must be one of {AXIS_TYPES}; got {axis_types!r}.")
  available = jax.devices()
  if len(available) < devices:
    raise ValueError(
        f"--devices {devices}: JAX sees {len(available)} {available[0].platform} device(s). "
        "Simulated CPU devices need XLA_FLAGS=--xla_force_host_platform_device_count="
        f"{devices} set before JAX initialises (and JAX_PLATFORMS=cpu on a machine "
        "with an accelerator)."
    )
  kind = getattr(jax.sharding.AxisType, axis_types.capitalize())
  return jax.make_mesh(
      (devices,), (BATCH_AXIS,), axis_types=(kind,), devices=available[:devices])


def _mesh_size(mesh: Any) -> int:
  return int(mesh.shape[BATCH_AXIS])


def _place(case: Case, x_np: np.ndarray, mesh: Any) -> tuple[jax.Array, int, str]:
  """Places a case's input on the mesh: ``(array, copies, description)``."""
  from jax.sharding import NamedSharding, PartitionSpec

  n = _mesh_size(mesh)
  if case.raises is not None or case.input in UNBATCHED_INPUTS or x_np.ndim == 0:
    why = "an error case" if case.raises is not None else "no batch axis"
    x = _put(x_np, NamedSharding(mesh, PartitionSpec()))
    return x, 1, f"replicated on {n} devices ({why})"
  tiled = np.concatenate([x_np] * n, axis=0)
  x = _put(tiled, NamedSharding(mesh, PartitionSpec(BATCH_AXIS)))
  return x, n, f"batch of {x_np.shape[0]} repeated {n} times, sharded over {n} devices"


def _put(values: np.ndarray, sharding: Any) -> jax.Array:
  """``values`` placed as ``sharding`` says, each process placing its own shards from its own
  copy: across processes ``jax.device_put`` first checks that every process holds equal
  values, which an array holding NaN never does."""
  values = np.asarray(values, jax.dtypes.canonicalize_dtype(values.dtype))
  return jax.make_array_from_callback(values.shape, sharding, lambda index: values[index])


def _replicate(tree: Any, mesh: Any) -> Any:
  from jax.sharding import NamedSharding, PartitionSpec

  if tree is None:
    return None
  return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))


def _expect_raise(case: Case, apply: Apply, params: Any, rest: Any, x: jax.Array,
                  run: Execution) -> None:
  spec: ErrorSpec = case.raises  # pyright: ignore[reportAssignmentType]  # run only when set
  try:
    apply(params, rest, x)
  except Exception as e:  # noqa: BLE001 - the point is to see what is raised
    run.raised = {"type": type(e).__name__, "message": str(e)}
    if type(e).__name__ != spec.type:
      run.error = f"raises {type(e).__name__} instead of {spec.type}: {error_line(e)}"
    elif not re.search(spec.pattern, str(e)):
      run.error = f"the {spec.type} message no longer matches {spec.pattern!r}: {str(e)!r}"
    return
  run.error = f"no longer raises {spec.type} (matching {spec.pattern!r})"


def _split_output(case: Case, out: Any) -> dict[str, Any]:
  if not case.indices:
    return {"output": out}
  if not (isinstance(out, tuple) and len(out) == 2):
    raise TypeError(
        f"case {case.name!r} declares indices but the module returned {type(out).__name__}."
    )
  return {"output": out[0], "indices": out[1]}


def run_case(
    case: Case, stored: Mapping[str, np.ndarray] | None = None, *, reps: int = 20,
    mesh: Any = None,
) -> Execution:
  """Runs one case.

  Args:
    case: the case.
    stored: the case's stored inputs from a baseline (``input``, and where
      present ``cotangent`` and ``weights/...``); None generates them. A stored
      cotangent that no longer fits the output (its shape or dtype moved) is
      generated anew, so that the comparison reports the output that moved.
    reps: the most timed steady-state calls.
    mesh: a mesh from :func:`make_mesh` to run sharded on (default: one device).

  Returns:
    An :class:`Execution`; an unexpected exception is caught into ``error``.
  """
  run = Execution()
  try:
    with case_gate(case.name) as gate:  # several processes agree first (processes/batch.py)
      try:
        _run(case, dict(stored or {}), run, reps, mesh)
      except Exception as e:  # noqa: BLE001 - reported as the case's status
        run.error = error_line(e)
      gate(run.error)  # where nothing ran across processes: tell the others how it went
  except ProcessesError as e:
    run.error = run.error or error_line(e)
  return run


def _run(
    case: Case, stored: dict[str, np.ndarray], run: Execution, reps: int, mesh: Any
) -> None:
  x_np = stored["input"] if "input" in stored else make_input(case.input, case.dtype)
  run.inputs["input"] = x_np
  apply, params, rest = split_callable(case.build())
  weights = {k.removeprefix("weights/"): v for k, v in stored.items() if k.startswith("weights/")}
  if params is not None and weights:
    params = with_params(params, weights)
  run.inputs.update({f"weights/{k}": v for k, v in param_arrays(params).items()})
  if mesh is None:
    x = jnp.asarray(x_np)
  else:
    x, run.copies, run.placement = _place(case, x_np, mesh)
    params, rest = _replicate(params, mesh), _replicate(rest, mesh)
  if case.raises is not None:
    _expect_raise(case, apply, params, rest, x, run)
    return
  evaluate(run, apply, (params, rest, x), lambda out: _split_output(case, out), reps=reps)
  run.call = apply, (params, rest, x)
  if case.grad and is_float(x_np.dtype):
    _gradients(case, apply, params, rest, x, stored, run, mesh)
  settle(run, lambda key, dtype: tolerance_for(case.tolerance, role_of(key), dtype))


def _gradients(
    case: Case, apply: Apply, params: Any, rest: Any, x: jax.Array,
    stored: Mapping[str, np.ndarray], run: Execution, mesh: Any = None,
) -> None:
  values = split_copies("output", run.results["output"], run.copies)[0]
  ct_np = stored.get("cotangent")
  if ct_np is None or ct_np.shape != values.shape or ct_np.dtype != values.dtype:
    # None stored, or the output's shape or dtype moved: the VJP could not take the stored one,
    # and the report should say that the output moved, not fail inside jax.vjp.
    ct_np = make_cotangent(values.shape, values.dtype)
  run.inputs["cotangent"] = ct_np
  if mesh is None:
    ct = jnp.asarray(ct_np)
  elif run.copies > 1:
    from jax.sharding import NamedSharding, PartitionSpec

    tiled = np.concatenate([ct_np] * run.copies, axis=0)
    ct = _put(tiled, NamedSharding(mesh, PartitionSpec(BATCH_AXIS)))
  else:
    ct = _replicate(jnp.asarray(ct_np), mesh)

  def vjp(p, r, x, ct):
    def primal(p, x):
      out = apply(p, r, x)
      return out[0] if case.indices else out

    if case.params and p is not None:
      _, pull = jax.vjp(primal, p, x)
      return pull(ct)
    _, pull = jax.vjp(lambda x: primal(p, x), x)
    return None, pull(ct)[0]

  grad_params, grad_x = jax.jit(vjp)(params, rest, x, ct)
  run.results["grad/input"] = to_numpy(grad_x)
  for path, value in param_arrays(grad_params).items():
    run.results[f"grad/params/{path}"] = value
