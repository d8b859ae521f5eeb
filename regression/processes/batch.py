"""The kit's ``check`` across processes: ``launch -n 2 -- nnx-pool-regression check --devices 4``.

Each process reads the baseline (the shipped one is installed on every host; a baseline of
your own must be readable by every process, as its stored inputs are what the cases run on),
runs every case on the global mesh (:func:`~nnx_pool.regression.batch.runner.make_mesh` over
all processes' devices) and gathers its results. Before each case's first collective the
processes agree (:func:`case_gate`), so a case that fails in one process is an error row in
all, never a wait. Process 0 prints the report and writes ``--json``/``--html``; it tells the
others its exit code, which they end with (:func:`share_exit`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from .environment import launched
from .gate import gated
from .group import Group, ProcessesError, current

# The commands that run across processes; the others run in one.
ACROSS = ("check", "info")


def join(command: str) -> tuple[Group | None, str | None]:
  """For the command line: in a launched process, starts the runtime.

  Returns:
    ``(group, problem)``: this process's group (None in one process), or why the command
    cannot run (a malformed variable, a command that runs in one process only).
  """
  try:
    found = launched()
    if found is None:
      return None, None
    if command not in ACROSS:
      return None, (f"{command} runs in one process (it writes or reads files once); run it "
                    "outside `launch`, and `check` across processes.")
    from .initialize import initialize

    initialize()
    return current(), None
  except (ValueError, RuntimeError) as e:
    return None, str(e)


@contextlib.contextmanager
def case_gate(name: str) -> Iterator[Callable[[str | None], None]]:
  """Around one case's run: the processes agree before its first collective. Yields the
  gate, which the caller passes at the end with the case's error (a no-op once passed, and
  in one process).

  Raises:
    ProcessesError: the processes are out of step (from an earlier case).
  """
  group = current()
  if group is None:
    yield lambda error: None
    return
  label = f"case {name}"
  number = group.begin(label)
  with gated(lambda error: _agree(group, number, label, error)) as gate:
    yield gate


def _agree(group: Group, number: int, label: str, error: str | None) -> None:
  group.agree(number, label, "ready", error=error)


def share_exit(report: Any, group: Group) -> int:
  """The lead tells the others its report's exit code; every process returns it.

  Raises:
    ProcessesError: the lead gave none within the wait.
  """
  number = group.begin("the report")
  if group.lead:
    report.notes.append(f"{group.count} processes ran it, over {_devices()} devices; this is "
                        "process 0's report")
    group.tell(number, "exit", {"exit_code": report.exit_code})
    return report.exit_code
  return int(group.hear(number, "exit", "the report")["exit_code"])


def _devices() -> int:
  import jax

  return jax.device_count()


__all__ = ["ACROSS", "ProcessesError", "case_gate", "join", "share_exit"]
