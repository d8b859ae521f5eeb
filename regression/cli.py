"""Command line: ``python -m regression`` or the ``nnx-pool-regression`` script.

Commands:

* ``check [--baseline DIR] [--json OUT] [-k PATTERN] [--dry-run]``: runs the
  batch after JIT warmup and compares it with the baseline (default: the
  shipped ``regression/baseline/``).
* ``record [--out DIR] [--force] [--json OUT]``: runs the batch and writes a
  baseline atomically (default ``--out``: the shipped baseline).
* ``diff A B [--json OUT]``: compares two recorded baselines.
* ``info [--json OUT]``: prints the current environment stamp.

Exit codes: 0 everything passed; 1 a number moved, an error case stopped
raising, a case failed to run, or the baseline is out of date (NEW, GONE,
STALE cases); 2 the baseline is missing, damaged, of a newer format, or may
not be written, with a one-line reason on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from regression import commands
from regression.batch import Batch, load_batch
from regression.report import Report, render, write_json

BatchFactory = Callable[[], Batch]


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="nnx-pool-regression",
      description="Version-stamped numeric regression checks for nnx-pool.",
  )
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

  def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT")

  p = sub.add_parser("check", help="compare the batch with a baseline")
  p.add_argument("--baseline", metavar="DIR", default=str(commands.SHIPPED),
                 help="baseline directory (default: the shipped regression/baseline)")
  p.add_argument("-k", dest="pattern", metavar="PATTERN",
                 help="only cases whose name contains PATTERN or matches it as a glob")
  p.add_argument("--dry-run", action="store_true", help="report drift but exit 0")
  add_json(p)

  p = sub.add_parser("record", help="run the batch and write a baseline")
  p.add_argument("--out", metavar="DIR", default=str(commands.SHIPPED),
                 help="baseline directory (default: the shipped regression/baseline)")
  p.add_argument("--force", action="store_true", help="replace an existing baseline")
  add_json(p)

  p = sub.add_parser("diff", help="compare two recorded baselines")
  p.add_argument("a", metavar="A", help="the reference baseline")
  p.add_argument("b", metavar="B", help="the baseline compared with it")
  add_json(p)

  p = sub.add_parser("info", help="print the current environment stamp")
  add_json(p)
  return parser


def run(args: argparse.Namespace, batch: BatchFactory) -> Report:
  """Runs the parsed command and returns its report."""
  if args.command == "info":
    return commands.info()
  if args.command == "diff":
    return commands.diff(args.a, args.b)
  loaded = batch()
  if args.command == "record":
    return commands.record(loaded.cases, args.out, force=args.force, notes=loaded.notes)
  return commands.check(
      loaded.cases, args.baseline, pattern=args.pattern, dry_run=args.dry_run, notes=loaded.notes
  )


def _print(report: Report) -> None:
  if report.command == "info":
    from regression.stamp import format_stamp

    print(format_stamp(report.stamp or {}))
    return
  if report.error:
    print(f"error: {report.error}", file=sys.stderr)
    return
  print(render(report))
  if report.command == "record" and report.exit_code == 0:
    print(f"\nwrote baseline {report.baseline} ({len(report.rows)} cases)")


def main(argv: Sequence[str] | None = None, *, batch: BatchFactory | None = None) -> int:
  """Entry point of ``nnx-pool-regression`` and ``python -m regression``.

  Args:
    argv: the arguments (default ``sys.argv[1:]``).
    batch: a factory of the cases to run (default: the canonical batch over
      ``nnx_pool``); tests pass a stand-in.

  Returns:
    The exit code.
  """
  args = _parser().parse_args(argv)
  report = run(args, batch or load_batch)
  _print(report)
  if args.json:
    write_json(report, args.json)
  return report.exit_code
