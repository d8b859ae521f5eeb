"""Tests for the window reductions: the taps (nnx_pool._taps), the box-by-box select
(nnx_pool._select) and the separable path (nnx_pool._separable).

Windows over ``UNROLL_LIMIT`` taps are reduced one spatial dim at a time. The
oracles are NumPy: the mirror in :mod:`nnx_pool.reference` (values, PyTorch's flat
indices and the window offsets they name, max and min gradients) and, for the separable
sums, window sums and their transpose written out tap by tap here. (The unrolled kernels,
``tap_select`` and ``tap_sum`` called directly on the large window, were the sums' oracle
and one case's offsets' oracle: compiling them at 60 to 125 taps cost more than the
separable kernels they checked, and the NumPy oracles check the same arrays, the offsets
of every case.)
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jcore

from nnx_pool import AvgPool, MaxPool, reference
from nnx_pool._adjoint import tap_select
from nnx_pool._geometry import Window
from nnx_pool._select import arg_select_boxes, flat_indices, offset_dtype_for
from nnx_pool._separable import UNROLL_LIMIT, select, separable_select, separable_sum, window_sum
from nnx_pool._taps import boxes, taps

# (window, strides, padding as (low, high) pairs or "VALID", dilation, ceil_mode, input shape)
CASES = {
    "9x9": ((9, 9), (9, 9), "VALID", (1, 1), False, (2, 19, 20, 2)),
    "9x9-overlap-pad": ((9, 9), (2, 3), ((4, 3), (2, 4)), (1, 1), False, (1, 16, 17, 2)),
    "9x9-dilated-ceil": ((9, 9), (2, 2), ((4, 4), (1, 0)), (2, 1), True, (1, 21, 16, 1)),
    # 60 taps: public entry points stay unrolled; tests force the separable path. (Its twin
    # at 72 taps, 12x6 with pads ((6, 2), (1, 3)) through the entry points, ran the same
    # separable code on the same kind of geometry; the entry points' dispatch over the limit
    # is the other cases' and test_dispatch_on_tap_count's. Without it, and with int32 in
    # MIN_CASES alone, the file's compile CPU went 14.4 s -> 13.3 s, pytest
    # tests/test_kernels.py -p tools.compile_census, 2 cores.)
    "12x5-ceil-pad": ((12, 5), (3, 2), ((6, 2), (1, 2)), (1, 1), True, (2, 23, 12, 2)),
    "5x5x5": ((5, 5, 5), (2, 3, 1), ((2, 2), (1, 2), (2, 0)), (1, 2, 1), True, (1, 9, 12, 7, 2)),
}
IDS = list(CASES)
INT8_CASE = "9x9-overlap-pad"  # padded: int8's fill value is read
JVP_CASES = ["9x9-overlap-pad", "12x5-ceil-pad", "5x5x5"]
# The cases whose select also takes the minimum. Min runs max's separable code with the
# other comparison and fill; these three show it through the entry point and the direct
# separable select, with padding, ceil mode, dilation, 2-D and 3-D, int8 and int32 (their
# JVPs and min gradients are checked too). Min in the other three took 0.9 s CPU (pytest -k
# select_matches, 2 cores: 11.7 s -> 10.8 s).
MIN_CASES = JVP_CASES
# The case whose JVP is also taken of the minimum: a stage's tangent is the tangent at the
# winning tap whichever kind chose it (the same rule as max's), and min's choice is checked
# in every MIN_CASES case by its values, indices and gradient. The 3-D case, with dilation
# and ceil mode; min's JVP in the other two took 0.7 of the jvps programs' 2.5 s of compile
# CPU (pytest -k jvp_and_min -p tools.compile_census, 2 cores).
JVP_MIN_CASE = "5x5x5"


def _geom(case):
  window, strides, padding, dilation, ceil_mode, shape = CASES[case]
  return Window.create(window, strides, padding, dilation=dilation, ceil_mode=ceil_mode).resolve(
      shape[1:-1]
  )


def _ref_kwargs(case):
  window, strides, padding, dilation, ceil_mode, _ = CASES[case]
  return dict(window=window, strides=strides, padding=padding), dict(
      dilation=dilation, ceil_mode=ceil_mode
  )


def _select(x, geom, kind):
  """The separable select, through the entry point (``select``) when the window is large."""
  if geom.size > UNROLL_LIMIT:
    return select(x, geom, kind)
  floating = bool(jnp.issubdtype(x.dtype, jnp.floating))
  return separable_select(x, geom, kind, floating)


def _sum(x, geom):
  """The separable sum, through the entry point (``window_sum``) when the window is large."""
  if geom.size > UNROLL_LIMIT:
    return window_sum(x, geom)
  return separable_sum(x, geom)


def _window_select(x, geom, kind):
  return tap_select(x, geom, kind, True)


def _pairs(case):
  """The case's padding as (low, high) pairs."""
  window, _, padding, *_ = CASES[case]
  return ((0, 0),) * len(window) if padding == "VALID" else padding


