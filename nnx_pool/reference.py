"""A plain-NumPy mirror of PyTorch's pooling semantics: the reference to test pooling against.

This module is the second, independent reference that the JAX implementation
is checked against (PyTorch itself is the first). It is public on purpose: a
reference kit should let users check their own pooling code against the same
rules, without PyTorch installed. It deliberately imports
nothing else from ``nnx_pool``: every output size, padding, divisor and index
below is computed here from the rules, with explicit Python loops over output
positions and window cells. It favours clarity over speed and is meant for
small arrays.

Conventions shared by every function:

* Arrays are channels-last and batched: ``(N, *spatial, C)`` with 1, 2 or 3
  spatial dims. The number of spatial dims is ``len(window)`` (or
  ``len(output_size)`` for the adaptive pools).
* ``window``, ``strides`` and ``dilation`` are tuples of ints, one per spatial
  dim.
* ``padding`` is ``"VALID"``, ``"SAME"`` or a tuple of ``(low, high)`` pairs,
  one per spatial dim. ``"SAME"`` is the lax/Flax rule of :func:`same_padding`
  (applied to the dilated window). Any non-negative explicit padding is
  accepted; PyTorch's own limit ``pad <= k/2`` is not enforced here.
* Indices are PyTorch's flat index inside one ``(n, c)`` plane of the input:
  ``w`` in 1-D, ``h*W + w`` in 2-D and ``(d*H + h)*W + w`` in 3-D, returned as
  int64 with shape ``(N, *out_spatial, C)``. They point at real cells, except
  for the PyTorch quirk described in :func:`max_pool` (a dilated window with
  no real cell).

Within a window, cells are visited in row-major order (the last spatial dim
fastest); padding cells are never visited.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Literal, NamedTuple, overload

import numpy as np

Padding = str | Sequence[tuple[int, int]]
Kind = Literal["max", "min"]

__all__ = [
  "adaptive_avg_pool",
  "adaptive_bins",
  "adaptive_max_pool",
  "avg_pool",
  "global_avg_pool",
  "global_max_pool",
  "lp_pool",
  "max_pool",
  "max_pool_grad",
  "max_unpool",
  "min_pool",
  "output_size",
  "same_padding",
]


# ----------------------------------------------------------------------------
# Scalar geometry.
# ----------------------------------------------------------------------------


def _check_int(value: object, name: str, minimum: int) -> int:
  """Returns ``value`` as an int, or raises ValueError if it is not one >= minimum."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f"{name} must be an int, got {value!r}")
  if value < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {value}")
  return int(value)


