"""Root pytest configuration: strict JAX settings, and Markdown code blocks as tests.

Every ``python`` code block in README.md, guides/*.md and docs/modules.md runs under pytest
through Sybil. Blocks written as ``>>>`` sessions are doctests, so every result they show is
compared with what the library really returns.
"""

import doctest
import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Nothing is collected while the suite starts (jax, flax, torch and the test modules imported,
# the tests collected): the cyclic collector's passes over that growing heap took 1.3 s of each
# worker's 6.3 s start (`pytest --collect-only`, 2 cores). pytest_collection_finish turns it
# back on; pytest-xdist's controller, which collects nothing, at its session's start.
gc.disable()

import pytest  # noqa: E402
from sybil import Sybil  # noqa: E402
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser  # noqa: E402

pytest_collect_file = Sybil(
    parsers=[
        PythonCodeBlockParser(doctest_optionflags=doctest.NORMALIZE_WHITESPACE),
        SkipParser(),
    ],
    # docs/ pages one by one, those whose python blocks are examples written to run here
    # (docs/regression.md's are a user's test file and a demo that writes a baseline).
    patterns=["README.md", "guides/*.md", "docs/modules.md"],
).pytest()


# Balancing the two xdist workers (`make test` runs `-n 2 --dist loadfile`): a worker
# takes the next whole file when it is nearly done with its current one, so the files
# that take longest go first and the many short ones fill in behind them (longest
# processing time first). pytest-xdist would otherwise sort files by their number of
# tests, which put the 8-device sharding run (few tests, a long setup) near the end,
# where it serialised on one worker. Measured serially on 2 cores; the rest of the
# files keep their collection order after these. Within a file nothing moves, so
# Sybil's Markdown blocks stay in order.
SLOW_FILES_FIRST = (
    "tests/test_kernels.py",
    "tests/test_sharding.py",
    "tests/test_robustness.py",
    "tests/test_pool.py",
    "tests/regression/batch/test_shipped.py",
    "tests/test_pool_properties.py",
    "tests/test_backend.py",
    "tests/test_pool_torch.py",
    "tests/test_adaptive.py",
    "tests/test_install.py",
    "tests/test_errors_table.py",
    "tests/regression/test_stress.py",
    "tests/test_gates.py",
    "tests/regression/test_cli.py",
)


# One persistent XLA compilation cache for the whole run: the xdist workers and the
# subprocesses that tests start (the `python -O` reruns, the device check's dry run,
# the CLI and install checks) compile many of the same programs, and a program
# compiled once is loaded from the cache by the other processes. It is made empty
# at the start of the run and removed at its end, so nothing carries over between
# runs; a JAX_COMPILATION_CACHE_DIR already set by the caller is used as it is.
# Measured with `make test EXTRAS=test,parity` on 2 cores: 258 s without it (an empty
# JAX_COMPILATION_CACHE_DIR= turns it off), 234 s with it (2026-12-07). A run that was killed
# cannot remove its cache (26 MB): its name carries the pid of the run that made it, and
# the next run removes those whose process is gone.
_CACHE_SETTINGS = {  # jax options, read from the variables of the same name in capitals
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    "jax_persistent_cache_min_entry_size_bytes": -1,
}
_OWN_CACHE: list[str] = []
_CACHE_PREFIX = "nnx-pool-xla-cache-"


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except OSError:  # not ours to signal (alive), or no such check on this platform
    return True
  return True


def _remove_stale_caches() -> None:
  """Removes the caches of earlier runs that were killed before they could remove their own."""
  root = Path(tempfile.gettempdir())
  for path in root.glob(f"{_CACHE_PREFIX}*"):
    pid = path.name.removeprefix(_CACHE_PREFIX).partition("-")[0]
    if pid.isdigit() and not _alive(int(pid)):
      shutil.rmtree(path, ignore_errors=True)


def _share_compilation_cache() -> None:
  """Sets the variables that the workers and subprocesses read when they import jax."""
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _remove_stale_caches()
    _OWN_CACHE.append(tempfile.mkdtemp(prefix=f"{_CACHE_PREFIX}{os.getpid()}-"))
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE[0]
  for name, value in _CACHE_SETTINGS.items():
    os.environ.setdefault(name.upper(), str(value))


# The workers (and the processes their tests start) inherit these before they import NumPy
# or torch: with one pytest-xdist worker per core, a library's own thread pool (OpenBLAS's
# under NumPy, OpenMP's under torch) only competes with the other worker for its core, and
# OpenBLAS's threads spin while they wait. `make test EXTRAS=test,parity`, 2 cores: 201.5 s
# to 204.5 s of pytest time in four runs without them, 197.8 s and 200.3 s with them
# (2026-12-07). Nothing else changes: XLA's own settings and the compiled programs stay
# those users get.
_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _one_thread_each() -> None:
  for name in _ONE_THREAD:
    os.environ.setdefault(name, "1")


# The suite's baselines live in temporary directories, which need not outlive a crash of the
# machine: the kit's writes skip their fsyncs (NNX_POOL_FSYNC=0, docs/regression.md), which
# wait for the disk (about 3 ms each on the 2-core runner; `make test` wrote 2,511, strace -c
# -w). Everything else about a write, its order and its atomicity against a killed process,
# stays; tests/regression/store/test_store.py checks the fsyncs of the default.
def _no_fsync() -> None:
  os.environ.setdefault("NNX_POOL_FSYNC", "0")


def _configure_jax() -> None:
  """The settings of a process that runs tests (jax may already be imported here)."""
  import jax

  # Implicit rank promotion hides layout bugs (an (N, C) array broadcast against an
  # (N, H, W, C) one); raise instead, as Equinox's suite does.
  jax.config.update("jax_numpy_rank_promotion", "raise")
  jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
  for name, value in _CACHE_SETTINGS.items():
    jax.config.update(name, type(value)(os.environ.get(name.upper(), str(value))))


def pytest_configure(config):
  if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order below
    config.option.loadscopereorder = False
  worker = hasattr(config, "workerinput")
  if not worker:  # the controller, or a run without xdist
    _share_compilation_cache()
    _no_fsync()
    if getattr(config.option, "numprocesses", None):
      _one_thread_each()
  # pytest-xdist's controller runs no test: it starts its workers without importing jax
  # (1 s of the run's start).
  if worker or not getattr(config.option, "numprocesses", None):
    _configure_jax()


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config):
  if hasattr(config, "workerinput"):
    # A pytest-xdist worker sent its last report and "workerfinished" at the session's end;
    # what remained kept the controller waiting: pytest's final garbage collection over all
    # a worker holds (0.7 s to 1 s), then the interpreter's teardown (jax destroying the
    # 2,000 or more programs it compiled). From the last worker's last test to the run's
    # end: 6.4 s when it tore down, 2.1 s leaving at its interpreter's exit (os._exit
    # registered with atexit), 1.3 s leaving here, before the other plugins' unconfigure
    # (`make test`, 2 cores). The controller counts a worker that closes its channel after
    # "workerfinished" as finished, not as lost.
    _exit_now()
  for path in _OWN_CACHE:
    shutil.rmtree(path, ignore_errors=True)


