"""Tests for the canonical batch: its inputs, its declarations, and a few real cases end to end."""

import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from nnx_pool import reference
from nnx_pool.regression import store
from nnx_pool.regression.batch import (
  BUILDERS,
  Case,
  build_cases,
  call,
  case,
  load_batch,
  select,
  selects_none,
)
from nnx_pool.regression.batch.inputs import INPUTS, make_cotangent, make_input, uniform
from nnx_pool.regression.batch.runner import run_case
from nnx_pool.regression.stamp import SHIPPED


def test_batch_inputs_are_deterministic():
  for name in INPUTS:
    a, b = make_input(name), make_input(name)
    assert store.digest(a) == store.digest(b), name


def test_batch_inputs_have_the_promised_properties():
  # Distinct-grid inputs are exact (and tie-free) in bfloat16 and float16.
  for name in ("one", "unbatched", "bad_rank", "nchw"):
    x = make_input(name, "float64")
    for low in (ml_dtypes.bfloat16, np.float16):
      assert np.array_equal(x.astype(low).astype(np.float64), x), (name, low)
    assert np.unique(x).size == x.size
  ints = make_input("ints")
  assert np.array_equal(ints, np.round(ints)) and ints.min() >= -8 and ints.max() <= 8
  extreme = make_input("extreme")
  assert (extreme[..., 0] > 0).all() and (extreme[..., 1] < 0).all()
  assert np.abs(extreme).min() < np.finfo(np.float32).tiny  # a subnormal is included
  nonfinite = make_input("nonfinite")
  assert np.isnan(nonfinite).sum() == 2 and np.isinf(nonfinite).sum() == 4
  assert not make_input("zeros").any()
  assert make_input("ints", "int8").dtype == np.int8
  ct = make_cotangent((2, 3), np.float32)
  assert ct.min() == 1 and ct.max() == 5 and np.array_equal(ct, np.round(ct))


def test_batch_inputs_refuse_a_lossy_integer_cast():
  with pytest.raises(ValueError, match="input 'batch' is not integer-valued.*`dtype` 'int32'"):
    make_input("batch", "int32")
  with pytest.raises(ValueError, match="`name` must be one of"):
    make_input("nope")


def test_batch_case_validates_its_fields():
  with pytest.raises(ValueError, match="`input` must be one of"):
    Case("c", lambda: None, input="missing")
  with pytest.raises(ValueError, match="`tolerance` must be one of"):
    Case("c", lambda: None, input="one", tolerance="loose")
  with pytest.raises(ValueError, match="`name` must be letters"):
    Case("a b", lambda: None, input="one")


def test_batch_notes_public_modules_no_case_covers():
  batch = build_cases([lambda: [Case("thing", lambda: None, input="one", module="MaxPool")]])
  assert [c.name for c in batch.cases] == ["thing"]
  (note,) = batch.notes
  assert note.startswith("public modules with no regression cases: AdaptiveAvgPool, ")
  assert ", MaxPool," not in note and ", MinPool," in note


def test_batch_refuses_a_case_name_used_twice():
  twice = [Case("same", lambda: None, input="one"), Case("same", lambda: None, input="zeros")]
  with pytest.raises(ValueError, match="case name 'same' is used twice"):
    build_cases([lambda: twice])


class _Recorder:
  """Stands in for a module whose constructor takes a `dtype` of its own."""

  def __init__(self, features, *, dtype=None, rngs=None):
    self.features, self.dtype, self.rngs = features, dtype, rngs


def test_batch_constructor_kwargs_are_apart_from_case_fields():
  # The module's dtype reaches its constructor; the case's dtype is the input's.
  c = case("rec", call(_Recorder, 8, dtype="bfloat16"), input="one", dtype="float16",
           tolerance="select")
  built = c.build()
  assert (built.features, built.dtype, built.rngs) == (8, "bfloat16", None)
  assert c.dtype == "float16" and c.tolerance == "select"
  assert c.config == "_Recorder(8, dtype='bfloat16')" and c.module == "_Recorder"
  with_params = case("rec_p", call(_Recorder, 4), input="one", params=True)
  assert with_params.config == "_Recorder(4, rngs=nnx.Rngs(0))"
  assert with_params.build().rngs is not None
  # A module whose parameters come from its arguments (GeMPool's p) takes no rngs.
  fixed = case("rec_f", call(_Recorder, 4), input="one", params=True, rngs=False)
  assert fixed.params and fixed.config == "_Recorder(4)" and fixed.build().rngs is None
  with pytest.raises(TypeError, match="`ctor` must be a call"):
    case("bad", _Recorder, input="one")
  with pytest.raises(TypeError, match="unexpected keyword argument 'window'"):
    case("bad", call(_Recorder, 1), input="one", window=3)


def test_batch_select_by_substring_or_glob():
  cases = [Case(n, lambda: None, input="one") for n in ("max_a", "avg_b", "max_c")]
  assert [c.name for c in select(cases, "max")] == ["max_a", "max_c"]
  assert [c.name for c in select(cases, "*_b")] == ["avg_b"]


