"""``nnx-pool-regression launch -n N -- COMMAND``: the same command in N local processes, which
form one JAX run over N x K simulated CPU devices, with one exit status.

Each process gets the variables of :mod:`~nnx_pool.regression.processes.environment` (the
coordinator on a free local port, the process count and its id, gloo as the CPU
collectives), ``JAX_PLATFORMS=cpu``, ``XLA_FLAGS=--xla_force_host_platform_device_count=K``
and the coordinator's bind address (local only);
what starts the runtime in it is the pytest plugin, the kit's ``check``, or your script's
call of :func:`~nnx_pool.regression.processes.initialize`. Every line a process prints is
relayed with its id (``[1] ...``). When one process ends, the others have ``grace``
seconds to end too, then they are terminated (killed 5 s later if need be); so they are
after ``timeout`` seconds, and on Ctrl-C. The status is 0 when every process exited 0,
else the first failing process's (by id; a signal N as 128 + N). Nothing here imports JAX,
nor uses a call that only POSIX has: it runs wherever Python does.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from ..cli.devices import with_device_count
from .environment import (
  COLLECTIVES_ENV,
  COORDINATOR_ENV,
  PROCESS_ID_ENV,
  PROCESSES_ENV,
  WAIT_ENV,
  wait_seconds,
)

# How long a terminated process has before it is killed.
_KILL_AFTER_S = 5.0
# How often the launcher looks at its processes.
_POLL_S = 0.05


def free_port() -> int:
  """A TCP port that is free on this host now (bound to port 0, then released)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return int(s.getsockname()[1])


def resolve(command: Sequence[str]) -> list[str]:
  """``python``, ``pytest`` and ``nnx-pool-regression`` as this interpreter runs them, so that
  every process has the launcher's environment; any other command as given."""
  head, rest = command[0], list(command[1:])
  if head in ("python", "python3"):
    return [sys.executable, *rest]
  if head in ("pytest", "py.test"):
    return [sys.executable, "-m", "pytest", *rest]
  if head == "nnx-pool-regression":
    return [sys.executable, "-m", "nnx_pool.regression", *rest]
  return list(command)


def xdist_workers(command: Sequence[str]) -> str | None:
  """The pytest-xdist workers a pytest command asks for (``-n 2``, ``-nauto``), else None."""
  argv = resolve(command)
  if argv[1:3] != ["-m", "pytest"]:
    return None
  args = argv[3:]
  for i, arg in enumerate(args):
    if arg == "--":
      break
    value = None
    if arg in ("-n", "--numprocesses") and i + 1 < len(args):
      value = args[i + 1]
    elif arg.startswith("--numprocesses="):
      value = arg.partition("=")[2]
    elif arg.startswith("-n") and len(arg) > 2 and not arg.startswith("--"):
      value = arg[2:]
    if value is not None and value != "0":
      return value
  return None


def child_environment(base: Mapping[str, str], index: int, processes: int, port: int,
                      local_devices: int, wait: float | None) -> dict[str, str]:
  """The environment of process ``index``: ``base`` and the launcher's variables."""
  env = dict(base)
  env.update({COORDINATOR_ENV: f"127.0.0.1:{port}", PROCESSES_ENV: str(processes),
              PROCESS_ID_ENV: str(index), COLLECTIVES_ENV: "gloo", "JAX_PLATFORMS": "cpu",
              # JAX binds the coordinator to every address by default; this one is local.
              "JAX_COORDINATOR_BIND_ADDRESS": f"127.0.0.1:{port}",
              "XLA_FLAGS": with_device_count(base.get("XLA_FLAGS", ""), local_devices),
              "PYTHONUNBUFFERED": "1"})
  if wait is not None:
    env[WAIT_ENV] = f"{wait:g}"
  return env


def describe(status: int | None) -> str:
  """``exit 0``, ``exit 1``, ``killed by SIGKILL`` or ``running``."""
  if status is None:
    return "running"
  if status >= 0:
    return f"exit {status}"
  try:
    return f"killed by {signal.Signals(-status).name}"
  except ValueError:
    return f"killed by signal {-status}"


def overall(statuses: Sequence[int | None]) -> int:
  """One status for all: 0 when every process exited 0, else the first other (by id)."""
  for status in statuses:
    if status:
      return 128 - status if status < 0 else status
  return 0


def _relay(index: int, stream: IO[bytes], out: IO[str], lock: threading.Lock) -> None:
  for raw in iter(stream.readline, b""):
    line = raw.decode("utf-8", "replace").rstrip("\r\n")
    with lock:
      out.write(f"[{index}] {line}\n")
      out.flush()
  stream.close()


