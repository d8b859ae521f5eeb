"""Robustness: the argument space of every module, size limits, and the dtype matrix.

* Property tests (hypothesis, derandomized) for the modules that
  tests/test_pool_properties.py does not cover: global, adaptive and selectable
  pooling and max-unpooling against the NumPy mirror ``nnx_pool.reference``, and
  the gates against NumPy transcriptions of their papers' formulas.
* The argument-type space of every module: floats, None, strings, bools, NumPy
  scalars, lists, nested tuples, arrays, for every argument. A configuration is
  either accepted (and gives a non-empty result for a non-empty input) or
  refused by a ``raise ValueError``/``raise TypeError`` statement of nnx_pool,
  never by an internal JAX, NumPy or Python error.
* Size limits (docs/limits.md): windows larger than the input, empty dims, whole
  maps of 1024 x 1024, and flat indices past int32 (checked with
  ``jax.eval_shape``, so no large array is allocated).
* Dtypes: bfloat16, float16, int8 and int32, bool refused everywhere, float32
  accumulation of low-precision averages, and float64 under ``jax_enable_x64``
  (in ``jax.enable_x64(True)``, the context manager, within this process).

A gap found here is kept as an ``xfail(strict=True)`` test whose reason names
the library change it needs, until that change lands.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import linecache
import math
import runpy
import signal
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import nnx_pool
from nnx_pool import (
    CBAM,
    AdaptiveAvgPool,
    AdaptiveMaxPool,
    AttentionPool,
    AttentionPoolLatent,
    AvgPool,
    BlurPool,
    EffectiveSqueezeExcitation,
    EfficientChannelAttention,
    FractionalMaxPool,
    GeMPool,
    GlobalAvgPool,
    GlobalContext,
    GlobalMaxPool,
    LightCBAM,
    LPPool,
    LsePlusPool,
    MaxPool,
    MaxUnpool,
    MedianPool,
    MinPool,
    SelectAdaptivePool,
    SqueezeExcitation,
    reference,
)

_SETTINGS = dict(
    deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
_PACKAGE = Path(nnx_pool.__file__).resolve().parent
_AVG_TOL = dict(rtol=1e-5, atol=1e-6)  # float32 sums against the mirror's float64
_GATE_TOL = dict(rtol=1e-5, atol=1e-5)  # the regression kit's float32 gate tolerance
_HANG_S = 60  # a single example running longer than this is a hang
# Gates with seeded uniform parameters, built from shapes: no initialiser compiles.
build = runpy.run_path(str(Path(__file__).parent / "_cheap.py"))["build"]


def raised_by_nnx_pool(e: BaseException) -> bool:
  """Whether ``e`` came out of a ``raise`` statement in nnx_pool's own source."""
  tb = e.__traceback__
  if tb is None:
    return False
  while tb.tb_next is not None:
    tb = tb.tb_next
  path = Path(tb.tb_frame.f_code.co_filename).resolve()
  line = linecache.getline(str(path), tb.tb_lineno).strip()
  return _PACKAGE in path.parents and line.startswith("raise ")


class _Hang(Exception):
  pass


def _alarm(signum, frame):
  raise _Hang(f"an example ran for more than {_HANG_S} s")


@contextlib.contextmanager
def _deadline():
  """Fails an example that runs longer than _HANG_S seconds (SIGALRM, main thread)."""
  previous = signal.signal(signal.SIGALRM, _alarm)
  signal.setitimer(signal.ITIMER_REAL, _HANG_S)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def _values(shape, seed, *, dtype="float32", specials=True) -> np.ndarray:
  """Small integers (ties) or distinct values; floats are quarters, with NaN and infinities."""
  rng = np.random.default_rng(seed)
  size = math.prod(shape)
  if rng.random() < 0.4 and size < 200:  # distinct, and within int8
    plain = rng.permutation(size).reshape(shape) - size // 2
  else:
    plain = rng.integers(-3, 4, shape)
  if np.issubdtype(np.dtype(dtype), np.integer):
    return plain.astype(dtype)
  plain = plain / 4.0
  if specials and rng.random() < 0.3:
    kinds = rng.choice(4, shape, p=[0.85, 0.05, 0.05, 0.05])
    plain = np.choose(kinds, [plain, np.nan, np.inf, -np.inf])
  return plain.astype(dtype)


def _rebatch(out, batched):
  """A module's output with the batch axis back (an unbatched call drops it), in NumPy (a[None]
  on a jax.Array compiles a program for each shape)."""
  return jax.tree.map(lambda a: np.asarray(a) if batched else np.asarray(a)[None], out)


def _jitted(module, x):
  """``module(x)`` under one ``nnx.jit``: one compiled program per drawn example.

  Each example has its own shapes, so each compiles anew; called eagerly, a module
  also compiles every small step (layout, bins, a gate's layers) on its own, which
  costs more than the pooling. Eager calls equal jitted ones (test_pool.py, test_gates.py
  and test_adaptive.py check that); the fuzz tests below trace under nnx.eval_shape.
  """
  return _call(module, x)


@nnx.jit
def _call(module, x):
  """One jitted function for all of _jitted's calls: an example that repeats an earlier
  one's module configuration and input shape reuses its program."""
  return module(x)


@nnx.jit
def _apply_each(modules, x):
  """Each module on ``x``, all in one compiled program (one compile for the lot, where a
  jit of each compiles once a module, and an eager call once an operation)."""
  return [m(x) for m in modules]


@jax.jit
def _unpool_2x2(values, indices):
  return MaxUnpool((2, 2))(values, indices)


# ============================================================================
# Global, adaptive and selectable pooling against the mirror.
# ============================================================================


@st.composite
def adaptive_configs(draw):
  nd = draw(st.integers(1, 3))
  max_len = {1: 9, 2: 6, 3: 4}[nd]
  spatial = tuple(draw(st.integers(1, max_len)) for _ in range(nd))
  out = tuple(draw(st.one_of(st.none(), st.integers(1, max_len + 2))) for _ in range(nd))
  # Spell the output size as our modules accept it: a tuple, or one int for every dim.
  if all(o == out[0] for o in out) and out[0] is not None and draw(st.booleans()):
    spelled = dict(output_size=out[0], num_spatial_dims=nd)
  else:
    spelled = dict(output_size=out)
  return dict(
      spatial=spatial, out=out, spelled=spelled, batch=draw(st.sampled_from([None, 1, 2])),
      channels=draw(st.integers(1, 3)), seed=draw(st.integers(0, 2**32 - 1)),
  )


def _adaptive_input(cfg, dtype="float32", specials=True):
  shape = (cfg["batch"] or 1, *cfg["spatial"], cfg["channels"])
  return _values(shape, cfg["seed"], dtype=dtype, specials=specials)


# 10 examples (15 before): they draw every value that the 15 drew of rank, output_size spelt
# as one int or a tuple, None entries, bins wider and narrower than a cell, overlapping and
# tiling bins, batch None, 1 or 2, channels, dtype, NaN and infinities, and every pairing of
# rank, spelling, None, upsampling, overlap, batch, dtype and NaN that the 15 drew; 8 missed
# tiling bins (listed with a plugin that records each example's _adaptive_input). (The avg
# test's 10 and 12 examples missed NaN inputs: it keeps 15.) 15 took 0.73 s of compile CPU,
# 13 programs (per-test census, pytest tests/test_robustness.py, 2 cores).
@settings(max_examples=10, **_SETTINGS)
@given(cfg=adaptive_configs(), dtype=st.sampled_from(["float32", "int32"]))
def test_adaptive_max_pool_matches_mirror(cfg, dtype):
  x = _adaptive_input(cfg, dtype)
  # NumPy mirror: PyTorch's bins; first maximum wins ties, the last NaN wins.
  want_values, want_indices = reference.adaptive_max_pool(x, cfg["out"])
  module = AdaptiveMaxPool(**cfg["spelled"], return_indices=True)
  values, indices = _rebatch(_jitted(module, x if cfg["batch"] else x[0]), cfg["batch"])
  assert values.dtype == x.dtype and indices.dtype == jnp.int32
  np.testing.assert_array_equal(values, want_values)
  np.testing.assert_array_equal(indices, want_indices)


@settings(max_examples=15, **_SETTINGS)
@given(cfg=adaptive_configs())
def test_adaptive_avg_pool_matches_mirror(cfg):
  x = _adaptive_input(cfg)
  want = reference.adaptive_avg_pool(x.astype(np.float64), cfg["out"])  # float64 bin means
  module = AdaptiveAvgPool(**cfg["spelled"])
  got = _rebatch(_jitted(module, x if cfg["batch"] else x[0]), cfg["batch"])
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, **_AVG_TOL)


