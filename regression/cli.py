"""Command line: ``python -m nnx_pool.regression`` or the ``nnx-pool-regression`` script.

Commands:

* ``check [--baseline DIR] [--json OUT] [--html OUT] [--timing] [-k PATTERN]
  [--dry-run] [--devices N [--axis-types explicit|auto]]``: runs the batch after
  JIT warmup and compares it with the baseline (default: the shipped one).
  ``--timing`` lists every case whose timing moved; by default the report gives
  totals and at most the largest mover. ``--html OUT`` also writes one
  self-contained page (:mod:`nnx_pool.regression.report.html`): both stamps, the table,
  and heatmaps of every failing array; it needs matplotlib, the ``report``
  extra, and without it exits 2 naming the install command before running anything.
  With ``--devices N`` the batch runs sharded over N devices (simulated CPU
  devices: ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` is set before
  JAX initialises, re-running the command in a fresh interpreter when this one
  already initialised JAX) and is compared with the same baseline.
* ``record [--out DIR] [--force] [--json OUT]``: runs the batch and writes a
  baseline atomically. Without ``--out`` it re-records the shipped baseline,
  and only in a source checkout: an installed package is never written.
* ``diff A B [--json OUT]``: compares two recorded baselines.
* ``info [--json OUT]``: prints the current environment stamp.
* ``report DIR [--obtained OBTAINED] [--json OUT] [--html OUT]``: the report of the last
  failing check of a pytest fixture baseline, from the baseline and the ``DIR.obtained``
  file that check wrote beside it (or ``OBTAINED``, where a check-only run wrote it),
  without running the model.
* ``rehearse REQ... [--baseline DIR] [--json OUT] [--html OUT] [--timing] [-k PATTERN]
  [--dry-run] [--resolve] [--no-cache] [--no-batch] [--pytest [PATH...] [-- ARG...]]``:
  runs ``check`` in a
  throwaway virtual environment that holds this nnx-pool and its dependencies at the
  versions installed here, except what the PEP 508 requirements REQ name
  (``jax==0.9.2``), against a baseline of this environment, and prints the same report,
  the versions it changed marked ``(rehearsal)``. This environment is never modified.
  ``--resolve`` lets pip choose older versions of the packages that depend on a
  requirement (flax for jax). Environments are cached per requirement set, the three
  used most recently kept (:func:`nnx_pool.regression.upgrade.rehearse_cache.cache_root`);
  ``rehearse --clear-cache`` empties the cache. ``--pytest`` also runs your
  ``nnx_regression`` tests there, comparing only; every argument after ``--`` goes to that
  pytest untouched (``--pytest tests -- -k logits``), and ``--no-batch`` runs only them.
  See :mod:`nnx_pool.regression.upgrade.rehearse`.
* ``bisect --good SPEC --bad SPEC [--resolve] [--pre] [-k PATTERN] [--html OUT]
  [--no-batch] [--pytest [PATH...] [-- ARG...]]``: finds the release that moved the numbers.
  SPEC is a requirement set as ``rehearse`` takes it, quoted as one argument
  (``'jax==0.9.0'``, ``'jax==0.10.2 flax==0.12.8'``); the two may differ in one package
  (jax with its jaxlib counts as one). It records the baselines in the good set's
  environment (into a temporary directory), checks them in the bad set's, then halves the
  registry's releases between them, in the rehearsal cache's environments, and names the
  first release whose check fails. See :mod:`nnx_pool.regression.upgrade.bisect`.

On a terminal, ``check`` and ``record`` show which case runs (``check: case 17/104
max_k2s1_ties_zeros ...``) on one line of stderr that is rewritten in place and cleared
at the end; when stderr is not a terminal (piped, redirected, CI) nothing extra is
printed. ``rehearse`` shows its steps there (``rehearse: step 2/3 installing ...``).

Exit codes: 0 everything passed; 1 a number moved, an error case stopped
raising, a case failed to run, or the baseline is out of date (NEW, GONE,
STALE cases); 2 the batch could not be imported or built (with its
traceback), the baseline is missing, damaged, of a newer format, or may not
be written (including a full disk), or too few devices, or a ``--json`` or ``--html``
file cannot be written or lies inside a baseline's directory (checked before anything runs,
and again when it is written),
with a one-line reason on stderr. ``rehearse`` exits with ``check``'s code, or 2 with a one-line
reason naming the requirement pip could not install; with ``--pytest``, with the worse
of that and pytest's (failed tests 1; no tests collected, a usage error or an
interrupted run 2). ``bisect`` exits 1 when it names a first moved release, 0 when the
bad set passes after all, and 2 on bad input (the two sets the same, more than one package
differing, no release between them) or a set that cannot be installed or recorded.

The batch (and with it ``nnx_pool`` and JAX) is imported inside :func:`main`,
so that a failure to import it is reported with exit code 2, not mistaken
for a number that moved.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from nnx_pool.regression import store
from nnx_pool.regression.report import Report, html, render, write_json
from nnx_pool.regression.stamp import SHIPPED, source_checkout
from nnx_pool.regression.upgrade import rehearse, rehearse_cache

BatchFactory = Callable[[], Any]

DEVICE_FLAG = "--xla_force_host_platform_device_count"
# `report` lists at most this many rows, the worst failing first, as the failing check did.
REPORT_ROWS = 20
# Set in the fresh interpreter that `--devices` starts, so it never starts another.
_CHILD_ENV = "NNX_POOL_REGRESSION_DEVICES_CHILD"


def _positive_int(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be a positive integer; got {text!r}")
  return value


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="nnx-pool-regression",
      description="Version-stamped numeric regression checks for nnx-pool.",
  )
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

  def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT")

  def add_check_options(p: argparse.ArgumentParser, *, html_help: str) -> None:
    """The options of ``check``, which ``rehearse`` passes on to the check it runs."""
    p.add_argument("--baseline", metavar="DIR", default=str(SHIPPED),
                   help="baseline directory (default: the shipped baseline)")
    p.add_argument("-k", dest="pattern", metavar="PATTERN",
                   help="only cases whose name contains PATTERN or matches it as a glob")
    p.add_argument("--dry-run", action="store_true", help="report drift but exit 0")
    p.add_argument("--timing", action="store_true",
                   help="list every case whose compile or steady time moved (never fails a check)")
    add_json(p)
    p.add_argument("--html", metavar="OUT", help=html_help)

  p = sub.add_parser(
      "check", help="compare the batch with a baseline",
      description="Runs the batch (after JIT warmup) and compares it with a baseline.",
      epilog="On a terminal, stderr shows the case running (case n/N); piped, nothing extra. "
             "Exit codes: 0 all pass, 1 a number moved or the baseline is out of date, "
             "2 an unusable baseline or a batch that could not be built.")
  add_check_options(p, html_help="also write one self-contained HTML page to OUT: both stamps, "
                    "the table, and heatmaps of every failing array with its tolerance (needs "
                    f"matplotlib: {html.INSTALL})")
  p.add_argument("--devices", metavar="N", type=_positive_int,
                 help="run the batch sharded over N (simulated CPU) devices")
  p.add_argument("--axis-types", choices=("explicit", "auto"), default="explicit",
                 help="the mesh's axis type with --devices (default: explicit, as jax.make_mesh)")

  p = sub.add_parser(
      "record", help="run the batch and write a baseline",
      description="Runs the batch and writes a baseline atomically.",
      epilog="On a terminal, stderr shows the case running (case n/N); piped, nothing extra.")
  p.add_argument("--out", metavar="DIR",
                 help="baseline directory (default, in a source checkout only: the shipped one)")
  p.add_argument("--force", action="store_true", help="replace an existing baseline")
  add_json(p)

  p = sub.add_parser("diff", help="compare two recorded baselines")
  p.add_argument("a", metavar="A", help="the reference baseline")
  p.add_argument("b", metavar="B", help="the baseline compared with it")
  add_json(p)

  p = sub.add_parser("info", help="print the current environment stamp")
  add_json(p)

  p = sub.add_parser(
      "report", help="redraw the last failure of a pytest fixture baseline",
      description="Compares a pytest fixture baseline with what its last failing check "
                  "obtained (DIR.obtained, written beside it by the failing check), without "
                  "running the model, and prints the report the check printed.",
      epilog="Exit codes: 0 the obtained results pass, 1 they differ, 2 a missing or damaged "
             "baseline or obtained file.")
  p.add_argument("baseline", metavar="DIR", help="the fixture baseline directory")
  p.add_argument("--obtained", metavar="OBTAINED",
                 help="the obtained file to compare (default: DIR.obtained beside it; a check "
                      "run with NNX_REGRESSION_CHECK_ONLY names the one it wrote)")
  add_json(p)
  p.add_argument("--html", metavar="OUT", help="also write the HTML page to OUT (needs "
                 f"matplotlib: {html.INSTALL})")

  p = sub.add_parser(
      "rehearse", help="run check in a throwaway environment with other versions",
      description="Runs check in a throwaway virtual environment: this nnx-pool and its "
                  "dependencies at the versions installed here, except what REQ names, "
                  "against a baseline of this environment. This environment is never "
                  "modified.",
      epilog="REQ is a PEP 508 requirement, one per argument (no pip options); a path or URL "
             "is named: 'mylib @ file:///abs/mylib-1.0-py3-none-any.whl'. A jax or jaxlib "
             "pinned with == brings the other to the same version; name both to choose each. "
             "A bare name (optax) adds that package at this environment's version. "
             "Environments are cached per requirement set in $NNX_POOL_CACHE/rehearse, else "
             "$XDG_CACHE_HOME/nnx-pool/rehearse, else ~/.cache/nnx-pool/rehearse (about 750 MB "
             "each); the 3 used most recently are kept ($NNX_POOL_REHEARSE_KEEP changes it), "
             "and --clear-cache removes them all. On a terminal, stderr shows each step "
             "(create, install, run). Exit codes: those of check; 2 when a requirement is "
             "malformed or pip cannot install it; with --pytest, the worse of check's and "
             "pytest's.")
  p.add_argument("requirements", metavar="REQ", nargs="*",
                 help="a PEP 508 requirement to apply over this environment, e.g. jax==0.9.2")
  add_check_options(p, html_help="also write check's HTML page to OUT (matplotlib is installed "
                    "in the rehearsal environment, not here)")
  p.add_argument("--resolve", action="store_true",
                 help="let pip choose, for each package here that depends on a requirement "
                      "(flax for jax), the newest version no newer than this environment's "
                      "that admits it; the report names what it chose and why")
  p.add_argument("--clear-cache", action="store_true",
                 help="remove every cached rehearsal environment not in use, and exit; "
                      "give it alone")
  p.add_argument("--no-cache", dest="cache", action="store_false",
                 help="build a throwaway environment and remove it afterwards; the cache is "
                      "neither read nor written")
  p.add_argument("--pytest", metavar="PATH", nargs="*", default=None,
                 help="also run python -m pytest PATH... there, from this directory, with "
                      "NNX_REGRESSION_CHECK_ONLY=1 (the nnx_regression fixture compares and never "
                      "records); give it last. Everything after a -- goes to pytest untouched: "
                      "--pytest tests -- -k logits")
  p.add_argument("--no-batch", dest="batch", action="store_false",
                 help="skip the kit's own cases (check): only run your tests (--pytest); the "
                      "kit's cases matter when your model uses nnx-pool's layers")

  p = sub.add_parser(
      "bisect", help="find the release between a good and a bad set that moved the numbers",
      description="Finds the one package the two requirement sets differ in, lists the "
                  "registry's releases of it between them, records the baselines in the good "
                  "set's environment (into a temporary directory: your own baselines are never "
                  "written) and checks them in the bad set's, then in the release halfway "
                  "between, halving until it names the first release whose check fails.",
      epilog="SPEC is a requirement set as rehearse takes it, quoted as one argument: "
             "--good 'jax==0.9.0' --bad 'jax==0.10.2'. jax and jaxlib count as one package: each "
             "jax release is installed with its jaxlib. Environments are the rehearsal cache's "
             "(reused by later bisects and rehearsals); a set this environment satisfies runs "
             "here, installing nothing. A release that cannot be installed or tested is "
             "skipped, and the halving goes around it. stderr gets one line per step (the "
             "release, its verdict, the time); stdout the first moved release's report, a total "
             "(steps, installs, minutes, disk) and, last, the answer. Exit codes: 1 a first moved "
             "release was found, 0 the bad set passes, 2 bad input or a set that cannot be "
             "installed or recorded.")
  p.add_argument("--good", metavar="SPEC", required=True,
                 help="the requirement set whose numbers are right, e.g. 'jax==0.9.0'")
  p.add_argument("--bad", metavar="SPEC", required=True,
                 help="the requirement set whose numbers moved, e.g. 'jax==0.10.2'")
  p.add_argument("--resolve", action="store_true",
                 help="let pip choose, at each release, the newest version no newer than this "
                      "environment's of each package that depends on it (flax for jax)")
  p.add_argument("--pre", action="store_true",
                 help="walk pre-releases too (by default they are left out, as pip leaves them)")
  p.add_argument("-k", dest="pattern", metavar="PATTERN",
                 help="check only the kit's cases whose name contains PATTERN or matches it as "
                      "a glob (all are recorded)")
  p.add_argument("--html", metavar="OUT",
                 help="write the HTML page of the first moved release's failure to OUT: your "
                      "tests' where they failed, else the kit's (drawn in its environment)")
  p.add_argument("--pytest", metavar="PATH", nargs="*", default=None,
                 help="also record and check your nnx_regression tests (python -m pytest "
                      "PATH..., from this directory); give it last. Everything after a -- goes "
                      "to pytest untouched")
  p.add_argument("--no-batch", dest="batch", action="store_false",
                 help="skip the kit's own cases: only record and check your tests (--pytest)")
  return parser


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
  from nnx_pool.regression import commands  # imports JAX; see the module docstring

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
    from nnx_pool.regression.batch import load_batch as batch
  loaded = batch()
  if args.command == "record":
    return commands.record(loaded.cases, args.out, force=args.force, notes=loaded.notes,
                           progress=progress)
  return commands.check(
      loaded.cases, args.baseline, pattern=args.pattern, dry_run=args.dry_run, notes=loaded.notes,
      devices=args.devices, axis_types=args.axis_types, progress=progress,
  )


def _fixture_report(path: str, obtained: str | None = None) -> Report:
  """``report DIR [--obtained OBTAINED]``: a fixture baseline against its obtained file."""
  from nnx_pool.regression.fixture.from_disk import report_from_disk
  from nnx_pool.regression.store import BaselineError

  try:
    return report_from_disk(path, obtained)
  except BaselineError as e:
    return Report(command="check", exit_code=2, error=str(e))


def _is_terminal(stream: TextIO | None) -> bool:
  try:
    return bool(stream is not None and stream.isatty())
  except (AttributeError, ValueError):  # no isatty, or a closed stream
    return False


def _columns(stream: TextIO) -> int:
  """The terminal's width; a terminal that reports 0 (unknown) falls back to COLUMNS, then 80."""
  try:
    columns = os.get_terminal_size(stream.fileno()).columns
  except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is an OSError
    columns = 0
  return columns or shutil.get_terminal_size().columns


