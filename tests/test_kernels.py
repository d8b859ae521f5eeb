"""Tests for the window reductions: the taps (nnx_pool._taps), the box-by-box select
(nnx_pool._select) and the separable path (nnx_pool._separable).

Windows over ``UNROLL_LIMIT`` taps are reduced one spatial dim at a time. The
oracles are the NumPy mirror in :mod:`nnx_pool.reference` and, for the separable
path, the unrolled kernels (``arg_select``, ``tap_select``, ``tap_sum``, called
directly on the large window).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jcore

from nnx_pool import AvgPool, MaxPool, reference
from nnx_pool._adjoint import tap_select, tap_sum
from nnx_pool._geometry import Window
from nnx_pool._select import arg_select, arg_select_boxes, flat_indices, offset_dtype_for
from nnx_pool._separable import UNROLL_LIMIT, select, separable_select, separable_sum, window_sum
from nnx_pool._taps import boxes, taps

# (window, strides, padding as (low, high) pairs or "VALID", dilation, ceil_mode, input shape)
CASES = {
    "9x9": ((9, 9), (9, 9), "VALID", (1, 1), False, (2, 19, 20, 2)),
    "9x9-overlap-pad": ((9, 9), (2, 3), ((4, 3), (2, 4)), (1, 1), False, (1, 16, 17, 2)),
    "9x9-dilated-ceil": ((9, 9), (2, 2), ((4, 4), (1, 0)), (2, 1), True, (1, 21, 16, 1)),
    # 60 taps: public entry points stay unrolled; tests force the separable path.
    "12x5-ceil-pad": ((12, 5), (3, 2), ((6, 2), (1, 2)), (1, 1), True, (2, 23, 12, 2)),
    "12x6-ceil-pad": ((12, 6), (3, 2), ((6, 2), (1, 3)), (1, 1), True, (1, 23, 13, 2)),
    "5x5x5": ((5, 5, 5), (2, 3, 1), ((2, 2), (1, 2), (2, 0)), (1, 2, 1), True, (1, 9, 12, 7, 2)),
}
IDS = list(CASES)


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


def _jit_select(x, geom, kind):
  return jax.jit(_select, static_argnums=(1, 2))(x, geom, kind)


def _window_select(x, geom, kind):
  return tap_select(x, geom, kind, True)


def _unrolled_select(x, geom, kind):
  if jnp.issubdtype(x.dtype, jnp.floating):
    return jax.jit(_window_select, static_argnums=(1, 2))(x, geom, kind)
  return jax.jit(functools.partial(arg_select, shared_pad=True), static_argnums=(1, 2))(
      x, geom, kind)


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


@pytest.mark.parametrize(("length", "window", "stride", "dilation", "padding", "ceil_mode"), [
    (7, 3, 2, 1, 1, False), (7, 3, 2, 1, 1, True), (8, 2, 2, 1, 0, False),
    (9, 3, 1, 2, 2, False), (6, 4, 3, 1, (2, 1), True), (5, 5, 2, 1, 2, True),
    (4, 10**6, 10**6, 1, 0, True),  # one window, trimmed to the input
    (1, 6, 3, 1, 3, True), (4, 6, 6, 1, 3, True),  # phases starting past the end
])
def test_both_tap_spellings_read_the_same_cells(length, window, stride, dilation, padding,
                                                ceil_mode):
  # The same window over a 2-D map (the second dim fixed at 3x3/2 pad 1) read as
  # stride phases shifted by pads, and as slices of one padded copy: identical
  # arrays, padding holding the fill value (-7, to be seen).
  padding = padding if isinstance(padding, tuple) else (padding, padding)
  geom = Window.create((window, 3), (stride, 2), (padding, (1, 1)), dilation=(dilation, 1),
                       ceil_mode=ceil_mode).resolve((length, 6))
  x = jnp.arange(2 * length * 6 * 3, dtype=jnp.float32).reshape(2, length, 6, 3)
  phases = list(taps(x, geom, -7.0, shared_pad=False))
  shared = list(taps(x, geom, -7.0, shared_pad=True))
  assert len(phases) == len(shared) == geom.size
  for j, (a, b) in enumerate(zip(phases, shared, strict=True)):
    assert a.shape == b.shape == (2, *geom.out_shape, 3), j
    np.testing.assert_array_equal(a, b, err_msg=f"tap {j}")


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


def _boxed_indices(x, geom, kind):
  """The box-by-box select's values, flat indices and window offsets."""
  values, offsets = arg_select_boxes(x, geom, kind)
  return values, flat_indices(offsets, geom), offsets


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
  # cell), on ties, NaN, infinities, whole -inf windows and integers.
  boxed = jax.jit(_boxed_indices, static_argnums=(1, 2))
  for kind in ("max", "min"):
    mirror = reference.max_pool if kind == "max" else reference.min_pool
    for name, x in _inputs(shape, seed=14).items():
      if name == "int8":  # int32 stands for the integers: one compile fewer per case
        continue
      values, indices, offsets = boxed(x, geom, kind)
      want_values, want_indices = mirror(x, window, strides, padding, dilation=dilation)
      np.testing.assert_array_equal(np.asarray(values), want_values, err_msg=name)
      np.testing.assert_array_equal(np.asarray(indices), want_indices, err_msg=name)
      assert values.dtype == x.dtype, name
      assert offsets.dtype == np.int8, name  # at most 27 taps: int8 offsets


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


