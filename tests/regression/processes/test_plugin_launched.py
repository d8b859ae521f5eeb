"""The ``nnx_regression`` fixture in two launched pytest sessions: ``launch -n 2 -- pytest``.

A user's test file (in a temporary project, outside this repository's pytest settings)
checks a model on a global batch split over both processes' devices. The first launch
records (process 0 writes and lists; process 1 hears its verdict and says where the list
is), the second compares and passes in both, and a plain one-process ``pytest`` of the same
file passes too, naming the layout that changed. Marked ``integration``: three pytest
sessions, two of them in two processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEST_FILE = textwrap.dedent('''
    import jax
    import numpy as np
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec as P

    import nnx_pool


    def test_pools(nnx_regression):
      images = np.arange(8 * 8 * 8 * 2, dtype=np.float32).reshape(8, 8, 8, 2) % 7
      mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
      x = jax.make_array_from_callback(images.shape, NamedSharding(mesh, P("data")),
                                       lambda index: images[index])
      pools = nnx.Sequential(nnx_pool.MaxPool(2), nnx_pool.GlobalAvgPool())
      nnx_regression.check("pools", pools, x)
''')


def _pytest(project: Path, *launch: str) -> tuple[int, str]:
  """``pytest -q test_pools.py`` in ``project``, under ``launch`` with those options if any."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("NNX_REGRESSION_")}
  command = ["pytest", "-q", "-p", "no:cacheprovider", "test_pools.py"]
  argv = ([sys.executable, "-m", "nnx_pool.regression", "launch", *launch, "--", *command]
          if launch else [sys.executable, "-m", *command])
  done = subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True, timeout=300,
                        check=False)
  return done.returncode, done.stdout + done.stderr


def test_the_fixture_records_once_and_compares_in_two_processes_and_in_one(tmp_path):
  (tmp_path / "test_pools.py").write_text(TEST_FILE)
  launch = ("-n", "2", "--wait", "30", "--grace", "15", "--timeout", "240")
  status, out = _pytest(tmp_path, *launch)
  assert status == 1, out[-3000:]
  baseline = tmp_path / "_regression" / "test_pools" / "pools"
  assert f"[0] nnx_regression: no baseline for 'pools'; wrote one to {baseline}" in out
  assert (f"[1] nnx_regression (process 0's verdict): no baseline for 'pools'; wrote one to "
          f"{baseline}") in out
  assert "[0] wrote 1 new baseline(s) (rerun to compare):" in out
  assert ("[1] process 1: baselines, obtained files and the HTML page are written and listed by "
          "process 0") in out
  assert (baseline / "manifest.json").is_file()

  status, out = _pytest(tmp_path, *launch)
  assert status == 0, out[-3000:]
  assert "[0] 1 passed" in out and "[1] 1 passed" in out

  status, out = _pytest(tmp_path)  # one process, one device
  assert status == 0, out[-3000:]
  assert ("'pools' passed; layout changed (processes 2 -> 1; mesh data=4 -> none; inputs "
          "input/0 [data, -, -, -] -> input/0 one device)") in out
