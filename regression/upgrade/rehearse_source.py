"""This nnx-pool, as a rehearsal installs it: from a checkout's copy, a URL, or an index.

From a source checkout (:func:`~nnx_pool.regression.stamp.source_checkout`, an editable
install included), the files its build reads (:data:`SOURCE_FILES`) are copied to a
temporary directory, hashed as they are copied, and installed from there, so nothing is
written into the checkout. Installed from a wheel or an archive, it is installed from the
URL pip recorded (``direct_url.json``); installed from an index, as
``nnx-pool==<version>`` from the index. The digest (:meth:`Source.digest`) tells a cached
environment whether the nnx-pool it holds is this one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..stamp import source_checkout
from .rehearse_plan import SELF, RehearsalError

# What pyproject.toml's setuptools configuration reads to build nnx-pool.
SOURCE_FILES = ("pyproject.toml", "README.md", "nnx_pool", "regression")
# In a user's `file://` directory, what a build or a tool leaves, and is not the package.
_NOT_SOURCE = re.compile(r"^(\.git|\.hg|\.svn|__pycache__|build|dist|\.venv|venv|\.tox|\.nox|"
                         r"\.[a-z_]*cache|.*\.egg-info)$")


def location_digest(path: Path) -> str:
  """The SHA-256 of a ``file://`` requirement's location: a file's bytes, or a directory's
  files (paths and bytes, not following links), less what builds and tools leave there
  (``.git``, ``build``, ``dist``, ``*.egg-info``, caches). ``missing`` when there is nothing.
  """
  h = hashlib.sha256()
  if path.is_file():
    h.update(path.read_bytes())
    return h.hexdigest()
  if not path.is_dir():
    return "missing"
  for where, dirs, names in os.walk(path):
    dirs[:] = sorted(d for d in dirs if not _NOT_SOURCE.match(d))
    for name in sorted(names):
      file = Path(where, name)
      if file.is_file() and not name.endswith(".pyc"):
        h.update(file.relative_to(path).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(file.read_bytes()).digest())
  return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class Snapshot:
  """nnx-pool as one install takes it: the pip requirement, and the digest of what it installs."""

  requirement: str
  digest: str


@dataclasses.dataclass(frozen=True)
class Source:
  """Where the rehearsal installs this nnx-pool from.

  Attributes:
    root: a source checkout, copied before each install; or None.
    url: else the URL pip installed it from (a wheel, an archive); or None.
    version: else the version to install from the index.
    requires: its declared requirements (extras included).
  """

  root: Path | None
  url: str | None
  version: str | None
  requires: tuple[str, ...]

  def files(self) -> list[Path]:
    """The files of a checkout that the build reads (:data:`SOURCE_FILES`)."""
    if self.root is None:
      return []
    files = []
    for name in SOURCE_FILES:
      path = self.root / name
      found = [path] if path.is_file() else sorted(path.rglob("*"))
      files += [p for p in found if p.is_file() and "__pycache__" not in p.parts]
    return files

  def digest(self) -> str:
    """What a cached environment compares with the nnx-pool it holds: the files, or the URL."""
    return self._hash((self._name(p), p.read_bytes()) for p in self.files())

  def snapshot(self, extras: Sequence[str], scratch: Path) -> Snapshot:
    """The pip requirement installing it with ``extras``, and the digest of what it installs.

    A checkout is copied under ``scratch`` and the digest taken from the bytes copied,
    so an edit made while pip installs the copy is not stamped onto it.
    """
    name = f"{SELF}[{','.join(extras)}]" if extras else SELF
    if self.root is None:
      return Snapshot(f"{name} @ {self.url}" if self.url else f"{name}=={self.version}",
                      self.digest())
    copy = scratch / "nnx-pool-source"
    shutil.rmtree(copy, ignore_errors=True)
    copied = []
    for path in self.files():
      data = path.read_bytes()
      target = copy / self._name(path)
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_bytes(data)
      copied.append((self._name(path), data))
    return Snapshot(f"{name} @ {copy.as_uri()}", self._hash(copied))

  def _name(self, path: Path) -> str:
    # Called only on the paths files() lists, which is empty when root is None.
    return path.relative_to(self.root).as_posix()  # pyright: ignore[reportArgumentType]

  def _hash(self, files: Iterable[tuple[str, bytes]]) -> str:
    h = hashlib.sha256(f"{self.url} {self.version}".encode())
    for name, data in files:
      h.update(name.encode() + b"\0")
      h.update(hashlib.sha256(data).digest())
    return h.hexdigest()


def this_source() -> Source:
  """Where this nnx-pool comes from: a checkout, the URL pip installed it from, or an index.

  Raises:
    RehearsalError: nnx-pool is neither a checkout nor installed.
  """
  root = source_checkout()
  if root is not None:
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    requires = [*project.get("dependencies", []),
                *(f"{r}; extra == {name!r}" for name, group in sorted(extras.items())
                  for r in group)]
    return Source(root, None, None, tuple(requires))
  try:
    dist = importlib.metadata.distribution(SELF)
  except importlib.metadata.PackageNotFoundError as e:
    raise RehearsalError("rehearse: nnx-pool is neither a source checkout nor an installed "
                         "distribution; install it with pip first.") from e
  direct = dist.read_text("direct_url.json")
  url = json.loads(direct).get("url") if direct else None
  return Source(None, url, dist.version, tuple(dist.requires or ()))
