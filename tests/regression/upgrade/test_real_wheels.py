"""``bisect`` with real wheels from the registry (``make test-rehearsal``, ``-m rehearsal``):
guide 12's test, written to move at jax 0.10.0, bisected by release and by date."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

USER_TEST = '''\
import jax
import jax.numpy as jnp
from packaging.version import Version


def test_column_means(nnx_regression):
  x = jnp.arange(12.0).reshape(3, 4)
  # Deliberately version-dependent: from jax 0.10.0 on, this "model" adds 1e-3.
  shift = 1e-3 if Version(jax.__version__) >= Version("0.10.0") else 0.0
  nnx_regression.check("column_means", lambda a: a.mean(axis=0) + shift, x)
'''

BISECT = [sys.executable, "-m", "nnx_pool.regression", "bisect"]


def _project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
  """A user's project holding the test, and the bisect's environment variables."""
  project = tmp_path / "project"
  (project / "tests").mkdir(parents=True)
  (project / "tests" / "test_moves.py").write_text(USER_TEST)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.setdefault("NNX_POOL_CACHE", str(tmp_path / "cache"))  # fresh builds unless told
  env["NNX_POOL_REHEARSE_KEEP"] = "10"  # keep every environment, to count them
  env["TMPDIR"] = str(tmp_path)  # where the bisect keeps what the moved test's report names
  return project, env


@pytest.mark.rehearsal
@pytest.mark.timeout(1500)
def test_bisect_names_jax_0_10_0_with_real_wheels_in_at_most_4_installs(tmp_path):
  project, env = _project(tmp_path)
  cache = Path(env["NNX_POOL_CACHE"]) / "rehearse"
  before = set(cache.iterdir()) if cache.is_dir() else set()
  started = time.monotonic()
  done = subprocess.run(
      [*BISECT, "--good", "jax==0.9.0", "--bad", "jax==0.10.2", "--resolve", "--no-batch",
       "--pytest", "tests"],
      cwd=project, env=env, capture_output=True, text=True, timeout=1500, check=False)
  minutes = (time.monotonic() - started) / 60
  assert done.returncode == 1, done.stderr
  lines = done.stdout.splitlines()
  assert lines[-1].startswith("first moved: jax 0.10.0 (jaxlib 0.10.0, flax "), lines[-1]
  assert lines[-1].endswith("), last good: jax 0.9.2")
  installs = int(lines[-2].split(" steps, ")[1].split(" install")[0])
  built = {e for e in cache.iterdir() if (e / "env" / "pyvenv.cfg").is_file()} - before
  assert installs <= 4 and len(built) <= installs, (lines[-2], built)
  assert "jax 0.9.0 -> 0.10.0" in done.stdout  # the failing test's report
  # Issue 40, across real releases: the program recorded under jax 0.9.0 still gives its
  # numbers under 0.10.0, and the first new StableHLO line is the test's own shift of 1e-3.
  at = lines.index("the program changed, not the compiler: jax/flax (or your code) now lower "
                   "this model differently; the recorded program still gives the recorded "
                   "numbers here. First differing StableHLO lines (recorded -, now +):")
  assert lines[at + 1].strip() == "+ % = stablehlo.constant dense<1.000000e-03> : tensor<f32>"
  assert not (project / "tests" / "_regression").exists()  # the user's baselines: untouched
  (kept,) = tmp_path.glob("nnx-pool-bisect-*")  # what the report names, and nothing else
  assert sorted(p.name for p in kept.iterdir()) == ["check-4.tmp", "user"]
  assert f"are kept in {kept} (" in done.stdout
  print(done.stderr, lines[-2], f"({minutes:.1f} min measured here)", sep="\n")


@pytest.mark.rehearsal
@pytest.mark.timeout(1500)
def test_bisect_by_date_names_the_day_jax_0_10_0_appeared_with_real_wheels(tmp_path):
  # Issue 39: the registry's upload times, no package named. PyPI's JSON page for jax gives
  # jax-0.10.0-py3-none-any.whl the upload time 2026-04-16T12:32:11Z (read by hand): the
  # first day whose set holds the release the test moves at; the day before it on which
  # any package of the set had a release, 2026-04-14, is the last good one.
  project, env = _project(tmp_path)
  done = subprocess.run(
      [*BISECT, "--good-date", "2026-03-01", "--bad-date", "2026-09-01", "--no-batch",
       "--pytest", "tests"],
      cwd=project, env=env, capture_output=True, text=True, timeout=1500, check=False)
  assert done.returncode == 1, done.stderr
  lines = done.stdout.splitlines()
  assert lines[-1] == ("first moved: 2026-04-16: jax 0.9.2 -> 0.10.0, jaxlib 0.9.2 -> 0.10.0 "
                       "(last good: 2026-04-14)"), done.stderr
  print(done.stderr, lines[-2], sep="\n")
