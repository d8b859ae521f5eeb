"""The editable install ``make`` builds: Python imports the repository's own files.

``make`` installs nnx-pool in editable mode and lays out links for type checkers
(``tools/link_layout.py``): they are on ``sys.path``, where pyright reads them
(``make typecheck`` checks that it resolves the package through them). Python must still
import the repository's files, so that a traceback and ``module.__file__`` name
``nnx_pool/_pool.py``, the file to open, not a link in the virtual environment (issue 36,
item 15). Run from a directory outside the repository, as a user's project is, where the
repository is not on ``sys.path``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Prints, as JSON, where nnx_pool, the kit and the module of MaxPool come from, and the files
# of the traceback of a refused argument (raised inside nnx_pool).
_WHERE = """\
import importlib, json, traceback
importlib.invalidate_caches()  # as pytest and others do: the links must stay skipped after it
import nnx_pool, nnx_pool.regression
module = importlib.import_module(nnx_pool.MaxPool.__module__)
try:
  nnx_pool.MaxPool("two")
except (TypeError, ValueError) as e:
  frames = [frame.filename for frame in traceback.extract_tb(e.__traceback__)]
print(json.dumps({"package": nnx_pool.__file__, "kit": nnx_pool.regression.__file__,
                  "module": module.__file__, "frames": frames}))
"""


def _editable_here() -> bool:
  """Whether this environment's nnx-pool is the editable install of this repository (read
  from its site-packages: from the repository root, a build's nnx_pool.egg-info answers)."""
  site = sysconfig.get_paths()["purelib"]
  for dist in importlib.metadata.distributions(name="nnx-pool", path=[site]):
    info = json.loads(dist.read_text("direct_url.json") or "{}")
    return bool(info.get("dir_info", {}).get("editable")) and info.get("url") == ROOT.as_uri()
  return False


@pytest.mark.skipif(not _editable_here(), reason="nnx-pool is not this repository's editable "
                    "install (`make` builds one)")
def test_the_editable_install_imports_the_repositorys_files_not_the_links(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  done = subprocess.run([sys.executable, "-c", _WHERE], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 0, done.stderr
  where = json.loads(done.stdout)
  # Before: .venv/nnx-pool-links/nnx_pool/__init__.py, and every frame in the links.
  assert Path(where["package"]) == ROOT / "nnx_pool" / "__init__.py"
  assert Path(where["kit"]) == ROOT / "regression" / "__init__.py"
  assert Path(where["module"]).parent == ROOT / "nnx_pool"
  ours = [Path(f) for f in where["frames"] if "nnx_pool" in Path(f).parts
          or "nnx-pool-links" in Path(f).parts]
  assert ours and all(f.parent == ROOT / "nnx_pool" for f in ours), where["frames"]
  assert where["module"] in where["frames"]
