"""What ``bisect --good-date --bad-date`` walks: the dates on which the resolved set could change,
what changed between two resolved sets, and the registry's upload times.

Nothing here installs anything (:mod:`.bisect_dates` does):

* :func:`parse_day` reads ``2026-03-01``; the world "on" a day is what the registry held at
  its end (UTC): ``uv pip compile --exclude-newer`` of the next day's midnight
  (:func:`exclude_newer`);
* :func:`upload_days` lists, from each package's upload times, the days between two on
  which a release appeared: the only days on which the resolved set can change;
* :func:`changes` names what changed between two resolved sets (``jax 0.9.2 -> 0.10.0``), and
  :func:`singles` splits it into changes that can be tried alone (jax with its jaxlib);
* :func:`index_upload_times` reads a package's upload times from a PEP 691 index (PEP 700's
  ``upload-time``), and :func:`dated_locations` names the locations that have none (a
  find-links folder, a ``file://`` index), which cannot answer "as of a date".
"""

from __future__ import annotations

import datetime as dt
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence

from packaging.utils import (
  InvalidSdistFilename,
  InvalidWheelFilename,
  parse_sdist_filename,
  parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from .installer import PipSettings
from .rehearse_plan import PAIRED, RehearsalError, normalise

PYPI = "https://pypi.org/simple"
# A package's releases and their first upload time (UTC), by version text.
Registry = Callable[[str], Mapping[str, dt.datetime]]


def parse_day(text: str, flag: str) -> dt.date:
  """``2026-03-01`` as a date.

  Raises:
    RehearsalError: not a date in ISO form, naming the flag and the form.
  """
  try:
    return dt.date.fromisoformat(text)
  except ValueError:
    raise RehearsalError(f"bisect: {flag} {text!r} is not a date; give it as YYYY-MM-DD, e.g. "
                         f"{flag} 2026-03-01.") from None


def exclude_newer(day: dt.date) -> str:
  """uv's ``--exclude-newer`` for the world at the end of ``day`` (UTC)."""
  return f"{day + dt.timedelta(days=1)}T00:00:00Z"


def upload_days(times: Mapping[str, Mapping[str, dt.datetime]], good: dt.date,
                bad: dt.date) -> list[dt.date]:
  """The days after ``good`` and before ``bad`` on which any of the packages had a release
  uploaded (UTC), in order: the resolved set changes on no other day."""
  days = {when.astimezone(dt.UTC).date() for releases in times.values()
          for when in releases.values()}
  return sorted(day for day in days if good < day < bad)


def changes(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
  """``jax 0.9.2 -> 0.10.0``, ``ml-dtypes (none) -> 0.5.4``: each package whose version moved."""
  lines = []
  for name in sorted(set(old) | set(new)):
    if old.get(name) != new.get(name):
      lines.append(f"{name} {old.get(name) or '(none)'} -> {new.get(name) or '(none)'}")
  return lines


def singles(old: Mapping[str, str], new: Mapping[str, str]) -> list[dict[str, str | None]]:
  """The changes from ``old`` to ``new`` that can be tried alone: ``{name: new version}`` (None:
  removed), jax and jaxlib together (a jax release installs with its jaxlib)."""
  moved = [name for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]
  groups: list[dict[str, str | None]] = []
  for name in moved:
    partner = PAIRED.get(name)
    joined = next((g for g in groups if partner in g), None)
    if joined is None:
      joined = {}
      groups.append(joined)
    joined[name] = new.get(name)
  return groups


def applied(world: Mapping[str, str], change: Mapping[str, str | None]) -> dict[str, str]:
  """``world`` with one of :func:`singles` applied."""
  out = dict(world)
  for name, version in change.items():
    if version is None:
      out.pop(name, None)
    else:
      out[name] = version
  return out


def pinned(world: Mapping[str, str]) -> list[str]:
  """A resolved set as requirements: ``jax==0.9.2``."""
  return [f"{name}=={version}" for name, version in sorted(world.items())]


def _version(filename: str) -> Version | None:
  try:
    if filename.endswith(".whl"):
      return parse_wheel_filename(filename)[1]
    return parse_sdist_filename(filename)[1]
  except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
    return None


def read_upload_times(page: Mapping[str, object], index: str) -> dict[str, dt.datetime]:
  """Each release's first upload time from a PEP 691 project page (its files' PEP 700
  ``upload-time``).

  Raises:
    RehearsalError: files without upload times: the index cannot say what it held on a date.
  """
  found: dict[str, dt.datetime] = {}
  files = page.get("files")
  for item in files if isinstance(files, list) else ():
    if not isinstance(item, dict):
      continue
    version = _version(str(item.get("filename", "")))
    when = item.get("upload-time")
    if version is None:
      continue
    if not isinstance(when, str):
      raise RehearsalError(
          f"bisect: the index {index} gives no upload times (PEP 700's upload-time) for "
          f"{item.get('filename')}, so it cannot say what it held on a date; bisect by date "
          "needs an index that does (PyPI, or a mirror that keeps them), or bisect releases "
          "with --good/--bad.")
    moment = dt.datetime.fromisoformat(when.replace("Z", "+00:00"))
    key = str(version)
    found[key] = min(found.get(key, moment), moment)
  return found


def index_upload_times(index: str, name: str, cert: str | None = None
                       ) -> dict[str, dt.datetime]:
  """The upload times of ``name``'s releases on the PEP 691 index ``index`` (none: not there)."""
  url = f"{index.rstrip('/')}/{normalise(name)}/"
  request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
  context = ssl.create_default_context(cafile=cert) if cert else None
  try:
    with urllib.request.urlopen(request, timeout=60, context=context) as response:
      kind = response.headers.get("Content-Type", "")
      body = response.read()
  except urllib.error.HTTPError as e:
    if e.code == 404:
      return {}
    raise RehearsalError(f"bisect: could not read {url} ({e})") from e
  except (urllib.error.URLError, OSError) as e:
    raise RehearsalError(f"bisect: could not read {url} ({e})") from e
  if "json" not in kind:
    raise RehearsalError(
        f"bisect: the index {index} answers {url} without JSON (PEP 691), so it gives no upload "
        "times and cannot say what it held on a date; bisect by date needs an index that does "
        "(PyPI, or a mirror that keeps them), or bisect releases with --good/--bad.")
  return read_upload_times(json.loads(body), index)


def dated_locations(settings: PipSettings) -> tuple[list[str], list[str]]:
  """The indexes that can answer "as of a date" (http and https), and a line for each location
  left out for having no upload times (a find-links folder, a ``file://`` index)."""
  indexes = [settings.index_url or PYPI, *settings.extra_index_urls]
  kept = [url for url in indexes if url.startswith(("http://", "https://"))]
  left = [f"left out {url}: a local index has no upload times" for url in indexes
          if url not in kept]
  left += [f"left out find-links {where}: a folder of files has no upload times"
           for where in settings.find_links]
  return kept, left


def registry_of(indexes: Sequence[str], cert: str | None) -> Registry:
  """A :data:`Registry` over ``indexes``: each release's earliest upload time on any of them."""

  def times(name: str) -> dict[str, dt.datetime]:
    found: dict[str, dt.datetime] = {}
    for index in indexes:
      for version, when in index_upload_times(index, name, cert).items():
        found[version] = min(found.get(version, when), when)
    return found

  return times


def times_of(names: Iterable[str], registry: Registry) -> dict[str, Mapping[str, dt.datetime]]:
  """Each package's upload times (:data:`Registry`), by name."""
  return {name: registry(name) for name in sorted(set(names))}
