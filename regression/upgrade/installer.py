"""Which installer builds the rehearsal environments (uv, else pip), and pip's settings for uv.

:func:`choose` picks uv (the ``upgrade`` extra's ``uv`` package, found with
``uv.find_uv_bin()``, else a ``uv`` on ``PATH``) and falls back to pip where uv is missing or
cannot run; :attr:`Installer.why` is the one line that says which ran and why.
``NNX_POOL_INSTALLER=pip`` (or ``uv``) chooses.

uv does not read pip's configuration, so :func:`pip_settings` reads it as pip resolves it
(``pip config list``: the ``PIP_*`` variables over the ``install`` section over ``global``)
and :func:`uv_arguments` hands the same index, extra indexes, find-links directories,
certificate and constraints to uv, with ``--index-strategy unsafe-best-match``: pip chooses
the best version across every index, where uv's default takes the first index that has the
package at all (an extra index holding only jax 0.10.2 made ``jax==0.9.2`` unsatisfiable).

uv links an environment's files from its cache
(:func:`~.rehearse_cache.uv_cache_dir`, beside the rehearsal
cache and as private as it: a writer there could change what every environment runs).
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .rehearse_plan import RehearsalError, normalise

INSTALLER_ENV = "NNX_POOL_INSTALLER"  # "uv" or "pip": which installer builds environments
UPGRADE_EXTRA = "pip install 'nnx-pool[upgrade]'"
# pip's options that reach uv, as `pip config list` names them.
_OPTIONS = ("index-url", "extra-index-url", "find-links", "no-index", "cert", "client-cert",
            "constraint", "trusted-host")
_TRUE = ("1", "true", "yes", "on")
COPIED = "falling back to full copy"  # uv's warning where it cannot link from its cache


@dataclasses.dataclass(frozen=True)
class Installer:
  """The installer of the rehearsal environments.

  Attributes:
    name: ``uv`` or ``pip``.
    why: the one line saying which installer runs and why.
    uv: the uv executable (None for pip).
  """

  name: str
  why: str
  uv: Path | None = None


def _find_uv() -> Path | None:
  """The ``uv`` package's executable, else the one on ``PATH``; None where neither is."""
  try:
    import uv  # the `upgrade` extra

    return Path(uv.find_uv_bin())
  except (ImportError, FileNotFoundError):
    found = shutil.which("uv")
    return Path(found) if found else None


def _uv_version(uv: Path) -> tuple[str | None, str]:
  """``uv --version``'s version, or None and why it could not run."""
  try:
    done = subprocess.run([str(uv), "--version"], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, check=False)
  except (OSError, subprocess.TimeoutExpired) as e:
    return None, str(e)
  words = done.stdout.split()
  if done.returncode or len(words) < 2:
    return None, f"uv --version exited {done.returncode}: {done.stderr.strip()[:200]}"
  return words[1], ""


def choose(environ: Mapping[str, str] | None = None,
           find: Callable[[], Path | None] = _find_uv,
           version: Callable[[Path], tuple[str | None, str]] = _uv_version) -> Installer:
  """uv where it is installed and runs, else pip (see the module docstring).

  Raises:
    RehearsalError: ``NNX_POOL_INSTALLER`` is neither ``uv`` nor ``pip``, or is ``uv`` where
      uv cannot be found or run.
  """
  environ = os.environ if environ is None else environ
  asked = environ.get(INSTALLER_ENV, "").strip().lower()
  if asked not in ("", "uv", "pip"):
    raise RehearsalError(f"rehearse: {INSTALLER_ENV} must be 'uv' or 'pip'; got "
                         f"{environ[INSTALLER_ENV]!r}. Unset it to use uv where it is installed.")
  if asked == "pip":
    return Installer("pip", f"installer: pip ({INSTALLER_ENV}=pip)")
  uv = find()
  problem = f"uv is not installed ({UPGRADE_EXTRA} brings it)" if uv is None else ""
  if uv is not None:
    found, why = version(uv)
    if found is not None:
      return Installer("uv", f"installer: uv {found} ({uv}), environments linked from its "
                       "cache", uv)
    problem = f"uv at {uv} could not run: {why}"
  if asked == "uv":
    raise RehearsalError(f"rehearse: {INSTALLER_ENV}=uv, but {problem}.")
  return Installer("pip", f"installer: pip, slower than uv: {problem}")


