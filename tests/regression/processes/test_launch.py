"""``nnx-pool-regression launch``, its variables and the initializer, without JAX in the processes.

The processes here are small Python commands (a few hundredths of a second each), so that
what the launcher does (variables, relayed lines, one status, ending the processes on every
path) is tested apart from JAX; tests/test_processes.py runs it with JAX.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from nnx_pool.regression.cli import main
from nnx_pool.regression.processes import environment
from nnx_pool.regression.processes.environment import launched, wait_seconds
from nnx_pool.regression.processes.initialize import join_problem
from nnx_pool.regression.processes.launcher import (
  child_environment,
  describe,
  launch,
  overall,
  resolve,
  xdist_workers,
)

LAUNCHED = {"NNX_REGRESSION_COORDINATOR": "127.0.0.1:4321", "NNX_REGRESSION_PROCESSES": "2",
            "NNX_REGRESSION_PROCESS_ID": "1"}


def test_no_variables_means_one_process():
  assert launched({}) is None
  assert launched({"NNX_REGRESSION_PROCESSES": "2"}) is None  # no coordinator: none


def test_the_variables_are_read_and_checked():
  assert launched(LAUNCHED) == environment.Launched("127.0.0.1:4321", 2, 1, None)
  auto = launched({"NNX_REGRESSION_COORDINATOR": "auto", "NNX_REGRESSION_CPU_COLLECTIVES": "gloo"})
  assert auto == environment.Launched("auto", None, None, "gloo")
  with pytest.raises(ValueError, match=r"NNX_REGRESSION_COORDINATOR='host': expected host:port"):
    launched({**LAUNCHED, "NNX_REGRESSION_COORDINATOR": "host"})
  with pytest.raises(ValueError, match=r"NNX_REGRESSION_PROCESS_ID=2 is not below "
                                       r"NNX_REGRESSION_PROCESSES=2"):
    launched({**LAUNCHED, "NNX_REGRESSION_PROCESS_ID": "2"})
  with pytest.raises(ValueError, match=r"NNX_REGRESSION_PROCESSES='two': expected an integer "
                                       r">= 1"):
    launched({**LAUNCHED, "NNX_REGRESSION_PROCESSES": "two"})


def test_the_wait_is_60_s_unless_set():
  assert wait_seconds({}) == 60.0
  assert wait_seconds({"NNX_REGRESSION_WAIT": "2.5"}) == 2.5
  with pytest.raises(ValueError, match=r"NNX_REGRESSION_WAIT='0': expected a positive number"):
    wait_seconds({"NNX_REGRESSION_WAIT": "0"})


def test_each_process_gets_the_launchers_variables():
  env = child_environment({"XLA_FLAGS": "--xla_foo --xla_force_host_platform_device_count=8",
                           "HOME": "h"}, 1, 2, 4321, 2, 5.0)
  assert env == {"HOME": "h", "NNX_REGRESSION_COORDINATOR": "127.0.0.1:4321",
                 "NNX_REGRESSION_PROCESSES": "2", "NNX_REGRESSION_PROCESS_ID": "1",
                 "NNX_REGRESSION_CPU_COLLECTIVES": "gloo", "JAX_PLATFORMS": "cpu",
                 "JAX_COORDINATOR_BIND_ADDRESS": "127.0.0.1:4321",
                 "XLA_FLAGS": "--xla_foo --xla_force_host_platform_device_count=2",
                 "PYTHONUNBUFFERED": "1", "NNX_REGRESSION_WAIT": "5"}
  assert launched(env) == environment.Launched("127.0.0.1:4321", 2, 1, "gloo")


def test_python_pytest_and_the_kit_run_with_this_interpreter():
  assert resolve(["python", "-c", "1"]) == [sys.executable, "-c", "1"]
  assert resolve(["pytest", "tests"]) == [sys.executable, "-m", "pytest", "tests"]
  assert resolve(["nnx-pool-regression", "check"]) == [sys.executable, "-m", "nnx_pool.regression",
                                                       "check"]
  assert resolve(["make", "test"]) == ["make", "test"]


@pytest.mark.parametrize(("command", "workers"), [
    (["pytest", "-n", "2", "tests"], "2"), (["pytest", "-nauto"], "auto"),
    (["pytest", "--numprocesses=4"], "4"), (["pytest", "-n", "0"], None),
    (["pytest", "tests", "--", "-n", "2"], None), (["python", "-n", "2"], None)])
def test_xdist_workers_are_found_in_a_pytest_command(command, workers):
  assert xdist_workers(command) == workers


def test_statuses():
  assert [describe(s) for s in (0, 3, -9, None)] == ["exit 0", "exit 3", "killed by SIGKILL",
                                                     "running"]
  assert overall([0, 0]) == 0
  assert overall([0, 3]) == 3
  assert overall([1, -9]) == 1  # the first failing process, by id
  assert overall([0, -9]) == 137  # a signal N as 128 + N, as a shell says


def _run(code: str, processes: int = 2, **options) -> tuple[int, str, str, float]:
  out, err = io.StringIO(), io.StringIO()
  start = time.monotonic()
  status = launch(["python", "-c", textwrap.dedent(code)], processes, out=out, err=err,
                  environ={k: v for k, v in os.environ.items() if not k.startswith("NNX_REG")},
                  **options)
  return status, out.getvalue(), err.getvalue(), time.monotonic() - start


def test_every_line_carries_its_process_and_the_status_is_the_first_failure():
  status, out, err, _ = _run("""
      import os, sys
      index = int(os.environ["NNX_REGRESSION_PROCESS_ID"])
      print("devices", os.environ["XLA_FLAGS"], os.environ["JAX_PLATFORMS"])
      print("coordinator", os.environ["NNX_REGRESSION_COORDINATOR"].startswith("127.0.0.1:"))
      sys.exit(3 * index)
  """, local_devices=3)
  assert status == 3
  for index in (0, 1):
    assert f"[{index}] devices --xla_force_host_platform_device_count=3 cpu\n" in out
    assert f"[{index}] coordinator True\n" in out
  assert err.splitlines()[-1].startswith("launch: 2 processes, ")
  assert err.splitlines()[-1].endswith(": process 0 exit 0; process 1 exit 3")


def test_a_process_left_running_after_another_ended_is_ended_after_the_grace():
  status, out, err, seconds = _run("""
      import os, time
      if os.environ["NNX_REGRESSION_PROCESS_ID"] == "1":
        print("hanging", flush=True)
        time.sleep(120)
  """, grace=0.5)
  assert seconds < 30  # not the 120 s sleep
  assert "[1] hanging" in out
  assert "launch: process 0 (exit 0) ended at " in err
  assert "the others have 0.5 s to end (--grace)" in err
  assert "process(es) 1 did not end within 0.5 s of the first; ending them" in err
  assert status != 0


def test_a_command_that_cannot_start_is_said_and_nothing_runs():
  out, err = io.StringIO(), io.StringIO()
  status = launch(["no-such-command-for-nnx-pool"], 2, out=out, err=err, environ={})
  assert status == 2
  assert "launch: could not start 'no-such-command-for-nnx-pool': No such file or directory; " \
         "nothing ran" in err.getvalue()


def test_the_processes_are_ended_after_the_timeout():
  status, _, err, seconds = _run("import time; time.sleep(120)", timeout=0.5)
  assert seconds < 30
  assert "the processes ran past --timeout 0.5 s; ending them" in err
  assert status != 0


@pytest.mark.skipif(os.name != "posix", reason="sends SIGINT to the launcher (POSIX)")
def test_ctrl_c_ends_every_process(tmp_path):
  code = (f"import os, time; open(os.path.join({str(tmp_path)!r}, "
          "os.environ['NNX_REGRESSION_PROCESS_ID']), 'w').write(str(os.getpid())); time.sleep(120)")
  # A shell that starts a command in the background (`make test &`, CI runners) makes it
  # ignore SIGINT, and Python then installs no Ctrl-C handler: the launcher here gets
  # Python's own back first, as a terminal would give it.
  launcher = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "from nnx_pool.regression.cli import main; sys.exit(main(sys.argv[1:]))")
  proc = subprocess.Popen([sys.executable, "-c", launcher, "launch", "-n", "2", "--",
                           "python", "-c", code], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True)
  try:
    deadline = time.monotonic() + 60
    while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
      time.sleep(0.05)
    time.sleep(0.2)  # the pids are written; the files closed
    pids = [int(p.read_text()) for p in tmp_path.iterdir()]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate()  # reaped, its pipes closed (else a later test meets its warning)
  assert proc.returncode == 130
  assert "launch: interrupted: ending the processes" in err
  for pid in pids:
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)


def test_launch_refuses_a_command_line_it_cannot_run(capsys, monkeypatch):
  for name in LAUNCHED:
    monkeypatch.delenv(name, raising=False)
  assert main(["launch", "-n", "2", "pytest"]) == 2
  assert capsys.readouterr().err == ("error: launch: give the command after --: "
                                     "nnx-pool-regression launch -n 2 -- pytest tests\n")
  assert main(["launch", "-n", "2", "--", "pytest", "-n", "2", "tests"]) == 2
  assert capsys.readouterr().err.startswith(
      "error: launch: pytest-xdist (-n 2) cannot run in a launched process")
  monkeypatch.setenv("NNX_REGRESSION_COORDINATOR", "127.0.0.1:1")
  assert main(["launch", "-n", "2", "--", "python", "-c", "1"]) == 2
  assert "this is already a launched process (NNX_REGRESSION_COORDINATOR is set)" in (
      capsys.readouterr().err)


def test_the_plugin_refuses_xdist_in_a_launched_process(monkeypatch):
  for name, value in LAUNCHED.items():
    monkeypatch.setenv(name, value)
  assert join_problem(2, False).startswith(
      "nnx_regression: pytest-xdist (-n 2) cannot run in a launched process: each launched "
      "process is one JAX process of a global mesh")
  assert join_problem(None, True) is not None  # an xdist worker
  monkeypatch.setenv("NNX_REGRESSION_PROCESS_ID", "x")
  assert join_problem(None, False).startswith(
      "nnx_regression: NNX_REGRESSION_PROCESS_ID='x': expected an integer >= 0")


def test_the_plugin_starts_nothing_and_imports_no_jax_unless_launched():
  code = ("import sys; import nnx_pool.regression.pytest_plugin; "
          "from nnx_pool.regression.processes.initialize import join_problem; "
          "assert join_problem(None, False) is None; "
          "assert 'jax' not in sys.modules and 'flax' not in sys.modules, 'imported'")
  env = {k: v for k, v in os.environ.items() if not k.startswith("NNX_REGRESSION_")}
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                        timeout=60, check=False)
  assert done.returncode == 0, done.stderr
