"""The numeric half of the ``nnx_regression`` fixture and of ``guard.Guard``.

Kept apart from :mod:`nnx_pool.regression.pytest_plugin` so that loading the plugin does
not import JAX. It runs a user's module (``check``) or the gradient of a loss
(``check_grad``) under ``jax.jit`` and eagerly, through the pipeline the CLI uses
(:func:`~nnx_pool.regression.runner.compile_and_time`, :func:`~nnx_pool.regression.runner.
split_callable`), and compares a :class:`Recording` with a baseline.

A fixture baseline (format version 3) holds, as arrays, the inputs (``input/<i>``) and one
result per output leaf (``output[/<path>]``; for ``check_grad`` ``loss`` and
``grad/<path>``): the jit and the eager result are both compared with it, so nothing is
stored twice (where the two runs disagree already when recording, the eager one is kept
too, as ``<key>_eager``, and the eager run compared with it). Its manifest holds the
model's state schema, its mode flags, a fingerprint of every variable
(:func:`~nnx_pool.regression.model_state.weight_fingerprints`) and of every submodule's
output. With ``store_params=True`` the model's state (every variable but the PRNG
keys) is stored whole, once per set of weights, in ``<root>/_weights/<16 hex>/`` (a baseline
directory of its own, named by a digest of its contents, shared by every test that stores
the same weights), and loaded into the model before it runs.

A failing check writes what it obtained beside the baseline, ``<name>.obtained/`` (the same
format, kind ``pytest-obtained``, eager results included), so that :func:`report_from_disk`
(``nnx-pool-regression report DIR``) can draw the report again without the model. In
check-only mode (``NNX_REGRESSION_CHECK_ONLY``, what ``rehearse --pytest`` sets) nothing is
written into the tree: the obtained file goes to a temporary directory of the process
(:func:`obtained_path`), which the report names (``report DIR --obtained OUT``).

A weight set is named by a digest of its content (:func:`weights_name`) and checked against
its name whenever it is read: a set whose content does not match is refused
(:func:`load_weight_set`) and rewritten by an update (:func:`write`).

Format version 2 (nnx-pool 0.1.0) stored ``output`` and ``output_eager`` and the full
``weights/<path>`` parameters; it still loads: its ``output`` is compared, its weights are
compared by digest, and there is no schema, mode or per-layer fingerprint to compare.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, overload

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_pool.regression import model_state, store
from nnx_pool.regression.compare import Verdict, compare_arrays
from nnx_pool.regression.constants import OBTAINED_SUFFIX, WEIGHTS_DIR
from nnx_pool.regression.report import FailedArray, Report, Row, Timing, recorded_label
from nnx_pool.regression.runner import compile_and_time, eager_key, split_callable, to_numpy
from nnx_pool.regression.stamp import stamp_changes
from nnx_pool.regression.store import Baseline, BaselineError
from nnx_pool.regression.tolerance import (
  Tolerance,
  floored,
  is_float,
  layer_tolerance,
  scales,
  tolerance_for,
)

KIND = "pytest"
OBTAINED_KIND = "pytest-obtained"
WEIGHTS_KIND = "pytest-weights"
_REDO = "re-record it (--nnx-regression-update)"  # the fix of a damaged fixture file
# The manifest fields a fixture baseline or obtained file must hold, and those it may hold
# (older versions lack them), with their types.
_FIELDS = {"stamp": dict, "results": dict}
_OPTIONAL = {"mode": str, "name": str, "inputs": list, "timing": dict, "model": dict,
             "weights_set": str, "fresh": list, "jit_eager_agree": bool, "test": str}


@dataclasses.dataclass
class Recording:
  """What one run of a check produced, or what a baseline's ``obtained`` file holds.

  Attributes:
    mode: ``check`` or ``check_grad``.
    results: the jit results by key (``output``, ``loss``, ``grad/<path>``).
    eager: the eager results, by the same keys.
    inputs: the inputs by key (``input/<i>``).
    tolerances: each result's tolerance.
    model: for a module, ``{"type", "schema", "modes", "weights", "layers"}``: what
      :mod:`~nnx_pool.regression.model_state` says of the model that ran; None for a function.
    fresh: the fingerprints of the model's own (fresh) weights when stored weights were
      loaded over them; None when the model ran with its own.
    weight_arrays: the state to store with ``store_params`` (dotted path -> array).
    weights_set: the stored weight set the run loaded (its 16-hex name), or None.
    jit_eager_agree: whether every eager result is within tolerance of the jit one.
    compile_s, steady_s: compile time and steady-state median of the jitted call.
    call: how the check called the model, ``{"kwargs": {name: value}, "eager": bool}``
      (keyword arrays are inputs, ``input/<name>``); None when not known (read from disk).
    policy: ``policy(key, dtype, scale)``, the tolerance of a result whose baseline has
      that scale (:func:`~nnx_pool.regression.tolerance.scales`); None when not known.
    rename: the stored paths' new names (``store_params``'s ``rename``), as a function.
  """

  mode: str
  results: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  eager: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  inputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  tolerances: dict[str, Tolerance] = dataclasses.field(default_factory=dict)
  model: dict[str, Any] | None = None
  fresh: list[dict[str, Any]] | None = None
  weight_arrays: dict[str, np.ndarray] | None = None
  weights_set: str | None = None
  jit_eager_agree: bool = True
  compile_s: float | None = None
  steady_s: float | None = None
  call: dict[str, Any] | None = None
  policy: Callable[[str, np.dtype, float | None], Tolerance] | None = dataclasses.field(
      default=None, repr=False)
  rename: Callable[[str], str] | None = dataclasses.field(default=None, repr=False)

  def floored(self) -> list[str]:
    """The results whose tolerance had to be floored: all zero or subnormal."""
    return [key for key, tol in self.tolerances.items()
            if key in self.results and floored(tol, self.results[key].dtype)]


# ----------------------------------------------------------------------- running


def _flatten(prefix: str, tree: Any, separator: str = "/") -> dict[str, np.ndarray]:
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  out = {}
  for path, leaf in leaves:
    suffix = jax.tree_util.keystr(path, simple=True, separator=separator)
    if suffix == "value" or suffix.endswith(f"{separator}value"):  # a Variable's array
      suffix = suffix[:-len("value")].removesuffix(separator)
    out[f"{prefix}/{suffix}" if suffix else prefix] = to_numpy(leaf)
  return out


def as_input(value: Any, index: int | str) -> jax.Array:
  """An input as a JAX array; anything but an array or a number is refused."""
  if isinstance(value, (jax.Array, np.ndarray, np.generic, int, float, bool)):
    return jnp.asarray(value)
  where = f"inputs[{index}]" if isinstance(index, int) else index
  raise TypeError(
      f"`{where}` must be an array; got {type(value).__name__}. "
      "Pass arrays positionally: check(name, module, x, y)."
  )


def _json_static(value: Any) -> Any:
  """A static call keyword as JSON (tuples as lists); raises TypeError for anything else."""
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, tuple):
    return [_json_static(item) for item in value]
  raise TypeError(type(value).__name__)


def call_keywords(kwargs: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, jax.Array]]:
  """Splits a check's call keywords: ``(static, arrays)``.

  Python bools, numbers, strings, None and tuples of them are static (closed over, so
  ``jax.jit`` sees Python values, as ``training=False`` needs); arrays are traced inputs.

  Raises:
    TypeError: a keyword is neither.
  """
  static, arrays = {}, {}
  for name, value in (kwargs or {}).items():
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
      arrays[name] = jnp.asarray(value)
      continue
    try:
      _json_static(value)
    except TypeError:
      raise TypeError(
          f"call keyword `{name}` must be an array or a Python bool, int, float, str, None or a "
          f"tuple of them; got {type(value).__name__} ({value!r}).") from None
    static[name] = value
  return static, arrays


def _start(mode: str, inputs: Sequence[Any], kwargs: Mapping[str, Any] | None, eager: bool
           ) -> tuple[Recording, tuple[jax.Array, ...], dict[str, Any], dict[str, jax.Array]]:
  """The recording of a run with its inputs and call; ``(rec, inputs, static, arrays)``."""
  xs = tuple(as_input(x, i) for i, x in enumerate(inputs))
  static, arrays = call_keywords(kwargs)
  rec = Recording(mode, call={"kwargs": {k: _json_static(v) for k, v in sorted(static.items())},
                              "eager": bool(eager)})
  rec.inputs = {f"input/{i}": to_numpy(x) for i, x in enumerate(xs)}
  rec.inputs.update({f"input/{name}": to_numpy(x) for name, x in arrays.items()})
  return rec, xs, static, arrays


def _prepare(model: nnx.Module, weights: Mapping[str, np.ndarray] | None, store_params: bool,
             rec: Recording, rename: Any = None) -> nnx.Module:
  """Describes the model into ``rec``; returns the module to run (a copy when weights load)."""
  rec.model = {"type": type(model).__name__, "schema": model_state.schema(model),
               "modes": model_state.modes(model), "config": model_state.configs(model)}
  rec.rename = model_state.renamer(rename)
  if weights is not None:
    rec.fresh = model_state.weight_fingerprints(model)
    model = nnx.merge(*nnx.split(model), copy=True)
    model_state.load_weights(model, weights, rename)
  rec.model["weights"] = model_state.weight_fingerprints(model)
  if store_params:
    rec.weight_arrays = model_state.storable(model)
  return model


def _eager_copy(model: nnx.Module) -> nnx.Module:
  return nnx.merge(*nnx.split(model), copy=True)


def _layers(rec: Recording, model: nnx.Module, run: Callable[[nnx.Module], Any],
            traced: list[dict[str, Any]] | None) -> Any:
  """Records the layers and the modes they ran in: with ``traced=None``, runs ``run`` on a
  copy of ``model`` eagerly with :func:`~nnx_pool.regression.model_state.capture` (every
  submodule's output) and returns its result; else ``traced`` holds them already (call
  order, shapes and modes, from a trace: ``eager=False``), and it returns None."""
  out = None
  if traced is None:
    copy = _eager_copy(model)
    with model_state.capture(copy) as calls:
      out = run(copy)
  else:
    calls = traced
  rec.model["layers"] = calls  # pyright: ignore[reportOptionalSubscript]  # set by _prepare
  rec.model["modes_used"] = model_state.modes_used(calls)  # pyright: ignore[reportOptionalSubscript]
  return out


def execute(module_or_fn: Any, inputs: Sequence[Any], *, rtol: float | None,
            atol: float | None, weights: Mapping[str, np.ndarray] | None = None,
            store_params: bool = False, kwargs: Mapping[str, Any] | None = None,
            eager: bool = True, rename: Any = None) -> Recording:
  """Runs ``module_or_fn(*inputs, **kwargs)`` under jit (after warmup) and eagerly.

  Args:
    module_or_fn: an ``nnx.Module`` or a function of arrays.
    inputs: the arrays to call it with.
    rtol, atol: overrides of the output tolerance.
    weights: stored weights to load into (a copy of) the module before it runs.
    store_params: keep the module's state in the recording, to store.
    kwargs: keyword arguments of the call (:func:`call_keywords`).
    eager: also run it eagerly, recording every submodule's output; False runs it under
      jit only (a module's layers' shapes and modes are then recorded from the jit trace).
    rename: the stored weights' new paths (``store_params``'s ``rename``).
  """
  rec, xs, static, arrays = _start("check", inputs, kwargs, eager)
  args = (*xs, *arrays.values())
  target = module_or_fn
  if isinstance(module_or_fn, nnx.Module):
    target = _prepare(module_or_fn, weights, store_params, rec, rename)
  layers: list[dict[str, Any]] = []  # filled by the jit trace where eager=False
  observe = None if eager else (lambda m: model_state.traced_into(m, layers))
  apply, params, rest = split_callable(target, static, tuple(arrays), observe=observe)
  out, rec.compile_s, rec.steady_s = compile_and_time(apply, (params, rest, *args))
  rec.results = _flatten("output", out)
  if isinstance(target, nnx.Module):
    result = _layers(rec, target, lambda m: m(*xs, **static, **arrays),
                     None if eager else layers)
  else:
    result = apply(params, rest, *args) if eager else None
  rec.eager = _flatten("output", result) if eager else {}
  _settle(rec, lambda key, dtype, scale: tolerance_for(
      "model", "output", dtype, rtol=rtol, atol=atol, scale=scale))
  return rec


def execute_grad(loss_fn: Callable[..., Any], model: nnx.Module, inputs: Sequence[Any], *,
                 wrt: Any, rtol: float | None, atol: float | None,
                 weights: Mapping[str, np.ndarray] | None = None,
                 store_params: bool = False, kwargs: Mapping[str, Any] | None = None,
                 eager: bool = True, rename: Any = None) -> Recording:
  """Runs ``loss_fn(model, *inputs, **kwargs)`` and its gradient with respect to ``wrt`` state.

  The gradient is ``nnx.grad``'s: of the loss with respect to the model's variables that
  ``wrt`` selects (an ``nnx`` filter, ``nnx.Param`` by default), every other variable held
  fixed. Both come in as arguments of the jitted function, so BatchNorm statistics, RNG
  state and the rest work under the trace. ``kwargs``, ``eager`` and ``rename`` are as
  for :func:`execute`.

  Raises:
    TypeError: ``loss_fn`` is not callable or ``model`` is not an ``nnx.Module``.
    ValueError: ``wrt`` selects no variable, or the loss is not a floating scalar.
  """
  if not callable(loss_fn):
    raise TypeError(f"`loss_fn` must be a function loss_fn(model, *inputs); got "
                    f"{type(loss_fn).__name__}.")
  if not isinstance(model, nnx.Module):
    raise TypeError(f"`model` must be an nnx.Module; got {type(model).__name__}. For a plain "
                    "function, take its gradient yourself and use check().")
  rec, xs, static, arrays = _start("check_grad", inputs, kwargs, eager)
  names = tuple(arrays)
  target = _prepare(model, weights, store_params, rec, rename)
  graphdef, diff, rest = nnx.split(target, wrt, ...)
  if not jax.tree_util.tree_leaves(diff):
    raise ValueError(f"`wrt` selects no variable of the model; got {wrt!r}. Pass an nnx filter "
                     "such as nnx.Param (the default).")

  def call(model: nnx.Module, *args: Any) -> Any:
    return loss_fn(model, *args[:len(xs)], **static, **dict(zip(names, args[len(xs):],
                                                                 strict=True)))

  def loss(diff, rest, *args):
    return call(nnx.merge(graphdef, diff, rest, copy=True), *args)

  layers: list[dict[str, Any]] = []

  def described(diff, rest, *args):  # the loss, its layers recorded (eager=False)
    model = nnx.merge(graphdef, diff, rest, copy=True)
    with model_state.traced_into(model, layers):
      return call(model, *args)

  args = (*xs, *arrays.values())
  shape = jax.eval_shape(loss if eager else described, diff, rest, *args)
  if getattr(shape, "shape", None) != () or not is_float(shape.dtype):
    raise ValueError(
        f"`loss_fn` must return a floating scalar; got {getattr(shape, 'dtype', type(shape))}"
        f"{list(getattr(shape, 'shape', []))}. Reduce it, e.g. return jnp.mean(...).")

  def apply(diff, rest, *args):
    return jax.value_and_grad(loss)(diff, rest, *args)

  (value, grads), rec.compile_s, rec.steady_s = compile_and_time(apply, (diff, rest, *args))
  rec.results = {"loss": to_numpy(value), **_flatten("grad", grads)}
  if eager:
    value, grads = apply(diff, rest, *args)
    rec.eager = {"loss": to_numpy(value), **_flatten("grad", grads)}
  _layers(rec, target, lambda m: call(m, *args), None if eager else layers)
  _settle(rec, lambda key, dtype, scale: tolerance_for(
      "gradient", "output" if key == "loss" else "grad_params", dtype, rtol=rtol, atol=atol,
      scale=scale))
  return rec


def _settle(rec: Recording, policy: Callable[[str, np.dtype, float | None], Tolerance]) -> None:
  """Gives every result its tolerance, scaled to the result itself (the baseline it becomes;
  :func:`compare` scales it to the stored one), and says whether jit and eager agree."""
  rec.policy = policy
  scale = scales(rec.results)
  rec.tolerances = {key: policy(key, value.dtype, scale.get(key))
                    for key, value in rec.results.items()}
  rec.jit_eager_agree = all(
      compare_arrays(rec.eager[key], value, rec.tolerances[key]).passed
      for key, value in rec.results.items() if key in rec.eager)


def nonfinite_outputs(rec: Recording) -> str | None:
  """Why a run's results are not all finite (chex's message), or None when they are."""
  floats = {k: v for k, v in rec.results.items() if is_float(v.dtype)}
  try:
    chex.assert_tree_all_finite(floats)
  except AssertionError as e:
    return str(e).strip().splitlines()[0]
  return None


def stamp_label(stamp: Mapping[str, Any]) -> str:
  """``jax 0.10.2, flax 0.12.8, cpu`` for messages."""
  versions = stamp.get("versions", {})
  backend = stamp.get("backend", {})
  return f"jax {versions.get('jax')}, flax {versions.get('flax')}, {backend.get('platform')}"


# ------------------------------------------------------------------------ storing


def weights_root(path: Path) -> Path:
  """Where the weight sets of the baseline at ``path`` live: ``<root>/_weights``."""
  return Path(path).parent.parent / WEIGHTS_DIR


def weights_name(arrays: Mapping[str, np.ndarray]) -> str:
  """A weight set's name: 16 hex digits of the SHA-256 of its paths and array digests."""
  return _set_name((path, store.digest(value)) for path, value in arrays.items())


