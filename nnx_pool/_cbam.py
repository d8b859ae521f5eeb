"""The CBAM family: CBAM and timm's light CBAM, channels-last.

Woo et al., "CBAM: Convolutional Block Attention Module", ECCV 2018,
https://arxiv.org/abs/1807.06521, as timm 1.0.31 ``timm/layers/cbam.py`` computes it:
a channel gate from pooled summaries through one MLP, then a spatial gate from a
convolution and a one-channel BatchNorm over per-pixel summaries of the channels.

* :class:`CBAM`: timm's ``CbamModule``, the paper's block (mean and max summaries);
* :class:`LightCBAM`: timm's ``LightCbamModule`` (their average, ``0.5 * mean +
  0.5 * max``, as one summary).

Both are built, called and loaded by one base class; each says only how it
summarises. The family's conventions (inputs, dtypes, the layer options,
``from_torch``) are in :mod:`nnx_pool._gates`.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn.linear import default_bias_init, default_kernel_init
from flax.typing import Dtype, PrecisionLike

from ._args import check_positive_int, flax_names
from ._gates import (
  Activation,
  Initializer,
  _Gate,
  _layer_options,
  _scaled,
  avg_max_summary,
)
from ._layout import unbatch
from ._numerics import accumulation_dtype, spatial_mean, true_divide
from ._select import extremum
from ._torch_keys import TORCH_KEYS
from ._torch_state import load


class _CbamFamily(_Gate):
  """What CBAM and LightCBAM share: their construction, their call and their loader.

  A subclass gives ``_maps``, the number of summary maps its spatial convolution
  reads, and the two summaries (:meth:`_channel_logits`, :meth:`_spatial_maps`).
  """

  _maps: int

  def _init_cbam(self, in_features, squeeze_features, rd_ratio, rd_divisor,
                 spatial_kernel_size, activation, gate, use_bias, num_spatial_dims, dtype,
                 param_dtype, precision, kernel_init, bias_init, rngs) -> None:
    """Checks every argument and builds the MLP, the spatial convolution and its BatchNorm."""
    self._init_width(in_features, squeeze_features, rd_ratio, rd_divisor)
    k = check_positive_int(spatial_kernel_size, "spatial_kernel_size")
    if k % 2 == 0:
      raise ValueError(f"`spatial_kernel_size` must be odd (to keep the size); got {k}.")
    self.spatial_kernel_size = k
    layer = _layer_options(dtype, param_dtype, precision, kernel_init, rngs)
    self._init_mlp(activation, gate, use_bias, num_spatial_dims, layer, bias_init)
    pad = ((k - 1) // 2, (k - 1) // 2)
    self.spatial_conv = nnx.Conv(
        self._maps, 1, (k,) * self.num_spatial_dims, padding=(pad,) * self.num_spatial_dims,
        use_bias=False, **layer,
    )
    self.spatial_norm = self._batch_norm(1, dtype, param_dtype, rngs)

  def _mlp(self, v: jax.Array) -> jax.Array:
    return self.fc2(self.activation(self.fc1(v)))

  def _channel_logits(self, x: jax.Array) -> jax.Array:
    """The channel gate's input, ``(N, 1.., C)``."""
    raise NotImplementedError

  def _spatial_maps(self, x: jax.Array) -> jax.Array:
    """The spatial convolution's input, ``(N, *spatial, _maps)``."""
    raise NotImplementedError

  def __call__(self, inputs: jax.Array, use_running_average: bool | None = None) -> jax.Array:
    """Gates ``(N, *spatial, C)`` or ``(*spatial, C)``; the output has its shape and dtype.

    Args:
      inputs: the feature map.
      use_running_average: normalise the spatial map with the BatchNorm's running
        statistics (True) or the batch's, updating the running ones (False), for this
        call only (default None: the module's mode, ``.eval()`` or ``.train()``), as
        :class:`flax.nnx.BatchNorm` takes it.
    """
    use_running_average = self._running_average(use_running_average)
    x, batch = self._prepare(inputs)
    x = _scaled(x, self.gate(self._channel_logits(x)))
    normed = self.spatial_norm(self.spatial_conv(self._spatial_maps(x)),
                               use_running_average=use_running_average)
    return unbatch(_scaled(x, self.gate(normed)), batch)

  @classmethod
  def from_torch(cls, state_dict: Mapping, **options):
    """Builds the gate from timm's state dict: ``CbamModule``'s for :class:`CBAM`,
    ``LightCbamModule``'s for :class:`LightCBAM`.

    Keys: ``channel.fc1.weight``, ``channel.fc2.weight`` (with or without
    ``channel.fc1.bias``/``channel.fc2.bias``), ``spatial.conv.conv.weight``
    ``(1, maps, k, k)`` (maps: 2 for CBAM, 1 for LightCBAM) and
    ``spatial.conv.bn.{weight, bias, running_mean, running_var}``
    (``num_batches_tracked`` is accepted and ignored). ``in_features``,
    ``squeeze_features``, ``use_bias``, ``spatial_kernel_size`` and
    ``num_spatial_dims`` come from the weights. The module is returned in training
    mode, as PyTorch's; call ``.eval()``.

    Args:
      state_dict: the PyTorch module's ``state_dict()``, keys without a prefix.
      **options: other constructor arguments (``activation``, ``dtype``...).
    """
    return load(cls, TORCH_KEYS[cls.__name__], state_dict, options)


