"""Property tests: AvgPool, MaxPool, MinPool and LPPool against the NumPy mirror.

Hypothesis draws window configurations (1 to 3 spatial dims, window, strides,
dilation, every padding form, ceil mode, the average divisors, dtype, batched
or not) and small inputs; every expectation comes from
:mod:`nnx_pool.reference`, the independent NumPy mirror of PyTorch's rules.

Which configurations are valid is predicted from the mirror's
:func:`~nnx_pool.reference.output_size` and :func:`~nnx_pool.reference.same_padding`,
plus the three rules our modules add and document (``_geometry.Window``):
explicit padding at most half the effective window per side (PyTorch's
``pad <= k/2``), no ``"SAME"`` with ``ceil_mode``, and no window made of
padding only. Inputs come from a drawn seed rather than drawn arrays, which
keeps each example fast; a failure prints the configuration and the seed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import nnx_pool
import nnx_pool._separable
from nnx_pool import AvgPool, LPPool, MaxPool, MinPool, reference

# Deterministic, no example database in the repository, no per-example deadline
# (the first call of a shape compiles).
_SETTINGS = dict(
    deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
_AVG_TOL = dict(rtol=1e-5, atol=1e-6)  # float32 sums against the mirror's float64
_PACKAGE = Path(nnx_pool.__file__).parent
# Each example compiles its own program, so the example counts are the file's time. The
# four costliest tests run fewer examples than they did (max/min 80 -> 40, their gradient
# 30 -> 15, avg 40 -> 25, separable max/min 20 -> 10): the derandomized examples kept
# still draw every value that the longer runs drew of kind, ndim, padding mode, asymmetric
# pads, ceil mode, dilation, dtype, unbatched input, divisor override, count_include_pad
# and norm type (checked by listing those features over the valid examples of both).
# Separable max/min 10 -> 8 (its examples cost about 0.6 s each, most of it tracing): the 8
# derandomized examples draw every feature the 10 drew (kind, ndim 1-3, the long axis at
# each position, VALID, SAME and explicit padding, asymmetric pads, ceil mode with padding
# and with dilation, strides past the window, unbatched, int and tuple strides) and an int
# window besides; 5, 6 and 7 examples missed VALID or 2-D (listed with a script that
# records those features of each valid example, hypothesis 6.170.17, derandomize=True).
# Then max/min 40 -> 30, their gradient 15 -> 11, avg 25 -> 18, lp 25 -> 15 and separable
# avg/lp 15 -> 12: each count's derandomized examples draw every value that the longer run
# drew of those features, of the spellings (int window, strides None, int or tuple, padding
# as a string in either case, an int, ints or pairs), of strides past the window, overlap,
# one-tap windows and return_indices, and of the separable long axis's position per kind
# and rank; and every pairing of two of them that the longer run drew, but these (each
# shown elsewhere): max/min values of ceil mode in float32 (test_pool_torch.py's max sweep)
# and of a batched 1-D input (test_pool.py's 1-D vectors); the gradient with asymmetric
# pads or padding without ceil mode (test_pool.py::test_maxpool_gradient_matches_mirror's
# 2x3 case); avg of SAME or count_include_pad unbatched (test_pool.py's
# test_pool_unbatched_equals_batched: AvgPool((2, 2), 1, 1), a layout step before any
# padding rule); lp without ceil mode batched or of norm 2.5 outside ceil mode, batched or
# 1-D (the 20 and 18 examples missed them too; test_pool.py::test_lppool_vectors and
# test_pool_torch.py's lp sweep). Fewer missed more (listed with a plugin that records each
# valid example's configuration from _input and _jit_apply: 8-10 gradient examples missed
# 3-D explicit padding or min on VALID, 25 max/min SAME in 1-D, 15 avg "SAME" spelt in upper
# case, 10 separable avg/lp avg's 3-D long axis first). Their programs took 5.1 s of compile
# CPU, now 3.41 s (5.43 s before; per-test census, pytest tests/test_pool_properties.py, 2 cores).

# The sweeps draw random channels-last shapes; some look channels-first, by design.
pytestmark = pytest.mark.filterwarnings("ignore::nnx_pool.ChannelsFirstWarning")


# ----------------------------------------------------------------------------
# Configurations.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
  """A drawn configuration: our module's arguments and the mirror's."""

  kind: str  # "max", "min", "avg" or "lp"
  spatial: tuple[int, ...]
  window: tuple[int, ...]
  strides: tuple[int, ...]
  dilation: tuple[int, ...]
  padding: object  # as our module takes it
  padding_mode: str  # "VALID", "SAME" or "explicit"
  pairs: tuple[tuple[int, int], ...]  # the explicit (low, high) pairs; zeros otherwise
  ceil_mode: bool
  batch: int | None  # None: unbatched
  channels: int
  dtype: str = "float32"
  count_include_pad: bool = True
  divisor_override: int | None = None
  norm_type: float = 2.0
  window_arg: object = None  # as our module takes it (an int for 1-D now and then)
  strides_arg: object = None  # None (= window), an int or a tuple
  seed: int = 0

  @property
  def ndim(self) -> int:
    return len(self.window)

  @property
  def mirror_padding(self):
    return self.padding_mode if self.padding_mode != "explicit" else self.pairs

  def module(self, **extra):
    # An int argument is repeated over num_spatial_dims, so the dims are always stated.
    extra = {"num_spatial_dims": self.ndim, **extra}
    args = (self.window_arg, self.strides_arg)
    if self.kind == "lp":
      return LPPool(self.norm_type, *args, ceil_mode=self.ceil_mode, **extra)
    if self.kind == "avg":
      return AvgPool(
          *args, self.padding, ceil_mode=self.ceil_mode,
          count_include_pad=self.count_include_pad, divisor_override=self.divisor_override,
          **extra,
      )
    cls = MaxPool if self.kind == "max" else MinPool
    dilation = self.dilation if len(set(self.dilation)) > 1 else self.dilation[0]
    return cls(*args, self.padding, dilation=dilation, ceil_mode=self.ceil_mode, **extra)


def _padding_spelling(draw, mode, pairs):
  """One of the forms our modules accept for a padding: VALID/SAME (any case), int, ints, pairs."""
  if mode in ("VALID", "SAME"):
    return draw(st.sampled_from([mode, mode.lower()]))
  forms = ["pairs"]
  if all(lo == hi for lo, hi in pairs):
    forms.append("ints")
    if len({lo for lo, _ in pairs}) == 1:
      forms.append("int")
  form = draw(st.sampled_from(forms))
  if form == "int":
    return pairs[0][0]
  if form == "ints":
    return tuple(lo for lo, _ in pairs)
  return pairs


# The separable tests pool windows over this many taps one spatial dim at a time: the
# modules' UNROLL_LIMIT (64) lowered to it while they run (_separable_over). The separable
# code is the same for any tap count (a loop over each dim's taps); the dispatch at the
# real limit and windows of 60 to 125 taps are tested in test_kernels.py. The separable
# examples draw the same features at either limit (listed with a script over the valid
# examples). Over 64 (65 to 70 taps along the long dim), the max/min test's 8 examples took
# 0.6 s each to trace and their programs 3.5 s of compile CPU; over 16, 1.7 s (pytest
# tests/test_pool_properties.py -p tools.compile_census, 2 cores: 8.8 s -> 6.3 s of compile
# CPU for the file). No window the other tests here draw has over 9 taps, so none of their
# kernels, traced once per geometry and shape, is one of these.
_SEPARABLE_LIMIT = 16


_SEPARABLE_RAN: set = set()  # (geometry, input shape) of the kernels that ran separable


@contextlib.contextmanager
def _separable_over(name, module, cfg):
  """``UNROLL_LIMIT`` lowered to :data:`_SEPARABLE_LIMIT`, asserting that ``name``
  (``separable_select`` or ``separable_sum``) ran on ``module``'s geometry over ``cfg``'s
  input where its window has over that many taps (a single window is trimmed to the
  input): in the block, or in an earlier one (a kernel is traced once per geometry and
  shape, and reused; one traced outside these blocks would fail here)."""
  original = getattr(nnx_pool._separable, name)

  def recorded(x, geom, *args, **kwargs):
    _SEPARABLE_RAN.add((geom, x.shape))
    return original(x, geom, *args, **kwargs)

  with mock.patch.object(nnx_pool._separable, "UNROLL_LIMIT", _SEPARABLE_LIMIT), \
      mock.patch.object(nnx_pool._separable, name, recorded):
    yield
  geom = module.window.resolve(cfg.spatial)
  if geom.size > _SEPARABLE_LIMIT:  # not a single window trimmed to the input under it
    shape = (cfg.batch or 1, *cfg.spatial, cfg.channels)
    assert (geom, shape) in _SEPARABLE_RAN, f"{name} did not run"


@st.composite
def configs(draw, kind, *, max_size=None, beyond_half=False, separable=False):
  """A window configuration; with ``beyond_half`` the padding may exceed our limit.

  With ``separable`` the window has over :data:`_SEPARABLE_LIMIT` taps (one long dim),
  which the modules pool one spatial dim at a time under :func:`_separable_over`.
  """
  ndim = draw(st.integers(1, 3))
  max_window = {1: 4, 2: 3, 3: 2}[ndim]
  window = tuple(draw(st.integers(1, max_window)) for _ in range(ndim))
  if separable:
    axis = draw(st.integers(0, ndim - 1))
    others = math.prod(window) // window[axis]
    long = draw(st.integers(_SEPARABLE_LIMIT // others + 1, _SEPARABLE_LIMIT // others + 6))
    window = (*window[:axis], long, *window[axis + 1:])
  strides = tuple(draw(st.integers(1, 3)) for _ in range(ndim))
  dilation = (1,) * ndim
  if kind in ("max", "min") and draw(st.booleans()):
    dilation = tuple(draw(st.integers(1, 3)) for _ in range(ndim))
  effective = [d * (k - 1) + 1 for k, d in zip(window, dilation, strict=True)]
  ceil_mode = draw(st.booleans())
  modes = ["VALID", "SAME", "explicit", "explicit"]
  mode = "VALID" if kind == "lp" else draw(st.sampled_from(modes))
  pairs = ((0, 0),) * ndim
  if mode == "SAME":
    ceil_mode = False  # refused, see test_pool_refuses_invalid_configs
  if mode == "explicit":
    limit = [e // 2 + (1 if beyond_half else 0) for e in effective]
    symmetric = draw(st.sampled_from([True, False, False]))
    pairs = []
    for lim in limit:
      lo = draw(st.integers(0, lim))
      pairs.append((lo, lo if symmetric else draw(st.integers(0, lim))))
    pairs = tuple(pairs)
  padding = None if kind == "lp" else _padding_spelling(draw, mode, pairs)
  # Lengths around the effective window: the shortest ones decide validity.
  max_size = max_size or {1: 9, 2: 6, 3: 4}[ndim]
  spatial = tuple(
      draw(st.integers(max(1, e - lo - hi - 1), max(1, e - lo - hi - 1) + max_size - 1))
      for e, (lo, hi) in zip(effective, pairs, strict=True)
  )
  window_arg = window[0] if ndim == 1 and draw(st.booleans()) else window
  if strides == window and draw(st.booleans()):
    strides_arg = None
  elif len(set(strides)) == 1 and draw(st.booleans()):
    strides_arg = strides[0]
  else:
    strides_arg = strides
  cfg = Config(
      kind=kind, spatial=spatial, window=window, strides=strides, dilation=dilation,
      padding=padding, padding_mode=mode, pairs=pairs, ceil_mode=ceil_mode,
      batch=draw(st.sampled_from([None, 1, 2])), channels=draw(st.integers(1, 3)),
      window_arg=window_arg, strides_arg=strides_arg, seed=draw(st.integers(0, 2**32 - 1)),
  )
  if kind in ("max", "min"):
    cfg = dataclasses.replace(cfg, dtype=draw(st.sampled_from(["float32", "int32"])))
  if kind == "avg":
    cfg = dataclasses.replace(
        cfg, count_include_pad=draw(st.booleans()),
        divisor_override=draw(st.one_of(st.none(), st.integers(1, 9))),
    )
  if kind == "lp":
    cfg = dataclasses.replace(cfg, norm_type=draw(st.sampled_from([1, 2, 3, 1.5, 2.5, 4.0])))
  return cfg


def _predicted_out_shape(cfg: Config) -> tuple[int, ...] | None:
  """The output's spatial shape by the NumPy mirror and our documented rules; None if invalid."""
  if cfg.padding_mode == "SAME" and cfg.ceil_mode:
    return None  # our rule: SAME already rounds up
  out_shape = []
  for length, k, s, d, (lo, hi) in zip(
      cfg.spatial, cfg.window, cfg.strides, cfg.dilation, cfg.pairs, strict=False
  ):
    effective = d * (k - 1) + 1
    if cfg.padding_mode == "SAME":
      lo, hi = reference.same_padding(length, k, s, d)
    elif max(lo, hi) > effective // 2:
      return None  # our rule (PyTorch's pad <= k/2, on the effective window)
    try:
      out = reference.output_size(length, k, s, lo, hi, dilation=d, ceil_mode=cfg.ceil_mode)
    except ValueError:
      return None
    taps = np.arange(out)[:, None] * s - lo + np.arange(k)[None, :] * d
    if not ((taps >= 0) & (taps < length)).any(axis=1).all():
      return None  # our rule: a window of padding only has no value (PyTorch: UB)
    out_shape.append(out)
  return tuple(out_shape)


