"""What a rehearsal environment costs to build: ``python -m benchmarks.upgrade``.

The numbers behind docs/regression.md, "The installer". The same requirement set as guide 12's
rehearsal (``jax==0.9.2 jaxlib==0.9.2 flax==0.12.6``) goes into fresh environments built as
``rehearse`` builds them (:mod:`nnx_pool.regression.upgrade.installer`: ``uv venv`` then ``uv
pip install`` with pip's settings translated), first with an empty uv cache (cold), then
``--rounds`` times with it warm; ``--pip`` adds one environment built with ``python -m venv``
and pip (pip's own cache as it is). Each line gives the wall time and the disk the environment
holds of its own (files not linked from uv's cache), and the header the date, the machine and
its load average (another job running beside it shows there).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nnx_pool.regression.upgrade import installer, rehearse_cache

REQUIREMENTS = ["jax==0.9.2", "jaxlib==0.9.2", "flax==0.12.6"]


def _uv_build(uv: Path, env: Path, cache: Path) -> float:
  """Seconds to build ``env`` with uv (its cache ``cache``)."""
  args, environ = installer.uv_arguments(installer.pip_settings(installer.pip_config_list()))
  environ = {**os.environ, **environ, "UV_CACHE_DIR": str(cache)}
  started = time.perf_counter()
  subprocess.run([str(uv), "venv", "--quiet", "--python", sys.executable, str(env)], check=True,
                 env=environ)
  subprocess.run([str(uv), "pip", "install", "--quiet", "--python", str(env / "bin" / "python"),
                  *REQUIREMENTS, *args], check=True, env=environ)
  return time.perf_counter() - started


def _pip_build(env: Path) -> float:
  """Seconds to build ``env`` with ``python -m venv`` and pip."""
  started = time.perf_counter()
  subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
  subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "--quiet",
                  "--disable-pip-version-check", *REQUIREMENTS], check=True,
                 stderr=subprocess.DEVNULL)
  return time.perf_counter() - started


def _line(what: str, seconds: float, env: Path) -> str:
  own, linked = rehearse_cache.disk_use([env])
  return (f"{what:<28} {seconds:7.1f} s  {own / 1e6:7.1f} MB of its own, "
          f"{linked / 1e6:6.0f} MB linked from uv's cache")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.upgrade", description=__doc__)
  parser.add_argument("--rounds", type=int, default=3, help="warm environments (default 3)")
  parser.add_argument("--pip", action="store_true", help="also build one with pip (a minute+)")
  args = parser.parse_args(argv)
  chosen = installer.choose()
  if chosen.uv is None:
    print(f"error: {chosen.why}", file=sys.stderr)
    return 2
  load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
  print(f"# {dt.date.today()}, {platform.machine()} {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {chosen.why}; load average {load[0]:.2f} "
        f"{load[1]:.2f} {load[2]:.2f}")
  print(f"# {' '.join(REQUIREMENTS)} into a fresh environment")
  with tempfile.TemporaryDirectory(prefix="nnx-pool-bench-upgrade-") as tmp:
    root, cache = Path(tmp), Path(tmp) / "uv-cache"
    seconds = _uv_build(chosen.uv, root / "cold", cache)
    print(_line("uv, cold cache", seconds, root / "cold"))
    warm = []
    for n in range(args.rounds):
      warm.append(_uv_build(chosen.uv, root / f"warm{n}", cache))
      print(_line(f"uv, warm cache ({n + 1})", warm[-1], root / f"warm{n}"))
    if warm:
      print(f"{'uv, warm cache, median':<28} {statistics.median(warm):7.1f} s")
    if args.pip:
      print(_line("pip (its cache as it is)", _pip_build(root / "pip"), root / "pip"))
    shutil.rmtree(root, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
