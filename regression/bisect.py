"""``bisect``: which release between a good and a bad requirement set moved the numbers.

``nnx-pool-regression bisect --good 'jax==0.9.0' --bad 'jax==0.10.2' --resolve`` answers
the question a failing check after an upgrade asks next. It:

1. finds the one package the two sets differ in, and lists the registry's releases of it
   between them (``pip index versions``, read by :mod:`nnx_pool.regression.bisect_plan`);
2. records the baselines in the good set's environment, into a temporary directory: the
   kit's batch (``record``) and, with ``pytest_paths``, the user's ``nnx_regression`` tests
   (``--nnx-regression-dir``), which then run once more there, comparing only, so that a
   test that fails there for another reason is named before anything is blamed on a
   release. The user's own baselines are never read or written;
3. checks them in the bad set's environment (the bad set passing: nothing to bisect), then
   in the release halfway between the last good and the first moved one, until the two
   are neighbours. A release that cannot be installed or tested is skipped and the halving
   goes around it, as ``git bisect skip`` does.

Every environment is the rehearsal cache's (:func:`nnx_pool.regression.rehearse.in_cache`),
built and kept current as ``rehearse`` builds it, and reused by later bisects and
rehearsals. A set that this environment already satisfies (the bad set ``jax==0.10.2``
where jax 0.10.2 is installed) runs here instead, building nothing; nothing is written into
this environment either way.

Nothing here prints but ``say``, told one line per step (the release, its verdict, the
time, how its environment was made); :mod:`nnx_pool.regression.cli` prints the rest.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from packaging.version import Version

from nnx_pool.regression import rehearse, rehearse_cache, rehearse_env, store
from nnx_pool.regression.bisect_plan import (
    GOOD,
    MOVED,
    SKIP,
    Halving,
    Listing,
    Span,
    Walk,
    duration,
    find_span,
    fits,
    label,
    parse_index,
    parse_set,
    partner_of,
    releases_between,
)
from nnx_pool.regression.rehearse_env import Job, StepProgress, Steps
from nnx_pool.regression.rehearse_plan import (
    RehearsalError,
    installed_depends,
    installed_pins,
    make_plan,
)
from nnx_pool.regression.rehearse_source import this_source
from nnx_pool.regression.report import Report

Lister = Callable[[str, bool], Listing]
RECORDED = "recorded"
FAILED = "failed"  # the good set not recorded, or an end not installed or tested
HERE = "this environment"  # a step's `how` where it ran in this interpreter's environment


def registry_releases(name: str, pre: bool) -> Listing:
  """The releases of ``name`` that pip would install here, and those it leaves out as yanked.

  Runs ``python -m pip index versions NAME -vv`` with this interpreter's pip, which reads
  the same configuration (index, find-links) as the pip of a rehearsal environment.

  Raises:
    RehearsalError: pip is missing or could not list the package (one line naming why).
  """
  command = [sys.executable, "-m", "pip", "index", "versions", name, "-vv",
             "--disable-pip-version-check", "--no-input", *(["--pre"] if pre else [])]
  done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                        check=False)
  output = done.stdout + done.stderr
  if done.returncode != 0:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    why = next((line.removeprefix("ERROR: ") for line in reversed(lines)
                if line.startswith("ERROR: ")), lines[-1] if lines else "no message")
    raise RehearsalError(f"bisect: could not list the releases of {name} with pip index "
                         f"versions (exit {done.returncode}): {why}")
  return parse_index(output)


def this_environment() -> Path | None:
  """This interpreter's virtual environment, where a set it satisfies runs; None outside one."""
  env = Path(sys.prefix)
  if sys.prefix == sys.base_prefix or not rehearse_env.interpreter(env).exists():
    return None
  return env


def _size(env: Path) -> int:
  """The bytes of the files under ``env`` (links not followed)."""
  return sum(st.st_size for path in env.rglob("*")
             if stat.S_ISREG((st := path.lstat()).st_mode))