def _set_name(digests: Iterable[tuple[str, Any]]) -> str:
  return hashlib.sha256(json.dumps(sorted(digests)).encode()).hexdigest()[:16]


def read_weight_set(target: Path) -> Baseline:
  """Reads the weight set at ``target``, checked against its name (its content's address).

  Raises:
    BaselineError: it is missing or damaged, or holds other weights than its name says
      (one line naming it).
  """
  base = store.read_baseline(target)
  # read_baseline checked every array against its digest: the table's digests are the arrays'.
  held = _set_name((key, entry["digest"]) for key, entry in base.manifest["arrays"].items())
  if base.manifest.get("kind") != WEIGHTS_KIND or held != target.name:
    raise BaselineError(
        f"weight set {target}: its content is not the weight set named {target.name} (it "
        f"hashes to {held}, kind {base.manifest.get('kind')!r}): it was replaced or edited; "
        "--nnx-regression-update rewrites it.")
  return base


def size_of(path: Path) -> int:
  """Bytes of the files directly in a baseline directory (0 if there is none)."""
  try:
    return sum(entry.stat().st_size for entry in Path(path).iterdir() if entry.is_file())
  except OSError:
    return 0


def megabytes(size: int) -> str:
  """``2.1 MB``, ``236 KB``."""
  if size >= 1e6:
    return f"{size / 1e6:.1f} MB"
  return f"{max(size / 1e3, 0.1):.0f} KB" if size >= 1e3 else f"{size} B"


