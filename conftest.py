"""Root pytest configuration: strict JAX numerics settings for the whole suite."""

import jax

# Implicit rank promotion hides layout bugs (an (N, C) array broadcast against an
# (N, H, W, C) one); raise instead, as Equinox's suite does.
jax.config.update("jax_numpy_rank_promotion", "raise")
