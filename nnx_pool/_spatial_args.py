"""The spatial arguments' forms: windows, strides, dilations and padding, and how many dims.

Every module takes these the same way: an int for every spatial dim or a tuple with one
entry per dim, padding as ``"VALID"``/``"SAME"``, an int, one int per dim or one
``(low, high)`` pair per dim, and one rule for how many spatial dims a module pools
(:func:`spatial_dims`): a tuple argument sets them by its length, an int is repeated over
``num_spatial_dims``, and ``num_spatial_dims`` defaults to 2 (PyTorch's ``MaxPool2d(2)``,
``AdaptiveAvgPool2d(1)``). Arguments that disagree are a ValueError. What the validated
arguments give over an input, the output shape and padding, is :mod:`nnx_pool._geometry`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, overload

import numpy as np

from ._args import check_num_spatial_dims, is_int

# The largest window, stride, dilation or padding entry: sizes are int64 in XLA and PyTorch.
MAX_SIZE = 2**63 - 1
# The argument types of the public signatures. An int is a Python or NumPy integer (a bool is
# refused at run time); a window, stride or dilation is one int for every spatial dim or one
# per dim; padding is "VALID"/"SAME" (any case), an int, one int per dim or one (low, high)
# pair per dim.
IntLike = int | np.integer
SizeLike = IntLike | Sequence[IntLike]
PaddingLike = str | IntLike | Sequence[IntLike] | Sequence[tuple[IntLike, IntLike]]
# An adaptive pool's output size: an int for every spatial dim, or one per dim (None keeps it).
OutputSizeLike = IntLike | Sequence[IntLike | None]
# A resolved padding spec: "VALID", "SAME", or one (low, high) pair per dim.
Pairs = tuple[tuple[int, int], ...]
PaddingSpec = Literal["VALID", "SAME"] | Pairs

PADDING_FORMS = (
    '"VALID" or "SAME" (any case), an int (both sides of every dim), '
    "a tuple of ints (symmetric per dim), or a tuple of (low, high) pairs"
)


def _length(value) -> int | None:
  """How many spatial dims an argument names: its length when a sequence, else None."""
  if isinstance(value, Sequence) and not isinstance(value, str):
    return len(value)
  return None


def spatial_dims(num_spatial_dims=None, **arguments) -> int:
  """The number of spatial dims a module pools, from the one rule for every module.

  Each tuple among ``arguments`` (name to value) sets the dims by its length;
  ints and strings set nothing. An explicit ``num_spatial_dims`` (1, 2 or 3)
  must agree with every tuple; with neither, the default is 2.

  Raises:
    TypeError: ``num_spatial_dims`` is not an int.
    ValueError: ``num_spatial_dims`` is not 1, 2 or 3, a tuple has another
      length, or two of them disagree.
  """
  if num_spatial_dims is not None:
    num_spatial_dims = check_num_spatial_dims(num_spatial_dims)
  source = None if num_spatial_dims is None else f"`num_spatial_dims={num_spatial_dims}`"
  ndim = num_spatial_dims
  for name, value in arguments.items():
    length = _length(value)
    if length is None:
      continue
    if not 1 <= length <= 3:
      raise ValueError(
          f"`{name}` must have 1, 2 or 3 entries (one per spatial dim); got {value!r}.")
    if ndim is None:
      ndim, source = length, f"`{name}` {value!r}"
    elif length != ndim:
      raise ValueError(
          f"`{name}` {value!r} has {length} entries, but {source} sets {ndim} spatial dim(s); "
          "give every tuple one entry per spatial dim, or an int for all of them."
      )
  return 2 if ndim is None else ndim


def as_tuple(value, ndim: int, name: str, *, minimum: int = 1) -> tuple[int, ...]:
  """Returns ``value`` (an int or a sequence of ``ndim`` ints) as an ``ndim``-tuple.

  Raises:
    TypeError: ``value`` is neither an int nor a sequence of ints.
    ValueError: wrong length, or an entry below ``minimum``.
  """
  if is_int(value):
    values = (int(value),) * ndim
  elif isinstance(value, Sequence) and not isinstance(value, str):
    if not all(is_int(v) for v in value):
      raise TypeError(f"`{name}` must be an int or a tuple of ints; got {value!r}.")
    values = tuple(int(v) for v in value)
    if len(values) != ndim:
      raise ValueError(
          f"`{name}` must have one entry per spatial dim ({ndim}); got {value!r} "
          f"with {len(values)}."
      )
  else:
    raise TypeError(f"`{name}` must be an int or a tuple of ints; got {value!r}.")
  if any(v < minimum for v in values):
    raise ValueError(f"`{name}` entries must be >= {minimum}; got {value!r}.")
  if any(v > MAX_SIZE for v in values):
    raise ValueError(f"`{name}` entries must be at most 2**63 - 1 (int64); got {value!r}.")
  return values


def _flat_pad_pairs(padding) -> Pairs | None:
  """F.pad's flat ``(left, right, top, bottom[, front, back])`` as pairs, first dim first."""
  if (isinstance(padding, Sequence) and not isinstance(padding, str)
      and len(padding) in (4, 6) and all(is_int(p) for p in padding)):
    pairs = [(int(padding[i]), int(padding[i + 1])) for i in range(0, len(padding), 2)]
    return tuple(reversed(pairs))
  return None