def _mirror_offsets(case, indices):
  """The row-major window offsets that the mirror's flat indices name (NumPy).

  Output ``q``'s tap ``j`` of a dim reads ``q * stride - pad_low + j * dilation``: each
  dim's tap is read back from the cell's coordinate, and the taps raveled over the window.
  """
  window, strides, _, dilation, _, shape = CASES[case]
  coords = np.unravel_index(indices, shape[1:-1])
  grid = np.indices(indices.shape)
  taps = []
  for axis, (c, k, s, d, (lo, _)) in enumerate(
      zip(coords, window, strides, dilation, _pairs(case), strict=True)):
    tap, rest = np.divmod(c - grid[axis + 1] * s + lo, d)
    assert (rest == 0).all() and (tap >= 0).all() and (tap < k).all(), case
    taps.append(tap)
  return np.ravel_multi_index(taps, window)


KINDS = ("max", "min")
_FLOATS = ("special", "all_neg_inf_block", "normal")


def _by_dtype(inputs):
  """The float inputs stacked on the batch axis, then the two integer ones.

  Every output reads one example, so stacking changes nothing that is compared, and
  the three float inputs share one compiled program.
  """
  n = inputs["normal"].shape[0]
  floats = np.concatenate([inputs[name] for name in _FLOATS])
  return {"float32": floats, **{k: v for k, v in inputs.items() if k not in _FLOATS}}, n


def _split(name, a, n):
  """``(label, part)`` per input of a :func:`_by_dtype` array: the float ones by name."""
  a = np.asarray(a)
  if name != "float32":
    return [(name, a)]
  return [(label, a[i * n:(i + 1) * n]) for i, label in enumerate(_FLOATS)]


def _assert_each_input_equal(dtype, got, want, n, kind):
  """``got == want`` bit for bit, input by input of a stacked batch (:func:`_split`)."""
  for (name, g), (_, w) in zip(_split(dtype, got, n), _split(dtype, want, n), strict=True):
    np.testing.assert_array_equal(g, w, err_msg=f"{kind} {name}")


# Each compiled once per geometry and input shapes: every kind asked for (max and min unless
# told), every dtype, in one program (the kernels and the unrolled oracles compiled per kind
# and per dtype took most of the file's time).
@functools.partial(jax.jit, static_argnums=(0, 1), static_argnames=("kinds",))
def _select_all(select, geom, xs, kinds=KINDS):
  """``select``'s values, window offsets and flat indices for each dtype and kind."""
  out = {}
  for dtype, x in xs.items():
    for kind in kinds:
      values, offsets = select(x, geom, kind)
      out[dtype, kind] = values, offsets, flat_indices(offsets, geom)
  return out


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _vjps(select, geom, kinds, x, ct):
  """The VJP of each kind's values at ``x``, one program for all kinds."""
  return {kind: jax.vjp(lambda v, kind=kind: select(v, geom, kind)[0], x)[1](ct)[0]
          for kind in kinds}


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _jvps(select, geom, kinds, x, t):
  """The JVP of each kind's values and offsets at ``x`` along ``t``."""
  return {kind: jax.jvp(lambda v, kind=kind: select(v, geom, kind), (x,), (t,)) for kind in kinds}


def _inputs(shape, seed):
  """Integer inputs (many ties), floats with ties, NaN and -inf/+inf, and a plain normal."""
  rng = np.random.default_rng(seed)
  ints = rng.integers(-3, 3, shape).astype(np.int32)
  special = rng.integers(-3, 3, shape).astype(np.float32)
  special[rng.random(shape) < 0.04] = np.nan
  special[rng.random(shape) < 0.3] = -np.inf
  special[rng.random(shape) < 0.05] = np.inf
  # A block of -inf larger than some windows, so whole windows are -inf.
  block = (slice(None),) + tuple(slice(0, min(n, 8)) for n in shape[1:-1]) + (slice(None),)
  all_inf = rng.normal(size=shape).astype(np.float32)
  all_inf[block] = -np.inf
  return {
      "int32": ints,
      "int8": ints.astype(np.int8),
      "special": special,
      "all_neg_inf_block": all_inf,
      "normal": rng.normal(size=shape).astype(np.float32),
  }


