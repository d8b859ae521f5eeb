"""Anti-aliased downsampling: timm's ``BlurPool2d``, a binomial blur then a stride, channels-last.

Zhang, "Making Convolutional Networks Shift-Invariant Again", ICML 2019,
https://arxiv.org/abs/1904.11486, as timm 1.0.31 ``timm/layers/blur_pool.py``
``BlurPool2d`` computes it: the binomial filter ``C(n-1, k) / 2^(n-1)``
(``n = filter_size``), its outer product over the spatial dims, applied to each
channel alone (a depthwise convolution) with a stride, after padding every side by
timm's ``get_padding(filter_size, stride) = ((stride - 1) + (filter_size - 1)) // 2``
(``timm/layers/padding.py``) in ``pad_mode``, one of ``F.pad``'s modes:

* ``"reflect"``: mirrored without repeating the edge (``x[1], x[0] | x[0], x[1], ...``);
  the padding must be shorter than the dim, as PyTorch requires;
* ``"constant"``: zeros (timm's ``aa_layer='blurpc'``);
* ``"replicate"``: the edge repeated;
* ``"circular"``: wrapped around; at most the dim's length, as PyTorch requires.

The coefficients are the exact ratios rounded to float32: timm's values bit for bit for
every size timm builds (2 to 64), and correct up to this module's limit of 1024 taps
(:data:`MAX_FILTER_SIZE`), where float32 binomials would overflow. Padding that would make
the padded input too large for XLA to size (a huge stride in ``"constant"`` or
``"replicate"`` mode) is refused before XLA sees it.

The padding is the same on both sides, so an even filter's output differs from an odd
one's, as timm's does: ``filter_size=4`` gives ``L - 1`` outputs at stride 1 and
``L // 2 + 1`` at stride 2, where 3 gives ``L`` and ``ceil(L / 2)``. timm's filter is a
non-persistent buffer: there are no weights and no ``from_torch``.

How it is computed: the filter is separable, so the blur is one strided 1-D pass per
spatial dim, each a sum of ``filter_size`` strided slices (XLA fuses them into one
loop), with a gradient that places the cotangent by stride phase, as the window
sums of :mod:`nnx_pool._adjoint` do. On (8, 56, 56, 256) at stride 2, measured on
the 2-core CPU: a depthwise ``lax.conv_general_dilated`` (``feature_group_count=C``)
took 62-80 ms forward and 0.56-1.1 s forward and backward, the separable passes
22-28 ms and 42-57 ms (filters 3 and 5). The passes sum in another order than a
convolution: they agree with PyTorch's to a few float32 ULPs. float16 and bfloat16
inputs are computed in float32 and rounded once.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from nnx_pool._args import flax_names, is_int
from nnx_pool._geometry import SizeLike, as_tuple, check_padded_size, spatial_dims
from nnx_pool._jit import kernel
from nnx_pool._layout import check_in_features, check_nonempty_spatial, prepare, unbatch
from nnx_pool._numerics import accumulation_dtype

# F.pad's mode names and jnp.pad's for the same padding.
PAD_MODES = {"reflect": "reflect", "constant": "constant", "replicate": "edge",
             "circular": "wrap"}

Pads = tuple[tuple[int, int], ...]


# ----------------------------------------------------------------------------
# PyTorch's padding modes (F.pad), shared with MedianPool.
# ----------------------------------------------------------------------------


def check_pad_mode(value) -> str:
  if not isinstance(value, str) or value not in PAD_MODES:
    error = ValueError if isinstance(value, str) else TypeError
    raise error(
        f"`pad_mode` must be one of {', '.join(map(repr, PAD_MODES))} (F.pad's modes); "
        f"got {value!r}.")
  return value


def check_torch_pads(spatial: tuple[int, ...], pads: Pads, mode: str, module: str) -> None:
  """PyTorch's limits on ``F.pad``: reflect padding shorter than the dim, circular at most it."""
  for axis, (length, (lo, hi)) in enumerate(zip(spatial, pads, strict=True)):
    pad = max(lo, hi)
    if mode == "reflect" and pad >= length:
      raise ValueError(
          f"{module}: reflect padding must be shorter than the dim it pads (PyTorch's F.pad "
          f"rule: it mirrors the dim without its edge); spatial dim {axis} has length "
          f"{length} and padding ({lo}, {hi}). Use an input at least {pad + 1} long there, "
          "or less padding.")
    if mode == "circular" and pad > length:
      raise ValueError(
          f"{module}: circular padding must be at most the length of the dim it pads "
          f"(PyTorch's F.pad rule: it would wrap around more than once); spatial dim {axis} "
          f"has length {length} and padding ({lo}, {hi}). Use an input at least {pad} long "
          "there, or less padding.")


