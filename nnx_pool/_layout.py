"""Input checks shared by every module: rank, channels-last layout and dtype.

Inputs are channels-last: ``(N, *spatial, C)``, or unbatched ``(*spatial, C)``.
The number of spatial dims is always known from the module (its window, or an
explicit argument), so a rank tells batched and unbatched apart without
guessing.
"""

from __future__ import annotations

import math
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from nnx_pool._args import check_positive_int

DtypeKind = Literal["float", "ordered"]


def as_array(x, name: str = "inputs") -> jax.Array:
  """Converts ``x`` to a JAX array, with a TypeError naming ``name`` if it cannot be."""
  if isinstance(x, jax.Array):
    return x
  if isinstance(x, (np.ndarray, np.generic, list, tuple, float, int)):
    return jnp.asarray(x)
  raise TypeError(f"`{name}` must be an array; got {type(x).__name__}.")


def check_dtype(x: jax.Array, kind: DtypeKind, module: str, name: str = "inputs") -> None:
  """Refuses dtypes an operation has no meaning for.

  ``"float"``: averages and norms, which need a floating dtype.
  ``"ordered"``: max and min, which take floats and integers but not bool or complex.
  """
  dtype = x.dtype
  if jnp.issubdtype(dtype, jnp.complexfloating):
    raise TypeError(
        f"{module}: `{name}` has complex dtype {dtype}, which has no order; "
        "pool the real and imaginary parts separately."
    )
  if dtype == jnp.bool_:
    raise TypeError(
        f"{module}: `{name}` has dtype bool; cast it first, e.g. x.astype(jnp.float32)."
    )
  if kind == "float" and not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(
        f"{module}: `{name}` has dtype {dtype}, but this pooling needs a floating dtype; "
        "cast it first, e.g. x.astype(jnp.float32)."
    )


def rank_message(module: str, name: str, shape: tuple[int, ...], ndim: int) -> str:
  """Why ``shape`` does not fit a module over ``ndim`` spatial dims, and how to say otherwise."""
  rank = len(shape)
  message = (
      f"{module}: `{name}` must be channels-last (N, *spatial, C) or (*spatial, C) with "
      f"{ndim} spatial dim(s), so rank {ndim + 2} or {ndim + 1}; got shape {shape} (rank {rank})."
  )
  if rank == ndim:
    message += " If it has no channel axis, add one: x[..., None]."
  fits = [n for n in (rank - 2, rank - 1) if 1 <= n <= 3 and n != ndim]
  if fits:
    choices = " or ".join(f"num_spatial_dims={n}" for n in fits)
    message += (
        f" For this shape set {choices} (the default is 2; a tuple argument sets it by its "
        "length)."
    )
  return message


def check_rank(x: jax.Array, num_spatial: int, module: str, name: str = "inputs") -> bool:
  """Checks the rank against ``num_spatial`` and returns whether ``x`` is batched."""
  if x.ndim not in (num_spatial + 2, num_spatial + 1):
    raise ValueError(rank_message(module, name, tuple(x.shape), num_spatial))
  return x.ndim == num_spatial + 2


def check_features(
    x: jax.Array, in_features: int | None, batched: bool, module: str, name: str = "inputs"
) -> None:
  """Checks the channel axis (last) against ``in_features``, and names an NCHW mistake."""
  if in_features is None or x.shape[-1] == in_features:
    return
  channel_first_axis = 1 if batched else 0
  message = (
      f"{module}: `{name}` must be channels-last with in_features={in_features} on the "
      f"last axis; got shape {tuple(x.shape)}."
  )
  if x.shape[channel_first_axis] == in_features:
    message += (
        f" It looks channels-first (NCHW: {in_features} on axis {channel_first_axis}); "
        f"use jnp.moveaxis(x, {channel_first_axis}, -1)."
    )
  raise ValueError(message)


def check_nonempty_spatial(x: jax.Array, module: str, name: str = "inputs") -> None:
  """Refuses a zero-size spatial dim where a module reduces the whole map (or bins of it)."""
  if 0 in x.shape[1:-1]:
    raise ValueError(
        f"{module}: `{name}` needs non-empty spatial dims (there is nothing to pool); got "
        f"spatial shape {tuple(x.shape[1:-1])} in shape {tuple(x.shape)}."
    )


# Flat per-plane indices are int32, as jax.numpy's default integer without x64.
MAX_PLANE = 2**31 - 1


def check_plane_indexable(spatial: tuple[int, ...], module: str, hint: str = "") -> None:
  """Refuses a plane whose flat indices would not fit in int32."""
  cells = math.prod(spatial)
  if cells > MAX_PLANE:
    raise ValueError(
        f"{module}: a plane of spatial shape {tuple(spatial)} has {cells} cells, but flat "
        f"indices are int32 and address at most 2**31 - 1 = {MAX_PLANE} cells.{hint}"
    )


def check_in_features(in_features) -> int | None:
  """Validates an optional ``in_features`` constructor argument."""
  return check_positive_int(in_features, "in_features", optional=True)


def prepare(
    x,
    num_spatial: int,
    *,
    kind: DtypeKind,
    module: str,
    in_features: int | None = None,
) -> tuple[jax.Array, bool]:
  """Runs every input check and returns ``(x with a batch axis, was_batched)``."""
  x = as_array(x)
  check_dtype(x, kind, module)
  batched = check_rank(x, num_spatial, module)
  check_features(x, in_features, batched, module)
  return (x if batched else x[None]), batched


def unbatch(out, batched: bool):
  """Drops the batch axis that :func:`prepare` added, from an array or a tuple of them."""
  return out if batched else jax.tree.map(lambda a: a[0], out)
