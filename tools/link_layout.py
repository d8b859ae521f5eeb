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
``regression/`` folder; and ``nnx-pool-links.pth`` in the environment's site-packages. Its
first line puts the folder on ``sys.path``, where type checkers look (pyright asks the
interpreter for ``sys.path``). Its second line keeps Python from importing through the
links: it moves the editable install's finder ahead of the path-based one, so ``nnx_pool``
and ``nnx_pool.regression`` import from the repository's files, and a traceback or a
module's ``__file__`` names ``nnx_pool/_pool.py``, not its link (site reads the ``.pth``
files in name order, setuptools' ``__editable__`` one first). An edit shows through the
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
# The .pth line that moves setuptools' editable finder (its module is named
# __editable___<project>_<version>_finder) ahead of the others; a .pth line starting with
# "import" runs, and type checkers skip it.
FINDER_FIRST = ('import sys; sys.meta_path.sort(key=lambda finder: not getattr(finder, '
                '"__module__", "").startswith("__editable___nnx_pool_"))')


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
  pth = site_packages / f"{FOLDER}.pth"
  pth.with_suffix(".tmp").write_text(f"{tree}\n{FINDER_FIRST}\n")
  os.replace(pth.with_suffix(".tmp"), pth)
  return tree

if __name__ == "__main__":
  if sys.prefix == sys.base_prefix:
    sys.exit("run it with a virtual environment's interpreter, e.g. .venv/bin/python "
             f"{Path(__file__).name}")
  print(link_layout(Path(sys.prefix), Path(sysconfig.get_paths()["purelib"])))
