"""Tests for the canonical batch: its inputs, its declarations, and a few real cases end to end."""

import ml_dtypes
import numpy as np
import pytest

from nnx_pool.regression import commands, store
from nnx_pool.regression.batch import (
    BUILDERS,
    Case,
    build_cases,
    call,
    case,
    load_batch,
    select,
)
from nnx_pool.regression.inputs import INPUTS, make_cotangent, make_input
from nnx_pool.regression.runner import run_case


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
  with pytest.raises(TypeError, match="`ctor` must be a call"):
    case("bad", _Recorder, input="one")
  with pytest.raises(TypeError, match="unexpected keyword argument 'window'"):
    case("bad", call(_Recorder, 1), input="one", window=3)


def test_batch_select_by_substring_or_glob():
  cases = [Case(n, lambda: None, input="one") for n in ("max_a", "avg_b", "max_c")]
  assert [c.name for c in select(cases, "max")] == ["max_a", "max_c"]
  assert [c.name for c in select(cases, "*_b")] == ["avg_b"]


@pytest.fixture(scope="module")
def batch():
  return load_batch()


def test_batch_covers_every_public_module(batch):
  assert batch.notes == []
  for builder in BUILDERS:
    assert builder(), builder.__name__


def test_batch_every_case_constructs_its_module(batch):
  # Cheap (no compile): catches a builder whose signature drifted from the module's.
  assert len({c.name for c in batch.cases}) == len(batch.cases)
  for c in batch.cases:
    c.build()


def test_batch_spans_inputs_dtypes_and_options(batch):
  cases = batch.cases
  inputs = {c.input for c in cases}
  assert {"one", "unbatched", "batch", "zeros", "asym", "ints", "extreme", "nonfinite",
          "bad_rank"} <= inputs
  assert {"float32", "float16", "bfloat16", "int8", "int32"} <= {c.dtype for c in cases}
  configs = " ".join(c.config for c in cases)
  for option in ("dilation=2", "ceil_mode=True", "return_indices=True", "in_features=2",
                 "'SAME'", "count_include_pad=False", "divisor_override=3", "((0, 1), (1, 0))"):
    assert option in configs, option
  per_module = {}
  for c in cases:
    per_module.setdefault(c.module, set()).add(c.input)
  for module in ("MaxPool", "MinPool", "AvgPool", "LPPool"):
    assert "bad_rank" in per_module[module] and "nonfinite" in per_module[module], module


# Real cases that exercise each machinery path: indices with NaN, ties with the
# sum rule, exact integer averages, extreme magnitudes, bfloat16, an error case.
REAL = ["max_k2_indices_nonfinite", "max_k2s1_ties_zeros", "avg_k3s1p1_ints",
        "avg_k2s1_extreme", "lp2_k2_bf16_batch", "min_bad_rank", "max_k3s1p1_int8_ints"]


def test_batch_real_cases_record_then_check_clean(batch, tmp_path):
  cases = [c for c in batch.cases if c.name in REAL]
  assert sorted(c.name for c in cases) == sorted(REAL)
  out = tmp_path / "baseline"
  recorded = commands.record(cases, out, reps=3)
  assert recorded.exit_code == 0, [r.details for r in recorded.rows]
  checked = commands.check(cases, out, reps=3)
  assert checked.exit_code == 0, [(r.case, r.details) for r in checked.rows]
  base = store.read_baseline(out)
  cases_json = base.manifest["cases"]
  assert cases_json["max_k2s1_ties_zeros"]["results"]["grad/input"]["rule"] == "sum"
  assert cases_json["avg_k3s1p1_ints"]["results"]["output"]["rule"] == "exact"
  assert cases_json["min_bad_rank"]["raises"]["type"] == "ValueError"
  assert "grad/input" not in cases_json["max_k3s1p1_int8_ints"]["results"]  # no int gradients
  # NaN propagates through max pooling and is what the index points at (seed facts).
  values = base.arrays["max_k2_indices_nonfinite/output"]
  indices = base.arrays["max_k2_indices_nonfinite/indices"]
  assert np.isnan(values[0, 0, 0, 0]) and indices[0, 0, 0, 0] == 1
  assert values[0, 0, 0, 1] == np.inf


def test_batch_run_case_reports_an_unexpected_error():
  def broken():
    raise RuntimeError("cannot build")

  run = run_case(Case("broken", broken, input="one"))
  assert run.error == "RuntimeError: cannot build"
