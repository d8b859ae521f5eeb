"""Channel gates: the family's conventions and the construction its members share.

Each gate pools its input to a summary, turns the summary into a scale with a
small learned map and a gate function (a sigmoid by default), and multiplies
the input by it. The family, one module each, as timm lays it out
(``timm/layers/squeeze_excite.py``, ``eca.py``, ``cbam.py``, ``global_context.py``):

* :mod:`nnx_pool._squeeze_excite`: :class:`~nnx_pool.SqueezeExcitation` (global mean,
  reduce, activation, expand, gate; Hu et al. 2018, https://arxiv.org/abs/1709.01507)
  and :class:`~nnx_pool.EffectiveSqueezeExcitation` (one C-to-C projection, hard
  sigmoid; CenterMask, Lee & Park 2020, https://arxiv.org/abs/1911.06667);
* :mod:`nnx_pool._eca`: :class:`~nnx_pool.EfficientChannelAttention` (a 1-D
  convolution across channels; ECA-Net, Wang et al. 2020,
  https://arxiv.org/abs/1910.03151);
* :mod:`nnx_pool._cbam`: :class:`~nnx_pool.CBAM` (a channel gate from mean and max,
  then a spatial gate; Woo et al. 2018, https://arxiv.org/abs/1807.06521) and timm's
  :class:`~nnx_pool.LightCBAM`;
* :mod:`nnx_pool._context_gates`: :class:`~nnx_pool.GlobalContext` (GCNet, Cao et al.
  2019, https://arxiv.org/abs/1904.11492).

This module holds what they share: the argument checks, the layer options, the
reduce/expand MLP, the BatchNorm, batching, :func:`make_divisible` and the summaries.

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
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from ._args import (
  check_bool,
  check_callable,
  check_num_spatial_dims,
  check_number,
  check_positive_int,
)
from ._jit import kernel
from ._layout import check_nonempty_spatial, prepare
from ._numerics import accumulation_dtype, true_divide
from ._select import extremum

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

  @staticmethod
  def _batch_norm(features: int, dtype, param_dtype, rngs: nnx.Rngs) -> nnx.BatchNorm:
    """A BatchNorm with PyTorch's defaults (momentum 0.9 = PyTorch's 0.1, epsilon 1e-5); like
    every :class:`flax.nnx.BatchNorm` it starts in training mode."""
    return nnx.BatchNorm(features, momentum=0.9, epsilon=1e-5, dtype=dtype,
                         param_dtype=param_dtype, rngs=rngs)

  def _running_average(self, value) -> bool | None:
    """A call's ``use_running_average``, checked (:func:`check_use_running_average`)."""
    return check_use_running_average(value, type(self).__name__)

  def _prepare(self, inputs) -> tuple[jax.Array, tuple[int, ...]]:
    """``(N, *spatial, C)`` and the batch shape that :func:`unbatch` restores."""
    module = type(self).__name__
    x, batch = prepare(inputs, self.num_spatial_dims, kind="float", module=module,
                       in_features=self.in_features, owner=self)
    check_nonempty_spatial(x, module)  # a gate pools the whole map
    return x, batch