# (length, window, stride, dilation, padding, ceil_mode) of the first dim.
TAP_SPELLINGS = [
    (7, 3, 2, 1, 1, False), (7, 3, 2, 1, 1, True), (8, 2, 2, 1, 0, False),
    (9, 3, 1, 2, 2, False), (6, 4, 3, 1, (2, 1), True), (5, 5, 2, 1, 2, True),
    (4, 10**6, 10**6, 1, 0, True),  # one window, trimmed to the input
    (1, 6, 3, 1, 3, True), (4, 6, 6, 1, 3, True),  # phases starting past the end
]


def test_both_tap_spellings_read_the_same_cells():
  # The same window over a 2-D map read as stride phases shifted by pads, and as slices of
  # one padded copy: identical arrays, padding holding the fill value (-7, to be seen).
  # Every configuration in one jitted program (run eagerly, each slice and pad compiled on
  # its own). Each dim's taps are spelt from that dim's geometry alone (the product of the
  # per-dim phases or slices): the first configuration reads a second padded, strided dim
  # (3/2 pad 1) with it, the others a plain one (one tap), which keeps their taps to their
  # first dim's (the 3/2 pad 1 dim under all nine took 3.2 s of compile CPU, 1.2 s with
  # it under the first alone: pytest -k tap_spellings -p tools.compile_census, 2 cores).
  geoms, xs = [], []
  for i, (length, window, stride, dilation, padding, ceil_mode) in enumerate(TAP_SPELLINGS):
    padding = padding if isinstance(padding, tuple) else (padding, padding)
    second = (3, 2, (1, 1)) if i == 0 else (1, 1, (0, 0))
    geoms.append(Window.create((window, second[0]), (stride, second[1]), (padding, second[2]),
                               dilation=(dilation, 1), ceil_mode=ceil_mode).resolve((length, 6)))
    xs.append(np.arange(2 * length * 6 * 3, dtype=np.float32).reshape(2, length, 6, 3))
  spellings = jax.jit(lambda xs: [
      (list(taps(x, geom, -7.0, shared_pad=False)), list(taps(x, geom, -7.0, shared_pad=True)))
      for x, geom in zip(xs, geoms, strict=True)])(xs)
  for config, geom, (phases, shared) in zip(TAP_SPELLINGS, geoms, spellings, strict=True):
    assert len(phases) == len(shared) == geom.size, config
    for j, (a, b) in enumerate(zip(phases, shared, strict=True)):
      assert a.shape == b.shape == (2, *geom.out_shape, 3), (config, j)
      np.testing.assert_array_equal(a, b, err_msg=f"{config} tap {j}")


# Windows whose padding only the first outputs of a dim reach (a low border): the
# offsets are computed box by box there. (window, strides, padding, dilation, shape)
LOW_BORDER = {
    "3x3/2 p1 (the ResNet stem)": ((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), (2, 8, 10, 3)),
    "3/2 p1, 1-D": ((3,), (2,), ((1, 1),), (1,), (2, 12, 2)),
    "3x3x3/2 p1": ((3, 3, 3), (2, 2, 2), ((1, 1),) * 3, (1, 1, 1), (1, 6, 8, 4, 2)),
    "2x2 dilation 2 p1 /2": ((2, 2), (2, 2), ((1, 1), (1, 1)), (2, 2), (1, 8, 6, 2)),
    "3x3/1 low pads only": ((3, 3), (1, 1), ((1, 0), (1, 0)), (1, 1), (1, 7, 6, 2)),
    "4x3/3 p(2,0)": ((4, 3), (3, 1), ((2, 0), (1, 0)), (1, 1), (1, 12, 5, 2)),
    "one padded dim": ((3, 2), (2, 2), ((1, 1), (0, 0)), (1, 1), (1, 10, 8, 2)),
    "5x5/2 p(2,0)": ((5, 5), (2, 2), ((2, 0), (2, 0)), (1, 1), (1, 11, 12, 1)),
}




