"""Functional twins of the pooling modules, for use inside an NNX module's ``__call__``.

Each is called as ``(inputs, <the module's arguments>)``, with the module's
names, defaults, validation and errors, and runs the implementation the module
runs::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import MaxPool, functional as F
    >>> x = jnp.arange(32.0).reshape(2, 4, 4, 1)
    >>> bool((F.max_pool(x, 3, 2, 1) == MaxPool(3, 2, 1)(x)).all())
    True

They jit, vmap and differentiate as the modules do. Where a Flax model calls
``nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))``, the PyTorch
semantics are ``F.max_pool(x, 3, 2, 1)``: strides default to the window, an int
is repeated over ``num_spatial_dims`` (default 2), and ``ceil_mode``,
``dilation`` and ``return_indices`` are there.
"""

from nnx_pool._adaptive import (
  adaptive_avg_pool,
  adaptive_max_pool,
  global_avg_pool,
  global_max_pool,
)
from nnx_pool._pool import avg_pool, lp_pool, max_pool, min_pool
from nnx_pool._unpool import max_unpool

# Grouped by family: window pools, unpooling, adaptive and global pools.
__all__ = ["avg_pool", "max_pool", "min_pool", "lp_pool", "max_unpool",
           "adaptive_avg_pool", "adaptive_max_pool", "global_avg_pool", "global_max_pool"]