def test_batch_select_avg_is_a_substring_as_pytest_reads_a_word_and_a_glob_anchors_it():
  # Issue 36, item 16: `-k avg_` also selects the global, adaptive and select averages, as
  # pytest's `-k avg_` would; the glob `avg_*` is matched against the whole name.
  names = ("avg_k2_one", "global_avg_batch", "adaptive_avg_1d_seq", "select_avg_batch",
           "max_k2_one")
  cases = [Case(n, lambda: None, input="one") for n in names]
  assert [c.name for c in select(cases, "avg_")] == list(names[:4])
  assert [c.name for c in select(cases, "avg_*")] == ["avg_k2_one"]
  assert selects_none("avg_", names) is None
  assert selects_none("avg_k2_on3", names) == (
      "-k 'avg_k2_on3' selects none of the 5 cases (the nearest: avg_k2_one); a case is "
      "selected when its name contains PATTERN, as pytest's -k matches a word (-k avg_ also "
      "selects global_avg_batch), or matches it as a glob (-k 'avg_*': the names that start "
      "with avg_).")


@pytest.fixture(scope="module")
def batch():
  return load_batch()


def test_batch_covers_every_public_module(batch):
  assert batch.notes == []
  for builder in BUILDERS:
    assert builder(), builder.__name__


def test_batch_every_case_constructs_its_module(batch):
  # Catches a builder whose signature drifted from the module's. A module with weights is
  # built abstractly (nnx.eval_shape): its constructor runs, its initialisers are traced,
  # not compiled (built for real, 12 initialisers compiled in 2.3 s of this test's 3.0 s).
  assert len({c.name for c in batch.cases}) == len(batch.cases)
  for c in batch.cases:
    built = nnx.eval_shape(c.build) if c.params else c.build()
    assert callable(built), c.name


def test_batch_spans_inputs_dtypes_and_options(batch):
  cases = batch.cases
  inputs = {c.input for c in cases}
  assert {"one", "unbatched", "batch", "zeros", "asym", "ints", "extreme", "nonfinite",
          "bad_rank"} <= inputs
  assert {"float32", "float16", "bfloat16", "int8", "int32"} <= {c.dtype for c in cases}
  configs = " ".join(c.config for c in cases)
  for option in ("dilation=2", "ceil_mode=True", "return_indices=True", "in_features=2",
                 "'SAME'", "count_include_pad=False", "divisor_override=3", "((0, 1), (1, 0))",
                 "circular=True", "add_maxpool=True, norm=True"):
    assert option in configs, option
  per_module = {}
  for c in cases:
    per_module.setdefault(c.module, set()).add(c.input)
  for module in ("MaxPool", "MinPool", "AvgPool", "LPPool"):
    assert "bad_rank" in per_module[module] and "nonfinite" in per_module[module], module


# The shipped baseline, checked against the NumPy mirror (nnx_pool.reference, PyTorch's rules
# written out with loops) on the inputs stored beside the results: cases that exercise each
# path of the machinery, indices with NaN, ties under the sum rule, exact integer averages,
# extreme magnitudes, bfloat16, an int8 window with padding, an error case.
@pytest.fixture(scope="module")
def shipped():
  return store.read_baseline(SHIPPED)


def _stored(shipped, case: str) -> dict[str, np.ndarray]:
  return {k.split("/", 1)[1]: v for k, v in shipped.arrays.items() if k.startswith(f"{case}/")}


def _close(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> None:
  assert actual.dtype == expected.dtype and actual.shape == expected.shape
  np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=rtol,
                             atol=atol, equal_nan=True)