# 12x6 is left to the reference test: XLA:CPU takes minutes to compile its unrolled oracle.
@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("case", [case for case in IDS if case != "12x6-ceil-pad"])
def test_select_matches_unrolled_bit_for_bit(case, kind):
  geom = _geom(case)
  for name, x in _inputs(CASES[case][-1], seed=IDS.index(case)).items():
    values, offsets = _jit_select(jnp.asarray(x), geom, kind)
    want_values, want_offsets = _unrolled_select(jnp.asarray(x), geom, kind)
    assert values.dtype == want_values.dtype and offsets.dtype == want_offsets.dtype, name
    assert offsets.dtype == offset_dtype_for(geom), name
    np.testing.assert_array_equal(np.asarray(values), np.asarray(want_values), err_msg=name)
    np.testing.assert_array_equal(np.asarray(offsets), np.asarray(want_offsets), err_msg=name)


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("case", IDS)
def test_select_matches_reference(case, kind):
  geom = _geom(case)
  args, kwargs = _ref_kwargs(case)
  mirror = reference.max_pool if kind == "max" else reference.min_pool
  for name, x in _inputs(CASES[case][-1], seed=1).items():
    values, offsets = _jit_select(jnp.asarray(x), geom, kind)
    indices = flat_indices(offsets, geom)
    want_values, want_indices = mirror(x, **args, **kwargs)
    np.testing.assert_array_equal(np.asarray(values), want_values, err_msg=name)
    np.testing.assert_array_equal(np.asarray(indices), want_indices, err_msg=name)


def _max_vjp(select, geom):
  """``(x, ct) -> `` the VJP of a max's values: one compiled program, reused for each ``ct``.

  (Run eagerly, a VJP dispatches, and compiles, every op of the unrolled oracle alone.)
  """
  return jax.jit(lambda x, ct: jax.vjp(lambda v: select(v, geom, "max")[0], x)[1](ct)[0])


