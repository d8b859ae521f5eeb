"""One step of a bisect: a release's environment made ready, the baselines recorded there (the
good end) or checked (every other release), and what the step found."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import json
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from packaging.version import Version

from ..report import Report
from . import installer, rehearse, rehearse_cache, rehearse_env, rehearse_pytest
from .bisect_here import Here
from .bisect_plan import GOOD, MOVED, SKIP, Span, duration, label
from .rehearse_env import Job, StepProgress, Steps, own_requirements
from .rehearse_plan import RehearsalError, installed_depends, installed_pins, make_plan
from .rehearse_source import this_source

RECORDED = "recorded"
USER_DIR = "user"  # the bisect's directory of the baselines the user's tests record


FAILED = "failed"  # the good set not recorded, or an end not installed or tested


HERE = "this environment"  # a step's `how` where it ran in this interpreter's environment


@dataclasses.dataclass
class Step:
  """One release recorded or checked.

  Attributes:
    release: the bisected package's release.
    verdict: :data:`RECORDED` (the good one), :data:`~nnx_pool.regression.upgrade.bisect_plan.GOOD`,
      ``MOVED``, ``SKIP`` (a release between the ends that could not be installed or
      tested), or :data:`FAILED` (an end that could not be).
    label: the release with the versions beside it (:func:`~.bisect_plan.label`).
    seconds: how long the step took, its environment's build included.
    how: how its environment was made ready (built, updated, reused), or "this environment".
    not_here: why it did not run in this environment, whose versions it fits (its extras,
      a local build, a jax plugin here); empty otherwise.
    env: the cached environment it ran in (None: this environment, or none was built).
    why: what could not be installed or tested (``SKIP``), or recorded (a failed record).
    report: the kit's check (None without the batch, or where check wrote no report).
    tests: pytest's output (with ``pytest_paths``).
    tested: pytest's exit status.
    page: the HTML page of its failure, with ``html``.
    tmp: its tests' temporary directory, inside the bisect's: what a failing check obtained
      lies there.
  """

  release: Version | datetime.date
  verdict: str = SKIP
  label: str = ""
  seconds: float = 0.0
  how: str = ""
  not_here: str = ""
  env: Path | None = None
  why: str = ""
  report: Report | None = None
  tests: str | None = None
  tested: int | None = None
  page: Path | None = None
  tmp: Path | None = None

  @property
  def built(self) -> bool:
    """Whether this step built its environment (an install)."""
    return self.how.startswith("built")

  def line(self, n: int) -> str:
    """``bisect: step 3: jax 0.9.2 (...): good, 50 s (environment built in 47 s)``."""
    word = "skipped" if self.verdict == SKIP else self.verdict
    what = f"{word}, {self.why}" if self.why else word
    where = ("" if not self.how else f" ({self.how})" if self.how == HERE
             else f" (environment {self.how}" + (f"; not run here: {self.not_here})"
                                                 if self.not_here else ")"))
    return f"bisect: step {n}: {self.label}: {what}, {duration(self.seconds)}{where}"


@dataclasses.dataclass
class Bisected:
  """What a bisect found.

  Attributes:
    exit_code: 1 a first moved release was found, 0 the bad set passes, 2 bad input or a
      set that could not be installed, recorded or checked.
    error: the one-line reason for exit code 2.
    answer: the last line: ``first moved: jax 0.10.0 (...), last good: jax 0.9.2``.
    total: steps, installs, minutes and disk.
    steps: every step, in order.
    moved: the first moved release's step (its report, its tests' output, its page).
    notes: releases left out of the walk, environments the cache removed.
    log: pytest's output where recording the user's tests failed.
  """

  exit_code: int
  error: str | None = None
  answer: str = ""
  total: str = ""
  steps: list[Step] = dataclasses.field(default_factory=list)
  moved: Step | None = None
  notes: list[str] = dataclasses.field(default_factory=list)
  log: str | None = None


class _StepLine:
  """The progress line of one step: ``bisect: step 3/5 jax 0.9.2: installing ...``."""

  def __init__(self, progress: StepProgress | None, n: int, total: int, what: str):
    self.progress, self.n, self.total, self.what = progress, n, total, what

  def __call__(self, _n: int, _total: int, text: str, /) -> None:
    if self.progress is not None:
      self.progress(self.n, max(self.n, self.total), f"{self.what}: {text}")

  def clear(self) -> None:
    if self.progress is not None:
      self.progress.clear()


@dataclasses.dataclass
class StepRunner:
  """One bisect's settings, and where it keeps its baselines."""

  span: Span | None  # None: bisect by date (name labels the steps)
  scratch: Path
  resolve: bool
  batch: bool
  pytest_paths: tuple[str, ...] | None
  pattern: str | None
  html: bool
  progress: StepProgress | None
  expected: int
  here: Path | None = None
  # A step's label from its release and versions (bisect by date names the day); default
  # bisect_plan.label of the span's package.
  name: Callable[[Version | datetime.date, dict[str, str]], str] | None = None

  def labelled(self, release: Version | datetime.date, versions: dict[str, str]) -> str:
    """The step's label: :attr:`name`'s, else :func:`~.bisect_plan.label`."""
    if self.name is not None or self.span is None:
      return self.name(release, versions) if self.name is not None else str(release)
    return label(self.span.package, str(release), versions)

  def __post_init__(self) -> None:
    self.source = this_source()
    self.pins = installed_pins()
    self.depends = installed_depends() if self.resolve else {}
    self.kit = self.scratch / "kit"
    self.user = self.scratch / USER_DIR
    self.present = Here.read(self.here) if self.here is not None else None
    self.installer = installer.choose()
    self.notes: list[str] = []  # the installer's (uv copied, not linked)
    # What an environment built for a step holds besides the set (bisect_here.Here.differs).
    self.also = [*own_requirements(self.source.requires, ("report",) if self.html else ()),
                 *["pytest"] * (self.pytest_paths is not None)]

  def _runs_here(self, requirements: Sequence[str]) -> tuple[bool, str]:
    if self.present is None:
      return False, ""
    return self.present.differs(requirements, self.also)

  def run(self, n: int, release: Version | datetime.date, requirements: Sequence[str], then: int,
          work: Callable[[Path, Path, Steps, Step], None]) -> Step:
    """Runs ``work(env, rehearsed, steps, step)`` where ``requirements`` are installed."""
    step = Step(release, label=self.labelled(release, {}))
    started = time.monotonic()
    steps = Steps(_StepLine(self.progress, n, self.expected, step.label), then)
    try:
      runs_here, step.not_here = self._runs_here(requirements)
      here = self.here if runs_here else None
      if here is not None:
        spec = importlib.util.find_spec("nnx_pool")
        package = Path(spec.origin).parent if spec and spec.origin else here
        step.how = HERE
        work(here, package, steps, step)
      else:
        plan = make_plan(requirements, pins=self.pins, requires=self.source.requires,
                         html=self.html, pytest=self.pytest_paths is not None,
                         resolve=self.resolve, depends=self.depends)
        job = Job(plan, self.source, self.scratch, steps, self.pins, self.installer, self.notes)
        _, step.how = rehearse.in_cache(
            job, then, lambda env: work(env, rehearse_pytest.rehearsed_package(env), steps, step))
        step.env = rehearse_cache.cache_root() / plan.key() / rehearse_cache.ENV_DIR
    except RehearsalError as e:
      step.verdict, step.why = SKIP, f"could not be installed: {str(e).removeprefix('rehearse: ')}"
    finally:
      steps.clear()
    step.seconds = time.monotonic() - started
    return step

  def _pytest(self, env: Path, rehearsed: Path, extra: Sequence[str], name: str, *,
              check_only: bool = True) -> tuple[int, str]:
    """Runs the user's tests there with the bisect's baselines; their status and output.

    The options are written ``--option=VALUE``: pytest takes a separate argument that names
    an existing path for one of the paths to test when it chooses its rootdir, which would
    then differ between the run that records and those that check.
    """
    log, foreign = self.scratch / f"{name}.log", self.scratch / f"{name}.foreign"
    # Their own TMPDIR: what a failing check obtained stays in the bisect's directory.
    code = rehearse_pytest.run_pytest(
        env, [*(self.pytest_paths or ()), f"--nnx-regression-dir={self.user}", *extra],
        rehearsed=rehearsed, foreign=foreign, check_only=check_only, output=log,
        tmp=self.scratch / f"{name}.tmp")
    error = rehearse_pytest.foreign_error(foreign, rehearsed)
    if error:
      raise Fatal(error.replace("rehearse:", "bisect:", 1))
    return code, log.read_text(errors="replace")

  def record(self, env: Path, rehearsed: Path, steps: Steps, step: Step) -> None:
    """Records the kit's batch and the user's tests there (see the module docstring)."""
    step.label = self.labelled(step.release, rehearse_env.environment_versions(env))
    if self.batch:
      steps.next("recording the kit's baselines (record)")
      steps.clear()  # record draws its own case n/N line
      code = _kit(env, ["record", "--out", str(self.kit)], self.scratch)
      if code != 0:
        step.verdict, step.why = FAILED, f"record exited {code} (its messages above say why)"
        return
    if self.pytest_paths is not None:
      steps.next("recording your tests' baselines (pytest)")
      code, step.tests = self._pytest(env, rehearsed, [], "record", check_only=False)
      if code not in (0, 1):
        step.verdict = FAILED
        step.why = f"pytest exited {code} ({_meaning(code)}) recording your tests"
        return
      steps.next("checking your tests against what they recorded (pytest)")
      step.tested, step.tests = self._pytest(env, rehearsed, [], "recheck")
      if step.tested != 0:
        step.verdict = FAILED
        step.why = (f"your tests fail where they recorded their baselines (pytest exited "
                    f"{step.tested}, {_meaning(step.tested)}): a test that varies from run to "
                    "run, or fails for another reason, cannot be bisected; fix it first")
        return
    step.verdict = RECORDED

  def check(self, env: Path, rehearsed: Path, steps: Steps, step: Step, n: int) -> None:
    """Checks the recorded baselines there; sets the step's verdict."""
    step.label = self.labelled(step.release, rehearse_env.environment_versions(env))
    pages = []
    problems = []
    code = None
    if self.batch:
      steps.next("running check")
      steps.clear()  # check draws its own case n/N line
      out, page = self.scratch / f"check-{n}.json", self.scratch / f"kit-{n}.html"
      code = rehearse_env.run_check(env, self.kit, out, pattern=self.pattern, dry_run=False,
                                    html=page if self.html else None, scratch=self.scratch)
      step.report = _read_report(out)
      pages.append(page)
      if code not in (0, 1) or step.report is None:
        problems.append(f"check exited {code} (its messages above say why)")
      elif _platform_changes(step.report):
        problems.append(f"it ran on another platform than the recording "
                        f"({', '.join(_platform_changes(step.report))}), which no release moves")
    if self.pytest_paths is not None:
      steps.next("running your tests (pytest)")
      page = self.scratch / f"tests-{n}.html"
      extra = [f"--nnx-regression-html={page}"] if self.html else []
      step.tested, step.tests = self._pytest(env, rehearsed, extra, f"check-{n}")
      step.tmp = self.scratch / f"check-{n}.tmp"
      pages.insert(0, page)  # your tests' page first: your model is the question
      if step.tested not in (0, 1):
        problems.append(f"pytest exited {step.tested} ({_meaning(step.tested)})")
    step.page = next((p for p in pages if p.is_file()), None)
    if problems:
      step.verdict, step.why = SKIP, "could not be tested: " + "; ".join(problems)
    else:
      step.verdict = MOVED if 1 in (code, step.tested) else GOOD


