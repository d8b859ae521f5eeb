"""What a user's model is, besides its outputs: its state's schema, its modes, its weights and
the output of each submodule, each as a small JSON-able fingerprint.

A fixture baseline stores these beside the outputs (format version 3), so that a failing
check can say, before any number, what changed about the model itself:

* :func:`schema`: every variable of the model's state, by path (``stem.bn.mean``), with its
  type (``Param``, ``BatchStat``, ``RngKey`` ...), shape and dtype;
* :func:`modes`: every submodule's mode flags (``use_running_average``, ``deterministic``),
  which ``model.train()`` and ``model.eval()`` set; :func:`modes_used`: the mode each layer
  actually ran in, as resolved in the call (a flag given as a call argument, else the
  attribute), from :func:`capture`;
* :func:`config`: every submodule's static configuration (window, strides, padding,
  features, rates, activation functions by name: the plain Python attributes an NNX
  module holds), so that a report can say what changed about the layer that moved first;
* :func:`weight_fingerprints`: per numeric leaf of the state, its shape, dtype, SHA-256 and
  a few statistics, enough to say that the initialisation changed and where first;
* :func:`capture`: the output of every submodule, in the order the calls return (so a
  submodule before the module that called it), as shape, dtype and a few reductions, and
  the modes each call ran in; under a trace (``values=False``), shapes and modes only.

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
import dataclasses
import enum
import inspect
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
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


def natural(path: str) -> tuple[tuple[int, int, str], ...]:
  """A sort key that puts ``blocks.2`` before ``blocks.10`` and ``layer2`` before
  ``layer10`` (runs of digits compared as numbers)."""
  return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
               for part in re.split(r"(\d+)", path) if part)


def pattern(path: str) -> str:
  """``blocks.3.se.fc1`` -> ``blocks.*.se.fc1``: the path with its indices starred."""
  return ".".join("*" if part.isdigit() else part for part in path.split("."))


_SKIP = object()  # a value that is not static configuration


def _static(value: Any, depth: int = 0) -> Any:
  """The JSON form of a plain configuration value (functions by name), or ``_SKIP``."""
  if value is None or isinstance(value, (bool, int, str)):
    return value
  if isinstance(value, float):
    return value if math.isfinite(value) else str(value)
  if isinstance(value, enum.Enum):
    return value.name
  if isinstance(value, (jax.Array, np.ndarray, nnx.Variable, nnx.Module, nnx.Rngs)) or (
      type(value).__name__ in ("RngStream", "List", "Dict")):
    return _SKIP
  if isinstance(value, np.dtype):
    return value.name
  if isinstance(value, (tuple, list)):
    items = [_static(item, depth + 1) for item in value] if depth < 3 else [_SKIP]
    return _SKIP if any(item is _SKIP for item in items) else items
  if dataclasses.is_dataclass(value) and not isinstance(value, type) and depth < 3:
    fields = {f.name: _static(getattr(value, f.name), depth + 1)
              for f in dataclasses.fields(value)}
    return {k: v for k, v in fields.items() if v is not _SKIP}
  if isinstance(value, type):
    try:
      return np.dtype(value).name  # jnp.float32 and the other scalar types
    except TypeError:
      return value.__qualname__
  if callable(value):
    inner = getattr(value, "func", None)  # functools.partial
    name = getattr(value, "__name__", None) or getattr(inner, "__name__", None)
    return name if name else type(value).__name__
  return _SKIP


def config(module: nnx.Module) -> dict[str, Any]:
  """The static configuration of one module: its plain Python attributes (numbers, strings,
  tuples, dtypes, dataclass values such as a pooling window, functions by name), by name;
  a dataclass value's fields as ``name.field``. Arrays, variables and submodules are not."""
  out: dict[str, Any] = {}
  for name, value in vars(module).items():
    if name.startswith("_"):
      continue
    data = _static(value)
    if isinstance(data, dict):
      out.update({f"{name}.{field}": item for field, item in data.items()})
    elif data is not _SKIP:
      out[name] = data
  return out