# ----------------------------------------------------------------------------
# Inputs.
# ----------------------------------------------------------------------------


def _input(cfg: Config, *, positive=False) -> np.ndarray:
  """A batched (N, *spatial, C) input from the config's seed.

  Small integers (many ties) or distinct values, mixed with NaN, -inf and +inf
  (the integer dtype's extremes for int32) in proportions that vary per seed,
  so that windows of ties, of NaN and of the padding value alone all occur.
  """
  rng = np.random.default_rng(cfg.seed)
  shape = (cfg.batch or 1, *cfg.spatial, cfg.channels)
  size = math.prod(shape)
  if positive:  # LP pooling takes x**p without |.|: keep the sums positive (or zero)
    return np.where(rng.random(shape) < 0.1, 0, rng.uniform(0.1, 2.0, shape)).astype(np.float32)
  if rng.random() < 0.3:
    plain = rng.permutation(size).reshape(shape) - size // 2  # distinct
  else:
    plain = rng.integers(-2, 3, shape)  # ties
  weights = np.array([1.0, *rng.choice([0.0, 0.3, 2.0], 3)])
  kinds = rng.choice(4, shape, p=weights / weights.sum())
  if cfg.dtype == "int32":
    info = np.iinfo(np.int32)
    specials = [plain, np.full(shape, 0), np.full(shape, info.min), np.full(shape, info.max)]
    return np.choose(kinds, specials).astype(np.int32)
  specials = [plain / 4, np.full(shape, np.nan), np.full(shape, -np.inf), np.full(shape, np.inf)]
  return np.choose(kinds, specials).astype(np.float32)


