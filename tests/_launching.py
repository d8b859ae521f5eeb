"""Running ``nnx-pool-regression launch -n 2 -- COMMAND`` from a test: its status, its lines,
its time and each process's ``RESULT`` line (tests/_processes_worker.py prints one).

Loaded by path (``runpy.run_path``): tests/ is not a package.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def launch(*command: str, wait: float = 30, timeout: float = 150) -> dict:
  """Runs ``launch -n 2 -- COMMAND``; its status, lines, seconds and each process's RESULT.

  The launcher ends its processes on every path (``--timeout``); should it hang itself, its
  whole process group is killed here (POSIX; elsewhere the launcher alone).
  """
  argv = [sys.executable, "-m", "nnx_pool.regression", "launch", "-n", "2", "--wait", f"{wait}",
          "--grace", "15", "--timeout", f"{timeout}", "--", *command]
  start = time.monotonic()
  proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          cwd=ROOT, start_new_session=os.name == "posix")
  try:
    out, _ = proc.communicate(timeout=timeout + 60)
  except subprocess.TimeoutExpired:
    if os.name == "posix":
      os.killpg(proc.pid, signal.SIGKILL)
    proc.kill()
    out, _ = proc.communicate()
    pytest.fail(f"the launcher itself hung:\n{out[-3000:]}")
  results = {}
  for line in out.splitlines():
    found = re.match(r"\[(\d)\] RESULT (.*)", line)
    if found:
      results[int(found[1])] = json.loads(found[2])
  return {"status": proc.returncode, "out": out, "results": results,
          "seconds": time.monotonic() - start}
