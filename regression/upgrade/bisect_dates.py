"""``bisect --good-date --bad-date``: which day's releases, of any package, moved the numbers.

``nnx-pool-regression bisect --good-date 2026-03-01 --bad-date 2026-09-01`` answers "which
upgrade moved it" when the user does not know which package to suspect. It:

1. resolves the kit's requirement set, unpinned (nnx-pool's dependencies, and pytest with
   ``--pytest``), as the registry held it at the end of each date (``uv pip compile
   --exclude-newer``, :mod:`.date_plan`); a location without upload times (a find-links folder,
   a ``file://`` index) is left out with a line that says so, and an index that serves no
   upload times is refused;
2. lists, from the registry's upload times of every package in the two sets, the days between
   on which a release appeared (the only days the set can change);
3. records the baselines with the good date's set, checks them with the bad date's, then
   halves over those days (as ``bisect`` over releases does: :mod:`.bisect`), and names the
   first day that moved and everything that changed on it;
4. where several packages changed that day, tries each change alone on the last good day's
   set and names the one that moves the numbers (or says that only the combination installs).

Every environment is built (with uv) and kept as ``bisect`` builds it (:mod:`.bisect_steps`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from . import date_plan, installer, preflight, rehearse_cache
from .bisect import clean, finish, keep_moved
from .bisect_plan import GOOD, LABELLED, MOVED, Halving
from .bisect_steps import Bisected, Fatal, Step, StepRunner, bad_end
from .pip_messages import uv_failure
from .rehearse_env import StepProgress, own_requirements
from .rehearse_plan import RehearsalError
from .rehearse_source import this_source

Resolver = Callable[[dt.date], dict[str, str]]
# run_step(n, day, requirements, record) -> the step: records (the good end) or checks there.
RunStep = Callable[[int, dt.date, Sequence[str], bool], Step]


def day_label(day: dt.date | object, versions: Mapping[str, str]) -> str:
  """``2026-07-14 (jax 0.10.0, jaxlib 0.10.0, flax 0.12.8)``."""
  others = [f"{n} {versions[n]}" for n in LABELLED if versions.get(n)]
  return f"{day}" + (f" ({', '.join(others)})" if others else "")


def uv_resolver(requirements: Sequence[str], uv: Path, settings: installer.PipSettings,
                indexes: Sequence[str], cache: Path) -> Resolver:
  """The set ``requirements`` resolve to at the end of a day: ``uv pip compile --exclude-newer``
  over ``indexes`` (pip's constraints kept), for this interpreter."""
  args, environ = installer.uv_arguments(_dated(settings, indexes))
  known: dict[dt.date, dict[str, str]] = {}

  def resolve(day: dt.date) -> dict[str, str]:
    if day not in known:
      command = [str(uv), "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate",
                 "--python", sys.executable, "--exclude-newer", date_plan.exclude_newer(day),
                 *args]
      done = subprocess.run(command, input="".join(f"{r}\n" for r in requirements), text=True,
                            capture_output=True, check=False,
                            env={**os.environ, **environ, "UV_CACHE_DIR": str(cache)})
      if done.returncode:
        why = uv_failure(done.stdout + done.stderr, requirements).split(": ", 1)[1]
        raise RehearsalError(f"bisect: could not resolve the set as of {day}: {why}")
      known[day] = installer.pinned_versions(done.stdout)
    return known[day]

  return resolve


def _dated(settings: installer.PipSettings, indexes: Sequence[str]) -> installer.PipSettings:
  """pip's settings with only ``indexes`` (those with upload times) and no find-links."""
  return dataclasses.replace(settings, index_url=indexes[0], extra_index_urls=tuple(indexes[1:]),
                             find_links=(), no_index=False)


def date_walk(points: Sequence[dt.date], world: Resolver, run_step: RunStep,
              tell: Callable[[str], None]) -> Bisected:
  """Records at ``points[0]``, checks at the last, halves between, then splits the first moved
  day's changes (see the module docstring)."""
  found = Bisected(0)

  def step(index: int, record: bool = False) -> Step:
    done = run_step(len(found.steps) + 1, points[index],
                    date_plan.pinned(world(points[index])), record)
    found.steps.append(done)
    tell(done.line(len(found.steps)))
    return done

  first = step(0, record=True)
  if bad_end(found, first, lambda: step(len(points) - 1), f"--good-date ({points[0]})",
             "--bad-date") is None:
    return found
  halving = Halving(len(points))
  while (index := halving.next()) is not None:
    here = world(points[index])  # the same set as a day checked: the same verdict
    verdict = (GOOD if here == world(points[halving.good]) else
               MOVED if here == world(points[halving.moved]) else step(index).verdict)
    halving.mark(index, verdict)
  good_day, moved_day = points[halving.good], points[halving.moved]
  old, new = world(good_day), world(moved_day)
  found.exit_code = 1
  # The first moved day's set may have been judged from a day checked with the same set.
  found.moved = next((s for s in reversed(found.steps)
                     if isinstance(s.release, dt.date) and world(s.release) == new), None)
  found.answer = (f"first moved: {moved_day}: {', '.join(date_plan.changes(old, new))} "
                  f"(last good: {good_day})")
  if halving.unsure():
    found.answer += "; days between them could not be checked (skipped)"
  groups = date_plan.singles(old, new)
  if len(groups) > 1:
    found.answer += "; " + _split(groups, old, new, run_step, found, tell)
  return found


def _split(groups: Sequence[Mapping[str, str | None]], old: Mapping[str, str],
           new: Mapping[str, str], run_step: RunStep, found: Bisected,
           tell: Callable[[str], None]) -> str:
  """Each change alone on the last good day's set: which moves the numbers."""
  moved, installed = [], 0
  for change in groups:
    what = ", ".join(date_plan.changes({n: old[n] for n in change if n in old},
                                       {n: new[n] for n in change if n in new}))
    done = run_step(len(found.steps) + 1, dt.date.min, date_plan.pinned(
        date_plan.applied(old, change)), False)
    done.label = f"alone: {what}"
    found.steps.append(done)
    tell(done.line(len(found.steps)))
    installed += done.verdict in (GOOD, MOVED)
    if done.verdict == MOVED:
      moved.append(what)
  if moved:
    return f"alone, {' and '.join(moved)} moves it"
  if not installed:
    return "no change installs alone: only the combination installs"
  return "no change moves it alone: the combination does"


def bisect_dates(
    good_date: str,
    bad_date: str,
    *,
    pytest_paths: Sequence[str] | None = None,
    batch: bool = True,
    pattern: str | None = None,
    html: str | os.PathLike | None = None,
    progress: StepProgress | None = None,
    say: Callable[[str], None] | None = None,
    resolver: Resolver | None = None,
    registry: date_plan.Registry | None = None,
) -> Bisected:
  """Finds the first day between ``good_date`` and ``bad_date`` whose resolved set moved the
  numbers, and the change that did (see the module docstring); :class:`Bisected` as
  :func:`~.bisect.bisect` returns it."""
  tell = say or (lambda line: None)
  started = time.monotonic()
  try:
    good = date_plan.parse_day(good_date, "--good-date")
    bad = date_plan.parse_day(bad_date, "--bad-date")
    if good >= bad:
      raise RehearsalError(f"bisect: --good-date {good} is not before --bad-date {bad}; swap "
                           "them, or give the day whose numbers are right first.")
    if batch:
      preflight.kit_pattern(pattern, "bisect")
    chosen = installer.choose()
    source = this_source()
    wanted = [*own_requirements(source.requires, ("report",) if html else ()),
              *["pytest"] * (pytest_paths is not None)]
    if resolver is None or registry is None:
      if chosen.uv is None:
        raise RehearsalError(f"bisect: by date needs uv ({chosen.why.removeprefix('installer: ')}"
                             ")")
      settings = installer.pip_settings(installer.pip_config_list())
      indexes, left_out = date_plan.dated_locations(settings)
      for line in left_out:
        tell(f"bisect: {line}")
      if not indexes:
        raise RehearsalError("bisect: no index with upload times is configured (only local "
                             "ones), so nothing can say what was released on a date.")
      resolver = resolver or uv_resolver(wanted, chosen.uv, settings, indexes,
                                         rehearse_cache.uv_cache_dir())
      registry = registry or date_plan.registry_of(indexes, settings.cert)
    ends = resolver(good), resolver(bad)
    times = date_plan.times_of({*ends[0], *ends[1]}, registry)
    points = [good, *date_plan.upload_days(times, good, bad), bad]
    keep = rehearse_cache.keep_count()
  except RehearsalError as e:
    return Bisected(2, error=str(e))
  if ends[0] == ends[1]:
    return Bisected(0, answer=f"nothing changed: the set resolves alike on {good} and {bad}")
  tell(f"bisect: {good} -> {bad}: {len(points) - 2} days between on which a release of the "
       f"{len(times)} packages appeared; records on the first, checks the last, then at most "
       f"{(len(points) - 2).bit_length()} between; {chosen.why}")
  scratch = Path(tempfile.mkdtemp(prefix="nnx-pool-bisect-"))
  kept: list[Path] = []
  try:
    try:
      state = StepRunner(None, scratch, False, batch,
                         None if pytest_paths is None else tuple(pytest_paths), pattern,
                         html is not None, progress, len(points).bit_length() + 2,
                         name=day_label)
    except RehearsalError as e:
      return Bisected(2, error=str(e))

    def run_step(n: int, day: dt.date, requirements: Sequence[str], record: bool) -> Step:
      then = batch + (pytest_paths is not None) * (2 if record else 1)
      work = state.record if record else (
          lambda env, pkg, steps, s: state.check(env, pkg, steps, s, n))
      return state.run(n, day, requirements, then, work)

    try:
      found = date_walk(points, resolver, run_step, tell)
    except Fatal as e:
      found = Bisected(2, error=str(e))
    kept = keep_moved(found, scratch)
    found.notes += state.notes
    finish(found, html, keep, time.monotonic() - started)
  finally:
    clean(scratch, kept)
  return found
