"""One int rule for every module, the functional twins, and ``nnx_pool.output_shape``.

Expected values come from the NumPy mirror (``nnx_pool.reference``), from
PyTorch 2.13 CPU outputs written out below, or from the closed-form output-size
rule (PyTorch's ``Pool.h``: ``floor((L + 2p - d(k - 1) - 1) / s) + 1``).
"""

from __future__ import annotations

import functools
import inspect
import runpy
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import nnx_pool
from nnx_pool import (
  AdaptiveAvgPool,
  AdaptiveMaxPool,
  AvgPool,
  GlobalAvgPool,
  GlobalMaxPool,
  LPPool,
  MaxPool,
  MaxUnpool,
  MinPool,
  output_shape,
  reference,
)
from nnx_pool import functional as F

# Modules from shapes with NumPy values (tests/_cheap.py), where the initialiser is not the point.
build = runpy.run_path(str(Path(__file__).parent / "_cheap.py"))["build"]

RNG = np.random.default_rng(12)
X2 = RNG.permutation(2 * 7 * 6 * 3).reshape(2, 7, 6, 3).astype(np.float32)
X1 = RNG.permutation(2 * 9 * 3).reshape(2, 9, 3).astype(np.float32)

# ----------------------------------------------------------------------------
# The int rule.
# ----------------------------------------------------------------------------


def test_int_arguments_mean_two_spatial_dims_as_pytorch_maxpool2d():
  # nn.MaxPool2d(3, 2, 1) on NCHW arange(25): PyTorch 2.13 CPU gives these values.
  x = np.arange(25.0, dtype=np.float32).reshape(1, 5, 5, 1)
  small, y = jax.jit(lambda x, x2: (MaxPool(3, 2, 1)(x), MaxPool(3, 2, 1)(x2)))(x, X2)
  np.testing.assert_array_equal(small[0, ..., 0], [[6, 8, 9], [16, 18, 19], [21, 23, 24]])
  want, _ = reference.max_pool(X2, (3, 3), (2, 2), ((1, 1), (1, 1)))
  np.testing.assert_array_equal(y, want)


def test_one_dim_is_num_spatial_dims_1_or_a_one_tuple():
  want, _ = reference.max_pool(X1, (3,), (2,), ((1, 1),))
  np.testing.assert_array_equal(MaxPool(3, 2, 1, num_spatial_dims=1)(X1), want)
  np.testing.assert_array_equal(MaxPool((3,), 2, 1)(X1), want)
  np.testing.assert_array_equal(MaxPool(3, (2,), 1)(X1), want)  # any tuple sets the dims


@pytest.mark.parametrize("module", [AvgPool, MaxPool, MinPool, MaxUnpool])
def test_every_window_module_repeats_an_int_over_num_spatial_dims(module):
  for ndim in (1, 2, 3):
    pool = module(2, num_spatial_dims=ndim)
    assert pool.window.shape == (2,) * ndim
    assert pool.window.strides == (2,) * ndim
  assert LPPool(2, 3, num_spatial_dims=3).window.shape == (3, 3, 3)
  assert AdaptiveAvgPool(3, num_spatial_dims=1).output_size == (3,)
  assert AdaptiveMaxPool(3).output_size == (3, 3)


@pytest.mark.parametrize("module", [AvgPool, MaxPool, MinPool, LPPool, MaxUnpool,
                                    AdaptiveAvgPool, AdaptiveMaxPool, GlobalAvgPool,
                                    GlobalMaxPool])
def test_num_spatial_dims_is_keyword_only_and_defaults_to_two(module):
  parameter = inspect.signature(module.__init__).parameters["num_spatial_dims"]
  assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
  assert parameter.default in (None, 2)  # None: a tuple argument may set it, else 2


