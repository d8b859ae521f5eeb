"""What a user's model is, besides its outputs: its state's schema, its modes, its weights and
the output of each submodule, each as a small JSON-able fingerprint.

A fixture baseline stores these beside the outputs (format version 3), so that a failing
check can say, before any number, what changed about the model itself:

* :func:`schema`: every variable of the model's state, by path (``stem.bn.mean``), with its
  type (``Param``, ``BatchStat``, ``RngKey`` ...), shape and dtype;
* :func:`modes`: every submodule's mode flags (``use_running_average``, ``deterministic``),
  which ``model.train()`` and ``model.eval()`` set;
* :func:`weight_fingerprints`: per numeric leaf of the state, its shape, dtype, SHA-256 and
  a few statistics, enough to say that the initialisation changed and where first;
* :func:`capture`: the output of every submodule, in the order the calls return (so a
  submodule before the module that called it), as shape, dtype and a few reductions.

:func:`capture` wraps the ``__call__`` of each submodule's class for the duration of one
eager run and restores it after; nothing of the model is edited. It works on every Flax
this package supports (0.11.2 has no ``nnx.capture``). What it cannot see: work done in
plain functions or ``jnp`` calls inside a module's ``__call__`` (it is attributed to that
module), submodules called through another method than ``__call__``, and calls made under
a JAX transform inside the model (``nnx.scan``, ``nnx.vmap``, ``nnx.grad`` of a submodule),
whose values are tracers and are skipped. While it runs, the wrapped classes are wrapped
for every thread.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

# The attributes that put a Flax module in train or eval mode, and what each value means.
MODE_FLAGS: dict[str, dict[bool | None, str]] = {
    "use_running_average": {True: "eval mode", False: "the model is in train mode"},
    "deterministic": {True: "eval mode", False: "dropout is active: the model is in train mode"},
}
# The reductions a fingerprint keeps of an array (over its finite elements, in float64).
STATS = ("mean", "std", "min", "max", "abs_mean")


def dotted(path: Sequence[Any]) -> str:
  """``("layers", 0, "kernel")`` -> ``layers.0.kernel``; the model itself is ``(model)``."""
  return ".".join(str(part) for part in path) or "(model)"


def submodules(model: nnx.Module) -> list[tuple[tuple[Any, ...], nnx.Module]]:
  """``(path, module)`` of the model and every submodule (``nnx.iter_modules`` from Flax
  0.12 on, where the method is deprecated; the method on Flax 0.11, which lacks the
  function)."""
  if hasattr(nnx, "iter_modules"):
    return list(nnx.iter_modules(model))
  return list(model.iter_modules())


def _flat_state(state: Any) -> list[tuple[tuple[Any, ...], Any]]:
  return list(nnx.to_flat_state(state))


def _value(variable: Any) -> Any:
  """A variable's array, without ``.value`` (deprecated in Flax 0.12 for some types)."""
  return jax.tree_util.tree_leaves(variable)[0]


def is_key(value: Any) -> bool:
  """Whether ``value`` is a typed PRNG key array (an ``RngKey``'s value)."""
  # jax.dtypes.issubdtype is public (jax's API docs) but not re-exported with `as` in its stub.
  return jax.dtypes.issubdtype(getattr(value, "dtype", np.float32), jax.dtypes.prng_key)  # pyright: ignore[reportPrivateImportUsage]


def host(value: Any) -> np.ndarray:
  """A host NumPy copy; a typed key array becomes its key data."""
  if is_key(value):
    value = jax.random.key_data(value)
  return np.asarray(jax.device_get(value))


def variables(model: nnx.Module) -> list[tuple[str, str, Any]]:
  """``(dotted path, variable type, value)`` for every variable of ``model``'s state."""
  _, state = nnx.split(model)
  return [(dotted(path), type(var).__name__, _value(var)) for path, var in _flat_state(state)]