class CBAM(_CbamFamily):
  """Convolutional block attention: a channel gate from mean and max, then a spatial gate.

  Woo et al., "CBAM: Convolutional Block Attention Module", ECCV 2018,
  https://arxiv.org/abs/1807.06521, as timm's ``CbamModule``:

  1. channel attention ``x * gate(mlp(mean over space) + mlp(max over space))``
     with one shared MLP ``fc2(activation(fc1(.)))``;
  2. spatial attention ``x * gate(norm(conv([mean over C, max over C])))``, a
     ``spatial_kernel_size`` convolution from 2 maps to 1 without bias, zero
     padded to keep the size, followed by a one-channel BatchNorm.

  The BatchNorm is kept, as in timm and the authors' code, so that PyTorch
  weights load exactly; like every :class:`flax.nnx.BatchNorm` it starts in
  training mode (batch statistics, momentum 0.9 = PyTorch's 0.1, epsilon 1e-5):
  call ``.eval()`` for inference. The reduced width, when
  ``squeeze_features`` is None, is timm's
  ``make_divisible(in_features * rd_ratio, rd_divisor, round_limit=0)``.
  The maxima propagate NaN and share their gradient between ties, as
  ``torch.amax``.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from nnx_pool import CBAM
    >>> cbam = CBAM(32, rngs=nnx.Rngs(0))
    >>> cbam.fc1.kernel.shape, cbam.spatial_conv.kernel.shape, cbam(jnp.ones((2, 8, 8, 32))).shape
    ((32, 2), (7, 7, 2, 1), (2, 8, 8, 32))

  Args:
    in_features: the channel count ``C``.
    squeeze_features: the MLP's hidden width (default None: from ``rd_ratio``).
    rd_ratio: the reduction ratio when ``squeeze_features`` is None (default 1/16).
    rd_divisor: the hidden width is rounded to a multiple of this (default 1).
    spatial_kernel_size: the odd size of the spatial convolution (default 7).
    activation: the MLP's activation (default ``nnx.relu``).
    gate: maps both attention maps to scales (default ``nnx.sigmoid``).
    use_bias: whether the MLP layers have a bias (default False, as timm).
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3 (default 2);
      the spatial convolution has that many dims.
    dtype, param_dtype, precision, kernel_init, bias_init, rngs: the layer options
      (see :mod:`nnx_pool._gates`) of the MLP layers and the spatial convolution;
      ``bias_init`` is used when ``use_bias``. The BatchNorm takes ``dtype`` and
      ``param_dtype`` and keeps Flax's initial scale 1 and bias 0.
  """

  _maps = 2  # the mean and the max over the channels

  @flax_names
  def __init__(
      self, in_features: int, squeeze_features: int | None = None, *,
      rd_ratio: float = 1 / 16, rd_divisor: int = 1, spatial_kernel_size: int = 7,
      activation: Activation = nnx.relu, gate: Activation = nnx.sigmoid, use_bias: bool = False,
      num_spatial_dims: int = 2, dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
      precision: PrecisionLike = None,
      kernel_init: Initializer = default_kernel_init,
      bias_init: Initializer = default_bias_init, rngs: nnx.Rngs,
  ):
    self._init_cbam(in_features, squeeze_features, rd_ratio, rd_divisor, spatial_kernel_size,
                    activation, gate, use_bias, num_spatial_dims, dtype, param_dtype, precision,
                    kernel_init, bias_init, rngs)

  def _channel_logits(self, x: jax.Array) -> jax.Array:
    space = tuple(range(1, x.ndim - 1))
    return self._mlp(spatial_mean(x)) + self._mlp(extremum(x, space, "max", keepdims=True))

  def _spatial_maps(self, x: jax.Array) -> jax.Array:
    # The max before the mean: in the other order XLA:CPU fuses the sum differently, 1e-6
    # away from the shipped baseline (recorded with this order).
    channel_max = extremum(x, -1, "max", keepdims=True)
    channel_sum = jnp.sum(x, axis=-1, keepdims=True, dtype=accumulation_dtype(x.dtype))
    channel_mean = true_divide(channel_sum, x.shape[-1]).astype(x.dtype)
    return jnp.concatenate([channel_mean, channel_max], axis=-1)


