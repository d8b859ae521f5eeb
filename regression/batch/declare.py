"""How a regression case is declared: :class:`Case`, its constructor :func:`call`, a batch.

A :class:`Case` is a small record: a name, a zero-argument factory that builds
the module (or a plain function), the name of a stored input
(:data:`nnx_pool.regression.batch.inputs.INPUTS`), a dtype, the kind of tolerance
(:data:`nnx_pool.regression.tolerance.KINDS`), whether the module returns indices,
whether it has parameters, and, for a deliberately bad input, the error it
must raise. A module's constructor call is spelled with :func:`call`, apart from
the case's own fields, so a constructor argument never collides with a
:class:`Case` field (a module's own ``dtype`` reaches its constructor).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from flax import nnx

from ..compare.tolerance import KINDS
from ..constants import NAME
from .inputs import INPUTS


@dataclasses.dataclass(frozen=True)
class ErrorSpec:
  """The error a case must raise: an exception type name and a message regex.

  Attributes:
    type: the exception class name, e.g. ``"ValueError"``.
    pattern: a regular expression searched for in the message.
  """

  type: str
  pattern: str


# The fields of a Case that its declaration holds as they are (besides its tolerance kind and
# the error it raises): a change to any of them makes the case STALE, except to `note`.
_DECLARED = ("module", "config", "input", "dtype", "indices", "params", "grad", "note")


@dataclasses.dataclass(frozen=True)
class Case:
  """One regression case.

  Attributes:
    name: a unique name (letters, digits, ``_.-``).
    build: a zero-argument factory returning an ``nnx.Module`` or a function
      of one array.
    input: the name of an input in :data:`nnx_pool.regression.batch.inputs.INPUTS`.
    dtype: the input's dtype name (default ``"float32"``).
    tolerance: the kind of tolerance, one of :data:`nnx_pool.regression.tolerance.KINDS`.
    indices: the module returns ``(values, indices)`` (default False).
    params: the module has ``nnx.Param`` weights, stored in the baseline and
      differentiated (default False).
    grad: record the gradient for a fixed cotangent (default True; always off
      for integer dtypes and error cases).
    raises: the error a deliberately bad input must raise (default None).
    module: the public name of the module under test, for reports.
    config: a readable constructor call, for reports.
    note: why an option is off, or what the case pins.
  """

  name: str
  build: Callable[[], Any]
  input: str
  dtype: str = "float32"
  tolerance: str = "window"
  indices: bool = False
  params: bool = False
  grad: bool = True
  raises: ErrorSpec | None = None
  module: str = ""
  config: str = ""
  note: str = ""

  def __post_init__(self):
    if not isinstance(self.name, str) or not NAME.match(self.name):
      raise ValueError(f"`name` must be letters, digits and _.- only; got {self.name!r}.")
    if not callable(self.build):
      raise TypeError(f"`build` must be a zero-argument callable; got {self.build!r}.")
    if self.input not in INPUTS:
      raise ValueError(f"`input` must be one of {sorted(INPUTS)}; got {self.input!r}.")
    if self.tolerance not in KINDS:
      raise ValueError(f"`tolerance` must be one of {KINDS}; got {self.tolerance!r}.")
    if self.raises is not None and not isinstance(self.raises, ErrorSpec):
      raise TypeError(f"`raises` must be an ErrorSpec or None; got {self.raises!r}.")

  def describe(self) -> dict[str, Any]:
    """The case's declaration as JSON, stored in the manifest to detect edits."""
    declaration = {field: getattr(self, field) for field in _DECLARED}
    declaration["tolerance_kind"] = self.tolerance
    declaration["raises"] = dataclasses.asdict(self.raises) if self.raises else None
    return declaration


# Public namespaces that re-export functions defined in private modules.
_PUBLIC = {"jax.nn": jax.nn, "jax.numpy": jax.numpy, "flax.nnx": nnx}


def _show(value: Any) -> str:
  """A stable spelling of a constructor argument: functions by name, not by address.

  A function defined in a private module (``jax._src...``) is named by its public
  alias, so that a move inside the library does not read as a changed declaration.
  """
  if callable(value) and hasattr(value, "__qualname__"):
    for prefix, namespace in _PUBLIC.items():
      if getattr(namespace, value.__qualname__, None) is value:
        return f"{prefix}.{value.__qualname__}"
    return f"{getattr(value, '__module__', '')}.{value.__qualname__}".lstrip(".")
  return repr(value)


