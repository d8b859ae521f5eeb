"""The names several modules of the kit share, each defined here once.

This module imports nothing but :mod:`re`: the pytest plugin (loaded by every pytest
session of an environment that has nnx-pool) and ``rehearse`` read it, and neither may
import pytest's or JAX's world through it.
"""

from __future__ import annotations

import re

# The baseline format version this nnx-pool writes (and the newest it reads); here, not in
# store/, so that `nnx_pool.regression.FORMAT_VERSION` loads without NumPy.
FORMAT_VERSION = 3

# The one mesh axis of a sharded check (`check --devices N`): the batch axis of the inputs.
BATCH_AXIS = "batch"

# Set (to anything but "" or "0") to compare only: the nnx_regression fixture never writes a
# baseline. `rehearse --pytest` sets it for the user's tests.
CHECK_ONLY_ENV = "NNX_REGRESSION_CHECK_ONLY"

# How the note of a partial `record -k` begins, in its report and its baseline's manifest.
PARTIAL_NOTE = "record -k"

# check's hidden option: the result of a rehearsal's pytest run, for its report.
PYTEST_RESULT_OPTION = "--pytest-result"

# What a batch case's name and a fixture baseline's name may hold: letters, digits, `_.-`.
NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")

# Beside a fixture baseline `<name>/`, a failing check writes `<name>.obtained/`; the weight
# sets kept with store_params=True lie in `<baselines' parent>/_weights/<16 hex>/`.
OBTAINED_SUFFIX = ".obtained"
WEIGHTS_DIR = "_weights"
# The fix a damaged fixture file (baseline, obtained file, weight set) names.
FIXTURE_REDO = "re-record it (--nnx-regression-update)"


def baseline_name_problem(name: object) -> str | None:
  """Why ``name`` cannot name a fixture baseline (one line for a ValueError), or None.

  Besides :data:`NAME`, a baseline's directory may not be hidden (``.``, ``..``, ``.x``) nor
  be one of the kit's own files: ``<other>.obtained`` (what ``<other>``'s failing check
  writes, and removes when it passes) or ``_weights`` (case-insensitively, as some file
  systems compare names).
  """
  if not isinstance(name, str) or not NAME.match(name):
    return f"`name` must be letters, digits and _.- only; got {name!r}."
  if name.startswith("."):
    return (f"`name` may not start with '.' ('.' and '..' are directories, and a name "
            f"starting with '.' a hidden one); got {name!r}.")
  if name.lower().endswith(OBTAINED_SUFFIX):
    other = name[:-len(OBTAINED_SUFFIX)]
    return (f"`name` may not end in {OBTAINED_SUFFIX!r}: a failing check of {other!r} writes "
            f"its results to {name!r} and removes them when it passes; got {name!r}. Choose "
            "another name.")
  if name.lower() == WEIGHTS_DIR:
    return (f"`name` may not be {WEIGHTS_DIR!r}, the directory of the stored weight sets; got "
            f"{name!r}. Choose another name.")
  return None