@pytest.mark.parametrize("build, message", [
    (lambda: MaxPool((3,), num_spatial_dims=2),
     "`window_shape` (3,) has 1 entries, but `num_spatial_dims=2` sets 2 spatial dim(s)"),
    (lambda: AvgPool((3, 3), (2,)),
     "`strides` (2,) has 1 entries, but `window_shape` (3, 3) sets 2 spatial dim(s)"),
    (lambda: MinPool(3, padding=((1, 1),), dilation=(1, 1)),
     "`dilation` (1, 1) has 2 entries, but `padding` ((1, 1),) sets 1 spatial dim(s)"),
    (lambda: AdaptiveAvgPool((2, 2), num_spatial_dims=3),
     "`output_size` (2, 2) has 2 entries, but `num_spatial_dims=3` sets 3 spatial dim(s)"),
    (lambda: MaxUnpool(2, num_spatial_dims=4), "`num_spatial_dims` must be 1, 2 or 3; got 4."),
])
def test_arguments_that_disagree_are_a_value_error(build, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    build()


def test_a_rank_mismatch_names_the_expected_dims_and_the_fix():
  with pytest.raises(ValueError) as info:
    MaxPool(2)(X1[0, :, 0])  # (9,): a 1-D map without its channel axis
  assert "with 2 spatial dim(s), so rank 3 or more; got shape (9,)" in str(info.value)
  with pytest.raises(ValueError) as info:
    AvgPool(2, num_spatial_dims=3)(X1[0])  # (L, C) to a 3-D pool
  message = str(info.value)
  assert "3 spatial dim(s), so rank 4 or more; got shape (9, 3) (rank 2)" in message
  assert "For this shape set num_spatial_dims=1 (the default is 2" in message


# ----------------------------------------------------------------------------
# Functional twins.
# ----------------------------------------------------------------------------

TWINS = [
    ("avg_pool", AvgPool, (3, 2, 1), dict(ceil_mode=True, count_include_pad=False)),
    ("max_pool", MaxPool, (3, 2, 1), dict(ceil_mode=True, return_indices=True)),
    ("min_pool", MinPool, (2, 2), dict(dilation=2, return_indices=True)),
    ("lp_pool", LPPool, (2, 3, 2), dict(ceil_mode=True)),
    ("adaptive_avg_pool", AdaptiveAvgPool, ((3, None),), {}),
    ("adaptive_max_pool", AdaptiveMaxPool, (4,), dict(return_indices=True)),
    ("global_avg_pool", GlobalAvgPool, (), dict(keepdims=True)),
    ("global_max_pool", GlobalMaxPool, (), {}),
    ("blur_pool", nnx_pool.BlurPool, (3, 2), dict(pad_mode="replicate")),
    ("median_pool", nnx_pool.MedianPool, (3, 2), dict(same=True)),
]


# Flax's functions default strides to 1 and PyTorch's to the window: no default here.
STRIDES_REQUIRED = {("avg_pool", "strides"), ("max_pool", "strides"), ("min_pool", "strides")}
# A learnable p (GeM) or r (LSE) is the module's: the twins take the value itself.
PARAMETER_OPTIONS = ("learnable", "param_dtype")


def test_every_pooling_module_has_a_functional_twin_with_its_signature():
  modules = {"avg_pool": AvgPool, "max_pool": MaxPool, "min_pool": MinPool, "lp_pool": LPPool,
             "max_unpool": MaxUnpool, "adaptive_avg_pool": AdaptiveAvgPool,
             "adaptive_max_pool": AdaptiveMaxPool, "global_avg_pool": GlobalAvgPool,
             "global_max_pool": GlobalMaxPool, "gem_pool": nnx_pool.GeMPool,
             "lse_plus_pool": nnx_pool.LsePlusPool, "blur_pool": nnx_pool.BlurPool,
             "median_pool": nnx_pool.MedianPool,
             "fractional_max_pool": nnx_pool.FractionalMaxPool}
  assert sorted(F.__all__) == sorted(modules)
  for name, module in modules.items():
    ours = dict(inspect.signature(getattr(F, name)).parameters)
    theirs = dict(inspect.signature(module.__init__).parameters)
    del theirs["self"]
    for option in PARAMETER_OPTIONS:  # how a module holds its parameter: no twin has it
      theirs.pop(option, None)
    assert list(ours)[0] == "inputs"
    for arg, parameter in theirs.items():  # the module's names, kinds and defaults
      assert ours[arg].kind == parameter.kind, (name, arg)
      if (name, arg) in STRIDES_REQUIRED:  # required in the signature, so type checkers say so
        assert ours[arg].default is inspect.Parameter.empty, (name, arg)
      else:
        assert ours[arg].default == parameter.default, (name, arg)


def _mirror(name, x):
  """The mirror's result for each row of TWINS, on ``x`` (float64)."""
  if name == "avg_pool":
    return reference.avg_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)), ceil_mode=True,
                              count_include_pad=False)
  if name == "max_pool":
    return reference.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)), ceil_mode=True)
  if name == "min_pool":
    return reference.min_pool(x, (2, 2), (2, 2), "VALID", dilation=(2, 2))
  if name == "lp_pool":
    return reference.lp_pool(x, 2, (3, 3), (2, 2), ceil_mode=True)
  if name == "adaptive_avg_pool":
    return reference.adaptive_avg_pool(x, (3, None))
  if name == "adaptive_max_pool":
    return reference.adaptive_max_pool(x, (4, 4))
  if name == "global_avg_pool":
    return reference.global_avg_pool(x)[:, None, None, :]
  if name == "blur_pool":
    return reference.blur_pool(x, (3, 3), (2, 2), "replicate")
  if name == "median_pool":
    return reference.median_pool(x, (3, 3), (2, 2), "SAME")[0]
  return reference.global_max_pool(x)