def _apply(module, cfg: Config, x: np.ndarray):
  """Calls ``module`` on ``x`` as the config says (unbatched drops N = 1), returns batched."""
  out = module(x if cfg.batch else x[0])
  if cfg.batch:
    return out
  return jax.tree.map(lambda a: a[None], out)


def _jit_apply(cfg: Config, x: np.ndarray, **extra):
  """:func:`_apply` of ``cfg.module(**extra)`` under one ``jax.jit``: one compiled program
  per configuration.

  Examples differ in geometry, so most compile anew; those that differ in their input's
  seed alone (5 of the 40 max/min examples, 1 of 25 avg, 4 of 25 lp) reuse the program.
  Called eagerly, a module also compiles its small layout steps (the batch axis, the index
  flattening) one by one, which cost more than the kernel. Eager calls equal jitted ones
  (test_pool.py::test_pool_eager_equals_jit), and the other test files call eagerly.
  """
  return _jitted(dataclasses.replace(cfg, seed=0), tuple(sorted(extra.items())))(x)


@functools.cache
def _jitted(cfg: Config, extra):
  module = cfg.module(**dict(extra))
  return jax.jit(lambda v: _apply(module, cfg, v))


def _cotangent(cfg: Config, shape) -> np.ndarray:
  """Multiples of 1/4: overlapping windows accumulate exactly in any order."""
  return (np.random.default_rng(cfg.seed + 1).integers(-8, 9, shape) / 4).astype(np.float32)


