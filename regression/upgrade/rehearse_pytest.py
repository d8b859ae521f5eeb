"""The user's tests in a rehearsal environment: run as their own ``python -m pytest`` would
run them, guarded against another nnx_pool, and what they found read back for the report.

:func:`run_pytest` runs :data:`PYTEST_MAIN` with the environment's interpreter, from the
user's directory, comparing only by default; :func:`foreign_error` is the one line refusing a
run that imported another nnx_pool; :func:`read_result` reads what the run found (its exit
status, the tests by outcome, the ids that failed), which ``rehearse`` puts in its report,
its JSON and its page.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..constants import CHECK_ONLY_ENV
from .rehearse_cache import shown
from .rehearse_env import interpreter, site_packages, subprocess_env

PYTEST_RESULT_ENV = "NNX_POOL_PYTEST_RESULT"  # where PYTEST_MAIN's plugin writes the result

# The user's `python -m pytest`, run by `python -c` so that sys.path is the same (their
# directory first), with a guard: `import nnx_pool` must find the rehearsed nnx-pool, before
# pytest starts (a nnx_pool/ in their directory) and after it ends (one a conftest found).
# A foreign one is written to the file named by $NNX_POOL_REHEARSE_FOREIGN, and exits 4.
# Where $NNX_POOL_PYTEST_RESULT names a file, a plugin writes there what the run found: its
# exit status, the tests by outcome, and the ids of those that failed or errored.
PYTEST_MAIN = """\
import importlib.util, json, os, sys
class Result:
  def __init__(self, path):
    self.path, self.outcomes = path, {}
  def pytest_collectreport(self, report):
    if report.failed:
      self.outcomes[report.nodeid or "(collection)"] = "error"
  def pytest_runtest_logreport(self, report):
    if report.when == "call":
      xfail = hasattr(report, "wasxfail")
      outcome = ("xfailed" if report.skipped else "xpassed") if xfail else report.outcome
    elif report.failed or report.skipped:
      outcome = "error" if report.failed else "skipped"
    else:
      return
    if self.outcomes.get(report.nodeid) not in ("failed", "error"):
      self.outcomes[report.nodeid] = outcome
  def pytest_sessionfinish(self, session, exitstatus):
    counts = {}
    for outcome in self.outcomes.values():
      counts[outcome] = counts.get(outcome, 0) + 1
    failed = sorted(n for n, o in self.outcomes.items() if o in ("failed", "error"))
    with open(self.path + ".tmp", "w") as f:
      json.dump({"exit_status": int(exitstatus), "counts": counts, "failed": failed}, f)
    os.replace(self.path + ".tmp", self.path)
def foreign(origin):
  # Files, not directories, are compared: a package laid out as links to its files (the
  # venv `make` builds, tools/link_layout.py) is the same package.
  found = os.path.realpath(origin) if origin else "nowhere"
  wanted = os.path.realpath(os.path.join(os.environ["NNX_POOL_REHEARSED"], "__init__.py"))
  return found != wanted and (os.path.dirname(found) if origin else found)
def refuse(where):
  report = os.environ["NNX_POOL_REHEARSE_FOREIGN"]
  with open(report + ".tmp", "w") as f:
    f.write(where)
  os.replace(report + ".tmp", report)
  sys.exit(4)
spec = importlib.util.find_spec("nnx_pool")
if foreign(spec and spec.origin):
  refuse(foreign(spec and spec.origin))
import pytest
result = os.environ.get("NNX_POOL_PYTEST_RESULT")
# The arguments after -c's code, as `python -m pytest ARGS` reads them.
code = pytest.main(plugins=[Result(result)] if result else [])
module = sys.modules.get("nnx_pool")
if module is not None and foreign(module.__file__):
  refuse(foreign(module.__file__))
sys.exit(int(code))
"""


def rehearsed_package(env: Path) -> Path:
  """The directory ``import nnx_pool`` must find in the rehearsal environment ``env``."""
  return ([*site_packages(env), env][0]) / "nnx_pool"


def run_pytest(env: Path, paths: Sequence[str], *, rehearsed: Path, foreign: Path,
               check_only: bool = True, output: Path | None = None,
               tmp: Path | None = None, result: Path | None = None) -> int:
  """Runs the user's tests in the environment, in their directory, comparing only by default.

  Args:
    env: the rehearsal environment.
    paths: pytest's arguments.
    rehearsed: the nnx_pool package the tests must import (:func:`rehearsed_package`).
    foreign: where the guard writes the nnx_pool they found instead, if any.
    check_only: set :data:`~nnx_pool.regression.constants.CHECK_ONLY_ENV`; False lets the
      fixture record (``bisect`` records into its own ``--nnx-regression-dir``).
    output: write pytest's stdout and stderr to this file instead of this process's.
    tmp: the tests' temporary directory (``TMPDIR``, ``TEMP``, ``TMP``), created here: where
      a failing check-only comparison writes what it obtained. None: the system's.
    result: where pytest writes what it found (:func:`read_result`); None: nowhere.
  """
  command = [str(interpreter(env)), "-c", PYTEST_MAIN, "-p", "no:cacheprovider", *paths]
  environ = {**subprocess_env(env), CHECK_ONLY_ENV: "1" if check_only else "0",
             "NNX_POOL_REHEARSED": str(rehearsed), "NNX_POOL_REHEARSE_FOREIGN": str(foreign)}
  if result is not None:
    result.unlink(missing_ok=True)
    environ[PYTEST_RESULT_ENV] = str(result)
  if tmp is not None:
    tmp.mkdir(parents=True, exist_ok=True)
    environ.update(dict.fromkeys(("TMPDIR", "TEMP", "TMP"), str(tmp)))
  with contextlib.ExitStack() as stack:
    sink = None if output is None else stack.enter_context(output.open("w"))
    return subprocess.run(command, env=environ, stdin=subprocess.DEVNULL, stdout=sink,
                          stderr=None if sink is None else subprocess.STDOUT,
                          check=False).returncode


def read_result(path: Path, paths: Sequence[str], code: int, meaning: str) -> dict[str, Any]:
  """What the user's tests found, for the report: the command, its exit status and what it
  means, the tests by outcome (None where pytest wrote nothing: it stopped before the end)
  and the ids of those that failed or errored."""
  found: dict[str, Any] = {"counts": None, "failed": []}
  with contextlib.suppress(OSError, ValueError):
    data = json.loads(path.read_text())
    if isinstance(data, dict):
      found.update({k: data[k] for k in ("counts", "failed") if k in data})
  return {"command": shlex.join(["pytest", *paths]), "exit_status": code, "meaning": meaning,
          **found}


def foreign_error(foreign: Path, rehearsed: Path) -> str | None:
  """The one line refusing a pytest run that imported another nnx_pool; None if it did not."""
  try:
    where = foreign.read_text()
  except FileNotFoundError:
    return None
  return (f"rehearse: pytest would import nnx_pool from {where}, not the rehearsed one "
          f"({shown(rehearsed)}), so its results would not be the rehearsal's; a nnx_pool "
          f"package in {os.getcwd()} (or a path your conftest adds) comes first. Run rehearse "
          "--pytest from a directory without one.")
