#!/usr/bin/env bash
# The accelerator check, for a machine with one GPU and jax, flax and torch installed
# (the `device` machine's image: jax 0.11.2 with CUDA, no network). Writes
# device_check.json and benchmarks-{taps,xla}.json to $OUT; at most LIMIT seconds (300).
#   OUT=results bash benchmarks/device_check.sh            # on the GPU machine
#   OUT=results bash benchmarks/device_check.sh --dry-run  # CPU, tiny shapes (the test suite)
#   OUT=results LIMIT=540 bash benchmarks/device_check.sh --batch 64 256  # kernels, not launches
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the directory for the results}"
PYTHON="${PYTHON:-python}"
exec timeout "${LIMIT:-300}" env PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
  "$PYTHON" -m benchmarks.device_check --out "$OUT" "$@"
