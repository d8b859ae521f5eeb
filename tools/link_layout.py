"""Lays nnx_pool out as installed, in links that type checkers read, in a virtual environment.

``make`` installs nnx-pool in editable mode, where setuptools maps the repository's
``regression/`` folder to ``nnx_pool.regression`` with an import hook. Python follows the
hook; type checkers (pyright, and Pylance in VS Code) read folders and cannot, so in a
user's file they resolved neither ``nnx_pool`` nor ``nnx_pool.regression``. setuptools'
``editable_mode=strict`` lays out such links itself, but in place of the hook: then the
repository's own ``nnx_pool/``, which holds no ``regression/``, comes first on ``sys.path``
in every command run from the repository root, and ``python -m pytest`` there fails to load
the kit's plugin. So ``make`` keeps the hook and runs this script with the environment's
interpreter::

  .venv/bin/python tools/link_layout.py

It writes ``<env>/nnx-pool-links/nnx_pool/``: a link to each of ``nnx_pool/``'s
``*.py``, ``*.pyi``, ``py.typed`` and sub-packages, and ``nnx_pool/regression`` linking the
``regression/`` folder; and, in the environment's site-packages, ``nnx-pool-links.pth`` and
the module its second line imports, ``_nnx_pool_links.py``. The ``.pth``'s first line puts
the folder on ``sys.path``, where type checkers look (pyright asks the interpreter for
``sys.path``, and skips a ``.pth`` line that imports). The module keeps Python from importing
through the links: a path hook answers for the folder with a finder that finds nothing, so
Python takes ``nnx_pool`` from wherever it would without the links (the editable install's
hook: the repository's files; or an earlier ``sys.path`` entry, as before), and a traceback or
a module's ``__file__`` names ``nnx_pool/_pool.py``, not its link. An edit shows through the
links at once, as does a file added to ``regression/``; a module added to ``nnx_pool/``
needs the script run again (``make typecheck`` runs it every time).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = "nnx-pool-links"
PATTERNS = ("*.py", "*.pyi", "py.typed")
HOOK = "_nnx_pool_links"  # the module the .pth imports, written beside it
HOOK_SOURCE = '''"""Keeps Python from importing nnx_pool through the links type checkers read.

Written by nnx-pool's tools/link_layout.py: the links folder stays on sys.path, where pyright
finds the package, and this path hook answers for that folder with a finder that finds
nothing, so Python imports nnx_pool as it would without the folder (the editable install's
files, the repository's own).
"""

import sys

LINKS = {links!r}


class _Nothing:
  """The finder of the links folder: it finds no module there."""

  @staticmethod
  def find_spec(fullname, target=None):
    return None

  @staticmethod
  def invalidate_caches():
    pass


def links_hook(path):
  """sys.path_hooks' entry: the empty finder for the links folder, no other path."""
  if path != LINKS:
    raise ImportError(path)
  return _Nothing


if not any(getattr(hook, "__name__", "") == "links_hook" for hook in sys.path_hooks):
  sys.path_hooks.insert(0, links_hook)
sys.path_importer_cache.pop(LINKS, None)
'''


def link_layout(prefix: Path, site_packages: Path) -> Path:
  """Replaces ``prefix/nnx-pool-links`` and writes its ``.pth`` in ``site_packages``."""
  tree = prefix / FOLDER
  staging = prefix / f"{FOLDER}.tmp"
  shutil.rmtree(staging, ignore_errors=True)  # links only: their targets stay
  package = staging / "nnx_pool"
  package.mkdir(parents=True)
  for pattern in PATTERNS:
    for file in sorted((ROOT / "nnx_pool").glob(pattern)):
      (package / file.name).symlink_to(file)
  for folder in sorted((ROOT / "nnx_pool").glob("*/__init__.py")):
    (package / folder.parent.name).symlink_to(folder.parent, target_is_directory=True)
  (package / "regression").symlink_to(ROOT / "regression", target_is_directory=True)
  shutil.rmtree(tree, ignore_errors=True)
  staging.rename(tree)
  _write(site_packages / f"{HOOK}.py", HOOK_SOURCE.format(links=str(tree)))
  _write(site_packages / f"{FOLDER}.pth", f"{tree}\nimport {HOOK}\n")
  return tree


def _write(path: Path, text: str) -> None:
  """Replaces ``path`` whole (a temporary file renamed over it)."""
  path.with_suffix(".tmp").write_text(text)
  os.replace(path.with_suffix(".tmp"), path)

if __name__ == "__main__":
  if sys.prefix == sys.base_prefix:
    sys.exit("run it with a virtual environment's interpreter, e.g. .venv/bin/python "
             f"{Path(__file__).name}")
  print(link_layout(Path(sys.prefix), Path(sysconfig.get_paths()["purelib"])))