# 12 examples (15 before): they draw every value that the 15 drew of rank, batch, channels,
# dtype, keepdims, NaN, infinities and one-cell maps, and every pairing of rank, batch, dtype,
# keepdims and NaN that the 15 drew; 8 and 10 missed NaN inputs (listed with a plugin that
# records each example's _adaptive_input and GlobalMaxPool arguments).
@settings(max_examples=12, **_SETTINGS)
@given(cfg=adaptive_configs(), keepdims=st.booleans(), dtype=st.sampled_from(["float32", "int8"]))
def test_global_pools_match_mirror(cfg, keepdims, dtype):
  nd = len(cfg["spatial"])
  x = _adaptive_input(cfg, dtype)
  arg = x if cfg["batch"] else x[0]
  shape = (x.shape[0], *([1] * nd if keepdims else []), x.shape[-1])
  pools = [GlobalMaxPool(num_spatial_dims=nd, keepdims=keepdims)]
  if dtype == "float32":
    pools.append(GlobalAvgPool(num_spatial_dims=nd, keepdims=keepdims))
  got_max, *got_avg = _apply_each(pools, arg)  # one program for both pools
  np.testing.assert_array_equal(  # mirror: the max rule of max_pool over the whole plane
      _rebatch(got_max, cfg["batch"]), reference.global_max_pool(x).reshape(shape))
  if dtype == "float32":
    (got_avg,) = got_avg
    np.testing.assert_allclose(
        _rebatch(got_avg, cfg["batch"]),
        reference.global_avg_pool(x.astype(np.float64)).reshape(shape), **_AVG_TOL)
  else:
    with pytest.raises(TypeError, match="needs a floating dtype"):
      GlobalAvgPool(num_spatial_dims=nd)(arg)


@settings(max_examples=12, **_SETTINGS)
@given(cfg=adaptive_configs(), pool_type=st.sampled_from(["avg", "max", "avgmax", "catavgmax"]),
       flatten=st.booleans())
def test_select_adaptive_pool_matches_mirror(cfg, pool_type, flatten):
  x = _adaptive_input(cfg, specials=False)
  avg = reference.adaptive_avg_pool(x.astype(np.float64), cfg["out"])
  mx, _ = reference.adaptive_max_pool(x, cfg["out"])
  # timm's SelectAdaptivePool2d: avg, max, 0.5 * (avg + max), or both concatenated on C.
  want = {"avg": avg, "max": mx, "avgmax": 0.5 * (avg + mx),
          "catavgmax": np.concatenate([avg, mx], axis=-1)}[pool_type]
  if flatten:
    want = want.reshape(want.shape[0], -1)
  module = SelectAdaptivePool(**cfg["spelled"], pool_type=pool_type, flatten=flatten)
  got = _rebatch(_jitted(module, x if cfg["batch"] else x[0]), cfg["batch"])
  assert module.feat_mult() == (2 if pool_type == "catavgmax" else 1)
  np.testing.assert_allclose(got, want, **_AVG_TOL)


# ============================================================================
# Max unpooling against the mirror.
# ============================================================================


