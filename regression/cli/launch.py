"""``launch -n N [--local-devices K] [--wait S] [--grace S] [--timeout S] -- COMMAND...``:
the command line of :mod:`nnx_pool.regression.processes.launcher`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .parser import positive_int

USAGE = "nnx-pool-regression launch -n 2 -- pytest tests"


def seconds(text: str) -> float:
  """An argparse type: a positive number of seconds."""
  try:
    value = float(text)
  except ValueError:
    value = 0.0
  if not value > 0:
    raise argparse.ArgumentTypeError(f"must be a positive number of seconds; got {text!r}")
  return value


def add_launch_parser(sub: argparse._SubParsersAction) -> None:
  """The ``launch`` command's options (the command itself follows ``--``)."""
  p = sub.add_parser(
      "launch", help="run a command in N local processes of one JAX run",
      description="Runs the same command in N local processes that form one JAX run "
                  "(jax.distributed, gloo CPU collectives) over N x K simulated CPU devices: "
                  "your nnx_regression tests on a model whose arrays span processes, as on a "
                  "cluster. Each process gets NNX_REGRESSION_COORDINATOR, "
                  "NNX_REGRESSION_PROCESSES, NNX_REGRESSION_PROCESS_ID and "
                  "NNX_REGRESSION_CPU_COLLECTIVES, JAX_PLATFORMS=cpu and XLA_FLAGS with K "
                  "devices; the pytest plugin and the kit's check start the runtime from them, "
                  "a script of yours calls nnx_pool.regression.processes.initialize() first.",
      epilog=f"Example: {USAGE}. python, pytest and nnx-pool-regression run with this "
             "interpreter. Every line is relayed with its process's id ([1] ...). pytest-xdist "
             "(-n) is refused in the processes. Once one process ends, the others have --grace "
             "seconds; then they are terminated. Exit code: 0 when every process exited 0, else "
             "the first failing process's (a signal N as 128 + N); 130 on Ctrl-C; 2 for a "
             "malformed command line. On a cluster, run the command under the cluster's own "
             "launcher instead (docs: guides/13-several-processes.md).")
  p.add_argument("-n", dest="processes", metavar="N", type=positive_int, required=True,
                 help="how many processes")
  p.add_argument("--local-devices", metavar="K", type=positive_int, default=2,
                 help="simulated CPU devices per process (default 2)")
  p.add_argument("--wait", metavar="S", type=seconds,
                 help="seconds a check waits for the other processes to reach it "
                      "(NNX_REGRESSION_WAIT; default 60)")
  p.add_argument("--grace", metavar="S", type=seconds,
                 help="seconds the other processes have to end once one has (default: the "
                      "wait + 30)")
  p.add_argument("--timeout", metavar="S", type=seconds,
                 help="end every process still running after S seconds (default: none)")


def launch_command(argv: Sequence[str]) -> int:
  """``launch ...``: parses ``argv`` (``launch`` first) and runs the launcher."""
  from ..processes.environment import COORDINATOR_ENV, launched
  from ..processes.launcher import launch, xdist_workers
  from .parser import make_parser

  argv = list(argv)
  cut = argv.index("--") if "--" in argv else len(argv)
  args, extra = make_parser().parse_known_args(argv[:cut])  # -h exits here
  command = argv[cut + 1:]
  if cut == len(argv) or extra:
    print(f"error: launch: give the command after --: {USAGE}", file=sys.stderr)
    return 2
  if not command:
    print(f"error: launch: no command after --: {USAGE}", file=sys.stderr)
    return 2
  workers = xdist_workers(command)
  if workers is not None:
    print(f"error: launch: pytest-xdist (-n {workers}) cannot run in a launched process: each "
          "process is one JAX process of a global mesh, and its tests run in it. Drop -n "
          "(launch's own -n gives the processes).", file=sys.stderr)
    return 2
  try:
    nested = launched()
  except ValueError:
    nested = True
  if nested:
    print(f"error: launch: this is already a launched process ({COORDINATOR_ENV} is set); "
          "launch from a plain shell.", file=sys.stderr)
    return 2
  return launch(command, args.processes, local_devices=args.local_devices, wait=args.wait,
                grace=args.grace, timeout=args.timeout)
