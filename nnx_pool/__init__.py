"""nnx-pool: pooling modules and channel gates for Flax NNX, with PyTorch semantics.

Every module is channels-last, ``(N, *spatial, C)`` or unbatched ``(*spatial, C)``,
and window strides default to the window (PyTorch, Keras, TF), not to 1 (Flax).
"""

from nnx_pool._adaptive import AdaptiveAvgPool as AdaptiveAvgPool
from nnx_pool._adaptive import AdaptiveMaxPool as AdaptiveMaxPool
from nnx_pool._adaptive import GlobalAvgPool as GlobalAvgPool
from nnx_pool._adaptive import GlobalMaxPool as GlobalMaxPool
from nnx_pool._adaptive import SelectAdaptivePool as SelectAdaptivePool
from nnx_pool._gates import CBAM as CBAM
from nnx_pool._gates import EffectiveSqueezeExcitation as EffectiveSqueezeExcitation
from nnx_pool._gates import EfficientChannelAttention as EfficientChannelAttention
from nnx_pool._gates import SqueezeExcitation as SqueezeExcitation
from nnx_pool._gates import eca_kernel_size as eca_kernel_size
from nnx_pool._gates import hard_sigmoid as hard_sigmoid
from nnx_pool._gates import make_divisible as make_divisible
from nnx_pool._pool import AvgPool as AvgPool
from nnx_pool._pool import LPPool as LPPool
from nnx_pool._pool import MaxPool as MaxPool
from nnx_pool._pool import MinPool as MinPool
from nnx_pool._unpool import MaxUnpool as MaxUnpool

__version__ = "0.1.0"

__all__ = [
    "AdaptiveAvgPool",
    "AdaptiveMaxPool",
    "AvgPool",
    "CBAM",
    "EffectiveSqueezeExcitation",
    "EfficientChannelAttention",
    "GlobalAvgPool",
    "GlobalMaxPool",
    "LPPool",
    "MaxPool",
    "MaxUnpool",
    "MinPool",
    "SelectAdaptivePool",
    "SqueezeExcitation",
    "eca_kernel_size",
    "hard_sigmoid",
    "make_divisible",
]