class ProgressLine:
  """``check: case 17/104 max_k2s1_ties_zeros ...``, rewritten in place on one terminal line.

  ``label`` (``check: case``) comes first, then ``n/total`` and the name. Each
  call returns to the start of the line (``\\r``) and overwrites what the previous
  call wrote; :meth:`clear` blanks it. Text is cut to the terminal's width, so the
  line never wraps (a wrapped line cannot be rewritten with ``\\r``).
  """

  def __init__(self, stream: TextIO, label: str):
    self.stream = stream
    self.label = label
    self._shown = 0

  def __call__(self, n: int, total: int, name: str) -> None:
    text = f"{self.label} {n}/{total} {name} ..."[:max(_columns(self.stream) - 1, 1)]
    self.stream.write("\r" + text.ljust(self._shown))
    self.stream.flush()
    self._shown = len(text)

  def clear(self) -> None:
    """Blanks the line, leaving the cursor at its start."""
    if self._shown:
      self.stream.write("\r" + " " * self._shown + "\r")
      self.stream.flush()
      self._shown = 0


@contextlib.contextmanager
def _progress(label: str | None) -> Iterator[ProgressLine | None]:
  """A progress line on stderr when it is a terminal (else None), cleared on the way out."""
  if label is None or not _is_terminal(sys.stderr):
    yield None
    return
  line = ProgressLine(sys.stderr, label)
  try:
    yield line
  finally:
    line.clear()