def configs(model: nnx.Module) -> dict[str, dict[str, Any]]:
  """``{path: {"type", "config"}}`` of the model and every submodule (:func:`config`)."""
  return {dotted(path): {"type": type(module).__name__, "config": config(module)}
          for path, module in submodules(model)}


def _show(value: Any) -> str:
  """A configuration value as Python writes it: lists as tuples, functions by name."""
  if isinstance(value, list):
    return "(" + ", ".join(_show(v) for v in value) + ("," if len(value) == 1 else "") + ")"
  return str(value)


def config_change(before: Mapping[str, Any] | None, now: Mapping[str, Any] | None,
                  most: int = 3) -> str | None:
  """What changed in one module's :func:`configs` entry (``act: silu -> relu``), or None."""
  if not before or not now:
    return None
  parts = []
  if before.get("type") != now.get("type"):
    parts.append(f"type {before.get('type')} -> {now.get('type')}")
  old, new = before.get("config") or {}, now.get("config") or {}
  for name in sorted(set(old) | set(new), key=natural):
    if old.get(name, _SKIP) != new.get(name, _SKIP):
      a = _show(old[name]) if name in old else "(unset)"
      b = _show(new[name]) if name in new else "(unset)"
      parts.append(f"{name}: {a} -> {b}")
  if not parts:
    return None
  more = f"; and {len(parts) - most} more" if len(parts) > most else ""
  return "; ".join(parts[:most]) + more



def weight_fingerprints(model: nnx.Module) -> list[dict[str, Any]]:
  """A :func:`fingerprint` of every variable of ``model`` with its path and type."""
  return [{"path": path, "type": kind, **fingerprint(value)}
          for path, kind, value in variables(model)]


def storable(model: nnx.Module) -> dict[str, np.ndarray]:
  """The state ``store_params`` keeps: every variable but the PRNG keys, by dotted path."""
  return {path: host(value) for path, _, value in variables(model) if not is_key(value)}


Rename = Mapping[str, str] | Callable[[str], str]


def renamer(rename: Rename | None) -> Callable[[str], str] | None:
  """``rename`` as a function of a dotted path.

  A mapping replaces path components: ``{"se.conv_reduce": "se.fc1"}`` turns
  ``blocks.3.se.conv_reduce.kernel`` into ``blocks.3.se.fc1.kernel`` (whole components
  only, each entry at its first place in the path; the longest entry that matches wins).
  A function is used as it is.
  """
  if rename is None or callable(rename):
    return rename
  table = sorted(((tuple(old.split(".")), tuple(new.split("."))) for old, new in rename.items()),
                 key=lambda item: -len(item[0]))

  def apply(path: str) -> str:
    parts = tuple(path.split("."))
    for old, new in table:
      for i in range(len(parts) - len(old) + 1):
        if parts[i:i + len(old)] == old:
          return ".".join(parts[:i] + new + parts[i + len(old):])
    return path

  return apply


def load_weights(model: nnx.Module, arrays: Mapping[str, np.ndarray],
                 rename: Rename | None = None) -> None:
  """Writes stored arrays into ``model``'s variables of the same path (PRNG keys excepted).

  Args:
    model: the module to load into.
    arrays: the stored weights, by dotted path.
    rename: the stored paths' new names (:func:`renamer`), for a model whose variables
      were renamed since the weights were stored.

  Raises:
    ValueError: the stored set does not match the model's variables (path, shape, dtype),
      or ``rename`` gives two stored weights one name.
  """
  to_new = renamer(rename)
  if to_new is not None:
    renamed: dict[str, np.ndarray] = {}
    for path, value in arrays.items():
      target = to_new(path)
      if not isinstance(target, str):
        raise TypeError(f"`rename` must map a path to a str; got {target!r} for {path!r}.")
      if target in renamed:
        raise ValueError(f"`rename` gives two stored weights the name {target!r}; got "
                         f"{rename!r}.")
      renamed[target] = value
    arrays = renamed
  graphdef, state = nnx.split(model)
  flat = _flat_state(state)
  have = {dotted(path): var for path, var in flat if not is_key(_value(var))}
  missing = sorted(set(have) - set(arrays), key=natural)
  extra = sorted(set(arrays) - set(have), key=natural)
  if missing or extra:
    what = (f"the model has {missing[0]!r}, which they lack" if missing
            else f"they hold {extra[0]!r}, which the model lacks")
    hint = ""
    if missing and extra:
      # The stored weight most like the first missing one: its shape and dtype, most path
      # components in common.
      wanted = _value(have[missing[0]])
      alike = [p for p in extra if tuple(arrays[p].shape) == tuple(wanted.shape)
               and arrays[p].dtype == np.dtype(wanted.dtype)] or extra
      like = max(alike, key=lambda p: _affinity(p, missing[0]))
      hint = (f" (they hold {like!r}); if the variables were only renamed, pass "
              f"rename={{old path part: new}}, e.g. rename={_example(like, missing[0])!r}")
    raise ValueError(f"the stored weights do not fit the model: {what} ({len(missing)} missing, "
                     f"{len(extra)} extra){hint}; pass --nnx-regression-update if the model "
                     "changed.")
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