# The geometries whose boxes also pool int32, and also take the minimum. Integers differ from
# floats in the fill value (the dtype's minimum or maximum) and in having no NaN to compare,
# and min from max in the comparison and the fill, element by element, not in how the
# output is split into boxes (the same code at any rank): one 2-D and one 1-D geometry keep
# them, and the 3-D one's boxes are shown by its float max (each dtype and kind compiled is
# one more kernel in the test's program; min in the other five cases took 0.9 of the test's
# 6.4 s CPU; int32 and min in the 3-D case, 27 taps, took 0.9 of the test's 3.4 s of
# compile CPU, pytest -k box_by_box -p tools.compile_census, 2 cores). Every geometry's
# first box reads the low padding, so each of the two shows min's fill there.
INT_BOX_CASES = ["3x3/2 p1 (the ResNet stem)", "3/2 p1, 1-D"]


@pytest.mark.parametrize("case", list(LOW_BORDER))
def test_box_by_box_select_matches_the_mirror(case):
  window, strides, padding, dilation, shape = LOW_BORDER[case]
  geom = Window.create(window, strides, padding, dilation=dilation).resolve(shape[1:-1])
  # Tap j of window q reads coordinate q * stride + j * dilation - pad_low of its dim.
  reads = [np.arange(d.out)[:, None] * s + np.arange(k)[None, :] * r - lo
           for d, k, s, r, (lo, _) in zip(geom.dims, window, strides, dilation, padding,
                                          strict=True)]
  assert all((p < n).all() for p, n in zip(reads, shape[1:-1], strict=True)), "a high border"
  assert any((p < 0).any() for p in reads), "no low border"
  parts = boxes(geom)
  assert parts is not None and len(parts) > 1
  # The boxes partition the output: every position in exactly one.
  cover = np.zeros(geom.out_shape, np.int64)
  for box in parts:
    cover[tuple(slice(q0, q1) for q0, q1 in box)] += 1
  np.testing.assert_array_equal(cover, 1)
  # The last box is the interior: every tap of its windows on a real cell.
  for (q0, q1), p in zip(parts[-1], reads, strict=True):
    assert (p[q0:q1] >= 0).all(), case
  # Values and PyTorch's flat indices against the NumPy mirror (PyTorch's scan, cell by
  # cell), on ties, NaN, infinities, whole -inf windows and, in INT_BOX_CASES, integers
  # (int32 stands for them: int8 takes the same kernel; test_select_matches_the_mirror has
  # it) and min as well as max.
  inputs = _inputs(shape, seed=14)
  del inputs["int8"]
  kinds = KINDS
  if case not in INT_BOX_CASES:
    del inputs["int32"]
    kinds = ("max",)
  xs, n = _by_dtype(inputs)
  got = _select_all(arg_select_boxes, geom, xs, kinds=kinds)
  for kind in kinds:
    mirror = reference.max_pool if kind == "max" else reference.min_pool
    for dtype, x in xs.items():
      values, offsets, indices = got[dtype, kind]
      assert values.dtype == x.dtype, dtype
      assert offsets.dtype == np.int8, dtype  # at most 27 taps: int8 offsets
      want_values, want_indices = mirror(x, window, strides, padding, dilation=dilation)
      _assert_each_input_equal(dtype, values, want_values, n, kind)
      _assert_each_input_equal(dtype, indices, want_indices, n, kind)


@pytest.mark.parametrize(("window", "strides", "padding", "length"), [
    (3, 1, 1, 8),  # a high border as well (3x3/1 pad 1)
    (3, 2, 1, 9),  # the stem's pool on an odd map: its last window reaches past the end
    (2, 2, 0, 8),  # no padding at all
])
def test_no_boxes_where_a_window_reaches_past_the_end_or_none_starts_in_padding(
    window, strides, padding, length):
  geom = Window.create(window, strides, padding).resolve((length, length))
  assert boxes(geom) is None


def test_dispatch_on_tap_count():
  """Over UNROLL_LIMIT taps the public kernels are separable; at or under it, unrolled."""
  assert all(_geom(case).size > UNROLL_LIMIT for case in IDS if case != "12x5-ceil-pad")
  geom = _geom("12x5-ceil-pad")
  assert geom.size <= UNROLL_LIMIT
  x = jnp.asarray(_inputs(CASES["12x5-ceil-pad"][-1], seed=0)["normal"])
  entry = jax.make_jaxpr(lambda x: select(x, geom, "max"))(x)
  unrolled = jax.make_jaxpr(lambda x: _window_select(x, geom, "max"))(x)
  assert _count_equations(entry.jaxpr) == _count_equations(unrolled.jaxpr)