def _print(report: Report, *, timing: bool, json_path: str | None,
           limit: int | None = None) -> None:
  if report.command == "info":
    from nnx_pool.regression.stamp import format_stamp

    print(format_stamp(report.stamp or {}))
    return
  if report.error:
    print(f"error: {report.error}", file=sys.stderr)
    return
  print(render(report, timing=timing, json_path=json_path, limit=limit))
  if report.command == "record" and report.exit_code == 0:
    print(f"\nwrote baseline {report.baseline} ({len(report.rows)} cases)")


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
    return _bisect(argv)
  handed: list[str] = []
  if argv[:1] == ["rehearse"] and "--" in argv:  # pytest's own options, untouched
    cut = argv.index("--")
    argv, handed = argv[:cut], argv[cut + 1:]
  if argv[:1] == ["rehearse"]:
    problem = _forgotten_dashes(argv, handed)
    if problem:
      print(f"error: rehearse: {problem}", file=sys.stderr)
      return 2
  args = _parser().parse_args(argv)
  if args.command == "rehearse":
    problem = _pytest_problem(args, handed)
    if problem:
      print(f"error: rehearse: {problem}", file=sys.stderr)
      return 2
    if args.pytest is not None:
      args.pytest = [*args.pytest, *handed]
  problem = _outputs_problem(args)
  if problem:
    print(f"error: {problem}", file=sys.stderr)
    return 2
  if args.command == "rehearse":
    return _rehearse(args)
  if getattr(args, "devices", None):
    code = _provide_devices(args.devices, argv, custom_batch=batch is not None)
    if code is not None:
      return code
  try:
    label = f"{args.command}: case" if args.command in ("check", "record") else None
    with _progress(label) as progress:
      report = run(args, batch, progress=progress)
  except Exception:  # noqa: BLE001 - an import or build failure: shown whole, exit 2
    traceback.print_exc()
    print(f"error: {args.command}: the regression batch could not be imported or built (the "
          "traceback above says why); nothing was compared.", file=sys.stderr)
    return 2
  _print(report, timing=getattr(args, "timing", False), json_path=args.json,
         limit=REPORT_ROWS if args.command == "report" else None)
  if not _write_json(report, args.json):
    return 2
  html_path = getattr(args, "html", None)
  if html_path is not None:
    try:
      with _progress("check --html: figure") as progress:
        html.write_html(report, html_path, progress=progress)
    except OSError as e:
      print(f"error: --html {html_path}: could not write it ({e.strerror or e}); any earlier "
            "file there is unchanged.", file=sys.stderr)
      return 2
    if not report.error:
      print(html.closing_line(html_path))
  return report.exit_code


