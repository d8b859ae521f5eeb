"""Where the suite's time goes: every XLA compile, by program name and test file.

A pytest plugin for maintainers (not installed with the package). Each process that loads it
(each pytest-xdist worker) writes one JSON file into ``$NNX_POOL_CENSUS`` (default
``build/compile-census``) at its end: the seconds of CPU each program name took to compile
(``jit_flat``: a fixture check's program; ``jit__truncated_normal``: a Flax initialiser), per
test file, and jax.monitoring's totals (backend compile, tracing, lowering, cache hits),
tracing and lowering also per test file.
Then this file, run as a script, adds the workers up::

    make test EXTRAS=test,parity PYTEST_ARGS="-p tools.compile_census"
    .venv/bin/python tools/compile_census.py

It wraps ``jax._src.compiler.compile_or_get_cached``, a private function: on a JAX without it
the plugin counts only jax.monitoring's totals.
"""

from __future__ import annotations

import collections
import json
import os
import re
import sys
import time
from pathlib import Path

DEFAULT = "build/compile-census"
_programs: collections.Counter = collections.Counter()
_counts: collections.Counter = collections.Counter()
_events: collections.Counter = collections.Counter()
_staging: collections.Counter = collections.Counter()  # tracing and lowering, by test file
_STAGES = ("/jax/core/compile/jaxpr_trace_duration",
           "/jax/core/compile/jaxpr_to_mlir_module_duration")
_current = ["(collection)"]


def _directory() -> Path:
  return Path(os.environ.get("NNX_POOL_CENSUS", DEFAULT))


def pytest_configure(config) -> None:
  import jax.monitoring
  from jax._src import compiler

  def heard(event, seconds, **_):
    _events[event] += seconds
    if event in _STAGES:
      _staging[_current[0]] += seconds

  jax.monitoring.register_event_duration_secs_listener(heard)
  original = getattr(compiler, "compile_or_get_cached", None)
  if original is None:
    return

  def counted(backend, computation, *args, **kwargs):
    start = time.process_time()
    try:
      return original(backend, computation, *args, **kwargs)
    finally:
      name = str(computation.operation.attributes["sym_name"]).strip('"')
      key = f"{re.sub(r'_?[0-9]+$', '', name)}\t{_current[0]}"
      _programs[key] += time.process_time() - start
      _counts[key] += 1

  compiler.compile_or_get_cached = counted


def pytest_runtest_setup(item) -> None:
  _current[0] = item.nodeid.split("::")[0]


# At the session's end, not at unconfigure: an xdist worker leaves at the start of its
# unconfigure (conftest.py), before the other plugins' hooks run.
def pytest_sessionfinish(session) -> None:
  out = _directory()
  out.mkdir(parents=True, exist_ok=True)
  times = os.times()
  (out / f"{os.getpid()}.json").write_text(json.dumps({
      "cpu_s": times.user + times.system, "events": _events, "staging": _staging,
      "programs": {key: [_counts[key], seconds] for key, seconds in _programs.items()}}))


def summary(directory: Path, top: int = 30) -> str:
  """The workers' files added up: totals, then the costliest program names and files."""
  cpu, events = 0.0, collections.Counter()
  by_name, by_file, seconds, counts, staging = (collections.Counter() for _ in range(5))
  for path in sorted(directory.glob("*.json")):
    data = json.loads(path.read_text())
    cpu += data["cpu_s"]
    events.update(data["events"])
    staging.update(data.get("staging", {}))
    for key, (count, spent) in data["programs"].items():
      name, file = key.split("\t")
      by_name[name] += spent
      by_file[file] += spent
      seconds[key] += spent
      counts[key] += count
  lines = [f"CPU of the processes that loaded the plugin: {cpu:.1f} s"]
  lines += [f"{spent:8.1f} s  {event}" for event, spent in events.most_common()]
  lines += ["compiles (seconds of CPU, count, program, test file):"]
  lines += [f"{spent:8.1f} s  {counts[key]:5d}  {key.replace(chr(9), '  ')}"
            for key, spent in seconds.most_common(top)]
  lines += ["tracing and lowering by test file:"]
  lines += [f"{v:8.1f} s  {k}" for k, v in staging.most_common(top)]
  lines += ["by program name:"] + [f"{v:8.1f} s  {k}" for k, v in by_name.most_common(top)]
  lines += ["by test file:"] + [f"{v:8.1f} s  {k}" for k, v in by_file.most_common(top)]
  return "\n".join(lines)


if __name__ == "__main__":
  print(summary(Path(sys.argv[1] if len(sys.argv) > 1 else DEFAULT)))