def _example(old: str, new: str) -> dict[str, str]:
  """The rename entry that turns ``old`` into ``new`` (their differing middle)."""
  x, y = old.split("."), new.split(".")
  lead, trail = _common(x, y)
  start = max(lead - 1, 0)  # with the component before the change, for context
  return {".".join(x[start:len(x) - trail]): ".".join(y[start:len(y) - trail])}


# ------------------------------------------------------------ each submodule's output


_SIGNATURES: dict[Any, inspect.Signature | None] = {}


def _signature(function: Any) -> inspect.Signature | None:
  if function not in _SIGNATURES:
    try:
      _SIGNATURES[function] = inspect.signature(function)
    except (TypeError, ValueError):
      _SIGNATURES[function] = None
  return _SIGNATURES[function]


def call_modes(module: Any, function: Any, args: tuple, kwargs: Mapping[str, Any]
               ) -> dict[str, bool]:
  """The mode flags one call of ``module`` ran with: each flag of :data:`MODE_FLAGS` given
  to the call (by keyword or position) when not None, else the module's attribute, as
  Flax resolves them (``first_from``); flags that are neither a bool are left out."""
  flags = {}
  for flag in MODE_FLAGS:
    given = kwargs.get(flag)
    if flag not in kwargs:
      signature = _signature(function)
      if signature is not None and flag in signature.parameters:
        try:
          given = signature.bind(module, *args, **kwargs).arguments.get(flag)
        except TypeError:
          given = None
    value = given if given is not None else getattr(module, flag, None)
    if isinstance(value, (bool, np.bool_)):
      flags[flag] = bool(value)
  return flags


def _shape_only(leaf: Any) -> dict[str, Any]:
  return {"shape": [int(n) for n in np.shape(leaf)], "dtype": np.dtype(leaf.dtype).name}