def _write_json(report: Report, path: str | None) -> bool:
  """Writes ``--json`` (if given); False, with one line on stderr, when it cannot."""
  if path is None:
    return True
  try:
    write_json(report, path)
  except OSError as e:
    print(f"error: --json {path}: could not write it ({e.strerror or e}); any earlier file "
          "there is unchanged.", file=sys.stderr)
    return False
  return True


# rehearse's options that pytest has no option of the same name for, and whether each takes
# a value: after --pytest, any other option (-k, -x, --html, ...) is taken for pytest's.
_REHEARSE_ONLY = {"--baseline": True, "--dry-run": False, "--timing": False, "--json": True,
                  "--resolve": False, "--clear-cache": False, "--no-cache": False,
                  "--no-batch": False}


def _forgotten_dashes(argv: Sequence[str], handed: Sequence[str]) -> str | None:
  """The refusal of a pytest option given after ``--pytest`` but before ``--`` (issue 29):
  argparse would read ``-k logits`` as the kit's case filter, and pytest would run every
  test. Names ``--`` and shows the command corrected; None when there is no such option."""
  if "--pytest" not in argv:
    return None
  start = argv.index("--pytest") + 1
  before, paths, moved = list(argv[:start - 1]), [], []
  rest = list(argv[start:])
  while rest:
    token = rest.pop(0)
    flag = token.split("=", 1)[0]
    if flag in _REHEARSE_ONLY:  # rehearse's own: before --pytest, with its value
      before.append(token)
      if _REHEARSE_ONLY[flag] and "=" not in token and rest:
        before.append(rest.pop(0))
    elif moved or (token.startswith("-") and token != "-"):  # pytest's, and what follows
      moved.append(token)
    else:
      paths.append(token)
  if not moved:
    return None
  fixed = shlex.join(["nnx-pool-regression", *before, "--pytest", *paths, "--", *moved,
                      *handed])
  return (f"{moved[0]} comes after --pytest but before --, where rehearse reads the options, "
          f"not pytest (a -k there selected none of the kit's cases, and pytest ran every "
          f"test); pytest's options go after a --: {fixed}")