@st.composite
def unpool_configs(draw):
  nd = draw(st.integers(1, 3))
  window = tuple(draw(st.integers(1, {1: 4, 2: 3, 3: 2}[nd])) for _ in range(nd))
  strides = tuple(draw(st.integers(1, 3)) for _ in range(nd))
  padding = tuple(draw(st.integers(0, k // 2)) for k in window)
  spatial = tuple(draw(st.integers(max(1, k - 2 * p), k - 2 * p + 4))
                  for k, p in zip(window, padding, strict=True))
  shift = tuple(draw(st.integers(-(s - 1), s - 1)) for s in strides)
  return dict(window=window, strides=strides, padding=padding, spatial=spatial,
              shift=shift if draw(st.booleans()) else None,
              batch=draw(st.sampled_from([None, 2])), channels=draw(st.integers(1, 2)),
              seed=draw(st.integers(0, 2**32 - 1)))


# 9 examples (12 before): they draw every value that the 12 drew of rank, dtype, batched or
# not, padding, overlapping windows, strides past the window, one-tap windows, channels, an
# output_size or the default, and the mirror's refusal (the eager ValueError), and every
# pairing of rank, dtype, batched, padding, overlap, output_size and refusal that the 12 drew;
# 6 to 8 examples missed some (listed with a plugin that records each example's MaxUnpool
# call, hypothesis derandomized). 12 examples took 1.63 s of compile CPU (pytest
# tests/test_robustness.py with a per-test census, 2 cores).
@settings(max_examples=9, **_SETTINGS)
@given(cfg=unpool_configs(), dtype=st.sampled_from(["float32", "int32", "bfloat16"]))
def test_max_unpool_matches_mirror(cfg, dtype):
  shape = (cfg["batch"] or 1, *cfg["spatial"], cfg["channels"])
  x = _values(shape, cfg["seed"], dtype="int32" if dtype == "int32" else "float32",
              specials=False)
  x = x.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else x
  pool = MaxPool(cfg["window"], cfg["strides"], cfg["padding"], return_indices=True)
  try:  # traced only: the pooled shape, or the refusal, without a compile
    pooled = jax.eval_shape(pool, x)[0].shape
  except ValueError:
    assume(False)  # an invalid pooling: tests/test_pool_properties.py covers it
  output_size = None
  if cfg["shift"] is not None:
    default = MaxUnpool(cfg["window"], cfg["strides"], cfg["padding"]).default_output_size(
        pooled[1:-1])
    output_size = tuple(d + s for d, s in zip(default, cfg["shift"], strict=True))
    assume(min(output_size) >= 1)
  unpool = MaxUnpool(cfg["window"], cfg["strides"], cfg["padding"])

  @jax.jit
  def pool_and_unpool(v):  # one compile an example (a jit each and the eager slices: three)
    values, indices = pool(v)
    if not cfg["batch"]:  # the unbatched call
      return values, indices, unpool(values[0], indices[0], output_size)[None]
    return values, indices, unpool(values, indices, output_size)

  values, indices, got = jax.device_get(pool_and_unpool(x))
  plain = values.astype(np.float32) if dtype == "bfloat16" else values  # the mirror's dtypes
  try:  # NumPy mirror: PyTorch's MaxUnpool, the later of two equal indices wins
    want = reference.max_unpool(plain, indices, cfg["window"], cfg["strides"], cfg["padding"],
                                output_size)
  except ValueError:  # e.g. an index outside the plane (padding shrank the default size)
    # Eager, so the indices are concrete and checked (traced, out-of-range ones are dropped).
    with pytest.raises(ValueError) as info:
      unpool(values if cfg["batch"] else values[0], indices if cfg["batch"] else indices[0],
             output_size)
    assert raised_by_nnx_pool(info.value)
    return
  assert got.dtype == values.dtype
  np.testing.assert_array_equal(got.astype(want.dtype), want)


# ============================================================================
# Gates against NumPy transcriptions of their papers.
# ============================================================================


def _np_params(module) -> dict:
  """The module's parameters as float64 NumPy arrays, keyed like ``fc1/kernel``."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(nnx.state(module, nnx.Param))
  return {
      jax.tree_util.keystr(path, simple=True, separator="/").removesuffix("/value"):
          np.asarray(leaf, np.float64)
      for path, leaf in leaves
  }


def _sigmoid(v):
  return 1.0 / (1.0 + np.exp(-v))


def _conv_same(maps: np.ndarray, kernel: np.ndarray) -> np.ndarray:
  """Cross-correlation (as nnx.Conv) with zero 'same' padding: (N, *S, I) x (*K, I, O)."""
  nd = kernel.ndim - 2
  pads = [(0, 0)] + [((k - 1) // 2, (k - 1) // 2) for k in kernel.shape[:nd]] + [(0, 0)]
  padded = np.pad(maps, pads)
  out = np.zeros((*maps.shape[:-1], kernel.shape[-1]))
  spatial = maps.shape[1:-1]
  for offset in itertools.product(*(range(k) for k in kernel.shape[:nd])):
    window = padded[(slice(None), *(slice(o, o + n) for o, n in zip(offset, spatial, strict=True)))]
    out += window @ kernel[offset]
  return out


@st.composite
def gate_configs(draw):
  nd = draw(st.integers(1, 3))
  max_len = {1: 7, 2: 5, 3: 3}[nd]
  return dict(
      nd=nd, spatial=tuple(draw(st.integers(1, max_len)) for _ in range(nd)),
      channels=draw(st.integers(1, 12)), batch=draw(st.sampled_from([None, 1, 3])),
      seed=draw(st.integers(0, 2**32 - 1)),
  )


def _gate_input(cfg):
  shape = (cfg["batch"] or 1, *cfg["spatial"], cfg["channels"])
  return np.random.default_rng(cfg["seed"]).standard_normal(shape).astype(np.float32)


@settings(max_examples=4, **_SETTINGS)
@given(cfg=gate_configs(), squeeze=st.one_of(st.none(), st.integers(1, 6)),
       rd_ratio=st.sampled_from([1 / 16, 0.25, 0.5, 1.0]), rd_divisor=st.sampled_from([1, 2, 8]),
       use_bias=st.booleans())
def test_squeeze_excitation_matches_the_paper(cfg, squeeze, rd_ratio, rd_divisor, use_bias):
  c = cfg["channels"]
  se = build(SqueezeExcitation, c, squeeze, rd_ratio=rd_ratio, rd_divisor=rd_divisor,
             use_bias=use_bias, num_spatial_dims=cfg["nd"], seed=0)
  if squeeze is None:  # timm's make_divisible(c * rd_ratio, rd_divisor, round_limit=0)
    squeeze = max(rd_divisor, int(c * rd_ratio + rd_divisor / 2) // rd_divisor * rd_divisor)
  assert se.fc1.kernel.shape == (c, squeeze)
  x = _gate_input(cfg)
  p = _np_params(se)
  # Hu et al. 2018: s = sigmoid(W2 relu(W1 mean(x) + b1) + b2); y = x * s.
  mean = x.astype(np.float64).mean(axis=tuple(range(1, x.ndim - 1)), keepdims=True)
  h = np.maximum(mean @ p["fc1/kernel"] + p.get("fc1/bias", 0.0), 0.0)
  want = x * _sigmoid(h @ p["fc2/kernel"] + p.get("fc2/bias", 0.0))
  got = _rebatch(_jitted(se, x if cfg["batch"] else x[0]), cfg["batch"])
  np.testing.assert_allclose(got, want, **_GATE_TOL)


@settings(max_examples=4, **_SETTINGS)
@given(cfg=gate_configs())
def test_effective_squeeze_excitation_matches_the_paper(cfg):
  ese = build(EffectiveSqueezeExcitation, cfg["channels"], num_spatial_dims=cfg["nd"], seed=1)
  x = _gate_input(cfg)
  p = _np_params(ese)
  # CenterMask (Lee & Park 2020): y = x * hard_sigmoid(W mean(x) + b), relu6(v + 3) / 6.
  mean = x.astype(np.float64).mean(axis=tuple(range(1, x.ndim - 1)), keepdims=True)
  want = x * np.clip(mean @ p["fc/kernel"] + p["fc/bias"] + 3.0, 0.0, 6.0) / 6.0
  got = _rebatch(_jitted(ese, x if cfg["batch"] else x[0]), cfg["batch"])
  np.testing.assert_allclose(got, want, **_GATE_TOL)


@settings(max_examples=6, **_SETTINGS)
@given(cfg=gate_configs(), kernel_size=st.one_of(st.none(), st.sampled_from([1, 3, 5])))
def test_efficient_channel_attention_matches_the_paper(cfg, kernel_size):
  c = cfg["channels"]
  eca = build(EfficientChannelAttention, c, kernel_size, num_spatial_dims=cfg["nd"], seed=2)
  if kernel_size is None:  # ECA-Net: k = |log2(C) / gamma + b / gamma|, odd, at least 3
    t = int(abs(math.log2(c) + 1) / 2)
    kernel_size = max(t if t % 2 else t + 1, 3)
  assert eca.kernel_size == kernel_size
  x = _gate_input(cfg)
  w = _np_params(eca)["conv/kernel"].reshape(-1)
  mean = x.astype(np.float64).mean(axis=tuple(range(1, x.ndim - 1)))  # (N, C)
  pad = (kernel_size - 1) // 2
  # ECA-Net (Wang et al. 2020): a 1-D convolution across channels, zero padded, no bias.
  conv = np.stack([np.correlate(np.pad(row, pad), w, mode="valid") for row in mean])
  want = x * _sigmoid(conv).reshape(x.shape[0], *([1] * cfg["nd"]), c)
  got = _rebatch(_jitted(eca, x if cfg["batch"] else x[0]), cfg["batch"])
  np.testing.assert_allclose(got, want, **_GATE_TOL)


@settings(max_examples=2, **_SETTINGS)
@given(cfg=gate_configs(), kernel=st.sampled_from([1, 3]), squeeze=st.integers(1, 4))
def test_cbam_matches_the_paper(cfg, kernel, squeeze):
  assume(cfg["batch"] is not None)  # BatchNorm statistics need the batch axis to be explicit
  cbam = build(CBAM, cfg["channels"], squeeze, spatial_kernel_size=kernel,
               num_spatial_dims=cfg["nd"], seed=3)
  x = _gate_input(cfg).astype(np.float64)
  p = _np_params(cbam)
  space = tuple(range(1, x.ndim - 1))

  def mlp(v):
    return np.maximum(v @ p["fc1/kernel"], 0.0) @ p["fc2/kernel"]

  # Woo et al. 2018 (timm's CbamModule): channel gate from mean and max, then a
  # spatial gate from [mean, max] over channels, a convolution and BatchNorm
  # (training mode: batch statistics, biased variance, epsilon 1e-5).
  x1 = x * _sigmoid(mlp(x.mean(axis=space, keepdims=True)) + mlp(x.max(axis=space, keepdims=True)))
  maps = np.concatenate([x1.mean(axis=-1, keepdims=True), x1.max(axis=-1, keepdims=True)], -1)
  z = _conv_same(maps, p["spatial_conv/kernel"])
  mean, var = z.mean(axis=tuple(range(z.ndim - 1))), z.var(axis=tuple(range(z.ndim - 1)))
  z = (z - mean) / np.sqrt(var + 1e-5) * p["spatial_norm/scale"] + p["spatial_norm/bias"]
  want = x1 * _sigmoid(z)
  np.testing.assert_allclose(_jitted(cbam, x.astype(np.float32)), want, rtol=1e-4, atol=1e-4)


# ============================================================================
# The argument-type space of every module.
# ============================================================================

_JUNK = st.one_of(
    st.integers(-2, 7),
    st.sampled_from([np.int64(2), np.int8(3), np.uint8(1), np.int32(-1), np.bool_(True)]),
    st.sampled_from([0.0, 2.0, 1.5, -1.0, float("nan"), float("inf"), -float("inf")]),
    st.none(),
    st.booleans(),
    st.sampled_from(["", "same", "VALID", "2", "avg", "max", "catavgmax", "relu"]),
    st.lists(st.one_of(st.integers(-1, 4), st.none()), max_size=4).map(tuple),
    st.lists(st.integers(0, 3), max_size=4),
    st.tuples(st.tuples(st.integers(0, 2), st.integers(0, 2)),
              st.tuples(st.integers(0, 2), st.integers(0, 2))),
    st.tuples(st.tuples(st.integers(1, 3)), st.integers(1, 3)),
    st.sampled_from([np.array([2, 2]), np.array(2), 1 + 1j, {"k": 1}, b"2", nnx.relu, object()]),
)
# Not fuzzed: the gates' `rngs`, `dtype` and `param_dtype`, which go to flax.nnx
# unchanged (their errors are Flax's).
_RATIOS = st.sampled_from([1 / 16, 0.5, np.float32(0.25), np.float64(2.0), 10**400])


def _gate(cls, **extra):
  # Built from shapes (tests/_cheap.py): the arguments are checked as eagerly, and no
  # initialiser compiles for each shape the fuzzing draws.
  return lambda **kw: build(cls, **kw, **extra)


# name -> (factory, {argument: valid values, the default first}).
_WINDOW = [(2, 2), (3, 3), 2, (2, 1), [2, 3], (np.int64(2), 2)]
_STRIDES = [None, 1, (1, 2), 2, np.int32(1)]
_PADDING = ["VALID", "same", 1, (1, 0), ((0, 1), (1, 0))]
_IN_FEATURES = [None, 4, np.int64(4)]
_NSD = [2, 1, 3, np.int8(2)]
_OUTPUT = [(2, 2), 1, 3, (None, 2), (1, 3), [2, 2]]
_GATE_FN = [nnx.sigmoid, nnx.relu, jnp.tanh]
_MODULES = {
    "AvgPool": (AvgPool, dict(
        window_shape=_WINDOW, strides=_STRIDES, padding=_PADDING, ceil_mode=[False, True],
        count_include_pad=[True, False], divisor_override=[None, 3], in_features=_IN_FEATURES)),
    "MaxPool": (MaxPool, dict(
        window_shape=_WINDOW, strides=_STRIDES, padding=_PADDING, dilation=[1, 2, (1, 2)],
        ceil_mode=[False, True], return_indices=[False, True], in_features=_IN_FEATURES)),
    "MinPool": (MinPool, dict(
        window_shape=_WINDOW, strides=_STRIDES, padding=_PADDING, dilation=[1, 2, (2, 1)],
        ceil_mode=[False, True], return_indices=[True, False], in_features=_IN_FEATURES)),
    "LPPool": (LPPool, dict(
        norm_type=[2, 1, 3.0, 1.5, np.float32(2)], window_shape=_WINDOW, strides=_STRIDES,
        ceil_mode=[False, True], in_features=_IN_FEATURES)),
    "MaxUnpool": (MaxUnpool, dict(
        window_shape=_WINDOW, strides=_STRIDES, padding=[0, 1, (1, 0)],
        in_features=_IN_FEATURES)),
    "GlobalAvgPool": (GlobalAvgPool, dict(
        num_spatial_dims=_NSD, keepdims=[False, True], in_features=_IN_FEATURES)),
    "GlobalMaxPool": (GlobalMaxPool, dict(
        num_spatial_dims=_NSD, keepdims=[False, True], in_features=_IN_FEATURES)),
    "AdaptiveAvgPool": (AdaptiveAvgPool, dict(
        output_size=_OUTPUT, num_spatial_dims=[None, 2, 1], in_features=_IN_FEATURES)),
    "AdaptiveMaxPool": (AdaptiveMaxPool, dict(
        output_size=_OUTPUT, num_spatial_dims=[None, 2, 1], return_indices=[False, True],
        in_features=_IN_FEATURES)),
    "SelectAdaptivePool": (SelectAdaptivePool, dict(
        output_size=[1, (2, 2), 3], pool_type=["avg", "max", "avgmax", "catavgmax"],
        flatten=[False, True], num_spatial_dims=[None, 2], in_features=_IN_FEATURES)),
    "SqueezeExcitation": (_gate(SqueezeExcitation), dict(
        in_features=[4, np.int64(4)], squeeze_features=[None, 2], rd_ratio=[1 / 16, 0.5],
        rd_divisor=[8, 1], activation=[nnx.relu, nnx.silu], gate=_GATE_FN,
        use_bias=[True, False], num_spatial_dims=_NSD)),
    "EffectiveSqueezeExcitation": (_gate(EffectiveSqueezeExcitation), dict(
        in_features=[4], gate=_GATE_FN, num_spatial_dims=_NSD)),
    "EfficientChannelAttention": (_gate(EfficientChannelAttention), dict(
        in_features=[4, None], kernel_size=[None, 3, 1], gamma=[2, 1.5, np.float32(3)],
        beta=[1, -2.5, 0], gate=_GATE_FN, num_spatial_dims=_NSD)),
    "CBAM": (_gate(CBAM), dict(
        in_features=[4], squeeze_features=[None, 2], rd_ratio=[1 / 16, 0.5], rd_divisor=[1, 2],
        spatial_kernel_size=[3, 1], activation=[nnx.relu], gate=_GATE_FN, use_bias=[False, True],
        num_spatial_dims=_NSD)),
    "LightCBAM": (_gate(LightCBAM), dict(
        in_features=[4], squeeze_features=[None, 2], rd_ratio=[1 / 16, 0.5],
        spatial_kernel_size=[3, 1], use_bias=[False, True], num_spatial_dims=_NSD)),
    "GlobalContext": (_gate(GlobalContext), dict(
        in_features=[4], use_attn=[True, False], fuse_add=[False, True],
        fuse_scale=[True, False], squeeze_features=[None, 2], gate=_GATE_FN,
        num_spatial_dims=_NSD)),
    "AttentionPool": (_gate(AttentionPool), dict(
        in_features=[4], feat_size=[2, 3, (2, 3)], num_heads=[1, 2, None],
        out_features=[None, 2, 0], pool_type=["token", ""], class_token=[False, True])),
    "AttentionPoolLatent": (_gate(AttentionPoolLatent), dict(
        in_features=[4], num_heads=[2, 1, 8], latent_len=[1, 2],
        pool_type=["token", "avg", ""], qk_norm=[False, True])),
    "GeMPool": (GeMPool, dict(
        p=[3.0, 1.0, 2.5, np.float32(4)], eps=[1e-6, 1e-3], learnable=[True, False],
        flatten=[True, False], num_spatial_dims=_NSD, in_features=_IN_FEATURES)),
    "LsePlusPool": (LsePlusPool, dict(
        r=[10.0, 1.0, np.float32(2)], learnable=[True, False], flatten=[True, False],
        num_spatial_dims=_NSD, in_features=_IN_FEATURES)),
    "BlurPool": (BlurPool, dict(
        filter_size=[3, 2, 5, (3, 2), np.int64(4)], strides=[2, 1, (1, 2), np.int32(3)],
        pad_mode=["reflect", "constant", "replicate", "circular"], in_features=_IN_FEATURES,
        num_spatial_dims=[None, 2, 1])),
    "MedianPool": (MedianPool, dict(
        window_shape=[3, 2, (3, 1), [1, 2]], strides=[1, 2, (1, 2)],
        padding=[0, 1, (1, 0), ((0, 1), (1, 0))], same=[False, True], in_features=_IN_FEATURES,
        num_spatial_dims=[None, 2, 1])),
    # Called with samples of the input's (*batch, C, ndim) shape, rngs, or junk (_fractional).
    "FractionalMaxPool": (FractionalMaxPool, dict(
        window_shape=[2, (2, 1), 1, 3], output_size=[(2, 2), 2, (1, 3), None],
        output_ratio=[None, None, None, 0.5, (0.5, np.float32(0.75))], return_indices=[False, True],
        in_features=_IN_FEATURES, num_spatial_dims=[None, 2, 1])),
}
# Modules with parameters, whose in_features is their channel count (fewer examples each).
_GATES = ("SqueezeExcitation", "EffectiveSqueezeExcitation", "EfficientChannelAttention", "CBAM",
          "LightCBAM", "GlobalContext", "AttentionPool", "AttentionPoolLatent")
_POOLS = tuple(sorted(set(_MODULES) - set(_GATES)))


def test_fuzz_covers_every_public_module():
  public = {n for n in nnx_pool.__all__
            if isinstance(getattr(nnx_pool, n), type)
            and issubclass(getattr(nnx_pool, n), nnx.Module)}
  assert public == set(_MODULES)


@st.composite
def _input_arrays(draw):
  """Mostly a valid rank for 2 spatial dims (3 or 4), sometimes anything; rarely empty dims."""
  rank = draw(st.sampled_from([4, 4, 3, 1, 2, 5]))
  shape = tuple(draw(st.sampled_from([4, 5, 6, 3, 2, 1, 0])) for _ in range(rank))
  if rank >= 3 and draw(st.booleans()):
    shape = (*shape[:-1], 4)  # the gates' (and in_features') channel count
  dtype = draw(st.sampled_from(["float32", "float32", "bfloat16", "int32", "bool"]))
  values = (np.arange(math.prod(shape)).reshape(shape) % 7 - 3)
  # Cast by NumPy and placed as is: jnp.asarray(values, dtype) compiles a conversion a shape.
  return jax.device_put(values.astype(jnp.dtype(dtype)))


@pytest.mark.parametrize("name", _POOLS)
@settings(max_examples=20, **_SETTINGS)
@given(data=st.data())
def test_fuzz_pool_arguments_accepted_or_refused_by_our_own_errors(name, data):
  _fuzz(name, data)


@pytest.mark.parametrize("name", _GATES)
@settings(max_examples=8, **_SETTINGS)  # a gate compiles more per example
@given(data=st.data())
def test_fuzz_gate_arguments_accepted_or_refused_by_our_own_errors(name, data):
  _fuzz(name, data)


def _fuzz(name, data):
  """A configuration with some arguments junk: accepted, or refused by our own raise."""
  factory, space = _MODULES[name]
  kwargs = {}
  for arg, valid in space.items():
    junk = data.draw(
        st.sampled_from([False, False, False, False, False, True]), label=f"junk {arg}?")
    if junk:
      kwargs[arg] = data.draw(st.one_of(_JUNK, _RATIOS) if arg == "rd_ratio" else _JUNK,
                              label=arg)
    else:
      kwargs[arg] = data.draw(st.sampled_from(valid), label=arg)
  x = data.draw(_input_arrays(), label="inputs")
  output_size = source = None
  if name == "MaxUnpool":
    output_size = data.draw(st.one_of(st.none(), _JUNK), label="output_size")
  if name == "FractionalMaxPool":
    source = data.draw(st.one_of(st.sampled_from(["samples", "samples", "rngs"]), _JUNK),
                       label="samples")
  try:
    with _deadline():
      module = factory(**kwargs)
      out = _traced_call(name, module, x, output_size, source)
  except (ValueError, TypeError) as e:
    assert raised_by_nnx_pool(e), f"{type(e).__name__} not raised by nnx_pool: {e}"
    event(f"refused: {type(e).__name__}")
    return
  except _Hang:
    raise
  except Exception as e:  # noqa: BLE001 - anything else is an internal error
    pytest.fail(f"{type(e).__name__} (not our ValueError/TypeError): {e}")
  event("accepted")
  leaves = jax.tree.leaves(out)
  assert leaves and all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves)
  if x.size:  # a non-empty input never gives a silently empty result
    assert all(math.prod(leaf.shape) for leaf in leaves), [leaf.shape for leaf in leaves]


def _traced_call(name, module, x, output_size, source):
  """The module's call traced by ``nnx.eval_shape``: every argument check runs, and the
  result's shapes and dtypes come back, but nothing compiles.

  Called eagerly, every example compiled each of its operations on its own (the two fuzz
  tests took 15.8 s of `make test`'s test time, base.xml). The input, the indices and the
  samples are closed over, not passed, so they stay concrete arrays and the checks of their
  values (indices in range, samples in [0, 1)) run as they do eagerly; the module and an
  ``nnx.Rngs`` go in as arguments, graph nodes that the call may update.
  """
  if name == "MaxUnpool":
    indices = jax.device_put(np.zeros(x.shape, np.int32))
    return nnx.eval_shape(lambda m: m(x, indices, output_size), module)
  if name == "FractionalMaxPool":
    call = _fractional(module, x, source)
    rngs = call.pop("rngs", None)
    return nnx.eval_shape(lambda m, r: m(x, **call, rngs=r), module, rngs)
  return nnx.eval_shape(lambda m: m(x), module)


def _fractional(module, x, source) -> dict:
  """FractionalMaxPool's call arguments: uniform samples of the shape the input needs
  (``(*batch, C, ndim)``), its rngs, or a junk value as samples."""
  if source == "rngs":
    return {"rngs": nnx.Rngs(0)}
  if not isinstance(source, str) or source != "samples":
    return {"samples": source}
  ndim = len(module.window_shape)
  shape = (*x.shape[:max(x.ndim - ndim - 1, 0)], x.shape[-1], ndim)
  # A concrete jax.Array: a NumPy one would become a tracer in jnp.asarray under eval_shape.
  return {"samples": jax.device_put(
      np.random.default_rng(0).uniform(size=shape).astype(np.float32))}


# ============================================================================
# Size limits (docs/limits.md).
# ============================================================================


def test_window_larger_than_the_input_with_padding_or_ceil_mode_matches_mirror():
  x = np.arange(4.0, dtype=np.float32).reshape(1, 2, 2, 1)
  # A 3x3 window over 2x2 fits with padding 1 (one output) and, in ceil mode, with
  # an overhang of less than a stride; mirror: PyTorch's rules in NumPy.
  got = MaxPool((3, 3), 2, 1)(x)
  np.testing.assert_array_equal(got, reference.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)))[0])
  got = AvgPool((3, 3), 2, ceil_mode=True)(x)
  np.testing.assert_array_equal(got, [[[[1.5]]]])  # hand: mean of 0, 1, 2, 3 (4 real cells)
  with pytest.raises(ValueError, match="Output size is too small") as info:
    MaxPool((3, 3))(x)
  assert raised_by_nnx_pool(info.value)


# Gaps found here, with the library change each needs: {(module, where): reason}. None
# today (FractionalMaxPool's reshape to (n, -1, c) failed on N or C of 0 until it spelt
# the size out).
_EMPTY_XFAIL: dict[tuple[str, str], str] = {}


def _empty_params():
  params = []
  for where in ("batch", "channels"):
    for name in sorted(_MODULES):
      reason = _EMPTY_XFAIL.get((name, where))
      marks = [pytest.mark.xfail(strict=True, raises=ZeroDivisionError, reason=reason)] if (
          reason) else []
      params.append(pytest.param(name, where, id=f"{where}-{name}", marks=marks))
  return params


def _empty_call(name, where):
  """The module with its default arguments, and its call on an empty batch (0, 4, 4, 4) or
  on empty channels (2, 4, 4, 0); the inputs are NumPy zeros, closed over."""
  if name == "AttentionPoolLatent":  # tokens (N, L, C): an empty batch of 16 tokens
    tokens = np.zeros((0, 16, 4), np.float32)
    return build(AttentionPoolLatent, 4, num_heads=2), lambda m: m(tokens)
  factory, valid = _MODULES[name]
  module = factory(**{arg: values[0] for arg, values in valid.items()})
  shape = (0, 4, 4, 4) if where == "batch" else (2, 4, 4, 0)
  x = np.zeros(shape, np.float32)
  if name == "MaxUnpool":
    indices = np.zeros(shape, np.int32)
    return module, lambda m: m(x, indices)
  if name == "FractionalMaxPool":  # PyTorch's _random_samples: (N, C, 2)
    samples = np.full((shape[0], shape[-1], 2), 0.5, np.float32)
    return module, lambda m: m(x, samples=samples)
  return module, lambda m: m(x)


def _empty_names(where):
  return [name for name in sorted(_MODULES) if (name, where) not in _EMPTY_XFAIL
          and not (name in _GATES and where == "channels")]


@functools.cache
def _empty_results(where) -> dict:
  """Each module's (first) result on empty dims, all from one nnx.jit program a `where`.

  One nnx.jit a module: 47 programs, 0.50 s of compile CPU; these two: 0.10 s (census
  plugin, -k empty_batch_or).
  A module that fails fails every test of its `where`, its name in the traceback; the
  gaps in _EMPTY_XFAIL run alone, so that each fails on its own.
  """
  names = _empty_names(where)
  modules, calls = zip(*(_empty_call(name, where) for name in names), strict=True)
  results = nnx.jit(lambda ms: [jax.tree.leaves(call(m))[0]
                                for m, call in zip(ms, calls, strict=True)])(list(modules))
  return dict(zip(names, results, strict=True))


@pytest.mark.parametrize(("name", "where"), _empty_params())
def test_empty_batch_or_channels_give_an_empty_result_of_the_right_shape(name, where):
  if name in _GATES and where == "channels":
    pytest.skip("a gate's channel count is its in_features, which must be positive")
  if (name, where) in _EMPTY_XFAIL:
    module, call = _empty_call(name, where)
    out = jax.tree.leaves(nnx.jit(call)(module))[0]
  else:
    out = _empty_results(where)[name]
  shape = (0, 4, 4, 4) if where == "batch" else (2, 4, 4, 0)
  expected = {  # hand: what each module does to a (N, 4, 4, C) map
      "AvgPool": (2, 2), "MaxPool": (2, 2), "MinPool": (2, 2), "LPPool": (2, 2),
      "MaxUnpool": (8, 8), "GlobalAvgPool": (), "GlobalMaxPool": (), "AdaptiveAvgPool": (2, 2),
      "AdaptiveMaxPool": (2, 2), "SelectAdaptivePool": (1, 1), "GeMPool": (),
      "LsePlusPool": (), "AttentionPool": (), "BlurPool": (2, 2), "MedianPool": (2, 2),
      "FractionalMaxPool": (2, 2),
  }.get(name, (4, 4))
  expected = (shape[0], *expected, shape[-1])
  if name == "AttentionPoolLatent":  # 16 tokens of 4 channels pooled to one vector
    expected = (0, 4)
  assert out.shape == expected and out.size == 0


@pytest.mark.parametrize("pool_type", ["avg", "max", "avgmax", "catavgmax"])
def test_an_empty_batch_flattens_to_an_empty_matrix(pool_type):
  pool = SelectAdaptivePool(2, pool_type=pool_type, flatten=True)
  width = 2 * 2 * 3 * pool.feat_mult()  # hand: (2, 2) bins of 3 channels, flattened
  assert pool(jnp.zeros((0, 4, 4, 3))).shape == (0, width)


@pytest.mark.parametrize("make", [
    GlobalAvgPool, GlobalMaxPool, lambda: AdaptiveAvgPool(2),
    lambda: SelectAdaptivePool(1, pool_type="avgmax"),
    lambda: build(SqueezeExcitation, 4), lambda: build(EffectiveSqueezeExcitation, 4),
    lambda: build(EfficientChannelAttention, 4), lambda: build(CBAM, 4),
], ids=["GlobalAvgPool", "GlobalMaxPool", "AdaptiveAvgPool", "SelectAdaptivePool",
        "SqueezeExcitation", "EffectiveSqueezeExcitation", "EfficientChannelAttention", "CBAM"])
def test_whole_map_reductions_refuse_empty_spatial_dims(make):
  with pytest.raises(ValueError, match="needs non-empty spatial dims") as info:
    jax.block_until_ready(make()(jnp.zeros((1, 0, 4, 4))))
  assert raised_by_nnx_pool(info.value)


def _integer_map(shape):
  """Integer values in [-7, 7]: every partial sum of a 1024 x 1024 plane stays below 2**24,
  so float32 sums are exact in any order and the mean (a power-of-two count) is exact."""
  n, h, w, c = np.ogrid[tuple(slice(s) for s in shape)]  # broadcast, not four full grids
  return ((n * 5 + h * 7 + w * 3 + c * 11) % 15 - 7).astype(np.float32)


@pytest.fixture(scope="module")
def big_map():
  """A (2, 1024, 1024, 2) integer map and every whole-map pooling of it, from one program.

  The two tests below share it: compiled one pooling at a time they took 1.3 s and 1.6 s
  (base.xml, `make test`), together in one jax.jit 1.7 s (measured alone on 2 cores).
  """
  x = _integer_map((2, 1024, 1024, 2))

  @jax.jit
  def pools(v):
    return dict(global_avg=GlobalAvgPool()(v), global_max=GlobalMaxPool()(v),
                adaptive_avg=AdaptiveAvgPool(1)(v),
                adaptive_max=AdaptiveMaxPool(1, return_indices=True)(v),
                quadrants=AdaptiveAvgPool((2, 2))(v), window=AvgPool((1024, 1024))(v))

  return x, pools(x)


def test_whole_map_pooling_on_1024_by_1024_is_exact(big_map):
  x, got = big_map
  total = x.astype(np.int64).sum(axis=(1, 2))
  mean = (total / (1024 * 1024)).astype(np.float32)  # exact: a power-of-two divisor
  peak = x.max(axis=(1, 2))
  np.testing.assert_array_equal(got["global_avg"], mean)
  np.testing.assert_array_equal(got["global_max"], peak)
  np.testing.assert_array_equal(got["adaptive_avg"][:, 0, 0], mean)
  values, indices = got["adaptive_max"]
  first = x.reshape(2, -1, 2).argmax(axis=1)  # NumPy: the first maximum in row-major order
  np.testing.assert_array_equal(values[:, 0, 0], peak)
  np.testing.assert_array_equal(indices[:, 0, 0], first)
  # Quadrants: 512 x 512 bins, summed exactly, divided by 2**18.
  quads = x.reshape(2, 2, 512, 2, 512, 2).astype(np.int64).sum(axis=(2, 4)) / 512**2
  np.testing.assert_array_equal(got["quadrants"], quads.astype(np.float32))


def test_a_1024_by_1024_average_window_equals_the_global_mean(big_map):
  x, got = big_map
  want = (x.astype(np.int64).sum(axis=(1, 2)) / 1024**2).astype(np.float32)  # exact, as above
  assert got["window"].shape == (2, 1, 1, 2)
  np.testing.assert_array_equal(got["window"][:, 0, 0], want)


@pytest.mark.parametrize("make", [
    lambda: MaxPool((2, 2), 2**15, return_indices=True),
    lambda: MinPool((2, 2), 2**15, return_indices=True),
    lambda: AdaptiveMaxPool((2, 2), return_indices=True),
    GlobalMaxPool,
    lambda: SelectAdaptivePool(1, pool_type="max"),
], ids=["MaxPool", "MinPool", "AdaptiveMaxPool", "GlobalMaxPool", "SelectAdaptivePool"])
def test_indices_past_int32_are_refused(make):
  # A 65536 x 65536 plane (2**32 cells); eval_shape traces it without allocating.
  big = jax.ShapeDtypeStruct((1, 2**16, 2**16, 1), jnp.float32)
  with pytest.raises(ValueError, match=r"has 4294967296 cells, but flat indices are int32") as info:
    jax.eval_shape(make(), big)
  assert raised_by_nnx_pool(info.value)


def test_a_window_past_int32_offsets_is_refused():
  big = jax.ShapeDtypeStruct((1, 2**16, 2**16, 1), jnp.float32)
  with pytest.raises(ValueError, match="window reaching 4294967296 cells") as info:
    jax.eval_shape(MaxPool((2**16, 2**16)), big)
  assert raised_by_nnx_pool(info.value)


def test_a_big_plane_without_indices_is_pooled():
  # The refusal is about the indices: values alone (and averages) trace at 2**32 cells.
  big = jax.ShapeDtypeStruct((1, 2**16, 2**16, 1), jnp.float32)
  assert jax.eval_shape(MaxPool((2, 2), 2**15), big).shape == (1, 2, 2, 1)
  assert jax.eval_shape(GlobalAvgPool(), big).shape == (1, 1)
  assert jax.eval_shape(AdaptiveAvgPool(2), big).shape == (1, 2, 2, 1)


def test_unpool_output_past_int32_is_refused():
  values = jax.ShapeDtypeStruct((1, 2, 2, 1), jnp.float32)
  indices = jax.ShapeDtypeStruct((1, 2, 2, 1), jnp.int32)
  # Stride 2**15: (2 - 1) * 32768 + 2 = 32770 per dim, 1073872900 cells, which int32 addresses.
  unpooled = jax.eval_shape(lambda v, i: MaxUnpool((2, 2), 2**15)(v, i), values, indices)
  assert unpooled.shape == (1, 32770, 32770, 1)
  # Stride 2**16: 65538 per dim, 4295229444 cells.
  too_big = r"spatial shape \(65538, 65538\) has 4295229444 cells"
  with pytest.raises(ValueError, match=too_big) as info:
    jax.eval_shape(lambda v, i: MaxUnpool((2, 2), 2**16)(v, i), values, indices)
  assert raised_by_nnx_pool(info.value)


def test_indices_of_a_plane_just_under_int32_are_int32():
  # 46340**2 = 2147395600 < 2**31 - 1: the largest square plane int32 indices address.
  big = jax.ShapeDtypeStruct((1, 46340, 46340, 1), jnp.float32)
  _, indices = jax.eval_shape(MaxPool((2, 2), 23170, return_indices=True), big)
  assert indices.dtype == jnp.int32 and indices.shape == (1, 2, 2, 1)


@pytest.mark.parametrize("window", [5, 10**12, 2**63 - 1], ids=["5", "1e12", "int64max"])
def test_a_window_far_larger_than_the_input_costs_what_the_input_does(window):
  # Ceil mode lets one window overhang the input by less than a stride (the stride
  # is the window): only the taps on real cells matter, however many the window has.
  x = np.array([[[1.0], [4.0], [2.0], [3.0]]], np.float32)
  window = (window,)
  values, indices = MaxPool(window, ceil_mode=True, return_indices=True)(x)
  np.testing.assert_array_equal(values, [[[4.0]]])  # hand: the max of the one window
  np.testing.assert_array_equal(indices, [[[1]]])
  np.testing.assert_array_equal(AvgPool(window, ceil_mode=True)(x), [[[2.5]]])  # 10 / 4 cells
  grad = jax.grad(lambda v: MaxPool(window, ceil_mode=True)(v).sum())(x)
  np.testing.assert_array_equal(grad, [[[0.0], [1.0], [0.0], [0.0]]])
  # PyTorch's LP rule, (mean of x**2 over the real cells * window) ** (1/2), in float64.
  want = np.sqrt(np.float64(30 / 4) * window[0])
  np.testing.assert_allclose(LPPool(2, window, ceil_mode=True)(x)[0, 0, 0], want, rtol=1e-6)


# ============================================================================
# Arguments the fuzzing found mishandled, now refused by our own errors.
# ============================================================================


@pytest.mark.parametrize("cls", [SqueezeExcitation, CBAM])
def test_gates_refuse_an_infinite_rd_ratio(cls):
  with pytest.raises(ValueError, match="`rd_ratio` must be a positive") as info:
    cls(8, rd_ratio=float("inf"), rngs=nnx.Rngs(0))
  assert raised_by_nnx_pool(info.value)


@pytest.mark.parametrize("cls", [SqueezeExcitation, CBAM])
def test_gates_take_numpy_ratios_and_refuse_bool_ratios(cls):
  gate = build(cls, 64, rd_ratio=np.float32(0.25), rd_divisor=8)
  assert gate.squeeze_features == 16  # hand: make_divisible(64 * 0.25, 8) = 16
  with pytest.raises(TypeError, match="`rd_ratio` must be a positive finite number; got True"):
    cls(8, rd_ratio=True, rngs=nnx.Rngs(0))


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(gamma=0), "`gamma`"), (dict(gamma=float("nan")), "`gamma`"),
    (dict(gamma="2"), "`gamma`"), (dict(beta=float("inf")), "`beta`"),
], ids=["gamma0", "gamma_nan", "gamma_str", "beta_inf"])
def test_eca_refuses_bad_gamma_and_beta(kwargs, match):
  with pytest.raises((ValueError, TypeError), match=match) as info:
    EfficientChannelAttention(8, **kwargs, rngs=nnx.Rngs(0))
  assert raised_by_nnx_pool(info.value)


@pytest.mark.parametrize("cls", [SqueezeExcitation, CBAM])
@pytest.mark.parametrize("use_bias", [-1, "yes", None])
def test_gates_refuse_a_use_bias_that_is_not_a_bool(cls, use_bias):
  with pytest.raises(TypeError, match="`use_bias` must be a bool") as info:
    cls(8, use_bias=use_bias, rngs=nnx.Rngs(0))
  assert raised_by_nnx_pool(info.value)


@pytest.mark.parametrize("call", [
    lambda: LPPool(10**400, (2,)),
    lambda: AvgPool((2,), divisor_override=10**400)(np.ones((1, 4, 1), np.float32)),
], ids=["LPPool-norm_type", "AvgPool-divisor_override"])
def test_numbers_too_large_for_a_float_are_refused(call):
  with pytest.raises(ValueError) as info:
    call()
  assert raised_by_nnx_pool(info.value)


# ============================================================================
# Dtypes.
# ============================================================================

_LOW = {"bfloat16": (ml_dtypes.bfloat16, 1e-2), "float16": (np.float16, 1e-3)}


@pytest.mark.parametrize("dtype", sorted(_LOW))
def test_low_precision_inputs_keep_their_dtype_and_match_mirror(dtype):
  np_dtype, tol = _LOW[dtype]  # the regression kit's forward tolerance for this dtype
  x = (np.random.default_rng(0).integers(-16, 17, (2, 5, 7, 3)) / 8).astype(np_dtype)
  x64 = x.astype(np.float64)  # exact; the mirror takes NumPy's own dtypes
  # All modules under one jit: one compile, where an eager call also compiles its layout
  # steps one by one (eager equals jit: tests/test_pool.py, tests/test_adaptive.py).
  averages = [
      (AvgPool((3, 3), 2, 1), reference.avg_pool(x64, (3, 3), (2, 2), ((1, 1), (1, 1)))),
      (LPPool(2, (2, 2)), reference.lp_pool(x64, 2, (2, 2))),
      (GlobalAvgPool(), reference.global_avg_pool(x64)),
      (AdaptiveAvgPool((3, 4)), reference.adaptive_avg_pool(x64, (3, 4))),
      (SelectAdaptivePool(2, pool_type="avgmax"),
       0.5 * (reference.adaptive_avg_pool(x64, (2, 2)) + reference.adaptive_max_pool(x64,
                                                                                     (2, 2))[0])),
  ]
  selections = [
      (MaxPool((2, 2)), reference.max_pool(x64, (2, 2), (2, 2), "VALID")[0]),
      (MinPool((3, 3), 1, "SAME"), reference.min_pool(x64, (3, 3), (1, 1), "SAME")[0]),
      (GlobalMaxPool(), reference.global_max_pool(x64)),
      (AdaptiveMaxPool((3, 4)), reference.adaptive_max_pool(x64, (3, 4))[0]),
  ]
  se = build(SqueezeExcitation, 3, 2)
  low = build(SqueezeExcitation, 3, 2, dtype=np_dtype, param_dtype=np_dtype)
  *got, got_se, got_low = _apply_each([m for m, _ in averages + selections] + [se, low], x)
  for got_one, (_, want) in zip(got[:len(averages)], averages, strict=True):
    assert got_one.dtype == np_dtype
    np.testing.assert_allclose(np.asarray(got_one, np.float64), want, rtol=tol, atol=tol)
  for got_one, (_, want) in zip(got[len(averages):], selections, strict=True):
    assert got_one.dtype == np_dtype  # max and min select an input value: exact
    np.testing.assert_array_equal(np.asarray(got_one, np.float64), want)
  assert got_se.dtype == np_dtype  # the gated map keeps its dtype with float32 params
  assert got_low.dtype == np_dtype


@pytest.mark.parametrize("dtype", ["int8", "int32"])
def test_integer_inputs_for_max_and_min_are_exact(dtype):
  info = np.iinfo(dtype)
  x = np.random.default_rng(1).integers(info.min, info.max, (2, 6, 6, 2), endpoint=True)
  x = x.astype(dtype)
  x[0, 0, 0, 0], x[1, 5, 5, 1] = info.min, info.max  # the extremes, next to the padding
  # One compiled program for all the pools (eager equals jit: tests/test_pool.py,
  # tests/test_adaptive.py); padding holds the dtype's min (max) and never wins, and no
  # -max(-x) overflows.
  [(max_values, max_indices), (min_values, min_indices), global_max, (ada_values, ada_indices),
   select, (pooled, where)] = _apply_each([
          MaxPool((3, 3), 2, 1, return_indices=True), MinPool((3, 3), 2, 1, return_indices=True),
          GlobalMaxPool(), AdaptiveMaxPool((4, 4), return_indices=True),
          SelectAdaptivePool(2, pool_type="max"), MaxPool((2, 2), return_indices=True)], x)
  for kind, values, indices, mirror in (("max", max_values, max_indices, reference.max_pool),
                                        ("min", min_values, min_indices, reference.min_pool)):
    want_values, want_indices = mirror(x, (3, 3), (2, 2), ((1, 1), (1, 1)))
    assert values.dtype == x.dtype, kind
    np.testing.assert_array_equal(values, want_values)
    np.testing.assert_array_equal(indices, want_indices)
  np.testing.assert_array_equal(global_max, reference.global_max_pool(x))
  want_values, want_indices = reference.adaptive_max_pool(x, (4, 4))
  np.testing.assert_array_equal(ada_values, want_values)
  np.testing.assert_array_equal(ada_indices, want_indices)
  np.testing.assert_array_equal(select, reference.adaptive_max_pool(x, (2, 2))[0])
  unpooled = _unpool_2x2(pooled, where)
  assert unpooled.dtype == x.dtype
  np.testing.assert_array_equal(
      unpooled, reference.max_unpool(np.asarray(pooled), np.asarray(where), (2, 2)))


def _bool_calls():
  b = jnp.zeros((1, 4, 4, 4), bool)
  return {
      "AvgPool": lambda: AvgPool((2,))(b[0]), "MaxPool": lambda: MaxPool((2, 2))(b),
      "MinPool": lambda: MinPool((2, 2))(b), "LPPool": lambda: LPPool(2, (2, 2))(b),
      "MaxUnpool": lambda: MaxUnpool((2, 2))(b, jnp.zeros(b.shape, jnp.int32)),
      "GlobalAvgPool": lambda: GlobalAvgPool()(b), "GlobalMaxPool": lambda: GlobalMaxPool()(b),
      "AdaptiveAvgPool": lambda: AdaptiveAvgPool(2)(b),
      "AdaptiveMaxPool": lambda: AdaptiveMaxPool(2)(b),
      "SelectAdaptivePool": lambda: SelectAdaptivePool(pool_type="max")(b),
      "SqueezeExcitation": lambda: build(SqueezeExcitation, 4)(b),
      "EffectiveSqueezeExcitation": lambda: build(EffectiveSqueezeExcitation, 4)(b),
      "EfficientChannelAttention": lambda: build(EfficientChannelAttention, 4)(b),
      "CBAM": lambda: build(CBAM, 4)(b),
      "LightCBAM": lambda: build(LightCBAM, 4)(b),
      "GlobalContext": lambda: build(GlobalContext, 4)(b),
      "AttentionPool": lambda: build(AttentionPool, 4, feat_size=4, num_heads=2)(b),
      "AttentionPoolLatent": lambda: build(AttentionPoolLatent, 4, num_heads=2)(
          b.reshape(1, 16, 4)),
      "GeMPool": lambda: GeMPool()(b), "LsePlusPool": lambda: LsePlusPool()(b),
      "BlurPool": lambda: BlurPool()(b), "MedianPool": lambda: MedianPool()(b),
      "FractionalMaxPool": lambda: FractionalMaxPool(2, 2)(b, samples=np.zeros((1, 4, 2))),
  }


@pytest.mark.parametrize("name", sorted(_MODULES))
def test_bool_inputs_are_refused_by_every_module(name):
  with pytest.raises(TypeError, match=r"`inputs` has dtype bool; cast it first") as info:
    _bool_calls()[name]()
  assert raised_by_nnx_pool(info.value)


def test_low_precision_averages_accumulate_in_float32():
  # One 256 and eight 1s in a 3x3 window. Summed in bfloat16 the 1s vanish
  # (256 + 1 rounds back to 256: bfloat16 has 8 significant bits), giving
  # 256 / 9 = 28.4 -> 28.5. Summed in float32: 264 / 9 = 29.33 -> 29.375 in bfloat16.
  window = np.ones((1, 3, 3, 1), np.float32)
  window[0, 0, 0, 0] = 256.0
  for dtype in (ml_dtypes.bfloat16, np.float16):
    x = window.astype(dtype)
    want = np.asarray(np.float32(264.0) / np.float32(9.0)).astype(dtype)  # hand computation
    # NumPy out: indexing a jax.Array compiles a program for each shape.
    assert np.asarray(AvgPool((3, 3))(x))[0, 0, 0, 0] == want
    assert np.asarray(GlobalAvgPool()(x))[0, 0] == want
    assert np.asarray(AdaptiveAvgPool(1)(x))[0, 0, 0, 0] == want
  bf16_sum = ml_dtypes.bfloat16(0.0)
  for v in window.ravel().astype(ml_dtypes.bfloat16):  # what a bfloat16 accumulator would do
    bf16_sum = ml_dtypes.bfloat16(bf16_sum + v)
  assert float(bf16_sum) == 256.0


def test_bfloat16_global_mean_of_a_128_by_128_map_is_within_tolerance_of_float32():
  x = np.random.default_rng(2).uniform(0.0, 1.0, (4, 128, 128, 8)).astype(np.float32)
  xb = x.astype(ml_dtypes.bfloat16)
  got = np.asarray(GlobalAvgPool()(xb), np.float64)
  want = np.asarray(GlobalAvgPool()(xb.astype(np.float32)), np.float64)  # same values, float32
  # The regression kit's `global` bfloat16 tolerance (docs/regression.md): 1e-2.
  np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
  # Tighter and the actual claim: one rounding of the float32 mean to bfloat16 (2**-8).
  np.testing.assert_allclose(got, want, rtol=2.0**-8, atol=0)
  # The means sit near 0.5, where bfloat16 steps by 2**-9: a bfloat16 accumulator
  # would have stalled at 2**16 / 2**7 = 512 per 2**16 terms long before.
  np.testing.assert_allclose(want, x.astype(np.float64).mean(axis=(1, 2)), rtol=2.0**-8)


# ---------------------------------------------------------------- float64


def _x64_report() -> dict:
  """Under jax_enable_x64: float64 results against the mirror, and the int32 decision.

  The modules run under one ``nnx.jit`` (one compile for those on ``x``, not one per
  primitive, as the eager float64 calls did); eager calls equal jitted ones (test_pool.py,
  test_adaptive.py).
  """
  rng = np.random.default_rng(3)
  x = rng.standard_normal((2, 5, 7, 3))
  pos = rng.uniform(0.5, 2.0, (2, 5, 7, 3))
  results = {}

  def record(name, got, want, exact=False):
    got = jax.tree.leaves(got)[0] if isinstance(got, tuple) else got
    err = float(np.max(np.abs(np.asarray(got, np.float64) - want)))
    results[name] = {"dtype": str(got.dtype), "max_abs": err, "exact": exact}

  modules = {
      "AvgPool": AvgPool((3, 3), 2, 1, count_include_pad=False), "MaxPool": MaxPool((2, 2)),
      "MinPool": MinPool((3, 3), 1, "SAME"), "GlobalAvgPool": GlobalAvgPool(),
      "GlobalMaxPool": GlobalMaxPool(), "AdaptiveAvgPool": AdaptiveAvgPool((3, 4)),
      "AdaptiveMaxPool": AdaptiveMaxPool((3, 4)),
      "SelectAdaptivePool": SelectAdaptivePool(1, pool_type="catavgmax", flatten=True),
      "indices": MaxPool((2, 2), return_indices=True),
      "gate": build(SqueezeExcitation, 3, 2, param_dtype=jnp.float64),
  }
  got = dict(zip(modules, _apply_each(list(modules.values()), x), strict=True))
  (lp,) = _apply_each([LPPool(3, (2, 2))], pos)  # positive inputs: a p-norm of order 3
  record("AvgPool", got["AvgPool"],
         reference.avg_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)), count_include_pad=False))
  record("LPPool", lp, reference.lp_pool(pos, 3, (2, 2)))
  record("MaxPool", got["MaxPool"], reference.max_pool(x, (2, 2), (2, 2), "VALID")[0], True)
  record("MinPool", got["MinPool"], reference.min_pool(x, (3, 3), (1, 1), "SAME")[0], True)
  record("GlobalAvgPool", got["GlobalAvgPool"], reference.global_avg_pool(x))
  record("GlobalMaxPool", got["GlobalMaxPool"], reference.global_max_pool(x), True)
  record("AdaptiveAvgPool", got["AdaptiveAvgPool"], reference.adaptive_avg_pool(x, (3, 4)))
  record("AdaptiveMaxPool", got["AdaptiveMaxPool"], reference.adaptive_max_pool(x, (3, 4))[0],
         True)
  record("SelectAdaptivePool", got["SelectAdaptivePool"],
         np.concatenate([reference.global_avg_pool(x), reference.global_max_pool(x)], -1))
  pooled, where = got["indices"]
  record("MaxUnpool", jax.jit(lambda v, i: MaxUnpool((2, 2))(v, i, (5, 7)))(pooled, where),
         reference.max_unpool(np.asarray(pooled), np.asarray(where), (2, 2), output_size=(5, 7)),
         True)
  results["indices_dtype"] = str(where.dtype)
  results["gate_dtype"] = str(got["gate"].dtype)
  big = jax.ShapeDtypeStruct((1, 2**16, 2**16, 1), jnp.float64)
  try:
    _, idx = jax.eval_shape(MaxPool((2, 2), 2**15, return_indices=True), big)
    results["big_plane_indices"] = str(idx.dtype)
  except ValueError as e:
    results["big_plane_indices"] = f"ValueError: {e}"
  return {"x64": bool(jax.config.jax_enable_x64), "results": results}


def _enable_x64():
  """``jax.enable_x64``; the floor, jax 0.7.0, has it in ``jax.experimental`` only (which
  newer jax dropped)."""
  if hasattr(jax, "enable_x64"):
    return jax.enable_x64
  from jax.experimental import enable_x64  # pyright: ignore[reportAttributeAccessIssue]

  return enable_x64


@pytest.fixture(scope="module")
def x64_report() -> dict:
  # The context manager gives the dtypes and errors a process started with JAX_ENABLE_X64=1
  # gives (this report was compared with one), without a second interpreter importing jax.
  with _enable_x64()(True):
    return _x64_report()


_X64_MODULES = ("AvgPool", "LPPool", "MaxPool", "MinPool", "GlobalAvgPool", "GlobalMaxPool",
                "AdaptiveAvgPool", "AdaptiveMaxPool", "SelectAdaptivePool", "MaxUnpool")


@pytest.mark.parametrize("name", _X64_MODULES)
def test_float64_under_x64_keeps_float64_and_matches_mirror(x64_report, name):
  assert x64_report["x64"]
  result = x64_report["results"][name]
  assert result["dtype"] == "float64"
  # Mirror in float64; averages within the kit's float64 `window`/`global` tolerance.
  assert result["max_abs"] == 0.0 if result["exact"] else result["max_abs"] < 1e-12


def test_float64_under_x64_indices_stay_int32_and_gates_follow_their_params(x64_report):
  assert x64_report["results"]["indices_dtype"] == "int32"
  assert x64_report["results"]["gate_dtype"] == "float64"


def test_float64_under_x64_big_planes_are_refused_too(x64_report):
  # Stated in docs/limits.md: indices stay int32 under x64, so big planes are refused.
  decision = x64_report["results"]["big_plane_indices"]
  assert decision.startswith("ValueError: MaxPool: a plane of spatial shape (65536, 65536)")