@contextlib.contextmanager
def capture(model: nnx.Module, *, values: bool = True) -> Iterator[list[dict[str, Any]]]:
  """Records the output of every submodule of ``model`` called in the block.

  Yields a list that fills, in the order calls return, with ``{"path", "type",
  "outputs": [fingerprint of each output leaf]}`` and, for a module with mode flags,
  ``"modes"`` (:func:`call_modes`); a submodule called twice appears twice (``path#2``).
  With ``values=True`` (an eager run) calls whose outputs are tracers (a transform inside
  the model) are skipped; with ``values=False`` (the block traces the model, e.g. under
  ``nnx.eval_shape``) every call is recorded with its outputs' shape and dtype only and
  ``"traced": True``. The submodules' classes get their ``__call__`` back when the block ends.
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
      traced = any(isinstance(leaf, jax.core.Tracer) for leaf in leaves)  # pyright: ignore[reportAttributeAccessIssue]
      if leaves and (not traced or not values):
        path = paths[key]
        seen[path] = seen.get(path, 0) + 1
        entry: dict[str, Any] = {
            "path": path if seen[path] == 1 else f"{path}#{seen[path]}",
            "type": type(self).__name__,
            "outputs": [_shape_only(leaf) if traced else fingerprint(leaf) for leaf in leaves]}
        modes = call_modes(self, original, args, kwargs)
        if modes:
          entry["modes"] = modes
        if traced:
          entry["traced"] = True
        calls.append(entry)
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


@contextlib.contextmanager
def traced_into(model: nnx.Module, calls: list[dict[str, Any]]) -> Iterator[None]:
  """:func:`capture` (``values=False``) of a block that traces ``model``, its calls added to
  ``calls`` when the block ends: each submodule's call order, output shapes and modes, from
  a trace that is made anyway (a jit-only check's compile, ``check_grad``'s ``eval_shape``
  of the loss), so that nothing is traced twice."""
  with capture(model, values=False) as inside:
    yield
  calls.extend(inside)


def modes_used(calls: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, bool]]:
  """``{path: {flag: value}}`` of the layers that ran, with the modes they ran in
  (:func:`capture`'s ``"modes"``), in natural path order; a second call is ``path#2``."""
  used = {call["path"]: dict(call["modes"]) for call in calls if call.get("modes")}
  return {path: used[path] for path in sorted(used, key=natural)}


# ------------------------------------------------------------ what changed, in one line each


def _shape_text(entry: Mapping[str, Any]) -> str:
  return f"{entry['dtype']}{list(entry['shape'])}"


def _signature_of(entry: Mapping[str, Any]) -> tuple[Any, ...]:
  return entry["type"], tuple(entry["shape"]), entry["dtype"]


def _common(x: Sequence[str], y: Sequence[str]) -> tuple[int, int]:
  """How many leading, then how many of the remaining trailing, items two lists share."""
  shortest = min(len(x), len(y))
  lead = next((i for i in range(shortest) if x[i] != y[i]), shortest)
  trail = 0
  while trail < shortest - lead and x[-1 - trail] == y[-1 - trail]:
    trail += 1
  return lead, trail


def _affinity(a: str, b: str) -> int:
  """How many leading and trailing path components two paths share."""
  return sum(_common(a.split("."), b.split(".")))


def renames(before: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]], *,
            weights_before: Sequence[Mapping[str, Any]] | None = None,
            weights_now: Sequence[Mapping[str, Any]] | None = None,
            rename: Callable[[str], str] | None = None) -> dict[str, str]:
  """Which variables of the baseline's schema the model now holds under another name.

  A variable gone from the schema and one new in it are a pair when they have the same type,
  shape and dtype and either ``rename`` maps the old path to the new one, or both weight
  fingerprints have the same digest (the same numbers under a new name). Among several
  candidates of the same digest (zero-initialised biases), the one sharing most leading and
  trailing path components is taken, unless two tie: then none is.

  Returns:
    ``{old path: new path}``.
  """
  old, new = {e["path"]: e for e in before}, {e["path"]: e for e in now}
  gone = sorted(set(old) - set(new), key=natural)
  added = set(new) - set(old)
  pairs: dict[str, str] = {}
  if rename is not None:
    for path in gone:
      target = rename(path)
      if target in added and _signature_of(old[path]) == _signature_of(new[target]):
        pairs[path] = target
        added.discard(target)
  digest_before = {e["path"]: e.get("digest") for e in weights_before or ()}
  digest_now = {e["path"]: e.get("digest") for e in weights_now or ()}
  for path in gone:
    if path in pairs or digest_before.get(path) is None:
      continue
    candidates = [p for p in added if digest_now.get(p) == digest_before[path]
                  and _signature_of(new[p]) == _signature_of(old[path])]
    ranked = sorted(((_affinity(path, p), p) for p in candidates), reverse=True)
    if ranked and (len(ranked) == 1 or ranked[0][0] > ranked[1][0]):
      pairs[path] = ranked[0][1]
      added.discard(ranked[0][1])
  return pairs


def _renamed_group(old: str, new: str) -> tuple[str, str, str]:
  """``(prefix, old middle, new middle)``: ``blocks.3.se.conv_reduce.bias`` ->
  ``blocks.3.se.fc1.bias`` is ``("blocks.3.se", "conv_reduce", "fc1")``."""
  x, y = old.split("."), new.split(".")
  lead, trail = _common(x, y)
  return ".".join(x[:lead]), ".".join(x[lead:len(x) - trail]), ".".join(y[lead:len(y) - trail])


