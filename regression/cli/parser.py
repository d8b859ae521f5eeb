"""The command line's commands and options: the argparse parser :func:`~.dispatch.main` runs
(the site's page of the command line is written from it)."""

from __future__ import annotations

import argparse

from ..constants import PYTEST_RESULT_OPTION
from ..report import html
from ..stamp import SHIPPED


def positive_int(text: str) -> int:
  """An argparse type: a positive integer (``--devices``; the benchmarks' batch sizes)."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be a positive integer; got {text!r}")
  return value


def make_parser() -> argparse.ArgumentParser:
  """The parser of ``nnx-pool-regression``: every command and option."""
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
                   help="only cases whose name contains PATTERN (as pytest's -k matches a word: "
                        "avg_ selects global_avg_batch too) or matches it as a glob ('avg_*': "
                        "the names that start with avg_); one that selects none exits 2")
    p.add_argument("--dry-run", action="store_true", help="report drift but exit 0")
    p.add_argument("--timing", action="store_true",
                   help="list the compile and steady totals and every case whose time moved "
                        "past the noise (by default one line counts them: another machine's "
                        "times differ for that alone); timing never fails a check")
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
  p.add_argument("--devices", metavar="N", type=positive_int,
                 help="run the batch sharded over N (simulated CPU) devices")
  p.add_argument("--axis-types", choices=("explicit", "auto"), default="explicit",
                 help="the mesh's axis type with --devices (default: explicit, as jax.make_mesh)")
  # rehearse --pytest hands check the user's tests' result, for its report and page.
  p.add_argument(PYTEST_RESULT_OPTION, metavar="FILE", help=argparse.SUPPRESS)

  p = sub.add_parser(
      "record", help="run the batch and write a baseline",
      description="Runs the batch and writes a baseline atomically.",
      epilog="On a terminal, stderr shows the case running (case n/N); piped, nothing extra.")
  p.add_argument("--out", metavar="DIR",
                 help="baseline directory (default, in a source checkout only: the shipped one)")
  p.add_argument("--force", action="store_true",
                 help="replace an existing baseline (with -k: merge the selection into it)")
  p.add_argument("-k", dest="pattern", metavar="PATTERN",
                 help="record only the cases whose name contains PATTERN or matches it as a "
                      "glob; into an existing baseline (with --force) they replace its own and "
                      "its other cases are kept; into a new one, a partial baseline that says so")
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
  p.add_argument("--good", metavar="SPEC",
                 help="the requirement set whose numbers are right, e.g. 'jax==0.9.0'")
  p.add_argument("--bad", metavar="SPEC",
                 help="the requirement set whose numbers moved, e.g. 'jax==0.10.2'")
  p.add_argument("--good-date", metavar="YYYY-MM-DD",
                 help="instead of --good: the kit's requirements, unpinned, as the registry held "
                      "them at the end of this day (uv --exclude-newer; needs uv)")
  p.add_argument("--bad-date", metavar="YYYY-MM-DD",
                 help="instead of --bad: the day whose set moved; bisect halves over the days "
                      "between on which any package of the set had a release, names the first "
                      "day that moved and what changed on it, then tries each change alone")
  p.add_argument("--resolve", action="store_true",
                 help="let pip choose, at each release, the newest version no newer than this "
                      "environment's of each package that depends on it (flax for jax)")
  p.add_argument("--pre", action="store_true",
                 help="walk pre-releases too (by default they are left out, as pip leaves them)")
  p.add_argument("-k", dest="pattern", metavar="PATTERN",
                 help="check only the kit's cases whose name contains PATTERN or matches it as "
                      "a glob, as check -k selects them (all are recorded); one that selects "
                      "none exits 2 before anything is built")
  p.add_argument("--html", metavar="OUT",
                 help="write the HTML page of the first moved release's failure to OUT: your "
                      "tests' where they failed, else the kit's (drawn in its environment)")
  p.add_argument("--pytest", metavar="PATH", nargs="*", default=None,
                 help="also record and check your nnx_regression tests (python -m pytest "
                      "PATH..., from this directory); give it last. Everything after a -- goes "
                      "to pytest untouched")
  p.add_argument("--no-batch", dest="batch", action="store_false",
                 help="skip the kit's own cases: only record and check your tests (--pytest)")
  from .launch import add_launch_parser  # imports this module's positive_int

  add_launch_parser(sub)
  return parser