def _pytest_problem(args: argparse.Namespace, handed: Sequence[str]) -> str | None:
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
  return None


def _rehearse(args: argparse.Namespace) -> int:
  """``rehearse``: prints the report of check in the rehearsal environment; the exit code."""
  if args.clear_cache:
    return _clear_cache(args)
  if not args.requirements:
    print("error: rehearse: name at least one requirement, e.g. jax==0.9.2 (or pass "
          "--clear-cache alone).", file=sys.stderr)
    return 2
  with _progress("rehearse: step") as progress:
    report = rehearse.rehearse(
        args.requirements, baseline=args.baseline, pattern=args.pattern, dry_run=args.dry_run,
        html=args.html, pytest_paths=args.pytest, batch=args.batch, cache=args.cache,
        resolve=args.resolve, progress=progress)
  _print(report, timing=args.timing, json_path=args.json)
  if not _write_json(report, args.json):
    return 2
  if args.html is not None and not report.error and Path(args.html).is_file():
    print(html.closing_line(args.html))
  return report.exit_code


def _bisect(argv: Sequence[str]) -> int:
  """``bisect``: prints each step, the first moved release's report, the answer; the exit code."""
  from nnx_pool.regression.upgrade import bisect

  argv, handed = list(argv), []
  if "--" in argv:  # pytest's own options, untouched
    argv, handed = argv[:argv.index("--")], argv[argv.index("--") + 1:]
  args = _parser().parse_args(argv)
  problem = None
  if handed and args.pytest is None:
    problem = (f"the arguments after -- ({' '.join(handed)}) are pytest's; pass --pytest "
               "[PATH...] before the --.")
  elif not args.batch and (args.pytest is None or args.pattern is not None):
    problem = ("--no-batch skips the kit's own cases, so there is nothing to run without "
               "--pytest" if args.pytest is None else
               "-k selects the kit's own cases, which --no-batch skips; to select your tests, "
               "pass pytest's options after --: --pytest tests -- -k NAME")
  elif args.html is not None:
    problem = _html_problem(args.html, None, here=False)
  if problem:
    print(f"error: bisect: {problem.removeprefix('error: ')}", file=sys.stderr)
    return 2

  with _progress("bisect: step") as progress:
    def say(line: str) -> None:
      if progress is not None:
        progress.clear()
      print(line, file=sys.stderr, flush=True)

    found = bisect.bisect(
        args.good, args.bad, resolve=args.resolve, pre=args.pre,
        pytest_paths=None if args.pytest is None else [*args.pytest, *handed], batch=args.batch,
        pattern=args.pattern, html=args.html, progress=progress, say=say)
  if found.error:
    if found.log:
      print(found.log, end="" if found.log.endswith("\n") else "\n")
    print(f"error: {found.error}", file=sys.stderr)
    return 2
  moved = found.moved
  if moved is not None:
    if moved.report is not None and moved.report.exit_code != 0:  # the kit's cases moved too
      print(render(moved.report, limit=REPORT_ROWS))
    if moved.tests:
      print(moved.tests, end="" if moved.tests.endswith("\n") else "\n")
    if args.html is not None and Path(args.html).is_file():
      print(html.closing_line(args.html))
  for note in found.notes:
    print(f"note: bisect: {note}")
  print(found.total)
  print(found.answer)
  return found.exit_code


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


