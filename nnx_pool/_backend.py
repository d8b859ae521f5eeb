"""Which formulation the window kernels use, per JAX backend: one table and one override.

Two formulations of the same window sums and maxima:

* ``"taps"``: the kernels of :mod:`nnx_pool._taps`, one strided view per window
  tap fused into one loop, with the phase-scatter adjoints. Tuned and measured on
  XLA:CPU (docs/benchmarks.md), and the reference for every semantic rule.
* ``"xla"``: XLA's own ``reduce_window`` for the forward, differentiated by JAX
  (``select_and_scatter`` for a max), which GPU and TPU compilers lower natively.

Both give the same values. Where they may differ (docs/benchmarks.md, "Backends"):
sums are added in another order (a few ULPs on float data, bit-equal on
integer-valued data); a max or min over a window holding NaN gives NaN in both,
but ``"xla"`` may send its gradient to another cell than PyTorch's last NaN; and
``return_indices=True`` and a dilated max or min always run ``"taps"`` (only the
taps compute window offsets, and JAX has no gradient for a dilated
``reduce_window`` max). Adaptive and global pools always use their own kernels.
On ties both send the gradient to the first extremum (tested on CPU).

The defaults below were chosen from measurements on XLA:CPU only: until a GPU or
TPU run says otherwise, every backend uses ``"taps"``, whose semantics are the
tested ones. Change a default by assigning to :data:`IMPLEMENTATION_DEFAULTS`, or
for a block of code with :func:`use_implementation`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax

IMPLEMENTATIONS = ("taps", "xla")

# Keyed by jax.default_backend(). Backends not listed use "taps".
IMPLEMENTATION_DEFAULTS: dict[str, str] = {"cpu": "taps", "gpu": "taps", "tpu": "taps"}

_override: list[str] = []


def _check(name) -> str:
  if name not in IMPLEMENTATIONS:
    raise ValueError(f"`implementation` must be one of {IMPLEMENTATIONS}; got {name!r}.")
  return name


def current_implementation() -> str:
  """The formulation the kernels use now: the innermost override, else this backend's default."""
  if _override:
    return _override[-1]
  return _check(IMPLEMENTATION_DEFAULTS.get(jax.default_backend(), "taps"))


@contextlib.contextmanager
def use_implementation(name: str) -> Iterator[None]:
  """Runs the window kernels traced inside the block with ``name`` (``"taps"`` or ``"xla"``).

  The choice is made when a function is traced: a function jitted inside the block
  keeps it when called later.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import MaxPool, use_implementation
    >>> x = jnp.arange(16.0).reshape(1, 4, 4, 1)
    >>> with use_implementation("xla"):
    ...   y = MaxPool(2)(x)
    >>> y[0, ..., 0]
    Array([[ 5.,  7.],
           [13., 15.]], dtype=float32)
  """
  _override.append(_check(name))
  try:
    yield
  finally:
    _override.pop()
