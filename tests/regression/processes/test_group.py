"""The agreement of several processes on a check, against a stand-in for the runtime's store.

The stand-in is one process's view of JAX's distributed key-value store and barrier: the
other processes' posts are given, or missing, and the barrier passes or times out, as the
runtime's would (measured with two real processes in tests/test_processes.py and
tests/regression/processes/test_faults.py).
"""

from __future__ import annotations

import json

import pytest

from nnx_pool.regression.processes.group import PREFIX, Group, ProcessesError


class Store:
  """The store as process 0 sees it; ``others`` are process 1's posts by stage."""

  def __init__(self, others=None, *, barrier=True, reachable=True):
    self.kv = {f"{PREFIX}/0/{stage}/1": json.dumps(post) for stage, post in (others or {}).items()}
    self.barrier, self.reachable = barrier, reachable

  def key_value_set(self, key, value, allow_overwrite=False):
    if not self.reachable:
      raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")
    self.kv[key] = value

  def wait_at_barrier(self, key, timeout_ms):
    if not self.barrier:
      raise RuntimeError(f"DEADLINE_EXCEEDED: Barrier timed out. Id: {key}::0")

  def blocking_key_value_get(self, key, timeout_ms):
    if key not in self.kv:
      raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
    return self.kv[key]

  def key_value_dir_get(self, prefix):
    if not self.reachable:
      raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")
    return [(k, v) for k, v in self.kv.items() if k.startswith(prefix)]


def _post(name, error=None, plan=None):
  return {"name": name, "error": error, "plan": plan}


def _group(store, index=0):
  return Group(store, index, 2, wait_s=2.0)


def test_agree_returns_every_post_once_all_came():
  group = _group(Store({"ready": _post("logits")}))
  posts = group.agree(group.begin("logits"), "logits", "ready", plan={"refused": None})
  assert posts == {0: _post("logits", plan={"refused": None}), 1: _post("logits")}
  assert group.broken is None and group.lead


def test_a_process_at_another_check_puts_the_processes_out_of_step():
  group = _group(Store({"ready": _post("features")}))
  with pytest.raises(ProcessesError, match=r"^the processes reached different checks: process 0 "
                     r"at 'logits', process 1 at 'features'\. Nothing was compared or written\.$"):
    group.agree(group.begin("logits"), "logits", "ready")
  # Every later check ends at once, with the first reason.
  with pytest.raises(ProcessesError, match=r"check 'grads' was not run: the processes are out of "
                     r"step since an earlier check \(the processes reached different checks"):
    group.begin("grads")


def test_an_error_posted_by_a_process_ends_the_check_and_keeps_the_step():
  group = _group(Store({"ready": _post("logits", error="ValueError: no such file")}))
  with pytest.raises(ProcessesError, match=r"^process 1 failed before check 'logits' could be "
                     r"compared: ValueError: no such file\. Nothing was compared or written\.$"):
    group.agree(group.begin("logits"), "logits", "ready")
  assert group.broken is None  # both ended the same check: the next one runs
  assert group.begin("grads") == 1


def test_a_process_that_never_came_is_named():
  group = _group(Store(barrier=False))
  with pytest.raises(ProcessesError, match=r"^process 1 did not reach check 'logits' within 2 s "
                     r"\(NNX_REGRESSION_WAIT\): it hangs, died, or stopped before the check\. "
                     "Nothing was compared or written.$"):
    group.agree(group.begin("logits"), "logits", "ready")
  assert group.broken.startswith("process 1 did not reach check 'logits'")


def test_a_process_that_came_after_the_others_left_says_so():
  group = _group(Store({"ready": _post("logits")}, barrier=False), index=1)
  group.client.kv[f"{PREFIX}/0/ready/0"] = json.dumps(_post("logits"))
  with pytest.raises(ProcessesError, match=r"the other processes stopped waiting for this one "
                     r"\(process 1\) at check 'logits': it came more than 2 s after them"):
    group.agree(group.begin("logits"), "logits", "ready")


def test_a_lost_coordinator_is_named():
  group = _group(Store(reachable=False), index=1)
  with pytest.raises(ProcessesError, match=r"^the coordinator \(process 0\) could not be reached "
                     r"at check 'logits'; it may have died \(RuntimeError: UNAVAILABLE"):
    group.agree(group.begin("logits"), "logits", "ready")


def test_a_verdict_that_never_comes_names_the_lead():
  group = _group(Store(), index=1)
  with pytest.raises(ProcessesError, match=r"^process 0 \(the lead\) gave no verdict on check "
                     r"'logits' within 2 s after this process ran it \(RuntimeError: "
                     "DEADLINE_EXCEEDED"):
    group.hear(group.begin("logits"), "verdict", "logits")
  lead = _group(Store())
  lead.tell(0, "verdict", {"status": "passed"})
  assert json.loads(lead.client.kv[f"{PREFIX}/0/verdict"]) == {"status": "passed"}
