"""Starting JAX's distributed runtime from the variables of
:mod:`~nnx_pool.regression.processes.environment`, and only from them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .environment import AUTO, Launched, launched, wait_seconds

# How long a process waits for the others to join at start-up, at least (JAX's default is
# 300 s; a peer that never starts should be named sooner).
_JOIN_S = 60


def initialize(environ: Mapping[str, str] | None = None) -> bool:
  """Initializes ``jax.distributed`` as the launcher's variables say; call it before JAX runs
  anything (before ``jax.devices()``).

  ``nnx-pool-regression launch`` sets the variables; the ``nnx_regression`` pytest plugin
  and the kit's ``check`` call this, and a script of yours run under the launcher calls it
  first. Without the variables it does nothing: on a cluster your own code calls
  ``jax.distributed.initialize()``, or you set ``NNX_REGRESSION_COORDINATOR=auto``.

  Returns:
    Whether it initialized the runtime (False: no variables, or already initialized).

  Raises:
    ValueError: a variable is malformed.
    RuntimeError: JAX ran something before (its backend is up), so it is too late.
  """
  found = launched(environ)
  if found is None:
    return False
  import jax

  if jax.distributed.is_initialized():
    return False
  if found.collectives:
    jax.config.update("jax_cpu_collectives_implementation", found.collectives)
  join = max(_JOIN_S, int(wait_seconds(environ)))
  try:
    if found.coordinator == AUTO:
      jax.distributed.initialize(initialization_timeout=join)
    else:
      jax.distributed.initialize(found.coordinator, num_processes=found.processes,
                                 process_id=found.process_id, initialization_timeout=join)
  except RuntimeError as e:
    raise RuntimeError(f"{_describe(found)}: jax.distributed.initialize failed ({e}). It must "
                       "run before anything asks JAX for its devices.") from e
  return True


def join_problem(xdist_workers: Any, xdist_worker: bool) -> str | None:
  """What the pytest plugin does at the start of a session: in a launched process (the
  variables are set), refuses pytest-xdist and starts the runtime; elsewhere nothing (no
  JAX imported). Returns why the session cannot run (a usage error), or None."""
  try:
    found = launched()
    if found is None:
      return None
    if xdist_workers or xdist_worker:
      return (f"nnx_regression: pytest-xdist (-n {xdist_workers}) cannot run in a launched "
              "process: each launched process is one JAX process of a global mesh, and its "
              "tests run in it. Drop -n (or pass -n 0); `launch -n N` gives the processes.")
    initialize()
  except (ValueError, RuntimeError) as e:
    return f"nnx_regression: {e}"
  return None


def _describe(found: Launched) -> str:
  if found.coordinator == AUTO:
    return f"process {os.getpid()} (coordinator auto)"
  return f"process {found.process_id} of {found.processes} (coordinator {found.coordinator})"