@pytest.mark.slow
@pytest.mark.parametrize("case", IDS)
def test_max_grad_matches_reference_and_unrolled(case):
  geom = _geom(case)
  args, kwargs = _ref_kwargs(case)
  x = _inputs(CASES[case][-1], seed=2)["int32"].astype(np.float32)  # ties everywhere
  out_shape = (x.shape[0], *geom.out_shape, x.shape[-1])
  # Integer-valued cotangents: every accumulation is exact, whatever its order.
  g = np.random.default_rng(3).integers(-4, 5, out_shape).astype(np.float32)
  vjp, vjp_unrolled = _max_vjp(_select, geom), _max_vjp(_window_select, geom)
  grad, want_unrolled = vjp(x, g), vjp_unrolled(x, g)
  np.testing.assert_array_equal(np.asarray(grad), np.asarray(want_unrolled))
  np.testing.assert_array_equal(np.asarray(grad), reference.max_pool_grad(x, g, **args, **kwargs))
  # Float cotangents: equal up to the order of accumulation over overlapping windows.
  g = np.random.default_rng(4).normal(size=out_shape).astype(np.float32)
  grad, want_unrolled = vjp(x, g), vjp_unrolled(x, g)
  np.testing.assert_allclose(np.asarray(grad), np.asarray(want_unrolled), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("case", ["9x9-overlap-pad", "12x5-ceil-pad", "5x5x5"])
def test_select_jvp_and_min_grad(case, kind):
  geom = _geom(case)
  args, kwargs = _ref_kwargs(case)
  x = _inputs(CASES[case][-1], seed=5)["special"]
  t = np.random.default_rng(6).integers(-4, 5, x.shape).astype(np.float32)
  # Each transformation compiled once (run eagerly, it would compile op by op).
  (values, offsets), (t_values, t_offsets) = jax.jit(
      lambda x, t: jax.jvp(lambda v: _select(v, geom, kind), (x,), (t,)))(x, t)
  _, (want_t, _) = jax.jit(
      lambda x, t: jax.jvp(lambda v: _window_select(v, geom, kind), (x,), (t,)))(x, t)
  assert t_offsets.dtype == jax.dtypes.float0
  np.testing.assert_array_equal(np.asarray(t_values), np.asarray(want_t))
  g = np.random.default_rng(7).integers(-4, 5, values.shape).astype(np.float32)
  grad = jax.jit(jax.grad(lambda x: (_select(x, geom, kind)[0] * g).sum()))(x)
  want = reference.max_pool_grad(x, g, **args, **kwargs, kind=kind)
  np.testing.assert_array_equal(np.asarray(grad), want)


def test_select_second_derivative_is_zero():
  geom = _geom("9x9-overlap-pad")
  x = jnp.asarray(_inputs(CASES["9x9-overlap-pad"][-1], seed=8)["normal"])
  v = jnp.ones_like(x)
  hvp = jax.jit(lambda x, v: jax.jvp(jax.grad(lambda x: select(x, geom, "max")[0].sum()), (x,),
                                      (v,))[1])(x, v)
  np.testing.assert_array_equal(np.asarray(hvp), 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("case", IDS)
def test_window_sum_matches_unrolled_and_reference(case):
  geom = _geom(case)
  window, strides, padding, dilation, _, shape = CASES[case]
  # Multiples of 1/8: float32 sums are exact in any order, so both paths agree to 1e-6.
  x = _inputs(shape, seed=9)["int32"].astype(np.float32) / 8
  total = jax.jit(_sum, static_argnums=1)(jnp.asarray(x), geom)
  unrolled = jax.jit(tap_sum, static_argnums=1)
  want = unrolled(jnp.asarray(x), geom)
  np.testing.assert_allclose(np.asarray(total), np.asarray(want), rtol=1e-6, atol=1e-6)
  g = np.random.default_rng(10).integers(-4, 5, total.shape).astype(np.float32) / 8
  # Each transformation compiled once (run eagerly, it would compile op by op).
  vjp_of = lambda fn: jax.jit(lambda x, ct: jax.vjp(fn, x)[1](ct)[0])  # noqa: E731
  grad = vjp_of(lambda x: _sum(x, geom))(x, g)
  want_grad = vjp_of(lambda x: tap_sum(x, geom))(x, g)
  np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-6, atol=1e-6)
  # Normal floats: the summation order differs, so float32 rounding differs slightly.
  t = _inputs(shape, seed=11)["normal"]
  jvp = jax.jit(lambda x, t: jax.jvp(lambda v: _sum(v, geom), (x,), (t,))[1])(x, t)
  np.testing.assert_allclose(
      np.asarray(jvp), np.asarray(unrolled(jnp.asarray(t), geom)), rtol=1e-5, atol=1e-5
  )
  if all(d == 1 for d in dilation):  # reference.avg_pool has no dilation
    ref = reference.avg_pool(
        x.astype(np.float64), window, strides, padding, ceil_mode=CASES[case][4],
        divisor_override=1,
    )
    np.testing.assert_allclose(np.asarray(total), ref, rtol=1e-6, atol=1e-6)


def test_modules_match_reference_on_large_windows():
  x = _inputs((1, 20, 19, 3), seed=12)["special"]
  values, indices = MaxPool((9, 9), strides=(2, 3), padding=((4, 4), (1, 3)), ceil_mode=True,
                            return_indices=True)(jnp.asarray(x))
  want_values, want_indices = reference.max_pool(x, (9, 9), (2, 3), ((4, 4), (1, 3)),
                                                 ceil_mode=True)
  np.testing.assert_array_equal(np.asarray(values), want_values)
  np.testing.assert_array_equal(np.asarray(indices), want_indices)
  x = _inputs((1, 20, 19, 3), seed=13)["normal"]
  for count_include_pad in (True, False):
    got = AvgPool((9, 9), strides=2, padding=((4, 4), (1, 3)), ceil_mode=True,
                  count_include_pad=count_include_pad)(jnp.asarray(x))
    want = reference.avg_pool(x, (9, 9), (2, 2), ((4, 4), (1, 3)), ceil_mode=True,
                              count_include_pad=count_include_pad)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)


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
