"""The one compiled layer of every pooling call: ``jax.jit``, a named scope, and sharding glue.

Each call of a pooling module or function runs one :func:`kernel`: jitted with its
geometry static, so an eager call runs one compiled program per shape instead of one
dispatch per tap, and under ``jax.named_scope("nnx_pool.<name>")``, so that profiles
and HLO metadata name it. The building blocks that a kernel calls (window sums,
selects, flat indices) are plain traced functions under a scope of their own
(:func:`scoped`): one jit per call path, a named scope for each part.

An input split over ``Explicit`` mesh axes along a spatial dim runs under
``jax.sharding.auto_axes`` (:func:`_on_auto_axes`).
"""

from __future__ import annotations

import functools
import math

import jax
from jax.sharding import PartitionSpec


def _scope(fn) -> str:
  return f"nnx_pool.{fn.__name__}"


def scoped(fn):
  """``fn`` run under ``jax.named_scope("nnx_pool.<fn's name>")``; nothing else changes."""
  scope = _scope(fn)

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    with jax.named_scope(scope):
      return fn(*args, **kwargs)

  return wrapper


def kernel(*, static_argnums: int | tuple[int, ...] = ()):
  """``jax.jit`` with static geometry arguments, the body under a ``nnx_pool.<name>`` scope.

  Every kernel takes a batched ``(N, *spatial, C)`` array first, all arguments
  positional, and returns arrays laid out the same way; see :func:`_on_auto_axes`
  for inputs split over ``Explicit`` mesh axes along a spatial dim.
  """
  static = {static_argnums} if isinstance(static_argnums, int) else set(static_argnums)

  def wrap(fn):
    scope = _scope(fn)

    @functools.wraps(fn)
    def scoped_fn(*args):
      dynamic = [i for i in range(len(args)) if i not in static]

      def body(*arrays):
        full = list(args)
        for i, a in zip(dynamic, arrays, strict=True):
          full[i] = a
        return fn(*full)

      with jax.named_scope(scope):
        return _on_auto_axes(body, tuple(args[i] for i in dynamic))

    return jax.jit(scoped_fn, static_argnums=static_argnums)

  return wrap


def _explicit_spatial_spec(x) -> PartitionSpec | None:
  """``x``'s partition spec when ``Explicit`` mesh axes split one of its spatial dims."""
  typeof = getattr(jax, "typeof", None)
  if typeof is None or not hasattr(jax.sharding, "auto_axes"):  # jax < 0.6
    return None
  spec = getattr(getattr(typeof(x), "sharding", None), "spec", None)
  if spec is None or not any(spec[1:x.ndim - 1]):
    return None
  return PartitionSpec(*spec, *([None] * (x.ndim - len(spec))))


def may_split_space(x) -> bool:
  """Whether devices may split a spatial dim of ``x`` (batched, channels-last) in this trace.

  True when an ``Explicit`` spec splits one, or when ``x`` lies on a mesh with an ``Auto``
  axis over several devices, whose split a trace cannot see. Kernels whose CPU-fast
  spelling would move a split map with more than halo exchanges ask this first.
  """
  typeof = getattr(jax, "typeof", None)
  sharding = getattr(typeof(x), "sharding", None) if typeof is not None else None
  mesh = getattr(sharding, "mesh", None)
  if mesh is None or not getattr(mesh, "shape", None):
    return False
  spec = getattr(sharding, "spec", None) or ()
  if any(spec[1:x.ndim - 1]):
    return True
  auto = getattr(jax.sharding.AxisType, "Auto", None)
  return any(kind == auto and mesh.shape[name] > 1
             for name, kind in zip(mesh.axis_names, getattr(mesh, "axis_types", ()), strict=False))


def _on_auto_axes(body, arrays: tuple):
  """``body(*arrays)``; on ``Auto`` axes if ``Explicit`` ones split the first array's map.

  Explicit sharding types have no rule for a pad, strided slice or reshape of
  a dim split over devices (``ShardingTypeError``), so the kernel runs under
  ``jax.sharding.auto_axes``, where the compiler partitions it (halo exchanges
  for the windows), and each output keeps the input's spec on every dim that
  the mesh axes still divide (a dim pooled to 1 cell is replicated).
  """
  spec = _explicit_spatial_spec(arrays[0])
  if spec is None:
    return body(*arrays)
  mesh = jax.typeof(arrays[0]).sharding.mesh

  def out_spec(out) -> PartitionSpec:
    entries = []
    for size, entry in zip(out.shape, spec, strict=True):
      axes = entry if isinstance(entry, tuple) else (entry,) if entry else ()
      shards = math.prod(mesh.shape[a] for a in axes)
      entries.append(entry if axes and size % shards == 0 else None)
    return PartitionSpec(*entries)

  shapes = jax.eval_shape(body, *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays))
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.sharding.auto_axes(body, out_sharding=jax.tree.map(out_spec, shapes))(*arrays)
