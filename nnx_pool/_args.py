"""Constructor-argument checks shared by every module.

Each check raises TypeError for a value of the wrong kind and ValueError for a
value of the right kind out of range; the message names the argument, shows
the value received and says what is expected. Python and NumPy scalars are
accepted alike; ``bool`` is never taken for a number.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Callable
from typing import Literal, ParamSpec, TypeGuard, TypeVar, overload

import numpy as np

_P = ParamSpec("_P")
_R = TypeVar("_R")


def is_int(value) -> TypeGuard[int | np.integer]:
  """Whether ``value`` is a Python or NumPy integer, not a bool."""
  return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_bool(value, name: str) -> bool:
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"`{name}` must be a bool; got {value!r}.")
  return bool(value)


@overload
def check_positive_int(value, name: str, *, optional: Literal[False] = False) -> int: ...
@overload
def check_positive_int(value, name: str, *, optional: bool) -> int | None: ...
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


def check_choice(value, name: str, choices: dict[str, str]) -> str:
  """``value`` when it is one of ``choices`` (each with what it means, for the message)."""
  accepted = ", ".join(f"{choice!r} ({meaning})" for choice, meaning in choices.items())
  if not isinstance(value, str):
    raise TypeError(f"`{name}` must be one of {accepted}; got {value!r}.")
  if value not in choices:
    raise ValueError(f"`{name}` must be one of {accepted}; got {value!r}.")
  return value


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


# ----------------------------------------------------------------------------
# The peers' argument names.
# ----------------------------------------------------------------------------

# Argument names of PyTorch, torchvision and timm that nnx-pool spells another way:
# peer name -> (ours, whose spelling ours is, whose the peer name is).
PEER_NAMES: dict[str, tuple[str, str, str]] = {
    "kernel_size": ("window_shape", "Flax's", "PyTorch's"),
    "stride": ("strides", "Flax's", "PyTorch's"),
    "keepdim": ("keepdims", "NumPy's", "PyTorch's"),
    "input_channels": ("in_features", "Flax's", "torchvision's"),
    "channels": ("in_features", "Flax's", "timm's"),
    "squeeze_channels": ("squeeze_features", "nnx-pool's", "torchvision's"),
    "rd_channels": ("squeeze_features", "nnx-pool's", "timm's"),
    "act_layer": ("activation", "nnx-pool's", "timm's"),
    "scale_activation": ("gate", "nnx-pool's", "torchvision's"),
    "gate_layer": ("gate", "nnx-pool's", "timm's"),
    "bias": ("use_bias", "Flax's", "timm's"),
    "mlp_bias": ("use_bias", "Flax's", "timm's"),
    "r_learnable": ("learnable", "nnx-pool's", "timm's"),
    "output_dim": ("out_features", "Flax's", "open_clip's"),
    "spacial_dim": ("feat_size", "nnx-pool's", "open_clip's"),
    "filt_size": ("filter_size", "nnx-pool's", "timm's"),
    "_random_samples": ("samples", "nnx-pool's", "PyTorch's"),
}


def flax_names(fn: Callable[_P, _R]) -> Callable[_P, _R]:
  """Wraps a public function, ``__init__`` or ``__call__`` so that a wrong keyword names the
  public API.

  A peer's name for one of ``fn``'s arguments (:data:`PEER_NAMES`) is a TypeError
  naming the one to use: "MaxPool takes `strides` (Flax's name), not `stride`
  (PyTorch's)". A peer's constructor argument that a module takes per call instead
  (a keyword-only argument of its ``__call__``, such as PyTorch's ``_random_samples``)
  is answered with the call to write. Any other unknown keyword, or too many
  positional arguments, is a TypeError that names the public class (``"FractionalMaxPool's
  call"`` for a ``__call__``) or function, not a private base class, and lists what it
  takes. Correct calls pay one set difference.
  """
  parameters = inspect.signature(fn).parameters
  names = frozenset(parameters)
  positional = [p.name for p in parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  keyword = [p.name for p in parameters.values() if p.kind == p.KEYWORD_ONLY]
  is_method = fn.__name__ in ("__init__", "__call__")
  if is_method:
    positional = positional[1:]

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    unknown = kwargs.keys() - names
    too_many = len(args) - is_method > len(positional)
    if unknown or too_many:
      owner = type(args[0]).__name__ if is_method else fn.__name__
      called = _call_keywords(type(args[0])) if fn.__name__ == "__init__" else ()
      if fn.__name__ == "__call__":
        owner += "'s call"
      _refuse(owner, sorted(unknown), len(args) - is_method, positional, keyword, called)
    return fn(*args, **kwargs)

  return wrapper


def _call_keywords(cls: type) -> tuple[str, ...]:
  """The keyword-only arguments of ``cls.__call__``: what a module takes per call."""
  try:
    parameters = inspect.signature(cls.__call__).parameters.values()
  except (TypeError, ValueError):  # no __call__ of its own, or one without a signature
    return ()
  return tuple(p.name for p in parameters if p.kind == p.KEYWORD_ONLY)


def _refuse(owner: str, unknown: list[str], given: int, positional: list[str],
            keyword: list[str], called: tuple[str, ...] = ()) -> None:
  takes = f"{owner} takes ({', '.join(positional)}" + (
      f", *, {', '.join(keyword)})" if keyword else ")")
  for name in unknown:
    if name not in PEER_NAMES:
      continue
    ours, our_kind, their_kind = PEER_NAMES[name]
    if ours in (*positional, *keyword):
      raise TypeError(
          f"{owner} takes `{ours}` ({our_kind} name), not `{name}` ({their_kind}): "
          f"write {ours}=... instead.")
    if ours in called:
      raise TypeError(
          f"{owner} takes `{ours}` ({our_kind} name) when called, not `{name}` "
          f"({their_kind}) when built: write {owner}(...)(inputs, {ours}=...) instead.")
  if unknown:
    raise TypeError(f"{owner} got an unexpected keyword argument `{unknown[0]}`; {takes}.")
  raise TypeError(
      f"{owner} got {given} positional arguments, at most {len(positional)}; {takes}.")
