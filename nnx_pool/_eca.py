"""Efficient channel attention (ECA-Net), and timm's circular variant, channels-last.

Wang et al., "ECA-Net: Efficient Channel Attention for Deep Convolutional Neural
Networks", CVPR 2020, https://arxiv.org/abs/1910.03151, as timm 1.0.31
``timm/layers/eca.py`` computes it (``EcaModule``, and ``CecaModule`` for
``circular=True``). The family's conventions (inputs, dtypes, the layer options,
``from_torch``) are in :mod:`nnx_pool._gates`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn.linear import default_kernel_init
from flax.typing import Dtype, PrecisionLike

from ._args import check_bool, check_number, check_positive_int, flax_names
from ._gates import Activation, Initializer, _Gate, _layer_options, _scaled
from ._layout import unbatch
from ._numerics import spatial_mean
from ._torch_keys import TORCH_KEYS
from ._torch_state import load


def eca_kernel_size(in_features: int, gamma: float = 2, beta: float = 1) -> int:
  """ECA's adaptive kernel size: ``t = int(|log2(C) + beta| / gamma)``, made odd, at least 3.

  >>> eca_kernel_size(64), eca_kernel_size(128), eca_kernel_size(2048)
  (3, 5, 7)
  """
  in_features = check_positive_int(in_features, "in_features")
  gamma = check_number(gamma, "gamma", positive=True)
  beta = check_number(beta, "beta")
  t = int(abs(math.log(in_features, 2) + beta) / gamma)  # timm's expression
  return max(t if t % 2 else t + 1, 3)


class EfficientChannelAttention(_Gate):
  """Efficient channel attention: ``x * gate(conv1d over channels of (mean over space of x)))``.

  Wang et al., "ECA-Net: Efficient Channel Attention for Deep Convolutional
  Neural Networks", CVPR 2020, https://arxiv.org/abs/1910.03151, as timm's
  ``EcaModule``: the pooled channel vector is treated as a 1-D signal and
  convolved (one input and one output channel, zero padding ``(k - 1) // 2``,
  no bias) so each channel's scale depends on its ``k`` neighbours. When
  ``kernel_size`` is None, ``k`` comes from the channel count by
  :func:`eca_kernel_size` (64 channels give 3, 128 give 5, 2048 give 7).

  ``circular=True`` is timm's ``CecaModule``: the channel vector is padded
  circularly (``F.pad(y, (p, p), mode='circular')``), so the first and last
  channels are neighbours. As PyTorch's circular padding, it wraps at most once:
  ``(k - 1) // 2`` may not exceed the channel count.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from nnx_pool import EfficientChannelAttention
    >>> eca = EfficientChannelAttention(128, rngs=nnx.Rngs(0))
    >>> eca.kernel_size, eca(jnp.ones((2, 4, 4, 128))).shape
    (5, (2, 4, 4, 128))

  Args:
    in_features: the channel count ``C``; may be None when ``kernel_size`` is
      given (then the channel axis is not checked).
    kernel_size: an odd positive kernel size (default None: from ``in_features``).
    gamma: the divisor of the kernel-size rule (default 2).
    beta: the offset of the kernel-size rule (default 1).
    gate: maps the convolved vector to the scale (default ``nnx.sigmoid``).
    circular: pad the channel vector circularly, timm's ``CecaModule`` (default
      False: zeros, ``EcaModule``).
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3 (default 2).
    dtype, param_dtype, precision, kernel_init, rngs: the layer options (see the module
      docstring) of the convolution. It has no bias, so there is no ``bias_init``.
  """

  @flax_names
  def __init__(
      self, in_features: int | None = None, kernel_size: int | None = None, *,
      gamma: float = 2, beta: float = 1, gate: Activation = nnx.sigmoid, circular: bool = False,
      num_spatial_dims: int = 2, dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
      precision: PrecisionLike = None,
      kernel_init: Initializer = default_kernel_init, rngs: nnx.Rngs,
  ):
    if in_features is None and kernel_size is None:
      raise ValueError(
          "EfficientChannelAttention needs `in_features` or `kernel_size`; got neither.")
    if in_features is not None:
      in_features = check_positive_int(in_features, "in_features")
    self.in_features = in_features
    gamma = check_number(gamma, "gamma", positive=True)  # checked even when kernel_size
    beta = check_number(beta, "beta")  # is given, which makes them unused
    if kernel_size is None:  # then in_features is not None (refused above)
      kernel_size = eca_kernel_size(self.in_features, gamma, beta)  # pyright: ignore[reportArgumentType]
    kernel_size = check_positive_int(kernel_size, "kernel_size")
    if kernel_size % 2 == 0:
      raise ValueError(
          f"`kernel_size` must be odd (the output keeps C channels); got {kernel_size}.")
    self.kernel_size = kernel_size
    self.circular = check_bool(circular, "circular")
    if self.circular and in_features is not None:
      self._check_wrap(in_features)
    self._init_gate(gate, num_spatial_dims)
    layer = _layer_options(dtype, param_dtype, precision, kernel_init, rngs)
    pad = (kernel_size - 1) // 2
    padding = "CIRCULAR" if self.circular else ((pad, pad),)  # CIRCULAR: (k - 1) // 2 a side
    self.conv = nnx.Conv(1, 1, (kernel_size,), padding=padding, use_bias=False, **layer)

  def _check_wrap(self, channels: int) -> None:
    pad = (self.kernel_size - 1) // 2
    if pad > channels:
      raise ValueError(
          f"EfficientChannelAttention: circular padding of (kernel_size - 1) // 2 = {pad} "
          f"channels a side wraps more than once around {channels} channels, which PyTorch's "
          f"circular padding refuses; use a kernel_size of at most {2 * channels + 1}.")

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Gates ``(N, *spatial, C)`` or ``(*spatial, C)``; the output has its shape and dtype."""
    x, batch = self._prepare(inputs)
    if self.circular:
      self._check_wrap(x.shape[-1])
    pooled = spatial_mean(x)
    signal = pooled.reshape(x.shape[0], x.shape[-1], 1)  # channels as a 1-D signal
    scale = self.gate(self.conv(signal)).reshape(pooled.shape)
    return unbatch(_scaled(x, scale), batch)

  @classmethod
  def from_torch(cls, state_dict: Mapping, **options):
    """Builds the gate from timm ``EcaModule``'s state dict (``conv.weight``, shape ``(1, 1, k)``).

    timm ``CecaModule``'s state dict is the same: pass ``circular=True``.
    ``kernel_size`` comes from the weight; the weight does not hold the
    channel count, so pass ``in_features`` to have the input checked.

    Args:
      state_dict: the PyTorch module's ``state_dict()``, keys without a prefix.
      **options: other constructor arguments (``in_features``, ``gate``, ``dtype``...).
    """
    return load(cls, TORCH_KEYS["EfficientChannelAttention"], state_dict, options)