@dataclasses.dataclass
class Written:
  """What a write put on disk: the baseline's bytes, and its weight set's (if any)."""

  size: int
  weights: Path | None = None
  weights_size: int = 0
  weights_new: bool = False
  weights_note: str = ""  # why a set that was there was written again

  def describe(self) -> str:
    """``2.1 MB`` or ``2.1 MB, and weights 32.1 MB in _weights/<hex> (new)``."""
    text = megabytes(self.size)
    if self.weights is not None:
      how = self.weights_note or ("written now" if self.weights_new else
                                  "shared, already stored")
      text += (f", and its weights {megabytes(self.weights_size)} in "
               f"{self.weights.parent.name}/{self.weights.name} ({how})")
    return text


def _fields(rec: Recording, stamp: Mapping[str, Any], *, nodeid: str, name: str,
            weights_set: str | None) -> dict[str, Any]:
  return {
      "kind": KIND,
      "stamp": dict(stamp),
      "test": nodeid,
      "name": name,
      "mode": rec.mode,
      "inputs": sorted(rec.inputs),
      "results": {k: t.to_json() for k, t in sorted(rec.tolerances.items())},
      "jit_eager_agree": rec.jit_eager_agree,
      "timing": {"compile_s": rec.compile_s, "steady_s": rec.steady_s},
      "model": rec.model,
      "weights_set": weights_set,
      "call": rec.call,
  }


