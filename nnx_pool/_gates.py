"""Channel gates: squeeze-and-excitation and its relatives, channels-last.

Each gate pools its input to a summary, turns the summary into a scale with a
small learned map and a gate function (a sigmoid by default), and multiplies
the input by it:

* :class:`SqueezeExcitation`: global mean, reduce, activation, expand, gate
  (Hu et al. 2018, https://arxiv.org/abs/1709.01507);
* :class:`EffectiveSqueezeExcitation`: global mean, one C-to-C projection,
  hard sigmoid (CenterMask, Lee & Park 2020, https://arxiv.org/abs/1911.06667);
* :class:`EfficientChannelAttention`: global mean, a 1-D convolution across
  channels, sigmoid (ECA-Net, Wang et al. 2020, https://arxiv.org/abs/1910.03151);
* :class:`CBAM`: a channel gate from mean and max, then a spatial gate
  (Woo et al. 2018, https://arxiv.org/abs/1807.06521).

timm's light CBAM and GCNet's global context follow the same conventions in
:mod:`nnx_pool._context_gates`.

Inputs are ``(*batch, *spatial, C)``: usually ``(N, *spatial, C)``, or unbatched
``(*spatial, C)``. As for the global pools, ``num_spatial_dims`` (default 2) says
how many axes lie before the channels, so every axis before them is a batch
axis; the channel gates pool over exactly those spatial axes and their
one-pixel scale broadcasts back over them.

The output has the input's dtype. The summaries (means over space or over
channels) accumulate in float32 for float16/bfloat16 and are rounded to the
input's dtype, as :class:`~nnx_pool.GlobalAvgPool` gives them; maxima are exact.
The scale is computed in the layers' computation dtype: ``dtype`` when given,
else the promotion of the summary and the parameters, so float32 for a
bfloat16 input with the default ``param_dtype=float32``. The product
``x * scale`` is taken in the wider of the two dtypes and rounded once to the
input's dtype, so a bfloat16 model keeps bfloat16 activations.

Every Linear and Conv of a gate takes Flax's layer options, as
:class:`flax.nnx.Linear` and :class:`flax.nnx.Conv` do; each class says which
layers they reach:

* ``dtype``: the computation dtype of the scale (default None: the promotion of
  the pooled summary and the params, float32 by default); the output keeps the
  input's dtype;
* ``param_dtype``: the parameter dtype (default float32);
* ``precision``: the ``jax.lax`` precision (default None: JAX's default);
* ``kernel_init``: the kernel initializer (default Flax's, ``lecun_normal()``);
* ``bias_init``: the bias initializer of the layers with a bias (default Flax's, zeros);
* ``rngs``: random number streams for the initial parameters.

Every gate has a ``from_torch(state_dict, **options)`` classmethod that builds
it from the state dict of the PyTorch module it mirrors (torch tensors or
NumPy arrays; torch itself is not imported). Sizes come from the weights; the
options are the remaining constructor arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx.nn.linear import default_bias_init, default_kernel_init
from flax.typing import Dtype, PrecisionLike
from jax import lax

from nnx_pool._args import (
  check_bool,
  check_callable,
  check_num_spatial_dims,
  check_number,
  check_positive_int,
  flax_names,
)
from nnx_pool._jit import kernel
from nnx_pool._layout import check_nonempty_spatial, prepare, unbatch
from nnx_pool._numerics import accumulation_dtype, spatial_mean, true_divide
from nnx_pool._select import extremum
from nnx_pool._torch_state import TORCH_KEYS, load

Activation = Callable[[jax.Array], jax.Array]
Initializer = Callable[..., jax.Array]


def make_divisible(v: float, divisor: int = 8, min_value: int | None = None,
                   round_limit: float = 0.9) -> int:
  """timm's channel rounding: ``v`` to the nearest multiple of ``divisor``, at least ``min_value``.

  ``max(min_value, int(v + divisor / 2) // divisor * divisor)``, plus
  ``divisor`` when that falls below ``round_limit * v``; ``min_value``
  defaults to ``divisor``.

  >>> make_divisible(64 / 16, 8, round_limit=0.0), make_divisible(480 / 16, 8, round_limit=0.0)
  (8, 32)
  """
  min_value = min_value or divisor
  new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
  if new_v < round_limit * v:
    new_v += divisor
  return new_v


# ----------------------------------------------------------------------------
# Argument checks.
# ----------------------------------------------------------------------------


def _scaled(x: jax.Array, scale: jax.Array) -> jax.Array:
  """``x * scale`` rounded once to ``x``'s dtype (the scale may be wider, e.g. float32)."""
  return (x * scale).astype(x.dtype)


@kernel(static_argnums=1)
def avg_max_summary(x: jax.Array, axes: tuple[int, ...] | None = None) -> jax.Array:
  """timm's ``0.5 * x.mean(axes) + 0.5 * x.amax(axes)``, kept as size-1 axes (default: space).

  The sum, its correctly rounded division and the combination are in float32 for
  float16/bfloat16 inputs, rounded once to ``x``'s dtype; the max propagates NaN
  and ties share its gradient, as ``torch.amax``.
  """
  axes = tuple(range(1, x.ndim - 1)) if axes is None else axes
  acc = accumulation_dtype(x.dtype)
  total = jnp.sum(x, axis=axes, keepdims=True, dtype=acc)
  average = true_divide(total, math.prod(x.shape[a] for a in axes))
  return (0.5 * average + 0.5 * extremum(x, axes, "max", keepdims=True).astype(acc)
          ).astype(x.dtype)


def check_use_running_average(value, module: str) -> bool | None:
  """A gate's per-call ``use_running_average``: True, False or None (the module's mode)."""
  if value is None:
    return None
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(
        f"{module}: `use_running_average` must be True, False or None (None: the module's "
        f"mode, set by .eval() and .train()); got {value!r}.")
  return bool(value)


def _check_initializer(value, name: str) -> Initializer:
  if not callable(value):
    example = "zeros_init()" if name == "bias_init" else "lecun_normal()"
    raise TypeError(
        f"`{name}` must be an initializer, a callable (key, shape, dtype) -> array such as "
        f"nnx.initializers.{example}; got {value!r}.")
  # Any callable passes (its signature cannot be checked here), as Initializer promises.
  return value  # pyright: ignore[reportReturnType]


def _is_precision_name(value) -> bool:
  """Whether ``value`` is a string that ``jax.lax.Precision`` reads ('highest', 'float32'...)."""
  try:
    lax.Precision(value)
  except ValueError:
    return False
  return True


def _check_precision(value):
  """``precision`` as :class:`flax.nnx.Linear` and ``jax.lax.dot_general`` take it."""
  if value is None or isinstance(value, (lax.Precision, lax.DotAlgorithm, lax.DotAlgorithmPreset)):
    return value
  if isinstance(value, str) and (_is_precision_name(value)
                                 or value in lax.DotAlgorithmPreset.__members__):
    return value
  if isinstance(value, (tuple, list)) and len(value) == 2 and (
      all(isinstance(p, lax.Precision) for p in value)
      or all(isinstance(p, str) and _is_precision_name(p) for p in value)):
    return value
  error = ValueError if isinstance(value, (str, tuple, list)) else TypeError
  raise error(
      "`precision` must be None, a jax.lax.Precision, a name such as 'highest' or 'default', "
      "a pair of those (both Precision or both names), a jax.lax.DotAlgorithmPreset or its "
      f"name, or a jax.lax.DotAlgorithm, as flax.nnx.Linear takes it; got {value!r}.")


def _layer_options(dtype, param_dtype, precision, kernel_init, rngs) -> dict:
  """The options every Linear and Conv of a gate takes, ``precision`` and ``kernel_init`` checked.

  Layers with a bias add ``bias_init``.
  """
  return dict(dtype=dtype, param_dtype=param_dtype, precision=_check_precision(precision),
              kernel_init=_check_initializer(kernel_init, "kernel_init"), rngs=rngs)


def _squeeze_width(in_features: int, squeeze_features, rd_ratio, rd_divisor) -> int:
  """The hidden width: given, or timm's ``make_divisible(C * rd_ratio, rd_divisor, 0)``.

  The last argument is timm's ``round_limit``.
  """
  if squeeze_features is None:
    rd_ratio = check_number(rd_ratio, "rd_ratio", positive=True)
    squeeze_features = make_divisible(
        in_features * rd_ratio, check_positive_int(rd_divisor, "rd_divisor"), round_limit=0.0)
  return check_positive_int(squeeze_features, "squeeze_features")


class _Gate(nnx.Module):
  """Shared plumbing: argument checks, the reduce/expand maps and batching."""

  def _init_width(self, in_features, squeeze_features, rd_ratio, rd_divisor) -> None:
    """Checks and stores ``in_features`` and the hidden width of the reduce/expand maps."""
    self.in_features = check_positive_int(in_features, "in_features")
    self.squeeze_features = _squeeze_width(in_features, squeeze_features, rd_ratio, rd_divisor)

  def _init_gate(self, gate, num_spatial_dims) -> None:
    """Checks and stores the gate function and the number of spatial dims."""
    self.gate = check_callable(gate, "gate")
    self.num_spatial_dims = check_num_spatial_dims(num_spatial_dims)

  def _init_mlp(self, activation, gate, use_bias, num_spatial_dims, layer: dict,
                bias_init) -> None:
    """Checks the rest of the arguments and builds ``fc1`` (C to hidden) and ``fc2`` (back).

    Call after :meth:`_init_width`; ``layer`` comes from :func:`_layer_options`.
    """
    self.activation = check_callable(activation, "activation")
    self._init_gate(gate, num_spatial_dims)
    use_bias = check_bool(use_bias, "use_bias")
    bias_init = _check_initializer(bias_init, "bias_init")
    self.fc1 = nnx.Linear(self.in_features, self.squeeze_features, use_bias=use_bias,
                          bias_init=bias_init, **layer)
    self.fc2 = nnx.Linear(self.squeeze_features, self.in_features, use_bias=use_bias,
                          bias_init=bias_init, **layer)

  def _prepare(self, inputs) -> tuple[jax.Array, tuple[int, ...]]:
    """``(N, *spatial, C)`` and the batch shape that :func:`unbatch` restores."""
    module = type(self).__name__
    x, batch = prepare(inputs, self.num_spatial_dims, kind="float", module=module,
                       in_features=self.in_features, owner=self)
    check_nonempty_spatial(x, module)  # a gate pools the whole map
    return x, batch


# ----------------------------------------------------------------------------
# Gates.
# ----------------------------------------------------------------------------


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
    self.bn = (nnx.BatchNorm(self.squeeze_features, momentum=0.9, epsilon=1e-5, dtype=dtype,
                             param_dtype=param_dtype, rngs=rngs) if self.norm else None)

  def __call__(self, inputs: jax.Array, use_running_average: bool | None = None) -> jax.Array:
    """Gates ``(N, *spatial, C)`` or ``(*spatial, C)``; the output has its shape and dtype.

    Args:
      inputs: the feature map.
      use_running_average: with ``norm=True``, normalise with the BatchNorm's running
        statistics (True) or the batch's, updating the running ones (False), for this
        call only (default None: the module's mode, ``.eval()`` or ``.train()``), as
        :class:`flax.nnx.BatchNorm` takes it; without a BatchNorm it changes nothing.
    """
    use_running_average = check_use_running_average(use_running_average, type(self).__name__)
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


class CBAM(_Gate):
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
      (see the module docstring) of the MLP layers and the spatial convolution;
      ``bias_init`` is used when ``use_bias``. The BatchNorm takes ``dtype`` and
      ``param_dtype`` and keeps Flax's initial scale 1 and bias 0.
  """

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
    self._init_width(in_features, squeeze_features, rd_ratio, rd_divisor)
    k = check_positive_int(spatial_kernel_size, "spatial_kernel_size")
    if k % 2 == 0:
      raise ValueError(f"`spatial_kernel_size` must be odd (to keep the size); got {k}.")
    self.spatial_kernel_size = k
    layer = _layer_options(dtype, param_dtype, precision, kernel_init, rngs)
    self._init_mlp(activation, gate, use_bias, num_spatial_dims, layer, bias_init)
    pad = ((k - 1) // 2, (k - 1) // 2)
    self.spatial_conv = nnx.Conv(
        2, 1, (k,) * self.num_spatial_dims, padding=(pad,) * self.num_spatial_dims,
        use_bias=False, **layer,
    )
    self.spatial_norm = nnx.BatchNorm(
        1, momentum=0.9, epsilon=1e-5, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def __call__(self, inputs: jax.Array, use_running_average: bool | None = None) -> jax.Array:
    """Gates ``(N, *spatial, C)`` or ``(*spatial, C)``; the output has its shape and dtype.

    Args:
      inputs: the feature map.
      use_running_average: normalise the spatial map with the BatchNorm's running
        statistics (True) or the batch's, updating the running ones (False), for this
        call only (default None: the module's mode, ``.eval()`` or ``.train()``), as
        :class:`flax.nnx.BatchNorm` takes it.
    """
    use_running_average = check_use_running_average(use_running_average, type(self).__name__)
    x, batch = self._prepare(inputs)
    space = tuple(range(1, x.ndim - 1))

    def mlp(v):
      return self.fc2(self.activation(self.fc1(v)))

    x = _scaled(x, self.gate(mlp(spatial_mean(x)) + mlp(extremum(x, space, "max", keepdims=True))))
    # The max before the mean: in the other order XLA:CPU fuses the sum differently, 1e-6
    # away from the shipped baseline (recorded with this order).
    channel_max = extremum(x, -1, "max", keepdims=True)
    channel_sum = jnp.sum(x, axis=-1, keepdims=True, dtype=accumulation_dtype(x.dtype))
    channel_mean = true_divide(channel_sum, x.shape[-1]).astype(x.dtype)
    maps = jnp.concatenate([channel_mean, channel_max], axis=-1)
    normed = self.spatial_norm(self.spatial_conv(maps),
                               use_running_average=use_running_average)
    y = _scaled(x, self.gate(normed))
    return unbatch(y, batch)

  @classmethod
  def from_torch(cls, state_dict: Mapping, **options):
    """Builds the gate from timm ``CbamModule``'s state dict.

    Keys: ``channel.fc1.weight``, ``channel.fc2.weight`` (with or without
    ``channel.fc1.bias``/``channel.fc2.bias``), ``spatial.conv.conv.weight``
    ``(1, 2, k, k)`` and ``spatial.conv.bn.{weight, bias, running_mean,
    running_var}`` (``num_batches_tracked`` is accepted and ignored).
    ``in_features``, ``squeeze_features``, ``use_bias``,
    ``spatial_kernel_size`` and ``num_spatial_dims`` come from the weights. The
    module is returned in training mode, as PyTorch's; call ``.eval()``.

    Args:
      state_dict: the PyTorch module's ``state_dict()``, keys without a prefix.
      **options: other constructor arguments (``activation``, ``gate``, ``dtype``...).
    """
    return load(cls, TORCH_KEYS["CBAM"], state_dict, options)