@dataclasses.dataclass(frozen=True)
class Call:
  """A constructor call, ``cls(*args, **kwargs)``, made when the case runs.

  Attributes:
    cls: the module class (or any factory).
    args: its positional arguments.
    kwargs: its keyword arguments.
    rngs: also pass ``rngs=nnx.Rngs(0)`` (modules with parameters).
  """

  cls: Callable[..., Any]
  args: tuple = ()
  kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  rngs: bool = False

  def __call__(self) -> Any:
    if self.rngs:
      return self.cls(*self.args, **self.kwargs, rngs=nnx.Rngs(0))
    return self.cls(*self.args, **self.kwargs)

  def describe(self) -> str:
    """``MaxPool((2, 2), return_indices=True)``, for reports and the manifest."""
    shown = [_show(a) for a in self.args] + [f"{k}={_show(v)}" for k, v in self.kwargs.items()]
    if self.rngs:
      shown.append("rngs=nnx.Rngs(0)")
    return f"{self.cls.__name__}({', '.join(shown)})"


def call(cls: Callable[..., Any], *args: Any, **kwargs: Any) -> Call:
  """Spells the constructor call ``cls(*args, **kwargs)`` of a case."""
  return Call(cls, args, dict(kwargs))


def case(name: str, ctor: Call, *, input: str, rngs: bool | None = None, **fields: Any) -> Case:
  """Builds a :class:`Case` that runs the module ``ctor`` makes.

  Args:
    name: the case name.
    ctor: the constructor call, from :func:`call`.
    input: the stored input's name.
    rngs: pass ``rngs=nnx.Rngs(0)`` to the constructor (default None: when
      ``params=True``); False for a module whose parameters start from its
      arguments and take no ``rngs`` (GeMPool's ``p``).
    **fields: other :class:`Case` fields (``dtype``, ``tolerance``, ``indices``,
      ``params``, ``grad``, ``raises``, ``note``).

  Raises:
    TypeError: ``ctor`` is not a :class:`Call`, or a field is not a Case field.
  """
  if not isinstance(ctor, Call):
    raise TypeError(f"`ctor` must be a call(cls, *args, **kwargs); got {ctor!r}.")
  ctor = dataclasses.replace(ctor, rngs=bool(fields.get("params")) if rngs is None else rngs)
  return Case(name=name, build=ctor, input=input, module=ctor.cls.__name__,
              config=ctor.describe(), **fields)


@dataclasses.dataclass
class Batch:
  """The cases to run, plus what could not be covered and why.

  Attributes:
    cases: the cases, in order.
    notes: lines for reports: skipped builders, uncovered public modules.
  """

  cases: list[Case]
  notes: list[str] = dataclasses.field(default_factory=list)


# How -k selects a case, for the commands' help and messages.
MATCH_RULE = ("a case is selected when its name contains PATTERN, as pytest's -k matches a "
              "word (-k avg_ also selects global_avg_batch), or matches it as a glob "
              "(-k 'avg_*': the names that start with avg_)")


def select(cases: Sequence[Case], pattern: str | None) -> list[Case]:
  """Keeps the cases whose name contains ``pattern`` or matches it as a glob."""
  if not pattern:
    return list(cases)
  return [c for c in cases if matches(c.name, pattern)]


def matches(name: str, pattern: str | None) -> bool:
  """Whether ``name`` is selected by ``pattern`` (substring or glob; None selects all).

  A substring, as pytest's ``-k`` matches a word, so ``avg_`` selects ``global_avg_batch``
  too; a glob is matched against the whole name, so ``avg_*`` selects only the names that
  start with ``avg_`` (:data:`MATCH_RULE`).
  """
  return not pattern or pattern in name or fnmatch.fnmatchcase(name, pattern)


def selects_none(pattern: str | None, names: Sequence[str]) -> str | None:
  """The one line refusing a ``-k`` that selects none of ``names``; None when it selects one.

  The line counts the names, offers the nearest ones where a typo is likely, and states
  the rule (:data:`MATCH_RULE`).
  """
  if not pattern or any(matches(name, pattern) for name in names):
    return None
  near = difflib.get_close_matches(pattern, names, n=3, cutoff=0.85)
  hint = f" (the nearest: {', '.join(near)})" if near else ""
  return f"-k {pattern!r} selects none of the {len(names)} cases{hint}; {MATCH_RULE}."
