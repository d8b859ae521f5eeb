"""The kit where ``fcntl`` does not exist (Windows), and its one lock (``store/lock.py``).

CI has no Windows, so Windows is simulated: a ``sitecustomize`` blocks ``fcntl``
(``sys.modules["fcntl"] = None``, so ``import fcntl`` raises ImportError as it does there)
and provides a stand-in ``msvcrt`` whose ``locking`` is backed by the real ``flock``,
taken before the block. Installed nnx-pool loads its pytest plugin in every pytest
session of an environment (the ``pytest11`` entry point), so an import that fails there
fails the user's own test suite at collection (issue 21, item 2).
"""

from __future__ import annotations

import ast
import errno
import fcntl
import os
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import numpy as np
import pytest

import nnx_pool.regression
from nnx_pool.regression import store
from nnx_pool.regression.store import lock

REPO = Path(nnx_pool.regression.__file__).resolve().parents[1]

# A Windows-like interpreter: no fcntl, and an msvcrt whose locking is flock on the file.
WINDOWS_SITECUSTOMIZE = """\
import errno, sys, types
import fcntl as _fcntl  # taken before it is blocked: the stand-in msvcrt locks with it
import subprocess  # before the stand-in: it decides it runs on Windows by importing msvcrt

def _locking(fd, mode, nbytes):
  if mode == 0:  # LK_UNLCK
    _fcntl.flock(fd, _fcntl.LOCK_UN)
    return
  try:
    _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
  except BlockingIOError:
    raise PermissionError(errno.EACCES, "Permission denied") from None

_msvcrt = types.ModuleType("msvcrt")
_msvcrt.LK_UNLCK, _msvcrt.LK_NBLCK, _msvcrt.locking = 0, 2, _locking
sys.modules["msvcrt"] = _msvcrt
sys.modules["fcntl"] = None  # `import fcntl` raises ImportError, as on Windows
"""


def _windows_env(tmp_path: Path) -> dict[str, str]:
  site = tmp_path / "windows-site"
  site.mkdir()
  (site / "sitecustomize.py").write_text(WINDOWS_SITECUSTOMIZE)
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(site)}
  env.pop("PYTEST_ADDOPTS", None)
  env.pop("PYTEST_XDIST_WORKER", None)
  return env


# ------------------------------------------------------- the simulated Windows

_USERS_TEST = textwrap.dedent("""\
    import sys


    def test_fcntl_is_blocked():
      with __import__("pytest").raises(ImportError):
        import fcntl  # noqa: F401


    def test_the_nnx_regression_plugin_is_loaded(pytestconfig, nnx_regression):
      assert pytestconfig.pluginmanager.has_plugin("nnx_regression")
""")

# One simulated-Windows interpreter does both jobs (each start of one imports JAX and the
# kit, about 2 s): first a pytest session in the user's project, as `python -m pytest`
# there (the plugin loads through its entry point into a fresh interpreter), then info,
# a check of the shipped baseline, record and check. One case's check of the shipped
# baseline reads it as well as seven, and max_k2_one is then compiled already for record.
_PYTEST_THEN_KIT = textwrap.dedent("""\
    import sys
    from pathlib import Path

    import pytest

    assert sys.modules["fcntl"] is None and "msvcrt" in sys.modules
    project, out = Path(sys.argv[1]), Path(sys.argv[2])
    print("pytest exit", int(pytest.main(["-p", "no:cacheprovider", str(project)])))
    print("%s")
    from nnx_pool.regression import cli
    from nnx_pool.regression.batch import Batch, load_batch

    two = lambda: Batch([c for c in load_batch().cases if c.name in ("max_k2_one", "avg_k2_one")])
    codes = [
        cli.main(["info"]),
        cli.main(["check", "-k", "max_k2_one", "--dry-run"]),  # the shipped baseline
        cli.main(["record", "--out", str(out)], batch=two),
        cli.main(["check", "--baseline", str(out)], batch=two),
    ]
    print("codes", codes)
""")
_KIT = "----- the kit"