def _outputs_problem(args: argparse.Namespace) -> str | None:
  """Why ``--json`` or ``--html`` cannot be written (one line), found before anything runs."""
  json_path, html_path = getattr(args, "json", None), getattr(args, "html", None)
  if json_path is not None:
    problem = _output_problem("--json", json_path)
    if problem:
      return problem
  if html_path is not None:  # a rehearsal draws its page in its own environment
    return _html_problem(html_path, json_path, here=args.command != "rehearse")
  return None


def _output_problem(flag: str, path: str) -> str | None:
  """Why the file ``path`` that ``flag`` names cannot be written, or None."""
  out = Path(path)
  if out.is_dir():
    return f"{flag} {path}: is a directory; name the file to write."
  if not out.parent.is_dir():
    return f"{flag} {path}: directory {out.parent} does not exist."
  if not os.access(out.parent, os.W_OK | os.X_OK):
    return f"{flag} {path}: directory {out.parent} is not writable."
  baseline = _baseline_around(out)
  if baseline is not None:
    return (f"{flag} {path}: lies inside {baseline}, a baseline's directory (or an obtained "
            "file's), which holds the kit's own files only; write it elsewhere.")
  return None


def _baseline_around(out: Path) -> Path | None:
  """The baseline (or obtained, or weight set) directory that ``out`` would be written
  into, directly or below; None when no directory above it is one."""
  for directory in out.resolve().parents:
    if (directory / store.MANIFEST).is_file() and store.stored_format_version(directory):
      return directory
  return None


