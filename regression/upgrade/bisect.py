"""``bisect``: which release between a good and a bad requirement set moved the numbers.

``nnx-pool-regression bisect --good 'jax==0.9.0' --bad 'jax==0.10.2' --resolve`` answers
the question a failing check after an upgrade asks next. It:

1. finds the one package the two sets differ in, and lists the registry's releases of it
   between them (``pip index versions``, read by :mod:`nnx_pool.regression.upgrade.bisect_plan`);
   what can be judged without installing is refused first, in one line
   (:mod:`.preflight`: the sets swapped, a ``-k`` that selects no case, releases a package
   kept at this environment's version excludes);
2. records the baselines in the good set's environment, into a temporary directory: the
   kit's batch (``record``) and, with ``pytest_paths``, the user's ``nnx_regression`` tests
   (``--nnx-regression-dir``), which then run once more there, comparing only, so that a
   test that fails there for another reason is named before anything is blamed on a
   release. The user's own baselines are never read or written;
3. checks them in the bad set's environment (the bad set passing: nothing to bisect), then
   in the release halfway between the last good and the first moved one, until the two
   are neighbours. A release that cannot be installed or tested is skipped and the halving
   goes around it, as ``git bisect skip`` does. Where the user's tests failed at the first
   moved release, the baselines and obtained files their report names are kept (the note
   says where); everything else in the temporary directory is removed.

Every environment is the rehearsal cache's (:func:`nnx_pool.regression.upgrade.rehearse.in_cache`),
built and kept current as ``rehearse`` builds it, and reused by later bisects and
rehearsals; every step installs the sets' extras and markers. A set that this environment
already holds (the bad set ``jax==0.10.2`` where jax 0.10.2 is installed, and nothing here,
such as a jax plugin, that an environment built for it would lack: :mod:`.bisect_here`)
runs here instead, building nothing; nothing is written into this environment either way.

Nothing here prints but ``say``, told one line per step (the release, its verdict, the
time, how its environment was made); :mod:`nnx_pool.regression.cli` prints the rest.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from packaging.version import Version

from .. import store
from . import preflight, rehearse_cache, rehearse_env
from .bisect_plan import (
  SKIP,
  Halving,
  Listing,
  Span,
  Walk,
  find_span,
  parse_index,
  parse_set,
  partner_of,
  releases_between,
)
from .bisect_steps import (
  FAILED,
  HERE,
  USER_DIR,
  Bisected,
  Fatal,
  Step,
  StepRunner,
  bad_end,
)
from .rehearse_env import StepProgress
from .rehearse_plan import RehearsalError, installed_depends, installed_pins
from .rehearse_source import this_source

Lister = Callable[[str, bool], Listing]


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
    sets = parse_set(good, "--good"), parse_set(bad, "--bad")
    span = find_span(*sets)
    if batch:
      preflight.kit_pattern(pattern, "bisect")
    walk = releases_between(lister(span.package, pre), span, pre=pre)
    partners = lister(span.partner, pre) if span.partner else None
    preflight.pin_conflicts(
        span.package, walk.releases, named={*sets[0], *sets[1]}, pins=installed_pins(),
        depends=installed_depends(), requires=this_source().requires,
        also=["pytest"] * (pytest_paths is not None) + ["matplotlib"] * (html is not None),
        resolve=resolve)
    keep = rehearse_cache.keep_count()
  except RehearsalError as e:
    return Bisected(2, error=str(e))
  found = Bisected(0, notes=[f"left out: {line}" for line in walk.left_out])
  ends = {span.good: sets[0], span.bad: sets[1]}
  tell(f"bisect: {span.package} {span.good} -> {span.bad}: {len(walk.releases)} releases "
       f"({', '.join(map(str, walk.releases))}); records in the first, checks the last, then "
       f"at most {walk.steps()} between")
  for note in found.notes:
    tell(f"bisect: {note}")
  scratch, kept = Path(tempfile.mkdtemp(prefix="nnx-pool-bisect-")), []
  try:
    try:
      state = StepRunner(span, scratch, resolve, batch,
                      None if pytest_paths is None else tuple(pytest_paths), pattern,
                      html is not None, progress, 2 + walk.steps(), here=this_environment())
    except RehearsalError as e:
      return Bisected(2, error=str(e))
    tell(f"bisect: {state.installer.why}")

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
    except Fatal as e:
      found.exit_code, found.error = 2, str(e)
      result = found
    kept = keep_moved(result, scratch)
    result.notes += state.notes
    finish(result, html, keep, time.monotonic() - started)
  finally:
    clean(scratch, kept)
  return result


def keep_moved(found: Bisected, scratch: Path) -> list[Path]:
  """What outlives the bisect: where the first moved release's test report names files (the
  baselines the tests recorded, what that release obtained), so that ``report`` can draw it
  again; the note says where. Nothing otherwise."""
  moved = found.moved
  if moved is None or moved.tests is None:
    return []
  kept = [path for path in (scratch / USER_DIR, moved.tmp) if path is not None and path.exists()]
  size = sum(_size(path) for path in kept)
  found.notes.append(
      f"the baselines your tests recorded with {found.steps[0].label}, and what "
      f"{moved.label} obtained, which their report names, are kept in "
      f"{rehearse_cache.shown(scratch)} ({size / 1e6:.1f} MB): `nnx-pool-regression report` "
      "draws that report again from there; remove the directory when done")
  return kept


def clean(scratch: Path, kept: Sequence[Path]) -> None:
  """Removes the bisect's directory, all but ``kept`` (no link followed)."""
  if not kept:
    shutil.rmtree(scratch, ignore_errors=True)
    return
  for path in scratch.iterdir():
    if path not in kept:
      if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
      else:
        path.unlink(missing_ok=True)


def _halve(found: Bisected, walk: Walk, span: Span, step: Callable[[int], Step]) -> Bisected:
  """Records in the good release, checks the bad one, then halves between them."""
  first = step(0)
  last = bad_end(found, first, lambda: step(len(walk.releases) - 1), f"--good ({first.label})",
                 "--bad")
  if last is None:
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


def total_line(steps: Sequence[Step], seconds: float) -> str:
  """``bisect: 4 steps, 3 installs, 1.2 minutes, 0.02 GB of environments (...)``."""
  envs = {s.env for s in steps if s.env is not None and s.env.is_dir()}
  own, linked = rehearse_cache.disk_use(sorted(envs))
  here = any(s.how == HERE for s in steps)
  installs = sum(s.built for s in steps)
  shared = f"; {linked / 1e9:.2f} GB more linked from uv's cache" if linked else ""
  return (f"bisect: {len(steps)} steps, {installs} install{'s' * (installs != 1)}, "
          f"{seconds / 60:.1f} minutes, {own / 1e9:.2f} GB of environments "
          f"({len(envs)} in {rehearse_cache.shown(rehearse_cache.cache_root())}"
          f"{', and this environment' if here else ''}{shared})")


def finish(found: Bisected, html: str | os.PathLike | None, keep: int, seconds: float) -> None:
  """The total line, the page of the first moved release, and the cache's clean-up."""
  found.total = total_line(found.steps, seconds)
  moved = found.moved
  if html is not None and moved is not None:
    if moved.page is not None:
      store.write_atomic(Path(html), moved.page.read_bytes())
    else:
      found.notes.append(f"no HTML page: the check of {moved.label} drew none")
  removed = rehearse_cache.prune(rehearse_cache.cache_root(), keep)
  if removed:
    found.notes.append(f"removed {len(removed)} cached environment(s) used least recently, "
                       f"keeping {keep} ({rehearse_cache.KEEP_ENV} changes it)")