def torch_pad(x: jax.Array, pads: Pads, mode: str) -> jax.Array:
  """``F.pad(x, ..., mode=mode)`` of the spatial dims of a batched channels-last ``x``."""
  if not any(lo or hi for lo, hi in pads):
    return x
  return jnp.pad(x, ((0, 0), *pads, (0, 0)), mode=PAD_MODES[mode])


# ----------------------------------------------------------------------------
# The binomial blur: one strided 1-D pass per spatial dim.
# ----------------------------------------------------------------------------


# The longest filter: the kernel takes one strided slice per tap and dim, so its program grows
# with the filter (a 1024-tap 2-D blur of a 520 x 520 map: 4.5 s to its first result on the
# 2-core CPU, 0.47 s after).
MAX_FILTER_SIZE = 1024


def binomial_filter(size: int) -> tuple[float, ...]:
  """timm's 1-D filter ``C(n-1, k) / 2^(n-1)`` as float32 values (Python floats).

  Each coefficient is the exact integer ratio correctly rounded, then rounded to float32:
  timm 1.0.31's float32 values bit for bit for every size it builds (2 to 64; from 65 its
  ``torch.tensor`` of the binomials overflows int64), and the right values beyond, where a
  float32 ``C(n-1, k)`` or ``2^(n-1)`` overflows (129 gave all zeros, 200 NaN).
  """
  scale = 2 ** (size - 1)
  coeffs = np.array([math.comb(size - 1, k) / scale for k in range(size)]).astype(np.float32)
  return tuple(float(c) for c in coeffs)


def blur_padding(filter_size: int, stride: int) -> int:
  """timm's ``get_padding(filter_size, stride)``, put on both sides of each spatial dim."""
  return ((stride - 1) + (filter_size - 1)) // 2


def _strided_sum(x: jax.Array, axis: int, coeffs: tuple[float, ...], stride: int) -> jax.Array:
  """``y[q] = sum_j coeffs[j] * x[q * stride + j]`` along ``axis``, over the windows that fit."""
  k = len(coeffs)
  out = (x.shape[axis] - k) // stride + 1
  total = None
  for j, c in enumerate(coeffs):
    tap = lax.slice_in_dim(x, j, j + (out - 1) * stride + 1, stride, axis) * jnp.asarray(
        c, x.dtype)
    total = tap if total is None else total + tap
  return total  # pyright: ignore[reportReturnType]  # not None: a filter has at least one tap


