"""nnx-pool: pooling modules and channel gates for Flax NNX, with PyTorch semantics.

Every module is channels-last, ``(N, *spatial, C)`` or unbatched ``(*spatial, C)``,
and window strides default to the window (PyTorch, Keras, TF), not to 1 (Flax).
"""

from nnx_pool._pool import AvgPool as AvgPool
from nnx_pool._pool import LPPool as LPPool
from nnx_pool._pool import MaxPool as MaxPool
from nnx_pool._pool import MinPool as MinPool
from nnx_pool._unpool import MaxUnpool as MaxUnpool

__version__ = "0.1.0"

__all__ = [
    "AvgPool",
    "LPPool",
    "MaxPool",
    "MaxUnpool",
    "MinPool",
]
