"""``rehearse``: ``check`` run in a throwaway environment, this one changed by named requirements.

``nnx-pool-regression rehearse jax==0.9.2`` says what a change of versions would do to
the numbers before anything here changes. It:

1. plans the environment: this nnx-pool and its dependencies, each at the version
   installed here, except what the requirements name
   (:mod:`nnx_pool.regression.upgrade.rehearse_plan`);
2. creates it (the standard library's :mod:`venv`, with pip) and installs the plan
   there, or reuses one built earlier for the same requirement set
   (:mod:`.rehearse_env`, :mod:`.rehearse_cache`);
   a failed install is one line (:mod:`nnx_pool.regression.upgrade.pip_messages`);
3. runs ``check`` there against a baseline of this environment (the shipped one by
   default) and returns its report, with the version changes the rehearsal made
   marked ``(rehearsal)``: ``jax 0.10.2 -> 0.9.2 (rehearsal)``;
4. with ``pytest_paths``, runs the user's ``python -m pytest ARGS`` there too, before
   ``check`` (:mod:`.rehearse_pytest`), in the user's directory, with
   ``NNX_REGRESSION_CHECK_ONLY=1``, so the ``nnx_regression`` fixture compares with the
   recorded baselines and never writes one; what it found (exit status, tests by outcome,
   the ids that failed) goes into the report, its JSON and ``check``'s page. ``batch=False``
   (``--no-batch``) skips step 3: only the user's tests run, and the report compares the
   two environments' stamps.

This environment is never modified: see :mod:`nnx_pool.regression.upgrade.rehearse_env`.

Nothing here prints: :mod:`nnx_pool.regression.cli` renders the report, and
``progress`` is told of each step. The run's ``check`` and ``pytest`` write to this
process's stderr (tracebacks, the ``case n/N`` line on a terminal); ``pytest`` writes
its report to stdout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .. import store
from ..report import Report
from ..stamp import git_revision, installed_versions, labelled_changes
from . import installer, preflight, rehearse_cache, rehearse_env, rehearse_pytest
from .rehearse_env import Job, StepProgress, Steps
from .rehearse_plan import (
  Plan,
  RehearsalError,
  admits,
  dependencies,
  installed_depends,
  installed_pins,
  make_plan,
)
from .rehearse_source import this_source

T = TypeVar("T")

# pytest's exit status -> (rehearse's exit code, what it means).
PYTEST_EXITS = {0: (0, "passed"), 1: (1, "tests failed"), 2: (2, "interrupted"),
                3: (2, "internal error"), 4: (2, "usage error"), 5: (2, "no tests collected")}


def combined_exit(check: int, pytest: int | None) -> int:
  """rehearse's exit code: the worse of ``check``'s and ``pytest``'s (see :data:`PYTEST_EXITS`)."""
  if pytest is None:
    return check
  return max(check, PYTEST_EXITS.get(pytest, (2, ""))[0])


def rehearsal_changes(old: Mapping[str, Any], new: Mapping[str, Any],
                      here: Mapping[str, str | None]) -> list[str]:
  """:func:`~nnx_pool.regression.stamp.stamp_changes`, each version the rehearsal changed marked.

  Args:
    old: the baseline's stamp.
    new: the rehearsal's stamp.
    here: this environment's versions (:func:`~nnx_pool.regression.stamp.installed_versions`).

  Returns:
    Lines like ``jax 0.10.2 -> 0.9.2 (rehearsal)``; a change the rehearsal did not make
    (the baseline was recorded elsewhere) is not marked.
  """
  versions = new.get("versions") or {}
  lines = []
  for label, line in labelled_changes(old, new):
    ours = label in versions and versions[label] != here.get(label)
    lines.append(line + (" (rehearsal)" if ours else ""))
  return lines