def _store_weights(path: Path, arrays: Mapping[str, np.ndarray]) -> tuple[Path, bool, str]:
  """Writes a weight set under :func:`weights_root` unless it is there, whole and matching
  its name; ``(its dir, written, why a set that was there was written again)``."""
  target = weights_root(path) / weights_name(arrays)
  try:
    read_weight_set(target)
    return target, False, ""
  except BaselineError as e:
    there = (target / store.MANIFEST).exists()
    why = "" if not there else (
        "rewritten: its content did not match its name" if "is not the weight set named" in
        str(e) else "rewritten: it was damaged")
  store.write_baseline(target, {"kind": WEIGHTS_KIND}, dict(arrays), force=True)
  return target, True, why


def write(path: Path, rec: Recording, stamp: Mapping[str, Any], *, nodeid: str,
          name: str) -> Written:
  """Writes (or replaces) the baseline at ``path``, and its weight set when one is kept.

  Removes a stale ``obtained`` file beside it.
  """
  weights, new, weights_set, why = None, False, None, ""
  if rec.weight_arrays is not None:
    weights, new, why = _store_weights(path, rec.weight_arrays)
    weights_set = weights.name
  store.write_baseline(path, _fields(rec, stamp, nodeid=nodeid, name=name,
                                     weights_set=weights_set),
                       {**rec.inputs, **rec.results, **disagreeing_eager(rec)}, force=True)
  remove_obtained(path)
  return Written(size_of(path), weights, size_of(weights) if weights else 0, new, why)