def schema(model: nnx.Module) -> list[dict[str, Any]]:
  """Every variable of the model: path, type, shape and dtype, in path order."""
  return [{"path": path, "type": kind, "shape": [int(n) for n in np.shape(value)],
           "dtype": str(value.dtype)} for path, kind, value in variables(model)]


def modes(model: nnx.Module) -> dict[str, dict[str, Any]]:
  """Each submodule's mode flags that are set (True or False), by path."""
  out: dict[str, dict[str, Any]] = {}
  for path, module in submodules(model):
    flags = {flag: getattr(module, flag) for flag in MODE_FLAGS
             if isinstance(getattr(module, flag, None), bool)}
    if flags:
      out[dotted(path)] = flags
  return dict(sorted(out.items()))


def stats(array: np.ndarray) -> dict[str, float | None]:
  """The :data:`STATS` of an array's finite elements (None where it has none)."""
  values = np.asarray(array)
  if values.dtype.kind not in "biuf":
    values = values.astype(np.float64)  # bfloat16, float16 and the other ml_dtypes
  values = values.astype(np.float64).ravel()
  values = values[np.isfinite(values)]
  if not values.size:
    return dict.fromkeys(STATS)
  return {"mean": float(values.mean()), "std": float(values.std()), "min": float(values.min()),
          "max": float(values.max()), "abs_mean": float(np.abs(values).mean())}


def digest(array: np.ndarray) -> str:
  """The SHA-256 of an array's dtype, shape and bytes (:func:`nnx_pool.regression.store.digest`)."""
  from nnx_pool.regression.store import digest as store_digest

  return store_digest(array)


def fingerprint(array: Any) -> dict[str, Any]:
  """Shape, dtype, digest and :data:`STATS` of an array."""
  values = host(array)
  return {"shape": [int(n) for n in values.shape], "dtype": values.dtype.name,
          "digest": digest(values), **stats(values)}


def weight_fingerprints(model: nnx.Module) -> list[dict[str, Any]]:
  """A :func:`fingerprint` of every variable of ``model`` with its path and type."""
  return [{"path": path, "type": kind, **fingerprint(value)}
          for path, kind, value in variables(model)]


def storable(model: nnx.Module) -> dict[str, np.ndarray]:
  """The state ``store_params`` keeps: every variable but the PRNG keys, by dotted path."""
  return {path: host(value) for path, _, value in variables(model) if not is_key(value)}


def load_weights(model: nnx.Module, arrays: Mapping[str, np.ndarray]) -> None:
  """Writes stored arrays into ``model``'s variables of the same path (PRNG keys excepted).

  Raises:
    ValueError: the stored set does not match the model's variables (path, shape, dtype).
  """
  graphdef, state = nnx.split(model)
  flat = _flat_state(state)
  have = {dotted(path): var for path, var in flat if not is_key(_value(var))}
  missing, extra = sorted(set(have) - set(arrays)), sorted(set(arrays) - set(have))
  if missing or extra:
    what = (f"the model has {missing[0]!r}, which they lack" if missing
            else f"they hold {extra[0]!r}, which the model lacks")
    raise ValueError(f"the stored weights do not fit the model: {what} ({len(missing)} missing, "
                     f"{len(extra)} extra); pass --nnx-regression-update if the model changed.")
  for path in sorted(have):
    current, stored = _value(have[path]), arrays[path]
    if tuple(stored.shape) != tuple(current.shape) or stored.dtype != np.dtype(current.dtype):
      raise ValueError(
          f"the stored weight {path!r} is {stored.dtype}{list(stored.shape)}, the model's is "
          f"{np.dtype(current.dtype)}{list(current.shape)}; pass --nnx-regression-update if the "
          "model changed.")
  replaced = {}
  for path, var in flat:
    name = dotted(path)
    if name in arrays:
      var = jax.tree_util.tree_map(lambda _, new=arrays[name]: jax.numpy.asarray(new), var)
    replaced[path] = var
  nnx.update(model, nnx.from_flat_state(replaced))