def output_size(
  length: int,
  window: int,
  stride: int,
  pad_low: int,
  pad_high: int,
  dilation: int = 1,
  ceil_mode: bool = False,
) -> int:
  """Number of pooling windows along one dim, by PyTorch's rule.

  With effective window ``e = dilation*(window-1) + 1`` and
  ``span = length + pad_low + pad_high - e``:

  * floor mode: ``span // stride + 1``;
  * ceil mode: ``ceil(span / stride) + 1``, minus one if the last window would
    start at or after ``length + pad_low``, i.e. the last window must start
    inside the input or the left padding. ``span`` may be negative here: a
    single window can overhang the padded input by less than a stride.

  Raises ValueError when the window does not fit in the padded input or the
  result is below one (PyTorch's "Output size is too small").

  >>> output_size(4, 3, 2, 0, 0)
  1
  >>> output_size(10, 1, 2, 0, 0, ceil_mode=True)
  5
  """
  length = _check_int(length, "length", 0)
  window = _check_int(window, "window", 1)
  stride = _check_int(stride, "stride", 1)
  pad_low = _check_int(pad_low, "pad_low", 0)
  pad_high = _check_int(pad_high, "pad_high", 0)
  dilation = _check_int(dilation, "dilation", 1)
  effective = dilation * (window - 1) + 1
  span = length + pad_low + pad_high - effective
  if span < 0 and not ceil_mode:
    raise ValueError(
      f"window {window} (effective {effective}) does not fit in length {length} "
      f"padded by ({pad_low}, {pad_high})"
    )
  # In ceil mode a window may overhang the padded input by less than a stride
  # (PyTorch: ceil((2 - 3) / 2) + 1 = 1 output for L=2, k=3, s=2).
  if ceil_mode:
    out = -(-span // stride) + 1
    if (out - 1) * stride >= length + pad_low:
      out -= 1
  else:
    out = span // stride + 1
  if out < 1:
    raise ValueError(f"output size is too small: {out} (length {length})")
  return out


def same_padding(length: int, window: int, stride: int, dilation: int = 1) -> tuple[int, int]:
  """The lax/Flax/TF ``'SAME'`` padding ``(low, high)`` of one dim.

  ``out = ceil(length / stride)`` and
  ``total = max((out - 1)*stride + e - length, 0)`` with the effective window
  ``e = dilation*(window-1) + 1``; the total is split as
  ``(total // 2, total - total // 2)``, so any odd cell goes on the high side.

  >>> same_padding(2, 2, 1)
  (0, 1)
  >>> same_padding(5, 3, 2)
  (1, 1)
  """
  length = _check_int(length, "length", 0)
  window = _check_int(window, "window", 1)
  stride = _check_int(stride, "stride", 1)
  dilation = _check_int(dilation, "dilation", 1)
  effective = dilation * (window - 1) + 1
  out = -(-length // stride)
  total = max((out - 1) * stride + effective - length, 0)
  return total // 2, total - total // 2


def adaptive_bins(length: int, out: int) -> list[tuple[int, int]]:
  """PyTorch's adaptive-pooling bins ``[start, end)`` for ``out`` bins over ``length``.

  Bin ``i`` is ``start = floor(i*length/out)``, ``end = ceil((i+1)*length/out)``,
  in exact integer arithmetic. Bins may overlap, and ``out`` may exceed
  ``length`` (then cells repeat).

  >>> adaptive_bins(5, 3)
  [(0, 2), (1, 4), (3, 5)]
  """
  length = _check_int(length, "length", 1)
  out = _check_int(out, "out", 1)
  return [((i * length) // out, -(-((i + 1) * length) // out)) for i in range(out)]


# ----------------------------------------------------------------------------
# Array geometry.
# ----------------------------------------------------------------------------


class _Dim(NamedTuple):
  """Geometry of one spatial dim of a sliding-window pool."""

  length: int
  window: int
  stride: int
  dilation: int
  pad_low: int
  pad_high: int
  out: int

  def start(self, o: int) -> int:
    """Input coordinate (may be negative) of the first cell of window ``o``."""
    return o * self.stride - self.pad_low

  def real_coords(self, o: int) -> list[int]:
    """Input coordinates of the real (non-padding) cells of window ``o``, in order."""
    first = self.start(o)
    coords = (first + j * self.dilation for j in range(self.window))
    return [c for c in coords if 0 <= c < self.length]

  def first_tap(self, o: int) -> int:
    """PyTorch's starting coordinate: the window start stepped by the dilation until >= 0.

    This is the first real coordinate whenever window ``o`` has one in this dim;
    when it has none (a dilated window whose taps straddle the input), it is a
    coordinate at or past ``length``.
    """
    c = self.start(o)
    while c < 0:
      c += self.dilation
    return c

  def padded_extent(self, o: int) -> int:
    """Window ``o`` clipped to ``[-pad_low, length + pad_high)`` (PyTorch's pool_size)."""
    first = self.start(o)
    return min(first + self.window, self.length + self.pad_high) - first


def _check_tuple(values: object, name: str, nd: int, minimum: int) -> tuple[int, ...]:
  if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
    raise ValueError(f"{name} must be a tuple of {nd} ints, got {values!r}")
  if len(values) != nd:
    raise ValueError(f"{name} must have {nd} entries, got {values!r}")
  return tuple(_check_int(v, f"{name}[{i}]", minimum) for i, v in enumerate(values))


def _spatial_rank(window: object) -> int:
  """The number of spatial dims, ``len(window)``; raises ValueError for a non-tuple."""
  if isinstance(window, (str, bytes)) or not isinstance(window, Sequence):
    raise ValueError(f"window must be a tuple of ints, one per spatial dim, got {window!r}")
  return len(window)


def _check_input(x: object, nd: int, name: str = "x") -> np.ndarray:
  """Returns ``x`` as an ndarray of rank ``nd + 2`` with a numeric dtype."""
  if nd not in (1, 2, 3):
    raise ValueError(f"pooling needs 1, 2 or 3 spatial dims, got {nd}")
  x = np.asarray(x)
  if x.ndim != nd + 2:
    raise ValueError(
      f"{name} must have shape (N, *spatial, C) with {nd} spatial dims, got {x.shape}"
    )
  if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
    raise ValueError(f"{name} must have an integer or floating dtype, got {x.dtype}")
  return x


def _resolve_padding(
  padding: Padding, spatial: tuple[int, ...], window: tuple[int, ...],
  strides: tuple[int, ...], dilation: tuple[int, ...],
) -> list[tuple[int, int]]:
  nd = len(spatial)
  if isinstance(padding, str):
    if padding == "VALID":
      return [(0, 0)] * nd
    if padding == "SAME":
      return [same_padding(*args) for args in zip(spatial, window, strides, dilation, strict=True)]
    raise ValueError(f"padding must be 'VALID', 'SAME' or (low, high) pairs, got {padding!r}")
  if not isinstance(padding, Sequence) or len(padding) != nd:
    raise ValueError(f"padding must be {nd} (low, high) pairs, got {padding!r}")
  pairs = []
  for i, pair in enumerate(padding):
    if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
      raise ValueError(f"padding[{i}] must be a (low, high) pair, got {pair!r}")
    pairs.append((_check_int(pair[0], f"padding[{i}][0]", 0),
                  _check_int(pair[1], f"padding[{i}][1]", 0)))
  return pairs


def _geometry(
  x: np.ndarray, window: Sequence[int], strides: Sequence[int], padding: Padding,
  dilation: Sequence[int] | None, ceil_mode: bool,
) -> list[_Dim]:
  nd = _spatial_rank(window)
  x = _check_input(x, nd)
  window = _check_tuple(window, "window", nd, 1)
  strides = _check_tuple(strides, "strides", nd, 1)
  dilation = (1,) * nd if dilation is None else _check_tuple(dilation, "dilation", nd, 1)
  spatial = tuple(x.shape[1:-1])
  pads = _resolve_padding(padding, spatial, window, strides, dilation)
  dims = []
  for length, k, s, d, (lo, hi) in zip(spatial, window, strides, dilation, pads, strict=True):
    out = output_size(length, k, s, lo, hi, dilation=d, ceil_mode=ceil_mode)
    dims.append(_Dim(length, k, s, d, lo, hi, out))
  return dims


def _flat_index(cell: Sequence[int], spatial: Sequence[int]) -> int:
  """PyTorch's flat per-plane index of ``cell``: ``(d*H + h)*W + w`` and so on."""
  index = 0
  for c, length in zip(cell, spatial, strict=True):
    index = index * length + c
  return index


def _unflat_index(index: int, spatial: Sequence[int]) -> tuple[int, ...]:
  cell = []
  for length in reversed(spatial):
    cell.append(index % length)
    index //= length
  return tuple(reversed(cell))


Cells = list[tuple[int, ...]]


def _sliding_windows(dims: Sequence[_Dim]) -> Iterator[tuple[tuple[int, ...], Cells]]:
  """Yields ``(output position, real cells)`` for every window, row-major."""
  for pos in itertools.product(*(range(d.out) for d in dims)):
    per_dim = [d.real_coords(o) for d, o in zip(dims, pos, strict=True)]
    yield pos, list(itertools.product(*per_dim))


def _torch_start_index(dims: Sequence[_Dim], pos: Sequence[int]) -> int:
  """PyTorch's initial index of window ``pos``: the flat index of the per-dim first taps.

  Equal to the flat index of the window's first real cell when it has one.
  """
  index = 0
  for d, o in zip(dims, pos, strict=True):
    index = index * d.length + d.first_tap(o)
  return index


def _adaptive_windows(
  spatial: Sequence[int], out: Sequence[int],
) -> Iterator[tuple[tuple[int, ...], Cells]]:
  """Yields ``(output position, cells)`` for every adaptive bin, row-major."""
  bins = [adaptive_bins(length, t) for length, t in zip(spatial, out, strict=True)]
  for pos in itertools.product(*(range(t) for t in out)):
    per_dim = [range(*b[o]) for b, o in zip(bins, pos, strict=True)]
    yield pos, list(itertools.product(*per_dim))


def _at(pos: Sequence[int]) -> tuple:
  """Index of every (n, c) at spatial position ``pos`` of a channels-last array."""
  return (slice(None), *pos, slice(None))


# ----------------------------------------------------------------------------
# Reductions over one window.
# ----------------------------------------------------------------------------


def _start_value(dtype: np.dtype, kind: Kind):
  """-inf / +inf for floats; the dtype's min / max for integers."""
  if np.issubdtype(dtype, np.floating):
    return np.array(-np.inf if kind == "max" else np.inf, dtype=dtype)
  info = np.iinfo(dtype)
  return np.array(info.min if kind == "max" else info.max, dtype=dtype)


def _select(
  x: np.ndarray, cells: Sequence[tuple[int, ...]], kind: Kind, start_index: int,
) -> tuple[np.ndarray, np.ndarray]:
  """PyTorch's max (or min) over ``cells`` for every (n, c): ``(values, indices)``.

  Start from -inf (max) or +inf (min), dtype min/max for integers, with
  ``start_index`` (the first cell's index, or PyTorch's value for an empty
  window); visit the cells in order and take a cell when
  ``val > best or isnan(val)`` (min: ``val < best or isnan(val)``). So the
  first extreme wins ties and the last NaN wins.
  """
  spatial = x.shape[1:-1]
  n, c = x.shape[0], x.shape[-1]
  best = np.full((n, c), _start_value(x.dtype, kind), dtype=x.dtype)
  best_index = np.full((n, c), start_index, dtype=np.int64)
  for cell in cells:
    val = x[_at(cell)]
    better = (val > best) if kind == "max" else (val < best)
    take = better | np.isnan(val)
    best = np.where(take, val, best)
    best_index = np.where(take, _flat_index(cell, spatial), best_index)
  return best, best_index


def _sum(x: np.ndarray, cells: Sequence[tuple[int, ...]]) -> np.ndarray:
  """Float64 sum over ``cells`` for every (n, c), in window order."""
  acc = np.zeros((x.shape[0], x.shape[-1]), dtype=np.float64)
  for cell in cells:
    acc = acc + x[_at(cell)].astype(np.float64)
  return acc


# ----------------------------------------------------------------------------
# Sliding-window pools.
# ----------------------------------------------------------------------------


def _avg_pool_f64(
  x: np.ndarray, window: Sequence[int], strides: Sequence[int], padding: Padding,
  ceil_mode: bool, count_include_pad: bool, divisor_override: int | None,
) -> np.ndarray:
  dims = _geometry(x, window, strides, padding, None, ceil_mode)
  if divisor_override is not None:
    if isinstance(divisor_override, bool) or not isinstance(divisor_override, (int, np.integer)):
      raise ValueError(f"divisor_override must be an int, got {divisor_override!r}")
    if divisor_override == 0:
      raise ValueError("divisor_override must not be zero")
  x = np.asarray(x)
  out = np.zeros((x.shape[0], *(d.out for d in dims), x.shape[-1]), dtype=np.float64)
  for pos, cells in _sliding_windows(dims):
    if divisor_override is not None:
      divisor = int(divisor_override)
    elif count_include_pad:
      divisor = math.prod(d.padded_extent(o) for d, o in zip(dims, pos, strict=True))
    else:
      divisor = len(cells)
      if divisor == 0:
        raise ValueError("a pooling window covers no input cell, so it has no divisor")
    out[_at(pos)] = _sum(x, cells) / divisor
  return out


def avg_pool(
  x: np.ndarray,
  window: Sequence[int],
  strides: Sequence[int],
  padding: Padding,
  *,
  ceil_mode: bool = False,
  count_include_pad: bool = True,
  divisor_override: int | None = None,
) -> np.ndarray:
  """PyTorch's average pool (AvgPool1d/2d/3d), channels-last.

  Each output is the float64 sum of the window's real cells divided by:

  * ``divisor_override`` when given (a nonzero int);
  * else, with ``count_include_pad=True``, the window's size after clipping it
    to ``[-pad_low, length + pad_high)`` in every dim: explicit padding counts,
    the ceil-mode overhang past the high padding does not;
  * else the number of real input cells in the window.

  The result is cast to ``x.dtype`` (so integer inputs are truncated).
  """
  x = np.asarray(x)
  return _avg_pool_f64(
    x, window, strides, padding, ceil_mode, count_include_pad, divisor_override
  ).astype(x.dtype)


def _arg_pool(
  x: np.ndarray, window: Sequence[int], strides: Sequence[int], padding: Padding,
  dilation: Sequence[int] | None, ceil_mode: bool, kind: Kind,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(values, indices, empty)``; ``empty`` marks output positions with no real cell."""
  dims = _geometry(x, window, strides, padding, dilation, ceil_mode)
  x = np.asarray(x)
  shape = (x.shape[0], *(d.out for d in dims), x.shape[-1])
  values = np.empty(shape, dtype=x.dtype)
  indices = np.empty(shape, dtype=np.int64)
  empty = np.zeros(shape[1:-1], dtype=bool)
  for pos, cells in _sliding_windows(dims):
    values[_at(pos)], indices[_at(pos)] = _select(x, cells, kind, _torch_start_index(dims, pos))
    empty[pos] = not cells
  return values, indices, empty


def max_pool(
  x: np.ndarray, window: Sequence[int], strides: Sequence[int], padding: Padding, *,
  dilation: Sequence[int] | None = None, ceil_mode: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """PyTorch's max pool with ``return_indices=True``, channels-last.

  Only real cells are visited, in row-major window order (padding acts as
  -inf, or the dtype's min for integers, and is never selected). Start with
  value -inf (integers: dtype min) and the index of the window's first real
  cell, then take a cell when ``val > best or isnan(val)``: the first maximum
  wins ties, and the last NaN in the window wins. ``dilation`` defaults to 1.

  Returns ``(values, indices)``; indices are flat per-plane (see the module
  docstring).

  PyTorch quirk, mirrored: with dilation a window can hold no real cell (its
  taps step over the input, e.g. length 1, window 2, dilation 2, padding 1).
  PyTorch 2.13 then returns -inf (integers: dtype min) and the index it
  starts from: per dim the window start stepped by the dilation until it is
  >= 0, flattened with the input's extents. That coordinate lies at or past
  the input's end, so the index aliases another cell or exceeds the plane.
  """
  return _arg_pool(x, window, strides, padding, dilation, ceil_mode, "max")[:2]


def min_pool(
  x: np.ndarray, window: Sequence[int], strides: Sequence[int], padding: Padding, *,
  dilation: Sequence[int] | None = None, ceil_mode: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """The min counterpart of :func:`max_pool`.

  Start from +inf (integers: dtype max) with the first real cell's index and
  take a cell when ``val < best or isnan(val)``: the first minimum wins ties,
  the last NaN wins. For floats this equals ``-max_pool(-x)`` with the same
  indices. A window with no real cell gives +inf (integers: dtype max) and
  PyTorch's index, as in :func:`max_pool`.
  """
  return _arg_pool(x, window, strides, padding, dilation, ceil_mode, "min")[:2]


def max_pool_grad(
  x: np.ndarray, g: np.ndarray, window: Sequence[int], strides: Sequence[int], padding: Padding,
  *, dilation: Sequence[int] | None = None, ceil_mode: bool = False, kind: Kind = "max",
) -> np.ndarray:
  """Gradient of :func:`max_pool` (or :func:`min_pool`, ``kind="min"``) w.r.t. ``x``.

  ``g`` is the cotangent, shaped like the pool's output. Each output's ``g``
  is added to the one input cell its index points at (PyTorch's backward);
  overlapping windows that pick the same cell accumulate. Sums are in float64,
  then cast to ``x.dtype`` for floating ``x`` and to ``g.dtype`` otherwise.

  An output whose window holds no real cell (see :func:`max_pool`) is a
  constant and sends no gradient anywhere. This deliberately differs from
  PyTorch 2.13, whose backward adds that ``g`` to the cell its aliased index
  names when the index falls inside the plane (and drops it otherwise).
  """
  if kind not in ("max", "min"):
    raise ValueError(f"kind must be 'max' or 'min', got {kind!r}")
  x = np.asarray(x)
  g = np.asarray(g)
  values, indices, empty = _arg_pool(x, window, strides, padding, dilation, ceil_mode, kind)
  if g.shape != values.shape:
    raise ValueError(f"g must have the pool's output shape {values.shape}, got {g.shape}")
  spatial = x.shape[1:-1]
  grad = np.zeros(x.shape, dtype=np.float64)
  for pos in itertools.product(*(range(o) for o in values.shape[1:-1])):
    if empty[pos]:
      continue
    for n in range(x.shape[0]):
      for c in range(x.shape[-1]):
        cell = _unflat_index(int(indices[(n, *pos, c)]), spatial)
        grad[(n, *cell, c)] += float(g[(n, *pos, c)])
  out_dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else g.dtype
  return grad.astype(out_dtype)


def lp_pool(
  x: np.ndarray,
  norm_type: float,
  window: Sequence[int],
  strides: Sequence[int] | None = None,
  *,
  ceil_mode: bool = False,
) -> np.ndarray:
  """PyTorch's power-average pool (LPPool1d/2d/3d), channels-last.

  Computed exactly as PyTorch does:
  ``(avg_pool(x**p, padding VALID, ceil_mode, count_include_pad=True) * prod(window)) ** (1/p)``.
  So a full window gives ``(sum x**p) ** (1/p)``, a partial ceil-mode window is
  scaled by ``prod(window) / clipped size``, and it uses ``x**p`` (not
  ``|x|**p``): a negative sum with a fractional ``1/p`` gives NaN. ``strides``
  defaults to ``window``. Computed in float64, cast to ``x.dtype`` for floating
  ``x`` (float64 otherwise).
  """
  x = np.asarray(x)
  numbers = (int, float, np.integer, np.floating)
  if isinstance(norm_type, bool) or not isinstance(norm_type, numbers):
    raise ValueError(f"norm_type must be a number, got {norm_type!r}")
  p = float(norm_type)
  if p == 0 or not math.isfinite(p):
    raise ValueError(f"norm_type must be finite and nonzero, got {norm_type!r}")
  if strides is None:
    strides = window
  with np.errstate(all="ignore"):
    powered = np.power(x.astype(np.float64), p)
    mean = _avg_pool_f64(powered, window, strides, "VALID", ceil_mode, True, None)
    out = np.power(mean * math.prod(window), 1.0 / p)
  out_dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
  return out.astype(out_dtype)


# ----------------------------------------------------------------------------
# Adaptive and global pools.
# ----------------------------------------------------------------------------


def _adaptive_out(
  x: object, output_size: Sequence[int | None],
) -> tuple[np.ndarray, tuple[int, ...]]:
  if isinstance(output_size, (str, bytes)) or not isinstance(output_size, Sequence):
    raise ValueError(f"output_size must be a tuple of ints or None, got {output_size!r}")
  nd = len(output_size)
  x = _check_input(x, nd)
  spatial = x.shape[1:-1]
  if min(spatial) < 1:
    raise ValueError(f"adaptive pooling needs non-empty spatial dims, got {x.shape}")
  out = tuple(
    length if t is None else _check_int(t, f"output_size[{i}]", 1)
    for i, (length, t) in enumerate(zip(spatial, output_size, strict=True))
  )
  return x, out


def adaptive_avg_pool(x: np.ndarray, output_size: Sequence[int | None]) -> np.ndarray:
  """PyTorch's adaptive average pool, channels-last.

  ``output_size`` has one entry per spatial dim; ``None`` keeps that dim. Each
  output is the float64 mean over its bin (see :func:`adaptive_bins`; bins may
  overlap, and outputs larger than the input are allowed), cast to
  ``x.dtype``.
  """
  x, out = _adaptive_out(x, output_size)
  result = np.zeros((x.shape[0], *out, x.shape[-1]), dtype=np.float64)
  for pos, cells in _adaptive_windows(x.shape[1:-1], out):
    result[_at(pos)] = _sum(x, cells) / len(cells)
  return result.astype(x.dtype)


def adaptive_max_pool(
  x: np.ndarray, output_size: Sequence[int | None],
) -> tuple[np.ndarray, np.ndarray]:
  """PyTorch's adaptive max pool with ``return_indices=True``, channels-last.

  Bins as in :func:`adaptive_avg_pool`; within a bin the rule of
  :func:`max_pool` applies (first maximum wins ties, last NaN wins). Returns
  ``(values, flat per-plane indices)``.
  """
  x, out = _adaptive_out(x, output_size)
  shape = (x.shape[0], *out, x.shape[-1])
  values = np.empty(shape, dtype=x.dtype)
  indices = np.empty(shape, dtype=np.int64)
  for pos, cells in _adaptive_windows(x.shape[1:-1], out):
    first = _flat_index(cells[0], x.shape[1:-1])
    values[_at(pos)], indices[_at(pos)] = _select(x, cells, "max", first)
  return values, indices


def _valid_cells(mask: np.ndarray, x_shape: tuple[int, ...], n: int) -> list[tuple[int, ...]]:
  """The spatial cells of batch entry ``n`` where ``mask`` (shape ``x_shape[:-1]``) is nonzero,
  row-major."""
  if mask.shape != x_shape[:-1]:
    raise ValueError(f"mask must have shape {x_shape[:-1]} (x's without C), got {mask.shape}")
  return [cell for cell in itertools.product(*map(range, x_shape[1:-1])) if mask[(n, *cell)]]


def global_avg_pool(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
  """Mean over all spatial axes of ``(N, *spatial, C)``: shape ``(N, C)``.

  Float64 sum divided by the number of spatial cells, cast to ``x.dtype``. With a
  ``mask`` ``(N, *spatial)``: the float64 sum over the cells where it is nonzero
  divided by their count (Keras's masked ``GlobalAveragePooling1D``), and 0 for an
  entry with no such cell (PyTorch's ``embedding_bag`` for an empty bag).
  """
  x = np.asarray(x)
  if mask is None:
    return adaptive_avg_pool(x, (1,) * (x.ndim - 2)).reshape(x.shape[0], x.shape[-1])
  out = np.zeros((x.shape[0], x.shape[-1]), np.float64)
  for n in range(x.shape[0]):
    cells = _valid_cells(np.asarray(mask), x.shape, n)
    if cells:
      out[n] = _sum(x[n:n + 1], cells)[0] / len(cells)
  return out.astype(x.dtype)


def global_max_pool(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
  """Max over all spatial axes of ``(N, *spatial, C)``: shape ``(N, C)``.

  Same rule as :func:`max_pool`, so any NaN in a plane gives NaN. With a ``mask``
  ``(N, *spatial)``: the same rule over the cells where it is nonzero, and 0 for an
  entry with no such cell.
  """
  x = np.asarray(x)
  if mask is None:
    values, _ = adaptive_max_pool(x, (1,) * (x.ndim - 2))
    return values.reshape(x.shape[0], x.shape[-1])
  out = np.zeros((x.shape[0], x.shape[-1]), x.dtype)
  for n in range(x.shape[0]):
    cells = _valid_cells(np.asarray(mask), x.shape, n)
    if cells:
      out[n] = _select(x[n:n + 1], cells, "max", 0)[0][0]
  return out


# ----------------------------------------------------------------------------
# Unpooling.
# ----------------------------------------------------------------------------


def max_unpool(
  x: np.ndarray,
  indices: np.ndarray,
  window: Sequence[int],
  strides: Sequence[int] | None = None,
  padding: Sequence[int] | None = None,
  output_size: Sequence[int] | None = None,
) -> np.ndarray:
  """PyTorch's MaxUnpool1d/2d/3d, channels-last.

  The output's spatial shape is ``output_size`` if given, else
  ``(in - 1)*stride - 2*padding + window`` per dim; as in PyTorch, a given
  ``output_size`` must lie strictly within one stride of that default.
  ``strides`` defaults to ``window`` and ``padding`` (one symmetric int per dim)
  to zeros. The output is zero except ``out[n, cell(idx), c] = x[n, pos, c]``
  where ``idx = indices[n, pos, c]`` is a flat per-plane index into the output.
  Inputs are written in row-major order of their position, so when two
  positions carry the same index the later one wins. An index outside the
  output plane raises ValueError.
  """
  nd = _spatial_rank(window)
  x = _check_input(x, nd)
  indices = np.asarray(indices)
  if indices.shape != x.shape:
    raise ValueError(f"indices must have the shape of x {x.shape}, got {indices.shape}")
  if not np.issubdtype(indices.dtype, np.integer):
    raise ValueError(f"indices must be integers, got {indices.dtype}")
  window = _check_tuple(window, "window", nd, 1)
  strides = window if strides is None else _check_tuple(strides, "strides", nd, 1)
  padding = (0,) * nd if padding is None else _check_tuple(padding, "padding", nd, 0)
  in_spatial = x.shape[1:-1]
  default = tuple(
    (i - 1) * s - 2 * p + k for i, s, p, k in zip(in_spatial, strides, padding, window, strict=True)
  )
  if output_size is None:
    out_spatial = default
  else:
    out_spatial = _check_tuple(output_size, "output_size", nd, 1)
    for d, (size, base, s) in enumerate(zip(out_spatial, default, strides, strict=True)):
      if not base - s < size < base + s:
        raise ValueError(
          f"output_size[{d}] = {size} must lie strictly between {base - s} and {base + s}"
        )
  if min(out_spatial) < 1:
    raise ValueError(f"max_unpool output would be empty: {out_spatial}")
  plane = math.prod(out_spatial)
  out = np.zeros((x.shape[0], *out_spatial, x.shape[-1]), dtype=x.dtype)
  for n in range(x.shape[0]):
    for c in range(x.shape[-1]):
      for pos in itertools.product(*(range(i) for i in in_spatial)):
        index = int(indices[(n, *pos, c)])
        if not 0 <= index < plane:
          raise ValueError(
            f"index {index} at {(n, *pos, c)} is outside the output plane of {plane}"
          )
        out[(n, *_unflat_index(index, out_spatial), c)] = x[(n, *pos, c)]
  return out


# ----------------------------------------------------------------------------
# Generalized global pools (issue 25): GeM and timm's LsePlus2d.
# ----------------------------------------------------------------------------


def _global_input(x: object) -> np.ndarray:
  """``x`` as a float ndarray ``(N, *spatial, C)`` with 1 to 3 non-empty spatial dims."""
  x = np.asarray(x)
  if not 3 <= x.ndim <= 5:
    raise ValueError(f"x must have shape (N, *spatial, C) with 1 to 3 spatial dims, got {x.shape}")
  if not np.issubdtype(x.dtype, np.floating):
    raise ValueError(f"x must have a floating dtype, got {x.dtype}")
  if 0 in x.shape[1:-1]:
    raise ValueError(f"x must have non-empty spatial dims, got {x.shape}")
  return x


def gem_pool(x: np.ndarray, p: float = 3.0, eps: float = 1e-6) -> np.ndarray:
  """Generalized mean over space, as cnnimageretrieval-pytorch's ``gem``: shape ``(N, C)``.

  ``avg_pool2d(x.clamp(min=eps).pow(p), (H, W)).pow(1. / p)``: each cell raised to
  ``eps`` when below it (NaN stays NaN), to the power ``p``, averaged over every
  spatial cell, and the ``1 / p``-th root taken; float64, cast to ``x.dtype``.
  """
  x = _global_input(x)
  wide = x.astype(np.float64)
  clamped = np.where(wide < eps, eps, wide)
  cells = math.prod(x.shape[1:-1])
  total = (clamped ** p).reshape(x.shape[0], cells, x.shape[-1]).sum(axis=1)
  return ((total / cells) ** (1.0 / p)).astype(x.dtype)


def lse_plus_pool(x: np.ndarray, r: float = 10.0) -> np.ndarray:
  """timm's ``LsePlus2d``: ``x_max + log(mean over space of exp(r (x - x_max))) / r``, ``(N, C)``.

  ``x_max`` is the max over every spatial cell of a channel (NaN if any is NaN);
  float64, cast to ``x.dtype``.
  """
  x = _global_input(x)
  flat = x.astype(np.float64).reshape(x.shape[0], -1, x.shape[-1])
  x_max = flat.max(axis=1, keepdims=True)
  mean_exp = np.exp(r * (flat - x_max)).mean(axis=1)
  return (x_max[:, 0] + np.log(mean_exp) / r).astype(x.dtype)


__all__ += ["gem_pool", "lse_plus_pool"]


# ----------------------------------------------------------------------------
# Resampling pools (issue 25): timm's BlurPool2d and MedianPool2d, PyTorch's
# FractionalMaxPool2d/3d.
# ----------------------------------------------------------------------------

PadMode = Literal["reflect", "constant", "replicate", "circular"]


@overload
def _padded_source(coord: int, length: int,
                   mode: Literal["replicate", "circular", "reflect"]) -> int: ...
@overload
def _padded_source(coord: int, length: int, mode: str) -> int | None: ...
def _padded_source(coord: int, length: int, mode: str) -> int | None:
  """The input coordinate that coordinate ``coord`` of ``F.pad(..., mode)`` reads; None for a
  zero of ``"constant"``. ``"reflect"`` mirrors without repeating the edge (-1 reads 1)."""
  if 0 <= coord < length:
    return coord
  if mode == "constant":
    return None
  if mode == "replicate":
    return min(max(coord, 0), length - 1)
  if mode == "circular":
    return coord % length
  if mode == "reflect":
    period = 2 * (length - 1)
    coord = abs(coord) % period
    return coord if coord < length else period - coord
  raise ValueError(f"pad mode must be reflect, constant, replicate or circular, got {mode!r}")


def _check_pad(length: int, pad: int, mode: str) -> None:
  """PyTorch's ``F.pad`` limits: reflect padding below the length, circular at most it."""
  if mode == "reflect" and pad >= length:
    raise ValueError(f"reflect padding {pad} must be less than the length {length}")
  if mode == "circular" and pad > length:
    raise ValueError(f"circular padding {pad} must be at most the length {length}")


def binomial_filter(size: int) -> np.ndarray:
  """timm's blur filter, ``C(size-1, k) / 2^(size-1)`` for ``k = 0..size-1``, float64.

  >>> binomial_filter(3).tolist()
  [0.25, 0.5, 0.25]
  """
  size = _check_int(size, "size", 2)
  return np.array([math.comb(size - 1, k) for k in range(size)], np.float64) / 2.0 ** (size - 1)


def blur_pool(
  x: np.ndarray, filter_size: Sequence[int], strides: Sequence[int], pad_mode: PadMode = "reflect",
) -> np.ndarray:
  """timm's ``BlurPool2d`` (any spatial rank), channels-last.

  Each spatial dim is padded on both sides by timm's
  ``get_padding(k, s) = ((s - 1) + (k - 1)) // 2`` in ``pad_mode`` (``F.pad``'s),
  and each output is the float64 sum over its window of the outer product of
  :func:`binomial_filter` per dim times the cells, stepping by ``strides``; the
  result is cast to ``x.dtype``.
  """
  nd = _spatial_rank(filter_size)
  x = _check_input(x, nd)
  filter_size = _check_tuple(filter_size, "filter_size", nd, 2)
  strides = _check_tuple(strides, "strides", nd, 1)
  spatial = x.shape[1:-1]
  pads = [((s - 1) + (k - 1)) // 2 for k, s in zip(filter_size, strides, strict=True)]
  outs = []
  for length, k, s, p in zip(spatial, filter_size, strides, pads, strict=True):
    _check_pad(length, p, pad_mode)
    if length + 2 * p < k:
      raise ValueError(f"filter {k} does not fit length {length} padded by {p} on each side")
    outs.append((length + 2 * p - k) // s + 1)
  filters = [binomial_filter(k) for k in filter_size]
  out = np.zeros((x.shape[0], *outs, x.shape[-1]), np.float64)
  for pos in itertools.product(*(range(o) for o in outs)):
    acc = np.zeros((x.shape[0], x.shape[-1]), np.float64)
    for taps in itertools.product(*(range(k) for k in filter_size)):
      weight, cell = 1.0, []
      for d, (o, j) in enumerate(zip(pos, taps, strict=True)):
        weight *= filters[d][j]
        cell.append(_padded_source(o * strides[d] - pads[d] + j, spatial[d], pad_mode))
      if None not in cell:
        acc = acc + weight * x[_at(cell)].astype(np.float64)
    out[_at(pos)] = acc
  return out.astype(x.dtype)


def median_pool(
  x: np.ndarray, window: Sequence[int], strides: Sequence[int], padding: Padding,
) -> tuple[np.ndarray, np.ndarray]:
  """timm's ``MedianPool2d`` (any spatial rank), channels-last: ``(values, indices)``.

  The input is padded by reflection (``F.pad``'s ``"reflect"``: the padding must be
  less than the dim) by ``padding``, ``(low, high)`` pairs per dim, or ``"SAME"``
  (TF's rule, :func:`same_padding`, timm's ``same=True``); only whole windows are
  kept. Each output is PyTorch's lower median of its window's cells in
  row-major order: the first NaN if the window holds one, else the cell of rank
  ``(n - 1) // 2`` in a stable sort (equal values rank in window order). Indices
  are the flat per-plane index of the input cell the median was read from (a
  padding cell names the cell it mirrors), int64.
  """
  nd = _spatial_rank(window)
  x = _check_input(x, nd)
  window = _check_tuple(window, "window", nd, 1)
  strides = _check_tuple(strides, "strides", nd, 1)
  spatial = x.shape[1:-1]
  pads = _resolve_padding(padding, spatial, window, strides, (1,) * nd)
  outs = []
  for length, k, s, (lo, hi) in zip(spatial, window, strides, pads, strict=True):
    _check_pad(length, max(lo, hi), "reflect")
    outs.append(output_size(length, k, s, lo, hi))
  shape = (x.shape[0], *outs, x.shape[-1])
  values = np.empty(shape, x.dtype)
  indices = np.empty(shape, np.int64)
  for pos in itertools.product(*(range(o) for o in outs)):
    cells = list(itertools.product(*(
      [_padded_source(o * s - lo + j, length, "reflect") for j in range(k)]
      for o, s, (lo, _), k, length in zip(pos, strides, pads, window, spatial, strict=True))))
    for n in range(x.shape[0]):
      for c in range(x.shape[-1]):
        vals = [x[(n, *cell, c)] for cell in cells]
        nans = [i for i, v in enumerate(vals) if np.isnan(v)]
        chosen = nans[0] if nans else sorted(range(len(vals)), key=lambda i: vals[i])[
          (len(vals) - 1) // 2]
        values[(n, *pos, c)] = vals[chosen]
        indices[(n, *pos, c)] = _flat_index(cells[chosen], spatial)
  return values, indices


# Which of a plane's samples drives each spatial dim, PyTorch's: in 2-D the first
# drives W and the second H; in 3-D, T, H and W in order.
_SAMPLE_OF_DIM = {1: (0,), 2: (1, 0), 3: (0, 1, 2)}


def fractional_intervals(sample: np.generic, length: int, out: int, window: int) -> list[int]:
  """PyTorch's ``generate_intervals``: where each of ``out`` windows starts along one dim.

  ``int((i + u) * alpha) - int(u * alpha)`` with ``alpha = (length - window) / (out - 1)``,
  and ``length - window`` for the last window; the arithmetic is done in the
  dtype of the NumPy scalar ``sample`` (PyTorch's: the input's; ml_dtypes' bfloat16
  too), each operation rounded to it.

  >>> fractional_intervals(np.float32(0.6), 5, 3, 2)
  [0, 2, 3]
  """
  length = _check_int(length, "length", 1)
  out = _check_int(out, "out", 1)
  window = _check_int(window, "window", 1)
  if window + out - 1 > length:
    raise ValueError(f"window {window} with {out} outputs needs window + out - 1 <= {length}")
  # NumPy's floats, and ml_dtypes' (bfloat16...), whose dtype kind is "V".
  if not isinstance(sample, np.generic) or sample.dtype.kind not in "fV":
    raise ValueError(f"sample must be a NumPy floating scalar, got {sample!r}")
  dtype = type(sample)
  starts = []
  if out > 1:
    # dtype is a floating scalar type (checked above); np.generic's stub has no arithmetic.
    alpha = dtype(length - window) / dtype(out - 1)  # pyright: ignore[reportOperatorIssue]
    starts = [int((dtype(i) + sample) * alpha) - int(sample * alpha) for i in range(out - 1)]  # pyright: ignore[reportOperatorIssue]
  starts.append(length - window)
  if not all(0 <= s <= length - window for s in starts):
    raise ValueError(f"a window starts outside [0, {length - window}]: {starts} (PyTorch asserts)")
  return starts


def fractional_max_pool(
  x: np.ndarray, window: Sequence[int], output_size: Sequence[int], samples: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
  """PyTorch's ``fractional_max_pool2d/3d`` with ``_random_samples``, channels-last.

  ``samples`` is ``(N, C, nd)``; plane ``(n, c)`` places its windows along each
  dim at :func:`fractional_intervals` of its sample for that dim (in 2-D sample 0
  drives W and sample 1 H; in 3-D they drive T, H, W; in 1-D the one sample), in
  the samples' dtype. Within a window the rule of :func:`max_pool` applies, from
  -inf with the window's first cell: the first maximum wins ties, the last NaN
  wins. Returns ``(values, flat per-plane indices)``.
  """
  nd = _spatial_rank(window)
  x = _check_input(x, nd)
  window = _check_tuple(window, "window", nd, 1)
  outs = _check_tuple(output_size, "output_size", nd, 1)
  samples = np.asarray(samples)
  expected = (x.shape[0], x.shape[-1], nd)
  if samples.shape != expected:
    raise ValueError(f"samples must have shape {expected}, got {samples.shape}")
  spatial = x.shape[1:-1]
  shape = (x.shape[0], *outs, x.shape[-1])
  values = np.empty(shape, x.dtype)
  indices = np.empty(shape, np.int64)
  for n in range(x.shape[0]):
    for c in range(x.shape[-1]):
      starts = [fractional_intervals(samples[n, c, _SAMPLE_OF_DIM[nd][d]], spatial[d], outs[d],
                                     window[d]) for d in range(nd)]
      for pos in itertools.product(*(range(o) for o in outs)):
        first = [s[o] for s, o in zip(starts, pos, strict=True)]
        best, best_index = -np.inf, _flat_index(first, spatial)
        for offset in itertools.product(*(range(k) for k in window)):
          cell = [f + j for f, j in zip(first, offset, strict=True)]
          val = x[(n, *cell, c)]
          if val > best or np.isnan(val):
            best, best_index = val, _flat_index(cell, spatial)
        values[(n, *pos, c)] = best
        indices[(n, *pos, c)] = best_index
  return values, indices


__all__ += ["binomial_filter", "blur_pool", "fractional_intervals", "fractional_max_pool",
            "median_pool"]