@dataclasses.dataclass
class Step:
  """One release recorded or checked.

  Attributes:
    release: the bisected package's release.
    verdict: :data:`RECORDED` (the good one), :data:`~nnx_pool.regression.bisect_plan.GOOD`,
      ``MOVED``, ``SKIP`` (a release between the ends that could not be installed or
      tested), or :data:`FAILED` (an end that could not be).
    label: the release with the versions beside it (:func:`~nnx_pool.regression.bisect_plan.label`).
    seconds: how long the step took, its environment's build included.
    how: how its environment was made ready (built, updated, reused), or "this environment".
    env: the cached environment it ran in (None: this environment, or none was built).
    why: what could not be installed or tested (``SKIP``), or recorded (a failed record).
    report: the kit's check (None without the batch, or where check wrote no report).
    tests: pytest's output (with ``pytest_paths``).
    tested: pytest's exit status.
    page: the HTML page of its failure, with ``html``.
  """

  release: Version
  verdict: str = SKIP
  label: str = ""
  seconds: float = 0.0
  how: str = ""
  env: Path | None = None
  why: str = ""
  report: Report | None = None
  tests: str | None = None
  tested: int | None = None
  page: Path | None = None

  @property
  def built(self) -> bool:
    """Whether this step built its environment (an install)."""
    return self.how.startswith("built")

  def line(self, n: int) -> str:
    """``bisect: step 3: jax 0.9.2 (...): good, 50 s (environment built in 47 s)``."""
    word = "skipped" if self.verdict == SKIP else self.verdict
    what = f"{word}, {self.why}" if self.why else word
    where = ("" if not self.how else f" ({self.how})" if self.how == HERE
             else f" (environment {self.how})")
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
class _Bisect:
  """One bisect's settings, and where it keeps its baselines."""

  span: Span
  scratch: Path
  resolve: bool
  batch: bool
  pytest_paths: tuple[str, ...] | None
  pattern: str | None
  html: bool
  progress: StepProgress | None
  expected: int
  here: Path | None = None
  here_versions: dict[str, str] = dataclasses.field(default_factory=dict)

  def __post_init__(self) -> None:
    self.source = this_source()
    self.pins = installed_pins()
    self.depends = installed_depends() if self.resolve else {}
    self.kit = self.scratch / "kit"
    self.user = self.scratch / "user"
    if self.here is not None:
      self.here_versions = rehearse_env.environment_versions(self.here)

  def _runs_here(self, requirements: Sequence[str]) -> bool:
    needs = ["pytest"] * (self.pytest_paths is not None) + ["matplotlib"] * self.html
    return (self.here is not None and fits(requirements, self.here_versions)
            and all(name in self.here_versions for name in needs))

  def run(self, n: int, release: Version, requirements: Sequence[str], then: int,
          work: Callable[[Path, Path, Steps, Step], None]) -> Step:
    """Runs ``work(env, rehearsed, steps, step)`` where ``requirements`` are installed."""
    step = Step(release, label=f"{self.span.package} {release}")
    started = time.monotonic()
    steps = Steps(_StepLine(self.progress, n, self.expected, step.label), then)
    try:
      here = self.here if self._runs_here(requirements) else None
      if here is not None:
        spec = importlib.util.find_spec("nnx_pool")
        package = Path(spec.origin).parent if spec and spec.origin else here
        step.how = HERE
        work(here, package, steps, step)
      else:
        plan = make_plan(requirements, pins=self.pins, requires=self.source.requires,
                         html=self.html, pytest=self.pytest_paths is not None,
                         resolve=self.resolve, depends=self.depends)
        job = Job(plan, self.source, self.scratch, steps, self.pins)
        _, step.how = rehearse.in_cache(
            job, then, lambda env: work(env, rehearse_env.rehearsed_package(env), steps, step))
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
    code = rehearse_env.run_pytest(
        env, [*(self.pytest_paths or ()), f"--nnx-regression-dir={self.user}", *extra],
        rehearsed=rehearsed, foreign=foreign, check_only=check_only, output=log)
    error = rehearse_env.foreign_error(foreign, rehearsed)
    if error:
      raise _Fatal(error.replace("rehearse:", "bisect:", 1))
    return code, log.read_text(errors="replace")

  def record(self, env: Path, rehearsed: Path, steps: Steps, step: Step) -> None:
    """Records the kit's batch and the user's tests there (see the module docstring)."""
    step.label = label(self.span.package, step.release, rehearse_env.environment_versions(env))
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
    step.label = label(self.span.package, step.release, rehearse_env.environment_versions(env))
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
    if self.pytest_paths is not None:
      steps.next("running your tests (pytest)")
      page = self.scratch / f"tests-{n}.html"
      extra = [f"--nnx-regression-html={page}"] if self.html else []
      step.tested, step.tests = self._pytest(env, rehearsed, extra, f"check-{n}")
      pages.insert(0, page)  # your tests' page first: your model is the question
      if step.tested not in (0, 1):
        problems.append(f"pytest exited {step.tested} ({_meaning(step.tested)})")
    step.page = next((p for p in pages if p.is_file()), None)
    if problems:
      step.verdict, step.why = SKIP, "could not be tested: " + "; ".join(problems)
    else:
      step.verdict = MOVED if 1 in (code, step.tested) else GOOD