def _where(paths: Sequence[str]) -> str:
  """The one path all share, else their pattern (``blocks.*.se``)."""
  return paths[0] if len(set(paths)) == 1 else pattern(paths[0])


def renamed_summary(pairs: Mapping[str, str]) -> str:
  """``28 leaves renamed under blocks.*.se (conv_reduce -> fc1, conv_expand -> fc2)``."""
  groups: dict[str, list[str]] = {}
  for old, new in sorted(pairs.items(), key=lambda item: natural(item[0])):
    prefix, a, b = _renamed_group(old, new)
    groups.setdefault(pattern(prefix), [])
    if f"{a} -> {b}" not in groups[pattern(prefix)]:
      groups[pattern(prefix)].append(f"{a} -> {b}")
  where = "; ".join(f"{prefix or '(model)'} ({', '.join(names)})"
                    for prefix, names in groups.items())
  return f"{len(pairs)} lea{'f' if len(pairs) == 1 else 'ves'} renamed under {where}"


def schema_changes(before: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]],
                   pairs: Mapping[str, str] | None = None, *, limit: int | None = None
                   ) -> list[str]:
  """What changed in the state's schema: variables renamed (``pairs``, :func:`renames`),
  added, removed, or changed in type, shape or dtype.

  One line per group of the same change under one pattern (``blocks.*.se``: ``16 leaves
  renamed conv_reduce -> fc1``), in natural order (``blocks.2`` before ``blocks.10``); a
  group of one names its variable. With more than ``limit`` groups, the first ``limit``
  and a line counting the rest.
  """
  pairs = dict(pairs or {})
  old, new = {e["path"]: e for e in before}, {e["path"]: e for e in now}
  groups: dict[tuple[str, ...], list[tuple[str, str]]] = {}
  for path, target in pairs.items():
    prefix, a, b = _renamed_group(path, target)
    groups.setdefault(("renamed", pattern(prefix), a, b), []).append((path, prefix))
  for path in set(old) | set(new):
    a, b = old.get(path), new.get(path)
    if path in pairs or (a is None and path in pairs.values()):
      continue
    if b is None:  # then a is not None: path is in one of them
      what = f"{a['type']} gone from the model's state"  # pyright: ignore[reportOptionalSubscript]
    elif a is None:
      what = f"new {b['type']} in the model's state"
    elif _signature_of(a) != _signature_of(b):
      what = f"{a['type']} -> {b['type']}"
    else:
      continue
    groups.setdefault(("leaf", pattern(path), what), []).append((path, path))
  lines = []
  for key, members in sorted(groups.items(), key=lambda item: natural(
      min((m[0] for m in item[1]), key=natural))):
    members.sort(key=lambda m: natural(m[0]))
    if key[0] == "renamed":
      if len(members) == 1:
        lines.append(f"`{members[0][0]}`: renamed `{pairs[members[0][0]]}` (same type, shape "
                     "and dtype)")
      else:
        lines.append(f"`{_where([m[1] for m in members]) or '(model)'}`: {len(members)} leaves "
                     f"renamed {key[2]} -> {key[3]}")
      continue
    path = members[0][0]
    a, b = old.get(path), new.get(path)
    if len(members) == 1:
      if b is None:
        lines.append(f"`{path}`: {a['type']} {_shape_text(a)} is gone from the model's state")  # pyright: ignore[reportOptionalSubscript, reportArgumentType]
      elif a is None:
        lines.append(f"`{path}`: new {b['type']} {_shape_text(b)} in the model's state")
      else:
        lines.append(f"`{path}`: {a['type']} {_shape_text(a)} -> {b['type']} {_shape_text(b)}")
      continue
    first = (f"{_shape_text(a)}" if b is None else f"{_shape_text(b)}" if a is None  # pyright: ignore[reportArgumentType]
             else f"{_shape_text(a)} -> {_shape_text(b)}")
    lines.append(f"`{key[1]}`: {len(members)} leaves, {key[2]} (first `{path}`: {first})")
  if limit is not None and len(lines) > limit:
    lines = lines[:limit] + [f"(and {len(lines) - limit} more groups of schema changes not "
                             "listed)"]
  return lines


