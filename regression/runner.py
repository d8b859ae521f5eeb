"""The run-and-compare pipeline, shared by the CLI's batch and the pytest fixture.

:func:`evaluate` compiles a callable, warms it up, times it, and records its
jit and eager results; :func:`settle` gives each result its tolerance and says
whether jit and eager agree; :func:`compare_results` checks each result against
a baseline's. :mod:`nnx_pool.regression.batch.runner` runs one batch case through
the first two, plus gradients for a fixed cotangent;
``nnx_pool.regression.fixture.running`` runs a user's module through the same three.

Everything a run computes is returned as NumPy arrays keyed by role:

* ``output`` / ``output_eager``: the result under ``jax.jit`` and eagerly;
* ``indices`` / ``indices_eager``: argmax indices, for modules that return them;
* ``grad/input`` and ``grad/params/<path>``: the VJP for the stored cotangent.

What the run consumes is returned too, so a recording can store it:
``input``, ``cotangent`` and ``weights/<path>`` (an ``nnx.Param`` each).

Timing separates compile time (``lower`` + ``compile``) from the steady state:
the median of repeated calls after two warmup calls, each ended by
``block_until_ready``.

A sharded run (``check --devices N``) holds ``copies`` copies of the stored batch
along the batch axis; :func:`compare_results` compares each of them with the
baseline (:func:`split_copies`).
"""

from __future__ import annotations

import dataclasses
import re
import statistics
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .compare import Verdict, compare_arrays
from .compare.tolerance import Tolerance
from .processes.arrays import to_host
from .processes.gate import before_collective

Apply = Callable[..., Any]

_RESULT_ROLES = (
    ("output", "output"),
    ("indices", "indices"),
    ("grad/input", "grad_input"),
    ("grad/params/", "grad_params"),
)


def role_of(key: str) -> str:
  """The tolerance role of a result key (``output_eager`` -> ``output``)."""
  for prefix, role in _RESULT_ROLES:
    if key.startswith(prefix):
      return role
  raise ValueError(f"`key` is not a result key; got {key!r}.")


@dataclasses.dataclass
class Execution:
  """What running a case produced.

  Attributes:
    results: result arrays by key (``output``, ``grad/input``, ...).
    inputs: consumed arrays by key (``input``, ``cotangent``, ``weights/...``).
    tolerances: the tolerance of each result key.
    jit_eager_agree: whether jit and eager results agree within tolerance.
    compile_s: seconds to lower and compile the forward pass.
    steady_s: median seconds per forward call after warmup.
    raised: for an error case, ``{"type": ..., "message": ...}`` of what was raised.
    error: an unexpected failure, as ``Type: message``; None when it ran.
    copies: how many copies of the stored batch the results hold (sharded runs;
      1 otherwise); see :func:`split_copies`.
    placement: how the input was placed on the mesh (sharded runs), for reports.
    call: the jitted forward call, ``(apply, args)``, from which the batch exports its program
      (:mod:`~nnx_pool.regression.batch.programs`); None where none ran.
  """

  results: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  inputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  tolerances: dict[str, Tolerance] = dataclasses.field(default_factory=dict)
  jit_eager_agree: bool | None = None
  compile_s: float | None = None
  steady_s: float | None = None
  raised: dict[str, str] | None = None
  error: str | None = None
  copies: int = 1
  placement: str = "one device"
  call: tuple[Apply, tuple] | None = dataclasses.field(default=None, repr=False)


