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

The defaults below come from XLA:CPU and one NVIDIA H200 (docs/benchmarks.md): on
the GPU neither implementation was faster, so every backend uses ``"taps"``, whose
semantics are the tested ones. :data:`IMPLEMENTATION_DEFAULTS` is a read-only view of them; change a
backend's default with :func:`set_default_implementation`, or the choice for a
block of code with :func:`use_implementation`, which holds for the thread (or
asyncio task) that enters it and no other.
"""

from __future__ import annotations

import contextlib
import contextvars
import types
from collections.abc import Iterator, Mapping

import jax

IMPLEMENTATIONS = ("taps", "xla")

# Keyed by jax.default_backend(). Backends not listed use "taps".
_DEFAULTS: dict[str, str] = {"cpu": "taps", "gpu": "taps", "tpu": "taps"}
IMPLEMENTATION_DEFAULTS: Mapping[str, str] = types.MappingProxyType(_DEFAULTS)

# The innermost use_implementation block of this thread (or task); None outside any.
_override: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "nnx_pool_implementation", default=None)


def _check(name, argument: str = "implementation") -> str:
  if not isinstance(name, str) or name not in IMPLEMENTATIONS:
    raise ValueError(f"`{argument}` must be one of {IMPLEMENTATIONS}; got {name!r}.")
  return name


def current_implementation() -> str:
  """The formulation the kernels use now: the innermost override, else this backend's default."""
  override = _override.get()
  if override is not None:
    return override
  return _check(IMPLEMENTATION_DEFAULTS.get(jax.default_backend(), "taps"))


def set_default_implementation(backend: str, implementation: str) -> None:
  """Makes ``implementation`` (``"taps"`` or ``"xla"``) the default of a JAX backend.

  ``backend`` is a name as :func:`jax.default_backend` gives it (``"cpu"``,
  ``"gpu"``, ``"tpu"``, or a plugin's). The change holds for every thread, for
  functions traced after it; :func:`use_implementation` still overrides it for a
  block of code.

  Example usage::

    >>> import nnx_pool
    >>> nnx_pool.set_default_implementation("gpu", "xla")
    >>> nnx_pool.IMPLEMENTATION_DEFAULTS["gpu"]
    'xla'
    >>> nnx_pool.set_default_implementation("gpu", "taps")  # back to the shipped default
  """
  if not isinstance(backend, str) or not backend:
    raise TypeError(
        "`backend` must be a JAX backend's name as jax.default_backend() gives it, e.g. "
        f"'cpu', 'gpu' or 'tpu'; got {backend!r}.")
  _DEFAULTS[backend] = _check(implementation)


@contextlib.contextmanager
def use_implementation(name: str) -> Iterator[None]:
  """Runs the window kernels traced inside the block with ``name`` (``"taps"`` or ``"xla"``).

  The choice is made when a function is traced: a function jitted inside the block
  keeps it when called later. It holds for the thread (or asyncio task) that enters
  the block; other threads keep theirs.

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
  token = _override.set(_check(name))
  try:
    yield
  finally:
    _override.reset(token)
