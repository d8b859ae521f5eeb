"""The regression kit on a real model: a bottleneck ResNet with BatchNorm (tests/_resnet.py).

The logic runs on the narrow ResNet (width 4 and two stages, the same code) through
:class:`nnx_pool.regression.guard.Guard`, the fixture without pytest; one test runs the
8 M-parameter one, for the baseline sizes. Expected values come from Flax itself
(``nnx.grad``, ``nnx.state``), from NumPy on the two models' weights, or by hand (the
pooled shapes).
"""

import functools
import json
import runpy
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_pool import MaxPool
from nnx_pool.regression import cli, store
from nnx_pool.regression.fixture import files
from nnx_pool.regression.fixture.comparison import compare
from nnx_pool.regression.fixture.recording import Recording
from nnx_pool.regression.guard import Guard, RegressionFailure
from nnx_pool.regression.tolerance import tolerance_for

# The model, by path: tests/ is not a package, and a plain `import _resnet` would read as a
# third-party distribution to tests/test_dependencies.py.
_RESNET = runpy.run_path(str(Path(__file__).parent / "_resnet.py"))
ResNet, cross_entropy, images = _RESNET["ResNet"], _RESNET["cross_entropy"], _RESNET["images"]
parameter_count, resnet_cheaply = _RESNET["parameter_count"], _RESNET["resnet_cheaply"]
# Modules filled from NumPy (kernels LeCun-scaled at gain 1, biases 0): Flax's initialisers
# compile once per shape, and these tests need the layers, not their initialisation.
numpy_initialised = _RESNET["numpy_initialised"]

# The narrow ResNet of the logic tests: width 4 and its first two stages (2,926 parameters;
# compile time grows with the layers, and two stages hold every kind: the stem's pool, a
# strided bottleneck with a projected shortcut).
WIDTH, BLOCKS = 4, (1, 1)
X = images(2, 32)  # stem: 32 -> conv stride 2 -> 16 -> MaxPool(3, 2, 1) -> 8
LABELS = jnp.array([3, 7])


@functools.cache
def _built(seed: int, num_classes: int) -> ResNet:
  return resnet_cheaply(width=WIDTH, seed=seed, num_classes=num_classes, blocks=BLOCKS)


def _model(seed: int = 0, num_classes: int = 10) -> ResNet:
  """A fresh copy of one narrow ResNet per seed and head (built once, 0.05 to 0.25 s each; a
  copy takes milliseconds): tests change their copy."""
  return nnx.merge(*nnx.split(_built(seed, num_classes)), copy=True)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
  """Baselines of the narrow ResNet in eval mode: logits (with store_params=True), stem
  features, gradients, recorded once for the module's tests."""
  root = tmp_path_factory.mktemp("recorded") / "test_model"
  guard = Guard(root)
  model = _model()
  assert guard.check("logits", model, X, store_params=True).status == "written"
  assert guard.check("stem", model.stem, X).status == "written"
  # Jit only: the eager gradient compiles every operation of the backward pass one by one
  # (about 6 s of CPU even on these two stages); the eager path of check_grad is tested on
  # _Small below.
  assert guard.check_grad("grads", cross_entropy, model, X, LABELS,
                          eager=False).status == "written"
  return root


@pytest.fixture
def baselines(recorded, tmp_path):
  """A copy of the recorded baselines a test may write beside (obtained files)."""
  shutil.copytree(recorded.parent, tmp_path / "r")
  return tmp_path / "r" / recorded.name


def _failure(call) -> RegressionFailure:
  with pytest.raises(RegressionFailure) as info:
    call()
  return info.value


# ------------------------------------------------------------------ item 1: gradients


class _Small(nnx.Module):
  """A convolution, BatchNorm and a linear head: the ResNet's layers, few enough that an eager
  gradient compiles in a second. Built with :func:`_small` (its values from NumPy)."""

  def __init__(self, rngs):
    self.conv = nnx.Conv(3, 4, (3, 3), rngs=rngs)
    self.bn = nnx.BatchNorm(4, rngs=rngs)
    self.fc = nnx.Linear(4, 10, rngs=rngs)

  def __call__(self, x):
    return self.fc(jnp.mean(jax.nn.relu(self.bn(self.conv(x))), axis=(1, 2)))


