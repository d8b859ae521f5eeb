"""Tests for nnx_pool._geometry: output sizes, padding resolution and divisors."""

import jax.numpy as jnp
import numpy as np
import pytest

from nnx_pool import AvgPool, LPPool, MaxPool, MinPool
from nnx_pool import functional as F
from nnx_pool._geometry import Window
from nnx_pool._spatial_args import as_tuple, parse_padding


def _out(length, k, s, padding=0, *, dilation=1, ceil_mode=False):
  window = Window.create(k, s, padding, dilation=dilation, ceil_mode=ceil_mode, num_spatial_dims=1)
  return window.resolve((length,)).out_shape[0]


@pytest.mark.parametrize(
    "k, s, expected",
    # PyTorch 2.13 CPU, F.max_pool2d(zeros(1, 1, 4, 4), k, s).shape[-1]: 4x4, no padding.
    [(2, 2, 2), (3, 1, 2), (2, 1, 3), (4, 1, 1), (1, 1, 4), (3, 2, 1), (1, 3, 2)],
)
def test_geometry_output_size_seed_table(k, s, expected):
  assert _out(4, k, s) == expected


def test_geometry_ceil_mode_keeps_last_window_inside():
  # PyTorch: L=10, k=1, s=2, ceil gives 5 (a 6th window would start at 10 = L + lo).
  assert _out(10, 1, 2, ceil_mode=True) == 5
  # 7x7, k2 s3 ceil: ceil((7 - 2) / 3) + 1 = 3, last start 6 < 7 (PyTorch 2.13 CPU: 3).
  assert _out(7, 2, 3, ceil_mode=True) == 3
  assert _out(7, 2, 3) == 2
  # L=5, k=2, s=2, pad 1: ceil((5 + 2 - 2) / 2) + 1 = 4, last start 6 >= 5 + 1 -> 3.
  assert _out(5, 2, 2, 1, ceil_mode=True) == 3


def test_geometry_same_padding_places_extra_on_high_side():
  # lax/Flax: out = ceil(L / s), total = max((out - 1) * s + k - L, 0).
  geom = Window.create((3, 2), (2, 1), "same").resolve((6, 5))
  assert geom.out_shape == (3, 5)
  # dim 0: total = 2 * 2 + 3 - 6 = 1 -> (0, 1); dim 1: total = 4 + 2 - 5 = 1 -> (0, 1).
  assert [(d.pad_low, d.pad_high) for d in geom.dims] == [(0, 1), (0, 1)]
  geom = Window.create((4,), 1, "SAME").resolve((5,))
  assert (geom.dims[0].pad_low, geom.dims[0].pad_high) == (1, 2)


def test_geometry_divisors_follow_pytorch():
  # AvgPool1d(k3, s1, p1) on L=5: including pads 3 everywhere; excluding [2, 3, 3, 3, 2].
  geom = Window.create((3,), 1, 1).resolve((5,))
  np.testing.assert_array_equal(geom.divisor(count_include_pad=True), [3, 3, 3, 3, 3])
  np.testing.assert_array_equal(geom.divisor(count_include_pad=False), [2, 3, 3, 3, 2])
  # 7x7, k2 s3 ceil: the last window [6, 8) is clipped to [6, 7): divisor 1 per dim.
  geom = Window.create((2, 2), 3, ceil_mode=True).resolve((7, 7))
  np.testing.assert_array_equal(
      geom.divisor(count_include_pad=True), [[4, 4, 2], [4, 4, 2], [2, 2, 1]]
  )


def test_geometry_first_real_offset_skips_left_padding():
  # k3 s1 p1 over L=4: window 0 starts on padding, its first real tap is offset 1.
  geom = Window.create((3, 3), 1, 1).resolve((4, 4))
  first = geom.first_real_offset()
  assert first[0, 0] == 1 * 3 + 1  # row-major offset of tap (1, 1)
  assert first[0, 2] == 1 * 3 + 0
  assert first[2, 0] == 0 * 3 + 1
  assert first[1, 1] == 0


