"""Modules built from shapes and NumPy values, for tests where the initialisation is not the point.

A Flax initialiser run eagerly compiles for every new parameter shape (``truncated_normal``,
the ``nnx.Linear`` default, about 0.3 s of CPU a shape on the 2-core machine, measured
with tests/test_robustness.py, where it took 8 of its 50 s). ``nnx.eval_shape`` builds the
module from shapes alone, so nothing compiles, and NumPy fills in the values. The
constructor's own checks run as they do eagerly: a refused argument raises the same error.

Loaded by path (``runpy.run_path``): tests/ is not a package, and a plain ``import _cheap``
would read as a third-party distribution to tests/test_dependencies.py.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx


def build(cls, *args, seed: int = 0, stats: tuple[float, float] | None = None, **kwargs):
  """``cls(*args, **kwargs, rngs=nnx.Rngs(0))`` with seeded uniform(-1, 1) parameters.

  Args:
    cls: the module class (or any callable that takes ``rngs``).
    *args: its positional arguments.
    seed: the NumPy seed of the values.
    stats: the other variables (BatchNorm's statistics) uniform in ``[low, high]``,
      drawn after the parameters; None: ones.
    **kwargs: its keyword arguments.
  """
  graphdef, params, rest = nnx.split(
      nnx.eval_shape(lambda: cls(*args, rngs=nnx.Rngs(0), **kwargs)), nnx.Param, ...)
  rng = np.random.default_rng(seed)
  # Cast by NumPy and placed as they are: jnp.asarray(float64, float32) and jnp.ones compile
  # a conversion or a broadcast for every new shape.
  params = jax.tree.map(lambda s: _put(rng.uniform(-1, 1, s.shape), s.dtype), params)
  if stats is None:
    rest = jax.tree.map(lambda s: _put(np.ones(s.shape), s.dtype), rest)
  else:
    rest = jax.tree.map(lambda s: _put(rng.uniform(*stats, s.shape), s.dtype), rest)
  return nnx.merge(graphdef, params, rest)


def _put(values: np.ndarray, dtype) -> jax.Array:
  return jax.device_put(values.astype(np.dtype(dtype)))
