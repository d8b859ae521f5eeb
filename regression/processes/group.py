"""The processes of one run agreeing on a check, through JAX's distributed key-value store.

Every check of the guard (and every case of the kit's batch) gets the next number of this
process's count. At the check's gate each process posts what it knows under
``nnx_regression/<n>/<stage>/<process>`` (the check's name, the error that stopped it, the
lead's plan) and waits at the runtime's barrier of that key, which passes for all or fails
for all, with a timeout (``NNX_REGRESSION_WAIT``). After the barrier every process reads the
same posts and reaches the same decision: go on, or end the check naming the process that
failed, stopped at another check, or never came. The lead (process 0) then posts the
verdict, which the others wait for.

A barrier that fails leaves the processes out of step: every later check of this process
ends at once with the first reason, and the process exits without JAX's shutdown
barrier, which would wait for the missing process until the runtime's heartbeat timeout
aborts it (:func:`exit_without_shutdown`).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from typing import Any

from ..describe import error_line
from .environment import WAIT_ENV, wait_seconds

PREFIX = "nnx_regression"


class ProcessesError(RuntimeError):
  """The processes could not run a check together; the message says which process and why."""


class Group:
  """This process's side of the agreements: ``index`` of ``count`` processes, ``wait_s``
  seconds at each barrier, ``client`` the runtime's key-value store."""

  def __init__(self, client: Any, index: int, count: int, wait_s: float):
    self.client = client
    self.index = index
    self.count = count
    self.wait_s = wait_s
    self.broken: str | None = None
    self._next = 0

  @property
  def lead(self) -> bool:
    """Whether this is process 0, which reads and writes the baselines."""
    return self.index == 0

  def begin(self, name: str) -> int:
    """The number of the next check; raises :class:`ProcessesError` once out of step."""
    if self.broken is not None:
      raise ProcessesError(f"check {name!r} was not run: the processes are out of step since "
                           f"an earlier check ({self.broken}); restart all of them.")
    number = self._next
    self._next += 1
    return number

  def _key(self, number: int, stage: str) -> str:
    return f"{PREFIX}/{number}/{stage}"

  def agree(self, number: int, name: str, stage: str, *, error: str | None = None,
            plan: dict[str, Any] | None = None) -> dict[int, dict[str, Any]]:
    """Posts this process's state at a stage of check ``number`` and waits for every process.

    Returns:
      Every process's post by its index (``name``, ``error``, ``plan``), once all agree.

    Raises:
      ProcessesError: a process did not come within the wait, is at another check, or
        posted an error; the message names it.
    """
    key = self._key(number, stage)
    post = {"name": name, "error": error, "plan": plan}
    try:
      self.client.key_value_set(f"{key}/{self.index}", json.dumps(post))
      self.client.wait_at_barrier(key, int(self.wait_s * 1000))
    except Exception as e:  # noqa: BLE001 - the runtime's error types differ by release
      raise self._break(self._absent(key, name, e)) from None
    posts = {i: post if i == self.index else self._read(key, i, name)
             for i in range(self.count)}
    elsewhere = {i: p["name"] for i, p in posts.items() if p["name"] != name}
    if elsewhere:
      where = ", ".join(f"process {i} at {n!r}" for i, n in sorted(elsewhere.items()))
      raise self._break(f"the processes reached different checks: process {self.index} at "
                        f"{name!r}, {where}")
    failed = [(i, p["error"]) for i, p in sorted(posts.items()) if p["error"] and i != self.index]
    if failed:
      raise ProcessesError("; ".join(f"process {i} failed before check {name!r} could be "
                                     f"compared: {err}" for i, err in failed)
                           + ". Nothing was compared or written.")
    return posts

  def _read(self, key: str, index: int, name: str) -> dict[str, Any]:
    try:
      return json.loads(self.client.blocking_key_value_get(f"{key}/{index}", 10_000))
    except Exception as e:  # noqa: BLE001 - after the barrier, only a lost coordinator
      raise self._break(f"process {index}'s state at check {name!r} could not be read "
                        f"({error_line(e)})") from None

  def _absent(self, key: str, name: str, error: BaseException) -> str:
    """Why a barrier failed: who never posted, or this process came after the others left."""
    try:
      posted = {k for k, _ in self.client.key_value_dir_get(f"{key}/")}
    except Exception:  # noqa: BLE001 - the store is gone with process 0
      return (f"the coordinator (process 0) could not be reached at check {name!r}; it may "
              f"have died ({error_line(error)})")
    missing = [i for i in range(self.count) if f"{key}/{i}" not in posted]
    if not missing:
      return (f"the other processes stopped waiting for this one (process {self.index}) at "
              f"check {name!r}: it came more than {self.wait_s:g} s after them ({WAIT_ENV})")
    who = ", ".join(f"process {i}" for i in missing)
    return (f"{who} did not reach check {name!r} within {self.wait_s:g} s ({WAIT_ENV}): it "
            "hangs, died, or stopped before the check")

  def _break(self, reason: str) -> ProcessesError:
    if self.broken is None:
      self.broken = reason
      atexit.register(exit_without_shutdown)
    return ProcessesError(f"{reason}. Nothing was compared or written.")

  def tell(self, number: int, what: str, payload: dict[str, Any]) -> None:
    """The lead posts ``payload`` (a verdict) for check ``number``."""
    self.client.key_value_set(self._key(number, what), json.dumps(payload))

  def hear(self, number: int, what: str, name: str) -> dict[str, Any]:
    """Waits for the lead's post of check ``number``.

    Raises:
      ProcessesError: none came within the wait (naming process 0).
    """
    try:
      return json.loads(self.client.blocking_key_value_get(self._key(number, what),
                                                           int(self.wait_s * 1000)))
    except Exception as e:  # noqa: BLE001 - a timeout, or the coordinator gone
      raise ProcessesError(
          f"process 0 (the lead) gave no verdict on check {name!r} within {self.wait_s:g} s "
          f"after this process ran it ({error_line(e)}); it may have died or still be "
          "writing. Nothing was compared here.") from None


_GROUP: list[Group] = []


def current() -> Group | None:
  """This process's :class:`Group` when JAX runs several processes, else None.

  Raises:
    ProcessesError: JAX runs several processes but its distributed client is missing.
  """
  import jax

  if jax.process_count() == 1:
    return None
  if not _GROUP:
    from jax._src import distributed  # the key-value store has no public path

    client = distributed.global_state.client
    if client is None:
      raise ProcessesError(
          f"JAX runs {jax.process_count()} processes, but not through jax.distributed: the "
          "checks need its key-value store. Call jax.distributed.initialize() first.")
    _GROUP.append(Group(client, jax.process_index(), jax.process_count(), wait_seconds()))
  return _GROUP[0]


def broken() -> str | None:
  """Why this process's group is out of step, or None (also with one process)."""
  return _GROUP[0].broken if _GROUP else None


def follower() -> int | None:
  """This process's index when it ran checks as one of several and is not the lead, else None."""
  return _GROUP[0].index if _GROUP and not _GROUP[0].lead else None


# The status this process ends with once out of step (pytest's, where it ran the checks).
_STATUS = [1]


def note_exit_status(status: int) -> None:
  """Records the status to end with (the pytest plugin's, at the end of the session)."""
  _STATUS[0] = int(status)


def exit_without_shutdown() -> None:
  """Ends this process now, out of step, without JAX's shutdown barrier (see the module's
  docstring), with the status noted (default 1)."""
  if broken() is None:
    return
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(_STATUS[0])
