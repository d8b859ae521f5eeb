"""What the C allocator does to XLA:CPU's times: ``python -m benchmarks.allocators``.

The same program's time moves with the process's allocator state: XLA:CPU allocates
its temporaries and results with ``malloc``, and glibc serves large blocks with
``mmap``, unmapping them on ``free``, so every call faults its large buffers in again
(each 4 KiB page costs a minor page fault, about 0.1-0.25 us, and is zeroed). glibc
raises its mmap threshold dynamically when such blocks are freed, up to 32 MiB, so a
long process often stops paying; a fresh one pays until then.

This runs one contestant process (:mod:`benchmarks.contestant`) per setting, in
rotating rounds, and prints the medians and the process's minor page faults per call:

* ``default``: glibc as the process starts;
* ``MALLOC_MMAP_THRESHOLD_=…``: a fixed threshold above the row's buffers (this also
  turns glibc's dynamic threshold off), so freed blocks stay on the heap;
* ``MALLOC_TOP_PAD_=…``: extra memory kept at the top of the heap after a free;
* ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` together: the fixed
  threshold alone leaves glibc's 128 KiB trim threshold, so the top of the heap is
  returned to the kernel after each call and faulted in again by the next;
* ``MALLOC_ARENA_MAX=1`` (alone, and with both thresholds): every thread allocates
  from the main heap. XLA:CPU runs a program on its worker threads, and glibc gives
  those their own arenas, whose extra 64 MiB heaps are unmapped as soon as they are
  empty, whatever the trim threshold says: a result that does not fit the thread's
  first heap is faulted in again on every call;
* ``jemalloc`` and ``tcmalloc``: Debian's ``libjemalloc2`` and
  ``libtcmalloc-minimal4`` through ``LD_PRELOAD``, if installed; and jemalloc with
  its page decay off (``MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1``), which
  otherwise hands freed pages back with ``madvise``.

The benchmark itself (:mod:`benchmarks.solo`) runs on the default allocator.
docs/benchmarks.md gives the advice for CPU users that these numbers support.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.solo import contestant_process

LIBRARIES = {
    "jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
}
GIB = 2**30


def settings() -> dict[str, dict[str, str]]:
  """Each setting's environment variables; a library not installed here is left out."""
  found = {"default": {},
           "MALLOC_MMAP_THRESHOLD_=1GiB": {"MALLOC_MMAP_THRESHOLD_": str(GIB)},
           "MALLOC_TOP_PAD_=1GiB": {"MALLOC_TOP_PAD_": str(GIB)},
           "MMAP_THRESHOLD_+TRIM_THRESHOLD_=1GiB": {"MALLOC_MMAP_THRESHOLD_": str(GIB),
                                                    "MALLOC_TRIM_THRESHOLD_": str(GIB)},
           "MALLOC_ARENA_MAX=1": {"MALLOC_ARENA_MAX": "1"},
           "ARENA_MAX=1, both thresholds 1GiB": {"MALLOC_ARENA_MAX": "1",
                                                 "MALLOC_MMAP_THRESHOLD_": str(GIB),
                                                 "MALLOC_TRIM_THRESHOLD_": str(GIB)}}
  for name, path in LIBRARIES.items():
    if Path(path).exists():
      found[name] = {"LD_PRELOAD": path}
  if Path(LIBRARIES["jemalloc"]).exists():  # freed pages kept, not returned by madvise
    found["jemalloc, no decay"] = {"LD_PRELOAD": LIBRARIES["jemalloc"],
                                   "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"}
  return found


def run(row: str, contestant: str, pass_name: str, rounds: int, calls: int) -> dict:
  per_setting: dict[str, list[dict]] = {name: [] for name in settings()}
  names = list(per_setting)
  for round_ in range(rounds):
    shift = round_ % len(names)
    for name in names[shift:] + names[:shift]:
      env = settings()[name]
      saved = {k: os.environ.get(k) for k in env}
      os.environ.update(env)
      try:
        per_setting[name].append(contestant_process(
            "benchmarks.contestant",
            [row, contestant, pass_name, "--calls", str(calls), "--faults"]))
      finally:
        for key, value in saved.items():
          if value is None:
            os.environ.pop(key, None)
          else:
            os.environ[key] = value
  return per_setting


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.allocators",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--row", default="AvgPool 3x3/1 pad 1 excl. pad")
  parser.add_argument("--contestant", default="ours", choices=("ours", "flax", "torch"))
  parser.add_argument("--pass", dest="pass_name", default="backward",
                      choices=("forward", "backward"))
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--calls", type=int, default=40)
  args = parser.parse_args(argv)
  results = run(args.row, args.contestant, args.pass_name, args.rounds, args.calls)
  print(f"{args.row}, {args.contestant}, {args.pass_name}: {args.rounds} processes per "
        "setting, medians [min-max over processes]")
  print(f"{'setting':30} {'ms per call':>22} {'minor faults per call':>22}")
  for name, processes in results.items():
    ms = [p["call_ms"] for p in processes]
    faults = statistics.median(p["faults_per_call"] for p in processes)
    print(f"{name:30} {statistics.median(ms):8.2f} [{min(ms):.2f}-{max(ms):.2f}]".ljust(53)
          + f"{faults:12.0f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