def resolved_notes(plan: Plan, there: Mapping[str, str], pins: Mapping[str, str],
                   depends: Mapping[str, Sequence[str]]) -> list[str]:
  """What ``--resolve`` chose, and why: each dependent whose version differs from this one's.

  Args:
    plan: the plan (its ``resolved`` dependents).
    there: the rehearsal environment's versions
      (:func:`~nnx_pool.regression.upgrade.rehearse_env.environment_versions`).
    pins: this environment's versions.
    depends: what each package here requires
      (:func:`~nnx_pool.regression.upgrade.rehearse_plan.installed_depends`).
  """
  if not plan.resolve:
    return []
  notes = []
  for name in plan.resolved:
    chosen, here = there.get(name), pins.get(name)
    if chosen is None or chosen == here:
      continue
    why = next((f"{name} {here}, this environment's, requires {dep}{spec}, which excludes "
                f"{dep} {there[dep]}" for dep, spec in dependencies(depends.get(name, ())).items()
                if dep in there and not admits(spec, there[dep])),
               f"the newest {name} no newer than this environment's {here} that pip could "
               "install with the requirements")
    notes.append(f"rehearsal: --resolve chose {name} {chosen} ({why})")
  return notes or ["rehearsal: --resolve kept every dependent at this environment's version"]


@dataclasses.dataclass
class _Outcome:
  """What ran in the environment: check's exit code and report, pytest's status, and where."""

  code: int
  json_path: Path
  there: dict[str, str]  # the environment's versions
  tested: int | None = None
  result: dict[str, Any] | None = None  # what the user's tests found (read_result)
  error: str | None = None
  where: str = ""
  disk: str = ""  # the environment's disk (disk), where it is kept


def _run_there(env: Path, job: Job, run: _Run) -> _Outcome:
  """Runs the user's tests first, so that check's report and page hold their result, then
  check (or, without the batch, info for the stamp)."""
  json_path = job.scratch / "check.json"
  tested = result = error = None
  result_path = job.scratch / "pytest-result.json"
  if run.pytest_paths is not None:
    job.steps.next(f"running {shlex.join(['pytest', *run.pytest_paths])}")
    job.steps.clear()
    rehearsed = rehearse_pytest.rehearsed_package(env)
    foreign = job.scratch / "foreign-nnx-pool.txt"
    tested = rehearse_pytest.run_pytest(env, run.pytest_paths, rehearsed=rehearsed,
                                        foreign=foreign, result=result_path)
    error = rehearse_pytest.foreign_error(foreign, rehearsed)
    meaning = PYTEST_EXITS.get(tested, (2, "an unknown status"))[1]
    result = rehearse_pytest.read_result(result_path, run.pytest_paths, tested, meaning)
    store.write_atomic(result_path, json.dumps(result).encode())
  if run.batch:
    job.steps.next("running check")
    job.steps.clear()  # check draws its own case n/N line
    code = rehearse_env.run_check(env, run.baseline, json_path, pattern=run.pattern,
                                  dry_run=run.dry_run, html=run.html, scratch=job.scratch,
                                  pytest_result=None if result is None else result_path)
  else:
    job.steps.next("reading the environment's stamp (info)")
    code = rehearse_env.run_info(env, json_path, scratch=job.scratch)
  return _Outcome(code, json_path, rehearse_env.environment_versions(env), tested, result,
                  error)