def _html_problem(path: str, json_path: str | None, *, here: bool = True) -> str | None:
  """Why ``--html path`` cannot be written (one line), found before the batch runs.

  ``here``: the page is drawn in this process, which then needs matplotlib.
  """
  if here and not html.available():
    return html.MISSING
  problem = _output_problem("--html", path)
  if problem:
    return problem
  if json_path is not None and Path(json_path).resolve() == Path(path).resolve():
    return f"--html and --json name the same file ({path}); give each its own."
  return None


def with_device_count(flags: str, devices: int) -> str:
  """``XLA_FLAGS`` with the host device count set to ``devices`` (any earlier count dropped)."""
  kept = [f for f in flags.split() if not f.startswith(DEVICE_FLAG)]
  return " ".join([*kept, f"{DEVICE_FLAG}={devices}"])


def _provide_devices(
    devices: int, argv: Sequence[str] | None, *, custom_batch: bool
) -> int | None:
  """Makes ``devices`` CPU devices available, before JAX initialises.

  Returns None when this process can go on (it sets ``XLA_FLAGS`` when JAX is
  not imported yet, or ``jax_num_cpu_devices`` when JAX is imported but not
  initialised, or already has enough devices); otherwise re-runs the command
  in a fresh interpreter and returns its exit code (or 2 when it cannot).
  """
  if "jax" not in sys.modules:
    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), devices)
    return None
  import jax

  try:
    jax.config.update("jax_num_cpu_devices", devices)  # refused once JAX has initialised
    return None
  except RuntimeError:
    pass
  if jax.device_count() >= devices:
    return None
  reason = None
  if custom_batch:
    reason = "a custom batch cannot be re-run in a fresh interpreter"
  elif os.environ.get(_CHILD_ENV):
    reason = "the fresh interpreter initialised JAX before the flag could take effect"
  if reason:
    print(
        f"error: --devices {devices}: JAX is already initialised with {jax.device_count()} "
        f"device(s) and {reason}; set XLA_FLAGS={DEVICE_FLAG}={devices} before importing JAX.",
        file=sys.stderr,
    )
    return 2
  env = {**os.environ, _CHILD_ENV: "1"}
  env["XLA_FLAGS"] = with_device_count(env.get("XLA_FLAGS", ""), devices)
  args = list(sys.argv[1:] if argv is None else argv)
  sys.stdout.flush()
  sys.stderr.flush()
  return subprocess.run([sys.executable, "-m", "nnx_pool.regression", *args], env=env,
                        check=False).returncode
