"""PyTorch state dicts into NNX modules: the loader and the conversions every table row uses.

Every ``from_torch`` is one call, ``load(cls, TORCH_KEYS[name], state_dict,
options)``; :mod:`nnx_pool._torch_keys` holds the table. An entry of it (a
:class:`Loader`) says three things:

* ``inferred``: the constructor arguments that the weights decide (passing one
  as an option is a TypeError, and so is ``rngs``: no initialiser runs);
* ``key_sets``: the key sets a peer's ``state_dict()`` may have, each a tuple of
  :class:`Row`; the state dict must hold every key of one set and nothing else;
* ``sizes``: the constructor arguments, read from the converted weights by
  their NNX path (``{"fc1.kernel": (in, hidden), ...}``), whichever key set matched.

A row names one state-dict key, the NNX variable it becomes (a dotted attribute
path) and the :class:`Conversion` between them:

* :data:`AS_IS`: biases, normalisation statistics, position embeddings;
* :func:`linear_weight`: a Linear ``(out, in)`` or 1x1 convolution
  ``(out, in, 1, ...)`` weight to an NNX ``(in, out)`` kernel;
* :func:`conv_weight`: a convolution weight ``(out, in, *k)`` to an NNX
  ``(*k, in, out)`` kernel (ECA's Conv1d ``(1, 1, k)`` becomes ``(k, 1, 1)``).

A row whose target is a tuple splits the converted value into that many equal
parts along its last axis (a fused ``qkv`` projection into ``q``, ``k`` and
``v``); a row without a target is a key that may be present and is ignored
(BatchNorm's ``num_batches_tracked``). :func:`linear`, :func:`batch_norm` and
:func:`layer_norm` write the rows of a whole PyTorch layer.

Loading reads the state dict as NumPy arrays (torch tensors too; torch is not
imported), or raises one ValueError listing every accepted key set and the keys
received; converts each row in order, checking its shape; builds the module from
shapes only (``nnx.eval_shape``) with ``sizes`` and the options; and assigns each
value, checking its shape against the module's variable. Every error names the
module and the key.

The conversions on their own:

>>> import numpy as np
>>> conv_weight()(np.zeros((8, 3, 5, 7)), "conv.weight", "Example").shape  # (*k, in, out)
(5, 7, 3, 8)
>>> linear_weight()(np.zeros((8, 3, 1, 1)), "fc.weight", "Example").shape  # (in, out)
(3, 8)
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# A shape requirement: the text of the error ("must be ...; got ...") when it is not met, else None.
Requirement = Callable[[tuple[int, ...]], str | None]


@dataclasses.dataclass(frozen=True)
class Conversion:
  """A PyTorch tensor to an NNX value: ``requires`` checked in order, then ``convert``.

  ``note`` follows the key in a shape-mismatch error, which shows the converted
  shape (" (transposed)").
  """

  convert: Callable[[np.ndarray], np.ndarray]
  requires: tuple[Requirement, ...] = ()
  note: str = ""

  def __call__(self, value: np.ndarray, key: str, module: str) -> np.ndarray:
    for requirement in self.requires:
      problem = requirement(value.shape)
      if problem:
        raise ValueError(f"{module}.from_torch: `{key}` {problem}")
    return self.convert(value)


def as_is(*requires: Requirement) -> Conversion:
  """The value unchanged, once ``requires`` hold (e.g. :func:`shape_is`)."""
  return Conversion(lambda value: value, requires)


AS_IS = as_is()


def _linear_shape(shape: tuple[int, ...]) -> str | None:
  if len(shape) < 2 or any(s != 1 for s in shape[2:]):
    return ("must be a 1x1 convolution weight (out, in, 1, 1) or a linear weight (out, in); "
            f"got shape {shape}.")
  return None


def _conv_shape(shape: tuple[int, ...]) -> str | None:
  if len(shape) < 3:
    return f"must be a convolution weight (out, in, *kernel); got shape {shape}."
  return None


def rank_is(ndim: int, form: str) -> Requirement:
  """A requirement of ``ndim`` axes; ``form`` shows them (``"(1 + H*W, C)"``)."""
  def requirement(got: tuple[int, ...]) -> str | None:
    return f"must be {form}; got shape {got}." if len(got) != ndim else None
  return requirement


def shape_is(shape: tuple[int, ...]) -> Requirement:
  """A requirement of exactly ``shape``, checked before the value is read."""
  def requirement(got: tuple[int, ...]) -> str | None:
    return f"has shape {got}; expected {shape}." if got != shape else None
  return requirement


def linear_weight(*also: Requirement) -> Conversion:
  """A Linear ``(out, in)`` or 1x1 conv ``(out, in, 1, ...)`` weight as an ``(in, out)`` kernel.

  ``also``: requirements checked after that one (e.g. a square weight).
  """
  return Conversion(lambda w: w.reshape(w.shape[:2]).T, (_linear_shape, *also), " (transposed)")


def conv_weight(shape: Requirement = _conv_shape) -> Conversion:
  """A convolution weight ``(out, in, *k)`` as an NNX kernel ``(*k, in, out)``.

  ``shape``: the weight's whole requirement (default: any ``(out, in, *k)``); a
  module that takes only some convolutions states its own.
  """
  return Conversion(lambda w: np.moveaxis(w, (0, 1), (-1, -2)), (shape,))


@dataclasses.dataclass(frozen=True)
class Row:
  """One state-dict key, the NNX variable(s) it becomes, and how.

  ``target``: a dotted attribute path (``"fc1.kernel"``); a tuple of paths splits
  the converted value into equal parts along its last axis; None accepts the key
  and ignores it.
  """

  key: str
  target: str | tuple[str, ...] | None
  convert: Conversion = AS_IS


@dataclasses.dataclass(frozen=True)
class Loader:
  """How one module reads a PyTorch state dict (see the module docstring)."""

  inferred: tuple[str, ...]
  key_sets: tuple[tuple[Row, ...], ...]
  sizes: Callable[[Mapping[str, np.ndarray]], dict]


def linear(key: str, target: str, *, bias: bool = True,
           weight: Conversion | None = None) -> tuple[Row, ...]:
  """The rows of a PyTorch Linear (or 1x1 Conv) ``key`` into an :class:`flax.nnx.Linear`."""
  rows = (Row(f"{key}.weight", f"{target}.kernel", weight or linear_weight()),)
  return rows + ((Row(f"{key}.bias", f"{target}.bias"),) if bias else ())


def batch_norm(key: str, target: str) -> tuple[Row, ...]:
  """A PyTorch BatchNorm into an :class:`flax.nnx.BatchNorm`; ``num_batches_tracked`` ignored."""
  names = (("weight", "scale"), ("bias", "bias"), ("running_mean", "mean"), ("running_var", "var"))
  return (*(Row(f"{key}.{torch_name}", f"{target}.{nnx_name}") for torch_name, nnx_name in names),
          Row(f"{key}.num_batches_tracked", None))


def layer_norm(key: str, target: str) -> tuple[Row, ...]:
  """A PyTorch LayerNorm (``weight``, ``bias``) into an :class:`flax.nnx.LayerNorm`."""
  return Row(f"{key}.weight", f"{target}.scale"), Row(f"{key}.bias", f"{target}.bias")


# ----------------------------------------------------------------------------
# Loading.
# ----------------------------------------------------------------------------


def load(cls: type, loader: Loader, state_dict: Mapping, options: Mapping) -> nnx.Module:
  """``cls`` built by ``loader`` from a PyTorch ``state_dict`` and the other constructor options.

  Raises TypeError for an option that the weights decide and for a state dict
  that is not a mapping, ValueError for keys that are not one key set exactly
  or a tensor of the wrong shape; each names ``cls`` and the key.
  """
  module = cls.__name__
  _refuse_inferred(options, (*loader.inferred, "rngs"), module)
  state, rows = _read_state(state_dict, loader.key_sets, module)
  values: dict[str, tuple[np.ndarray, str]] = {}  # NNX path -> (value, name in errors)
  for row in rows:
    if row.target is None:
      continue
    value = row.convert(state[row.key], row.key, module)
    name = row.key + row.convert.note
    if isinstance(row.target, str):
      values[row.target] = (value, name)
      continue
    parts = len(row.target)
    if value.ndim == 0 or value.shape[-1] % parts:
      raise ValueError(
          f"{module}.from_torch: `{name}` must split into {parts} equal parts along its last "
          f"axis; got shape {value.shape}.")
    for i, part in enumerate(np.split(value, parts, axis=-1)):
      values[row.target[i]] = (part, f"{name}, part {i + 1} of {parts}")
  sizes = loader.sizes({path: value for path, (value, _) in values.items()})
  # A module without parameters to initialise (GeMPool) takes no rngs.
  takes_rngs = "rngs" in inspect.signature(cls.__init__).parameters

  def build():
    return cls(**sizes, **options, **({"rngs": nnx.Rngs(0)} if takes_rngs else {}))

  try:  # the constructor's checks, on the sizes and values read from the weights too
    instance = nnx.eval_shape(build)
  except (TypeError, ValueError) as error:
    message = str(error).removeprefix(f"{module}: ")
    raise type(error)(f"{module}.from_torch: {message}") from None
  for path, (value, name) in values.items():
    _assign(_variable(instance, path), value, name, module)
  return _check_loaded(instance)


# The torch dtypes NumPy holds as they are; the other floating ones (bfloat16, the float8s)
# are widened to float32, which holds each of their values exactly.
_NUMPY_FLOATS = ("torch.float16", "torch.float32", "torch.float64")


def _weight(value, key: str, module: str) -> np.ndarray:
  """A state-dict value (a torch tensor, read without importing torch, or an array-like) as a
  real floating NumPy array with finite values; anything else is refused, naming ``key``."""
  where = f"{module}.from_torch: `{key}`"
  if hasattr(value, "detach"):  # a torch tensor
    if getattr(value, "is_meta", False):
      raise ValueError(
          f"{where} is a meta tensor, which holds no data (a model built on the meta device, "
          "e.g. under init_empty_weights); load its weights first, e.g. "
          "model.load_state_dict(weights, assign=True).")
    if not str(value.dtype).startswith(("torch.float", "torch.bfloat")):  # torch.half too
      raise TypeError(f"{where} must hold floating weights; got dtype {value.dtype}.")
    value = value.detach().cpu()
    if str(value.dtype) not in _NUMPY_FLOATS:
      try:
        value = value.float()
      except (RuntimeError, NotImplementedError, TypeError):
        raise TypeError(
            f"{where} has dtype {value.dtype}, which PyTorch cannot widen to float32 (a packed "
            "format); unpack it to a float dtype first.") from None
  array = np.asarray(value)
  if not jnp.issubdtype(array.dtype, jnp.floating):
    raise TypeError(f"{where} must hold floating weights; got dtype {array.dtype}.")
  finite = np.isfinite(array)
  if not finite.all():
    raise ValueError(
        f"{where} holds {array.size - int(finite.sum())} non-finite values (NaN or inf) of "
        f"{array.size}; a module built from it would compute NaN.")
  return array


def _refuse_inferred(options: Mapping, inferred: tuple[str, ...], module: str) -> None:
  given = sorted(set(options) & set(inferred))
  if given:
    raise TypeError(
        f"{module}.from_torch: do not pass {', '.join(given)}; sizes come from the weights "
        "and no initialiser runs."
    )


def _read_state(state_dict: Mapping, key_sets: tuple[tuple[Row, ...], ...],
                module: str) -> tuple[dict[str, np.ndarray], tuple[Row, ...]]:
  """The weights as NumPy arrays (:func:`_weight`) and the key set its keys are, or one error
  listing them all.

  A key set's keys are its rows' keys; those of rows without a target are optional, and
  ignored (BatchNorm's int64 ``num_batches_tracked``).
  """
  if not isinstance(state_dict, Mapping):
    raise TypeError(f"{module}.from_torch: `state_dict` must be a mapping; got {type(state_dict)}.")
  keys = set(state_dict)

  def split(rows):
    required = {row.key for row in rows if row.target is not None}
    return required, {row.key for row in rows if row.target is None}

  for rows in key_sets:
    required, optional = split(rows)
    if required <= keys <= required | optional:  # the optional keys are ignored: not read
      return {k: _weight(state_dict[k], k, module) for k in sorted(required)}, rows

  def describe(required, optional):
    text = ", ".join(sorted(required))
    return text + (f" (optional: {', '.join(sorted(optional))})" if optional else "")

  accepted = "; ".join(describe(*split(rows)) for rows in key_sets)
  raise ValueError(
      f"{module}.from_torch: unexpected state-dict keys. Expected one of: {accepted}. "
      f"Received: {', '.join(sorted(map(str, keys))) or 'no keys'}. Strip any parent prefix "
      "first, e.g. {k.removeprefix('se.'): v for k, v in sd.items() if k.startswith('se.')}."
  )


def _variable(module: nnx.Module, path: str) -> nnx.Variable:
  for name in path.split("."):
    module = getattr(module, name)
  return module  # pyright: ignore[reportReturnType]  # the path's last name is a variable


def _assign(variable: nnx.Variable, value: np.ndarray, name: str, module: str) -> None:
  # flax >= 0.12 spells it get_value/set_value (and deprecates .value); 0.11 has .value only.
  modern = hasattr(variable, "set_value")
  spec = variable.get_value() if modern else variable.value
  if tuple(spec.shape) != tuple(value.shape):
    raise ValueError(
        f"{module}.from_torch: `{name}` has shape {value.shape}; expected {tuple(spec.shape)}."
    )
  array = jnp.asarray(value, spec.dtype)
  if modern:
    variable.set_value(array)
  else:
    variable.value = array


def _check_loaded(module: nnx.Module) -> nnx.Module:
  """Refuses a module built by ``from_torch`` with a parameter left unassigned."""
  if any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(nnx.state(module))):
    raise RuntimeError(f"{type(module).__name__}.from_torch left a parameter unassigned.")
  return module
