"""Functional twins of the pooling modules, for use inside an NNX module's ``__call__``.

Each is called as ``(inputs, <the module's arguments>)``, with the module's
names, validation and errors, and runs the implementation the module runs::

    >>> import jax.numpy as jnp
    >>> from nnx_pool import MaxPool, functional as F
    >>> x = jnp.arange(32.0).reshape(2, 4, 4, 1)
    >>> bool((F.max_pool(x, 3, 2, 1) == MaxPool(3, 2, 1)(x)).all())
    True

They jit, vmap and differentiate as the modules do. One default differs from the
modules: ``avg_pool``, ``max_pool`` and ``min_pool`` take Flax's names and argument
order, so ``strides`` has **no default** there. Flax's functions default it to 1 and
PyTorch's (and the modules) to the window; omitting it (or passing None) is a
TypeError that names both, so swapping ``nnx.avg_pool(x, (2, 2))`` for
``F.avg_pool(x, (2, 2))`` cannot silently change the output's shape.

Coming from ``flax.nnx`` pooling
--------------------------------

Where a Flax model calls ``nnx.max_pool(x, (3, 3), strides=(2, 2),
padding=((1, 1), (1, 1)))``, the PyTorch semantics are ``F.max_pool(x, 3, 2, 1)``.
Every difference between ``flax.nnx.{avg,max,min}_pool`` and these functions
(flax 0.12.8; guide 6 runs each row):

========================  ==============================  ===================================
what                      ``flax.nnx``                    ``nnx_pool.functional``
========================  ==============================  ===================================
``strides``               default 1 (None means 1)        required: pass ``1`` or the window
``window_shape`` an int   TypeError (a tuple needed)      repeated over ``num_spatial_dims``
``padding=1`` (an int)    TypeError                       both sides of every dim (PyTorch)
``padding`` per dim       ``(low, high)``, any size       also ints; at most half the window
``count_include_pad``     True: ``prod(window)``          True: PyTorch's clipped window (the
                                                          same under ``"SAME"``)
bf16/f16 average          summed in the input dtype       summed in float32, rounded once
window over the input     an empty array                  ValueError naming the ways out
``ceil_mode``,            not available                   as PyTorch
``dilation``,
``return_indices``
gradient on ties          where XLA's lowering puts it    the first extremum (PyTorch's)
batch axes                any number before the window    the same; an NCHW-looking input
                                                          warns (``ChannelsFirstWarning``)
========================  ==============================  ===================================
"""

from ._adaptive import adaptive_avg_pool, adaptive_max_pool
from ._blur import blur_pool
from ._fractional import fractional_max_pool
from ._generalized import gem_pool, lse_plus_pool
from ._global import global_avg_pool, global_max_pool
from ._median import median_pool
from ._pool import avg_pool, lp_pool, max_pool, min_pool
from ._unpool import max_unpool

# Grouped by family: window pools, unpooling, adaptive and global pools, generalized
# pools, and timm's anti-aliased, median and PyTorch's fractional pools.
__all__ = ["avg_pool", "max_pool", "min_pool", "lp_pool", "max_unpool",
           "adaptive_avg_pool", "adaptive_max_pool", "global_avg_pool", "global_max_pool",
           "gem_pool", "lse_plus_pool", "blur_pool", "median_pool", "fractional_max_pool"]
