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
from typing import Any

# The version pyproject.toml declares, as installed; a checkout that is only on sys.path
# has no metadata to read.
try:
  __version__ = importlib.metadata.version("nnx-pool")
except importlib.metadata.PackageNotFoundError:
  __version__ = "0+unknown"

# Each public name and the private module that defines it: the one list of them. Type
# checkers read __init__.pyi, which is generated from it (tests/test_functional.py checks
# that it is up to date and prints the text to write when it is not).
_WHERE = {
    "IMPLEMENTATION_DEFAULTS": "_backend",
    "IMPLEMENTATIONS": "_backend",
    "current_implementation": "_backend",
    "set_default_implementation": "_backend",
    "use_implementation": "_backend",
    "AdaptiveAvgPool": "_adaptive",
    "AdaptiveMaxPool": "_adaptive",
    "GlobalAvgPool": "_global",
    "GlobalMaxPool": "_global",
    "SelectAdaptivePool": "_adaptive",
    "AttentionPool": "_attention_pool",
    "AttentionPoolLatent": "_latent_pool",
    "BlurPool": "_blur",
    "CBAM": "_cbam",
    "LightCBAM": "_cbam",
    "GlobalContext": "_context_gates",
    "EfficientChannelAttention": "_eca",
    "eca_kernel_size": "_eca",
    "GeMPool": "_generalized",
    "LsePlusPool": "_generalized",
    "make_divisible": "_gates",
    "EffectiveSqueezeExcitation": "_squeeze_excite",
    "SqueezeExcitation": "_squeeze_excite",
    "AvgPool": "_pool",
    "LPPool": "_pool",
    "MaxPool": "_pool",
    "MinPool": "_pool",
    "MaxUnpool": "_unpool",
    "FractionalMaxPool": "_fractional",
    "MedianPool": "_median",
    "output_shape": "_geometry",
    "ChannelsFirstWarning": "_layout",
}

# Public submodules, also loaded on first use: the functional twins and the NumPy mirror.
_SUBMODULES = ("functional", "reference")

# Type checkers read __all__ from __init__.pyi, which spells it out.
__all__ = sorted([*_WHERE, *_SUBMODULES])  # pyright: ignore[reportUnsupportedDunderAll]


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