@functools.cache
def _twins_and_modules():
  """Each row of TWINS: the twin's and the module's results on X2, all from one jitted
  program (eager, each op compiles alone; a program per row: 10 programs, 1.0 s of compile
  CPU, compile census)."""
  calls = [(getattr(F, name), module(*args, **kwargs), args, kwargs)
           for name, module, args, kwargs in TWINS]
  return jax.device_get(jax.jit(lambda x: [(twin(x, *args, **kwargs), pool(x))
                                           for twin, pool, args, kwargs in calls])(X2))


@pytest.mark.parametrize("i", range(len(TWINS)), ids=[t[0] for t in TWINS])
def test_functional_twin_and_module_match_the_mirror(i):
  name = TWINS[i][0]
  want = _mirror(name, X2.astype(np.float64))
  want = tuple(want) if isinstance(want, tuple) else want
  for got in _twins_and_modules()[i]:
    got = tuple(got) if isinstance(got, (tuple, list)) else got
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6), got, want)


def test_a_module_and_its_twin_are_one_implementation():
  # The one identity check: the module stores its arguments and runs the function's code,
  # so even the float32 rounding of an average with PyTorch's border divisors is the same.
  got = F.avg_pool(X2 / 7, 3, 2, 1, ceil_mode=True, count_include_pad=False)
  np.testing.assert_array_equal(AvgPool(3, 2, 1, ceil_mode=True, count_include_pad=False)(X2 / 7),
                                got)


def test_functional_twins_jit_vmap_and_differentiate():
  x = jnp.asarray(X2)

  def loss(v):
    return jnp.sum(F.max_pool(v, 3, 2, 1) * 2.0) + jnp.sum(F.avg_pool(v, 2, 1))

  grad = jax.jit(jax.grad(loss))(x)
  values, _ = reference.max_pool(X2, (3, 3), (2, 2), ((1, 1), (1, 1)))
  want = reference.max_pool_grad(X2, np.full(values.shape, 2.0), (3, 3), (2, 2),
                                 ((1, 1), (1, 1)))
  want = want + _avg_grad_2x2_stride1(X2.shape)
  np.testing.assert_allclose(grad, want, rtol=1e-6)
  # Unbatched (H, W, C) each under vmap, against the batched call: one program for both
  # (called eagerly, each compiled the kernel and its layout steps apart: 4 programs).
  per_example, batched = jax.jit(lambda v: (jax.vmap(lambda u: F.max_pool(u, 3, 2, 1))(v),
                                            F.max_pool(v, 3, 2, 1)))(x)
  np.testing.assert_array_equal(per_example, batched)
  np.testing.assert_array_equal(batched, values)  # the mirror's, above


