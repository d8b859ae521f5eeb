"""Writers forked from one process and released together: the concurrency tests' children.

A fork (milliseconds) stands for a fresh interpreter (0.6 s of CPU to import the store, 1.7 s
to import the kit): each child is its own process, opening its own lock file description as
another writer would. Used in the test process (tests/regression/test_stress.py's forced
writers, which touch no JAX: a fork does not carry JAX's threads over) and in a fresh
interpreter that imported the kit without initialising JAX (its recorders, each of which
initialises JAX itself).
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path


def fork_together(write: Callable[[Path, str], int | None], out: Path,
                  tags: list[str]) -> list[tuple[int, str, str]]:
  """``write(out, tag)`` in a forked child per tag, released together; ``[(code, "", err)]``:
  the child's exit code (what ``write`` returned, 0 for None, 1 if it raised) and what it
  wrote to its standard error, the traceback included. A child leaves with ``os._exit``,
  running none of its parent's teardown."""
  go_read, go_write = os.pipe()
  children = []
  for tag in tags:
    err_read, err_write = os.pipe()
    with warnings.catch_warnings():  # JAX's at-fork warning: the children never use its threads
      warnings.simplefilter("ignore", RuntimeWarning)
      pid = os.fork()
    if pid == 0:  # the child
      code = 1
      try:
        os.close(go_write)
        os.close(err_read)
        os.dup2(err_write, 2)
        os.read(go_read, 1)  # returns when the parent closes its end: every child at once
        code = write(out, tag) or 0
      except BaseException:  # noqa: BLE001 - reported to the parent, as a child's stderr
        traceback.print_exc()
      finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.close(err_write)
    children.append((pid, err_read))
  os.close(go_read)
  os.close(go_write)  # go
  results = []
  for pid, err_read in children:
    with os.fdopen(err_read) as err:
      stderr = err.read()
    _, status = os.waitpid(pid, 0)
    results.append((os.waitstatus_to_exitcode(status), "", stderr))
  return results
