"""Tolerance policy: what counts as "the same number" for each kind of result.

A tolerance is resolved from three things: the *kind* of computation a case
performs (a selection, a window reduction, a gate, a user's model), the *role*
of the array (an output, argmax indices, a gradient) and its *dtype*. Every
tolerance carries the reason it was chosen, and both are written into the
baseline and shown in every report.

Comparison is ``|actual - expected| <= atol + rtol * |expected|`` per element,
after NaN positions must agree and infinities must be equal (see
:mod:`nnx_pool.regression.compare.arrays`).

Where the numbers come from (``eps`` is the dtype's machine epsilon:
float64 2.2e-16, float32 1.2e-7, float16 9.8e-4, bfloat16 7.8e-3):

* **Selections** (max, min, argmax indices) are exact: they only pick an input
  value, so there is no rounding to forgive.
* **Window reductions** (average, LP) forward: JAX's own forward test tolerances
  for float32, float16 and bfloat16 (1e-6, 1e-3, 1e-2). Two summation orders
  of a window of k elements differ by at most ``2 (k - 1) u`` of the window's
  absolute sum (u = eps / 2); for the batch's largest window (3x3) that is
  ``8 eps`` = 9.5e-7 in float32, under 1e-6. float16 and bfloat16 are summed in
  float32 and rounded once, so they move by at most one ulp (2**-10 and 2**-7
  relative), under 1e-3 and 1e-2. JAX's float64 1e-15 is *below* the 3x3
  bound (1.8e-15), so float64 gets 1e-13. ``atol`` equals ``rtol`` because the
  batch's inputs are of order one, where a mean near zero loses relative but
  not absolute accuracy.
* **Whole-map means** (global and adaptive pooling with large bins): the same
  reordering bound for up to 80 cells is ``2 * 79 u`` = 9.4e-6 in float32, so
  float32 gets 1e-5 and float64 1e-12; float16 and bfloat16 are still one
  rounding of a float32 sum (1e-3, 1e-2).
* **Window reductions on extreme magnitudes** use the same ``rtol`` with
  ``atol`` set to the dtype's smallest normal number: same-signed windows
  cannot cancel, so the error is relative, and below the smallest normal a
  float has no relative precision left.
* **Gradients** compare autodiff with autodiff, so only rounding differs. JAX's
  gradient column (float32 2e-3) is sized for finite-difference checks and
  would hide real drift. Measured against a float64 run of the same modules
  (average and LP, every batch configuration), our float32, float16 and
  bfloat16 gradients err by at most 0.35x the forward tolerance; two
  implementations can then differ by 0.7x. We use 4x the forward tolerance
  (float64 4e-13, float32 4e-6, float16 4e-3, bfloat16 4e-2).
* **Gates** (global mean over the map, two small matmuls, a sigmoid, a product)
  chain more operations than a window: 10x the window forward tolerance in
  float64 and float32, 5x in float16 and bfloat16; gradients 4x that, capped at
  JAX's gradient numbers (1e-2 float16, 1e-1 bfloat16).
* **User models** (the pytest fixture's ``check``, kind ``model``) use the gate numbers
  unless the test passes ``rtol``/``atol``.
* **User gradients** (``check_grad``, kind ``gradient``): the loss is a forward result and
  gets the model's forward tolerance; each gradient leaf compares autodiff with autodiff.
  A backward pass repeats every reduction of the forward pass with the same length (a
  convolution's kernel gradient sums over the batch and the map, its input gradient over
  the output channels and the window), so it carries the forward's rounding and as much
  again: twice the forward's bound, the budget of the gate's forward (51 eps) doubled, 102
  eps = 1.2e-5 in float32. The tolerance is the gate gradient's, 4x the forward tolerance
  (float32 4e-5, float64 4e-12), capped at JAX's gradient-check numbers (float16 1e-2,
  bfloat16 1e-1); ``rtol``/``atol`` override it.
* **The scale of a user's arrays** (kinds ``model`` and ``gradient``, when the test passes
  no ``atol``). A fixed ``atol`` of 1e-5 is larger than every element of an array of size
  1e-7 (the logits of a randomly initialised network in eval mode are that small), so it
  would pass any change of them. The default ``atol`` of such an array follows the
  baseline's own magnitude ``S``::

    atol = min(fixed atol, SCALE_ULPS * eps * S),   SCALE_ULPS = 1024

  ``S`` is the largest finite ``|x|`` of the baseline array; for a gradient leaf, at least
  1/8 (:data:`MODULE_SHARE`) of the largest over its module's leaves, because rounding is
  relative to the sum of ``|terms|`` of a reduction, not to ``|result|``: the gradient of a
  bias in front of a train-mode BatchNorm is 0 in exact arithmetic, and float32 leaves
  rounding noise of its terms' size, which its kernel's gradient measures. ``rtol`` keeps
  its per-dtype value. The rule is measured, not derived (``python -m
  benchmarks.tolerance_scale``): float32 against float64, eager against jit and the batch
  split in two, for the logits and every gradient leaf of ``tests/_effnet.py`` (0.12 M and
  4.0 M parameters), ``tests/_resnet.py`` (34 k and 8.0 M) and a three-layer CNN whose
  convolutions have a bias before a BatchNorm, in units of ``eps * S``. In eval mode the
  worst array moved by 22 (a margin of 46x under 1024); in train mode with BatchNorm over
  enough numbers (the 8 M ResNet on 2x64x64 images, the CNN on 16x32x32) by 155 (6.6x),
  the zero-in-exact-arithmetic biases by 89 (11x). A 5% change moves the largest element
  by ``0.05 S`` = 420,000 ``eps * S``, 410x the tolerance. Not covered: a train-mode
  BatchNorm that normalises over a handful of numbers per channel (a batch of 2 on 1x1 or
  2x2 maps) is ill-conditioned, and float32 itself moves its model's results by 3,500 to
  2e7 ``eps * S`` (up to 2% of the gradients and 80% of the logits of the 4 M
  EfficientNet on 2x32x32): the fixed tolerance fails most of those too; check such a
  model in eval mode or on larger inputs. Where ``S`` is 0 or subnormal (an all-zero
  array) there is no scale: ``atol`` is floored at ``SCALE_ULPS * eps`` times the dtype's
  smallest normal number, so the array must stay (almost) exactly zero, and recording it
  warns, naming the array. The scale and the rule are written into the baseline with each
  tolerance (``Tolerance.scale``, ``reason``); a comparison takes ``S`` from the baseline's
  array, never from the new result.
* **The scale of a user's arrays in float16 and bfloat16.** 1024 eps is 8 S in bfloat16 and
  1.0 S in float16, and the fixed ``rtol`` (bfloat16 5e-2) alone passes a 5% change, so
  low precision has its own rule, measured the same way (``python -m
  benchmarks.tolerance_lowp``: eval mode, the logits, the map before the head's pool, the
  loss and every gradient leaf of ``tests/_effnet.py`` (0.12 M and 4.0 M parameters),
  ``tests/_resnet.py`` (34 k and 8.0 M) and a six-layer CNN, cast to the dtype; jit against
  eager, the batch split in two, the head's pool and the first convolution's sum in another
  order, jax 0.10.2 against 0.9.2, and the dtype against float32 on the same numbers)::

    rtol = 0,   atol = ulps * eps * S   (no fixed cap)   LOW_PRECISION_ULPS:
    bfloat16: 4 forward (outputs, the loss), 48 gradient;  float16: 16 and 128

  Forward results moved by at most 1.11 eps S between two runs in the dtype (bfloat16;
  float16 0.94) and 2.36 (float16 1.54) against float32: bfloat16's 4 leaves 3.6x and 1.7x,
  float16's 16 leaves 17x and 10x. A 5% change moves the largest element by 0.05 S, 6.4 eps
  S in bfloat16 and 51 in float16 (rounding the new value takes at most half an eps off),
  1.5x and 3.2x the tolerance: bfloat16 catches any change of the largest element over 4 eps
  = 3.1% of S, float16 over 1.6%. Gradient leaves are sums of many terms that XLA's CPU
  reductions add partly in the dtype itself, so their rounding is a fraction of ``S``: two
  runs in the dtype differed by up to 22 eps S in bfloat16 (the batch split, a BatchNorm
  scale's gradient) and 45 in float16 (the input's channels reversed), and the dtype
  against float32 by 65 and 694 (0.5 and 0.7 S). A 5% change (6.4 and 51 eps S) cannot be
  told from that rounding, per element or by the relative norm of the difference (rounding
  moved that by up to 16 and 46 eps, a 5% change by 6.4 and 51): the gradient rule, 48 and
  128 eps S (3/8 and 1/8 of S), leaves 2.2x and 2.9x over the runs in the dtype and catches a
  zeroed (2.7x and 8x) or negated leaf, not a 5% change; it does not cover the float32
  comparison, so a release that summed these gradients in float32 would fail them. Below the
  smallest normal number (float16's 6.1e-5) ``S`` is floored there, as above.
* **Integers and bools** are always exact.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

Role = Literal["output", "indices", "grad_input", "grad_params"]
ROLES: tuple[str, ...] = ("output", "indices", "grad_input", "grad_params")

# Kinds of tolerance a case may declare; see the module docstring.
KINDS: tuple[str, ...] = (
    "select", "select_ties", "exact_sum", "window", "window_rel", "global", "gate", "model",
    "gradient",
)

_FLOATS = ("float64", "float32", "float16", "bfloat16")

# The forward rtol (= atol) of each family of reductions, one per dtype of _FLOATS.
_FORWARD = {
    "window": (1e-13, 1e-6, 1e-3, 1e-2),
    "global": (1e-12, 1e-5, 1e-3, 1e-2),
    "gate": (1e-12, 1e-5, 5e-3, 5e-2),
}
# A gradient's: this many times its forward's, at most JAX's own gradient-check tolerance
# (jax._src.public_test_util.default_gradient_tolerance, per dtype of _FLOATS), which only
# the gates' float16 and bfloat16 reach.
_GRADIENT_FACTOR = 4
_JAX_GRADIENT = (1e-5, 2e-3, 1e-2, 1e-1)
# The default atol of a user's array is at most this many eps of its scale (the module
# docstring says how it was measured).
SCALE_ULPS = 1024
# In float16 and bfloat16 it is this many eps of its scale, (forward, gradient), with rtol 0
# and no fixed cap (the module docstring: the fixed numbers pass a 5% change there).
LOW_PRECISION_ULPS = {"float16": (16, 128), "bfloat16": (4, 48)}
# A gradient leaf's scale is at least the largest of its module's leaves over this.
MODULE_SHARE = 8
# The kinds whose default atol follows the baseline's scale: a user's model and gradient.
SCALED_KINDS = ("model", "gradient")
# Each kind's family, and the reasons of its (forward, gradient) tolerances.
_FAMILY = {
    "window": ("window", "window_fwd", "window_grad"),
    "window_rel": ("window", "window_rel", "window_grad"),
    "exact_sum": ("window", "exact_sum", "window_grad"),
    "global": ("global", "global_fwd", "global_grad"),
    "gate": ("gate", "gate_fwd", "gate_grad"),
    "model": ("gate", "model_fwd", "model_grad"),
    "gradient": ("gate", "loss_fwd", "gradient"),
}

_REASONS = {
    "exact_select": "exact: max/min select an input value, there is no rounding",
    "exact_indices": "exact: indices are integers",
    "exact_int": "exact: integer and bool results have no rounding",
    "exact_sum": (
        "exact: integer-valued inputs sum exactly in any order, so an average is "
        "one correctly rounded division"
    ),
    "ties": (
        "sum per (sample, channel), exact: the input has ties, and which tied element "
        "gets the gradient is implementation-specific"
    ),
    "window_fwd": (
        "window average/LP forward: JAX's forward tolerance for this dtype; covers "
        "reordering a 3x3 window sum (8 eps in float32) and one rounding of a "
        "float32-accumulated low-precision result"
    ),
    "global_fwd": (
        "mean over a whole map or a large bin: reordering up to 80 float32 terms "
        "(9.4e-6), one rounding of a float32 sum in float16/bfloat16"
    ),
    "global_grad": "mean gradient: 4x the forward tolerance, as for windows",
    "window_rel": (
        "window forward on extreme magnitudes: relative only (same-signed windows "
        "cannot cancel), atol = smallest normal"
    ),
    "window_grad": (
        "window gradient: autodiff vs autodiff, 4x the forward tolerance (measured "
        "error against float64 is at most 0.35x forward)"
    ),
    "gate_fwd": (
        "gate forward: global mean, two matmuls, sigmoid and product; 10x the "
        "window tolerance in float32/64, 5x in float16/bfloat16"
    ),
    "gate_grad": "gate gradient: 4x the gate forward, capped at JAX's gradient tolerance",
    "model_fwd": "user model forward: the gate tolerance for this dtype (override with rtol/atol)",
    "model_grad": "user model gradient: the gate gradient tolerance for this dtype",
    "loss_fwd": "loss of check_grad: the user model forward tolerance for this dtype",
    "gradient": (
        "gradient of check_grad: autodiff vs autodiff; the backward pass repeats the forward's "
        "reductions, twice the forward's rounding; 4x the forward tolerance, capped at JAX's "
        "gradient tolerance"
    ),
    "low_model_fwd": (
        "user model forward in low precision: rtol 0, atol a few eps of the array's scale, over "
        "the rounding measured there and under a 5% change (override with rtol/atol)"
    ),
    "low_loss_fwd": "loss of check_grad: the user model forward's rule in low precision",
    "low_gradient": (
        "gradient of check_grad in low precision: rtol 0, atol over the rounding measured "
        "there (a sum of many terms in the dtype); it catches a changed sign or a zeroed leaf, "
        "not a 5% change"
    ),
    "user": "set by the test",
}


@dataclasses.dataclass(frozen=True)
class Tolerance:
  """How two arrays are compared, and why.

  Attributes:
    rule: ``"exact"`` (equal values), ``"allclose"`` (``atol + rtol * |expected|``)
      or ``"sum"`` (totals per sample and channel compared exactly).
    rtol: relative tolerance (0 unless ``rule == "allclose"``).
    atol: absolute tolerance (0 unless ``rule == "allclose"``).
    reason: one sentence saying why these numbers.
    scale: for a user's array whose ``atol`` follows its magnitude, the baseline's largest
      ``|x|`` it was scaled from (see the module docstring); None for a fixed ``atol``.
  """

  rule: Literal["exact", "allclose", "sum"]
  rtol: float = 0.0
  atol: float = 0.0
  reason: str = ""
  scale: float | None = None

  def __post_init__(self):
    if self.rule not in ("exact", "allclose", "sum"):
      raise ValueError(
          f"`rule` must be 'exact', 'allclose' or 'sum'; got {self.rule!r}."
      )
    if not (self.rtol >= 0 and self.atol >= 0):
      raise ValueError(
          f"`rtol` and `atol` must be non-negative; got rtol={self.rtol!r}, atol={self.atol!r}."
      )

  def describe(self) -> str:
    """A short label for tables, e.g. ``exact`` or ``rtol=1e-06 atol=1e-06``."""
    if self.rule == "allclose":
      return f"rtol={self.rtol:.0e} atol={self.atol:.0e}"
    return "exact" if self.rule == "exact" else "sum exact"

  def to_json(self) -> dict[str, Any]:
    """The JSON form stored in a manifest (``scale`` only where there is one)."""
    data = dataclasses.asdict(self)
    if self.scale is None:
      del data["scale"]
    return data

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Tolerance:
    """Reads the form written by :meth:`to_json`."""
    if not isinstance(data, Mapping):
      raise TypeError(f"`data` must be a mapping; got {type(data).__name__}.")
    scale = data.get("scale")
    return cls(
        rule=data["rule"], rtol=float(data["rtol"]), atol=float(data["atol"]),
        reason=str(data["reason"]), scale=None if scale is None else float(scale),
    )


EXACT = Tolerance("exact", reason=_REASONS["exact_int"])


def dtype_name(dtype) -> str:
  """The canonical name of a NumPy or ml_dtypes dtype, e.g. ``"bfloat16"``."""
  return np.dtype(dtype).name


def is_float(dtype) -> bool:
  """Whether ``dtype`` is a floating dtype (including bfloat16 and float16)."""
  dt = np.dtype(dtype)
  return np.issubdtype(dt, np.floating) or dt.name == "bfloat16"


def _rtol(family: str, dtype, *, grad: bool) -> float:
  """The forward or gradient rtol (= atol) of a family of reductions for a floating dtype."""
  name = dtype_name(dtype)
  # Other ml_dtypes floats (float8_*) are treated as the coarsest known float.
  i = _FLOATS.index(name if name in _FLOATS else "bfloat16")
  forward = _FORWARD[family][i]
  return min(_GRADIENT_FACTOR * forward, _JAX_GRADIENT[i]) if grad else forward


def _finfo(dtype):
  """``ml_dtypes.finfo``, imported on first use: importing ml_dtypes costs 0.5 s (``-X
  importtime``), which ``launch`` and ``--help`` need not pay (a JAX process has it already)."""
  import ml_dtypes

  return ml_dtypes.finfo(np.dtype(dtype))


def _tiny(dtype) -> float:
  return float(_finfo(dtype).tiny)


def tolerance_for(
    kind: str,
    role: str,
    dtype,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    scale: float | None = None,
) -> Tolerance:
  """Resolves the tolerance for one array.

  Args:
    kind: the case's kind of tolerance, one of :data:`KINDS`.
    role: the array's role, one of :data:`ROLES`.
    dtype: the array's dtype.
    rtol: overrides the relative tolerance of a floating result (user tests).
    atol: overrides the absolute tolerance of a floating result (user tests).
    scale: the baseline array's magnitude (:func:`scales`); for kinds ``model`` and
      ``gradient`` without ``atol``, the default ``atol`` follows it (the module docstring).

  Returns:
    The :class:`Tolerance`, with its reason.
  """
  if kind not in KINDS:
    raise ValueError(f"`kind` must be one of {KINDS}; got {kind!r}.")
  if role not in ROLES:
    raise ValueError(f"`role` must be one of {ROLES}; got {role!r}.")
  if role == "indices":
    return Tolerance("exact", reason=_REASONS["exact_indices"])
  if not is_float(dtype):
    return EXACT
  grad = role in ("grad_input", "grad_params")
  if kind in ("select", "select_ties"):
    if grad and kind == "select_ties":
      return Tolerance("sum", reason=_REASONS["ties"])
    # A max/min gradient scatters the (integer-valued) cotangent onto the selected
    # elements; small integers add exactly in any order.
    return Tolerance("exact", reason=_REASONS["exact_select"])
  family, forward_reason, gradient_reason = _FAMILY[kind]
  if kind == "exact_sum" and not grad:
    return Tolerance("exact", reason=_REASONS[forward_reason])
  value = _rtol(family, dtype, grad=grad)
  if kind == "window_rel" and not grad:
    return Tolerance("allclose", value, _tiny(dtype), _REASONS[forward_reason])
  reason = _REASONS[gradient_reason if grad else forward_reason]
  if kind not in SCALED_KINDS:
    return Tolerance("allclose", value, value, reason)
  if atol is not None:
    return Tolerance("allclose", value if rtol is None else float(rtol), float(atol),
                     _REASONS["user"])
  if scale is None:
    return Tolerance("allclose", value if rtol is None else float(rtol), value,
                     reason if rtol is None else _REASONS["user"])
  ulps, low = scale_ulps(dtype, grad=grad)
  if low:
    reason = _REASONS[("low_" + gradient_reason) if grad else "low_" + forward_reason]
  if rtol is not None:
    reason = f"{_REASONS['user']} (rtol); atol: {reason}"
  rtol = (0.0 if low else value) if rtol is None else float(rtol)
  cap = math.inf if low else value
  return Tolerance("allclose", rtol, *_scaled_atol(cap, ulps, float(scale), dtype, reason))


def scale_ulps(dtype, *, grad: bool) -> tuple[int, bool]:
  """``(ulps, low)``: a user's array's default ``atol`` is ``ulps * eps * S`` (at most the
  fixed ``atol`` unless ``low``), and ``low`` says the low-precision rule applies (``rtol``
  0, no fixed cap; float16, bfloat16 and the other ml_dtypes floats, which get bfloat16's)."""
  name = dtype_name(dtype)
  if name in ("float64", "float32"):
    return SCALE_ULPS, False
  return LOW_PRECISION_ULPS.get(name, LOW_PRECISION_ULPS["bfloat16"])[grad], True


def _scaled_atol(cap: float, ulps: int, scale: float, dtype, reason: str
                 ) -> tuple[float, str, float]:
  """``(atol, reason, scale)`` of an array of the given scale: see the module docstring."""
  eps = float(_finfo(dtype).eps)
  if not scale >= _tiny(dtype):  # 0, subnormal (or NaN: no finite element)
    atol = ulps * eps * _tiny(dtype)
    return atol, (f"{reason}; atol floored at {ulps} eps x the smallest normal "
                  f"({atol:.1e}): the baseline is all zero or subnormal, so it must stay so"), \
        (scale if scale == scale else 0.0)
  if math.isinf(cap):
    return ulps * eps * scale, (f"{reason}; atol = {ulps} eps x the baseline's max|x| "
                                f"{scale:.3g}"), scale
  atol = min(cap, ulps * eps * scale)
  return atol, (f"{reason}; atol = min({cap:.0e}, {ulps} eps x the baseline's max|x| "
                f"{scale:.3g})"), scale


def floored(tol: Tolerance, dtype) -> bool:
  """Whether ``tol`` was scaled from an array too small to scale from (all zero, subnormal)."""
  return tol.scale is not None and not tol.scale >= _tiny(dtype)


def scales(arrays: Mapping[str, np.ndarray]) -> dict[str, float]:
  """The scale of each of a user's floating arrays: its largest finite ``|x|``; for a
  gradient leaf (``grad/<module path>/<name>``), at least 1/:data:`MODULE_SHARE` of the
  largest over its module's leaves.

  Non-floating arrays are left out; an array without a finite element has scale 0.
  """
  own = {}
  for key, value in arrays.items():
    if not is_float(value.dtype):
      continue
    values = np.asarray(value, np.float64)
    finite = np.abs(values[np.isfinite(values)])
    own[key] = float(finite.max()) if finite.size else 0.0
  group: dict[str, float] = {}
  for key, value in own.items():
    if key.startswith("grad/"):
      module = key.rpartition("/")[0]
      group[module] = max(group.get(module, 0.0), value)
  return {key: max(value, group[key.rpartition("/")[0]] / MODULE_SHARE)
          if key.startswith("grad/") else value for key, value in own.items()}


def policy_table() -> list[dict[str, Any]]:
  """The per-dtype numbers, for documentation and ``info``: each family's forward and
  gradient tolerance, and the scaled rule of a user's arrays (kinds ``model`` and
  ``gradient``): ``atol = scaled_ulps * eps * S``, capped at the fixed number where
  ``scaled_cap``, with ``rtol`` 0 where it is not."""
  return [
      {"dtype": name, **{f"{family}_{what}": _rtol(family, name, grad=what == "gradient")
                         for family in _FORWARD for what in ("forward", "gradient")},
       **{f"scaled_ulps_{what}": scale_ulps(name, grad=what == "gradient")[0]
          for what in ("forward", "gradient")},
       "scaled_cap": not scale_ulps(name, grad=False)[1]}
      for name in _FLOATS
  ]
