"""``rehearse`` and ``bisect`` on the command line: their refusals (pytest's options given
where the kit's go), and what they print."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from ..report import html, render
from ..report.data import moved_lines
from ..upgrade import preflight, rehearse, rehearse_cache
from ..upgrade.rehearse_plan import RehearsalError
from .outputs import REPORT_ROWS, html_problem, print_report, write_json_file
from .parser import make_parser
from .progress import progress_line, step_lines

# Each command's options that pytest has no option of the same name for, and whether each
# takes a value: after --pytest, any other option (-k, -x, --html, ...) is taken for pytest's.
_OWN = {
    "rehearse": {"--baseline": True, "--dry-run": False, "--timing": False, "--json": True,
                 "--resolve": False, "--clear-cache": False, "--no-cache": False,
                 "--no-batch": False},
    "bisect": {"--good": True, "--bad": True, "--resolve": False, "--pre": False,
               "--no-batch": False, "--good-date": True, "--bad-date": True},
}


def forgotten_dashes(argv: Sequence[str], handed: Sequence[str]) -> str | None:
  """The refusal of a pytest option given after ``--pytest`` but before ``--`` (issue 29, for
  ``rehearse``; issue 36, for ``bisect``): argparse would read ``-k logits`` as the kit's case
  filter, and pytest would run every test. Names ``--`` and shows the command corrected; None
  when there is no such option. ``argv`` starts with the command."""
  if "--pytest" not in argv:
    return None
  own = _OWN[argv[0]]
  start = argv.index("--pytest") + 1
  before, paths, moved = list(argv[:start - 1]), [], []
  rest = list(argv[start:])
  while rest:
    token = rest.pop(0)
    flag = token.split("=", 1)[0]
    if flag in own:  # the command's own: before --pytest, with its value
      before.append(token)
      if own[flag] and "=" not in token and rest:
        before.append(rest.pop(0))
    elif moved or (token.startswith("-") and token != "-"):  # pytest's, and what follows
      moved.append(token)
    else:
      paths.append(token)
  if not moved:
    return None
  fixed = shlex.join(["nnx-pool-regression", *before, "--pytest", *paths, "--", *moved,
                      *handed])
  return (f"{moved[0]} comes after --pytest but before --, where {argv[0]} reads the options, "
          f"not pytest (a -k there selected none of the kit's cases, and pytest ran every "
          f"test); pytest's options go after a --: {fixed}")


def missing_paths(args: argparse.Namespace) -> str | None:
  """A path given to ``--pytest`` (before ``--``) that does not exist here, in one line."""
  try:
    preflight.pytest_paths(args.pytest or (), args.command)
  except RehearsalError as e:
    return str(e).removeprefix(f"{args.command}: ")
  return None


def pytest_problem(args: argparse.Namespace, handed: Sequence[str]) -> str | None:
  """Why ``rehearse``'s pytest options do not fit together (one line), or None."""
  if handed and args.pytest is None:
    return (f"the arguments after -- ({' '.join(handed)}) are pytest's; pass --pytest [PATH...] "
            "before the --.")
  if not args.batch:
    if args.pytest is None:
      return "--no-batch skips the kit's own cases, so there is nothing to run without --pytest."
    given = [name for name, value in (("-k", args.pattern), ("--dry-run", args.dry_run),
                                      ("--html", args.html)) if value]
    if given:
      return (f"{', '.join(given)} with --no-batch: those options are for the kit's own cases, "
              "which --no-batch skips; to select your tests, pass pytest's options after --: "
              "--pytest tests -- -k NAME.")
  return missing_paths(args)


def rehearse_command(args: argparse.Namespace) -> int:
  """``rehearse``: prints the report of check in the rehearsal environment; the exit code."""
  if args.clear_cache:
    return _clear_cache(args)
  if not args.requirements:
    print("error: rehearse: name at least one requirement, e.g. jax==0.9.2 (or pass "
          "--clear-cache alone).", file=sys.stderr)
    return 2
  with step_lines("rehearse") as progress:
    report = rehearse.rehearse(
        args.requirements, baseline=args.baseline, pattern=args.pattern, dry_run=args.dry_run,
        html=args.html, pytest_paths=args.pytest, batch=args.batch, cache=args.cache,
        resolve=args.resolve, progress=progress)
    if progress.steps:
      print(f"rehearse: finished in {progress.since()}", file=sys.stderr, flush=True)
  print_report(report, timing=args.timing, json_path=args.json)
  for line in moved_lines(report, "rehearse"):
    print(line)
  if not write_json_file(report, args.json):
    return 2
  if args.html is not None and not report.error and Path(args.html).is_file():
    print(html.closing_line(args.html))
  return report.exit_code