@pytest.mark.parametrize("case", IDS)
def test_select_matches_the_mirror(case):
  # Values, window offsets and PyTorch's flat indices bit for bit against the NumPy mirror;
  # every input kind and dtype, max, and min in MIN_CASES.
  geom = _geom(case)
  args, kwargs = _ref_kwargs(case)
  inputs = _inputs(CASES[case][-1], seed=IDS.index(case))
  if case != INT8_CASE:  # int8 takes int32's code path with its own fill: one case shows it
    del inputs["int8"]
  if case not in MIN_CASES:
    # int32 in MIN_CASES, which show its fill with padding, ceil mode and dilation in 2-D
    # and 3-D (9x9 has no padding to fill; 9x9-dilated-ceil is 5x5x5's kind in 2-D).
    del inputs["int32"]
  xs, n = _by_dtype(inputs)
  got = _select_all(_select, geom, xs, kinds=KINDS if case in MIN_CASES else ("max",))
  for (dtype, kind), (values, offsets, indices) in got.items():
    x = xs[dtype]
    assert values.dtype == x.dtype and offsets.dtype == offset_dtype_for(geom), dtype
    mirror = reference.max_pool if kind == "max" else reference.min_pool
    want_values, want_indices = mirror(x, **args, **kwargs)
    # The window offsets bit for bit: the taps that the mirror's indices name.
    _assert_each_input_equal(dtype, offsets, _mirror_offsets(case, want_indices), n, kind)
    for (name, v), (_, w) in zip(_split(dtype, values, n), _split(dtype, want_values, n),
                                 strict=True):
      np.testing.assert_array_equal(v, w, err_msg=f"{kind} {name} (mirror)")
    for (name, i), (_, w) in zip(_split(dtype, indices, n), _split(dtype, want_indices, n),
                                 strict=True):
      np.testing.assert_array_equal(i, w, err_msg=f"{kind} {name} (mirror)")


@pytest.mark.slow
@pytest.mark.parametrize("case", IDS)
def test_max_grad_matches_reference(case):
  # The mirror (reference.max_pool_grad, float64 sums) is the oracle: bit for bit on
  # integer-valued cotangents, within float32 rounding on normal ones. (It was also
  # compared with the unrolled kernels' gradient, which equals the mirror wherever both
  # are exact: compiling that oracle at 60 to 125 taps took half of the test's time.)
  geom = _geom(case)
  args, kwargs = _ref_kwargs(case)
  x = _inputs(CASES[case][-1], seed=2)["int32"].astype(np.float32)  # ties everywhere
  out_shape = (x.shape[0], *geom.out_shape, x.shape[-1])
  # Integer-valued cotangents: every accumulation is exact, whatever its order. Where
  # test_select_jvp_and_min_grad takes min's gradient too, the program is the one it reuses.
  kinds = KINDS if case in JVP_CASES else ("max",)
  g = np.random.default_rng(3).integers(-4, 5, out_shape).astype(np.float32)
  grads = _vjps(_select, geom, kinds, x, g)
  for kind in kinds:
    np.testing.assert_array_equal(np.asarray(grads[kind]),
                                  reference.max_pool_grad(x, g, **args, **kwargs, kind=kind))
  # Float cotangents: equal up to the order of accumulation over overlapping windows.
  g = np.random.default_rng(4).normal(size=out_shape).astype(np.float32)
  grad = _vjps(_select, geom, kinds, x, g)["max"]
  np.testing.assert_allclose(np.asarray(grad), reference.max_pool_grad(x, g, **args, **kwargs),
                             rtol=1e-6, atol=1e-6)


def _at_indices(t, indices):
  """``t`` at each output's flat index (PyTorch's, over its example's spatial dims)."""
  n, c = t.shape[0], t.shape[-1]
  picked = np.take_along_axis(t.reshape(n, -1, c), indices.reshape(n, -1, c), axis=1)
  return picked.reshape(indices.shape)