def _end(procs: Sequence[subprocess.Popen], *, interrupt: bool = False) -> None:
  """Ends every process still running: SIGINT (``interrupt``, POSIX) or terminate, then
  kill those still there after a few seconds."""
  running = [p for p in procs if p.poll() is None]
  for p in running:
    try:
      if interrupt and os.name == "posix":
        p.send_signal(signal.SIGINT)
      else:
        p.terminate()
    except OSError:  # it ended meanwhile
      pass
  deadline = time.monotonic() + (2 * _KILL_AFTER_S if interrupt else _KILL_AFTER_S)
  for p in running:
    try:
      p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


def launch(command: Sequence[str], processes: int, *, local_devices: int = 2,
           wait: float | None = None, grace: float | None = None, timeout: float | None = None,
           out: IO[str] | None = None, err: IO[str] | None = None,
           environ: Mapping[str, str] | None = None) -> int:
  """Runs ``command`` in ``processes`` local processes of one JAX run; returns one status.

  Args:
    command: the command and its arguments (``python``, ``pytest`` and
      ``nnx-pool-regression`` run with this interpreter).
    processes: how many processes.
    local_devices: simulated CPU devices per process.
    wait: seconds a check waits for the other processes (``NNX_REGRESSION_WAIT``; default:
      the variable's value in this environment, else 60).
    grace: seconds the other processes have to end once one has (default: the wait + 30).
    timeout: seconds after which every process still running is ended (default: none).
    out, err: where the processes' lines and the launcher's own go (stdout, stderr).
    environ: the environment the processes start from (default: this one).
  """
  lines: IO[str] = sys.stdout if out is None else out
  notes: IO[str] = sys.stderr if err is None else err
  base = dict(os.environ if environ is None else environ)
  if grace is None:
    grace = (wait if wait is not None else wait_seconds(base)) + 30.0
  port = free_port()
  argv = resolve(command)
  lock = threading.Lock()
  procs: list[subprocess.Popen] = []
  relays: list[threading.Thread] = []
  note = _Notes(notes, lock)
  start = time.monotonic()
  interrupted = False
  previous = _on_sigterm()
  try:
    for index in range(processes):
      try:
        proc = subprocess.Popen(
            argv, env=child_environment(base, index, processes, port, local_devices, wait),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
      except OSError as e:  # no such command, not executable
        note(f"could not start {argv[0]!r}: {e.strerror or e}; nothing ran")
        return 2
      procs.append(proc)
      relay = threading.Thread(target=_relay, args=(index, proc.stdout, lines, lock),
                               daemon=True)
      relay.start()
      relays.append(relay)
    _watch(procs, grace, timeout, start, note)
  except KeyboardInterrupt:
    interrupted = True
    note("interrupted: ending the processes")
    _end(procs, interrupt=True)
  finally:
    _end(procs)
    _restore_sigterm(previous)
    for relay in relays:
      relay.join(timeout=5.0)
  statuses = [p.returncode for p in procs]
  note(f"{processes} processes, {time.monotonic() - start:.1f} s: " + "; ".join(
      f"process {i} {describe(s)}" for i, s in enumerate(statuses)))
  return 130 if interrupted else overall(statuses)


class _Notes:
  """The launcher's own lines (``launch: ...``), on ``err``."""

  def __init__(self, err: IO[str], lock: threading.Lock):
    self.err, self.lock = err, lock

  def __call__(self, text: str) -> None:
    with self.lock:
      self.err.write(f"launch: {text}\n")
      self.err.flush()


def _watch(procs: Sequence[subprocess.Popen], grace: float, timeout: float | None,
           start: float, note: _Notes) -> None:
  """Waits for every process; ends the rest ``grace`` s after the first ended, or all after
  ``timeout`` s."""
  first_end = None
  while True:
    statuses = [p.poll() for p in procs]
    if all(s is not None for s in statuses):
      return
    now = time.monotonic()
    if first_end is None and any(s is not None for s in statuses):
      first_end = now
      ended = [f"process {i} ({describe(s)})" for i, s in enumerate(statuses) if s is not None]
      note(f"{', '.join(ended)} ended at {now - start:.1f} s; the others have {grace:g} s to "
           "end (--grace)")
    if first_end is not None and now - first_end > grace:
      running = [str(i) for i, s in enumerate(statuses) if s is None]
      note(f"process(es) {', '.join(running)} did not end within {grace:g} s of the first; "
           f"ending them at {now - start:.1f} s")
      return
    if timeout is not None and now - start > timeout:
      note(f"the processes ran past --timeout {timeout:g} s; ending them")
      return
    time.sleep(_POLL_S)


def _on_sigterm() -> Any:
  """A SIGTERM to the launcher ends its processes as Ctrl-C does (main thread only)."""
  def handler(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
  try:
    return signal.signal(signal.SIGTERM, handler)
  except ValueError:  # not the main thread
    return None


def _restore_sigterm(previous: Any) -> None:
  if previous is not None:
    try:
      signal.signal(signal.SIGTERM, previous)
    except ValueError:
      pass