_CHEAP = runpy.run_path(str(Path(__file__).parent / "_cheap.py"))


def _small() -> _Small:
  """A :class:`_Small` filled from NumPy (uniform weights, BatchNorm statistics 1): Flax's
  initialisers would compile once per parameter shape, and the tests need the layers, not
  their initialisation."""
  return _CHEAP["build"](_Small)


def _nnx_grad(model, mode):
  """nnx.grad's loss and gradient leaves of ``model`` in ``mode``, compiled (the stored
  results are the jit ones), on a copy: train mode updates the copy's statistics."""
  copy = nnx.merge(*nnx.split(model), copy=True)
  getattr(copy, mode)()
  loss, grads = nnx.jit(nnx.value_and_grad(cross_entropy))(copy, X, LABELS)
  return loss, {"grad/" + "/".join(map(str, path)): np.asarray(jax.tree_util.tree_leaves(v)[0])
                for path, v in nnx.to_flat_state(grads)}


def _assert_gradients(stored, loss, expected):
  assert {k for k in stored if k.startswith("grad/")} == set(expected)
  np.testing.assert_allclose(stored["loss"], np.asarray(loss), rtol=1e-5)
  for key, value in expected.items():
    np.testing.assert_allclose(stored[key], value, rtol=1e-4, atol=1e-6, err_msg=key)


def test_check_grad_records_nnx_grad_of_the_resnet_in_eval_mode(recorded):
  loss, expected = _nnx_grad(_model(), "eval")
  assert len(expected) == len(jax.tree_util.tree_leaves(nnx.state(_model(), nnx.Param)))
  _assert_gradients(store.read_baseline(recorded / "grads").arrays, loss, expected)


def test_check_grad_of_a_batchnorm_model_in_train_mode(tmp_path):
  # Before the fix, split_callable closed over BatchNorm's statistics: under jit, a module
  # in train mode failed with "Cannot mutate BatchStat from a different trace level".
  model = _small()
  model.train()
  guard = Guard(tmp_path)
  assert guard.check_grad("grads", cross_entropy, model, X, LABELS).status == "written"
  _assert_gradients(store.read_baseline(tmp_path / "grads").arrays, *_nnx_grad(model, "train"))
  assert guard.check_grad("grads", cross_entropy, model, X, LABELS).status == "passed"
  assert guard.check("logits", model, X).status == "written"  # the forward in train mode too
  assert guard.check("logits", model, X).status == "passed"


def test_eager_results_that_disagree_with_jit_when_recording_are_kept_beside(tmp_path):
  # One result per output is stored; where eager already disagrees with jit (it can, BatchNorm
  # in train mode), the eager one is kept too and the eager run is compared with it.
  rec = Recording("check", results={"output": np.ones(3, np.float32)},
                       eager={"output": np.array([1, 1, 1.5], np.float32)})
  rec.tolerances = {"output": tolerance_for("model", "output", np.float32)}
  assert set(files.disagreeing_eager(rec)) == {"output_eager"}
  stamp = {"versions": {}, "backend": {}}
  written = files.write(Path(tmp_path) / "t" / "out", rec, stamp, nodeid="t", name="out")
  base = store.read_baseline(Path(tmp_path) / "t" / "out")
  assert set(base.arrays) == {"output", "output_eager"} and written.size > 0
  report = compare(base, rec, stamp, name="out")  # each run against its own: passes
  assert report.exit_code == 0 and [r.case for r in report.rows] == [
      "out:output [jit]", "out:output [eager]"]
  rec.eager["output"] = np.ones(3, np.float32)
  assert files.disagreeing_eager(rec) == {}


class _Dropped(nnx.Module):
  def __init__(self, rngs):
    self.fc = nnx.Linear(3, 4, rngs=rngs)
    self.drop = nnx.Dropout(0.5, rngs=rngs)

  def __call__(self, x):
    return self.drop(self.fc(x))


def _dropped() -> _Dropped:
  return numpy_initialised(lambda: _Dropped(nnx.Rngs(0)), 0, gain=1.0)


class _Gradient(nnx.Module):
  """A user module whose __call__ returns nnx.grad of a loss (the issue's first wall)."""

  def __init__(self, model):
    self.model = model

  def __call__(self, x):
    return nnx.grad(cross_entropy)(self.model, x, LABELS)["fc"]["kernel"]


