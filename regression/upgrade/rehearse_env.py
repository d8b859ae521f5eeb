"""The rehearsal environment: built with uv (else :mod:`venv` and pip), kept current, and run.

:func:`build` creates a virtual environment (``uv venv``; else the standard library's
:mod:`venv`, with pip: :mod:`.installer` chooses) and installs there the plan
(:mod:`nnx_pool.regression.upgrade.rehearse_plan`) and this nnx-pool
(:mod:`nnx_pool.regression.upgrade.rehearse_source`), under the plan's constraints.
:func:`prepare` does the same for a cache entry, or brings the environment it holds up to
date: reinstalled (``--no-deps``) when this nnx-pool changed, and brought back to this
environment's pins (``pip install`` again) when one of them moved since it was built
(:func:`stale_pins`). It uses a cached environment only with the entry's manifest
(:mod:`nnx_pool.regression.upgrade.rehearse_cache`), and only while the requirement set resolves
as it did: the content of each ``file://`` location, and the versions pip chooses for a
range (:func:`pip_choices`); otherwise it builds the environment again, never running what
was there. :func:`run_check` then runs ``check`` there, and
:mod:`nnx_pool.regression.upgrade.rehearse_pytest` the user's tests.

**Never this environment.** Every subprocess runs the rehearsal environment's
interpreter (:func:`interpreter`), with ``PYTHONPATH``, ``PYTHONHOME`` and pip's
``--user``/``--target``/``--prefix`` settings removed from its environment
(:func:`subprocess_env`); this interpreter's environment is only read.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as Pep508

from .. import store
from ..constants import PYTEST_RESULT_OPTION
from . import rehearse_cache
from .installer import (
  Installer,
  PipSettings,
  choose,
  copied_note,
  pinned_versions,
  pip_config_list,
  pip_settings,
  uv_command,
)
from .pip_messages import pip_failure, uv_failure
from .rehearse_cache import ENV_DIR, shown
from .rehearse_plan import (
  SELF,
  Plan,
  RehearsalError,
  admits,
  chosen_by_pip,
  first_copies,
  local_locations,
  normalise,
)
from .rehearse_source import Source, location_digest

_UNSET_ENV = ("PYTHONPATH", "PYTHONHOME", "PIP_USER", "PIP_TARGET", "PIP_PREFIX", "PIP_ROOT")


class StepProgress(Protocol):
  """The CLI's progress line: ``progress(n, total, what)``, and ``clear()``."""

  def __call__(self, n: int, total: int, what: str, /) -> None: ...

  def clear(self) -> None: ...


def interpreter(env: Path) -> Path:
  """The Python interpreter of the environment ``env``."""
  return env / ("Scripts" if os.name == "nt" else "bin") / ("python.exe" if os.name == "nt"
                                                            else "python")


def site_packages(env: Path) -> list[Path]:
  """The site-packages directory of the environment ``env`` (none before it is built)."""
  return [*env.glob("lib/python*/site-packages"), *env.glob("Lib/site-packages")]


def environment_versions(env: Path) -> dict[str, str]:
  """The distributions installed in the rehearsal environment ``env``, by normalised name."""
  dists = importlib.metadata.distributions(path=[str(p) for p in site_packages(env)])
  return {name: dist.version for name, dist in first_copies(dists).items()}


def stale_pins(there: Mapping[str, str], constraints: Iterable[str]) -> list[str]:
  """Each installed version a constraint no longer admits: ``numpy 2.4.5 -> 2.4.6``.

  Args:
    there: the environment's versions (:func:`environment_versions`).
    constraints: the plan's constraints (this environment's pins now).
  """
  stale = []
  for line in constraints:
    try:
      req = Pep508(line)
    except InvalidRequirement:  # a version PEP 440 cannot read: pip will say so
      continue
    have = there.get(normalise(req.name))
    if have is not None and not admits(req.specifier, have):
      stale.append(f"{normalise(req.name)} {have} -> {str(req.specifier).removeprefix('==')}")
  return stale