def rehearse(
    requirements: Sequence[str],
    *,
    baseline: str | os.PathLike,
    pattern: str | None = None,
    dry_run: bool = False,
    html: str | os.PathLike | None = None,
    pytest_paths: Sequence[str] | None = None,
    batch: bool = True,
    cache: bool = True,
    resolve: bool = False,
    progress: StepProgress | None = None,
) -> Report:
  """Runs ``check`` (and the user's tests) in an environment changed by ``requirements``.

  Args:
    requirements: PEP 508 requirements applied over this environment's versions.
    baseline: the baseline to compare with (a directory here).
    pattern: ``check -k``: only the cases it selects.
    dry_run: ``check --dry-run``: report drift, exit 0.
    html: ``check --html``: the page to write (the ``report`` extra is installed there).
    pytest_paths: also run ``python -m pytest`` with these arguments there (paths, then any
      option, handed to pytest untouched), comparing only; None runs no pytest.
    batch: run the kit's own cases (``check``); False runs only the user's tests, and the
      report's environment changes are those between this environment and the rehearsal's.
    cache: keep the environment under
      :func:`~nnx_pool.regression.upgrade.rehearse_cache.cache_root` and reuse it; False builds a
      throwaway one and removes it.
    resolve: let pip choose older versions of the packages that depend on a released one.
    progress: the CLI's progress line, told of each step.

  Returns:
    The report of ``check``, its version changes marked ``(rehearsal)``, with notes
    naming the environment, what ``resolve`` chose, and pytest's outcome. Exit code:
    :func:`combined_exit` of ``check``'s and pytest's; 2 with a one-line ``error`` when
    the requirements are malformed, pip cannot install them, ``check`` ran without
    writing a report, or the tests imported another nnx_pool.
  """
  try:
    if batch:
      preflight.kit_pattern(pattern, "rehearse")  # before minutes of pip, not after
    source = this_source()
    pins = installed_pins()
    depends = installed_depends() if resolve else {}
    plan = make_plan(requirements, pins=pins, requires=source.requires, html=html is not None,
                     pytest=pytest_paths is not None, resolve=resolve, depends=depends)
    keep = rehearse_cache.keep_count() if cache else 0
    chosen = installer.choose()
  except RehearsalError as e:
    return Report(command="check", exit_code=2, error=str(e))
  here = installed_versions()
  # The checkout's revision now, as the copy installed below is taken (None from a wheel).
  git = git_revision(source.root) if source.root is not None else None
  run = _Run(Path(baseline).absolute(), pattern, dry_run,
             None if html is None else Path(html).absolute(),
             None if pytest_paths is None else tuple(pytest_paths), batch)
  with tempfile.TemporaryDirectory(prefix="nnx-pool-rehearse-") as tmp:
    job = Job(plan, source, Path(tmp), Steps(progress, 2 + run.then()), pins, chosen)
    try:
      outcome = _in_cache(job, run) if cache else _in_throwaway(job, run)
    except RehearsalError as e:
      return Report(command="check", exit_code=2, error=str(e))
    report = (_report(outcome.json_path, outcome.code, here, git) if batch
              else _stamp_report(outcome.json_path, outcome.code, here, git))
  report.baseline = str(baseline) if batch else None
  others = ("everything else at this environment's versions, or older where --resolve chose"
            if resolve else "everything else at this environment's versions")
  what = "check ran" if batch else "your tests ran (--no-batch: not the kit's own cases)"
  report.notes += [f"rehearsal: {line}" for line in (chosen.why + outcome.disk, *job.notes)]
  report.notes.append(f"rehearsal: {what} in a separate environment with "
                      f"{' '.join(plan.changes)}, {others}; {outcome.where}")
  report.notes += resolved_notes(plan, outcome.there, pins, depends)
  if cache:
    removed = rehearse_cache.prune(rehearse_cache.cache_root(), keep, plan.key())
    if removed:
      report.notes.append(f"rehearsal: removed {len(removed)} cached environment(s) used least "
                          f"recently, keeping {keep} ({rehearse_cache.KEEP_ENV} changes it)")
  return _fold_pytest(report, outcome)


@dataclasses.dataclass(frozen=True)
class _Run:
  """What runs in the environment: check's options, and pytest's arguments."""

  baseline: Path
  pattern: str | None
  dry_run: bool
  html: Path | None
  pytest_paths: tuple[str, ...] | None
  batch: bool = True

  def then(self) -> int:
    """The steps that follow the environment's set-up: check (or info), and pytest."""
    return 1 + (self.pytest_paths is not None)


def in_cache(job: Job, then: int, work: Callable[[Path], T]) -> tuple[T, str]:
  """Runs ``work(env)`` in the cached environment of the plan, built or brought up to date first.

  The cache entry's lock is held throughout. ``then``: the steps ``work`` takes, for the
  progress line's total. Returns what ``work`` returned, and how the environment was made
  ready (:func:`~nnx_pool.regression.upgrade.rehearse_env.prepare`: built, updated or reused).
  """
  entry = rehearse_cache.cache_root() / job.plan.key()

  def waiting() -> None:
    job.steps.show("waiting for another rehearsal using this environment")

  try:
    with rehearse_cache.take(entry, waiting):
      how = rehearse_env.prepare(entry, job, then)
      rehearse_cache.mark_used(entry)
      result = work(entry / rehearse_cache.ENV_DIR)
  except BaseException:
    with contextlib.suppress(OSError):
      entry.rmdir()  # only if a failed build left it empty
    raise
  return result, how