@pytest.fixture(scope="module")
def windows_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, str, str, Path]:
  """The simulated Windows' run: (the process, pytest's output, the kit's output, its --out)."""
  tmp_path = tmp_path_factory.mktemp("windows")
  project = tmp_path / "project"
  project.mkdir()
  (project / "test_theirs.py").write_text(_USERS_TEST)
  out = tmp_path / "baselines" / "two"
  done = subprocess.run([sys.executable, "-c", _PYTEST_THEN_KIT % _KIT, str(project), str(out)],
                        cwd=project, env=_windows_env(tmp_path), capture_output=True, text=True,
                        timeout=300, check=False)
  ran_pytest, _, kit = done.stdout.partition(f"\n{_KIT}\n")
  return done, ran_pytest, kit, out


def test_portable_pytest_in_a_users_project_runs_without_fcntl(windows_run):
  done, ran_pytest, _, _ = windows_run
  # Before: `Error while loading plugin "pytest11"` ... `import fcntl` ... ModuleNotFoundError,
  # exit 3, and no test of the user's ran.
  assert ran_pytest.splitlines()[-1] == "pytest exit 0", done.stdout + done.stderr
  assert ran_pytest.splitlines()[-2].startswith("===") and " 2 passed" in ran_pytest


@pytest.mark.slow
def test_portable_info_check_and_record_run_without_fcntl(windows_run):
  done, _, kit, out = windows_run
  assert done.returncode == 0, done.stdout + done.stderr
  assert kit.splitlines()[-1] == "codes [0, 0, 0, 0]", done.stdout + done.stderr
  assert kit.startswith("versions:\n  python ")  # info's stamp
  assert "wrote baseline" in kit and "1 cases: 1 pass" in kit and "2 cases: 2 pass" in kit
  assert sorted(p.name for p in out.iterdir())[-1] == "manifest.json"
  # record took the Windows lock: msvcrt's, on a lock file beside the baseline.
  assert (out.parent / lock.LOCK_FILE).is_file()


def test_portable_no_installed_module_imports_posix_only_modules_at_import_time():
  # Imports inside a function run where a lock is taken; at module level they would run on
  # `import nnx_pool` and in every pytest session of the user's.
  platform_only = {"fcntl", "termios", "pwd", "grp", "resource", "msvcrt", "winreg"}
  found = []
  for path in sorted([*(REPO / "nnx_pool").rglob("*.py"), *(REPO / "regression").rglob("*.py")]):
    tree = ast.parse(path.read_text(), str(path))
    for node in _module_level(tree.body):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import)
               else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
      if {n.split(".")[0] for n in names} & platform_only:
        found.append(f"{path.relative_to(REPO)}:{node.lineno}")
  assert found == []


def _module_level(body: list[ast.stmt]):
  """The statements that run on import: not those inside a function or class body's functions."""
  for node in body:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
      continue
    yield node
    for field in ("body", "orelse", "finalbody", "handlers"):
      yield from _module_level(getattr(node, field, None) or [])


# ------------------------------------------------------------------ the lock


def test_lock_a_second_holder_waits_then_gives_up_with_busy(tmp_path):
  calls = []
  with lock.exclusive(tmp_path):
    with pytest.raises(lock.Busy):
      lock.exclusive(tmp_path, timeout_s=0.1, waiting=lambda: calls.append("waiting"))
  assert calls == ["waiting"]
  assert os.listdir(tmp_path) == []  # POSIX: the directory itself is locked, no file written
  with lock.exclusive(tmp_path, timeout_s=0):  # free again
    pass


def test_lock_a_waiter_gets_it_when_the_holder_releases(tmp_path):
  held = lock.exclusive(tmp_path)
  threading.Timer(0.2, held.release).start()
  with lock.exclusive(tmp_path, timeout_s=10):
    pass


