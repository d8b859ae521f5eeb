"""Lays out nnx_pool's sources as the wheel installs them, for tools that read sources.

The repository keeps the regression kit in ``regression/`` and setuptools' ``package-dir``
installs it as ``nnx_pool.regression``. Tools that find a package by walking folders (griffe
for the site's reference, pyright for ``make typecheck``) cannot follow the editable
install's import hook, so they read a copy laid out as installed::

  python docs/site_src/installed_layout.py build/typecheck

writes ``build/typecheck/nnx_pool/`` (``nnx_pool/**/*.py``, ``*.pyi``, ``py.typed``) and
``build/typecheck/nnx_pool/regression/`` (``regression/**/*.py``, its sub-packages with their
folders), replacing what was there.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The folders of the installed package, and where each one's files come from.
SOURCES = {("nnx_pool",): ROOT / "nnx_pool", ("nnx_pool", "regression"): ROOT / "regression"}
PATTERNS = ("*.py", "*.pyi", "py.typed")


def lay_out(dest: Path) -> Path:
  """Copies the package's sources under ``dest`` as installed; returns ``dest``."""
  shutil.rmtree(dest / "nnx_pool", ignore_errors=True)
  for parts, source in SOURCES.items():
    folder = dest.joinpath(*parts)
    folder.mkdir(parents=True, exist_ok=True)
    for pattern in PATTERNS:
      for file in sorted(source.rglob(pattern)):
        if "__pycache__" in file.parts:
          continue
        target = folder / file.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(file, target)
  return dest


if __name__ == "__main__":
  if len(sys.argv) != 2:
    sys.exit(f"usage: python {Path(__file__).name} DEST_FOLDER")
  lay_out(Path(sys.argv[1]))