def bisect_command(argv: Sequence[str]) -> int:
  """``bisect``: prints each step, the first moved release's report, the answer; the exit code."""
  from ..upgrade import bisect

  argv, handed = list(argv), []
  if "--" in argv:  # pytest's own options, untouched
    argv, handed = argv[:argv.index("--")], argv[argv.index("--") + 1:]
  problem = forgotten_dashes(argv, handed)
  if problem:
    return _refused(problem)
  args = make_parser().parse_args(argv)
  problem = _bisect_problem(args, handed)
  if problem:
    return _refused(problem)

  with progress_line("bisect: step") as progress:
    def say(line: str) -> None:
      if progress is not None:
        progress.clear()
      print(line, file=sys.stderr, flush=True)

    tests = None if args.pytest is None else [*args.pytest, *handed]
    if args.good_date is not None:
      from ..upgrade.bisect_dates import bisect_dates

      found = bisect_dates(args.good_date, args.bad_date, pytest_paths=tests, batch=args.batch,
                           pattern=args.pattern, html=args.html, progress=progress, say=say)
    else:
      found = bisect.bisect(
          args.good, args.bad, resolve=args.resolve, pre=args.pre, pytest_paths=tests,
          batch=args.batch, pattern=args.pattern, html=args.html, progress=progress, say=say)
  if found.error:
    if found.log:
      print(found.log, end="" if found.log.endswith("\n") else "\n")
    print(f"error: {found.error}", file=sys.stderr)
    return 2
  moved = found.moved
  if moved is not None:
    if moved.report is not None and moved.report.exit_code != 0:  # the kit's cases moved too
      print(render(moved.report, limit=REPORT_ROWS))
      for line in moved_lines(moved.report, f"bisect: {moved.label}"):
        print(line)
    if moved.tests:
      print(moved.tests, end="" if moved.tests.endswith("\n") else "\n")
    if args.html is not None and Path(args.html).is_file():
      print(html.closing_line(args.html))
  for note in found.notes:
    print(f"note: bisect: {note}")
  print(found.total)
  print(found.answer)
  return found.exit_code


def _bisect_problem(args: argparse.Namespace, handed: Sequence[str]) -> str | None:
  """Why ``bisect``'s options do not fit together, or a path to test is missing; or None."""
  dates = args.good_date is not None or args.bad_date is not None
  if dates and (args.good is not None or args.bad is not None or args.resolve or args.pre):
    return ("--good-date and --bad-date bisect the whole set by date; give them without --good, "
            "--bad, --resolve or --pre")
  if dates and (args.good_date is None or args.bad_date is None):
    return "give both --good-date and --bad-date, e.g. --good-date 2026-03-01 --bad-date 2026-09-01"
  if not dates and (args.good is None or args.bad is None):
    return ("give --good and --bad (requirement sets, e.g. --good 'jax==0.9.0' --bad "
            "'jax==0.10.2'), or --good-date and --bad-date")
  if handed and args.pytest is None:
    return (f"the arguments after -- ({' '.join(handed)}) are pytest's; pass --pytest "
            "[PATH...] before the --.")
  if not args.batch and args.pytest is None:
    return "--no-batch skips the kit's own cases, so there is nothing to run without --pytest"
  if not args.batch and args.pattern is not None:
    return ("-k selects the kit's own cases, which --no-batch skips; to select your tests, "
            "pass pytest's options after --: --pytest tests -- -k NAME")
  if args.html is not None:
    problem = html_problem(args.html, None, here=False)
    if problem:
      return problem.removeprefix("error: ")
  return missing_paths(args)


def _refused(problem: str) -> int:
  print(f"error: bisect: {problem}", file=sys.stderr)
  return 2


def _clear_cache(args: argparse.Namespace) -> int:
  """``rehearse --clear-cache``: removes the cached environments; prints what it did."""
  extra = [name for name, given in (("REQ", args.requirements), ("--json", args.json),
                                    ("--html", args.html), ("--pytest", args.pytest is not None),
                                    ("--no-batch", not args.batch),
                                    ("--resolve", args.resolve), ("--no-cache", not args.cache))
           if given]
  if extra:
    print(f"error: rehearse --clear-cache takes no {', '.join(extra)}; run it alone.",
          file=sys.stderr)
    return 2
  cleared = rehearse_cache.clear_cache()
  where = rehearse_cache.shown(cleared.root)
  if cleared.removed or cleared.freed:
    print(f"removed {len(cleared.removed)} rehearsal environment(s) from {where}, "
          f"{cleared.freed / 1e6:.0f} MB")
  else:
    print(f"no rehearsal environment to remove in {where}")
  if cleared.busy:
    print(f"left {len(cleared.busy)} in use by a running rehearsal: {', '.join(cleared.busy)}")
  return 0