def bad_end(found: Bisected, first: Step, check_last: Callable[[], Step], good: str,
            bad: str) -> Step | None:
  """The bad set's step, checked once the good one (``first``) recorded; None where the
  bisect ends at its ends, ``found`` then saying why: the baselines could not be recorded
  with the good set (``good``: how the command names it, ``--good (jax 0.9.0)``), the bad
  set (``bad``: its option) failed, or nothing moved."""
  if first.verdict != RECORDED:
    found.exit_code, found.log = 2, first.tests
    found.error = f"bisect: could not record the baselines with {good}: {first.why}."
    return None
  last = check_last()
  if last.verdict not in (GOOD, MOVED):
    found.exit_code = 2
    found.error = f"bisect: the {bad} set ({last.label}) {last.why}; nothing was bisected."
    return None
  if last.verdict == GOOD:
    found.answer = (f"nothing moved: {last.label} passes against the baselines recorded with "
                    f"{first.label}; nothing to bisect")
    return None
  return last


class Fatal(Exception):
  """A step failed in a way no other release would mend (exit 2, one line)."""


def _meaning(code: int | None) -> str:
  return rehearse.PYTEST_EXITS.get(code if code is not None else -1, (2, "an unknown status"))[1]


def _kit(env: Path, args: Sequence[str], scratch: Path) -> int:
  """Runs ``python -m nnx_pool.regression ARGS`` there (stdout dropped, stderr shown)."""
  command = [str(rehearse_env.interpreter(env)), "-P", "-m", "nnx_pool.regression", *args]
  return subprocess.run(command, cwd=scratch, env=rehearse_env.subprocess_env(env),
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                        check=False).returncode


def _platform_changes(report: Report) -> list[str]:
  """The report's environment changes of the device (``platform cpu -> gpu``)."""
  return [line for line in report.stamp_changes if line.split(" ", 1)[0] in _PLATFORM]


_PLATFORM = ("platform", "device_kind", "device_count", "machine", "python_implementation")


def _read_report(path: Path) -> Report | None:
  try:
    return Report.from_json(json.loads(path.read_text()))
  except (OSError, ValueError, KeyError, TypeError):
    return None
