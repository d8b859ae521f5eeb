"""GCNet's global context block, timm's ``GlobalContext``, channels-last.

:class:`GlobalContext`: Cao et al. 2019, https://arxiv.org/abs/1904.11492, as timm 1.0.31
``timm/layers/global_context.py`` computes it: attention pooling (or the mean) over
space, then a gate from one ConvMlp and/or a bias from another. It follows the
conventions of :mod:`nnx_pool._gates` (inputs, dtypes, the layer options ``dtype``,
``param_dtype``, ``precision``, ``kernel_init``, ``bias_init`` and ``rngs``, and
``from_torch``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn.linear import default_bias_init, default_kernel_init
from flax.typing import Dtype, PrecisionLike
from jax import lax

from ._args import check_bool, check_callable, check_positive_int, flax_names
from ._gates import (
  Activation,
  Initializer,
  _check_initializer,
  _Gate,
  _layer_options,
  _squeeze_width,
)
from ._jit import kernel
from ._layout import unbatch
from ._numerics import spatial_mean
from ._torch_keys import TORCH_KEYS
from ._torch_state import load


class _ConvMlp(nnx.Module):
  """timm's ``ConvMlp`` with ``LayerNorm2d`` on a pooled ``(N, C)`` vector: fc1, norm, act, fc2.

  The 1x1 convolutions are :class:`flax.nnx.Linear` layers with biases; the norm
  is over the hidden channels with timm's ``LayerNorm2d`` epsilon, 1e-6, and
  PyTorch's variance (``E[(x - mean)^2]``, not Flax's fast ``E[x^2] - mean^2``).
  """

  def __init__(self, in_features: int, hidden: int, activation: Activation, layer: dict,
               bias_init: Initializer, *, zero_last: bool = False):
    self.fc1 = nnx.Linear(in_features, hidden, bias_init=bias_init, **layer)
    self.norm = nnx.LayerNorm(hidden, epsilon=1e-6, use_fast_variance=False,
                              dtype=layer["dtype"], param_dtype=layer["param_dtype"],
                              rngs=layer["rngs"])
    self.activation = activation
    if zero_last:
      layer = dict(layer, kernel_init=nnx.initializers.zeros_init())
    self.fc2 = nnx.Linear(hidden, in_features, bias_init=bias_init, **layer)

  def __call__(self, v: jax.Array) -> jax.Array:
    return self.fc2(self.activation(self.norm(self.fc1(v))))


@kernel()
def softmax_pool(x: jax.Array, logits: jax.Array) -> jax.Array:
  """``sum over space of x * softmax over space of logits``, ``(N, C)``, rounded to ``x``'s dtype.

  ``logits`` is ``(N, *spatial, 1)``. The softmax and the weighted sum are in
  float32 at least (the wider of ``x``'s and the logits' dtypes), the sum at
  full precision (timm's ``x @ attn``).
  """
  n, c = x.shape[0], x.shape[-1]
  cells = math.prod(x.shape[1:-1])  # spelt out: -1 cannot be inferred for an empty batch
  dtype = jnp.promote_types(jnp.promote_types(x.dtype, logits.dtype), jnp.float32)
  weights = jax.nn.softmax(logits.reshape(n, cells).astype(dtype), axis=-1)
  context = jnp.einsum("nsc,ns->nc", x.reshape(n, cells, c).astype(dtype), weights,
                       precision=lax.Precision.HIGHEST)
  return context.astype(x.dtype)


class GlobalContext(_Gate):
  """Global context block: ``x * gate(mlp_scale(context)) + mlp_add(context)``, GCNet's.

  Cao et al., "GCNet: Non-local Networks Meet Squeeze-Excitation Networks and
  Beyond", ICCVW 2019, https://arxiv.org/abs/1904.11492, as timm's
  ``GlobalContext`` (timm 1.0.31 ``timm/layers/global_context.py``; the block of
  ``gcresnet*``, ``gcresnext26ts`` and ``gc_efficientnetv2_rw_t``):

  1. the context is attention pooling, ``sum over space of x * softmax over space
     of conv_attn(x)`` with ``conv_attn`` a C-to-1 projection with bias (the mean
     over space with ``use_attn=False``);
  2. ``fuse_scale`` (default): ``x * gate(mlp_scale(context))``;
     ``fuse_add``: ``+ mlp_add(context)``; either or both, each MLP timm's
     ``ConvMlp``: ``fc2(activation(LayerNorm(fc1(.))))``, the LayerNorm over the
     hidden channels with epsilon 1e-6 (timm's ``LayerNorm2d``).

  The context is computed in float32 for float16/bfloat16 inputs and rounded to
  the input's dtype; the output ``x * scale + add`` is rounded once. When
  ``squeeze_features`` is None the hidden width is timm's
  ``make_divisible(in_features * rd_ratio, rd_divisor, round_limit=0)``.

  Initialisation: ``mlp_add``'s last kernel starts at zero, as timm's
  ``reset_parameters`` sets it (so the block starts as the identity plus a
  bias); ``init_last_zero=True`` also zeroes ``mlp_scale``'s last kernel, as
  GCNet's own ``last_zero_init`` does (timm 1.0.31 stores the flag and does not
  read it). Weights loaded by :meth:`from_torch` are unaffected.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from nnx_pool import GlobalContext
    >>> gc = GlobalContext(64, fuse_add=True, rngs=nnx.Rngs(0))
    >>> gc.conv_attn.kernel.shape, gc.mlp_scale.fc1.kernel.shape, gc(jnp.ones((2, 7, 7, 64))).shape
    ((64, 1), (64, 8), (2, 7, 7, 64))

  Args:
    in_features: the channel count ``C``.
    use_attn: pool by attention (default True), else by the mean.
    fuse_add: add ``mlp_add(context)`` (default False).
    fuse_scale: multiply by ``gate(mlp_scale(context))`` (default True); at least
      one of the two.
    init_last_zero: ``mlp_scale``'s last kernel starts at zero too (default False).
    rd_ratio: the reduction ratio when ``squeeze_features`` is None (default 1/8).
    squeeze_features: the MLPs' hidden width (default None: from ``rd_ratio``).
    rd_divisor: the hidden width is rounded to a multiple of this (default 1).
    activation: the MLPs' activation (default ``nnx.relu``).
    gate: maps ``mlp_scale``'s output to the scale (default ``nnx.sigmoid``).
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3 (default 2).
    dtype, param_dtype, precision, kernel_init, bias_init, rngs: the layer options of
      ``conv_attn`` and the MLPs' layers (see :mod:`nnx_pool._gates`). The LayerNorms
      take ``dtype`` and ``param_dtype`` and keep Flax's initial scale 1 and bias 0.
  """

  @flax_names
  def __init__(
      self, in_features: int, *, use_attn: bool = True, fuse_add: bool = False,
      fuse_scale: bool = True, init_last_zero: bool = False, rd_ratio: float = 1 / 8,
      squeeze_features: int | None = None, rd_divisor: int = 1,
      activation: Activation = nnx.relu, gate: Activation = nnx.sigmoid,
      num_spatial_dims: int = 2, dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
      precision: PrecisionLike = None,
      kernel_init: Initializer = default_kernel_init,
      bias_init: Initializer = default_bias_init, rngs: nnx.Rngs,
  ):
    self.in_features = check_positive_int(in_features, "in_features")
    self.squeeze_features = _squeeze_width(self.in_features, squeeze_features, rd_ratio,
                                           rd_divisor)
    self.use_attn = check_bool(use_attn, "use_attn")
    self.fuse_add = check_bool(fuse_add, "fuse_add")
    self.fuse_scale = check_bool(fuse_scale, "fuse_scale")
    init_last_zero = check_bool(init_last_zero, "init_last_zero")
    if not (self.fuse_add or self.fuse_scale):
      raise ValueError(
          "GlobalContext needs fuse_scale=True or fuse_add=True (or both); with neither it "
          "would return its input unchanged. Got fuse_scale=False, fuse_add=False.")
    self.activation = check_callable(activation, "activation")
    self._init_gate(gate, num_spatial_dims)
    layer = _layer_options(dtype, param_dtype, precision, kernel_init, rngs)
    bias_init = _check_initializer(bias_init, "bias_init")
    self.conv_attn = (nnx.Linear(self.in_features, 1, bias_init=bias_init, **layer)
                      if self.use_attn else None)
    self.mlp_scale = (_ConvMlp(self.in_features, self.squeeze_features, self.activation, layer,
                               bias_init, zero_last=init_last_zero)
                      if self.fuse_scale else None)
    self.mlp_add = (_ConvMlp(self.in_features, self.squeeze_features, self.activation, layer,
                             bias_init, zero_last=True)
                    if self.fuse_add else None)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Gates ``(N, *spatial, C)`` or ``(*spatial, C)``; the output has its shape and dtype."""
    x, batch = self._prepare(inputs)
    n, c = x.shape[0], x.shape[-1]
    if self.conv_attn is not None:
      context = softmax_pool(x, self.conv_attn(x))
    else:
      context = spatial_mean(x).reshape(n, c)
    per_pixel = (n, *(1,) * (x.ndim - 2), c)  # broadcasts over space
    y = x
    if self.mlp_scale is not None:
      y = y * self.gate(self.mlp_scale(context)).reshape(per_pixel)
    if self.mlp_add is not None:
      y = y + self.mlp_add(context).reshape(per_pixel)
    return unbatch(y.astype(x.dtype), batch)

  @classmethod
  def from_torch(cls, state_dict: Mapping, **options):
    """Builds the block from timm ``GlobalContext``'s state dict.

    Keys: ``conv_attn.{weight, bias}`` (``use_attn=True``; weight ``(1, C, 1, 1)``)
    and ``mlp_scale.*`` and/or ``mlp_add.*``, each ``fc1.{weight, bias}``,
    ``norm.{weight, bias}``, ``fc2.{weight, bias}``. ``in_features``,
    ``squeeze_features``, ``use_attn``, ``fuse_scale`` and ``fuse_add`` come from
    the keys and weights.

    Args:
      state_dict: the PyTorch module's ``state_dict()``, keys without a prefix.
      **options: other constructor arguments (``activation``, ``gate``, ``dtype``...).
    """
    return load(cls, TORCH_KEYS["GlobalContext"], state_dict, options)
