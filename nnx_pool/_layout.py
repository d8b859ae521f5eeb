"""Input checks shared by every module: rank, channels-last layout and dtype.

Inputs are channels-last: ``(*batch, *spatial, C)`` with any number of batch
axes, usually one (``(N, H, W, C)``) or none (``(H, W, C)``). The number of spatial
dims is always known from the module (its window, or an explicit argument), so
the rank says how many batch axes there are without guessing.
"""

from __future__ import annotations

import math
import sys
import warnings
import weakref
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from ._args import check_positive_int

DtypeKind = Literal["float", "ordered"]


def as_array(x, name: str = "inputs") -> jax.Array:
  """Converts ``x`` to a JAX array, with a TypeError naming ``name`` if it cannot be."""
  if isinstance(x, jax.Array):
    return x
  if not isinstance(x, (np.ndarray, np.generic, list, tuple, float, int)):
    raise TypeError(f"`{name}` must be an array; got {type(x).__name__}.")
  try:
    return jnp.asarray(x)
  except (TypeError, ValueError, RuntimeError) as error:  # XLA's own refusal is a RuntimeError
    dtype = getattr(x, "dtype", None)
    if dtype is None:
      raise TypeError(f"`{name}` could not be made an array: {error}") from error
    raise TypeError(
        f"`{name}` has dtype {dtype}, which this JAX cannot compute in (float6 and "
        "float8_e5m3fnu have no XLA type); cast it first, e.g. x.astype(np.float32)."
    ) from error


def concrete_values(x: jax.Array, dtype=None) -> np.ndarray | None:
  """``x``'s values on this host, for an eager check of them; None where it has none to read:
  a tracer (under ``jax.jit``), or an array that spans processes (each process holds only
  its shards, and a check of those would differ between processes)."""
  tracer = jax.core.Tracer  # pyright: ignore[reportAttributeAccessIssue]
  if isinstance(x, tracer) or not getattr(x, "is_fully_addressable", True):
    return None
  return np.asarray(x, dtype)


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
      f"{module}: `{name}` must be channels-last (*batch, *spatial, C) with {ndim} spatial "
      f"dim(s), so rank {ndim + 1} or more; got shape {shape} (rank {rank})."
  )
  if rank == ndim:
    message += " If it has no channel axis, add one: x[..., None]."
  fits = [n for n in range(1, min(rank - 1, 3) + 1) if n != ndim]
  if fits:
    choices = " or ".join(f"num_spatial_dims={n}" for n in fits)
    message += (
        f" For this shape set {choices} (the default is 2; a tuple argument sets it by its "
        "length)."
    )
  return message


def batch_shape(x: jax.Array, num_spatial: int, module: str, name: str = "inputs"
                ) -> tuple[int, ...]:
  """The batch axes of ``x`` before its ``num_spatial`` spatial axes and channel axis.

  ``(*spatial, C)`` has none, ``(N, *spatial, C)`` one, and any number of leading
  axes are batch axes, as in ``flax.nnx.max_pool``.
  """
  if x.ndim < num_spatial + 1:
    raise ValueError(rank_message(module, name, tuple(x.shape), num_spatial))
  return tuple(x.shape[:x.ndim - num_spatial - 1])


class ChannelsFirstWarning(UserWarning):
  """An input with no ``in_features`` to check looks channels-first (NCHW) by its shape.

  Silence it for a layer by passing ``in_features=C``, which checks the channel
  axis instead, or with ``warnings.filterwarnings("ignore",
  category=nnx_pool.ChannelsFirstWarning)``.
  """


# A 2-D (3-D) input looks channels-first when the axis before its spatial dims in a
# channels-first reading holds at most this many entries (grey, RGB, RGBA)...
_FEW_CHANNELS = 4
# ...and its last two axes are equal and at least this long (a square image).
_MIN_SIDE = 8