def _avg_grad_3x3_pad1(ct: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """The gradient of nn.AvgPool2d(3, 1, 1) (count_include_pad: every divisor 9), by hand."""
  grad = np.zeros(shape)
  for n, oh, ow, c in np.ndindex(ct.shape):
    for ih in range(oh - 1, oh + 2):
      for iw in range(ow - 1, ow + 2):
        if 0 <= ih < shape[1] and 0 <= iw < shape[2]:
          grad[n, ih, iw, c] += ct[n, oh, ow, c] / 9
  return grad


def test_batch_shipped_selections_match_the_mirror(shipped):
  a = _stored(shipped, "max_k2_indices_nonfinite")
  values, indices = reference.max_pool(a["input"], (2, 2), (2, 2), "VALID")
  assert np.array_equal(a["output"], values, equal_nan=True)
  assert np.array_equal(a["indices"], indices) and a["indices"].dtype == np.int32
  grad = reference.max_pool_grad(a["input"], a["cotangent"], (2, 2), (2, 2), "VALID")
  assert np.array_equal(a["grad/input"], grad)
  # NaN propagates through max pooling and is what the index points at (seed facts).
  assert np.isnan(a["output"][0, 0, 0, 0]) and a["indices"][0, 0, 0, 0] == 1
  assert a["output"][0, 0, 0, 1] == np.inf
  ints = _stored(shipped, "max_k3s1p1_int8_ints")
  values, _ = reference.max_pool(ints["input"], (3, 3), (1, 1), ((1, 1), (1, 1)))
  assert ints["input"].dtype == np.int8 and np.array_equal(ints["output"], values)
  assert "grad/input" not in ints  # no integer gradients
  ties = _stored(shipped, "max_k2s1_ties_zeros")
  values, indices = reference.max_pool(ties["input"], (2, 2), (1, 1), "VALID")
  assert np.array_equal(ties["output"], values) and np.array_equal(ties["indices"], indices)
  # Under ties only the totals per sample and channel are pinned: every cotangent lands once.
  assert np.array_equal(ties["grad/input"].sum(axis=(1, 2)), ties["cotangent"].sum(axis=(1, 2)))


def test_batch_shipped_averages_match_the_mirror(shipped):
  ints = _stored(shipped, "avg_k3s1p1_ints")
  assert np.array_equal(ints["output"], reference.avg_pool(ints["input"], (3, 3), (1, 1),
                                                           ((1, 1), (1, 1))))  # exact
  grad = _avg_grad_3x3_pad1(ints["cotangent"], ints["input"].shape).astype(np.float32)
  _close(ints["grad/input"], grad, 4e-6, 4e-6)
  extreme = _stored(shipped, "avg_k2s1_extreme")
  _close(extreme["output"], reference.avg_pool(extreme["input"], (2, 2), (1, 1), "VALID"),
         1e-6, float(np.finfo(np.float32).tiny))
  lp = _stored(shipped, "lp2_k2_bf16_batch")
  expected = reference.lp_pool(lp["input"], 2, (2, 2)).astype(ml_dtypes.bfloat16)
  _close(lp["output"], expected, 1e-2, 1e-2)
  batch = _stored(shipped, "global_avg_batch")
  _close(batch["output"], reference.global_avg_pool(batch["input"]), 1e-5, 1e-5)
  asym = _stored(shipped, "adaptive_avg_34_asym")
  _close(asym["output"], reference.adaptive_avg_pool(asym["input"], (3, 4)), 1e-6, 1e-6)


def _grad_at_indices(ct: np.ndarray, indices: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """Each cotangent added to the input cell its flat per-plane index names (n, h, w, c)."""
  grad = np.zeros(shape)
  for pos in np.ndindex(ct.shape):
    h, w = divmod(int(indices[pos]), shape[2])
    grad[pos[0], h, w, pos[-1]] += ct[pos]
  return grad


def test_batch_shipped_family_pools_match_the_mirror(shipped):
  gem = _stored(shipped, "gem_p3_positive")
  assert gem["weights/p"].tolist() == [3.0]
  _close(gem["output"], reference.gem_pool(gem["input"], 3.0), 1e-5, 1e-5)
  lse = _stored(shipped, "lse_plus_r10_batch")
  assert lse["weights/r"] == 10.0
  _close(lse["output"], reference.lse_plus_pool(lse["input"], 10.0), 1e-5, 1e-5)
  # Multiples of 1/8 times the [1, 2, 1] x [1, 2, 1] / 16 taps: every sum is exact.
  blur = _stored(shipped, "blur_f3s2_one")
  assert np.array_equal(blur["output"], reference.blur_pool(blur["input"], (3, 3), (2, 2)))
  median = _stored(shipped, "median_k3_same_one")
  values, indices = reference.median_pool(median["input"], (3, 3), (1, 1), "SAME")
  assert np.array_equal(median["output"], values)
  grad = _grad_at_indices(median["cotangent"], indices, median["input"].shape)
  assert np.array_equal(median["grad/input"], grad.astype(np.float32))


def test_batch_fractional_case_matches_the_mirror_per_copy(shipped):
  # The case's samples: SplitMix64 draws fixed by its declaration, one (C, 2) per example.
  (c,) = [c for c in load_batch().cases if c.name == "fractional_max_k3_out34_indices_asym"]
  frac = _stored(shipped, c.name)
  samples = uniform((2, 3, 2), 29).astype(np.float32)
  values, indices = reference.fractional_max_pool(frac["input"], (3, 3), (3, 4), samples)
  assert np.array_equal(frac["output"], values) and np.array_equal(frac["indices"], indices)
  grad = _grad_at_indices(frac["cotangent"], indices, frac["input"].shape)
  assert np.array_equal(frac["grad/input"], grad.astype(np.float32))
  # Two copies of the batch (check --devices 2) take two copies of the samples.
  out, idx = c.build()(np.concatenate([frac["input"]] * 2))
  assert np.array_equal(out, np.concatenate([values] * 2))
  assert np.array_equal(idx, np.concatenate([indices] * 2))


def test_batch_shipped_declarations_hold_the_documented_rules(shipped):
  cases = shipped.manifest["cases"]
  assert cases["max_k2s1_ties_zeros"]["results"]["grad/input"]["rule"] == "sum"
  assert cases["avg_k3s1p1_ints"]["results"]["output"]["rule"] == "exact"
  assert cases["min_bad_rank"]["raises"]["type"] == "ValueError"
  assert cases["min_bad_rank"]["results"] == {}


def test_batch_run_case_reports_an_unexpected_error():
  def broken():
    raise RuntimeError("cannot build")

  run = run_case(Case("broken", broken, input="one"))
  assert run.error == "RuntimeError: cannot build"
