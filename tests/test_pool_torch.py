"""Parity of AvgPool, MaxPool, MinPool and LPPool with PyTorch 2.13 CPU.

Every expectation in this file is what ``torch.nn.functional`` (2.13.0, CPU)
computes on the same input, laid out channels-first. Configurations are drawn
from a seeded generator (so the sweep is the same on every run) and keep only
what PyTorch accepts: ``pad <= kernel // 2`` and at least one output per dim
(``aten/src/ATen/native/Pool.h``). Three corners PyTorch accepts are kept out
of the sweep and get their own tests below: a ceil-mode window longer than the
padded input (ours refuses it), a dilated window of padding only (PyTorch reads
out of bounds), and avg_pool3d on an input smaller than the kernel (PyTorch
refuses it in 3-D only).

Compiling is what costs time here, not running, so each test traces all of its
configurations into one ``jax.jit`` program (one XLA compile per test), and
every configuration pools one batch of four inputs that share a shape:

* 0: distinct values (a random permutation), so max/min gradients are exact;
* 1: small integers with many ties (the first extremum wins);
* 2: ties and NaN (NaN propagates, the last NaN in the window wins);
* 3: mostly -inf and +inf (windows full of -inf next to padding).

Unbatched configurations fold those four inputs into the channel axis. Both
PyTorch memory formats are checked: contiguous, and the channels-last view
``torch.from_numpy(x_nhwc).permute(0, 3, 1, 2)`` (channels_last_3d in 3-D).
Max, min, indices and max/min gradients must match exactly (cotangents are
multiples of 1/4, so accumulation order cannot matter); averages, their
gradients and LP pools within rtol = atol = 1e-6. The number of configurations
per test is in its id (``KEEP`` below).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest

from nnx_pool import AvgPool, LPPool, MaxPool, MinPool

torch = pytest.importorskip(
    "torch", reason="PyTorch parity tests need torch==2.13.0 (pip install -e '.[parity]')"
)
F = torch.nn.functional

_TOL = dict(rtol=1e-6, atol=1e-6)
_N, _C = 4, 2  # the four input kinds above, two channels each

# The sweeps draw random channels-last shapes; some look channels-first, by design.
pytestmark = pytest.mark.filterwarnings("ignore::nnx_pool.ChannelsFirstWarning")


# ----------------------------------------------------------------------------
# Configurations.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
  """One pooling configuration, as our module takes it and as PyTorch takes it."""

  spatial: tuple[int, ...]
  window: object  # as passed to our module: an int (repeated over ndim) or a tuple
  strides: object  # as passed to our module: None, an int or a tuple
  padding: object  # as passed to our module: "VALID", "same", an int, a tuple, pairs
  kernel: tuple[int, ...]  # PyTorch's kernel_size
  stride: tuple[int, ...]  # PyTorch's stride
  pad: tuple[int, ...]  # PyTorch's symmetric padding
  dilation: tuple[int, ...]
  ceil_mode: bool
  batched: bool
  dtype: str = "float32"
  return_indices: bool = True
  count_include_pad: bool = True
  divisor_override: int | None = None
  norm_type: float | None = None
  grad: bool = False  # also compare the gradient (float32 only)

  @property
  def ndim(self) -> int:
    return len(self.spatial)

  def select_kwargs(self) -> dict:
    return dict(
        dilation=self.dilation if len(set(self.dilation)) > 1 else self.dilation[0],
        ceil_mode=self.ceil_mode, return_indices=self.return_indices,
    )

  def avg_kwargs(self) -> dict:
    return dict(
        ceil_mode=self.ceil_mode, count_include_pad=self.count_include_pad,
        divisor_override=self.divisor_override,
    )


def _torch_out(length, k, s, p, d, ceil_mode) -> int:
  """PyTorch's pooling_output_shape (Pool.h), floor division rounding down."""
  out = (length + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
  if ceil_mode and (out - 1) * s >= length + p:
    out -= 1
  return out


def _every_window_has_a_cell(length, k, s, p, d, ceil_mode) -> bool:
  out = _torch_out(length, k, s, p, d, ceil_mode)
  taps = np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d
  return bool(((taps >= 0) & (taps < length)).any(axis=1).all())


def _same_pads(length, k, s, d) -> tuple[int, int]:
  """lax/Flax SAME padding of one dim (lax.padtype_to_pads), on the dilated window."""
  e = d * (k - 1) + 1
  out = -(-length // s)
  total = max((out - 1) * s + e - length, 0)
  return total // 2, total - total // 2


def _padding_form(rng, pad: tuple[int, ...]):
  """One of the spellings our modules accept for a symmetric padding."""
  forms = ["tuple", "pairs"]
  if len(set(pad)) == 1:
    forms.append("int")
  if not any(pad):
    forms += ["VALID", "valid"]
  form = forms[rng.integers(len(forms))]
  if form == "tuple":
    return tuple(pad)
  if form == "pairs":
    return tuple((p, p) for p in pad)
  if form == "int":
    return pad[0]
  return form


def _draw(
    rng, ndim, *, max_size, max_window, max_taps, dilation=False, same=True,
    explicit_padding=True,
) -> Config | None:
  """Draws one configuration; None when PyTorch would refuse it."""
  spatial = tuple(int(v) for v in rng.integers(1, max_size + 1, ndim))
  kernel = tuple(int(v) for v in rng.integers(1, max_window + 1, ndim))
  if math.prod(kernel) > max_taps:
    return None
  stride = tuple(int(rng.integers(1, min(k + 1, 3) + 1)) for k in kernel)  # <= k + 1, 3
  dil = (1,) * ndim
  if dilation and rng.random() < 0.4:
    dil = tuple(int(v) for v in rng.integers(1, 4, ndim))
  ceil_mode = bool(rng.random() < 0.5)
  if same and rng.random() < 0.15:
    # "SAME" where it is symmetric and within PyTorch's limit: PyTorch can express it.
    pairs = [_same_pads(n, k, s, d)
             for n, k, s, d in zip(spatial, kernel, stride, dil, strict=True)]
    if any(lo != hi or lo > k // 2 for (lo, hi), k in zip(pairs, kernel, strict=True)):
      return None
    pad = tuple(lo for lo, _ in pairs)
    padding = "SAME" if rng.random() < 0.5 else "same"
    ceil_mode = False  # our modules refuse SAME with ceil_mode
  elif explicit_padding and rng.random() < 0.7:
    pad = tuple(int(rng.integers(0, k // 2 + 1)) for k in kernel)
    padding = _padding_form(rng, pad)
  else:
    pad = (0,) * ndim
    padding = "VALID" if explicit_padding else None
  dims = zip(spatial, kernel, stride, pad, dil, strict=True)
  if any(_torch_out(*args, ceil_mode) < 1 for args in dims):
    return None
  dims = zip(spatial, kernel, stride, pad, dil, strict=True)
  if not all(_every_window_has_a_cell(*dim, ceil_mode) for dim in dims):
    # PyTorch 2.13 does not refuse a dilated window that lies wholly in the padding: it
    # returns -inf at an index past the input, and its backward corrupts the heap. Ours
    # raises ValueError instead (see test_maxpool_refuses_window_of_padding_only).
    return None
  # Our spellings of window and strides: an int for 1-D now and then; strides None = window.
  window = kernel[0] if ndim == 1 and rng.random() < 0.5 else kernel
  if stride == kernel and rng.random() < 0.5:
    strides = None
  elif len(set(stride)) == 1 and rng.random() < 0.3:
    strides = stride[0]
  else:
    strides = stride
  return Config(
      spatial, window, strides, padding, kernel, stride, pad, dil, ceil_mode,
      batched=bool(rng.random() < 0.85),
  )


def _configs(
    seed, count, ndim, accept=lambda cfg: True, **kwargs
) -> tuple[list[Config], np.random.Generator]:
  rng = np.random.default_rng(seed)
  out = []
  while len(out) < count:
    cfg = _draw(rng, ndim, **kwargs)
    if cfg is not None and accept(cfg):
      out.append(cfg)
  return out, rng


_SIZES = {1: dict(max_size=12, max_window=5, max_taps=5),
          2: dict(max_size=8, max_window=3, max_taps=9),
          3: dict(max_size=5, max_window=3, max_taps=8)}

# Which configurations each test checks: their count is in the test ids. Each sweep draws
# as many as it always did (DRAWN: the same seeds give the same configurations and the same
# inputs); the first PREFIX of them show every feature the whole draw shows (each padding
# spelling and SAME, ceil mode, dilation, int32, gradient, indices, unbatched, strides past
# the window, one-tap windows, windows as long as the input, one-output dims, ceil mode's
# extra window, divisor_override, count_include_pad and each norm type, and their pairings),
# and KEEP below picks from them. Compiling grows with the number of configurations checked.
# MinPool runs MaxPool's kernels with the other comparison and fill value (PyTorch's min is
# -max_pool(-x)), so the geometry and the spellings of padding, window and strides that the
# max sweep pins at every rank are not re-tested through it: its prefix is the first
# configurations that show what min does on its own at each rank, and its KEEP covers those
# features alone (float32 and int32, padding, SAME, ceil mode and its extra window, dilation,
# overlap, strides past the window, gradient, indices or not, unbatched, windows starting in
# padding, and their pairings: int32 with padding, ceil mode and no indices, ceil mode with
# padding, the gradient with dilation, ceil mode, padding, unbatched and windows starting in
# padding, indices with windows starting in padding), 36 -> 15 configurations.
DRAWN = {"max": {1: 40, 2: 60, 3: 24}, "min": {1: 20, 2: 30, 3: 12},
         "avg": {1: 30, 2: 60, 3: 24}, "lp": {1: 15, 2: 20, 3: 12}}
# Of those, the sweeps check the configurations below (indices into the first PREFIX of each
# draw, the ones checked until now): a smallest set, picked greedily, that still shows every
# feature and pairing that the whole prefix shows. Features: each padding spelling and SAME,
# padded, ceil mode and ceil mode's extra window, dilation (mixed too), int32, gradient,
# indices or not, unbatched, overlapping windows, strides past the window, one-tap windows,
# windows as long as the input, one-output dims, the strides and window spellings,
# divisor_override, count_include_pad and each norm type; the kernel paths they take (the
# gradient box by box where windows start in padding and none reaches past the end, windows
# starting in padding, over 9 taps, values only over 9 taps); and pairings: ceil mode with
# padding, the extra window with padding, dilation and overlap, dilation with padding, the
# gradient with dilation, ceil mode, the extra window, unbatched, padding, overlap, SAME,
# boxes, over 9 taps and count_include_pad False or divisor_override, indices with dilation,
# padding, the extra window, unbatched, over 9 taps and windows starting in padding, int32
# with ceil mode, padding, dilation, overlap and no indices, count_include_pad either way and
# divisor_override with padding and the extra window, one output and strides past the
# window with ceil mode. Each configuration left out shows only features that a kept one
# shows too. The spellings of padding, strides and window are read by one parser for every
# pool (nnx_pool._geometry.Window.create), pinned by the max sweep at every rank: the avg, lp
# and min sweeps' KEEP cover their other features. (Listed with a script over those
# features; the inputs are drawn for every configuration of the prefix, so a kept one pools
# the same input as before.) The 231 configurations compiled in the sweeps' programs took
# 11.6 s of CPU, these 75 take 4.9 s (pytest tests/test_pool_torch.py -p
# tools.compile_census, 2 cores).
PREFIX = {"max": {1: 20, 2: 30, 3: 18}, "min": {1: 10, 2: 17, 3: 9},
          "avg": {1: 30, 2: 42, 3: 18}, "lp": {1: 15, 2: 14, 3: 8}}
KEEP = {
    "max": {1: [0, 1, 9, 10, 12, 13, 16, 18], 2: [1, 6, 12, 17, 20, 21, 24, 28],
            3: [1, 2, 4, 6, 7, 10, 11, 15, 17]},
    "min": {1: [2, 3, 4, 6, 8, 9], 2: [4, 5, 8, 11, 16], 3: [0, 1, 7, 8]},
    "avg": {1: [2, 3, 4, 10, 12, 22, 28], 2: [0, 13, 16, 31, 34, 36], 3: [0, 1, 2, 9, 17]},
    "lp": {1: [2, 3, 8, 10, 13, 14], 2: [0, 1, 3, 4, 7, 13], 3: [0, 1, 4, 5, 6]},
}


def _select_configs(seed, ndim, count) -> list[Config]:
  configs, rng = _configs(seed, count, ndim, dilation=True, **_SIZES[ndim])
  out = []
  for c in configs:
    dtype = "int32" if rng.random() < 0.2 else "float32"
    # A gradient doubles the compile time of a configuration: take it for half of them.
    grad = dtype == "float32" and rng.random() < 0.5
    out.append(dataclasses.replace(
        c, dtype=dtype, grad=grad, return_indices=bool(rng.random() < 0.8)
    ))
  return out


def _avg_configs(seed, ndim, count) -> list[Config]:
  # PyTorch's avg_pool3d (only) refuses an input smaller than the kernel before padding:
  # "input image (T: 5 H: 4 W: 2) smaller than kernel size". Ours pools it like 1-D and 2-D.
  configs, rng = _configs(
      seed, count, ndim, accept=lambda c: ndim < 3 or min(np.subtract(c.spatial, c.kernel)) >= 0,
      **_SIZES[ndim],
  )
  out = []
  for c in configs:
    override = None
    if ndim > 1 and rng.random() < 0.25:  # AvgPool1d has no divisor_override
      override = int(rng.integers(1, 10))
    out.append(dataclasses.replace(
        c, count_include_pad=bool(rng.random() < 0.5), divisor_override=override,
        grad=bool(rng.random() < 0.5),
    ))
  return out


def _lp_configs(seed, ndim, count) -> list[Config]:
  configs, rng = _configs(seed, count, ndim, same=False, explicit_padding=False, **_SIZES[ndim])
  norms = [1, 2, 3, 1.5, 2.5, 4.0]
  return [dataclasses.replace(c, norm_type=norms[rng.integers(len(norms))]) for c in configs]


# ----------------------------------------------------------------------------
# Inputs and layouts.
# ----------------------------------------------------------------------------


def _inputs(rng, cfg: Config, *, positive=False) -> np.ndarray:
  """The batch of four input kinds, (4, *spatial, 2) channels-last."""
  shape = (_C, *cfg.spatial)
  size = math.prod(shape)
  if cfg.dtype == "int32":
    info = np.iinfo(np.int32)
    kinds = [
        rng.permutation(size).reshape(shape) - size // 2,
        rng.integers(-2, 3, shape),
        # Extremes; no int32 min, so that MinPool's check through ~x stays exact.
        rng.choice([info.min + 1, -1, 0, info.max], shape),
        rng.integers(-1, 2, shape),
    ]
    x = np.stack(kinds).astype(np.int32)
  elif positive:
    x = rng.uniform(0.25, 2.0, (_N, *shape)).astype(np.float32)
  else:
    ties = rng.integers(-2, 3, shape).astype(np.float32)
    kinds = [
        ((rng.permutation(size) - size / 2) / 8).reshape(shape),
        rng.integers(-2, 3, shape),
        np.where(rng.random(shape) < 0.3, np.nan, ties),
        rng.choice([-np.inf, np.inf, -1.0, 0.5], shape, p=[0.45, 0.25, 0.15, 0.15]),
    ]
    x = np.stack(kinds).astype(np.float32)
  return np.ascontiguousarray(np.moveaxis(x, 1, -1))  # (N, *spatial, C)


def _fold(a: np.ndarray, batched: bool) -> np.ndarray:
  """Our module's input for a config: the batch, or the batch folded into channels."""
  if batched:
    return a
  return np.ascontiguousarray(np.moveaxis(a, 0, -2).reshape(*a.shape[1:-1], -1))


def _unfold(a: np.ndarray, batched: bool) -> np.ndarray:
  """The inverse of :func:`_fold` on an output."""
  a = np.asarray(a)
  if batched:
    return a
  return np.moveaxis(a.reshape(*a.shape[:-1], _N, -1), -2, 0)


def _to_torch(a: np.ndarray, batched: bool, contiguous: bool):
  """PyTorch's channels-first view of a channels-last array: channels_last strides or contiguous."""
  t = torch.from_numpy(_fold(a, batched)).movedim(-1, 1 if batched else 0)
  return t.contiguous() if contiguous else t


def _from_torch(t, batched: bool) -> np.ndarray:
  return _unfold(t.detach().movedim(1 if batched else 0, -1).numpy(), batched)


def _cotangent(rng, shape) -> np.ndarray:
  # Multiples of 1/4: sums of overlapping windows are exact in any order.
  return (rng.integers(-8, 9, shape) / 4).astype(np.float32)


def _jit_all(fns, args):
  """Runs ``fns[i](*args[i])`` for every configuration in one jitted program."""
  return jax.device_get(jax.jit(lambda args: [f(*a) for f, a in zip(fns, args, strict=True)])(args))


def _compare(failures, cfg, what, ours, theirs, exact):
  try:
    if exact:
      np.testing.assert_array_equal(ours, theirs)
    else:
      np.testing.assert_allclose(ours, theirs, **_TOL)
  except AssertionError as err:
    failures.append(f"{cfg} [{what}]: {str(err).strip()}")


def _report(failures, count, name):
  assert not failures, (
      f"{len(failures)} mismatches with PyTorch 2.13 over {count} {name} configurations:\n"
      + "\n\n".join(failures[:8])
  )


def _ids(kind):
  return [f"{nd}d-{len(KEEP[kind][nd])}configs" for nd in (1, 2, 3)]


# ----------------------------------------------------------------------------
# Max and min pooling: values, indices, gradients.
# ----------------------------------------------------------------------------

_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def _torch_select(cfg: Config, x: np.ndarray, g: np.ndarray | None, kind: str, contiguous: bool):
  """PyTorch's max pool (min: through an order-reversing map), values, indices, grad."""
  t = _to_torch(x, cfg.batched, contiguous)
  if kind == "min":
    # -x for floats (NaN stays NaN); ~x = -x - 1 for integers, which cannot overflow.
    t = ~t if cfg.dtype == "int32" else -t
  t = t.detach().requires_grad_(g is not None)
  values, indices = _MAX_POOL[cfg.ndim](
      t, cfg.kernel, cfg.stride, cfg.pad, cfg.dilation, cfg.ceil_mode, return_indices=True
  )
  grad = None
  if g is not None:
    values.backward(_to_torch(g, cfg.batched, contiguous))
    # For min, d(-max_pool(-x))/dx is max_pool's gradient at -x: the two signs cancel.
    grad = _from_torch(t.grad, cfg.batched)
  if kind == "min":
    values = ~values if cfg.dtype == "int32" else -values
  return _from_torch(values, cfg.batched), _from_torch(indices, cfg.batched), grad


def _ours_select(module, with_grad):
  def run(x, g):
    if not with_grad:
      out = module(x)
      return (out, None, None) if not module.return_indices else (*out, None)

    def f(x):
      out = module(x)
      return (out[0], out[1]) if module.return_indices else (out, None)

    values, vjp, indices = jax.vjp(f, x, has_aux=True)
    (grad,) = vjp(g)
    return values, indices, grad

  return run


def _check_select(kind, ndim, seed, configs):
  cls = MaxPool if kind == "max" else MinPool
  rng = np.random.default_rng(seed)
  cases, fns, args = [], [], []
  for i, cfg in enumerate(configs):
    x = _inputs(rng, cfg)
    ref = _torch_select(cfg, x, None, kind, contiguous=True)
    g = _cotangent(rng, ref[0].shape) if cfg.grad else None
    if i not in KEEP[kind][ndim]:
      continue  # drawn all the same: the kept configurations' inputs stay as they were
    ref = _torch_select(cfg, x, g, kind, contiguous=True)
    # The other memory format (channels_last / channels_last_3d strides) must agree too.
    ref_cl = _torch_select(cfg, x, g, kind, contiguous=False)
    module = cls(cfg.window, cfg.strides, cfg.padding, num_spatial_dims=cfg.ndim,
                 **cfg.select_kwargs())
    cases.append((cfg, ref, ref_cl))
    fns.append(_ours_select(module, cfg.grad))
    args.append((_fold(x, cfg.batched), None if g is None else _fold(g, cfg.batched)))
  results = _jit_all(fns, args)
  failures = []
  for (cfg, ref, ref_cl), (values, indices, grad) in zip(cases, results, strict=True):
    # PyTorch 2.13's channels_last_3d max_pool3d drops the depth term, (d*H + h)*W + w, from
    # the index of a window whose max is the start value (-inf, or int32 min) when C is not
    # a multiple of the vector width (see
    # test_maxpool_3d_all_neg_inf_window_index_like_torch_contiguous). So against
    # channels_last_3d, skip the inputs that can have such windows.
    keep_cl = slice(None) if ndim < 3 else slice(0, 3 if cfg.dtype == "float32" else 2)
    for label, refs, keep in (("contiguous", ref, slice(None)), ("channels_last", ref_cl, keep_cl)):
      t_values, t_indices, t_grad = refs
      ours = _unfold(values, cfg.batched)[keep]
      _compare(failures, cfg, f"{label} values", ours, t_values[keep], True)
      if cfg.return_indices:
        assert indices.dtype == np.int32
        ours = _unfold(indices, cfg.batched)[keep]
        _compare(failures, cfg, f"{label} indices", ours, t_indices[keep], True)
      if t_grad is not None:
        ours = _unfold(grad, cfg.batched)[keep]
        _compare(failures, cfg, f"{label} grad", ours, t_grad[keep], True)
  _report(failures, len(cases), f"{cls.__name__}")


@pytest.mark.parametrize("ndim", [1, 2, 3], ids=_ids("max"))
def test_maxpool_matches_torch(ndim):
  # PyTorch 2.13 CPU F.max_pool{1,2,3}d(return_indices=True) and its autograd.
  configs = _select_configs(100 + ndim, ndim, DRAWN["max"][ndim])[:PREFIX["max"][ndim]]
  _check_select("max", ndim, 200 + ndim, configs)


@pytest.mark.parametrize("ndim", [1, 2, 3], ids=_ids("min"))
def test_minpool_matches_torch_negated_maxpool(ndim):
  # PyTorch 2.13 CPU: min pool = -max_pool(-x) (floats), ~max_pool(~x) (int32), same indices.
  configs = _select_configs(300 + ndim, ndim, DRAWN["min"][ndim])[:PREFIX["min"][ndim]]
  _check_select("min", ndim, 400 + ndim, configs)


# ----------------------------------------------------------------------------
# Average pooling: values and gradients.
# ----------------------------------------------------------------------------

_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _torch_avg(cfg: Config, x: np.ndarray, g: np.ndarray | None, contiguous: bool):
  t = _to_torch(x, cfg.batched, contiguous).detach().requires_grad_(g is not None)
  kwargs = dict(ceil_mode=cfg.ceil_mode, count_include_pad=cfg.count_include_pad)
  if cfg.ndim > 1:
    kwargs["divisor_override"] = cfg.divisor_override
  values = _AVG_POOL[cfg.ndim](t, cfg.kernel, cfg.stride, cfg.pad, **kwargs)
  grad = None
  if g is not None:
    values.backward(_to_torch(g, cfg.batched, contiguous))
    grad = _from_torch(t.grad, cfg.batched)
  return _from_torch(values, cfg.batched), grad


def _ours_avg(module, with_grad):
  def run(x, g):
    if not with_grad:
      return module(x), None
    values, vjp = jax.vjp(module, x)
    (grad,) = vjp(g)
    return values, grad

  return run


@pytest.mark.parametrize("ndim", [1, 2, 3], ids=_ids("avg"))
def test_avgpool_matches_torch(ndim):
  # PyTorch 2.13 CPU F.avg_pool{1,2,3}d (ceil_mode, count_include_pad, divisor_override).
  configs = _avg_configs(500 + ndim, ndim, DRAWN["avg"][ndim])[:PREFIX["avg"][ndim]]
  rng = np.random.default_rng(600 + ndim)
  cases, fns, args = [], [], []
  for i, cfg in enumerate(configs):
    x = _inputs(rng, cfg)
    out_shape = _torch_avg(cfg, x, None, True)[0].shape
    g = rng.standard_normal(out_shape).astype(np.float32) if cfg.grad else None
    if i not in KEEP["avg"][ndim]:
      continue  # drawn all the same: the kept configurations' inputs stay as they were
    cases.append((cfg, _torch_avg(cfg, x, g, True), _torch_avg(cfg, x, g, False)))
    module = AvgPool(cfg.window, cfg.strides, cfg.padding, num_spatial_dims=cfg.ndim,
                     **cfg.avg_kwargs())
    fns.append(_ours_avg(module, cfg.grad))
    args.append((_fold(x, cfg.batched), None if g is None else _fold(g, cfg.batched)))
  results = _jit_all(fns, args)
  failures = []
  for (cfg, ref, ref_cl), (values, grad) in zip(cases, results, strict=True):
    for label, (t_values, t_grad) in (("contiguous", ref), ("channels_last", ref_cl)):
      _compare(failures, cfg, f"{label} values", _unfold(values, cfg.batched), t_values, False)
      if cfg.grad:
        _compare(failures, cfg, f"{label} grad", _unfold(grad, cfg.batched), t_grad, False)
  _report(failures, len(cases), "AvgPool")


# ----------------------------------------------------------------------------
# LP pooling.
# ----------------------------------------------------------------------------

_LP_POOL = {1: F.lp_pool1d, 2: F.lp_pool2d, 3: F.lp_pool3d}


@pytest.mark.parametrize("ndim", [1, 2, 3], ids=_ids("lp"))
def test_lppool_matches_torch(ndim):
  # PyTorch 2.13 CPU F.lp_pool{1,2,3}d on positive inputs (it takes x**p, not |x|**p).
  configs = _lp_configs(700 + ndim, ndim, DRAWN["lp"][ndim])[:PREFIX["lp"][ndim]]
  rng = np.random.default_rng(800 + ndim)
  cases, fns, args = [], [], []
  for i, cfg in enumerate(configs):
    x = _inputs(rng, cfg, positive=True)
    if i not in KEEP["lp"][ndim]:
      continue  # drawn all the same: the kept configurations' inputs stay as they were
    # F.lp_pool1d multiplies by kernel_size itself, so it needs an int: (k,) is a TypeError.
    kernel = cfg.kernel[0] if ndim == 1 else cfg.kernel
    refs = [
        _from_torch(
            _LP_POOL[ndim](_to_torch(x, cfg.batched, c), cfg.norm_type, kernel, cfg.stride,
                           cfg.ceil_mode),
            cfg.batched,
        )
        for c in (True, False)
    ]
    cases.append((cfg, refs))
    fns.append(LPPool(cfg.norm_type, cfg.window, cfg.strides, ceil_mode=cfg.ceil_mode,
                      num_spatial_dims=cfg.ndim))
    args.append((_fold(x, cfg.batched),))
  results = _jit_all(fns, args)
  failures = []
  for (cfg, refs), values in zip(cases, results, strict=True):
    for label, ref in zip(("contiguous", "channels_last"), refs, strict=True):
      _compare(failures, cfg, f"{label} values", _unfold(values, cfg.batched), ref, False)
  _report(failures, len(cases), "LPPool")


# ----------------------------------------------------------------------------
# Hand-picked cases, eager (no jit), each against PyTorch 2.13 CPU.
# ----------------------------------------------------------------------------


def _torch_max_1d(x, k, s, p, **kwargs):
  values, indices = F.max_pool1d(torch.tensor([x]), k, s, p, return_indices=True, **kwargs)
  return values[0].numpy(), indices[0].numpy()


def test_maxpool_nan_last_in_window_wins_like_torch():
  x = [1.0, np.nan, 3.0, np.nan, 2.0, 5.0]
  # PyTorch 2.13: every window holding a NaN gives NaN, at that NaN's index.
  t_values, t_indices = _torch_max_1d(x, 3, 1, 0)
  # NumPy in and out: jnp.array of a list and indexing a jax.Array compile a program each.
  x = np.array(x, np.float32)[:, None]
  values, indices = jax.device_get(MaxPool((3,), 1, return_indices=True)(x))
  np.testing.assert_array_equal(values[:, 0], t_values)
  np.testing.assert_array_equal(indices[:, 0], t_indices)
  # Two NaNs in one window: the later one is reported (val > max || isnan(val)).
  t_values, t_indices = _torch_max_1d(x[:, 0].tolist(), 4, 2, 0)
  values, indices = jax.device_get(MaxPool((4,), 2, return_indices=True)(x))
  np.testing.assert_array_equal(indices[:, 0], t_indices)
  assert int(indices[0, 0]) == 3


def test_maxpool_all_neg_inf_window_points_at_first_real_cell_like_torch():
  x = [-np.inf, -np.inf, -np.inf, 1.0]
  # PyTorch 2.13: window [pad, -inf, -inf] gives -inf at index 0, never the padding.
  t_values, t_indices = _torch_max_1d(x, 3, 1, 1, ceil_mode=True)
  values, indices = jax.device_get(MaxPool((3,), 1, 1, ceil_mode=True, return_indices=True)(
      np.array(x, np.float32)[:, None]))
  np.testing.assert_array_equal(values[:, 0], t_values)
  np.testing.assert_array_equal(indices[:, 0], t_indices)
  assert int(indices[0, 0]) == 0


def test_minpool_first_minimum_wins_ties_like_torch():
  x = np.array([[2.0, 1.0, 1.0], [1.0, 3.0, 1.0], [0.0, 0.0, 4.0]], np.float32)
  # PyTorch 2.13: -max_pool2d(-x), k2 s1: the first minimum in row-major order wins.
  t_values, t_indices = F.max_pool2d(-torch.from_numpy(x)[None], 2, 1, return_indices=True)
  values, indices = jax.device_get(MinPool((2, 2), 1, return_indices=True)(x[:, :, None]))
  np.testing.assert_array_equal(values[..., 0], -t_values[0].numpy())
  np.testing.assert_array_equal(indices[..., 0], t_indices[0].numpy())
  np.testing.assert_array_equal(indices[..., 0], [[1, 1], [6, 7]])


def test_maxpool_3d_all_neg_inf_window_index_like_torch_contiguous():
  x = np.full((1, 3, 2, 2, 2), -np.inf, np.float32)  # (N, D, H, W, C), C = 2
  # PyTorch 2.13 (contiguous): an all -inf window reports its first cell, (d*H + h)*W + w.
  # Its channels_last_3d kernel reports h*W + w here instead, when C is not a multiple
  # of the vector width (C = 2, 3 do it; 1, 8, 16 do not), so the sweep skips such inputs.
  t_values, t_indices = F.max_pool3d(
      torch.from_numpy(x).movedim(-1, 1).contiguous(), 1, 1, return_indices=True
  )
  values, indices = jax.device_get(MaxPool((1, 1, 1), 1, return_indices=True)(x))
  np.testing.assert_array_equal(values, t_values.movedim(1, -1).numpy())
  np.testing.assert_array_equal(indices, t_indices.movedim(1, -1).numpy())
  np.testing.assert_array_equal(indices[0, :, 0, 0, 0], [0, 4, 8])


def test_maxpool_refuses_window_of_padding_only():
  # PyTorch 2.13 accepts max_pool1d(k2, s2, p1, dilation=3) on length 2, though its only
  # window has taps at -1 and 2, both padding: it returns -inf at index 2 (past the input)
  # and its backward then writes out of bounds. Ours refuses the configuration.
  with pytest.raises(ValueError, match="covers only padding"):
    MaxPool((2,), 2, 1, dilation=3)(np.zeros((2, 1), np.float32))


_PAST_INPUT_CASES = {
    # name: (our module, x, PyTorch 2.13 call on (1, 1, L))
    "avg-k3-s2": (AvgPool((3,), 2, ceil_mode=True), [1.0, 2.0],
                  lambda t: F.avg_pool1d(t, 3, 2, 0, ceil_mode=True)),
    "max-k3-s2": (MaxPool((3,), 2, ceil_mode=True), [1.0, 2.0],
                  lambda t: F.max_pool1d(t, 3, 2, 0, ceil_mode=True)),
    "max-k5-d2-p1": (MaxPool((5,), 2, 1, dilation=2, ceil_mode=True), [0.0, 1, 2, 3, 4, 5],
                     lambda t: F.max_pool1d(t, 5, 2, 1, 2, ceil_mode=True)),
    "lp-k3-s2": (LPPool(2, (3,), 2, ceil_mode=True), [1.0, 2.0],
                 lambda t: F.lp_pool1d(t, 2, 3, 2, ceil_mode=True)),
}


@pytest.mark.parametrize("name", list(_PAST_INPUT_CASES))
def test_pool_ceil_mode_window_past_padded_input_like_torch(name):
  # PyTorch 2.13 CPU: ceil mode gives out = ceil((L + 2p - e) / s) + 1 = 1 when
  # -s < L + 2p - e < 0 (PyTorch's Pool.h allows it in ceil mode); the window is clipped to
  # the input.
  # E.g. avg_pool1d([1, 2], k3, s2, ceil) = [1.5] and max_pool1d gives [2] at index 1.
  module, x, torch_fn = _PAST_INPUT_CASES[name]
  expected = torch_fn(torch.tensor([[x]]))[0, 0].numpy()
  got = np.asarray(module(np.array(x, np.float32)[:, None]))  # NumPy in and out
  np.testing.assert_allclose(got[:, 0], expected, **_TOL)
