"""The names several modules of the kit share, each defined here once.

This module imports nothing but :mod:`re`: the pytest plugin (loaded by every pytest
session of an environment that has nnx-pool) and ``rehearse`` read it, and neither may
import pytest's or JAX's world through it.
"""

from __future__ import annotations

import re

# The one mesh axis of a sharded check (`check --devices N`): the batch axis of the inputs.
BATCH_AXIS = "batch"

# Set (to anything but "" or "0") to compare only: the nnx_regression fixture never writes a
# baseline. `rehearse --pytest` sets it for the user's tests.
CHECK_ONLY_ENV = "NNX_REGRESSION_CHECK_ONLY"

# What a batch case's name and a fixture baseline's name may hold: letters, digits, `_.-`.
NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