def subprocess_env(env: Path) -> dict[str, str]:
  """The environment variables of a subprocess in the rehearsal environment ``env``."""
  environ = {k: v for k, v in os.environ.items() if k not in _UNSET_ENV}
  environ["VIRTUAL_ENV"] = str(env)
  environ["PATH"] = os.pathsep.join([str(interpreter(env).parent), environ.get("PATH", "")])
  environ["PYTHONNOUSERSITE"] = "1"
  return environ


def run_pip(env: Path, args: Sequence[str], *, on_line: Callable[[str], None],
            uv: tuple[Path, Path] | None = None, settings: PipSettings | None = None
            ) -> tuple[int, str]:
  """Runs the environment's own pip, or ``uv pip`` for it: its exit status and output (each
  line to ``on_line``).

  Args:
    env: the environment.
    args: pip's arguments (``install -c C -r R``).
    on_line: told each line of output.
    uv: ``(uv, its cache)`` to run ``uv pip`` with pip's settings (:mod:`.installer`).
    settings: those settings, where the caller read them already (else read here: a
      ``python -m pip config list``).
  """
  environ = subprocess_env(env)
  if uv is None:
    command = [str(interpreter(env)), "-m", "pip", *args, "--disable-pip-version-check",
               "--no-input", "--progress-bar", "off"]
  else:
    command, extra = uv_command(uv[0], interpreter(env), args,
                                settings or pip_settings(pip_config_list()), uv[1])
    environ.update(extra)
  lines = []
  with subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, env=environ) as proc:
    for line in proc.stdout or ():
      lines.append(line)
      if line.strip() and not line.startswith("WARNING"):
        on_line(line.strip())
  return proc.returncode, "".join(lines)


@dataclasses.dataclass
class Steps:
  """Numbers the steps on the progress line (``rehearse: step 2/3 installing ...``)."""

  progress: StepProgress | None
  total: int
  n: int = 0

  def next(self, what: str) -> None:
    self.n += 1
    self.show(what)

  def show(self, what: str) -> None:
    if self.progress is not None:
      self.progress(self.n, self.total, what)

  def clear(self) -> None:
    if self.progress is not None:
      self.progress.clear()


@dataclasses.dataclass(frozen=True)
class Job:
  """What building or updating an environment needs, besides the environment."""

  plan: Plan
  source: Source
  scratch: Path
  steps: Steps
  pins: Mapping[str, str]
  installer: Installer = dataclasses.field(default_factory=choose)
  notes: list[str] = dataclasses.field(default_factory=list)  # uv copied, not linked

  @functools.cached_property
  def settings(self) -> PipSettings:
    """pip's settings, read once for every install of this job (uv is handed them)."""
    return pip_settings(pip_config_list())

  def run(self, env: Path, args: Sequence[str]) -> tuple[int, str]:
    """:func:`run_pip` with this job's installer, its lines on the progress line."""
    uv = None
    if self.installer.uv is not None:
      uv = (self.installer.uv, rehearse_cache.uv_cache_dir())
    code, output = run_pip(env, args, uv=uv, on_line=lambda line: self.steps.show(
        f"{self.installer.name}: {line}"), settings=self.settings if uv else None)
    note = copied_note(output, uv[1]) if uv is not None else None
    if note and note not in self.notes:
      self.notes.append(note)
    return code, output

  def failure(self, output: str, requirements: Sequence[str]) -> str:
    """The installer's failure in one line (:mod:`.pip_messages`)."""
    if self.installer.name == "uv":
      return uv_failure(output, requirements, self.pins, resolve=self.plan.resolve)
    return pip_failure(output, requirements, self.pins, resolve=self.plan.resolve)