def refuse_flat_padding(padding, forms: str, source: str = "") -> None:
  """Refuses F.pad's flat 4- or 6-tuple ``padding`` (no module's form), with the pairs to write.

  ``forms`` says what the module takes; ``source`` names where the flat form comes from.
  """
  pairs = _flat_pad_pairs(padding)
  if pairs is not None:
    raise ValueError(
        f"`padding` {padding!r} reads as F.pad's flat (left, right, top, bottom[, front, "
        f"back]) order{source}; here padding is {forms}, first dim first: write "
        f"padding={pairs!r}.")


@overload
def parse_padding(padding: str, ndim: int) -> Literal["VALID", "SAME"]: ...
@overload
def parse_padding(padding: IntLike | Sequence[IntLike] | Sequence[tuple[IntLike, IntLike]],
                  ndim: int) -> Pairs: ...
@overload
def parse_padding(padding: object, ndim: int) -> PaddingSpec: ...
def parse_padding(padding: object, ndim: int) -> PaddingSpec:
  """Validates a padding argument and returns "VALID", "SAME" or (low, high) pairs."""
  if isinstance(padding, str):
    upper = padding.upper()
    if upper not in ("VALID", "SAME"):
      raise ValueError(f"`padding` must be {PADDING_FORMS}; got {padding!r}.")
    return upper
  if is_int(padding):
    pairs = ((int(padding), int(padding)),) * ndim
  elif isinstance(padding, Sequence):
    if len(padding) != ndim:
      raise ValueError(
          f"`padding` must have one entry per spatial dim ({ndim}); got {padding!r}. "
          f"Accepted: {PADDING_FORMS}."
      )
    if all(is_int(p) for p in padding):
      pairs = tuple((int(p), int(p)) for p in padding)
    elif all(
        isinstance(p, Sequence) and len(p) == 2 and all(is_int(q) for q in p) for p in padding
    ):
      pairs = tuple((int(lo), int(hi)) for lo, hi in padding)
    else:
      raise TypeError(f"`padding` must be {PADDING_FORMS}; got {padding!r}.")
  else:
    raise TypeError(f"`padding` must be {PADDING_FORMS}; got {padding!r}.")
  if any(v < 0 for pair in pairs for v in pair):
    raise ValueError(f"`padding` must be non-negative; got {padding!r}.")
  if any(v > MAX_SIZE for pair in pairs for v in pair):
    raise ValueError(f"`padding` entries must be at most 2**63 - 1 (int64); got {padding!r}.")
  return pairs
