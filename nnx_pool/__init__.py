"""nnx-pool: pooling modules and channel gates for Flax NNX, with PyTorch semantics.

Every module is channels-last, ``(N, *spatial, C)`` or unbatched ``(*spatial, C)``,
and window strides default to the window (PyTorch, Keras, TF), not to 1 (Flax).

The public names load on first use (PEP 562), so that the regression kit,
``nnx_pool.regression``, starts even when an upgrade broke the modules: it then
reports the import failure with its traceback and exit code 2, instead of the
interpreter failing before the kit runs.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  from nnx_pool._adaptive import AdaptiveAvgPool as AdaptiveAvgPool
  from nnx_pool._adaptive import AdaptiveMaxPool as AdaptiveMaxPool
  from nnx_pool._adaptive import GlobalAvgPool as GlobalAvgPool
  from nnx_pool._adaptive import GlobalMaxPool as GlobalMaxPool
  from nnx_pool._adaptive import SelectAdaptivePool as SelectAdaptivePool
  from nnx_pool._backend import IMPLEMENTATION_DEFAULTS as IMPLEMENTATION_DEFAULTS
  from nnx_pool._backend import IMPLEMENTATIONS as IMPLEMENTATIONS
  from nnx_pool._backend import current_implementation as current_implementation
  from nnx_pool._backend import use_implementation as use_implementation
  from nnx_pool._gates import CBAM as CBAM
  from nnx_pool._gates import EffectiveSqueezeExcitation as EffectiveSqueezeExcitation
  from nnx_pool._gates import EfficientChannelAttention as EfficientChannelAttention
  from nnx_pool._gates import SqueezeExcitation as SqueezeExcitation
  from nnx_pool._gates import eca_kernel_size as eca_kernel_size
  from nnx_pool._gates import make_divisible as make_divisible
  from nnx_pool._geometry import output_shape as output_shape
  from nnx_pool._layout import ChannelsFirstWarning as ChannelsFirstWarning
  from nnx_pool._pool import AvgPool as AvgPool
  from nnx_pool._pool import LPPool as LPPool
  from nnx_pool._pool import MaxPool as MaxPool
  from nnx_pool._pool import MinPool as MinPool
  from nnx_pool._unpool import MaxUnpool as MaxUnpool

# The version pyproject.toml declares, as installed; a checkout that is only on sys.path
# has no metadata to read.
try:
  __version__ = importlib.metadata.version("nnx-pool")
except importlib.metadata.PackageNotFoundError:
  __version__ = "0+unknown"

# Each public name and the private module that defines it.
_WHERE = {
    "IMPLEMENTATION_DEFAULTS": "_backend",
    "IMPLEMENTATIONS": "_backend",
    "current_implementation": "_backend",
    "use_implementation": "_backend",
    "AdaptiveAvgPool": "_adaptive",
    "AdaptiveMaxPool": "_adaptive",
    "GlobalAvgPool": "_adaptive",
    "GlobalMaxPool": "_adaptive",
    "SelectAdaptivePool": "_adaptive",
    "CBAM": "_gates",
    "EffectiveSqueezeExcitation": "_gates",
    "EfficientChannelAttention": "_gates",
    "SqueezeExcitation": "_gates",
    "eca_kernel_size": "_gates",
    "make_divisible": "_gates",
    "AvgPool": "_pool",
    "LPPool": "_pool",
    "MaxPool": "_pool",
    "MinPool": "_pool",
    "MaxUnpool": "_unpool",
    "output_shape": "_geometry",
    "ChannelsFirstWarning": "_layout",
}

# Public submodules, also loaded on first use: the functional twins and the NumPy mirror.
_SUBMODULES = ("functional", "reference")

__all__ = sorted([*_WHERE, *_SUBMODULES])


def __getattr__(name: str) -> Any:
  if name in _SUBMODULES:
    return importlib.import_module(f"nnx_pool.{name}")
  if name not in _WHERE:
    raise AttributeError(f"module 'nnx_pool' has no attribute {name!r}")
  value = getattr(importlib.import_module(f"nnx_pool.{_WHERE[name]}"), name)
  globals()[name] = value  # later lookups are plain attribute reads
  return value


def __dir__() -> list[str]:
  return sorted({*globals(), *_WHERE, *_SUBMODULES})