@pytest.mark.parametrize("case", JVP_CASES)
def test_select_jvp_and_min_grad(case):
  # Forward mode: each output's tangent is the tangent of the cell the mirror's index
  # names (the mirror's own rule: first extremum, last NaN, never padding).
  geom = _geom(case)
  args, kwargs = _ref_kwargs(case)
  x = _inputs(CASES[case][-1], seed=5)["special"]
  t = np.random.default_rng(6).integers(-4, 5, x.shape).astype(np.float32)
  jvps = _jvps(_select, geom, KINDS if case == JVP_MIN_CASE else ("max",), x, t)
  g = np.random.default_rng(7).integers(-4, 5, jvps["max"][0][0].shape).astype(np.float32)
  grads = _vjps(_select, geom, KINDS, x, g)
  for kind in KINDS:
    mirror = reference.max_pool if kind == "max" else reference.min_pool
    if kind in jvps:
      _, (t_values, t_offsets) = jvps[kind]
      assert t_offsets.dtype == jax.dtypes.float0, kind
      _, want_indices = mirror(x, **args, **kwargs)
      np.testing.assert_array_equal(np.asarray(t_values), _at_indices(t, want_indices),
                                    err_msg=kind)
    np.testing.assert_array_equal(
        np.asarray(grads[kind]), reference.max_pool_grad(x, g, **args, **kwargs, kind=kind),
        err_msg=kind)


def test_select_second_derivative_is_zero():
  geom = _geom("9x9-overlap-pad")
  x = _inputs(CASES["9x9-overlap-pad"][-1], seed=8)["normal"]
  v = np.ones_like(x)  # NumPy: jnp.ones_like compiles a broadcast
  hvp = jax.jit(lambda x, v: jax.jvp(jax.grad(lambda x: select(x, geom, "max")[0].sum()), (x,),
                                      (v,))[1])(x, v)
  np.testing.assert_array_equal(np.asarray(hvp), 0.0)


@functools.partial(jax.jit, static_argnums=(0,))
def _sum_transforms(geom, x, ct, t):
  """The separable window sum's value, VJP along ``ct`` and JVP along ``t``: one program."""
  total, vjp = jax.vjp(lambda v: _sum(v, geom), x)
  return total, vjp(ct)[0], jax.jvp(lambda v: _sum(v, geom), (x,), (t,))[1]


def _tap_views(case, out_shape):
  """Per window tap, the index of the cells it reads in the padded input (NumPy).

  Output ``q``'s tap ``j`` of a dim reads padded cell ``q * stride + j * dilation``.
  """
  window, strides, _, dilation, _, _ = CASES[case]
  for offset in np.ndindex(*window):
    yield (slice(None), *(slice(j * d, j * d + (q - 1) * s + 1, s) for j, d, s, q in zip(
        offset, dilation, strides, out_shape, strict=True)), slice(None))


def _padded_shape(case, shape, out_shape):
  """The zero-padded input every tap stays within: its low pads, and high ones to the last tap."""
  window, strides, _, dilation, _, _ = CASES[case]
  return (shape[0], *(max(lo + n, (q - 1) * s + (k - 1) * d + 1) for n, (lo, _), k, s, d, q in zip(
      shape[1:-1], _pairs(case), window, strides, dilation, out_shape, strict=True)), shape[-1])


def _mirror_sum(case, x, out_shape):
  """Every window's sum, zero padding (float64): the taps' views of the padded input added."""
  shape = x.shape
  padded = np.zeros(_padded_shape(case, shape, out_shape))
  padded[(slice(None), *(slice(lo, lo + n) for (lo, _), n in zip(
      _pairs(case), shape[1:-1], strict=True)), slice(None))] = x
  return sum(padded[view] for view in _tap_views(case, out_shape))


def _mirror_sum_transpose(case, g, shape):
  """The window sum's transpose (its VJP, float64): each output's cotangent added to every
  cell of its window, then the padding cropped."""
  out_shape = g.shape[1:-1]
  padded = np.zeros(_padded_shape(case, shape, out_shape))
  for view in _tap_views(case, out_shape):
    padded[view] += g
  return padded[(slice(None), *(slice(lo, lo + n) for (lo, _), n in zip(
      _pairs(case), shape[1:-1], strict=True)), slice(None))]


