"""Tests for the generalized global pools, GeM and log-sum-exp (nnx_pool._generalized).

Each expectation says where it comes from: a closed form computed by hand (written
out), the NumPy mirror (``nnx_pool.reference``, float64, independent of the JAX
code), or PyTorch 2.13 CPU running the sources' forward passes written here:
cnnimageretrieval-pytorch ``cirtorch/layers/pooling.py`` ``GeM`` with
``cirtorch/layers/functional.py`` ``gem``, and timm 1.0.31
``timm/layers/other_pool.py`` ``LsePlus2d``. The PyTorch tests skip cleanly when
torch is absent.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_pool import ChannelsFirstWarning, reference
from nnx_pool._generalized import GeMPool, LsePlusPool, gem_pool, lse_plus_pool

_TORCH_REASON = "PyTorch parity needs torch==2.13.0 (the parity extra)"


@nnx.jit
def apply(module, x):
  return module(x)


def _random(shape, seed, low=-1.0, high=2.0):
  return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


# ----------------------------------------------------------------------------
# Hand-computed values.
# ----------------------------------------------------------------------------

# One 2x2 map, two channels: [1, 2, 3, 6] and [-1, 0, 4, 4] (the first two below eps).
_GEM_X = np.array([[1.0, -1.0], [2.0, 0.0], [3.0, 4.0], [6.0, 4.0]], np.float32).reshape(
    1, 2, 2, 2)


@pytest.mark.parametrize(("p", "expected"), [
    # Closed form (sum of max(v, 1e-6)^p / 4)^(1/p), by hand for p = 1, 2, 3: channel 0
    # 12 / 4 = 3; sqrt(50 / 4); cbrt(252 / 4). Channel 1: (8 + 2e-6) / 4; sqrt(32 / 4);
    # cbrt(128 / 4). p = 10 and 40 in float64 Python: the max, 6 and 4, minus a shrinking gap
    # (at p = 40 nearly 6 / 4^(1/40) = 5.7956 and 4 / 2^(1/40) = 3.9313, the max over the
    # count of cells that reach it, to the 1/p). Far above, x^p overflows float32 (6^50 > 3e38)
    # as in PyTorch, so the result is inf.
    (1.0, [3.0, 2.0000005]),
    (2.0, [3.5355339059327378, 2.8284271247462787]),
    (3.0, [3.9790572078963917, 3.1748021039363987]),
    (10.0, [5.223822090482288, 3.73213196614723]),
    (40.0, [5.795617973549206, 3.9312823941810047]),
])
def test_gem_pool_is_the_mean_at_p1_and_tends_to_the_max(p, expected):
  np.testing.assert_allclose(gem_pool(_GEM_X, p), [expected], rtol=2e-7)
  np.testing.assert_allclose(reference.gem_pool(_GEM_X, p), [expected], rtol=2e-7)  # float32 out


def test_gem_pool_module_p1_is_exactly_the_mean():
  # Integer-valued cells: the sum is exact and the division correctly rounded, as PyTorch's.
  # By hand: channel c holds c + 1, c + 5, ..., c + 21, whose mean is c + 11.
  x = np.arange(1.0, 25.0, dtype=np.float32).reshape(1, 2, 3, 4)
  np.testing.assert_array_equal(apply(GeMPool(1.0), x), [[11.0, 12.0, 13.0, 14.0]])


_LSE_X = np.log(np.array([1.0, 1.0, 1.0, 5.0], np.float32)).reshape(1, 2, 2, 1)


@pytest.mark.parametrize(("r", "expected"), [
    # x = log [1, 1, 1, 5]: log(mean(exp(r x))) / r. r = 1 by hand: log(8 / 4) = log 2.
    # Others in float64 Python: toward the mean of x, log(5) / 4 = 0.402359, as r -> 0, and
    # the max, log(5) = 1.609438, as r grows (1.609438 - log(4) / 100 at r = 100).
    (0.1, 0.4272872190082424),
    (1.0, 0.6931471805599453),
    (10.0, 1.4708085070421064),
    (100.0, 1.5955749688229013),
])
def test_lse_plus_pool_between_the_mean_and_the_max(r, expected):
  # The float32 formula (timm's) loses about one float32 ULP of the mean of exponentials
  # divided by r: 6e-8 / 0.1 at r = 0.1, relative 1.4e-6.
  np.testing.assert_allclose(lse_plus_pool(_LSE_X, r), [[expected]], rtol=2e-6)
  # The mirror in float64, on x as float32 holds it (log 5 to 3e-8).
  np.testing.assert_allclose(reference.lse_plus_pool(_LSE_X.astype(np.float64), r),
                             [[expected]], rtol=1e-7)


def test_nan_propagates():
  # PyTorch: clamp(min=eps) keeps NaN, and adaptive_max_pool2d of a plane with NaN is NaN.
  x = np.ones((1, 2, 2, 2), np.float32)
  x[0, 1, 0, 1] = np.nan
  for pool in (gem_pool, lse_plus_pool):
    y = np.asarray(pool(x))
    assert y[0, 0] == 1.0 and np.isnan(y[0, 1]), pool.__name__


# ----------------------------------------------------------------------------
# The NumPy mirror, any spatial rank; several batch axes; bf16.
# ----------------------------------------------------------------------------

_RANKS = {1: (2, 7, 3), 2: (2, 5, 6, 3), 3: (2, 3, 4, 2, 3)}


@functools.cache
def _every_rank():
  """GeMPool(2.5) and LsePlusPool(4.0) on each rank's input of _RANKS (seed: the rank), all
  in one compiled program (a program per rank: 0.48 s of compile CPU, compile census)."""
  xs = {nd: _random(shape, seed=nd) for nd, shape in _RANKS.items()}
  pools = {nd: (GeMPool(2.5, num_spatial_dims=nd), LsePlusPool(4.0, num_spatial_dims=nd))
           for nd in _RANKS}
  return xs, jax.device_get(nnx.jit(lambda pools, xs: {
      nd: (gem(xs[nd]), lse(xs[nd])) for nd, (gem, lse) in pools.items()})(pools, xs))


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_modules_match_the_numpy_mirror(nd):
  xs, got = _every_rank()
  x = xs[nd]
  assert got[nd][0].shape == got[nd][1].shape == (x.shape[0], x.shape[-1])
  np.testing.assert_allclose(got[nd][0], reference.gem_pool(x, 2.5), rtol=2e-6)
  np.testing.assert_allclose(got[nd][1], reference.lse_plus_pool(x, 4.0), rtol=2e-6, atol=1e-7)


def test_several_batch_axes_and_unbatched():
  x = _random((2, 3, 4, 5, 3), seed=4)  # (B1, B2, H, W, C)
  flat = x.reshape(6, 4, 5, 3)
  modules = (GeMPool(), LsePlusPool(), GeMPool(flatten=False), LsePlusPool(flatten=False))
  # All four modules in one program (four programs: 1.25 s, one: 0.84 s; pytest --durations,
  # this file alone on 2 cores).
  outs = nnx.jit(lambda ms, a, b, c: [(m(a), m(b), m(c)) for m in ms])(modules, x, flat, x[0, 0])
  for module, (y, y_flat, y_one) in zip(modules, outs, strict=True):
    assert y.shape == (2, 3, 3) if module.flatten else (2, 3, 1, 1, 3)
    np.testing.assert_array_equal(y, np.asarray(y_flat).reshape(y.shape))
    np.testing.assert_array_equal(y_one, np.asarray(y_flat)[0])  # unbatched (H, W, C)


_HALVES = [jnp.bfloat16, jnp.float16]


@functools.cache
def _in_half_precision():
  """GeMPool() and LsePlusPool() on one input (seed 5) in each dtype of _HALVES, rounded by
  NumPy, and the outputs, from one compiled program (a program per dtype: 0.28 s of compile
  CPU, compile census)."""
  xs = [_random((2, 5, 6, 4), seed=5, low=0.1).astype(dtype) for dtype in _HALVES]
  outs = jax.device_get(jax.jit(lambda xs: [(GeMPool()(x), LsePlusPool()(x)) for x in xs])(xs))
  return dict(zip(_HALVES, zip(xs, outs, strict=True), strict=True))


@pytest.mark.parametrize("dtype", _HALVES)
def test_half_precision_keeps_its_dtype(dtype):
  # Computed in float32 and rounded once: the float64 mirror rounded to the dtype, within
  # one ULP (the float32 computation may round the other way near a boundary).
  x, (gem, lse) = _in_half_precision()[dtype]
  x64 = np.asarray(x, np.float64)
  eps = float(jnp.finfo(dtype).eps)
  for got, want in ((gem, reference.gem_pool(x64, 3.0)), (lse, reference.lse_plus_pool(x64))):
    assert got.dtype == dtype
    np.testing.assert_allclose(np.asarray(got, np.float64),
                               np.asarray(want).astype(dtype).astype(np.float64), rtol=eps)


# ----------------------------------------------------------------------------
# jit, vmap and grad; learnable or not.
# ----------------------------------------------------------------------------


def test_jit_vmap_and_grad():
  x = _random((3, 4, 4, 2), seed=6, low=0.5)
  eager = gem_pool(x, 2.0)
  # Under an outer jit p = 2 is a constant, which XLA may fold into x * x: one ULP apart.
  np.testing.assert_allclose(jax.jit(lambda x: gem_pool(x, 2.0))(x), eager, rtol=2.4e-7)
  # vmap over the batch of unbatched (H, W, C) maps.

  @jax.jit  # the rest in one program (eager: each op and its derivative compiled alone)
  def run(x):
    return (jax.vmap(lambda v: gem_pool(v, 2.0))(x),
            jax.grad(lambda x: jnp.sum(gem_pool(x, 2.0)))(x),
            jax.grad(lambda p: jnp.sum(gem_pool(x, p)))(jnp.float32(1.0)),
            gem_pool(x, nnx.Param(jnp.ones(1))), gem_pool(x, 1.0))

  mapped, grad, dp, with_param, with_one = run(x)
  np.testing.assert_allclose(mapped, eager, rtol=1e-6)
  # d/dx of the root mean square of a plane, sqrt(mean(x^2)): x / (n * rms), by hand.
  rms = np.sqrt((x.astype(np.float64) ** 2).mean(axis=(1, 2), keepdims=True))
  np.testing.assert_allclose(grad, x / (16 * rms), rtol=1e-5)
  # p as a traced array (a user's own parameter): d/dp at p = 1 of (mean x^p)^(1/p) is
  # m (mean(x log x) / m - log m) for m = mean(x) (the derivative of the power mean).
  # An nnx.Param of one element is read as its value (a user's own learnable p).
  np.testing.assert_array_equal(with_param, with_one)
  x64 = x.astype(np.float64)
  m = x64.mean(axis=(1, 2))
  expected = np.sum(m * ((x64 * np.log(x64)).mean(axis=(1, 2)) / m - np.log(m)))
  np.testing.assert_allclose(dp, expected, rtol=1e-5)


def test_a_python_exponent_does_not_widen_float32_under_x64():
  # A Python p is weakly typed: with jax_enable_x64 a float32 map is still raised to the
  # power in float32 (it was float64: the literal widened the computation).
  enable_x64 = getattr(jax, "enable_x64", None)
  if enable_x64 is None:
    pytest.skip("this jax has no jax.enable_x64 context manager")
  with enable_x64(True):
    text = str(jax.make_jaxpr(lambda x: gem_pool(x, 3.0))(np.ones((1, 2, 2, 1), np.float32)))
  powers = [line.split("=")[0] for line in text.splitlines() if " pow " in line]
  assert powers and all(":f32[" in power for power in powers), text


def test_learnable_false_is_a_fixed_variable():
  x = _random((2, 3, 3, 2), seed=7)
  pairs = ((GeMPool(learnable=False), GeMPool()), (LsePlusPool(learnable=False), LsePlusPool()))

  @nnx.jit  # both pairs in one program (eager, nnx.grad compiled each op alone)
  def run(pairs, x):
    return [(nnx.grad(lambda m, x: jnp.sum(m(x)))(fixed, x), fixed(x), learnable(x))
            for fixed, learnable in pairs]

  for (fixed, _), (grads, y_fixed, y_learnable) in zip(pairs, run(pairs, x), strict=True):
    assert nnx.state(fixed, nnx.Param) == nnx.State({})
    assert jax.tree.leaves(grads) == []
    np.testing.assert_array_equal(y_fixed, y_learnable)


# ----------------------------------------------------------------------------
# PyTorch 2.13 parity: values and gradients, state dicts both ways.
# ----------------------------------------------------------------------------


def _torch_modules(torch):
  nn, F = torch.nn, torch.nn.functional

  class GeM(nn.Module):
    # cnnimageretrieval-pytorch cirtorch/layers/pooling.py GeM and functional.py gem.
    def __init__(self, p=3, eps=1e-6):
      super().__init__()
      self.p = nn.Parameter(torch.ones(1) * p)
      self.eps = eps

    def forward(self, x):
      return F.avg_pool2d(x.clamp(min=self.eps).pow(self.p), (x.size(-2), x.size(-1))).pow(
          1. / self.p)

  class LsePlus2d(nn.Module):
    # timm 1.0.31 timm/layers/other_pool.py LsePlus2d (device/dtype left out).
    def __init__(self, r=10.0, r_learnable=True, flatten=True):
      super().__init__()
      if r_learnable:
        self.r = nn.Parameter(torch.tensor(r))
      else:
        self.register_buffer('r', torch.tensor(r))
      self.flatten = flatten

    def forward(self, x):
      x_max = F.adaptive_max_pool2d(x, 1)
      exp_x = torch.exp(self.r * (x - x_max))
      sum_exp = exp_x.mean(dim=(2, 3), keepdim=True)
      out = x_max + (1.0 / self.r) * torch.log(sum_exp)
      if self.flatten:
        out = out.flatten(1)
      return out

  return GeM, LsePlus2d


def _ours_with_grads(module, x, g):
  def loss(module, x):
    y = module(x)
    return jnp.sum(y * g), y

  # Values and gradients in one program.
  (grad_module, grad_x), y = nnx.jit(nnx.grad(loss, argnums=(0, 1), has_aux=True))(module, x)
  return y, grad_x, grad_module


@pytest.mark.parametrize("direction", ["torch to ours", "ours to torch"])
@pytest.mark.parametrize("kind", ["gem", "lse"])
def test_matches_pytorch_values_and_gradients(kind, direction):
  torch = pytest.importorskip("torch", reason=_TORCH_REASON)
  GeM, LsePlus2d = _torch_modules(torch)
  x = _random((2, 5, 6, 3), seed=8)  # negatives and values below eps for GeM's clamp
  g = _random((2, 3), seed=9)
  name, ours_cls, theirs = (("p", GeMPool, GeM(p=2.5)) if kind == "gem"
                            else ("r", LsePlusPool, LsePlus2d(r=3.0)))
  if direction == "torch to ours":
    ours = ours_cls.from_torch(theirs.state_dict())
  else:
    ours = ours_cls(1.7)
    theirs.load_state_dict({name: torch.tensor(np.asarray(getattr(ours, name)[...]))})
  y, grad_x, grad_module = _ours_with_grads(ours, x, g)
  xt = torch.tensor(np.moveaxis(x, -1, 1), requires_grad=True)
  yt = theirs(xt).reshape(2, 3)
  yt.backward(torch.tensor(g))
  np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grad_x, np.moveaxis(xt.grad.numpy(), 1, -1), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(getattr(grad_module, name)[...], getattr(theirs, name).grad.numpy(),
                             rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------
# Errors and the layout guard.
# ----------------------------------------------------------------------------


def test_channels_first_inputs_are_named():
  with pytest.raises(ValueError, match=re.escape(
      "GeMPool: `inputs` must be channels-last with in_features=3 on the last axis; got shape "
      "(2, 3, 16, 16). It looks channels-first (NCHW: 3 on axis 1); use "
      "jnp.moveaxis(x, 1, -1).")):
    GeMPool(in_features=3)(np.ones((2, 3, 16, 16), np.float32))
  # The warning is given while tracing: traced alone (jax.eval_shape), nothing compiled.
  with pytest.warns(ChannelsFirstWarning, match="lse_plus_pool: `inputs` of shape"):
    jax.eval_shape(lse_plus_pool, jax.ShapeDtypeStruct((2, 3, 16, 16), jnp.float32))


_ERRORS = [
    (lambda: GeMPool(0.0), ValueError, "`p` must be a positive finite number; got 0.0."),
    (lambda: GeMPool("3"), TypeError, "`p` must be a positive finite number; got '3'."),
    (lambda: GeMPool(eps=-1e-6), ValueError,
     "`eps` must be a positive finite number; got -1e-06."),
    (lambda: GeMPool(learnable=1), TypeError, "`learnable` must be a bool; got 1."),
    (lambda: LsePlusPool(flatten=None), TypeError, "`flatten` must be a bool; got None."),
    (lambda: LsePlusPool(-1.0), ValueError, "`r` must be a positive finite number; got -1.0."),
    (lambda: LsePlusPool(param_dtype=jnp.int32), TypeError,
     "`param_dtype` must be a floating dtype such as jnp.float32; got <class "
     "'jax.numpy.int32'>."),
    (lambda: LsePlusPool(r_learnable=False), TypeError,  # timm LsePlus2d's name
     "LsePlusPool takes `learnable` (nnx-pool's name), not `r_learnable` (timm's): write "
     "learnable=... instead."),
    (lambda: GeMPool(pool=1), TypeError,
     "GeMPool got an unexpected keyword argument `pool`; GeMPool takes (p, *, eps, "
     "learnable, flatten, num_spatial_dims, in_features, param_dtype)."),
    (lambda: gem_pool(np.ones((1, 2, 2, 1), np.float32), np.ones(2, np.float32)), TypeError,
     "`p` must be a positive number or a floating array of one element (shape () or (1,)); got "
     "an array of shape (2,) and dtype float32."),
    (lambda: lse_plus_pool(np.ones((1, 2, 2, 1), np.int32)), TypeError,
     "lse_plus_pool: `inputs` has dtype int32, but this pooling needs a floating dtype; cast it "
     "first, e.g. x.astype(jnp.float32)."),
    (lambda: gem_pool(np.ones((1, 0, 2, 1), np.float32)), ValueError,
     "gem_pool: `inputs` needs non-empty spatial dims (there is nothing to pool); got spatial "
     "shape (0, 2) in shape (1, 0, 2, 1)."),
    (lambda: GeMPool.from_torch({"p": np.float32(3.0)}), ValueError,
     "GeMPool.from_torch: `p` has shape (); expected (1,)."),
    (lambda: LsePlusPool.from_torch({"p": np.ones(1, np.float32)}), ValueError,
     "LsePlusPool.from_torch: unexpected state-dict keys. Expected one of: r. Received: p. Strip "
     "any parent prefix first, e.g. {k.removeprefix('se.'): v for k, v in sd.items() if "
     "k.startswith('se.')}."),
    (lambda: GeMPool.from_torch({"p": np.ones(1, np.float32)}, rngs=nnx.Rngs(0)), TypeError,
     "GeMPool.from_torch: do not pass rngs; sizes come from the weights and no initialiser "
     "runs."),
    # Issue 30: the constructor's checks hold for loaded values (p = 0 pooled to all 1.0).
    (lambda: GeMPool.from_torch({"p": np.zeros(1, np.float32)}), ValueError,
     "GeMPool.from_torch: `p` must be a positive finite number; got 0.0."),
    (lambda: LsePlusPool.from_torch({"r": np.float32(-2.0)}), ValueError,
     "LsePlusPool.from_torch: `r` must be a positive finite number; got -2.0."),
    (lambda: GeMPool.from_torch({"p": np.ones(1, np.float32)}, p=3.0), TypeError,
     "GeMPool.from_torch: do not pass p; sizes come from the weights and no initialiser runs."),
]


@pytest.mark.parametrize("i", range(len(_ERRORS)))
def test_errors(i):
  call, error, message = _ERRORS[i]
  with pytest.raises(error, match=f"^{re.escape(message)}$"):
    call()


def test_from_torch_options_and_fixed_r():
  # timm's r_learnable=False keeps r in the state dict as a buffer: learnable=False loads it.
  lse = LsePlusPool.from_torch({"r": np.float32(2.5)}, learnable=False, flatten=False)
  assert type(lse.r) is nnx.Variable and lse.flatten is False
  np.testing.assert_array_equal(lse.r[...], np.float32(2.5))
  gem = GeMPool.from_torch({"p": np.array([4.0], np.float32)}, eps=1e-3)
  assert gem.eps == 1e-3 and isinstance(gem.p, nnx.Param)
  np.testing.assert_array_equal(gem.p[...], [4.0])