def disagreeing_eager(rec: Recording) -> dict[str, np.ndarray]:
  """The eager results that are not within tolerance of the jit ones, keyed ``*_eager``.

  A baseline stores one result per output, compared with both runs; only where the two runs
  already disagree when recording (BatchNorm in train mode can: jit fuses its variance) is
  the eager result stored too, and the eager run compared with it.
  """
  return {eager_key(key): value for key, value in rec.eager.items()
          if key in rec.results and not compare_arrays(value, rec.results[key],
                                                       rec.tolerances[key]).passed}


_SCRATCH: list[Path] = []  # this process's directory of check-only obtained files, once made


def obtained_path(path: Path, *, check_only: bool = False) -> Path:
  """Where a failing check writes what it obtained: ``<name>.obtained`` beside the baseline.

  With ``check_only``, never in the tree: ``<tmp>/<dir>-<8 hex>/<name>.obtained`` in a
  temporary directory this process makes once (``nnx-regression-obtained-*``, left for
  ``report`` to read; the 8 hex digits tell apart two baseline directories of one name).
  """
  path = Path(path)
  if not check_only:
    return Path(f"{path}{OBTAINED_SUFFIX}")
  if not _SCRATCH:
    _SCRATCH.append(Path(tempfile.mkdtemp(prefix="nnx-regression-obtained-")))
  where = hashlib.sha256(str(path.parent.absolute()).encode()).hexdigest()[:8]
  return _SCRATCH[0] / f"{path.parent.name}-{where}" / f"{path.name}{OBTAINED_SUFFIX}"


def write_obtained(path: Path, rec: Recording, stamp: Mapping[str, Any], *, nodeid: str,
                   name: str, check_only: bool = False) -> Path:
  """Writes this run's results (jit and eager) beside the baseline at ``path`` (with
  ``check_only``, in a temporary directory: :func:`obtained_path`); returns where.

  Raises:
    OSError: it could not be written (a read-only tree, a full disk).
  """
  fields = _fields(rec, stamp, nodeid=nodeid, name=name, weights_set=rec.weights_set)
  fields.update(kind=OBTAINED_KIND, fresh=rec.fresh)
  eager = {eager_key(k): v for k, v in rec.eager.items()}
  out = obtained_path(path, check_only=check_only)
  store.write_baseline(out, fields, {**rec.inputs, **rec.results, **eager}, force=True)
  return out


def remove_obtained(path: Path) -> None:
  """Removes the ``obtained`` file of a baseline, if it is one (nothing else is touched)."""
  out = obtained_path(path)
  try:
    manifest = store.parse_json((out / store.MANIFEST).read_bytes())
  except (OSError, ValueError):
    return
  if isinstance(manifest, dict) and manifest.get("kind") == OBTAINED_KIND:
    shutil.rmtree(out, ignore_errors=True)


def load_weight_set(path: Path, manifest: Mapping[str, Any]) -> tuple[str, dict[str, np.ndarray]]:
  """The stored weights a baseline names: ``(name, arrays)``.

  Raises:
    BaselineError: the baseline names none, or the set is missing or damaged.
  """
  name = manifest.get("weights_set")
  if not name:
    raise BaselineError(
        f"baseline {path}: holds no stored weights (it was recorded without store_params=True); "
        "pass --nnx-regression-update to store them.")
  if not isinstance(name, str) or not re.fullmatch(r"[0-9a-f]{16}", name):
    raise BaselineError(f"baseline {path}: names the weight set {name!r}, which is no weight "
                        f"set's name (16 hex digits); {_REDO}.")
  try:
    base = read_weight_set(weights_root(path) / name)
  except BaselineError as e:
    raise BaselineError(f"{e} (the weights of baseline {path})") from None
  return name, base.arrays


# ---------------------------------------------------------------------- comparing


def load(path: Path) -> Baseline:
  """Reads a fixture baseline.

  Raises:
    BaselineError: see :func:`~nnx_pool.regression.store.read_baseline`; also when it is not
      a fixture baseline.
  """
  base = store.read_baseline(path)
  if base.manifest.get("kind") != KIND:
    raise BaselineError(f"baseline {path}: is not a pytest fixture baseline (kind "
                        f"{base.manifest.get('kind')!r}).")
  check_fields(path, base.manifest)
  return base


def check_fields(path: Path, manifest: Mapping[str, Any]) -> None:
  """Raises the one-line BaselineError where a fixture manifest lacks a field or holds one of
  another type (a manifest edited and sealed again, or written by another tool)."""
  for field, kind in (*_FIELDS.items(), *_OPTIONAL.items()):
    value = manifest.get(field)
    if value is None and field in _OPTIONAL:
      continue
    if not isinstance(value, kind):
      got = "nothing" if value is None else type(value).__name__
      raise BaselineError(f"baseline {path}: its {store.MANIFEST} field {field!r} holds {got}, "
                          f"not a {kind.__name__}; {_REDO}.")
  if not all(isinstance(t, dict) for t in manifest["results"].values()):
    raise BaselineError(f"baseline {path}: its {store.MANIFEST} field 'results' holds an "
                        f"entry that is not a dict; {_REDO}.")