class LightCBAM(_CbamFamily):
  """Light CBAM: ``x * sigmoid(mlp(avgmax over space))``, then ``* sigmoid(norm(conv(avgmax)))``.

  timm's ``LightCbamModule`` (timm 1.0.31 ``timm/layers/cbam.py``), an
  experimental lighter :class:`~nnx_pool.CBAM` (Woo et al. 2018,
  https://arxiv.org/abs/1807.06521). Each "avgmax" is ``0.5 * mean + 0.5 * max``:

  1. channel attention (``LightChannelAttn``): one pass of the MLP
     ``fc2(activation(fc1(.)))`` on the avgmax over space;
  2. spatial attention (``LightSpatialAttn``): the avgmax over channels, one map,
     through a ``spatial_kernel_size`` convolution from 1 map to 1 without bias,
     zero padded to keep the size, and a one-channel BatchNorm, without an
     activation (timm's ``ConvNormAct(1, 1, k, apply_act=False)``).

  Both gates are sigmoids, whatever timm's ``gate_layer``: ``LightChannelAttn``
  calls ``F.sigmoid`` and ``LightSpatialAttn`` is built without the argument, so
  there is no ``gate`` to choose. The BatchNorm starts in training mode
  (momentum 0.9 = PyTorch's 0.1, epsilon 1e-5), as every
  :class:`flax.nnx.BatchNorm`: call ``.eval()`` for inference. Summaries as
  :func:`nnx_pool._gates.avg_max_summary` computes them.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from nnx_pool import LightCBAM
    >>> light = LightCBAM(32, spatial_kernel_size=3, rngs=nnx.Rngs(0))
    >>> light.spatial_conv.kernel.shape  # (k, k, 1 map in, 1 out)
    (3, 3, 1, 1)
    >>> light(jnp.ones((8, 8, 32))).shape  # unbatched (H, W, C)
    (8, 8, 32)

  Args:
    in_features, squeeze_features, rd_ratio, rd_divisor: as :class:`CBAM` (the defaults too).
    spatial_kernel_size, activation, num_spatial_dims: as :class:`CBAM` (the defaults too;
      the spatial convolution reads one map).
    use_bias: whether the MLP layers have a bias (default False, as timm's ``mlp_bias``).
    dtype, param_dtype, precision, kernel_init, bias_init, rngs: the layer options of
      the MLP layers and the spatial convolution, as :class:`CBAM` takes them.
  """

  _maps = 1  # the average of the mean and the max over the channels

  @flax_names
  def __init__(
      self, in_features: int, squeeze_features: int | None = None, *,
      rd_ratio: float = 1 / 16, rd_divisor: int = 1, spatial_kernel_size: int = 7,
      activation: Activation = nnx.relu, use_bias: bool = False,
      num_spatial_dims: int = 2, dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
      precision: PrecisionLike = None,
      kernel_init: Initializer = default_kernel_init,
      bias_init: Initializer = default_bias_init, rngs: nnx.Rngs,
  ):
    self._init_cbam(in_features, squeeze_features, rd_ratio, rd_divisor, spatial_kernel_size,
                    activation, nnx.sigmoid, use_bias, num_spatial_dims, dtype, param_dtype,
                    precision, kernel_init, bias_init, rngs)

  def _channel_logits(self, x: jax.Array) -> jax.Array:
    return self._mlp(avg_max_summary(x))

  def _spatial_maps(self, x: jax.Array) -> jax.Array:
    return avg_max_summary(x, (x.ndim - 1,))