def test_lock_a_directory_removed_while_waiting_is_gone(tmp_path):
  directory = tmp_path / "entry"
  directory.mkdir()
  held = lock.exclusive(directory)
  result, waiting = [], threading.Event()

  def wait():
    try:
      lock.exclusive(directory, timeout_s=10, waiting=waiting.set).release()
      result.append("locked")
    except lock.Gone:
      result.append("gone")

  waiter = threading.Thread(target=wait)
  waiter.start()
  assert waiting.wait(10)  # it opened the directory and waits for the lock
  directory.rmdir()  # the holder removes it (a cache clean-up), then releases
  held.release()
  waiter.join(10)
  assert result == ["gone"]
  with pytest.raises(FileNotFoundError):
    lock.exclusive(directory)


@pytest.fixture
def windows_locking(monkeypatch):
  """This process as the simulated Windows sees it: no fcntl, the stand-in msvcrt."""
  calls = []

  def locking(fd, mode, nbytes):
    calls.append((mode, nbytes))
    if mode == 0:
      fcntl.flock(fd, fcntl.LOCK_UN)
      return
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise PermissionError(errno.EACCES, "Permission denied") from None

  msvcrt = types.ModuleType("msvcrt")
  msvcrt.LK_UNLCK, msvcrt.LK_NBLCK, msvcrt.locking = 0, 2, locking
  monkeypatch.setitem(sys.modules, "msvcrt", msvcrt)
  monkeypatch.setitem(sys.modules, "fcntl", None)
  return calls


def test_lock_on_windows_locks_a_byte_of_a_lock_file_in_the_directory(tmp_path, windows_locking):
  with lock.exclusive(tmp_path):
    assert os.listdir(tmp_path) == [lock.LOCK_FILE]
    with pytest.raises(lock.Busy):
      lock.exclusive(tmp_path, timeout_s=0)
  with lock.exclusive(tmp_path, timeout_s=0):
    pass
  assert windows_locking == [(2, 1), (2, 1), (0, 1), (2, 1), (0, 1)]  # LK_NBLCK, LK_UNLCK


def test_lock_on_windows_the_store_writes_a_baseline(tmp_path, windows_locking):
  out = tmp_path / "base"
  store.write_baseline(out, {"kind": "x"}, {"a": np.arange(3)})
  np.testing.assert_array_equal(store.read_baseline(out).arrays["a"], [0, 1, 2])
  assert (tmp_path / lock.LOCK_FILE).is_file() and windows_locking[0] == (2, 1)


@pytest.fixture
def windows_os(monkeypatch, windows_locking):
  """The os module as Windows has it: no directory descriptors, no O_NONBLOCK, and a
  directory cannot be opened (os.open raises PermissionError, as on Windows)."""
  real_open = os.open

  def open_(path, flags, mode=0o777, *, dir_fd=None):
    if dir_fd is not None:
      raise NotImplementedError("dir_fd unavailable on this platform")
    if os.path.isdir(path):
      raise PermissionError(errno.EACCES, "Permission denied", str(path))
    return real_open(path, flags, mode)

  monkeypatch.setattr(store.read, "_DIR_FD", False)
  monkeypatch.setattr(store.read, "_NONBLOCK", 0)
  monkeypatch.setattr(store.read.os, "open", open_)


def test_store_writes_and_reads_a_baseline_with_windows_os(tmp_path, windows_os):
  # Before: read_baseline opened the directory with O_DIRECTORY and dir_fd, and every
  # atomic write fsynced the directory through os.open: both fail on Windows.
  out = tmp_path / "base"
  store.write_baseline(out, {"kind": "x"}, {"a": np.arange(3)})
  np.testing.assert_array_equal(store.read_baseline(out).arrays["a"], [0, 1, 2])
  store.write_atomic(tmp_path / "r.json", b"{}")
  assert (tmp_path / "r.json").read_bytes() == b"{}"
  with pytest.raises(store.BaselineError, match="no such directory; record one with"):
    store.read_baseline(tmp_path / "missing")
  with pytest.raises(store.BaselineError, match="cannot open it"):
    store.read_baseline(tmp_path / "r.json")