def _install(env: Path, job: Job, what: str) -> str:
  """``pip install`` of the plan and nnx-pool, under the constraints; returns the digest of the
  nnx-pool it installed."""
  plan = job.plan
  constraints, requirements = env / "rehearsal-constraints.txt", env / "rehearsal-requirements.txt"
  store.write_atomic(constraints, "".join(f"{c}\n" for c in plan.constraints).encode())
  store.write_atomic(requirements, "".join(f"{r}\n" for r in plan.requirements).encode())
  snapshot = job.source.snapshot(plan.extras, job.scratch)  # hashed once, before pip runs
  job.steps.next(what)
  code, output = job.run(env, ["install", "-c", str(constraints), "-r", str(requirements),
                               snapshot.requirement])
  if code:
    raise RehearsalError(job.failure(output, plan.changes))
  return snapshot.digest


def build(env: Path, job: Job) -> str:
  """Creates the environment at ``env`` and installs the plan there; returns the digest of the
  nnx-pool installed. Raises RehearsalError."""
  uv = job.installer.uv
  job.steps.next(f"creating a virtual environment ({'uv venv' if uv else 'python -m venv'})")
  try:
    if uv is not None:
      subprocess.run([str(uv), "venv", "--quiet", "--python", sys.executable, str(env)],
                     check=True, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                     env={**subprocess_env(env), "UV_CACHE_DIR": str(
                         rehearse_cache.uv_cache_dir())})
    else:
      venv.EnvBuilder(with_pip=True, symlinks=os.name != "nt").create(env)
  except (OSError, subprocess.CalledProcessError) as e:
    why = getattr(e, "stderr", None) or e
    raise RehearsalError(f"rehearse: could not create a virtual environment with "
                         f"{job.installer.name} in {shown(env)} ({why}).") from e
  return _install(env, job, f"installing {' '.join(job.plan.requirements)} and nnx-pool "
                  f"({job.installer.name})")


def _outdated(env: Path, job: Job, manifest: Mapping[str, Any]) -> tuple[list[str], bool]:
  """What a cached environment lacks: pins that moved here (or new dependencies), a new nnx-pool.

  A pin the last install left unfollowed (the environment's own pip, which nothing the plan
  installs requires, is older than this one's) is not a move.
  """
  unfollowed = set(manifest["unfollowed"])
  moved = [line for line in stale_pins(environment_versions(env), job.plan.constraints)
           if line not in unfollowed]
  if manifest["requires"] != sorted(job.source.requires):
    moved.append("nnx-pool's dependencies")
  return moved, manifest["source"] != job.source.digest()


def _update(env: Path, job: Job, moved: Sequence[str], changed: bool, digest: str) -> str:
  """Brings a cached environment to this environment's pins and this nnx-pool; returns the
  digest of the nnx-pool it holds then (``digest``: the one it held)."""
  if moved:
    digest = _install(env, job, f"updating {', '.join(moved)} to this environment's versions "
                      f"({job.installer.name})")
  if not changed:
    return digest
  job.steps.next("reinstalling nnx-pool, changed since the environment was built "
                 f"({job.installer.name} --no-deps)")
  snapshot = job.source.snapshot(job.plan.extras, job.scratch)
  code, output = job.run(env, ["install", "--no-deps", "--force-reinstall", snapshot.requirement])
  if code:
    raise RehearsalError(job.failure(output, [SELF]))
  return snapshot.digest


def own_requirements(requires: Sequence[str], extras: Sequence[str]) -> list[str]:
  """nnx-pool's requirements that apply with ``extras``, their markers dropped."""
  lines = []
  for line in requires:
    try:
      req = Pep508(line)
    except InvalidRequirement:
      continue
    if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
      req.marker = None
      lines.append(str(req))
  return lines


