"""``main``: parses the command line, runs the command, prints its report, returns the exit
code (the commands are listed in :mod:`nnx_pool.regression.cli`)."""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..processes.batch import ProcessesError, join, share_exit
from ..report import Report, html
from ..stamp import SHIPPED, source_checkout
from .devices import provide_devices
from .launch import launch_command
from .outputs import REPORT_ROWS, outputs_problem, print_report, write_json_file
from .parser import make_parser
from .progress import progress_line
from .upgrade_commands import bisect_command, forgotten_dashes, pytest_problem, rehearse_command

BatchFactory = Callable[[], Any]


def run(
    args: argparse.Namespace, batch: BatchFactory | None = None, *,
    progress: Callable[[int, int, str], None] | None = None,
) -> Report:
  """Runs the parsed command and returns its report.

  ``progress`` is passed to ``record`` and ``check`` (see :mod:`nnx_pool.regression.commands`).

  Raises:
    Exception: whatever importing or building the batch raised; :func:`main`
      turns it into exit code 2.
  """
  from .. import commands  # imports JAX; see the module docstring

  if args.command == "info":
    return commands.info()
  if args.command == "diff":
    return commands.diff(args.a, args.b)
  if args.command == "report":
    return _fixture_report(args.baseline, args.obtained)
  if args.command == "record" and args.out is None:
    if source_checkout() is None:
      return Report(command="record", exit_code=2, error=(
          f"record: no --out given, and the shipped baseline lies in the installed package "
          f"({SHIPPED}), which is never written; pass --out DIR to record your own baseline."))
    args.out = str(SHIPPED)
  if batch is None:
    from ..batch import load_batch as batch
  loaded = batch()
  if args.command == "record":
    return commands.record(loaded.cases, args.out, force=args.force, pattern=args.pattern,
                           notes=loaded.notes, progress=progress)
  report = commands.check(
      loaded.cases, args.baseline, pattern=args.pattern, dry_run=args.dry_run, notes=loaded.notes,
      devices=args.devices, axis_types=args.axis_types, progress=progress,
  )
  if args.pytest_result is not None:
    report.pytest = _pytest_result(args.pytest_result)
  return report


def _pytest_result(path: str) -> dict[str, Any] | None:
  """The user's tests' result that ``rehearse`` wrote (``check --pytest-result``); None where
  it cannot be read (the report is whole without it)."""
  try:
    found = json.loads(Path(path).read_text())
  except (OSError, ValueError):
    return None
  return found if isinstance(found, dict) else None


def _fixture_report(path: str, obtained: str | None = None) -> Report:
  """``report DIR [--obtained OBTAINED]``: a fixture baseline against its obtained file."""
  from ..fixture.from_disk import report_from_disk
  from ..store import BaselineError

  try:
    return report_from_disk(path, obtained)
  except BaselineError as e:
    return Report(command="check", exit_code=2, error=str(e))


def main(argv: Sequence[str] | None = None, *, batch: BatchFactory | None = None) -> int:
  """Entry point of ``nnx-pool-regression`` and ``python -m nnx_pool.regression``.

  Args:
    argv: the arguments (default ``sys.argv[1:]``).
    batch: a factory of the cases to run (default: the canonical batch over
      ``nnx_pool``); tests pass a stand-in.

  Returns:
    The exit code.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv[:1] == ["bisect"]:  # its own `--` and refusals: see _bisect
    return bisect_command(argv)
  if argv[:1] == ["launch"]:  # the command to run follows `--`
    return launch_command(argv)
  handed: list[str] = []
  if argv[:1] == ["rehearse"] and "--" in argv:  # pytest's own options, untouched
    cut = argv.index("--")
    argv, handed = argv[:cut], argv[cut + 1:]
  if argv[:1] == ["rehearse"]:
    problem = forgotten_dashes(argv, handed)
    if problem:
      print(f"error: rehearse: {problem}", file=sys.stderr)
      return 2
  args = make_parser().parse_args(argv)
  if args.command == "rehearse":
    problem = pytest_problem(args, handed)
    if problem:
      print(f"error: rehearse: {problem}", file=sys.stderr)
      return 2
    if args.pytest is not None:
      args.pytest = [*args.pytest, *handed]
  group, problem = join(args.command)  # a launched process: one of several
  if not problem and (group is None or group.lead):  # only process 0 writes the outputs
    problem = outputs_problem(args)
  if problem:
    print(f"error: {problem}", file=sys.stderr)
    return 2
  if args.command == "rehearse":
    return rehearse_command(args)
  if getattr(args, "devices", None) and group is None:  # launched: the launcher gave them
    code = provide_devices(args.devices, argv, custom_batch=batch is not None)
    if code is not None:
      return code
  try:
    label = f"{args.command}: case" if args.command in ("check", "record") else None
    with progress_line(label) as progress:
      report = run(args, batch, progress=progress)
  except Exception:  # noqa: BLE001 - an import or build failure: shown whole, exit 2
    traceback.print_exc()
    print(f"error: {args.command}: the regression batch could not be imported or built (the "
          "traceback above says why); nothing was compared.", file=sys.stderr)
    return 2
  if group is not None:
    try:
      code = share_exit(report, group)
    except ProcessesError as e:
      print(f"error: {args.command}: {e}", file=sys.stderr)
      return 2
    if not group.lead:
      print(f"process {group.index} of {group.count}: ran its part; process 0 prints the report "
            f"and writes the files (exit {code})")
      return code
  print_report(report, timing=getattr(args, "timing", False), json_path=args.json,
               limit=REPORT_ROWS if args.command == "report" else None)
  if not write_json_file(report, args.json):
    return 2
  html_path = getattr(args, "html", None)
  if html_path is not None:
    try:
      with progress_line("check --html: figure") as progress:
        html.write_html(report, html_path, progress=progress)
    except OSError as e:
      print(f"error: --html {html_path}: could not write it ({e.strerror or e}); any earlier "
            "file there is unchanged.", file=sys.stderr)
      return 2
    if not report.error:
      print(html.closing_line(html_path))
  return report.exit_code