@pytest.mark.slow
@pytest.mark.parametrize("case", IDS)
def test_window_sum_matches_the_numpy_sums(case):
  # The separable sum (the entry point where the window is over UNROLL_LIMIT taps), its VJP
  # and its JVP against the NumPy window sum and transpose above (the unrolled kernel was the
  # oracle: compiling it at 60 to 125 taps, value, VJP and JVP, took 3.0 of the test's 5.5 s of
  # compile CPU, pytest -k window_sum_matches, 2 cores).
  geom = _geom(case)
  window, strides, padding, dilation, _, shape = CASES[case]
  # Multiples of 1/8: float32 sums are exact in any order, so they equal the float64 oracle.
  x = _inputs(shape, seed=9)["int32"].astype(np.float32) / 8
  g = np.random.default_rng(10).integers(
      -4, 5, (shape[0], *geom.out_shape, shape[-1])).astype(np.float32) / 8
  # Normal floats for the JVP (the sum of the tangent): float32 rounding differs by order.
  t = _inputs(shape, seed=11)["normal"]
  total, grad, jvp = _sum_transforms(geom, x, g, t)
  out_shape = tuple(reference.output_size(n, k, s, lo, hi, dilation=d, ceil_mode=CASES[case][4])
                    for n, k, s, (lo, hi), d in zip(shape[1:-1], window, strides, _pairs(case),
                                                    dilation, strict=True))
  assert total.shape == g.shape == (shape[0], *out_shape, shape[-1])
  np.testing.assert_array_equal(np.asarray(total), _mirror_sum(case, x, out_shape))
  np.testing.assert_array_equal(np.asarray(grad), _mirror_sum_transpose(case, g, shape))
  np.testing.assert_allclose(np.asarray(jvp), _mirror_sum(case, t, out_shape), rtol=1e-5,
                             atol=1e-5)
  if all(d == 1 for d in dilation):  # reference.avg_pool has no dilation
    ref = reference.avg_pool(
        x.astype(np.float64), window, strides, padding, ceil_mode=CASES[case][4],
        divisor_override=1,
    )
    np.testing.assert_allclose(np.asarray(total), ref, rtol=1e-6, atol=1e-6)


def test_modules_match_reference_on_large_windows():
  x = _inputs((1, 20, 19, 3), seed=12)["special"]
  y = _inputs((1, 20, 19, 3), seed=13)["normal"]
  averages = [AvgPool((9, 9), strides=2, padding=((4, 4), (1, 3)), ceil_mode=True,
                      count_include_pad=count_include_pad) for count_include_pad in (True, False)]
  # The three modules in one program (called one by one, each compiled on its own: eager
  # equals jit is test_pool.py's test_pool_eager_equals_jit).
  (values, indices), means = jax.device_get(jax.jit(lambda x, y: (
      MaxPool((9, 9), strides=(2, 3), padding=((4, 4), (1, 3)), ceil_mode=True,
              return_indices=True)(x), [avg(y) for avg in averages]))(x, y))
  want_values, want_indices = reference.max_pool(x, (9, 9), (2, 3), ((4, 4), (1, 3)),
                                                 ceil_mode=True)
  np.testing.assert_array_equal(values, want_values)
  np.testing.assert_array_equal(indices, want_indices)
  for avg, got in zip(averages, means, strict=True):
    want = reference.avg_pool(y, (9, 9), (2, 2), ((4, 4), (1, 3)), ceil_mode=True,
                              count_include_pad=avg.count_include_pad)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _count_equations(jaxpr) -> int:
  """Equations of ``jaxpr`` and of every jaxpr nested in its equations' params."""
  total = 0
  for eqn in jaxpr.eqns:
    total += 1
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if isinstance(sub, jcore.ClosedJaxpr):
          total += _count_equations(sub.jaxpr)
        elif isinstance(sub, jcore.Jaxpr):
          total += _count_equations(sub)
  return total


@pytest.mark.parametrize("module", [MaxPool, AvgPool])
def test_large_window_grad_program_size_is_bounded(module):
  """Compile-time guard: the grad program of a 16x16 pool grows with sum(window).

  The unrolled kernels give about 5,200 equations for jax.grad of MaxPool((16, 16))
  (256 taps in the forward and in the scatter); the separable path about 700.
  """
  x = jnp.zeros((1, 64, 64, 8))
  pool = module((16, 16))
  jaxpr = jax.make_jaxpr(jax.grad(lambda x: pool(x).sum()))(x).jaxpr
  assert _count_equations(jaxpr) < 1500
  # And it scales linearly with the window side, not quadratically.
  pool = module((32, 32))
  jaxpr = jax.make_jaxpr(jax.grad(lambda x: pool(x).sum()))(x).jaxpr
  assert _count_equations(jaxpr) < 3000