def to_numpy(x: Any) -> np.ndarray:
  """A host NumPy copy of an array (bfloat16 stays bfloat16); one that spans processes is
  gathered whole (:func:`~nnx_pool.regression.processes.arrays.to_host`)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return to_host(x)
  return np.asarray(jax.device_get(x))


def split_callable(obj: Any, kwargs: Mapping[str, Any] | None = None,
                   keywords: Sequence[str] = (), *,
                   observe: Callable[[nnx.Module, tuple], AbstractContextManager[Any]] | None = None
                   ) -> tuple[Apply, Any, Any]:
  """Turns an NNX module or a function into ``apply(params, rest, *inputs)`` and its state.

  A module is split into its ``nnx.Param`` state and everything else (BatchNorm's
  statistics, RNG state, ...). Both come in as arguments, so that under ``jax.jit``,
  ``jax.grad`` or a transform inside the module (``nnx.grad`` in its ``__call__``) no
  variable was made outside the trace: each call merges a fresh copy
  (``nnx.merge(..., copy=True)``), so calls never mutate the caller's module.

  Args:
    obj: an ``nnx.Module`` or a callable of arrays.
    kwargs: keyword arguments every call gets as they are (``training=False``): closed
      over, so static under ``jax.jit``.
    keywords: the names of the last ``len(keywords)`` inputs, passed by keyword (arrays
      given as keyword arguments, traced under ``jax.jit``).
    observe: for a module, a context manager factory entered around each call of the merged
      copy, given that copy and the call's inputs (the fixture records the submodules' calls
      of the jit trace with :func:`~nnx_pool.regression.fixture.model_state.captured_in`,
      instead of tracing them again).

  Returns:
    ``(apply, params, rest)``; ``params`` and ``rest`` are ``nnx.State`` objects, or None
    for a function.
  """
  static = dict(kwargs or {})
  names = tuple(keywords)

  def call(target: Any, xs: tuple) -> Any:
    positional = len(xs) - len(names)
    return target(*xs[:positional], **static, **dict(zip(names, xs[positional:], strict=True)))

  if isinstance(obj, nnx.Module):
    graphdef, params, rest = nnx.split(obj, nnx.Param, ...)

    def apply(params, rest, *xs):
      model = nnx.merge(graphdef, params, rest, copy=True)
      if observe is None:
        return call(model, xs)
      with observe(model, xs):
        return call(model, xs)

    return apply, params, rest
  if callable(obj):
    return (lambda params, rest, *xs: call(obj, xs)), None, None
  raise TypeError(f"`obj` must be an nnx.Module or a callable; got {type(obj).__name__}.")


def _path(path) -> str:
  text = jax.tree_util.keystr(path, simple=True, separator="/")
  return re.sub(r"/value$", "", text) or "value"


def param_arrays(params: Any) -> dict[str, np.ndarray]:
  """Flattens a params pytree to ``{"fc1/kernel": array}``."""
  if params is None:
    return {}
  leaves, _ = jax.tree_util.tree_flatten_with_path(params)
  return {_path(p): to_numpy(v) for p, v in leaves}


def with_params(params: Any, arrays: Mapping[str, np.ndarray]) -> Any:
  """Replaces every leaf of ``params`` by the stored array of the same path.

  Raises:
    ValueError: the stored weights do not match the module's parameters.
  """
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  paths = [_path(p) for p, _ in leaves]
  if sorted(paths) != sorted(arrays):
    raise ValueError(
        f"stored weights {sorted(arrays)} do not match the module's parameters {sorted(paths)}."
    )
  new = []
  for path, (_, leaf) in zip(paths, leaves, strict=True):
    stored = arrays[path]
    if tuple(stored.shape) != tuple(leaf.shape) or stored.dtype != np.dtype(leaf.dtype):
      raise ValueError(
          f"stored weight {path!r} is {stored.dtype}{list(stored.shape)} but the module's is "
          f"{np.dtype(leaf.dtype)}{list(leaf.shape)}."
      )
    new.append(jnp.asarray(stored))
  return jax.tree_util.tree_unflatten(treedef, new)


def compile_and_time(
    apply: Apply, args: tuple, *, reps: int = 20, budget_s: float = 0.05, jitted: bool = False
) -> tuple[Any, float, float]:
  """Compiles ``apply`` for ``args`` and times it.

  Args:
    apply: the function to jit (with ``jitted``, already jitted: ``jax.jit``'s result).
    args: its arguments (already on the device).
    reps: the most timed calls after warmup (at least 3 are made).
    budget_s: stop timing once this many seconds were spent.

  Across processes every process runs the program as often (3 timed calls), and the
  check's gate is passed after compiling, before the first run.

  Returns:
    ``(jit result, compile seconds, median steady-state seconds)``.
  """
  start = time.perf_counter()
  compiled = (apply if jitted else jax.jit(apply)).lower(*args).compile()  # pyright: ignore[reportFunctionMemberAccess]
  compile_s = time.perf_counter() - start
  before_collective()
  several = jax.process_count() > 1
  out = jax.block_until_ready(compiled(*args))
  jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(max(reps, 3)):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
    if len(times) >= 3 and (several or sum(times) > budget_s):
      break
  return out, compile_s, statistics.median(times)


def eager_key(key: str) -> str:
  """The key of the eager twin of a jit result (``output/0`` -> ``output_eager/0``)."""
  head, sep, rest = key.partition("/")
  return f"{head}_eager{sep}{rest}"


def evaluate(
    run: Execution, apply: Apply, args: tuple, name_outputs: Callable[[Any], Mapping[str, Any]],
    *, reps: int = 20,
) -> None:
  """Fills ``run`` with the jit results (compiled, warmed up, timed) and the eager ones.

  Args:
    run: where results and timings go.
    apply: the function; ``args`` are its arguments, already on the device.
    name_outputs: splits an output into named arrays (``{"output": ..., "indices": ...}``).
    reps: the most timed steady-state calls.
  """
  out_jit, run.compile_s, run.steady_s = compile_and_time(apply, args, reps=reps)
  out_eager = apply(*args)
  for key, value in name_outputs(out_jit).items():
    run.results[key] = to_numpy(value)
  for key, value in name_outputs(out_eager).items():
    run.results[eager_key(key)] = to_numpy(value)


def settle(run: Execution, tolerance: Callable[[str, np.dtype], Tolerance]) -> None:
  """Gives every result its tolerance, then says whether jit and eager results agree."""
  run.tolerances = {key: tolerance(key, value.dtype) for key, value in run.results.items()}
  run.jit_eager_agree = all(
      compare_arrays(run.results[eager_key(key)], value, run.tolerances[key]).passed
      for key, value in run.results.items() if eager_key(key) in run.results
  )


def compare_results(
    run: Execution, expected: Mapping[str, np.ndarray], keys: Collection[str]
) -> dict[str, Verdict | str]:
  """Checks each result of ``run`` against the baseline's array of the same key.

  Args:
    run: a settled run (:func:`settle`).
    expected: the baseline's arrays by key.
    keys: the result keys the baseline holds.

  Returns:
    For every key in either, its :class:`Verdict` (the worst over the copies
    of a sharded run), or why it could not be compared.
  """
  out: dict[str, Verdict | str] = {}
  for key in sorted(set(keys) | set(run.results)):
    if key not in run.results:
      out[key] = "in the baseline but no longer produced"
    elif key not in keys:
      out[key] = "produced now but not in the baseline"
    else:
      out[key] = _compare_copies(key, run.results[key], expected[key], run.tolerances[key],
                                 run.copies)
  return out


def _compare_copies(key: str, actual: np.ndarray, expected: np.ndarray, tol: Tolerance,
                    copies: int) -> Verdict:
  """Compares every copy of a sharded result with the baseline; the worst verdict wins."""
  verdicts = [compare_arrays(a, expected, tol) for a in split_copies(key, actual, copies)]
  worst = Verdict(
      all(v.passed for v in verdicts), max(v.max_abs for v in verdicts),
      max(v.max_rel for v in verdicts), sum(v.mismatches for v in verdicts),
      sum(v.size for v in verdicts), excess=max(v.excess for v in verdicts),
  )
  failed = [(i, v) for i, v in enumerate(verdicts) if not v.passed]
  if failed:
    i, first = failed[0]
    worst.message = first.message if len(verdicts) == 1 else (
        f"{len(failed)} of {len(verdicts)} copies differ; copy {i}: {first.message}")
  return worst


def split_copies(key: str, value: np.ndarray, copies: int) -> list[np.ndarray]:
  """The per-copy results of a sharded run, each comparable with the baseline.

  Outputs, indices and input gradients hold ``copies`` copies along the batch
  axis: they are split into one array per copy. A parameter gradient sums over
  every copy, so it is divided by ``copies`` (in float64, then cast back).
  """
  if copies == 1:
    return [value]
  if role_of(key) == "grad_params":
    return [(value.astype(np.float64) / copies).astype(value.dtype)]
  return list(np.split(value, copies, axis=0))