class _Fatal(Exception):
  """A step failed in a way no other release would mend (exit 2, one line)."""


def _meaning(code: int | None) -> str:
  return rehearse.PYTEST_EXITS.get(code if code is not None else -1, (2, "an unknown status"))[1]


def _kit(env: Path, args: Sequence[str], scratch: Path) -> int:
  """Runs ``python -m nnx_pool.regression ARGS`` there (stdout dropped, stderr shown)."""
  command = [str(rehearse_env.interpreter(env)), "-P", "-m", "nnx_pool.regression", *args]
  return subprocess.run(command, cwd=scratch, env=rehearse_env.subprocess_env(env),
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                        check=False).returncode


def _read_report(path: Path) -> Report | None:
  try:
    return Report.from_json(json.loads(path.read_text()))
  except (OSError, ValueError, KeyError, TypeError):
    return None


def bisect(
    good: str,
    bad: str,
    *,
    resolve: bool = False,
    pre: bool = False,
    pytest_paths: Sequence[str] | None = None,
    batch: bool = True,
    pattern: str | None = None,
    html: str | os.PathLike | None = None,
    progress: StepProgress | None = None,
    say: Callable[[str], None] | None = None,
    lister: Lister | None = None,
) -> Bisected:
  """Finds the first release between ``good`` and ``bad`` whose check fails.

  Args:
    good: the requirement set that passes, as ``rehearse`` takes it: ``'jax==0.9.0'``.
    bad: the requirement set that moved: ``'jax==0.10.2'``.
    resolve: let pip choose older versions of the packages that depend on the bisected
      one (flax for jax), as ``rehearse --resolve`` does.
    pre: walk pre-releases too.
    pytest_paths: also record and check the user's tests (``python -m pytest`` with these
      arguments, from this directory); None runs none.
    batch: record and check the kit's own cases; False runs only the user's tests.
    pattern: ``check -k``: only the kit's cases it selects.
    html: write the HTML page of the first moved release's failure here (the user's
      tests' page where they failed, else the kit's).
    progress: the CLI's progress line, told of each step's parts.
    say: told one line per step, and of the releases left out of the walk.
    lister: the registry's releases of a package (default :func:`registry_releases`).

  Returns:
    What was found (see :class:`Bisected`).
  """
  tell = say or (lambda line: None)
  lister = lister or registry_releases
  started = time.monotonic()
  try:
    span = find_span(parse_set(good, "--good"), parse_set(bad, "--bad"))
    walk = releases_between(lister(span.package, pre), span, pre=pre)
    partners = lister(span.partner, pre) if span.partner else None
    keep = rehearse_cache.keep_count()
  except RehearsalError as e:
    return Bisected(2, error=str(e))
  found = Bisected(0, notes=[f"left out: {line}" for line in walk.left_out])
  ends = {span.good: parse_set(good, "--good"), span.bad: parse_set(bad, "--bad")}
  tell(f"bisect: {span.package} {span.good} -> {span.bad}: {len(walk.releases)} releases "
       f"({', '.join(map(str, walk.releases))}); records in the first, checks the last, then "
       f"at most {walk.steps()} between")
  for note in found.notes:
    tell(f"bisect: {note}")
  with tempfile.TemporaryDirectory(prefix="nnx-pool-bisect-") as tmp:
    try:
      state = _Bisect(span, Path(tmp), resolve, batch,
                      None if pytest_paths is None else tuple(pytest_paths), pattern,
                      html is not None, progress, 2 + walk.steps(), here=this_environment())
    except RehearsalError as e:
      return Bisected(2, error=str(e))

    def requirements(release: Version) -> list[str] | None:
      if release in ends:
        return [r.text for r in ends[release].values()]
      partner = partner_of(release, partners) if partners is not None else None
      return None if partners is not None and partner is None else span.requirements(release,
                                                                                     partner)

    def step(index: int) -> Step:
      release = walk.releases[index]
      n = len(found.steps) + 1
      needed = requirements(release)
      if needed is None:
        done = Step(release, label=f"{span.package} {release}",
                    why=f"no {span.partner} release at or before it in the registry")
      elif not found.steps:
        done = state.run(n, release, needed, batch + 2 * (pytest_paths is not None),
                         state.record)
      else:
        done = state.run(n, release, needed, batch + (pytest_paths is not None),
                         lambda env, pkg, steps, s: state.check(env, pkg, steps, s, n))
      if done.verdict == SKIP and index in (0, len(walk.releases) - 1):
        done.verdict = FAILED  # an end: nothing to go around
      found.steps.append(done)
      tell(done.line(n))
      return done

    try:
      result = _halve(found, walk, span, step)
    except _Fatal as e:
      found.exit_code, found.error = 2, str(e)
      result = found
    _finish(result, walk, span, html, keep, time.monotonic() - started)
  return result