def pip_choices(env: Path, job: Job, names: Sequence[str]) -> tuple[dict[str, str | None],
                                                                   str | None]:
  """The versions pip would install now for ``names`` (:func:`~nnx_pool.regression.
  rehearse_plan.chosen_by_pip`): ``pip install --dry-run --ignore-installed --report`` of the
  plan and nnx-pool's requirements, under the constraints, by the environment's own pip.

  Returns:
    ``(versions, None)``, or ``({}, why)`` when pip could not resolve them (offline, say).
  """
  plan, scratch = job.plan, job.scratch
  requirements, constraints = scratch / "resolve-requirements.txt", scratch / "resolve-pins.txt"
  report = scratch / "resolve-report.json"
  lines = [*plan.requirements, *own_requirements(job.source.requires, plan.extras)]
  requirements.write_text("".join(f"{r}\n" for r in lines))
  constraints.write_text("".join(f"{c}\n" for c in plan.constraints))
  report.unlink(missing_ok=True)
  if job.installer.uv is not None:
    job.steps.next(f"resolving {', '.join(names)} again (uv pip compile)")
    code, output = job.run(env, ["compile", "--quiet", "--no-header", "--no-annotate", "-c",
                                 str(constraints), str(requirements)])
    picks = pinned_versions(output)
    if code:
      return {}, job.failure(output, plan.changes).removeprefix("rehearse: ")
    return {name: picks.get(name) for name in names}, None
  job.steps.next(f"resolving {', '.join(names)} again (pip install --dry-run)")
  code, output = job.run(env, ["install", "--dry-run", "--ignore-installed", "--quiet",
                               "--report", str(report), "-c", str(constraints), "-r",
                               str(requirements)])
  try:
    installs = json.loads(report.read_text())["install"] if not code else None
    picks = {normalise(item["metadata"]["name"]): item["metadata"]["version"]
             for item in installs or ()}
  except (OSError, ValueError, KeyError, TypeError):
    installs = None
  if installs is None:
    return {}, job.failure(output, plan.changes).removeprefix("rehearse: ")
  return {name: picks.get(name) for name in names}, None


def _stale_because(entry: Path, job: Job, manifest: Mapping[str, Any] | None,
                   files: Mapping[str, str]) -> tuple[str | None, str | None]:
  """Why the cached environment of ``entry`` cannot be used as it is: ``(why, None)`` when it
  must be rebuilt (no valid manifest, a ``file://`` location or a version pip chooses that
  changed), ``(None, note)`` when it can (a note when pip could not resolve again)."""
  env = entry / ENV_DIR
  if manifest is None or not (env / "pyvenv.cfg").is_file():
    return ("replacing a cached one without a valid manifest" if env.exists() or
            os.path.lexists(env) else None), None
  built_with = manifest.get("installer", "pip")
  if built_with != job.installer.name:
    return f"replacing a cached one built with {built_with}, not {job.installer.name}", None
  resolved = manifest["resolved"]
  if manifest["requirements"] != _requirement_set(job.plan, resolved):
    return "replacing a cached one whose manifest is not this requirement set's", None
  changed = sorted(text for text in files if files[text] != resolved.get("files", {}).get(text))
  if changed:
    return f"{', '.join(changed)} changed since the cached one was built", None
  names = chosen_by_pip(job.plan)
  if not names:
    return None, None
  versions, problem = pip_choices(env, job, names)
  if problem:
    return None, f"pip could not resolve {', '.join(names)} again ({problem}); kept the " \
        "versions chosen when it was built"
  held = resolved.get("versions", {})
  moved = [f"{name} {held.get(name)} -> {versions[name]}" for name in names
           if versions[name] != held.get(name)]
  if moved:
    return f"pip now chooses {', '.join(moved)}", None
  return None, None


def _requirement_set(plan: Plan, resolved: Mapping[str, Any]) -> str:
  """The digest of the resolved requirement set: the plan's key, what its ``file://``
  locations hold and the versions pip chose."""
  data = {"key": plan.key(), "resolved": resolved}
  return "sha256:" + hashlib.sha256(store.canonical_json(data).encode()).hexdigest()


def _commit(entry: Path, job: Job, resolved: Mapping[str, Any], digest: str) -> None:
  """Writes the entry's manifest: the last step, once the environment is complete."""
  env = entry / ENV_DIR
  rehearse_cache.write_manifest(entry, {
      "requirements": _requirement_set(job.plan, resolved),
      "resolved": dict(resolved),
      "source": digest,
      "requires": sorted(job.source.requires),
      "installer": job.installer.name,
      # Pins pip left as they were (nothing the plan installs requires them: the venv's pip).
      "unfollowed": stale_pins(environment_versions(env), job.plan.constraints),
  })