def _brute_counts(length, k, s, d, lo, hi, out):
  """Every tap enumerated: (real count, count inside [-lo, L + hi), first real tap)."""
  real, padded, first = [], [], []
  for i in range(out):
    pos = [i * s - lo + j * d for j in range(k)]
    on_real = [0 <= p < length for p in pos]
    real.append(sum(on_real))
    padded.append(sum(-lo <= p < length + hi for p in pos))
    first.append(on_real.index(True) if any(on_real) else 0)
  return real, padded, first


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("length", [1, 2, 5, 7])
def test_geometry_closed_form_counts_match_every_tap_enumerated(length, ceil_mode):
  checked = 0
  for k in range(1, 6):
    for s in range(1, 5):
      for d in range(1, 4):
        half = (d * (k - 1) + 1) // 2
        for lo in range(half + 1):
          for hi in range(half + 1):
            try:
              (dim,) = Window.create(k, s, ((lo, hi),), dilation=d,
                                     ceil_mode=ceil_mode).resolve((length,)).dims
            except ValueError:
              continue
            real, padded, first = _brute_counts(length, k, s, d, lo, hi, dim.out)
            np.testing.assert_array_equal(dim.real_count(), real)
            np.testing.assert_array_equal(dim.padded_count(), padded)
            np.testing.assert_array_equal(dim.first_real_tap(), first)
            checked += 1
  assert checked >= 50  # configurations that resolve, even for L = 1


def test_geometry_keeps_only_the_taps_that_reach_the_padded_input():
  # Ceil mode, L=4, k=10**12 (stride 10**12): one window, of which taps 0-3 are real.
  (dim,) = Window.create((10**12,), ceil_mode=True).resolve((4,)).dims
  assert (dim.out, dim.window, dim.stride, dim.applied_high) == (1, 4, 1, 0)
  np.testing.assert_array_equal(dim.real_count(), [4])
  # L=5, k=4, s=3, pad 1, ceil: windows start at -1 and 2; reach = 2 + 4 = 6 = L + 1.
  (dim,) = Window.create((4,), 3, 1, ceil_mode=True).resolve((5,)).dims
  assert (dim.out, dim.window, dim.stride) == (2, 4, 3)


def test_geometry_strides_default_to_window():
  assert Window.create((2, 3)).strides == (2, 3)
  assert Window.create((2, 3), 1).strides == (1, 1)


@pytest.mark.parametrize(
    "value, error, match",
    [
        (0, ValueError, "must be >= 1"),
        (-2, ValueError, "must be >= 1"),
        ((2, 0), ValueError, "must be >= 1"),
        (2.0, TypeError, "an int or a tuple of ints"),
        ((2, 2, 2), ValueError, "one entry per spatial dim"),
        ("2", TypeError, "an int or a tuple of ints"),
    ],
)
def test_geometry_as_tuple_rejects(value, error, match):
  with pytest.raises(error, match=match):
    as_tuple(value, 2, "strides")


@pytest.mark.parametrize(
    "padding, error, match",
    [
        ("FULL", ValueError, "VALID"),
        (-1, ValueError, "non-negative"),
        ((1,), ValueError, "one entry per spatial dim"),
        (((1, 2, 3), (0, 0)), TypeError, r"\(low, high\) pairs"),
        (1.5, TypeError, "VALID"),
        (None, TypeError, "VALID"),
    ],
)
def test_geometry_parse_padding_rejects(padding, error, match):
  with pytest.raises(error, match=match):
    parse_padding(padding, 2)


def test_geometry_parse_padding_forms():
  assert parse_padding("valid", 2) == "VALID"
  assert parse_padding("Same", 2) == "SAME"
  assert parse_padding(1, 2) == ((1, 1), (1, 1))
  assert parse_padding((1, 0), 2) == ((1, 1), (0, 0))
  assert parse_padding(((0, 1), (1, 0)), 2) == ((0, 1), (1, 0))


def test_geometry_rejects_padding_over_half_the_effective_window():
  with pytest.raises(ValueError, match="at most half the effective window"):
    Window.create((2, 2), 2, 2)
  # Dilation widens the effective window: k3 d2 has e = 5, so padding 2 is allowed.
  assert Window.create((3,), 1, 2, dilation=2).resolve((6,)).out_shape == (6,)


def test_geometry_rejects_window_larger_than_input():
  # PyTorch: "Output size is too small"; Flax silently returns a zero-size array.
  with pytest.raises(ValueError, match="Output size is too small"):
    Window.create((5, 5)).resolve((4, 4))


def test_geometry_rejects_windows_of_padding_only():
  # k2 d3 (e = 4) with padding 2 over L = 2: window 0 has taps -2 and 1 (one real cell),
  # window 1 has taps -1 and 2, both padding.
  with pytest.raises(ValueError, match="covers only padding"):
    Window.create((2,), 1, 2, dilation=3).resolve((2,))


def test_geometry_rejects_ceil_mode_with_same():
  with pytest.raises(ValueError, match="SAME already rounds"):
    Window.create(2, 2, "SAME", ceil_mode=True)


# ----------------------------------------------------------------------------
# A window that does not fit: which layer, and the ways out.
# ----------------------------------------------------------------------------