def read_config_list(text: str) -> dict[str, str]:
  """``pip config list``'s lines (``global.find-links='/srv/wheels'``) as a mapping."""
  found = {}
  for line in text.splitlines():
    key, sep, value = line.partition("=")
    if not sep:
      continue
    try:
      found[key.strip()] = str(ast.literal_eval(value.strip()))
    except (ValueError, SyntaxError):
      found[key.strip()] = value.strip().strip("'\"")
  return found


def pip_config_list() -> dict[str, str]:
  """What ``python -m pip config list`` prints here (empty where pip cannot say)."""
  try:
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
  except (OSError, subprocess.TimeoutExpired):
    return {}
  return read_config_list(done.stdout) if done.returncode == 0 else {}


@dataclasses.dataclass(frozen=True)
class PipSettings:
  """What reaches pip's install: its indexes, find-links, certificates and constraints."""

  index_url: str | None = None
  extra_index_urls: tuple[str, ...] = ()
  find_links: tuple[str, ...] = ()
  no_index: bool = False
  cert: str | None = None
  client_cert: str | None = None
  constraints: tuple[str, ...] = ()
  trusted_hosts: tuple[str, ...] = ()


def pip_settings(config: Mapping[str, str], environ: Mapping[str, str] | None = None
                 ) -> PipSettings:
  """pip's settings as pip resolves them for ``pip install``.

  Args:
    config: :func:`read_config_list` of ``pip config list`` (:func:`pip_config_list`).
    environ: the ``PIP_*`` variables (default this process's), which win over the files,
      as ``:env:`` entries of ``pip config list`` do.
  """
  environ = os.environ if environ is None else environ

  def value(option: str) -> str | None:
    variable = "PIP_" + option.upper().replace("-", "_")
    if environ.get(variable):
      return environ[variable]
    for section in (":env:", "install", "global"):
      if f"{section}.{option}" in config:
        return config[f"{section}.{option}"]
    return None

  def words(option: str) -> tuple[str, ...]:
    return tuple((value(option) or "").split())

  return PipSettings(
      index_url=value("index-url"), extra_index_urls=words("extra-index-url"),
      find_links=words("find-links"), no_index=(value("no-index") or "").lower() in _TRUE,
      cert=value("cert"), client_cert=value("client-cert"), constraints=words("constraint"),
      trusted_hosts=words("trusted-host"))


def uv_arguments(settings: PipSettings) -> tuple[list[str], dict[str, str]]:
  """uv's options and environment variables for pip's settings (see the module docstring)."""
  args = ["--index-strategy", "unsafe-best-match"]
  if settings.index_url:
    args += ["--index-url", settings.index_url]
  for url in settings.extra_index_urls:
    args += ["--extra-index-url", url]
  for where in settings.find_links:
    args += ["--find-links", where]
  if settings.no_index:
    args.append("--no-index")
  for path in settings.constraints:
    args += ["--constraint", path]
  for host in settings.trusted_hosts:
    args += ["--allow-insecure-host", host]
  environ = {}
  if settings.cert:  # uv reads the certificate authorities from SSL_CERT_FILE
    environ["SSL_CERT_FILE"] = settings.cert
  if settings.client_cert:
    environ["SSL_CLIENT_CERT"] = settings.client_cert
  return args, environ


def uv_command(uv: Path, env_python: Path, args: Sequence[str], settings: PipSettings,
               cache: Path) -> tuple[list[str], dict[str, str]]:
  """``uv pip ARGS`` for the environment of ``env_python``: the command and the variables to add.

  ``args`` are pip's (``install -c C -r R``); ``--force-reinstall`` becomes ``--reinstall``.
  """
  extra, environ = uv_arguments(settings)
  translated = ["--reinstall" if a == "--force-reinstall" else a for a in args]
  environ["UV_CACHE_DIR"] = str(cache)
  environ["UV_NO_PROGRESS"] = "1"
  return [str(uv), "pip", *translated, "--python", str(env_python), *extra], environ


def copied_note(output: str, cache: Path) -> str | None:
  """The line saying uv copied instead of linking (another filesystem), or None."""
  if COPIED not in output:
    return None
  return (f"uv copied the files instead of linking them from its cache {cache}, which lies "
          "on another filesystem than the environment: each environment takes its full size")


_PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$", re.M)


def pinned_versions(output: str) -> dict[str, str]:
  """``uv pip compile``'s ``name==version`` lines, by normalised name."""
  return {normalise(m[1]): m[2] for m in _PINNED.finditer(output)}