def _remove(path: Path) -> None:
  """Removes a directory tree, or a link or file in its place (never following a link)."""
  if path.is_symlink() or path.is_file():
    path.unlink()
  elif path.exists():
    shutil.rmtree(path)


def prepare(entry: Path, job: Job, then: int) -> str:
  """Makes ``entry``'s environment ready, under its lock; says how (built, updated, reused).

  An environment is used only with a valid manifest that says it holds this requirement set
  as it resolves now; otherwise it is removed without running anything there and built
  again. ``then``: the steps that follow (check, pytest), for the progress line's total.
  """
  env = entry / ENV_DIR
  started = time.monotonic()
  # Hashed before pip runs: an edit made while it installs makes the entry stale next time.
  files = {text: location_digest(path) for text, path in local_locations(job.plan).items()}
  manifest = rehearse_cache.read_manifest(entry)
  job.steps.total = job.steps.n + bool(manifest and chosen_by_pip(job.plan)) + 2 + then
  why, note = _stale_because(entry, job, manifest, files)
  if manifest is not None and why is None:
    moved, changed = _outdated(env, job, manifest)
    job.steps.total = job.steps.n + bool(moved) + changed + then
    if not moved and not changed:
      return "reused" + (f"; {note}" if note else "")
    rehearse_cache.drop_manifest(entry)  # an update cut short leaves an entry to rebuild
    digest = _update(env, job, moved, changed, manifest["source"])
    _commit(entry, job, manifest["resolved"], digest)
    return f"updated in {time.monotonic() - started:.0f} s"
  job.steps.total = job.steps.n + 2 + then
  rehearse_cache.drop_manifest(entry)
  _remove(env)  # never run: whatever is there is not known to be what the manifest says
  for unfinished in entry.glob(".tmp-*"):  # a build killed before it was renamed into place
    shutil.rmtree(unfinished, ignore_errors=True)
  staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry))
  try:
    digest = build(staging, job)
    os.rename(staging, env)  # a half-built environment is never at `env`
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  there = environment_versions(env)
  versions = {name: there.get(name) for name in chosen_by_pip(job.plan)}
  _commit(entry, job, {"files": files, "versions": versions}, digest)  # the commit
  return f"built in {time.monotonic() - started:.0f} s" + (f" ({why})" if why else "")


def run_check(env: Path, baseline: Path, json_path: Path, *, pattern: str | None,
              dry_run: bool, html: Path | None, scratch: Path,
              pytest_result: Path | None = None) -> int:
  """Runs ``check`` in the environment; its stdout (the table) is dropped, its stderr shown.
  ``pytest_result``: the user's tests' result
  (:func:`~nnx_pool.regression.upgrade.rehearse_pytest.read_result`, as JSON), for its report
  and page."""
  command = [str(interpreter(env)), "-P", "-m", "nnx_pool.regression", "check",
             "--baseline", str(baseline), "--json", str(json_path)]
  if pytest_result is not None:
    command += [PYTEST_RESULT_OPTION, str(pytest_result)]
  if pattern is not None:
    command += ["-k", pattern]
  if dry_run:
    command.append("--dry-run")
  if html is not None:
    command += ["--html", str(html)]
  # cwd: a scratch directory, so that no nnx_pool/ in the caller's directory shadows the
  # installed one (-P keeps the directory off sys.path too).
  return subprocess.run(command, cwd=scratch, env=subprocess_env(env), stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, check=False).returncode


def run_info(env: Path, json_path: Path, *, scratch: Path) -> int:
  """Runs ``info --json`` in the environment (its stamp, for a rehearsal without the batch)."""
  command = [str(interpreter(env)), "-P", "-m", "nnx_pool.regression", "info", "--json",
             str(json_path)]
  return subprocess.run(command, cwd=scratch, env=subprocess_env(env), stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, check=False).returncode