def mode_changes(before: Mapping[str, Mapping[str, Any]], now: Mapping[str, Mapping[str, Any]],
                 *, used: bool = False, most: int = 3) -> list[str]:
  """What changed in the modes: ``stem.bn: use_running_average True -> False (...)``,
  one line per layer, or, where more than ``most`` layers changed one flag the same way,
  one line for them all (``use_running_average True -> False (...) in 22 layers: ...``).

  With ``used=True`` (:func:`modes_used` on both sides) only the layers that ran on both
  sides are compared: a layer called on one side only is a change of the model's code,
  which the first moved layer names."""
  paths = set(before) & set(now) if used else set(before) | set(now)
  changes: dict[tuple[str, Any, Any], list[str]] = {}
  for path in sorted(paths, key=natural):
    a, b = before.get(path, {}), now.get(path, {})
    for flag in sorted(set(a) | set(b)):
      if a.get(flag) != b.get(flag):
        changes.setdefault((flag, a.get(flag), b.get(flag)), []).append(path)
  lines = []
  for (flag, a, b), where in changes.items():
    meaning = MODE_FLAGS.get(flag, {}).get(b)
    what = f"{flag} {a} -> {b}" + (f" ({meaning})" if meaning else "")
    if len(where) <= most:
      lines += [f"`{path}`: {what}" for path in where]
    else:
      shown = ", ".join(f"`{path}`" for path in where[:most])
      lines.append(f"{what} in {len(where)} layers: {shown} and {len(where) - most} more")
  return lines


def weight_changes(before: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]],
                   order: Sequence[str] = (), pairs: Mapping[str, str] | None = None
                   ) -> tuple[int, int, list[str]]:
  """``(differing Param leaves, Param leaves, the differing Param paths)``.

  Leaves are compared by digest; a leaf only one side has counts as differing; a leaf the
  baseline holds under another name (``pairs``: old path -> new path, :func:`renames`) is
  compared under its new name. Only ``Param`` leaves count (a new initialiser moves those;
  PRNG keys and BatchNorm statistics are state of another kind). They are listed in the
  order their modules were called (``order``: module paths in call order), then by path.
  """
  pairs = pairs or {}
  old: dict[str, Mapping[str, Any]] = {pairs.get(str(e["path"]), str(e["path"])): e
                                       for e in before}
  new: dict[str, Mapping[str, Any]] = {str(e["path"]): e for e in now}
  # Each p is in old or new, so one of the two gets is not None.
  params = [p for p in set(old) | set(new) if (old.get(p) or new.get(p))["type"] == "Param"]  # pyright: ignore[reportOptionalSubscript]
  rank = {path: i for i, path in enumerate(order)}

  def called(path: str) -> tuple[int, str]:
    module = path.rpartition(".")[0]
    return rank.get(module, len(rank)), path

  differ: list[str] = sorted((p for p in params
                   if p not in old or p not in new or old[p]["digest"] != new[p]["digest"]),
                  key=called)
  return len(differ), len(params), differ


def _close(a: float | None, b: float | None, scale: float, rtol: float, atol: float) -> bool:
  if a is None or b is None:
    return a is None and b is None
  return abs(a - b) <= atol + rtol * scale


def _moved(a: Mapping[str, Any], b: Mapping[str, Any], rtol: float, atol: float) -> str | None:
  """How one output's fingerprint moved (``shape (2, 16) -> (2, 15)``), or None.

  A fingerprint of a traced call (``jit``-only run) has shape and dtype only: values are
  then not compared."""
  if a["shape"] != b["shape"]:
    return f"shape {tuple(a['shape'])} -> {tuple(b['shape'])}"
  if a["dtype"] != b["dtype"]:
    return f"dtype {a['dtype']} -> {b['dtype']}"
  if "digest" not in a or "digest" not in b or a["digest"] == b["digest"]:
    return None
  extent = [abs(v) for v in (a["min"], a["max"]) if v is not None and math.isfinite(v)]
  scale = max(extent, default=0.0)
  for key in STATS:
    if not _close(a[key], b[key], scale, rtol, atol):
      return (f"{key} {a[key]:.6g} -> {b[key]:.6g}" if a[key] is not None and b[key] is not None
              else f"{key} {a[key]} -> {b[key]}")
  return None


