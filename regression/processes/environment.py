"""The environment variables that say this process is one of several, read without JAX.

``nnx-pool-regression launch`` sets them in each process it starts; on a cluster you set
them yourself (or ``NNX_REGRESSION_COORDINATOR=auto``), and
:func:`~nnx_pool.regression.processes.initialize` reads them. Nothing here imports JAX: the
pytest plugin reads them in every session.

* ``NNX_REGRESSION_COORDINATOR``: ``host:port`` of process 0's coordinator, or ``auto`` to
  let ``jax.distributed.initialize()`` find everything itself (SLURM, Open MPI, Cloud TPU,
  Kubernetes); unset, nothing is initialized.
* ``NNX_REGRESSION_PROCESSES``: how many processes (not with ``auto``).
* ``NNX_REGRESSION_PROCESS_ID``: this process's id, 0 to processes - 1 (not with ``auto``).
* ``NNX_REGRESSION_CPU_COLLECTIVES``: the CPU collectives to use across processes
  (``gloo``; unset: JAX's default).
* ``NNX_REGRESSION_WAIT``: seconds a check waits for the other processes to reach it
  (default 60), set with or without the others.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

COORDINATOR_ENV = "NNX_REGRESSION_COORDINATOR"
PROCESSES_ENV = "NNX_REGRESSION_PROCESSES"
PROCESS_ID_ENV = "NNX_REGRESSION_PROCESS_ID"
COLLECTIVES_ENV = "NNX_REGRESSION_CPU_COLLECTIVES"
WAIT_ENV = "NNX_REGRESSION_WAIT"
# The coordinator value that hands everything to jax.distributed.initialize()'s detection.
AUTO = "auto"
# Below JAX's heartbeat timeout (100 s), so that a dead peer is named before the runtime
# aborts the survivors.
DEFAULT_WAIT = 60.0


@dataclasses.dataclass(frozen=True)
class Launched:
  """What the variables say: ``coordinator`` (``host:port`` or ``auto``), ``processes`` and
  ``process_id`` (None with ``auto``), ``collectives`` (None: JAX's default)."""

  coordinator: str
  processes: int | None
  process_id: int | None
  collectives: str | None


def _integer(environ: Mapping[str, str], name: str, low: int) -> int:
  text = environ.get(name, "")
  try:
    value = int(text)
  except ValueError:
    value = low - 1
  if value < low:
    raise ValueError(f"{name}={text!r}: expected an integer >= {low}; "
                     f"{COORDINATOR_ENV}={environ.get(COORDINATOR_ENV)!r} needs it.")
  return value


def launched(environ: Mapping[str, str] | None = None) -> Launched | None:
  """The launcher's variables, or None when ``NNX_REGRESSION_COORDINATOR`` is unset.

  Raises:
    ValueError: a variable is missing or malformed (the message names it and its value).
  """
  environ = os.environ if environ is None else environ
  coordinator = environ.get(COORDINATOR_ENV, "").strip()
  if not coordinator:
    return None
  collectives = environ.get(COLLECTIVES_ENV, "").strip() or None
  if coordinator == AUTO:
    return Launched(AUTO, None, None, collectives)
  host, _, port = coordinator.rpartition(":")
  if not host or not port.isdigit():
    raise ValueError(f"{COORDINATOR_ENV}={coordinator!r}: expected host:port (127.0.0.1:4321) "
                     f"or {AUTO!r}.")
  processes = _integer(environ, PROCESSES_ENV, 1)
  process_id = _integer(environ, PROCESS_ID_ENV, 0)
  if process_id >= processes:
    raise ValueError(f"{PROCESS_ID_ENV}={process_id} is not below {PROCESSES_ENV}={processes}; "
                     "the ids run from 0 to processes - 1.")
  return Launched(coordinator, processes, process_id, collectives)


def wait_seconds(environ: Mapping[str, str] | None = None) -> float:
  """How long a check waits for the other processes (``NNX_REGRESSION_WAIT``, default 60 s).

  Raises:
    ValueError: the variable is not a positive number.
  """
  environ = os.environ if environ is None else environ
  text = environ.get(WAIT_ENV, "").strip()
  if not text:
    return DEFAULT_WAIT
  try:
    value = float(text)
  except ValueError:
    value = 0.0
  if not value > 0:
    raise ValueError(f"{WAIT_ENV}={text!r}: expected a positive number of seconds.")
  return value