def _halve(found: Bisected, walk: Walk, span: Span, step: Callable[[int], Step]) -> Bisected:
  """Records in the good release, checks the bad one, then halves between them."""
  first = step(0)
  if first.verdict != RECORDED:
    found.exit_code, found.log = 2, first.tests
    found.error = (f"bisect: could not record the baselines with --good ({first.label}): "
                   f"{first.why}.")
    return found
  last = step(len(walk.releases) - 1)
  if last.verdict == FAILED:
    found.exit_code = 2
    found.error = f"bisect: the --bad set ({last.label}) {last.why}; nothing was bisected."
    return found
  if last.verdict == GOOD:
    found.answer = (f"nothing moved: {last.label} passes against the baselines recorded with "
                    f"{first.label}; nothing to bisect")
    return found
  halving = Halving(len(walk.releases))
  checked = {0: first, len(walk.releases) - 1: last}
  while (index := halving.next()) is not None:
    checked[index] = step(index)
    halving.mark(index, checked[index].verdict)
  moved, good = checked[halving.moved], checked[halving.good]
  found.exit_code, found.moved = 1, moved
  found.answer = f"first moved: {moved.label}, last good: {span.package} {good.release}"
  unsure = halving.unsure()
  if unsure:
    names = ", ".join(f"{span.package} {walk.releases[i]}" for i in unsure)
    found.answer += (f"; {names} between them could not be checked (skipped), so the first "
                     f"moved may be {'it' if len(unsure) == 1 else 'one of them'}")
  return found


def _finish(found: Bisected, walk: Walk, span: Span, html: str | os.PathLike | None, keep: int,
            seconds: float) -> None:
  """The total line, the page of the first moved release, and the cache's clean-up."""
  envs = {s.env for s in found.steps if s.env is not None and s.env.is_dir()}
  size = sum(_size(env) for env in envs)
  here = any(s.how == HERE for s in found.steps)
  installs = sum(s.built for s in found.steps)
  found.total = (f"bisect: {len(found.steps)} steps, {installs} install{'s' * (installs != 1)}, "
                 f"{seconds / 60:.1f} minutes, {size / 1e9:.2f} GB of environments "
                 f"({len(envs)} in {rehearse_cache.shown(rehearse_cache.cache_root())}"
                 f"{', and this environment' if here else ''})")
  moved = found.moved
  if moved is not None and moved.tests:
    found.notes.append("the baselines and .obtained files your tests' report names lay in the "
                       "bisect's temporary directory, removed as it ended")
  if html is not None and moved is not None:
    if moved.page is not None:
      store.write_atomic(Path(html), moved.page.read_bytes())
    else:
      found.notes.append(f"no HTML page: the check of {moved.label} drew none")
  removed = rehearse_cache.prune(rehearse_cache.cache_root(), keep)
  if removed:
    found.notes.append(f"removed {len(removed)} cached environment(s) used least recently, "
                       f"keeping {keep} ({rehearse_cache.KEEP_ENV} changes it)")
