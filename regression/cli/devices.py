"""``--devices N``: N CPU devices made available before JAX initialises, the command rerun in
a fresh interpreter where this one initialised JAX already."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

DEVICE_FLAG = "--xla_force_host_platform_device_count"
# Set in the fresh interpreter that `--devices` starts, so it never starts another.
_CHILD_ENV = "NNX_POOL_REGRESSION_DEVICES_CHILD"


def with_device_count(flags: str, devices: int) -> str:
  """``XLA_FLAGS`` with the host device count set to ``devices`` (any earlier count dropped)."""
  kept = [f for f in flags.split() if not f.startswith(DEVICE_FLAG)]
  return " ".join([*kept, f"{DEVICE_FLAG}={devices}"])


def provide_devices(
    devices: int, argv: Sequence[str] | None, *, custom_batch: bool
) -> int | None:
  """Makes ``devices`` CPU devices available, before JAX initialises.

  Returns None when this process can go on (it sets ``XLA_FLAGS`` when JAX is
  not imported yet, or ``jax_num_cpu_devices`` when JAX is imported but not
  initialised, or already has enough devices); otherwise re-runs the command
  in a fresh interpreter and returns its exit code (or 2 when it cannot).
  """
  if "jax" not in sys.modules:
    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), devices)
    return None
  import jax

  try:
    jax.config.update("jax_num_cpu_devices", devices)  # refused once JAX has initialised
    return None
  except RuntimeError:
    pass
  if jax.device_count() >= devices:
    return None
  reason = None
  if custom_batch:
    reason = "a custom batch cannot be re-run in a fresh interpreter"
  elif os.environ.get(_CHILD_ENV):
    reason = "the fresh interpreter initialised JAX before the flag could take effect"
  if reason:
    print(
        f"error: --devices {devices}: JAX is already initialised with {jax.device_count()} "
        f"device(s) and {reason}; set XLA_FLAGS={DEVICE_FLAG}={devices} before importing JAX.",
        file=sys.stderr,
    )
    return 2
  env = {**os.environ, _CHILD_ENV: "1"}
  env["XLA_FLAGS"] = with_device_count(env.get("XLA_FLAGS", ""), devices)
  args = list(sys.argv[1:] if argv is None else argv)
  sys.stdout.flush()
  sys.stderr.flush()
  return subprocess.run([sys.executable, "-m", "nnx_pool.regression", *args], env=env,
                        check=False).returncode
