"""The window pools' one implementation: what their functions and modules run on an input.

Each ``run_*`` checks and batches the input (:func:`nnx_pool._layout.prepare`), resolves the
window over it (:class:`nnx_pool._geometry.Window`, with the ways out where it does not fit)
and runs one compiled kernel: the window sums and selects of the taps
(:mod:`nnx_pool._separable`), or with the ``"xla"`` implementation (:mod:`nnx_pool._backend`)
XLA's ``reduce_window``. The averages divide by PyTorch's border divisors, computed from the
geometry; float16 and bfloat16 inputs are summed in float32 and rounded once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._backend import current_implementation
from ._geometry import Geometry, Window, check_padded_size
from ._jit import kernel
from ._layout import check_plane_indexable, prepare, unbatch
from ._numerics import accumulation_dtype, true_divide
from ._select import Kind, flat_indices, identity
from ._separable import select, window_sum


def _spatial(divisor: np.ndarray) -> np.ndarray:
  """A divisor of shape ``out_shape`` as ``(1, *out_shape, 1)``, to broadcast over N and C."""
  return divisor.reshape(1, *divisor.shape, 1) if divisor.ndim else divisor


# Each call runs one kernel (one jit, see nnx_pool._jit): the arithmetic around the
# window reductions is compiled with them, so an eager call is one dispatch.


def _reduce_window(x, geom: Geometry, init, op) -> jax.Array:
  """XLA's ``reduce_window`` over the windows of ``geom`` (the ``"xla"`` implementation)."""
  one = (1,)
  return lax.reduce_window(
      x, np.asarray(init, x.dtype), op, one + geom.window + one,
      one + tuple(d.stride for d in geom.dims) + one, ((0, 0), *geom.pads, (0, 0)),
      window_dilation=one + tuple(d.dilation for d in geom.dims) + one)


def _window_sum(x, geom: Geometry, implementation: str) -> jax.Array:
  """Sum of every window: the taps, or with ``"xla"`` XLA's ``reduce_window`` (_backend)."""
  if implementation == "xla":
    return _reduce_window(x, geom, 0, lax.add)
  return window_sum(x, geom)


@kernel(static_argnums=(1, 2, 3, 4))
def window_average(x, geom, count_include_pad: bool, divisor_override, implementation: str):
  total = _window_sum(x.astype(accumulation_dtype(x.dtype)), geom, implementation)
  if divisor_override is not None:
    divisor = np.asarray(divisor_override)
  else:
    divisor = geom.divisor(count_include_pad=count_include_pad)
  return true_divide(total, _spatial(divisor)).astype(x.dtype)


@kernel(static_argnums=(1, 2, 3, 4))
def window_extremum(x, geom, kind: Kind, return_indices: bool, implementation: str):
  if implementation == "xla" and not return_indices and all(d.dilation == 1 for d in geom.dims):
    # XLA's own max (min), differentiated by JAX. JAX has no gradient for a dilated one,
    # and only the taps compute window offsets, so those stay on the taps.
    return _reduce_window(x, geom, identity(x.dtype, kind), lax.max if kind == "max" else lax.min)
  values, arg = select(x, geom, kind, return_indices)
  return (values, flat_indices(arg, geom)) if return_indices else values


@kernel(static_argnums=(1, 2, 3, 4))
def window_lp_norm(x, geom, norm_type: float, size: int, implementation: str):
  p = norm_type
  xa = x.astype(accumulation_dtype(x.dtype))
  powered = lax.integer_pow(xa, int(p)) if p.is_integer() else jnp.power(xa, p)
  # PyTorch: avg_pool(x**p) * prod(window), so partial windows scale by k / cells.
  cells = _spatial(geom.divisor(count_include_pad=True))
  mean = true_divide(_window_sum(powered, geom, implementation), cells)
  return jnp.power(mean * float(size), 1.0 / p).astype(x.dtype)


# The adaptive pool that fits any input, named where a window does not fit.
_ADAPTIVE = {"avg": {"AvgPool": "AdaptiveAvgPool", "avg_pool": "adaptive_avg_pool"},
             "max": {"MaxPool": "AdaptiveMaxPool", "max_pool": "adaptive_max_pool"},
             "min": {}}


def _resolve(window: Window, x: jax.Array, name: str, **ways) -> Geometry:
  """``window`` over the batched ``x`` (:meth:`Window.resolve`, ``ways`` its ways out), refusing
  a padded input too large for XLA to size."""
  geom = window.resolve(x.shape[1:-1], name, **ways)
  check_padded_size(
      x.shape, geom.pads, window.describe(name),
      "Pass less `padding` (at most half the dilated window is allowed, so a large `dilation` "
      "or window admits a large one).")
  return geom


def run_average(inputs, window: Window, count_include_pad: bool, divisor_override, in_features,
                name, owner=None):
  x, batch = prepare(inputs, window.ndim, kind="float", module=name, in_features=in_features,
                     owner=owner)
  geom = _resolve(window, x, name, adaptive=_ADAPTIVE["avg"].get(name))
  y = window_average(x, geom, count_include_pad, divisor_override, current_implementation())
  return unbatch(y, batch)


def run_extremum(inputs, window: Window, kind: Kind, return_indices: bool, in_features,
                 name, owner=None):
  x, batch = prepare(inputs, window.ndim, kind="ordered", module=name, in_features=in_features,
                     owner=owner)
  if return_indices:
    check_plane_indexable(
        x.shape[1:-1], name, " Pool without return_indices, or tile the map.")
  geom = _resolve(window, x, name, adaptive=_ADAPTIVE[kind].get(name))
  return unbatch(window_extremum(x, geom, kind, return_indices, current_implementation()), batch)


def run_lp_norm(inputs, window: Window, norm_type: float, in_features, name, owner=None):
  x, batch = prepare(inputs, window.ndim, kind="float", module=name, in_features=in_features,
                     owner=owner)
  geom = _resolve(window, x, name, takes_padding=False)
  y = window_lp_norm(x, geom, norm_type, window.size, current_implementation())
  return unbatch(y, batch)