def _avg_grad_2x2_stride1(shape):
  """d/dx of sum(avg_pool(x, 2, 1)): each cell gets 1/4 per window that holds it."""
  _, h, w, _ = shape
  rows = np.minimum(np.minimum(np.arange(h) + 1, h - np.arange(h)), 2)  # windows per row
  cols = np.minimum(np.minimum(np.arange(w) + 1, w - np.arange(w)), 2)
  return np.broadcast_to((np.outer(rows, cols) / 4.0)[None, :, :, None], shape)


def test_functional_errors_name_the_function():
  with pytest.raises(ValueError, match=r"^max_pool: `inputs` must be channels-last"):
    F.max_pool(X1[0, :, 0], 2, 2)
  with pytest.raises(TypeError, match=r"`return_indices` must be a bool; got 1\."):
    F.max_pool(X2, 2, 2, return_indices=1)
  with pytest.raises(ValueError, match=r"^global_avg_pool: `inputs` needs non-empty"):
    F.global_avg_pool(np.zeros((1, 0, 2, 1), np.float32))


def test_a_functional_twin_inside_an_nnx_module():
  class Stem(nnx.Module):
    def __init__(self, rngs):
      self.conv = nnx.Conv(3, 4, (3, 3), rngs=rngs)

    def __call__(self, x):
      return F.max_pool(nnx.relu(self.conv(x)), 3, 2, 1)

  stem = build(Stem)  # the initialiser is not the point: NumPy values, no compile
  # The stem and its convolution alone, in one program.
  y, conv = nnx.jit(lambda m, v: (m(v), m.conv(v)))(stem, X2)
  want, _ = reference.max_pool(np.maximum(np.asarray(conv), 0), (3, 3), (2, 2),
                               ((1, 1), (1, 1)))
  np.testing.assert_array_equal(y, want)


# ----------------------------------------------------------------------------
# output_shape.
# ----------------------------------------------------------------------------