def _result_keys(manifest: Mapping[str, Any]) -> list[str]:
  """The stored result keys (format 2 also stored ``output_eager``: compared via ``output``)."""
  return sorted(k for k in manifest.get("results", {}) if not k.split("/")[0].endswith("_eager"))


def _v2_weights(base: Baseline) -> list[dict[str, Any]]:
  """Fingerprints of a format-2 baseline's full ``weights/<path>`` parameters."""
  return [{"path": key.removeprefix("weights/").replace("/", "."), "type": "Param",
           "digest": store.digest(value)}
          for key, value in sorted(base.arrays.items()) if key.startswith("weights/")]


@overload
def _weights_line(before: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]],
                  *, loaded: Literal[True], order: Sequence[str],
                  pairs: Mapping[str, str] | None = None) -> str: ...
@overload
def _weights_line(before: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]],
                  *, loaded: bool, order: Sequence[str],
                  pairs: Mapping[str, str] | None = None) -> str | None: ...
def _weights_line(before: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]],
                  *, loaded: bool, order: Sequence[str],
                  pairs: Mapping[str, str] | None = None) -> str | None:
  differ, params, paths = model_state.weight_changes(before, now, order, pairs)
  if loaded:
    if not paths:
      return "weights: the stored weights were loaded before running; fresh initialisation " \
             "still gives the same weights"
    return (f"weights: the stored weights were loaded before running, so the outputs below do "
            f"not depend on initialisation; fresh initialisation no longer matches them: "
            f"{differ} of {params} parameter leaves differ (first: `{paths[0]}`)")
  if not paths:
    return None
  return (f"the initialisation changed: {differ} of {params} parameter leaves differ (first: "
          f"`{paths[0]}`); every output below ran on the new weights. Pass store_params=True to "
          "load stored weights and compare the computation alone")


def _spatial(key: str, array: np.ndarray) -> tuple[int, ...]:
  """The map axes of a result in nnx-pool's channels-last layout (none for a gradient)."""
  if key.startswith("grad") or array.ndim < 3:
    return ()
  return tuple(range(1, array.ndim - 1))


# Schema changes listed in a failure's headline, at most (grouped by submodule pattern).
MAX_SCHEMA_LINES = 20


def compare(base: Baseline, rec: Recording, stamp: Mapping[str, Any], *, name: str) -> Report:
  """Compares a recording with a fixture baseline.

  The report's first lines (:attr:`~nnx_pool.regression.report.Report.headline`) say what
  changed about the model before any number: the call's keywords, the state's schema, the
  modes the layers ran in, the weights, the inputs, and the first submodule whose output
  moved. Then one row per result (two, ``[jit]`` and ``[eager]``, where the two disagree
  with each other).

  Each result is compared under the tolerance its baseline array's scale gives
  (:func:`~nnx_pool.regression.tolerance.scales`), never the new result's. A schema change
  whose results all pass (a refactor that renamed variables and kept every number) passes:
  the headline is then the one line that says so.

  Returns:
    The report, exit code 1 when anything differs, else 0.
  """
  manifest = base.manifest
  report = Report(command="check", baseline=str(base.path), recorded=recorded_label(manifest),
                  unit="arrays", stamp=dict(stamp), baseline_stamp=manifest.get("stamp", {}))
  report.stamp_changes = stamp_changes(manifest.get("stamp", {}), stamp)
  timing = manifest.get("timing", {})
  report.timings.append(
      Timing(name, timing.get("compile_s"), rec.compile_s, timing.get("steady_s"), rec.steady_s))
  problems = 0  # headline lines that make the check fail; the others inform
  lines = report.headline
  version = manifest.get("format_version")
  old_model = manifest.get("model") or {}
  if version == 2:
    lines.append("baseline of format version 2 (nnx-pool 0.1.0): no schema, modes or per-layer "
                 "fingerprints to compare, and its outputs are compared with its jit result; "
                 "--nnx-regression-update rewrites it in format 3")
  count = len(lines)
  if manifest.get("mode", "check") != rec.mode:
    lines.append(f"the baseline was recorded by {manifest.get('mode', 'check')}(), this run is "
                 f"{rec.mode}(); re-record it")
  if rec.call is not None:
    lines += _call_changes((manifest.get("call") or {}).get("kwargs", {}), rec.call["kwargs"])
  problems += len(lines) - count
  model = rec.model or {}
  pairs: dict[str, str] = {}
  schema: list[str] = []
  if old_model.get("schema") is not None and model.get("schema") is not None:
    pairs = model_state.renames(old_model["schema"], model["schema"],
                                weights_before=old_model.get("weights"),
                                weights_now=model.get("weights"), rename=rec.rename)
    schema = model_state.schema_changes(old_model["schema"], model["schema"], pairs,
                                        limit=MAX_SCHEMA_LINES)
  lines += schema  # they fail the check only with a result that fails (below)
  count = len(lines)
  if old_model.get("modes_used") is not None and model.get("modes_used") is not None:
    lines += model_state.mode_changes(old_model["modes_used"], model["modes_used"], used=True)
  elif old_model.get("modes") is not None and model.get("modes") is not None:
    lines += model_state.mode_changes(old_model["modes"], model["modes"])
  problems += len(lines) - count
  before = old_model.get("weights") if version != 2 else _v2_weights(base)
  if before is not None and model.get("weights") is not None:
    order = [call["path"] for call in model.get("layers") or ()]
    if rec.fresh is not None:
      lines.append(_weights_line(before, rec.fresh, loaded=True, order=order,
                                 pairs=pairs))  # informs only
    else:
      now = model["weights"] if version != 2 else [w for w in model["weights"]
                                                    if w["type"] == "Param"]
      line = _weights_line(before, now, loaded=False, order=order, pairs=pairs)
      lines += [line] if line else []
      problems += bool(line)
  count = len(lines)
  lines += _input_problems(base.arrays, rec)
  problems += len(lines) - count
  keys = _result_keys(manifest)
  _rescale(rec, base.arrays, keys)
  failing = False
  for key in sorted(set(keys) | set(rec.results), key=model_state.natural):
    failing |= _rows_for(report, name, key, base.arrays, rec, key in keys)
  if failing and old_model.get("layers") and model.get("layers") is not None:
    lines.append(_first_moved(old_model, model, rec))
  if manifest.get("jit_eager_agree") and not rec.jit_eager_agree:
    report.notes.append("jit and eager results agreed in the baseline and now disagree")
  if not (failing or problems or report.notes):
    # It passes: the lines that only inform go, and a refactor that kept every number
    # (the schema changed) gets the one line that says so.
    lines[:] = [_refactor_line(old_model["schema"], model["schema"], pairs)] if schema else []
  report.exit_code = 1 if failing or problems or report.notes else 0
  return report