# ----------------------------------------------------------------------------
# Properties.
# ----------------------------------------------------------------------------


def _mirror_select(cfg: Config, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The NumPy mirror's values and indices: first extremum wins ties, last NaN wins,
  padding never selected."""
  mirror = reference.max_pool if cfg.kind == "max" else reference.min_pool
  return mirror(x, cfg.window, cfg.strides, cfg.mirror_padding, dilation=cfg.dilation,
                ceil_mode=cfg.ceil_mode)


@settings(max_examples=30, **_SETTINGS)
@given(cfg=st.one_of(configs("max"), configs("min")), return_indices=st.booleans())
def test_maxpool_minpool_match_mirror(cfg, return_indices):
  out_shape = _predicted_out_shape(cfg)
  assume(out_shape is not None)
  x = _input(cfg)
  want_values, want_indices = _mirror_select(cfg, x)
  out = _jit_apply(cfg, x, return_indices=return_indices)
  values, indices = out if return_indices else (out, None)
  assert values.shape == (x.shape[0], *out_shape, x.shape[-1])
  assert values.dtype == x.dtype
  np.testing.assert_array_equal(values, want_values)
  if return_indices:
    assert indices.dtype == jnp.int32
    np.testing.assert_array_equal(indices, want_indices)


@settings(max_examples=11, **_SETTINGS)
@given(cfg=st.one_of(configs("max"), configs("min")))
def test_maxpool_minpool_gradient_matches_mirror(cfg):
  cfg = dataclasses.replace(cfg, dtype="float32")
  out_shape = _predicted_out_shape(cfg)
  assume(out_shape is not None)
  x = _input(cfg)
  module = cfg.module()
  g = _cotangent(cfg, (x.shape[0], *out_shape, x.shape[-1]))

  @jax.jit  # the forward pass and its VJP in one compiled program
  def values_and_grad(v, ct):
    values, vjp = jax.vjp(lambda a: _apply(module, cfg, a), v)
    return values, vjp(ct)[0]

  values, grad = values_and_grad(x, g)  # NumPy in: jnp.asarray compiles per shape
  assert values.shape == g.shape
  # NumPy mirror: each output's cotangent lands on the cell its index points at.
  want = reference.max_pool_grad(
      x, g, cfg.window, cfg.strides, cfg.mirror_padding, dilation=cfg.dilation,
      ceil_mode=cfg.ceil_mode, kind=cfg.kind,
  )
  np.testing.assert_array_equal(grad, want)


@settings(max_examples=18, **_SETTINGS)
@given(cfg=configs("avg"))
def test_avgpool_matches_mirror(cfg):
  out_shape = _predicted_out_shape(cfg)
  assume(out_shape is not None)
  x = _input(cfg)
  # NumPy mirror: PyTorch's divisors (padding counted up to the explicit pad, ceil overhang
  # not; real cells with count_include_pad=False; divisor_override as given).
  with np.errstate(invalid="ignore"):  # inf - inf in the mirror's sums is NaN, as in ours
    want = reference.avg_pool(
        x, cfg.window, cfg.strides, cfg.mirror_padding, ceil_mode=cfg.ceil_mode,
        count_include_pad=cfg.count_include_pad, divisor_override=cfg.divisor_override,
    )
  got = _jit_apply(cfg, x)
  assert got.shape == (x.shape[0], *out_shape, x.shape[-1])
  assert got.dtype == x.dtype
  np.testing.assert_allclose(got, want, **_AVG_TOL)


@settings(max_examples=15, **_SETTINGS)
@given(cfg=configs("lp"))
def test_lppool_matches_mirror(cfg):
  out_shape = _predicted_out_shape(cfg)
  assume(out_shape is not None)
  x = _input(cfg, positive=True)
  # NumPy mirror: (avg_pool(x**p) * prod(window)) ** (1/p), as PyTorch computes it.
  want = reference.lp_pool(x, cfg.norm_type, cfg.window, cfg.strides, ceil_mode=cfg.ceil_mode)
  got = _jit_apply(cfg, x)
  assert got.shape == (x.shape[0], *out_shape, x.shape[-1])
  np.testing.assert_allclose(got, want, **_AVG_TOL)


@pytest.mark.slow
@settings(max_examples=8, **_SETTINGS)
@given(cfg=st.one_of(configs("max", separable=True), configs("min", separable=True)))
def test_separable_maxpool_minpool_match_mirror(cfg):
  cfg = dataclasses.replace(cfg, dtype="float32")
  out_shape = _predicted_out_shape(cfg)
  assume(out_shape is not None)
  x = _input(cfg)
  want_values, want_indices = _mirror_select(cfg, x)
  module = cfg.module(return_indices=True)
  g = _cotangent(cfg, (x.shape[0], *out_shape, x.shape[-1]))

  @jax.jit  # the forward pass and its VJP in one compiled program
  def run(v, ct):
    (values, indices), vjp = jax.vjp(lambda a: _apply(module, cfg, a), v)
    (grad,) = vjp((ct, np.zeros(indices.shape, jax.dtypes.float0)))
    return values, indices, grad

  with _separable_over("separable_select", module, cfg):
    values, indices, grad = run(x, g)  # NumPy in: jnp.asarray compiles per shape
  assert values.shape == (x.shape[0], *out_shape, x.shape[-1])
  np.testing.assert_array_equal(values, want_values)
  np.testing.assert_array_equal(indices, want_indices)
  np.testing.assert_array_equal(grad, reference.max_pool_grad(
      x, g, cfg.window, cfg.strides, cfg.mirror_padding, dilation=cfg.dilation,
      ceil_mode=cfg.ceil_mode, kind=cfg.kind))


@pytest.mark.slow
@settings(max_examples=12, **_SETTINGS)
@given(cfg=st.one_of(configs("avg", separable=True), configs("lp", separable=True)))
def test_separable_avgpool_lppool_match_mirror(cfg):
  out_shape = _predicted_out_shape(cfg)
  assume(out_shape is not None)
  x = _input(cfg, positive=cfg.kind == "lp")
  with np.errstate(invalid="ignore"):
    if cfg.kind == "avg":
      want = reference.avg_pool(
          x, cfg.window, cfg.strides, cfg.mirror_padding, ceil_mode=cfg.ceil_mode,
          count_include_pad=cfg.count_include_pad, divisor_override=cfg.divisor_override)
    else:
      want = reference.lp_pool(x, cfg.norm_type, cfg.window, cfg.strides,
                               ceil_mode=cfg.ceil_mode)
  with _separable_over("separable_sum", cfg.module(), cfg):
    got = _jit_apply(cfg, x)
  assert got.shape == (x.shape[0], *out_shape, x.shape[-1])
  np.testing.assert_allclose(got, want, **_AVG_TOL)


def _raised_by_us(excinfo) -> bool:
  """Whether the exception was raised by nnx_pool's own checks, not inside JAX."""
  return _PACKAGE in Path(str(excinfo.traceback[-1].path)).parents


@settings(max_examples=120, **_SETTINGS)
@given(
    cfg=st.one_of(
        configs("max", beyond_half=True), configs("min", beyond_half=True),
        configs("avg", beyond_half=True), configs("lp"),
    ),
    ceil_same=st.booleans(),
)
def test_pool_refuses_invalid_configs(cfg, ceil_same):
  if ceil_same and cfg.padding_mode == "SAME":
    cfg = dataclasses.replace(cfg, ceil_mode=True)
  out_shape = _predicted_out_shape(cfg)
  x = jax.ShapeDtypeStruct(
      ((cfg.batch,) if cfg.batch else ()) + (*cfg.spatial, cfg.channels), jnp.dtype(cfg.dtype)
  )
  if out_shape is None:
    # Invalid by the mirror's output_size or our documented rules: a ValueError from our
    # own checks, at construction or at call time, never an error from inside JAX.
    with pytest.raises(ValueError) as excinfo:
      jax.eval_shape(cfg.module(), x)
    assert _raised_by_us(excinfo), excinfo.getrepr()
  else:
    # Valid: the output shape is the mirror's (traced only, nothing compiles).
    out = jax.eval_shape(cfg.module(), x)
    want = ((cfg.batch,) if cfg.batch else ()) + (*out_shape, cfg.channels)
    assert out.shape == want


_BAD_ARGUMENTS = [
    # (constructor, args, kwargs, exception); expectations: the modules' documented contracts.
    (MaxPool, (0,), {}, ValueError),
    (MaxPool, ((2, 2), (1, 0)), {}, ValueError),
    (MaxPool, ((2, 2), (1, 1, 1)), {}, ValueError),
    (MaxPool, ((2, 2, 2, 2),), {}, ValueError),
    (MaxPool, ((),), {}, ValueError),
    (MaxPool, ((2.0, 2),), {}, TypeError),
    (MaxPool, ("2",), {}, TypeError),
    (MaxPool, (True,), {}, TypeError),
    (MaxPool, (2, 1, "FULL"), {}, ValueError),
    (MaxPool, (2, 1, -1), {}, ValueError),
    (MaxPool, ((3,), 1, ((1, 1), (1, 1))), {}, ValueError),  # 1 dim, 2 pairs
    (MaxPool, (3, 1, ((1, 1, 1),)), {}, TypeError),
    (MaxPool, (3, 1, 1.0), {}, TypeError),
    (MaxPool, (3, 1, 2), {}, ValueError),  # more than half the window
    (MaxPool, (3, 1, "SAME"), {"ceil_mode": True}, ValueError),
    (MaxPool, (3,), {"dilation": 0}, ValueError),
    (MaxPool, (3,), {"ceil_mode": 1}, TypeError),
    (MaxPool, (3,), {"return_indices": None}, TypeError),
    (MinPool, (3,), {"in_features": 0}, ValueError),
    (MinPool, (3,), {"in_features": 2.0}, TypeError),
    (AvgPool, (3,), {"divisor_override": 0}, ValueError),
    (AvgPool, (3,), {"divisor_override": -2}, ValueError),
    (AvgPool, (3,), {"divisor_override": True}, TypeError),
    (AvgPool, (3,), {"divisor_override": 2.5}, TypeError),
    (AvgPool, (3,), {"count_include_pad": "yes"}, TypeError),
    (LPPool, (0, 3), {}, ValueError),
    (LPPool, (-2, 3), {}, ValueError),
    (LPPool, (float("inf"), 3), {}, ValueError),
    (LPPool, (float("nan"), 3), {}, ValueError),
    (LPPool, ("2", 3), {}, TypeError),
    (LPPool, (True, 3), {}, TypeError),
]


@pytest.mark.parametrize(
    "cls, args, kwargs, error", _BAD_ARGUMENTS,
    ids=[f"{c.__name__}-{i}" for i, (c, *_) in enumerate(_BAD_ARGUMENTS)],
)
def test_pool_refuses_bad_arguments(cls, args, kwargs, error):
  with pytest.raises(error) as excinfo:
    cls(*args, **kwargs)
  assert _raised_by_us(excinfo), excinfo.getrepr()


@settings(max_examples=40, **_SETTINGS)
@given(
    kind=st.sampled_from(["max", "min", "avg", "lp"]),
    ndim=st.integers(1, 3),
    rank_offset=st.integers(-1, 3),  # rank = ndim + offset; ndim + 1 or more is valid
    dtype=st.sampled_from(["float32", "int32", "bool", "complex64"]),
)
def test_pool_refuses_bad_inputs(kind, ndim, rank_offset, dtype):
  module = {"max": MaxPool, "min": MinPool, "avg": AvgPool}.get(kind)
  module = module((1,) * ndim) if module else LPPool(2, (1,) * ndim)
  ok_rank = rank_offset >= 1  # (*spatial, C), (N, *spatial, C), or several batch axes
  ok_dtype = dtype == "float32" or (dtype == "int32" and kind in ("max", "min"))
  assume(not (ok_rank and ok_dtype))
  x = jax.ShapeDtypeStruct((2,) * (ndim + rank_offset), jnp.dtype(dtype))
  # Our documented contract: a wrong rank is a ValueError, a wrong dtype a TypeError.
  with pytest.raises((ValueError, TypeError)) as excinfo:
    jax.eval_shape(module, x)
  assert _raised_by_us(excinfo), excinfo.getrepr()
  assert excinfo.type is (TypeError if not ok_dtype else ValueError)
