"""Generalized global pools between the mean and the max: GeM and log-sum-exp, channels-last.

* :class:`GeMPool` (:func:`gem_pool`): the generalized mean
  ``(mean over space of max(x, eps)^p)^(1/p)`` of Radenović, Tolias and Chum,
  "Fine-tuning CNN Image Retrieval with No Human Annotation", TPAMI 2018,
  https://arxiv.org/abs/1711.02512, as their cnnimageretrieval-pytorch ``GeM``
  computes it: ``avg_pool2d(x.clamp(min=eps).pow(p), (H, W)).pow(1. / p)`` with
  ``p`` a learnable ``(1,)`` parameter. ``p = 1`` is the mean; as ``p`` grows
  it tends to the max.
* :class:`LsePlusPool` (:func:`lse_plus_pool`): timm's ``LsePlus2d``
  (timm 1.0.31 ``timm/layers/other_pool.py``),
  ``x_max + log(mean over space of exp(r (x - x_max))) / r`` with ``r`` a
  learnable scalar: the mean as ``r`` tends to 0, the max as it grows.

Inputs are ``(*batch, *spatial, C)``, usually ``(N, *spatial, C)``;
``num_spatial_dims`` (default 2) says how many axes lie before the channels,
and every axis before them is a batch axis. The output is ``(*batch, C)``
(``flatten=True``, the default, as timm) or ``(*batch, 1, ..., 1, C)``.

Float16 and bfloat16 inputs are computed in float32 (the powers, the
exponentials and their sums) and the result is rounded once to the input's
dtype; wider parameters widen the computation (float64 ``x`` stays float64).
The mean's division is PyTorch's, correctly rounded
(:func:`nnx_pool._numerics.mean`). The max of :class:`LsePlusPool` is
PyTorch's ``adaptive_max_pool2d(x, 1)``: NaN propagates, and its gradient goes
to the first maximum, as timm's.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.typing import Dtype

from ._adaptive import adaptive_max
from ._args import check_bool, check_num_spatial_dims, check_number, flax_names
from ._jit import kernel
from ._layout import check_in_features, check_nonempty_spatial, prepare, unbatch
from ._numerics import accumulation_dtype, mean
from ._torch_keys import TORCH_KEYS
from ._torch_state import load

# ----------------------------------------------------------------------------
# Argument checks.
# ----------------------------------------------------------------------------


def _check_exponent(value, name: str):
  """A positive finite number (as a float), or a floating array of one element (as it is).

  An array is the parameter of a module (or a user's own ``nnx.Param``, read here),
  possibly traced, so its value is not checked.
  """
  if isinstance(value, nnx.Variable):
    value = value[...]
  if isinstance(value, (jax.Array, np.ndarray)):
    if value.size != 1 or not jnp.issubdtype(value.dtype, jnp.floating):
      raise TypeError(
          f"`{name}` must be a positive number or a floating array of one element (shape () "
          f"or (1,)); got an array of shape {value.shape} and dtype {value.dtype}.")
    return value
  return check_number(value, name, positive=True)


def _check_param_dtype(value) -> jnp.dtype:
  try:
    dtype = jnp.dtype(value)
  except TypeError:
    dtype = None
  if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(
        f"`param_dtype` must be a floating dtype such as jnp.float32; got {value!r}.")
  return dtype


# ----------------------------------------------------------------------------
# Kernels on batched (N, *spatial, C) arrays.
# ----------------------------------------------------------------------------


def _computation(x: jax.Array, parameter: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``x`` and the scalar ``parameter`` in the computation dtype: float32 at least, wider
  if either is (a Python number, weakly typed, does not widen it)."""
  dtype = jnp.result_type(accumulation_dtype(x.dtype), parameter)
  return x.astype(dtype), jnp.asarray(parameter, dtype).reshape(())


@kernel(static_argnums=2)
def generalized_mean(x: jax.Array, p, eps: float) -> jax.Array:
  """``(mean over space of max(x, eps)^p)^(1/p)`` of a batched float ``x``, ``(N, 1.., C)``.

  The clamp is PyTorch's ``clamp(min=eps)``: NaN stays NaN, and the gradient
  passes where ``x >= eps``.
  """
  xc, p = _computation(x, p)
  clamped = jnp.where(xc < eps, jnp.asarray(eps, xc.dtype), xc)
  powered_mean = mean(clamped ** p, range(1, x.ndim - 1))
  return (powered_mean ** (1 / p)).astype(x.dtype)


@kernel()
def log_mean_exp(x: jax.Array, r) -> jax.Array:
  """timm's ``x_max + (1 / r) * log(mean over space of exp(r (x - x_max)))``, ``(N, 1.., C)``."""
  xc, r = _computation(x, r)
  x_max = adaptive_max(xc, (1,) * (x.ndim - 2))
  mean_exp = mean(jnp.exp(r * (xc - x_max)), range(1, x.ndim - 1))
  return (x_max + (1 / r) * jnp.log(mean_exp)).astype(x.dtype)


def _pool(pooling, inputs, parameter, static: tuple, flatten: bool, num_spatial_dims: int,
          in_features, name: str, owner=None) -> jax.Array:
  x, batch = prepare(inputs, num_spatial_dims, kind="float", module=name,
                     in_features=in_features, owner=owner)
  check_nonempty_spatial(x, name)
  y = pooling(x, parameter, *static)
  if flatten:
    y = y.reshape(y.shape[0], y.shape[-1])
  return unbatch(y, batch)


# ----------------------------------------------------------------------------
# Functions: the one implementation, which the modules below call.
# ----------------------------------------------------------------------------


@flax_names
def gem_pool(inputs: jax.Array, p: float | jax.Array | nnx.Variable = 3.0, *,
             eps: float = 1e-6, flatten: bool = True, num_spatial_dims: int = 2,
             in_features: int | None = None) -> jax.Array:
  """Generalized mean over space, ``(mean of max(x, eps)^p)^(1/p)``: :class:`GeMPool`'s function.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import functional as F
    >>> x = jnp.array([1., 2., 3., 6.]).reshape(1, 2, 2, 1)  # (N, H, W, C)
    >>> F.gem_pool(x, 1.0), F.gem_pool(x, 2.0)  # the mean; the root mean square
    (Array([[3.]], dtype=float32), Array([[3.535534]], dtype=float32))

  Args:
    inputs: ``(*batch, *spatial, C)`` floats.
    p: the exponent, a positive number, or a floating array (or ``nnx.Param``) of one
      element, such as a learnable parameter (default 3.0).
    eps: inputs below this positive number are raised to it (default 1e-6).
    flatten: return ``(*batch, C)`` (default True), else ``(*batch, 1, ..., 1, C)``.
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3 (default 2).
    in_features: the channel count, checked against the last axis when given
      (default None).
  """
  return _pool(generalized_mean, inputs, _check_exponent(p, "p"),
               (check_number(eps, "eps", positive=True),), check_bool(flatten, "flatten"),
               check_num_spatial_dims(num_spatial_dims), check_in_features(in_features),
               "gem_pool")


@flax_names
def lse_plus_pool(inputs: jax.Array, r: float | jax.Array | nnx.Variable = 10.0, *,
                  flatten: bool = True, num_spatial_dims: int = 2,
                  in_features: int | None = None) -> jax.Array:
  """Log-sum-exp pooling over space, timm's ``LsePlus2d``: the function of :class:`LsePlusPool`.

  ``x_max + log(mean over space of exp(r (x - x_max))) / r``.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import functional as F
    >>> x = jnp.log(jnp.array([1., 1., 1., 5.])).reshape(1, 2, 2, 1)
    >>> round(float(F.lse_plus_pool(x, 1.0)[0, 0]), 6)  # log(mean(exp(x))) = log(8 / 4)
    0.693147

  Args:
    inputs: ``(*batch, *spatial, C)`` floats.
    r: the sharpness, a positive number, or a floating array (or ``nnx.Param``) of one
      element, such as a learnable parameter (default 10.0).
    flatten: return ``(*batch, C)`` (default True), else ``(*batch, 1, ..., 1, C)``.
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3 (default 2).
    in_features: the channel count, checked against the last axis when given
      (default None).
  """
  return _pool(log_mean_exp, inputs, _check_exponent(r, "r"), (),
               check_bool(flatten, "flatten"), check_num_spatial_dims(num_spatial_dims),
               check_in_features(in_features), "lse_plus_pool")


# ----------------------------------------------------------------------------
# Modules.
# ----------------------------------------------------------------------------


class _ParameterPool(nnx.Module):
  """A global pool with one scalar parameter, learnable or fixed: shared plumbing."""

  def _init_parameter(self, name: str, value, shape: tuple[int, ...], learnable, flatten,
                      num_spatial_dims, in_features, param_dtype) -> None:
    value = check_number(value, name, positive=True)
    self.learnable = check_bool(learnable, "learnable")
    self.flatten = check_bool(flatten, "flatten")
    self.num_spatial_dims = check_num_spatial_dims(num_spatial_dims)
    self.in_features = check_in_features(in_features)
    array = jnp.full(shape, value, _check_param_dtype(param_dtype))
    setattr(self, name, nnx.Param(array) if self.learnable else nnx.Variable(array))

  def _call(self, pooling, inputs, parameter: nnx.Variable, static: tuple) -> jax.Array:
    return _pool(pooling, inputs, parameter[...], static, self.flatten, self.num_spatial_dims,
                 self.in_features, type(self).__name__, self)


class GeMPool(_ParameterPool):
  """Generalized-mean pooling over space: ``(mean of max(x, eps)^p)^(1/p)``, ``p`` learnable.

  Radenović, Tolias and Chum, "Fine-tuning CNN Image Retrieval with No Human
  Annotation", TPAMI 2018, https://arxiv.org/abs/1711.02512, as their
  cnnimageretrieval-pytorch ``GeM`` (``p = Parameter(torch.ones(1) * p)``, the
  forward ``avg_pool2d(x.clamp(min=eps).pow(p), (H, W)).pow(1. / p)``). ``p = 1``
  is the mean, ``p = 2`` the root mean square, and as ``p`` grows it tends to the
  max. Computed as described in :mod:`nnx_pool._generalized`.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import GeMPool
    >>> x = jnp.array([1., 2., 3., 6.]).reshape(1, 2, 2, 1)  # (N, H, W, C)
    >>> pool = GeMPool()  # p = 3: (252 / 4) ** (1 / 3)
    >>> pool.p[...], pool(x)
    (Array([3.], dtype=float32), Array([[3.9790573]], dtype=float32))

  Args:
    p: the initial exponent, a positive number (default 3.0).
    eps: inputs below this positive number are raised to it (default 1e-6).
    learnable: ``p`` is an ``nnx.Param`` of shape ``(1,)`` (default True), else a
      fixed ``nnx.Variable`` of that shape.
    flatten: return ``(*batch, C)`` (default True), else ``(*batch, 1, ..., 1, C)``.
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3 (default 2).
    in_features: the channel count, checked against the last axis when given
      (default None).
    param_dtype: the dtype of ``p`` (default float32).
  """

  p: nnx.Variable  # set by _init_parameter: an nnx.Param when learnable

  @flax_names
  def __init__(self, p: float = 3.0, *, eps: float = 1e-6, learnable: bool = True,
               flatten: bool = True, num_spatial_dims: int = 2, in_features: int | None = None,
               param_dtype: Dtype = jnp.float32):
    self.eps = check_number(eps, "eps", positive=True)
    self._init_parameter("p", p, (1,), learnable, flatten, num_spatial_dims, in_features,
                         param_dtype)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Pools ``(*batch, *spatial, C)`` to ``(*batch, C)``, or ``(*batch, 1, ..., 1, C)``."""
    return self._call(generalized_mean, inputs, self.p, (self.eps,))

  @classmethod
  def from_torch(cls, state_dict: Mapping, **options):
    """Builds the pool from a PyTorch GeM's state dict: ``p``, shape ``(1,)``.

    The common definition (cnnimageretrieval-pytorch's ``GeM``, and the many copies
    of it) holds ``p = Parameter(torch.ones(1) * p)``; its ``eps`` is not in the
    state dict, so pass it when it is not 1e-6.

    Args:
      state_dict: the PyTorch module's ``state_dict()``, keys without a prefix.
      **options: other constructor arguments (``eps``, ``flatten``, ``learnable``...).
    """
    return load(cls, TORCH_KEYS["GeMPool"], state_dict, options)


class LsePlusPool(_ParameterPool):
  """Log-sum-exp pooling over space, timm's ``LsePlus2d``: ``r`` learnable, mean to max.

  ``x_max + log(mean over space of exp(r (x - x_max))) / r``, as timm 1.0.31
  ``timm/layers/other_pool.py`` ``LsePlus2d`` computes it (the max subtracted for
  stability): the mean as ``r`` tends to 0 and the max as it grows. Computed as
  described in :mod:`nnx_pool._generalized`.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import LsePlusPool
    >>> x = jnp.log(jnp.array([1., 1., 1., 5.])).reshape(1, 2, 2, 1)  # (N, H, W, C)
    >>> round(float(LsePlusPool(1.0)(x)[0, 0]), 6)  # log(mean(exp(x))) = log(2)
    0.693147

  Args:
    r: the initial sharpness, a positive number (default 10.0).
    learnable: ``r`` is an ``nnx.Param`` of shape ``()`` (default True), else a
      fixed ``nnx.Variable``, as timm's ``r_learnable=False`` buffer.
    flatten, num_spatial_dims, in_features: as :class:`GeMPool` takes them (the
      defaults too).
    param_dtype: the dtype of ``r`` (default float32).
  """

  r: nnx.Variable  # set by _init_parameter: an nnx.Param when learnable

  @flax_names
  def __init__(self, r: float = 10.0, *, learnable: bool = True, flatten: bool = True,
               num_spatial_dims: int = 2, in_features: int | None = None,
               param_dtype: Dtype = jnp.float32):
    self._init_parameter("r", r, (), learnable, flatten, num_spatial_dims, in_features,
                         param_dtype)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Pools ``(*batch, *spatial, C)`` to ``(*batch, C)``, or ``(*batch, 1, ..., 1, C)``."""
    return self._call(log_mean_exp, inputs, self.r, ())

  @classmethod
  def from_torch(cls, state_dict: Mapping, **options):
    """Builds the pool from timm ``LsePlus2d``'s state dict: ``r``, a scalar.

    ``r`` is in the state dict whether it is learnable or a buffer; pass
    ``learnable=False`` for timm's ``r_learnable=False``.

    Args:
      state_dict: the PyTorch module's ``state_dict()``, keys without a prefix.
      **options: other constructor arguments (``learnable``, ``flatten``...).
    """
    return load(cls, TORCH_KEYS["LsePlusPool"], state_dict, options)