def _rescale(rec: Recording, stored: Mapping[str, np.ndarray], keys: Sequence[str]) -> None:
  """Gives each result the tolerance of its baseline array's scale (where the policy that
  made the recording's tolerances is known, and the baseline holds the result)."""
  if rec.policy is None:
    return
  have = [key for key in keys if key in rec.results and key in stored]
  scale = scales({key: stored[key] for key in have})
  for key in have:
    rec.tolerances[key] = rec.policy(key, rec.results[key].dtype, scale.get(key))


def _call_changes(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
  """One line per call keyword that changed: ``call keyword `training`: False -> True``."""
  lines = []
  for key in sorted(set(before) | set(now)):
    if key not in before:
      lines.append(f"call keyword `{key}`: new, {now[key]!r} (the baseline's call did not pass it)")
    elif key not in now:
      lines.append(f"call keyword `{key}`: {before[key]!r} in the baseline, not passed now")
    elif before[key] != now[key] or type(before[key]) is not type(now[key]):
      lines.append(f"call keyword `{key}`: {before[key]!r} -> {now[key]!r}")
  return lines


def _refactor_line(before: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]],
                   pairs: Mapping[str, str]) -> str:
  """``schema changed, outputs identical: 28 leaves renamed under blocks.*.se (...)``."""
  old, new = {e["path"] for e in before}, {e["path"] for e in now}
  parts = [model_state.renamed_summary(pairs)] if pairs else []
  gone, added = len(old - new - set(pairs)), len(new - old - set(pairs.values()))
  changed = len(model_state.schema_changes(
      [e for e in before if e["path"] in new], [e for e in now if e["path"] in old]))
  parts += [f"{gone} gone"] if gone else []
  parts += [f"{added} new"] if added else []
  parts += [f"{changed} changed in type, shape or dtype"] if changed else []
  return ("schema changed, outputs identical (within tolerance): " + "; ".join(parts)
          + "; --nnx-regression-update records the new schema")


def _first_moved(old_model: Mapping[str, Any], model: Mapping[str, Any], rec: Recording) -> str:
  """The line that says where a failing model first moved."""
  key, tol = next(iter(rec.tolerances.items()))
  rtol, atol = layer_tolerance(tol, rec.results[key].dtype if key in rec.results else None)
  config_before, config_now = old_model.get("config"), model.get("config")
  moved = model_state.first_moved(old_model["layers"], model["layers"], rtol=rtol,
                                  atol=atol, config_before=config_before,
                                  config_now=config_now)
  if moved:
    return moved
  traced = any(call.get("traced") for layers in (old_model["layers"], model["layers"])
               for call in layers)
  if traced:
    changed = model_state.config_changes(config_before or {}, config_now or {},
                                         [call["path"] for call in model["layers"]])
    return ("no per-layer values in a jit-only run (eager=False): which layer moved first is "
            "not known; run it with eager=True to find it" + (
                f". Configuration changed: {'; '.join(changed[:3])}" if changed else ""))
  return ("every submodule's output is within tolerance of its fingerprint: the difference "
          "arises in the model's own code after its last submodule" + (
              ", or in the backward pass" if rec.mode == "check_grad" else ""))


def _rows_for(report: Report, name: str, key: str, stored: Mapping[str, np.ndarray],
              rec: Recording, in_baseline: bool) -> bool:
  """The row(s) of one result; whether any failed."""
  if not in_baseline:
    report.rows.append(Row(f"{name}:{key}", "FAIL", details=["produced now but not in the "
                                                             "baseline"]))
    return True
  if key not in rec.results:
    report.rows.append(Row(f"{name}:{key}", "FAIL", details=["in the baseline but no longer "
                                                             "produced"]))
    return True
  tol, expected = rec.tolerances[key], stored[key]
  sides = [("", rec.results[key])]
  eager = rec.eager.get(key)
  if eager is not None and (eager_key(key) in stored or not compare_arrays(
      eager, rec.results[key], tol).passed):
    sides = [(" [jit]", rec.results[key]), (" [eager]", eager)]
  failed = False
  for label, actual in sides:
    if label == " [eager]":  # against the eager result where the baseline kept one
      expected = stored.get(eager_key(key), expected)
    verdict = compare_arrays(actual, expected, tol)
    row = _row(f"{name}:{key}{label}", verdict, tol)
    if not verdict.passed and actual.dtype == expected.dtype and actual.shape == expected.shape:
      row.failed[key] = FailedArray(expected, actual, tol, _spatial(key, expected))
    report.rows.append(row)
    failed |= not verdict.passed
  return failed