def looks_channels_first(shape: tuple[int, ...], num_spatial: int) -> bool:
  """Whether a channels-last ``shape`` reads better as channels-first (NCHW or NCDHW).

  The rule: 2-D or 3-D, the axis where NCHW keeps its channels (``shape[-3]``
  in 2-D, ``shape[-4]`` in 3-D) has at most 4 entries, and the last two axes
  are equal and at least 8: ``(N, 3, 224, 224)``. Read channels-last, that is
  a map at most 4 rows high whose width equals its channel count. Over the
  stage outputs of common CNNs (ResNet, VGG, MobileNet, EfficientNet, ConvNeXt
  and ViT patch grids at 32 to 512 pixels; ``tests/test_layout.py``) it flags
  none; 1-D inputs are never flagged.
  """
  if num_spatial == 1 or len(shape) < num_spatial + 1:
    return False
  channels = shape[-num_spatial - 1]
  return channels <= _FEW_CHANNELS and shape[-1] == shape[-2] >= _MIN_SIDE


# Each module instance warns once: those that have (held weakly).
_warned: weakref.WeakSet = weakref.WeakSet()


def _outside_stacklevel() -> int:
  """The ``stacklevel`` of the first caller outside nnx_pool, for a warning's location."""
  frame, level = sys._getframe(1), 1
  while frame is not None and frame.f_globals.get("__name__", "").startswith("nnx_pool"):
    frame, level = frame.f_back, level + 1
  return level


def warn_channels_first(x: jax.Array, num_spatial: int, module: str, owner=None) -> None:
  """Warns (:class:`ChannelsFirstWarning`) when ``x`` looks channels-first; once per ``owner``."""
  if not looks_channels_first(tuple(x.shape), num_spatial):
    return
  if owner is not None:
    if owner in _warned:
      return
    _warned.add(owner)
  axis = x.ndim - num_spatial - 1
  warnings.warn(
      f"{module}: `inputs` of shape {tuple(x.shape)} looks channels-first (NCHW: "
      f"{x.shape[axis]} channels on axis {axis}); this layer is channels-last and reads "
      f"{x.shape[-1]} channels on the last axis. If that is a mistake, use "
      f"jnp.moveaxis(x, {axis}, -1); if not, pass in_features={x.shape[-1]} to check the "
      "channels and silence this warning.",
      ChannelsFirstWarning,
      stacklevel=_outside_stacklevel(),
  )


def check_features(
    x: jax.Array, in_features: int | None, num_spatial: int, module: str, name: str = "inputs"
) -> None:
  """Checks the channel axis (last) against ``in_features``, and names an NCHW mistake."""
  if in_features is None or x.shape[-1] == in_features:
    return
  channel_first_axis = x.ndim - num_spatial - 1
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
    owner=None,
) -> tuple[jax.Array, tuple[int, ...]]:
  """Runs every input check; returns ``x`` as ``(N, *spatial, C)`` and its batch shape.

  The batch axes (none, one or several) are flattened into one, ``N``, which is 1
  for an unbatched input; :func:`unbatch` restores them. ``owner``, the calling
  module, warns once of an input that looks channels-first.
  """
  x = as_array(x)
  check_dtype(x, kind, module)
  batch = batch_shape(x, num_spatial, module)
  check_features(x, in_features, num_spatial, module)
  if in_features is None:
    warn_channels_first(x, num_spatial, module, owner)
  if len(batch) != 1:
    x = x.reshape(math.prod(batch), *x.shape[len(batch):])
  return x, batch


def prepare_map(inputs, num_spatial: int, kind: DtypeKind, in_features: int | None,
                module: str, owner=None, *, indexed: bool) -> tuple[jax.Array, tuple[int, ...]]:
  """:func:`prepare` for a pool over the whole map or bins of it: no spatial dim may be empty,
  and with ``indexed`` (a max, which keeps int32 flat indices) a plane must be indexable."""
  x, batch = prepare(inputs, num_spatial, kind=kind, module=module, in_features=in_features,
                     owner=owner)
  check_nonempty_spatial(x, module)
  if indexed:
    check_plane_indexable(x.shape[1:-1], module, " The max keeps one (for its gradient too).")
  return x, batch


def unbatch(out, batch: tuple[int, ...]):
  """Gives an array (or a tuple of them) from :func:`prepare`'s ``N`` back its batch axes."""
  if len(batch) == 1:
    return out
  return jax.tree.map(lambda a: a.reshape(*batch, *a.shape[1:]), out)