def _torch_size(length, k, s, p, d=1, ceil_mode=False):
  """PyTorch's pooling_output_shape (aten/src/ATen/native/Pool.h)."""
  out = (length + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
  if ceil_mode and (out - 1) * s >= length + p:
    out -= 1
  return out


@pytest.mark.parametrize("length, k, s, p, d, ceil_mode", [
    (112, 3, 2, 1, 1, False), (7, 2, 2, 0, 1, True), (10, 3, 3, 1, 2, True), (5, 3, 2, 1, 1, True),
    (9, 4, 1, 2, 1, False),
])
def test_output_shape_is_pytorchs_formula(length, k, s, p, d, ceil_mode):
  want = _torch_size(length, k, s, p, d, ceil_mode)
  got = output_shape((4, length, length + 1, 3), k, s, p, dilation=d, ceil_mode=ceil_mode)
  want_shape = (4, want, _torch_size(length + 1, k, s, p, d, ceil_mode), 3)
  assert got == want_shape
  # Traced (jax.eval_shape): the shape the pooling gives, nothing compiled.
  pooled = jax.eval_shape(MaxPool(k, s, p, dilation=d, ceil_mode=ceil_mode),
                          jax.ShapeDtypeStruct((4, length, length + 1, 3), jnp.float32))
  assert pooled.shape == want_shape


def test_output_shape_same_unbatched_and_errors():
  assert output_shape((5, 7, 2), (3, 2), 2, "SAME") == (3, 4, 2)  # ceil(L / s)
  assert output_shape((9, 3), 2, num_spatial_dims=1) == (4, 3)
  with pytest.raises(ValueError, match=r"Output size is too small: spatial dim 0 of length 2"):
    output_shape((1, 2, 2, 1), 3)
  with pytest.raises(ValueError, match=r"^output_shape: `input_shape` must be channels-last"):
    output_shape((9,), 2)
  with pytest.raises(TypeError, match=r"`input_shape` must be a tuple of non-negative ints"):
    output_shape((2, 4.0, 4, 1), 2)


# ----------------------------------------------------------------------------
# Profiles name the kernels.
# ----------------------------------------------------------------------------


def test_each_kernel_runs_under_a_named_scope():
  # jax.named_scope puts "nnx_pool.<kernel>" into the op metadata that profilers show: the
  # kernel each call runs (its one jit), and within it the window sum or select.
  x = jax.ShapeDtypeStruct((1, 8, 8, 2), jnp.float32)  # lowered from shapes: no input built

  def loss(v):
    pooled = F.max_pool(v, 3, 2, 1, return_indices=True)[0]
    return (jnp.sum(pooled) + jnp.sum(F.avg_pool(v, 2, 2)) + jnp.sum(F.adaptive_avg_pool(v, 3))
            + jnp.sum(F.adaptive_max_pool(v, 3)) + jnp.sum(F.global_avg_pool(v))
            + jnp.sum(F.lp_pool(v, 2, 2)))

  hlo = jax.jit(jax.grad(loss)).lower(x).compile().as_text()
  for path in ("nnx_pool.window_extremum/nnx_pool.select/",
               "nnx_pool.window_average/nnx_pool.window_sum/",
               "nnx_pool.window_lp_norm/nnx_pool.window_sum/", "nnx_pool.adaptive_avg/",
               "nnx_pool.adaptive_max/", "nnx_pool.spatial_mean/"):
    assert path in hlo, path
  values, indices = jax.eval_shape(lambda v: F.max_pool(v, 2, 2, return_indices=True), x)
  unpooled = jax.jit(lambda v, i: F.max_unpool(v, i, 2)).lower(values, indices)
  assert "nnx_pool._unpool" in unpooled.as_text(debug_info=True)
  returned = jax.jit(lambda v: F.max_pool(v, 2, 2, return_indices=True)).lower(x)
  assert "nnx_pool.window_extremum/nnx_pool.flat_indices/" in returned.as_text(debug_info=True)


def test_only_a_split_spatial_dim_runs_a_kernel_on_auto_axes():
  # _jit's sharding rule reads the axis names of an Explicit sharding's spec (one device is
  # enough): a split batch or channel axis runs the kernel as it is (no pad or strided
  # slice crosses a shard); a split spatial axis runs it under auto_axes, its spec padded
  # to the rank. (tests/test_sharding.py runs the split maps on 8 devices.)
  from jax.sharding import NamedSharding, PartitionSpec

  from nnx_pool._jit import _explicit_spatial_spec

  axis_type = getattr(jax.sharding, "AxisType", None)
  if axis_type is None or not hasattr(jax.sharding, "auto_axes"):
    pytest.skip(f"jax {jax.__version__} has no Explicit mesh axes")
  mesh = jax.make_mesh((1, 1), ("a", "b"), axis_types=(axis_type.Explicit,) * 2)

  def spec_of(*spec):
    sharding = NamedSharding(mesh, PartitionSpec(*spec))
    return _explicit_spatial_spec(jax.device_put(np.zeros((2, 4, 4, 3), np.float32), sharding))

  assert spec_of("a", None, None, "b") is None  # batch and channels split
  assert spec_of(None, None, None, ("a", "b")) is None
  assert spec_of(None, "a", None, None) == PartitionSpec(None, "a", None, None)
  assert spec_of("a", None, "b") == PartitionSpec("a", None, "b", None)
  # not sharded (zeros from NumPy: jnp.zeros would compile a program for the shape)
  assert _explicit_spatial_spec(jax.device_put(np.zeros((2, 4, 4, 3), np.float32))) is None


# ----------------------------------------------------------------------------
# strides: no default in the functions.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["avg_pool", "max_pool", "min_pool"])
def test_an_omitted_stride_is_refused_naming_both_conventions(name):
  # Swapping nnx.avg_pool(x, (2, 2)) (stride 1: (1, 3, 3, 1)) for F.avg_pool(x, (2, 2)) would
  # silently give (1, 2, 2, 1) if strides defaulted to the window.
  x = jax.device_put(np.ones((1, 4, 4, 1), np.float32))  # refused: only its shape matters
  module = {"avg_pool": "AvgPool", "max_pool": "MaxPool", "min_pool": "MinPool"}[name]
  for call, got in ((lambda: getattr(F, name)(x, (2, 2)), "was omitted"),
                    (lambda: getattr(F, name)(x, window_shape=(2, 2)), "was omitted"),
                    (lambda: getattr(F, name)(x, (2, 2), None), "got None")):
    with pytest.raises(TypeError) as info:
      call()
    assert str(info.value) == (
        f"{name}: `strides` has no default in nnx_pool.functional, and {got}. "
        f"flax.nnx.{name} defaults it to 1 (and reads None as 1); PyTorch's pools and "
        f"nnx_pool.{module} to the window. Pass it: strides=(2, 2) for PyTorch's convention, "
        "strides=1 for Flax's.")


def test_an_explicit_stride_gives_flaxs_and_pytorchs_results():
  x = np.arange(16.0, dtype=np.float32).reshape(1, 4, 4, 1)  # NumPy: jnp.arange compiles
  # One compiled program for the three (eagerly, each compiled its kernel and steps apart).
  ours_1, flax_1, ours_2 = jax.device_get(jax.jit(lambda x: (
      F.avg_pool(x, (2, 2), 1), nnx.avg_pool(x, (2, 2)), F.avg_pool(x, (2, 2), 2)))(x))
  # Flax's default stride 1: nnx.avg_pool(x, (2, 2)) is (1, 3, 3, 1).
  assert ours_1.shape == (1, 3, 3, 1)
  np.testing.assert_array_equal(ours_1, flax_1)
  # PyTorch's: seed 004's arange(16) average pool.
  assert ours_2[0, ..., 0].tolist() == [[2.5, 4.5], [10.5, 12.5]]


# ----------------------------------------------------------------------------
# The public names: one list, nnx_pool._WHERE, and the type stub generated from it.
# ----------------------------------------------------------------------------


def _stub_text() -> str:
  """``nnx_pool/__init__.pyi`` as generated from ``_WHERE`` and ``_SUBMODULES``.

  One ``from ... import X as X`` line per public name (an explicit re-export for type
  checkers), in the order ruff's isort keeps: by module, then constants, classes and
  functions, each by name.
  """
  def order(item):
    module, name = item
    kind = 0 if name.isupper() else 1 if name[0].isupper() else 2
    return module, kind, name.lower()

  names = [("nnx_pool", sub) for sub in nnx_pool._SUBMODULES]
  names += [(f"nnx_pool.{module}", name) for name, module in nnx_pool._WHERE.items()]
  lines = ['"""The public names for type checkers, generated from ``_WHERE`` in __init__.py.',
           "", "tests/test_functional.py checks that it is up to date.", '"""', ""]
  lines += [f"from {module} import {name} as {name}" for module, name in sorted(names, key=order)]
  return "\n".join([*lines, "", "__version__: str", "__all__: list[str]", ""])


def test_the_type_stub_is_generated_from_the_one_list_of_public_names():
  stub = Path(nnx_pool.__file__).with_name("__init__.pyi")
  want = _stub_text()
  assert stub.read_text() == want, (
      f"{stub.name} is out of date with nnx_pool._WHERE; replace its text with:\n{want}")


def test_every_public_name_loads_and_is_listed():
  # Each name of __all__ loads from the module _WHERE names (a wrong entry raises here),
  # and dir() lists it; the modules' own __all__-free namespaces are not consulted.
  assert sorted(nnx_pool.__all__) == nnx_pool.__all__
  for name in nnx_pool.__all__:
    assert getattr(nnx_pool, name) is not None, name
    assert name in dir(nnx_pool), name
  assert nnx_pool.MaxPool.__module__ == "nnx_pool._pool"
  assert nnx_pool.functional.__name__ == "nnx_pool.functional"
  with pytest.raises(AttributeError, match="module 'nnx_pool' has no attribute 'MaxPool2d'"):
    nnx_pool.MaxPool2d  # noqa: B018
