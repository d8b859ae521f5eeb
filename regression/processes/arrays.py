"""Arrays that span processes: their host copy (gathered), and the layout a check records.

A check's inputs may be global arrays: sharded over a mesh whose devices belong to several
processes, of which each process holds its own shards. :func:`to_host` gives every process
the whole array (``jax.experimental.multihost_utils.process_allgather``; a fully
replicated one is read from this process's own copy, with no collective), after the check's
gate (:mod:`~nnx_pool.regression.processes.gate`). :func:`layout` says how a check's inputs
lay, for the stamp: a baseline recorded in one process compares with a run over two, and
the report names the change (:func:`layout_line`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .gate import before_collective


def to_host(x: Any) -> np.ndarray:
  """The whole of a ``jax.Array`` that spans processes, on this host (every process calls it,
  in the same order, as for any collective)."""
  if x.is_fully_replicated:
    return np.asarray(x.addressable_data(0))
  before_collective()
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _axes(entry: Any) -> str:
  if entry is None:
    return "-"
  if isinstance(entry, (tuple, list)):
    return "+".join(str(e) for e in entry) or "-"
  return str(entry)


def _placement(x: Any) -> str:
  """``one device``, or the mesh axes each dimension is split over: ``[data, -, -, -]``."""
  sharding = getattr(x, "sharding", None)
  spec = getattr(sharding, "spec", None)
  if sharding is None or spec is None or len(sharding.device_set) == 1:
    return "one device"
  ndim = getattr(x, "ndim", len(spec))
  return "[" + ", ".join(_axes(spec[i] if i < len(spec) else None) for i in range(ndim)) + "]"


def layout(inputs: Mapping[str, Any]) -> dict[str, Any]:
  """How a check's inputs lie: ``{"processes", "mesh", "inputs"}`` for the stamp.

  ``mesh`` is ``data=2 x space=2`` (the first input's mesh) or ``none``; ``inputs`` is one
  ``input/0 [data, -, -, -]`` entry per input, ``; ``-separated.
  """
  import jax

  mesh = None
  for x in inputs.values():
    candidate = getattr(getattr(x, "sharding", None), "mesh", None)
    if candidate is not None and getattr(candidate, "size", 1) > 1:
      mesh = candidate
      break
  shape = "none" if mesh is None else " x ".join(f"{n}={s}" for n, s in mesh.shape.items())
  return {"processes": jax.process_count(), "mesh": shape,
          "inputs": "; ".join(f"{key} {_placement(x)}" for key, x in inputs.items())}


def layout_line(before: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> str | None:
  """The line a passing check's report gives a changed layout; None when it did not change
  (or the baseline does not say: recorded before layouts were stamped)."""
  if not before or not now:
    return None
  changed = [f"{key} {before.get(key)} -> {now.get(key)}"
             for key in ("processes", "mesh", "inputs") if before.get(key) != now.get(key)]
  if not changed:
    return None
  return (f"layout changed ({'; '.join(changed)}); every result is within its tolerance, as "
          "a layout moves only the order of reductions")
