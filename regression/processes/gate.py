"""The point before a check's first collective, where the processes must agree first.

The guard sets a gate around a check's run (:func:`gated`); the pipeline calls
:func:`before_collective` after compiling and before running the compiled program, and
before gathering an array that spans processes. The first call passes the gate (the
agreement of :mod:`~nnx_pool.regression.processes.group`), later ones do nothing, so that a
process that failed while tracing tells the others before any of them waits in a
collective. With no gate set (one process) it does nothing. Imports nothing from JAX.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator


class _Gate:
  def __init__(self, agree: Callable[[str | None], object]):
    self._agree = agree
    self.passed = False

  def __call__(self, error: str | None = None) -> None:
    """Agrees, once: ``error`` is what stopped this process before the gate (None: nothing)."""
    if not self.passed:
      self.passed = True  # set first: a failed agreement is not tried again
      self._agree(error)


_CURRENT: contextvars.ContextVar[_Gate | None] = contextvars.ContextVar(
    "nnx_regression_gate", default=None)


def before_collective() -> None:
  """Passes the current check's gate, if one is set and not passed yet."""
  gate = _CURRENT.get()
  if gate is not None:
    gate()


@contextlib.contextmanager
def gated(agree: Callable[[str | None], object]) -> Iterator[_Gate]:
  """Sets a gate that calls ``agree(None)`` once, before the first collective of the block
  (or ``agree(error)``, called by the block's owner when it failed before); the gate's
  ``passed`` says whether it was called."""
  gate = _Gate(agree)
  token = _CURRENT.set(gate)
  try:
    yield gate
  finally:
    _CURRENT.reset(token)
