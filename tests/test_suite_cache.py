"""The suite's shared XLA compilation cache (conftest.py): a killed run's cache is removed by
the next run, a live run's is kept."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path


def test_next_run_removes_the_cache_of_a_killed_run_and_keeps_a_live_ones(pytestconfig):
  # The root conftest as pytest loaded it (`import conftest` may find another folder's).
  conftest = pytestconfig.pluginmanager.get_plugin(str(pytestconfig.rootpath / "conftest.py"))
  done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  dead = int(done.stdout)  # a process that has exited: its cache is stale
  root = Path(tempfile.gettempdir())
  stale = Path(tempfile.mkdtemp(prefix=f"nnx-pool-xla-cache-{dead}-", dir=root))
  (stale / "entry").write_bytes(b"x")
  live = Path(tempfile.mkdtemp(prefix=f"nnx-pool-xla-cache-{os.getpid()}-", dir=root))
  try:
    conftest._remove_stale_caches()
    assert not stale.exists()
    assert live.is_dir()
  finally:
    for path in (stale, live):
      if path.exists():
        for child in path.iterdir():
          child.unlink()
        path.rmdir()