def test_dropout_in_eval_mode_and_nnx_grad_inside_call_work_under_the_fixture(tmp_path):
  model = _dropped()
  model.eval()
  x = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
  guard = Guard(tmp_path)
  guard.check("dropout", model, x)
  np.testing.assert_allclose(store.read_baseline(tmp_path / "dropout").arrays["output"],
                             np.asarray(model.fc(x)), rtol=1e-6)  # eval: dropout is identity
  guard.check_grad("dropout_grad", lambda m, x: jnp.mean(m(x)), model, x)
  # nnx.grad inside __call__, of a model with BatchNorm: before the fix, "Cannot extract graph
  # node from different trace level, got BatchStat(...)".
  small = _small()
  small.eval()
  inner = _Gradient(small)
  guard.check("inner_grad", inner, X)
  reference = nnx.grad(cross_entropy)(small, X, LABELS)["fc"]["kernel"]
  np.testing.assert_allclose(store.read_baseline(tmp_path / "inner_grad").arrays["output"],
                             np.asarray(jax.tree_util.tree_leaves(reference)[0]), rtol=1e-5)
  assert guard.check("inner_grad", inner, X).status == "passed"


def test_check_grad_refuses_what_it_cannot_differentiate(tmp_path):
  guard = Guard(tmp_path)
  model = _dropped()
  x = jnp.ones((2, 3))
  with pytest.raises(ValueError, match=r"`loss_fn` must return a floating scalar; got "
                                       r"float32\[2, 4\]\. Reduce it"):
    guard.check_grad("g", lambda m, x: m(x), model, x)
  with pytest.raises(ValueError, match="`wrt` selects no variable of the model"):
    guard.check_grad("g", lambda m, x: jnp.mean(m(x)), model, x, wrt=nnx.BatchStat)
  with pytest.raises(TypeError, match="`model` must be an nnx.Module; got function"):
    guard.check_grad("g", lambda m, x: m, lambda x: x, x)
  with pytest.raises(TypeError, match="`store_params` must be a bool; got 1"):
    guard.check("g", model, x, store_params=1)
  with pytest.raises(TypeError, match="`store_params=True` needs an nnx.Module; got function"):
    guard.check("g", lambda x: x, x, store_params=True)
  assert not list(tmp_path.iterdir())  # nothing was written


# ------------------------------------------------------ item 2: what a baseline holds