def _in_cache(job: Job, run: _Run) -> _Outcome:
  """Runs in the cached environment of the plan, built or brought up to date first."""
  outcome, how = in_cache(job, run.then(), lambda env: _run_there(env, job, run))
  env = rehearse_cache.cache_root() / job.plan.key() / rehearse_cache.ENV_DIR
  outcome.where = f"environment {rehearse_cache.shown(env)} ({how})"
  outcome.disk = f"; the environment: {disk(env)}"
  return outcome


def _in_throwaway(job: Job, run: _Run) -> _Outcome:
  """Runs in an environment built in the scratch directory, removed with it."""
  env = job.scratch / rehearse_cache.ENV_DIR
  started = time.monotonic()
  rehearse_env.build(env, job)
  built = time.monotonic() - started
  outcome = _run_there(env, job, run)
  outcome.where = f"a throwaway environment, built in {built:.0f} s and removed"
  return outcome


def disk(env: Path) -> str:
  """``12 MB of its own, 700 MB linked from uv's cache``: an environment's disk."""
  own, linked = rehearse_cache.disk_use([env])
  return f"{own / 1e6:.0f} MB of its own" + (
      f", {linked / 1e6:.0f} MB linked from uv's cache" if linked else "")


def _fold_pytest(report: Report, outcome: _Outcome) -> Report:
  """pytest's outcome in the report's notes, its ``pytest`` field, error and exit code."""
  tested, result = outcome.tested, outcome.result
  if tested is not None and result is not None:
    counts = ", ".join(f"{n} {what}" for what, n in sorted((result["counts"] or {}).items()))
    text = (f"{result['command']} exited {tested} ({result['meaning']}"
            f"{'; ' + counts if counts else ''}), comparing only")
    report.notes.append(f"rehearsal: {text}")
    report.pytest = result
    if outcome.error:
      report.error = outcome.error + (f"; {report.error}" if report.error else "")
    elif report.error:
      report.error += f"; {text}"
  code = outcome.code
  report.exit_code = combined_exit(code if report.error is None else code or 2, tested)
  if outcome.error:
    report.exit_code = 2
  return report


def _stamp_report(json_path: Path, code: int, here: Mapping[str, str | None],
                  git: dict[str, Any] | None) -> Report:
  """The report of a rehearsal without the batch: the rehearsal's stamp against this
  environment's, its changes marked; no rows."""
  from ..stamp import collect_stamp

  try:
    there = json.loads(json_path.read_text())["stamp"]
    if not isinstance(there, dict):
      raise TypeError(type(there).__name__)
  except (OSError, ValueError, KeyError, TypeError):
    return Report(command="check", exit_code=code or 2, error=(
        f"rehearse: info in the rehearsal environment exited {code} without a readable "
        "stamp; its messages above say why."))
  if git is not None and not (there.get("git") or {}).get("revision"):
    there["git"] = git
  mine = collect_stamp()
  report = Report(command="check", stamp=there, baseline_stamp=mine)
  report.stamp_changes = rehearsal_changes(mine, there, here)
  report.notes.append("rehearsal: --no-batch: the kit's own cases did not run; the environment "
                      "changes are this environment's against the rehearsal's")
  return report


def _report(json_path: Path, code: int, here: Mapping[str, str | None],
            git: dict[str, Any] | None) -> Report:
  """The child's report, its stamp's git that of the checkout installed, its changes marked."""
  try:
    report = Report.from_json(json.loads(json_path.read_text()))
  except (OSError, ValueError, KeyError, TypeError):
    return Report(command="check", exit_code=code or 2, error=(
        f"rehearse: check in the rehearsal environment exited {code} without a readable "
        "report; its messages above say why."))
  if report.stamp and git is not None and not (report.stamp.get("git") or {}).get("revision"):
    report.stamp["git"] = git  # the code installed there is this checkout's
  if report.stamp and report.baseline_stamp:
    report.stamp_changes = rehearsal_changes(report.baseline_stamp, report.stamp, here)
  return report
