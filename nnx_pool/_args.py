"""Constructor-argument checks shared by every module.

Each check raises TypeError for a value of the wrong kind and ValueError for a
value of the right kind out of range; the message names the argument, shows
the value received and says what is expected. Python and NumPy scalars are
accepted alike; ``bool`` is never taken for a number.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import numpy as np


def is_int(value) -> bool:
  """Whether ``value`` is a Python or NumPy integer, not a bool."""
  return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_bool(value, name: str) -> bool:
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"`{name}` must be a bool; got {value!r}.")
  return bool(value)


def check_positive_int(value, name: str, *, optional: bool = False) -> int | None:
  """A positive int (or None when ``optional``) as a Python int."""
  if optional and value is None:
    return None
  expected = "a positive int or None" if optional else "a positive int"
  if not is_int(value):
    raise TypeError(f"`{name}` must be {expected}; got {value!r}.")
  if value < 1:
    raise ValueError(f"`{name}` must be {expected}; got {value!r}.")
  return int(value)


def check_number(value, name: str, *, positive: bool = False) -> float:
  """A finite real number (positive when asked) as a Python float.

  Integers too large for a float are refused with the same ValueError as
  infinities.
  """
  expected = "a positive finite number" if positive else "a finite number"
  if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
    raise TypeError(f"`{name}` must be {expected}; got {value!r}.")
  try:
    number = float(value)
  except OverflowError:
    number = math.inf
  if not math.isfinite(number) or (positive and not number > 0):
    raise ValueError(f"`{name}` must be {expected}; got {value!r}.")
  return number


def check_callable(value, name: str) -> Callable:
  if not callable(value):
    raise TypeError(f"`{name}` must be a callable such as nnx.relu; got {value!r}.")
  return value


def check_num_spatial_dims(value) -> int:
  if not is_int(value):
    raise TypeError(f"`num_spatial_dims` must be 1, 2 or 3; got {value!r}.")
  if value not in (1, 2, 3):
    raise ValueError(f"`num_spatial_dims` must be 1, 2 or 3; got {value!r}.")
  return int(value)
