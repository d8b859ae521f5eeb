"""The squeeze-and-excitation gates: SE and effective SE, channels-last.

* :class:`SqueezeExcitation`: global mean, reduce, activation, expand, gate (Hu et
  al. 2018, https://arxiv.org/abs/1709.01507), as torchvision's
  ``SqueezeExcitation`` and timm's ``SEModule`` (timm 1.0.31
  ``timm/layers/squeeze_excite.py``) and EfficientNet's ``SqueezeExcite``;
* :class:`EffectiveSqueezeExcitation`: global mean, one C-to-C projection, hard
  sigmoid (CenterMask, Lee & Park 2020, https://arxiv.org/abs/1911.06667), as
  timm's ``EffectiveSEModule``.

The family's conventions (inputs, dtypes, the layer options, ``from_torch``) are
in :mod:`nnx_pool._gates`.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn.linear import default_bias_init, default_kernel_init
from flax.typing import Dtype, PrecisionLike

from ._args import check_bool, check_positive_int, flax_names
from ._gates import (
  Activation,
  Initializer,
  _check_initializer,
  _Gate,
  _layer_options,
  _scaled,
  avg_max_summary,
)
from ._layout import unbatch
from ._numerics import spatial_mean
from ._torch_keys import TORCH_KEYS
from ._torch_state import load


class SqueezeExcitation(_Gate):
  """Squeeze-and-excitation: ``x * gate(fc2(activation(fc1(mean over space of x))))``.

  Hu, Shen and Sun, "Squeeze-and-Excitation Networks", CVPR 2018,
  https://arxiv.org/abs/1709.01507. The reduce and expand maps are
  :class:`flax.nnx.Linear` layers on the pooled vector, equivalent to the 1x1
  convolutions of torchvision's ``SqueezeExcitation`` and timm's ``SEModule``.
  When ``squeeze_features`` is None the width is timm's
  ``make_divisible(in_features * rd_ratio, rd_divisor, round_limit=0)``
  (64 channels give 8, 480 give 32).

  timm ``SEModule``'s two options: ``add_maxpool=True`` squeezes with
  ``0.5 * mean + 0.5 * max`` over space (the max propagates NaN, ties share its
  gradient, as ``torch.amax``); ``norm=True`` puts a BatchNorm between ``fc1``
  and the activation (timm's ``norm_layer=nn.BatchNorm2d``, rexnet's
  ``SEWithNorm``), which, like every :class:`flax.nnx.BatchNorm`, starts in
  training mode (batch statistics, momentum 0.9 = PyTorch's 0.1, epsilon 1e-5):
  call ``.eval()`` for inference.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from nnx_pool import SqueezeExcitation
    >>> se = SqueezeExcitation(64, rngs=nnx.Rngs(0))
    >>> se.fc1.kernel.shape, se(jnp.ones((2, 5, 7, 64))).shape
    ((64, 8), (2, 5, 7, 64))

  Args:
    in_features: the channel count ``C``.
    squeeze_features: the reduced width (default None: from ``rd_ratio``).
    rd_ratio: the reduction ratio when ``squeeze_features`` is None (default 1/16).
    rd_divisor: the reduced width is rounded to a multiple of this (default 8).
    activation: applied after the reduction (default ``nnx.relu``).
    gate: maps the expanded vector to the scale (default ``nnx.sigmoid``).
    use_bias: whether both maps have a bias (default True).
    add_maxpool: squeeze with ``0.5 * mean + 0.5 * max`` (default False: the mean).
    norm: a BatchNorm between ``fc1`` and the activation (default False).
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3 (default 2).
    dtype, param_dtype, precision, kernel_init, bias_init, rngs: the layer options
      (see the module docstring) of both maps. The BatchNorm takes ``dtype`` and
      ``param_dtype`` and keeps Flax's initial scale 1 and bias 0.
  """

  @flax_names
  def __init__(
      self, in_features: int, squeeze_features: int | None = None, *,
      rd_ratio: float = 1 / 16, rd_divisor: int = 8,
      activation: Activation = nnx.relu, gate: Activation = nnx.sigmoid, use_bias: bool = True,
      add_maxpool: bool = False, norm: bool = False,
      num_spatial_dims: int = 2, dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
      precision: PrecisionLike = None,
      kernel_init: Initializer = default_kernel_init,
      bias_init: Initializer = default_bias_init, rngs: nnx.Rngs,
  ):
    self._init_width(in_features, squeeze_features, rd_ratio, rd_divisor)
    self.add_maxpool = check_bool(add_maxpool, "add_maxpool")
    self.norm = check_bool(norm, "norm")
    layer = _layer_options(dtype, param_dtype, precision, kernel_init, rngs)
    self._init_mlp(activation, gate, use_bias, num_spatial_dims, layer, bias_init)
    self.bn = (self._batch_norm(self.squeeze_features, dtype, param_dtype, rngs) if self.norm
               else None)

  def __call__(self, inputs: jax.Array, use_running_average: bool | None = None) -> jax.Array:
    """Gates ``(N, *spatial, C)`` or ``(*spatial, C)``; the output has its shape and dtype.

    Args:
      inputs: the feature map.
      use_running_average: with ``norm=True``, normalise with the BatchNorm's running
        statistics (True) or the batch's, updating the running ones (False), for this
        call only (default None: the module's mode, ``.eval()`` or ``.train()``), as
        :class:`flax.nnx.BatchNorm` takes it; without a BatchNorm it changes nothing.
    """
    use_running_average = self._running_average(use_running_average)
    x, batch = self._prepare(inputs)
    squeezed = avg_max_summary(x) if self.add_maxpool else spatial_mean(x)
    hidden = self.fc1(squeezed)
    if self.bn is not None:
      hidden = self.bn(hidden, use_running_average=use_running_average)
    scale = self.gate(self.fc2(self.activation(hidden)))
    return unbatch(_scaled(x, scale), batch)

  @classmethod
  def from_torch(cls, state_dict: Mapping, **options):
    """Builds the gate from a PyTorch squeeze-and-excitation state dict.

    Accepted key sets: torchvision ``SqueezeExcitation`` and timm ``SEModule``
    (``fc1.weight``, ``fc2.weight``, with or without ``fc1.bias``/``fc2.bias``,
    and with ``bn.{weight, bias, running_mean, running_var}`` when timm's
    ``norm_layer`` is a BatchNorm; ``bn.num_batches_tracked`` is accepted and
    ignored), and timm EfficientNet ``SqueezeExcite`` (``conv_reduce.*``,
    ``conv_expand.*``). Weights are ``(out, in, 1, 1)`` or ``(out, in)``.
    ``in_features``, ``squeeze_features``, ``use_bias`` and ``norm`` come from
    the weights; ``add_maxpool`` does not (pass it). Pass the peer's activation
    and gate when they are not ReLU and sigmoid (EfficientNet:
    ``activation=nnx.silu``; MobileNetV3: ``gate=jax.nn.hard_sigmoid``). With
    a BatchNorm the module is returned in training mode, as PyTorch's; call
    ``.eval()``.

    Args:
      state_dict: the PyTorch module's ``state_dict()``, keys without a prefix.
      **options: other constructor arguments (``activation``, ``gate``, ``dtype``...).
    """
    return load(cls, TORCH_KEYS["SqueezeExcitation"], state_dict, options)


class EffectiveSqueezeExcitation(_Gate):
  """Effective squeeze-and-excitation: ``x * gate(fc(mean over space of x)))``, one C-to-C map.

  Lee and Park, "CenterMask: Real-Time Anchor-Free Instance Segmentation",
  CVPR 2020, https://arxiv.org/abs/1911.06667, as timm's ``EffectiveSEModule``:
  no reduction, so no channel information is lost, a projection with bias,
  and a hard-sigmoid gate ``relu6(x + 3) / 6``.

  Example usage::

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from nnx_pool import EffectiveSqueezeExcitation
    >>> ese = EffectiveSqueezeExcitation(4, rngs=nnx.Rngs(0))
    >>> ese.fc.kernel.shape, ese(jnp.ones((3, 3, 4))).shape  # unbatched (H, W, C)
    ((4, 4), (3, 3, 4))

  Args:
    in_features: the channel count ``C``.
    gate: maps the projected vector to the scale (default ``jax.nn.hard_sigmoid``,
      ``relu6(x + 3) / 6``).
    num_spatial_dims: the axes between batch and channels, 1, 2 or 3 (default 2).
    dtype, param_dtype, precision, kernel_init, bias_init, rngs: the layer options
      (see the module docstring) of the projection.
  """

  @flax_names
  def __init__(
      self, in_features: int, *, gate: Activation = jax.nn.hard_sigmoid,
      num_spatial_dims: int = 2, dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
      precision: PrecisionLike = None,
      kernel_init: Initializer = default_kernel_init,
      bias_init: Initializer = default_bias_init, rngs: nnx.Rngs,
  ):
    self.in_features = check_positive_int(in_features, "in_features")
    self._init_gate(gate, num_spatial_dims)
    layer = _layer_options(dtype, param_dtype, precision, kernel_init, rngs)
    self.fc = nnx.Linear(self.in_features, self.in_features,
                         bias_init=_check_initializer(bias_init, "bias_init"), **layer)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Gates ``(N, *spatial, C)`` or ``(*spatial, C)``; the output has its shape and dtype."""
    x, batch = self._prepare(inputs)
    return unbatch(_scaled(x, self.gate(self.fc(spatial_mean(x)))), batch)

  @classmethod
  def from_torch(cls, state_dict: Mapping, **options):
    """Builds the gate from timm ``EffectiveSEModule``'s state dict (``fc.weight``, ``fc.bias``).

    ``in_features`` comes from the weight, ``(C, C, 1, 1)`` or ``(C, C)``.
    timm's ``add_maxpool=True`` variant is not supported.

    Args:
      state_dict: the PyTorch module's ``state_dict()``, keys without a prefix.
      **options: other constructor arguments (``gate``, ``dtype``...).
    """
    return load(cls, TORCH_KEYS["EffectiveSqueezeExcitation"], state_dict, options)