# ------------------------------------------------------------ each submodule's output


@contextlib.contextmanager
def capture(model: nnx.Module) -> Iterator[list[dict[str, Any]]]:
  """Records the output of every submodule of ``model`` called in the block.

  Yields a list that fills, in the order calls return, with ``{"path", "type",
  "outputs": [fingerprint of each output leaf]}``; a submodule called twice appears
  twice (``path#2``). Values that are tracers (a call under a transform) are skipped.
  The submodules' classes get their ``__call__`` back when the block ends.
  """
  paths = {}
  for path, module in submodules(model):
    if path and any("__call__" in vars(cls) for cls in type(module).__mro__):
      paths.setdefault(id(module), dotted(path))
  classes = {type(m) for _, m in submodules(model) if id(m) in paths}
  calls: list[dict[str, Any]] = []
  seen: dict[str, int] = {}
  active: set[int] = set()

  def wrap(original):
    def __call__(self, *args, **kwargs):
      key = id(self)
      if key not in paths or key in active:  # a parent class's wrapper, or not ours
        return original(self, *args, **kwargs)
      active.add(key)
      try:
        out = original(self, *args, **kwargs)
      finally:
        active.discard(key)
      leaves = jax.tree_util.tree_leaves(out)
      # jax imports jax.core itself; pyright wants the submodule imported by name.
      if leaves and not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):  # pyright: ignore[reportAttributeAccessIssue]
        path = paths[key]
        seen[path] = seen.get(path, 0) + 1
        calls.append({"path": path if seen[path] == 1 else f"{path}#{seen[path]}",
                      "type": type(self).__name__,
                      "outputs": [fingerprint(leaf) for leaf in leaves]})
      return out

    __call__.__wrapped__ = original
    return __call__

  patched = []
  try:
    for cls in sorted(classes, key=lambda c: len(c.__mro__), reverse=True):
      own = cls.__dict__.get("__call__")
      patched.append((cls, own))
      type.__setattr__(cls, "__call__", wrap(cls.__call__))
    yield calls
  finally:
    for cls, own in reversed(patched):
      if own is None:
        type.__delattr__(cls, "__call__")
      else:
        type.__setattr__(cls, "__call__", own)


# ------------------------------------------------------------ what changed, in one line each


def _shape_text(entry: Mapping[str, Any]) -> str:
  return f"{entry['dtype']}{list(entry['shape'])}"


def schema_changes(before: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]]
                   ) -> list[str]:
  """One line per variable added, removed, or changed in type, shape or dtype."""
  old, new = {e["path"]: e for e in before}, {e["path"]: e for e in now}
  lines = []
  for path in sorted(set(old) | set(new)):
    a, b = old.get(path), new.get(path)
    if b is None:  # then a is not None: path is in one of them
      lines.append(f"`{path}`: {a['type']} {_shape_text(a)} is gone from the model's state")  # pyright: ignore[reportOptionalSubscript, reportArgumentType]
    elif a is None:
      lines.append(f"`{path}`: new {b['type']} {_shape_text(b)} in the model's state")
    elif (a["type"], a["shape"], a["dtype"]) != (b["type"], b["shape"], b["dtype"]):
      lines.append(f"`{path}`: {a['type']} {_shape_text(a)} -> {b['type']} {_shape_text(b)}")
  return lines


def mode_changes(before: Mapping[str, Mapping[str, Any]], now: Mapping[str, Mapping[str, Any]]
                 ) -> list[str]:
  """One line per mode flag that changed: ``stem.bn: use_running_average True -> False (...)``."""
  lines = []
  for path in sorted(set(before) | set(now)):
    a, b = before.get(path, {}), now.get(path, {})
    for flag in sorted(set(a) | set(b)):
      if a.get(flag) != b.get(flag):
        meaning = MODE_FLAGS.get(flag, {}).get(b.get(flag))
        lines.append(f"`{path}`: {flag} {a.get(flag)} -> {b.get(flag)}"
                     + (f" ({meaning})" if meaning else ""))
  return lines