def _strided_sum_adjoint(ct: jax.Array, axis: int, length: int, coeffs: tuple[float, ...],
                         stride: int) -> jax.Array:
  """The transpose of :func:`_strided_sum`, by stride phase: cell ``t * stride + r`` receives
  ``coeffs[r + stride * i] * ct[t - i]``, unit-stride shifts of ``ct``, interleaved."""
  out, k = ct.shape[axis], len(coeffs)
  cells = -(-length // stride)  # per phase
  zero = jnp.zeros((), ct.dtype)
  phases = []
  for r in range(stride):
    total = None
    for i, j in enumerate(range(r, k, stride)):
      config = [(0, 0, 0)] * ct.ndim
      config[axis] = (i, cells - i - out, 0)
      term = lax.pad(ct, zero, config) * jnp.asarray(coeffs[j], ct.dtype)
      total = term if total is None else total + term
    if total is None:  # a stride longer than the filter: cells no window reads
      shape = list(ct.shape)
      shape[axis] = cells
      total = jnp.zeros(shape, ct.dtype)
    phases.append(total)
  stacked = jnp.stack(phases, axis=axis + 1)
  shape = list(ct.shape)
  shape[axis] = cells * stride
  return lax.slice_in_dim(stacked.reshape(shape), 0, length, 1, axis)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def strided_sum(x: jax.Array, axis: int, coeffs: tuple[float, ...], stride: int) -> jax.Array:
  """:func:`_strided_sum`, whose reverse mode runs :func:`_strided_sum_adjoint`.

  JAX's own transpose of a strided slice pads the cotangent with interior zeros, one
  input-sized array per tap: 82-105 ms against 42-50 ms forward and backward on the
  benchmark shape above.
  """
  return _strided_sum(x, axis, coeffs, stride)


@strided_sum.defjvp
def _strided_sum_jvp(axis, coeffs, stride, primals, tangents):
  (x,), (t,) = primals, tangents
  y = _strided_sum(x, axis, coeffs, stride)
  out = jax.ShapeDtypeStruct(y.shape, t.dtype)
  (t_out,) = jax.linear_transpose(
      lambda ct: _strided_sum_adjoint(ct, axis, x.shape[axis], coeffs, stride), out)(t)
  return y, t_out


@kernel(static_argnums=(1, 2, 3, 4))
def binomial_blur(x: jax.Array, filter_size: tuple[int, ...], strides: tuple[int, ...],
                  pads: Pads, pad_mode: str) -> jax.Array:
  """The blur of a batched float ``x``: padded, then one strided pass per spatial dim."""
  y = torch_pad(x.astype(accumulation_dtype(x.dtype)), pads, pad_mode)
  for axis, (k, s) in enumerate(zip(filter_size, strides, strict=True), start=1):
    y = strided_sum(y, axis, binomial_filter(k), s)
  return y.astype(x.dtype)


# ----------------------------------------------------------------------------
# Argument checks, the function and the module.
# ----------------------------------------------------------------------------


def _configure(filter_size, strides, pad_mode, num_spatial_dims, in_features):
  """Validated ``(filter_size, strides, pad_mode, in_features)``, one entry per spatial dim."""
  ndim = spatial_dims(num_spatial_dims, filter_size=filter_size, strides=strides)
  entries = filter_size if isinstance(filter_size, Sequence) and not isinstance(
      filter_size, str) else (filter_size,)
  if all(is_int(k) for k in entries) and min(int(k) for k in entries) < 2:  # not ">= 1"
    raise ValueError(
        f"`filter_size` must be at least 2 in every dim (a filter of 1 tap does not blur; "
        f"timm asserts filt_size > 1); got {filter_size!r}. For a plain strided subsample "
        "use x[:, ::2, ::2] or MaxPool(1, 2).")
  if all(is_int(k) for k in entries) and max(int(k) for k in entries) > MAX_FILTER_SIZE:
    raise ValueError(
        f"`filter_size` must be at most {MAX_FILTER_SIZE} in every dim (the kernel takes one "
        f"slice per tap, so its program grows with the filter); got {filter_size!r}. (timm "
        "1.0.31 builds at most 64: from 65 its binomials overflow int64.)")
  return (as_tuple(filter_size, ndim, "filter_size"), as_tuple(strides, ndim, "strides"),
          check_pad_mode(pad_mode), check_in_features(in_features))


def _blur(inputs, filter_size: tuple[int, ...], strides: tuple[int, ...], pad_mode: str,
          in_features, name: str, owner=None) -> jax.Array:
  x, batch = prepare(inputs, len(filter_size), kind="float", module=name,
                     in_features=in_features, owner=owner)
  check_nonempty_spatial(x, name)
  spatial = tuple(x.shape[1:-1])
  pads = tuple((p, p) for p in map(blur_padding, filter_size, strides))
  check_torch_pads(spatial, pads, pad_mode, name)
  check_padded_size(
      x.shape, pads, name,
      f"timm's padding grows with the stride, ((strides - 1) + (filter_size - 1)) // 2 a side, "
      f"here {tuple(p for p, _ in pads)}: use smaller `strides`.")
  for axis, (length, k, (lo, hi)) in enumerate(zip(spatial, filter_size, pads, strict=True)):
    if length + lo + hi < k:
      raise ValueError(
          f"{name}: filter_size {k} does not fit spatial dim {axis} of length {length} "
          f"padded by ({lo}, {hi}) (timm's get_padding); use an input at least "
          f"{k - lo - hi} long there, or a smaller filter.")
  return unbatch(binomial_blur(x, filter_size, strides, pads, pad_mode), batch)


@flax_names
def blur_pool(inputs: jax.Array, filter_size: SizeLike = 3, strides: SizeLike = 2, *,
              pad_mode: str = "reflect",
              num_spatial_dims: int | None = None, in_features: int | None = None) -> jax.Array:
  """A binomial blur then a stride, timm's ``BlurPool2d``: the function of :class:`BlurPool`.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import functional as F
    >>> x = jnp.zeros((1, 5, 5, 1)).at[0, 2, 2, 0].set(16.0)  # an impulse
    >>> F.blur_pool(x, 3, 1, pad_mode="constant")[0, ..., 0]  # 16 times the filter
    Array([[0., 0., 0., 0., 0.],
           [0., 1., 2., 1., 0.],
           [0., 2., 4., 2., 0.],
           [0., 1., 2., 1., 0.],
           [0., 0., 0., 0., 0.]], dtype=float32)

  Args:
    inputs: ``(*batch, *spatial, C)`` floats.
    filter_size: the binomial filter's length, 2 to 1024, an int or a tuple per dim
      (default 3).
    strides: the step between outputs, an int or a tuple per dim (default 2).
    pad_mode: ``"reflect"`` (default), ``"constant"`` (zeros), ``"replicate"`` or
      ``"circular"``, as ``F.pad``.
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3; keyword-only, 2
      unless a tuple argument sets it by its length.
    in_features: the channel count, checked against the last axis when given
      (default None).
  """
  sizes, strides, pad_mode, in_features = _configure(filter_size, strides, pad_mode,
                                                      num_spatial_dims, in_features)
  return _blur(inputs, sizes, strides, pad_mode, in_features, "blur_pool")


class BlurPool(nnx.Module):
  """Anti-aliased downsampling: a binomial blur of each channel, then a stride (timm's BlurPool2d).

  Zhang, "Making Convolutional Networks Shift-Invariant Again", ICML 2019,
  https://arxiv.org/abs/1904.11486; timm 1.0.31 ``timm/layers/blur_pool.py``. The
  filter is ``C(n-1, k) / 2^(n-1)`` per dim (``[1, 2, 1] / 4`` for 3,
  ``[1, 4, 6, 4, 1] / 16`` for 5), each side padded by
  ``((stride - 1) + (filter_size - 1)) // 2`` in ``pad_mode``. It has no
  parameters (timm's ``filt`` is a non-persistent buffer), so ``BlurPool2d(channels,
  filt_size, stride, pad_mode)`` is ``BlurPool(filt_size, stride, pad_mode=...,
  in_features=channels)``. Computed as described in :mod:`nnx_pool._blur`.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import BlurPool
    >>> x = jnp.arange(16.0).reshape(1, 4, 4, 1)
    >>> BlurPool()(x)[0, ..., 0]  # reflect padding, stride 2
    Array([[ 2.5,  4. ],
           [ 8.5, 10. ]], dtype=float32)

  Args:
    filter_size: the binomial filter's length, 2 to 1024, an int (repeated over
      ``num_spatial_dims``) or a tuple per dim (default 3).
    strides: the step between outputs, an int or a tuple per dim (default 2).
    pad_mode: ``"reflect"`` (default, timm's), ``"constant"`` (zeros, timm's
      ``'blurpc'``), ``"replicate"`` or ``"circular"``, as ``F.pad``.
    in_features: the channel count, checked against the last axis when given
      (default None).
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3; keyword-only, 2
      unless a tuple argument sets it by its length.
  """

  @flax_names
  def __init__(self, filter_size: SizeLike = 3, strides: SizeLike = 2, *, pad_mode: str = "reflect",
               in_features: int | None = None, num_spatial_dims: int | None = None):
    self.filter_size, self.strides, self.pad_mode, self.in_features = _configure(
        filter_size, strides, pad_mode, num_spatial_dims, in_features)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Blurs and subsamples ``(*batch, *spatial, C)`` to ``(*batch, *out, C)``.

    ``out = (length + 2 * pad - filter_size) // stride + 1`` per dim, with timm's
    ``pad = ((stride - 1) + (filter_size - 1)) // 2``.
    """
    return _blur(inputs, self.filter_size, self.strides, self.pad_mode, self.in_features,
                 type(self).__name__, self)