def test_a_baseline_stores_one_result_and_weights_only_as_a_fingerprint(recorded):
  manifest = json.loads((recorded / "logits" / "manifest.json").read_text())
  assert manifest["format_version"] == 3
  assert set(manifest["arrays"]) == {"input/0", "output"}  # no output_eager, no weights
  model = _model()
  params = {".".join(map(str, p)): np.asarray(jax.tree_util.tree_leaves(v)[0])
            for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  fingerprints = {w["path"]: w for w in manifest["model"]["weights"]}
  kernel = fingerprints["stem.conv.kernel"]
  value = params["stem.conv.kernel"]
  assert (kernel["type"], kernel["shape"], kernel["dtype"]) == ("Param", [7, 7, 3, 4], "float32")
  assert kernel["digest"] == store.digest(value)
  assert kernel["mean"] == pytest.approx(float(value.astype(np.float64).mean()))
  assert kernel["max"] == float(value.max())
  assert {p for p, w in fingerprints.items() if w["type"] == "Param"} == set(params)


def test_store_params_keeps_one_weight_set_however_many_baselines_share_it(tmp_path):
  guard = Guard(tmp_path / "test_a")
  model = _model()
  guard.check("one", model, X, store_params=True)
  outcome = Guard(tmp_path / "test_b").check("two", model, X, store_params=True)
  (weights,) = (tmp_path / "_weights").iterdir()
  assert "(shared, already stored)" in outcome.message and weights.name in outcome.message
  stored = store.read_baseline(weights).arrays
  # Every variable but the PRNG keys (the model has none), as the model holds them.
  state = {".".join(map(str, p)): np.asarray(jax.tree_util.tree_leaves(v)[0])
           for p, v in nnx.to_flat_state(nnx.state(model))}
  assert set(stored) == set(state)
  for path, value in state.items():
    np.testing.assert_array_equal(stored[path], value)
  for name in ("one", "two"):
    manifest = json.loads((tmp_path / f"test_{'a' if name == 'one' else 'b'}" / name /
                           "manifest.json").read_text())
    assert manifest["weights_set"] == weights.name
    assert not any(key.startswith("weights") for key in manifest["arrays"])


def test_store_params_loads_the_weights_so_a_new_initialisation_cannot_move_an_output(baselines):
  guard = Guard(baselines)
  other = _model(seed=1)  # another initialisation of the same model
  # The stored weights are loaded: the logits are those of the recorded weights, and pass.
  assert guard.check("logits", other, X, store_params=True).status == "passed"
  # Nor can it hide a numeric change: the padding moved, the stored weights do not help.
  other.stem.pool = MaxPool(3, 2, 0)
  failure = _failure(lambda: guard.check("logits", other, X, store_params=True))
  assert failure.outcome.report.headline[0].startswith(
      "weights: the stored weights were loaded before running, so the outputs below do not "
      "depend on initialisation; fresh initialisation no longer matches them: ")
  assert failure.outcome.report.headline[1] == (
      "first moved at `stem.pool` (MaxPool): window.padding: ((1, 1), (1, 1)) -> ((0, 0), "
      "(0, 0)); shape (2, 8, 8, 4) -> (2, 7, 7, 4)")
  # The same model with its recorded weights: fresh initialisation still matches.
  model = _model()
  model.stem.pool = MaxPool(3, 2, 0)
  failure = _failure(lambda: guard.check("logits", model, X, store_params=True))
  assert failure.outcome.report.headline[0] == (
      "weights: the stored weights were loaded before running; fresh initialisation still "
      "gives the same weights")


def test_a_new_initialisation_is_said_first_with_the_number_of_leaves_that_moved(baselines):
  old, new = _model(seed=0), _model(seed=1)
  flat = [(".".join(map(str, p)), np.asarray(jax.tree_util.tree_leaves(v)[0]))
          for p, v in nnx.to_flat_state(nnx.state(old, nnx.Param))]
  moved = {".".join(map(str, p)) for p, v in nnx.to_flat_state(nnx.state(new, nnx.Param))
           if not np.array_equal(np.asarray(jax.tree_util.tree_leaves(v)[0]), dict(flat)[
               ".".join(map(str, p))])}
  assert 0 < len(moved) < len(flat)  # the kernels moved; BatchNorm's ones and zeros did not
  failure = _failure(lambda: Guard(baselines).check("logits", new, X))
  lines = str(failure).splitlines()
  first = (f"the initialisation changed: {len(moved)} of {len(flat)} parameter leaves differ "
           f"(first: `stem.conv.kernel`)")
  headline = next(i for i, line in enumerate(lines) if line.startswith("the initialisation"))
  assert lines[headline].startswith(first)
  assert headline < next(i for i, line in enumerate(lines) if line.startswith("case "))


# ------------------------------------------------- item 3: the first layer that moved


def test_a_changed_pooling_padding_is_localised_to_that_layer(baselines):
  model = _model()
  model.stem.pool = MaxPool(3, 2, 0)  # 16 -> floor((16 - 3) / 2) + 1 = 7 instead of 8
  # The layer's configuration says why: its padding went from 1 to 0 on both sides of both
  # spatial axes (the arguments of the two MaxPools above).
  why = "window.padding: ((1, 1), (1, 1)) -> ((0, 0), (0, 0)); shape (2, 8, 8, 4) -> (2, 7, 7, 4)"
  failure = _failure(lambda: Guard(baselines).check("logits", model, X))
  assert failure.outcome.report.headline == [f"first moved at `stem.pool` (MaxPool): {why}"]
  # The stem's own baseline: the same layer, found inside the submodule checked.
  failure = _failure(lambda: Guard(baselines).check("stem", model.stem, X))
  assert failure.outcome.report.headline == [f"first moved at `pool` (MaxPool): {why}"]


def test_a_value_change_deep_in_the_model_is_localised_to_its_first_layer(baselines):
  model = _model()
  kernel = model.layer2.block0.conv2.kernel
  kernel[...] = kernel[...] * 1.01
  report = _failure(lambda: Guard(baselines).check("logits", model, X)).outcome.report
  assert report.headline[0].startswith(
      "the initialisation changed: 1 of ")  # the weights say it first ...
  assert report.headline[1].startswith("first moved at `layer2.block0.conv2` (Conv): ")


def test_capture_restores_every_class_and_skips_transformed_calls():
  model = _model()
  call = {cls: cls.__dict__.get("__call__") for cls in (MaxPool, nnx.Conv, nnx.BatchNorm)}
  from nnx_pool.regression.fixture import model_state

  with model_state.capture(model) as calls:
    model(X)
    jax.jit(lambda x: model(x))(X)  # traced: recorded nowhere
  assert {cls: cls.__dict__.get("__call__") for cls in call} == call
  # Call order, children before the module that called them; every submodule once.
  paths = [c["path"] for c in calls]
  assert paths[:4] == ["stem.conv", "stem.bn", "stem.pool", "stem"]
  assert paths[-2:] == ["pool", "fc"] and len(paths) == len(set(paths))
  assert calls[2]["outputs"][0]["shape"] == [2, 8, 8, WIDTH]


# --------------------------------------------------- item 8: schema and mode first


def test_a_mode_change_is_said_first_one_line_per_flag(baselines):
  model = _model()
  model.train()
  report = _failure(lambda: Guard(baselines).check("stem", model.stem, X)).outcome.report
  assert report.headline == [
      "`bn`: use_running_average True -> False (the model is in train mode)",
      "first moved at `bn` (BatchNorm): " + report.headline[1].split(": ", 1)[1],
  ]


def test_a_changed_state_schema_is_said_before_any_number(baselines):
  model = _model(num_classes=11)
  report = _failure(lambda: Guard(baselines).check("logits", model, X)).outcome.report
  assert report.headline[:2] == [
      "`fc.bias`: Param float32[10] -> Param float32[11]",
      "`fc.kernel`: Param float32[32, 10] -> Param float32[32, 11]",
  ]
  assert [row.details for row in report.rows] == [["shape (2, 11) != baseline (2, 10)"]]


# ------------------------------------------------------- item 5: readable reports


def test_more_than_20_failing_arrays_show_the_20_worst_and_how_many_more(baselines):
  new = _model(seed=1)
  leaves = len(jax.tree_util.tree_leaves(nnx.state(new, nnx.Param)))
  failure = _failure(lambda: Guard(baselines).check_grad("grads", cross_entropy, new, X, LABELS,
                                                        eager=False))
  report = failure.outcome.report
  failing = [r for r in report.rows if r.status == "FAIL"]
  assert len(report.rows) == leaves + 1  # the loss, and one row per gradient leaf
  assert len(failing) > 20
  text = str(failure)
  shown = [line for line in text.splitlines() if line.startswith("grads:")]
  assert len(shown) == 20
  assert len(failing) == len(report.rows)  # a new initialisation moves the loss and every leaf
  assert (f"(and {len(failing) - 20} more failing not listed: the 20 worst failing rows are "
          "shown; every row is in the JSON and HTML reports)") in text
  assert len(report.to_json()["rows"]) == leaves + 1
  # The gradient rows carry the gradient tolerance, the loss the forward one.
  row = {r.case: r for r in report.rows}
  assert row["grads:loss"].tolerance == "rtol=1e-05 atol=1e-05"
  assert row["grads:grad/fc/kernel"].tolerance == "rtol=4e-05 atol=4e-05"


# ----------------------------------------------------- item 4: the page, again later


def test_report_redraws_a_failure_from_the_obtained_file(baselines, tmp_path, capsys):
  model = _model()
  model.stem.pool = MaxPool(3, 2, 0)
  failure = _failure(lambda: Guard(baselines).check("logits", model, X))
  obtained = baselines / "logits.obtained"
  assert failure.outcome.obtained == obtained
  assert json.loads((obtained / "manifest.json").read_text())["kind"] == "pytest-obtained"
  page = tmp_path / "page.html"
  assert cli.main(["report", str(baselines / "logits"), "--html", str(page)]) == 1
  out = capsys.readouterr().out
  assert ("first moved at `stem.pool` (MaxPool): window.padding: ((1, 1), (1, 1)) -> ((0, 0), "
          "(0, 0)); shape (2, 8, 8, 4) -> (2, 7, 7, 4)") in out
  assert "logits:output" in out and "shape (2, 10) != baseline (2, 10)" not in out
  text = page.read_text()
  assert "first moved at `stem.pool` (MaxPool)" in text and "<figure>" in text
  # A passing check removes its obtained file; report then says there is none.
  assert Guard(baselines).check("logits", _model(), X).status == "passed"
  assert not obtained.exists()
  assert cli.main(["report", str(baselines / "logits")]) == 2
  assert "no obtained results beside it (logits.obtained): a failing check writes them" in (
      capsys.readouterr().err)


def test_check_of_a_fixture_baseline_points_to_report(baselines, capsys):
  assert cli.main(["check", "--baseline", str(baselines / "logits")]) == 2
  assert capsys.readouterr().err.startswith(
      f"error: baseline {baselines / 'logits'}: holds kind 'pytest', not a 'batch' baseline; it "
      "is a pytest fixture baseline: its test checks it, and `nnx-pool-regression report ")


# ------------------------------------------------------------ format 2 still loads


def test_a_format_2_baseline_of_nnx_pool_0_1_0_still_loads(tmp_path):
  # What 0.1.0's fixture wrote: output and output_eager, the full weights, no model section.
  model = numpy_initialised(lambda: nnx.Linear(3, 2, rngs=nnx.Rngs(0)), 0, gain=1.0)
  x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
  y = np.asarray(model(jnp.asarray(x)))
  kernel, bias = np.asarray(model.kernel[...]), np.asarray(model.bias[...])
  tol = {"rule": "allclose", "rtol": 1e-5, "atol": 1e-5, "reason": "user model forward"}
  out = tmp_path / "lin"
  store.write_baseline(out, {
      "kind": "pytest", "stamp": {}, "test": "t.py::t", "name": "lin",
      "inputs": ["input/0"], "weights": ["weights/bias", "weights/kernel"],
      "results": {"output": tol, "output_eager": tol}, "jit_eager_agree": True,
      "timing": {"compile_s": 0.1, "steady_s": 1e-5}},
      {"input/0": x, "weights/bias": bias, "weights/kernel": kernel, "output": y,
       "output_eager": y})
  manifest = json.loads((out / "manifest.json").read_text())
  manifest["format_version"] = 2
  manifest["manifest_sha256"] = store.format._checksum(manifest)
  (out / "manifest.json").write_text(json.dumps(manifest))
  assert Guard(tmp_path).check("lin", model, x).status == "passed"
  other = numpy_initialised(lambda: nnx.Linear(3, 2, rngs=nnx.Rngs(0)), 1, gain=1.0)
  report = _failure(lambda: Guard(tmp_path).check("lin", other, x)).outcome.report
  assert report.headline[0].startswith("baseline of format version 2 (nnx-pool 0.1.0)")
  assert report.headline[1].startswith("the initialisation changed: 1 of 2 parameter leaves "
                                       "differ (first: `kernel`)")


# --------------------------------------------------------------- the real size


@pytest.mark.integration  # its own CI step (`make test-integration`), outside the 240 s suite
def test_the_8m_parameter_resnet_baselines_fit_the_issues_targets(tmp_path):
  # The issue's example: logits, stem features and gradients of an 8 M-parameter ResNet on a
  # 2x64x64x3 batch; at most 35 MB by default and 70 MB with store_params=True (the weights
  # and the gradients are 32 MB each, random-looking float32 that barely compresses).
  model = resnet_cheaply()
  assert parameter_count(model) == 8_036_426
  x, labels = images(2, 64), jnp.array([3, 7])
  guard = Guard(tmp_path / "test_resnet")
  guard.check("logits", model, x, store_params=True)
  guard.check("stem", model.stem, x, store_params=True)
  guard.check_grad("grads", cross_entropy, model, x, labels, store_params=True)
  baselines = sum(files.size_of(p) for p in (tmp_path / "test_resnet").iterdir())
  weights = sum(files.size_of(p) for p in (tmp_path / "_weights").iterdir())
  for name in ("logits", "stem", "grads"):  # by default these three directories are all
    arrays = json.loads((tmp_path / "test_resnet" / name / "manifest.json").read_text())["arrays"]
    assert not any(key.startswith("weights") for key in arrays)
  assert baselines <= 35e6 and baselines + weights <= 70e6, (baselines, weights)
  assert weights >= 4 * parameter_count(model) * 0.9  # stored once, not per baseline