def weight_changes(before: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]],
                   order: Sequence[str] = ()) -> tuple[int, int, list[str]]:
  """``(differing Param leaves, Param leaves, the differing Param paths)``.

  Leaves are compared by digest; a leaf only one side has counts as differing. Only
  ``Param`` leaves count (a new initialiser moves those; PRNG keys and BatchNorm statistics
  are state of another kind). They are listed in the order their modules were called
  (``order``: module paths in call order), then by path.
  """
  old, new = {e["path"]: e for e in before}, {e["path"]: e for e in now}
  # Each p is in old or new, so one of the two gets is not None.
  params = [p for p in set(old) | set(new) if (old.get(p) or new.get(p))["type"] == "Param"]  # pyright: ignore[reportOptionalSubscript]
  rank = {path: i for i, path in enumerate(order)}

  def called(path: str) -> tuple[int, str]:
    module = path.rpartition(".")[0]
    return rank.get(module, len(rank)), path

  differ = sorted((p for p in params
                   if p not in old or p not in new or old[p]["digest"] != new[p]["digest"]),
                  key=called)
  return len(differ), len(params), differ


def _close(a: float | None, b: float | None, scale: float, rtol: float, atol: float) -> bool:
  if a is None or b is None:
    return a is None and b is None
  return abs(a - b) <= atol + rtol * scale


def _moved(a: Mapping[str, Any], b: Mapping[str, Any], rtol: float, atol: float) -> str | None:
  """How one output's fingerprint moved (``shape (2, 16) -> (2, 15)``), or None."""
  if a["shape"] != b["shape"]:
    return f"shape {tuple(a['shape'])} -> {tuple(b['shape'])}"
  if a["dtype"] != b["dtype"]:
    return f"dtype {a['dtype']} -> {b['dtype']}"
  if a["digest"] == b["digest"]:
    return None
  extent = [abs(v) for v in (a["min"], a["max"]) if v is not None and math.isfinite(v)]
  scale = max(extent, default=0.0)
  for key in STATS:
    if not _close(a[key], b[key], scale, rtol, atol):
      return (f"{key} {a[key]:.6g} -> {b[key]:.6g}" if a[key] is not None and b[key] is not None
              else f"{key} {a[key]} -> {b[key]}")
  return None


def first_moved(before: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]],
                *, rtol: float, atol: float) -> str | None:
  """The first submodule, in call order, whose output moved past the tolerance.

  Each statistic of the fingerprint may move by ``atol + rtol * max|output|``, the output
  tolerance applied at the output's own scale.

  Returns:
    ``first moved at `stem.pool` (MaxPool): shape (2, 16, 16, 64) -> (2, 15, 15, 64)``, or
    None when every submodule's output matches.
  """
  new = {e["path"]: e for e in now}
  for entry in before:
    other = new.get(entry["path"])
    where = f"`{entry['path']}` ({entry['type']})"
    if other is None:
      return f"first moved at {where}: called in the baseline, not called now"
    if len(entry["outputs"]) != len(other["outputs"]):
      return (f"first moved at {where}: {len(entry['outputs'])} output array(s) -> "
              f"{len(other['outputs'])}")
    for i, (a, b) in enumerate(zip(entry["outputs"], other["outputs"], strict=True)):
      how = _moved(a, b, rtol, atol)
      if how:
        which = f" output {i}" if len(entry["outputs"]) > 1 else ""
        return f"first moved at {where}{which}: {how}"
  old = {e["path"] for e in before}
  extra = [e for e in now if e["path"] not in old]
  if extra:
    first = extra[0]
    return f"first moved at `{first['path']}` ({first['type']}): called now, not in the baseline"
  return None