def test_a_window_too_large_names_the_layer_and_the_ways_out():
  # The issue's example: MaxPool(5) on (1, 3, 3, 2). Before: only "Output size is too
  # small: spatial dim 0 ...", with no layer and no way out.
  with pytest.raises(ValueError) as info:
    MaxPool(5)(jnp.ones((1, 3, 3, 2)))
  assert str(info.value) == (
      "MaxPool(window_shape=(5, 5), strides=(5, 5)) on spatial shape (3, 3): Output size is "
      "too small: spatial dim 0 of length 3 with window 5, dilation 1 (effective 5), stride 5 "
      "and padding (0, 0) gives 0 outputs. The window must fit in the padded input. Ways out: "
      "padding of 1 on each side of dim 0, ceil_mode=True, a window of at most 3 along dim 0, "
      "or AdaptiveMaxPool(output_size), which fits any input.")


@pytest.mark.parametrize("call, layer, ways", [
    # Each way out checked by hand with PyTorch's size rule on L = 2, k = 3, s = 3:
    # padding 1 gives (2 + 2 - 3) // 3 + 1 = 1; ceil gives ceil(-1 / 3) + 1 = 1.
    (lambda x: AvgPool(3)(x), "AvgPool(window_shape=(3, 3), strides=(3, 3))",
     "padding of 1 on each side of dim 0, ceil_mode=True, a window of at most 2 along dim 0, "
     "or AdaptiveAvgPool(output_size), which fits any input."),
    (lambda x: MinPool(3)(x), "MinPool(window_shape=(3, 3), strides=(3, 3))",
     "padding of 1 on each side of dim 0, ceil_mode=True, or a window of at most 2 along "
     "dim 0."),
    # LPPool takes no padding: none is suggested.
    (lambda x: LPPool(2, 3)(x), "LPPool(window_shape=(3, 3), strides=(3, 3))",
     "ceil_mode=True, or a window of at most 2 along dim 0."),
    # Stride 1: ceil mode gives ceil(-1 / 1) + 1 = 0 outputs, so it is not offered.
    (lambda x: F.max_pool(x, 3, 1), "max_pool(window_shape=(3, 3), strides=(1, 1))",
     "padding of 1 on each side of dim 0, a window of at most 2 along dim 0, or "
     "adaptive_max_pool(output_size), which fits any input."),
    # Already ceil mode with padding 1: only a smaller window or the adaptive pool.
    (lambda x: MaxPool(5, 1, 1, ceil_mode=True)(x),
     "MaxPool(window_shape=(5, 5), strides=(1, 1), padding=((1, 1), (1, 1)), ceil_mode=True)",
     "padding of 2 on each side of dim 0, a window of at most 4 along dim 0, or "
     "AdaptiveMaxPool(output_size), which fits any input."),
])
def test_each_way_out_is_offered_only_where_it_fits(call, layer, ways):
  with pytest.raises(ValueError) as info:
    call(jnp.ones((1, 2, 2, 1)))
  message = str(info.value)
  assert message.startswith(f"{layer} on spatial shape (2, 2): Output size is too small")
  assert message.endswith(f"Ways out: {ways}")


def test_each_suggested_way_out_really_fits():
  # The suggestions of the first test, applied: each gives one output along dim 0.
  x = jnp.ones((1, 3, 3, 2))
  assert MaxPool(5, padding=1)(x).shape == (1, 1, 1, 2)
  assert MaxPool(5, ceil_mode=True)(x).shape == (1, 1, 1, 2)
  assert MaxPool(3)(x).shape == (1, 1, 1, 2)


def test_the_padding_limit_names_the_layer_and_the_ways_out():
  with pytest.raises(ValueError) as info:
    MaxPool(3, padding=2)
  assert str(info.value) == (
      "MaxPool(window_shape=(3, 3), strides=(3, 3), padding=((2, 2), (2, 2))): `padding` must "
      "be at most half the effective window on each side (dim 0: window 3, dilation 1, so at "
      "most 1); got 2. PyTorch refuses it too. Ways out: padding of at most 1 there, or pad "
      "the input first with jnp.pad (-inf for a max pool, +inf for a min pool, 0 for an "
      "average that counts padding) and pool it with less padding.")
  with pytest.raises(ValueError, match=r"^avg_pool\(window_shape=\(2, 2\), strides=\(2, 2\), "
                                       r"padding=\(\(2, 2\), \(2, 2\)\)\): `padding` must"):
    F.avg_pool(jnp.ones((1, 4, 4, 1)), 2, 2, 2)