def _exit_now() -> None:
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)


# Python's cyclic garbage collector scans every object a process holds, and a worker holds
# jax, flax, torch, the collected tests and the programs it compiled: in `make test` it took
# 18 s of the two workers' 393 s of CPU (gc.callbacks, 2 cores). The objects that exist once
# collection ends live to the end of the run, so they are frozen out of the scans, and the
# young generation is collected 14 times less often: 7.6 s of GC, 378 s of CPU (four of the
# heaviest files alone: 87.2-88.4 s -> 84.0-84.7 s of CPU). No test depends on when a
# collection runs.
def pytest_collection_finish(session):
  gc.collect()
  gc.freeze()
  gc.set_threshold(10_000, 50, 100)
  gc.enable()


def pytest_sessionstart(session):
  if session.config.pluginmanager.has_plugin("dsession"):  # pytest-xdist's controller
    gc.enable()


def pytest_collection_modifyitems(config, items):
  # Tests marked `rehearsal` install real wheels from the registry (minutes, the network),
  # and those marked `integration` are end-to-end runs of a minute or so each (the 8-device
  # sharding worker, the device check's dry run, the 8 M-parameter model's baselines): each
  # left out unless -m names it (`make test-rehearsal`, `make test-integration`, CI steps of
  # their own).
  for marker in ("rehearsal", "integration"):
    if marker not in (config.option.markexpr or ""):
      left_out = [item for item in items if item.get_closest_marker(marker)]
      if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker(marker)]
  rank = {path: i for i, path in enumerate(SLOW_FILES_FIRST)}
  root = config.rootpath
  def file_rank(item):
    path = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
    return rank.get(path, len(rank))
  items.sort(key=file_rank)  # stable: the order within a file, and of the other files, stays
