"""The random samples of fractional max pooling: PyTorch's ``_random_samples``, given or drawn.

A call's samples are ``(*batch, C, num_spatial_dims)`` floats in ``[0, 1)``, PyTorch's
``_random_samples`` (an unbatched input also takes PyTorch's ``(1, C, num_spatial_dims)``):
given as ``samples`` (concrete ones checked to lie in ``[0, 1)``), or drawn with
``jax.random.uniform`` in the input's dtype from a key: ``fractional_max_pool``'s ``key``,
or :class:`~nnx_pool.FractionalMaxPool`'s ``rngs`` (an ``nnx.Rngs``, whose ``dropout``
stream is used, falling back to ``default`` as NNX does; an ``nnx.RngStream``; or a key).
There is no hidden global random state: with none of them, the call is an error.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ._layout import as_array, concrete_values

# The nnx.Rngs stream that the module draws its samples from.
RNG_STREAM = "dropout"


def samples_from(samples, key, x_dtype, batch: tuple[int, ...], channels: int, ndim: int,
                  name: str, source: str) -> jax.Array:
  """``(N, C, ndim)`` samples in the input's dtype: given, or drawn with ``key``."""
  n = math.prod(batch)
  if samples is not None and key is not None:
    raise TypeError(f"{name}: pass `samples` or `{source}`, not both.")
  if samples is None and key is None:
    hint = ("rngs=nnx.Rngs(dropout=0) (its 'dropout' stream, or 'default')"
            if source == "rngs" else "key=jax.random.key(0)")
    raise TypeError(
        f"{name} needs random samples, and there is no hidden global random state: pass "
        f"samples=<array of shape {(*batch, channels, ndim)} in [0, 1)> (PyTorch's "
        f"_random_samples) or {hint}.")
  if samples is None:
    return jax.random.uniform(key, (n, channels, ndim), dtype=x_dtype)  # pyright: ignore[reportArgumentType]  # set: one of the two is
  samples = as_array(samples, "samples")
  if not jnp.issubdtype(samples.dtype, jnp.floating):
    raise TypeError(
        f"{name}: `samples` must be floating (PyTorch's torch.rand draws, in [0, 1)); got "
        f"dtype {samples.dtype}.")
  expected = (*batch, channels, ndim)
  forms = [expected]
  if not batch:
    forms.append((1, channels, ndim))  # PyTorch's form for an unbatched input
  if tuple(samples.shape) not in forms:
    accepted = " or ".join(str(f) for f in forms)
    raise ValueError(
        f"{name}: `samples` must have shape {accepted} (the input's batch axes, its "
        f"{channels} channels, one sample per spatial dim); got {tuple(samples.shape)}.")
  _check_sample_range(samples, name)
  return samples.reshape(n, channels, ndim).astype(x_dtype)


def _check_sample_range(samples: jax.Array, name: str) -> None:
  """Refuses concrete samples outside ``[0, 1)`` or NaN; traced ones (under jit) and ones
  that span processes pass unseen."""
  values = concrete_values(samples, np.float64)
  if values is None:
    return
  outside = values[~((values >= 0) & (values < 1))]  # NaN compares false: outside too
  if outside.size:
    raise ValueError(
        f"{name}: `samples` must lie in [0, 1), where PyTorch's torch.rand draws them; got "
        f"{outside.size} outside it, the first {float(outside[0])!r}. Draw them with "
        "jax.random.uniform, or pass rngs (key) instead.")


def key_from_rngs(rngs, name: str) -> jax.Array | None:
  """A key from the module's ``rngs``: an ``nnx.Rngs`` (its dropout stream), an
  ``nnx.RngStream``, or a key itself."""
  if rngs is None:
    return None
  if isinstance(rngs, nnx.Rngs):
    try:
      stream = getattr(rngs, RNG_STREAM)
    except AttributeError:
      raise ValueError(
          f"{name}: `rngs` has no '{RNG_STREAM}' stream and no 'default' one to fall back "
          f"on; build it as nnx.Rngs({RNG_STREAM}=0) or nnx.Rngs(0), or pass the stream to "
          "use, e.g. rngs=rngs.params.") from None
    return stream()
  if isinstance(rngs, nnx.RngStream):
    return rngs()
  if _is_key(rngs):
    return rngs
  raise TypeError(
      f"{name}: `rngs` must be an nnx.Rngs, an nnx.RngStream or a JAX key; got "
      f"{type(rngs).__name__}.")


def _is_key(value) -> bool:
  """Whether ``value`` is a JAX key: a typed key, or a raw ``uint32`` one."""
  return isinstance(value, jax.Array) and (jnp.issubdtype(value.dtype, jax.dtypes.prng_key)
                                           or value.dtype == jnp.uint32)


def check_key(key, name: str):
  """``key`` when it is None or a JAX key (a TypeError naming the function otherwise)."""
  if key is None or _is_key(key):
    return key
  raise TypeError(
      f"{name}: `key` must be a JAX key such as jax.random.key(0); got {type(key).__name__}.")