def _ancestors(path: str) -> list[str]:
  """``a.b.c#2`` -> ``["a.b.c", "a.b", "a", "(model)"]``."""
  parts = path.partition("#")[0].split(".")
  return [".".join(parts[:i]) for i in range(len(parts), 0, -1)] + ["(model)"]


def _blame(path: str, before: Mapping[str, Any] | None, now: Mapping[str, Any] | None
           ) -> tuple[str, str, str] | None:
  """``(module, type, what changed)`` of the nearest of ``path`` and its ancestors whose
  configuration (:func:`configs`) changed, or None."""
  if not before or not now:
    return None
  for module in _ancestors(path):
    change = config_change(before.get(module), now.get(module))
    if change:
      return module, now[module]["type"], change
  return None


def first_moved(before: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]],
                *, rtol: float, atol: float, config_before: Mapping[str, Any] | None = None,
                config_now: Mapping[str, Any] | None = None) -> str | None:
  """The first submodule, in call order, whose output moved past the tolerance.

  Each statistic of the fingerprint may move by ``atol + rtol * max|output|``, the output
  tolerance applied at the output's own scale. Where that submodule, or the nearest module
  that contains it, had its configuration changed (``config_before``/``config_now``:
  :func:`configs`), that module is named with what changed: a changed activation inside a
  squeeze-excitation block moves the output of the block's second linear map first, and
  the block is to blame.

  Returns:
    ``first moved at `stem.pool` (MaxPool): shape (2, 16, 16, 64) -> (2, 15, 15, 64)``, or
    None when every submodule's output matches.
  """
  new = {e["path"]: e for e in now}

  def said(path: str, kind: str, how: str) -> str:
    blamed = _blame(path, config_before, config_now)
    if blamed is None:
      return f"first moved at `{path}` ({kind}): {how}"
    module, module_kind, change = blamed
    if module == path.partition("#")[0]:
      return f"first moved at `{path}` ({module_kind}): {change}; {how}"
    return (f"first moved at `{module}` ({module_kind}): {change} (its first output that moved: "
            f"`{path}` ({kind}), {how})")

  for entry in before:
    other = new.get(entry["path"])
    if other is None:
      return said(entry["path"], entry["type"], "called in the baseline, not called now")
    if len(entry["outputs"]) != len(other["outputs"]):
      return said(entry["path"], other["type"], f"{len(entry['outputs'])} output array(s) -> "
                  f"{len(other['outputs'])}")
    for i, (a, b) in enumerate(zip(entry["outputs"], other["outputs"], strict=True)):
      how = _moved(a, b, rtol, atol)
      if how:
        which = f"output {i}: " if len(entry["outputs"]) > 1 else ""
        return said(entry["path"], other["type"], which + how)
  old = {e["path"] for e in before}
  extra = [e for e in now if e["path"] not in old]
  if extra:
    first = extra[0]
    return said(first["path"], first["type"], "called now, not in the baseline")
  return None


def config_changes(before: Mapping[str, Any], now: Mapping[str, Any],
                   used: Sequence[str] = ()) -> list[str]:
  """``blocks.0.se (SqueezeExcite): act: silu -> relu`` for every module (of ``used``
  paths, when given) whose configuration changed, in natural order."""
  paths = set(before) & set(now)
  if used:
    called = {p.partition("#")[0] for p in used}
    paths = {p for p in paths if p in called or p == "(model)"}
  lines = []
  for path in sorted(paths, key=natural):
    change = config_change(before[path], now[path])
    if change:
      lines.append(f"`{path}` ({now[path]['type']}): {change}")
  return lines