def _row(case: str, verdict: Verdict, tol: Tolerance) -> Row:
  row = Row(case, "PASS" if verdict.passed else "FAIL", verdict.max_abs, verdict.max_rel,
            tol.describe())
  row.arrays["result"] = {**verdict.to_json(), "tolerance": tol.to_json()}
  if not verdict.passed:
    row.details.append(verdict.message)
  return row


def _input_problems(stored: Mapping[str, np.ndarray], rec: Recording) -> list[str]:
  """What differs between the inputs of the baseline and of this run."""
  problems = []
  base_inputs = {k for k in stored if k.startswith("input/")}
  if base_inputs != set(rec.inputs):
    problems.append(
        f"the test passes {len(rec.inputs)} input(s); the baseline has {len(base_inputs)}")
  for key in sorted(base_inputs & set(rec.inputs)):
    if store.digest(rec.inputs[key]) != store.digest(stored[key]):
      problems.append(
          f"{key} differs from the baseline's (shape, dtype or values); the comparison needs "
          "the same inputs. Pass --nnx-regression-update if the change is deliberate.")
  return problems


def report_from_disk(path: str | os.PathLike, obtained: str | os.PathLike | None = None
                     ) -> Report:
  """The report of the last failing check of the baseline at ``path``, from its files alone.

  Reads the baseline and the ``obtained`` file a failing check wrote beside it (or at
  ``obtained``, where a check-only run wrote it), and compares them as the check did.

  Raises:
    BaselineError: either is missing or damaged.
  """
  path = Path(path)
  base = load(path)
  out = obtained_path(path) if obtained is None else Path(obtained)
  if not (out / store.MANIFEST).exists():
    where = (f"no obtained results beside it ({out.name}): a failing check writes them; run "
             "the test first" if obtained is None else f"no obtained results in {out}")
    raise BaselineError(f"baseline {path}: {where}.")
  got = store.read_baseline(out)
  manifest = got.manifest
  if manifest.get("kind") != OBTAINED_KIND:
    raise BaselineError(f"baseline {path}: {out} is not an obtained file (kind "
                        f"{manifest.get('kind')!r}).")
  check_fields(out, manifest)
  timing = manifest.get("timing") or {}
  rec = Recording(manifest.get("mode") or "check", model=manifest.get("model"),
                  fresh=manifest.get("fresh"), weights_set=manifest.get("weights_set"),
                  jit_eager_agree=bool(manifest.get("jit_eager_agree")),
                  compile_s=timing.get("compile_s"), steady_s=timing.get("steady_s"))
  for key, value in got.arrays.items():
    if key.startswith("input/"):
      rec.inputs[key] = value
    elif key in manifest["results"]:
      rec.results[key] = value
  for key in rec.results:
    if eager_key(key) in got.arrays:
      rec.eager[key] = got.arrays[eager_key(key)]
  try:
    rec.tolerances = {k: Tolerance.from_json(t) for k, t in manifest["results"].items()}
    return compare(base, rec, manifest["stamp"], name=manifest.get("name") or path.name)
  except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
    # Both files passed their checksums: a field within them is not what the kit writes.
    raise BaselineError(f"baseline {path}: it or {out} holds a field the comparison cannot "
                        f"read ({type(e).__name__}: {e}); {_REDO}.") from None


def session_report(baselines: Sequence[str | os.PathLike | tuple[Any, Any]]) -> Report:
  """One report of several failing checks (a pytest session's), from their files.

  Each item is a baseline's path, whose obtained file lies beside it, or ``(path,
  obtained)`` where a check-only run wrote it elsewhere. Rows, headline lines and notes are
  prefixed with each baseline's ``<module>/<name>``; the stamps are those of the first check
  (one session has one environment; a baseline recorded elsewhere says so in its notes).
  """
  report = Report(command="check", unit="arrays")
  for item in baselines:
    path, obtained = item if isinstance(item, tuple) else (item, None)
    path = Path(path)
    label = f"{path.parent.name}/{path.name}"
    try:
      one = report_from_disk(path, obtained)
    except BaselineError as e:
      report.notes.append(f"{label}: {e}")
      continue
    if report.baseline is None:
      report.baseline = str(path.parent.parent)
      report.stamp, report.baseline_stamp = one.stamp, one.baseline_stamp
      report.stamp_changes, report.recorded = one.stamp_changes, one.recorded
    elif one.stamp_changes != report.stamp_changes:
      report.notes.append(f"{label}: its baseline's environment differs from the first's: "
                          f"{'; '.join(one.stamp_changes) or 'no changes'}")
    for row in one.rows:
      row.case = f"{path.parent.name}/{row.case}"
      report.rows.append(row)
    report.headline += [f"{label}: {line}" for line in one.headline]
    report.notes += [f"{label}: {note}" for note in one.notes
                     if not note.startswith("what this run obtained")]
    report.timings += one.timings
  report.exit_code = 1 if report.rows or report.notes else 0
  return report
