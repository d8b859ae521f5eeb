"""Tests for the nnx_regression pytest fixture, run in inner pytest sessions (pytester)."""

import json

import numpy as np
import pytest

# Inner sessions run in this process, and pytester drops the modules that an inner
# session imported first when it ends. The fixture's pipeline, imported once, then
# keeps the first flax's nnx.Module while later test files build modules from a
# re-imported flax. Importing flax here keeps one flax for every inner session.
from flax import nnx  # noqa: F401

from nnx_pool.regression import store

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "nnx_pool.regression.pytest_plugin")

TEST_FILE = """
import jax.numpy as jnp
import numpy as np
from flax import nnx

SCALE = {scale}
X = np.arange(12, dtype=np.float32).reshape(2, 3, 2) / 7


def test_pool(nnx_regression):
  nnx_regression.check("{name}", lambda x: jnp.mean(x, axis=1) * SCALE, X)


def test_linear(nnx_regression):
  model = nnx.Linear(2, 3, rngs=nnx.Rngs({seed}))
  nnx_regression.check("linear", model, jnp.asarray(X))
"""


@pytest.fixture(autouse=True)
def _no_autoload(monkeypatch):
  # Keep the inner sessions hermetic: only the plugin under test, loaded by -p,
  # whatever else is installed with a pytest11 entry point.
  monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def _failures(out):
  """The run's FAILURES section: on CI (the `CI` variable set) pytest's short summary repeats
  each failure's whole message, so a count over all the output would see every report twice."""
  return out.split(" short test summary info ")[0]


def _write(pytester, scale="1.0", name="pool", seed=0):
  return pytester.makepyfile(test_models=TEST_FILE.format(scale=scale, name=name, seed=seed))


def test_plugin_first_run_writes_baselines_and_fails_saying_so(pytester):
  _write(pytester)
  result = pytester.runpytest(*PLUGIN)
  result.assert_outcomes(failed=2)
  result.stdout.fnmatch_lines([
      ("*nnx_regression: no baseline for 'pool'; wrote one to *_regression*test_models*pool*"
       "(* KB; jax *, flax *, cpu). Rerun to compare."),
      "*nnx_regression*",
      "wrote 2 new baseline(s) (rerun to compare):",
      "  *pool (* KB)",  # every write says its size
  ])
  root = pytester.path / "_regression" / "test_models"
  assert sorted(p.name for p in root.iterdir()) == ["linear", "pool"]
  manifest = json.loads((root / "pool" / "manifest.json").read_text())
  assert manifest["kind"] == "pytest" and manifest["test"] == "test_models.py::test_pool"
  assert manifest["stamp"]["versions"]["jax"]
  assert manifest["format_version"] == 3
  # One stored result: jit and eager are both compared with it.
  assert set(manifest["results"]) == {"output"} and set(manifest["arrays"]) == {
      "input/0", "output"}
  linear = json.loads((root / "linear" / "manifest.json").read_text())
  # The parameters as fingerprints, not arrays: path, type, shape, dtype, digest, statistics.
  assert not any(k.startswith("weights") for k in linear["arrays"])
  kernel = next(w for w in linear["model"]["weights"] if w["path"] == "kernel")
  assert (kernel["type"], kernel["shape"], kernel["dtype"]) == ("Param", [2, 3], "float32")
  assert kernel["digest"].startswith("sha256:") and {"mean", "std", "min", "max"} <= set(kernel)

  # The second run compares and passes.
  pytester.runpytest(*PLUGIN).assert_outcomes(passed=2)


def test_plugin_reports_drift_like_the_cli(pytester):
  _write(pytester)
  pytester.runpytest(*PLUGIN)
  _write(pytester, scale="1.001")
  result = pytester.runpytest(*PLUGIN)
  result.assert_outcomes(failed=1, passed=1)
  result.stdout.fnmatch_lines([
      "*nnx_regression: 'pool' differs from its baseline*",
      "*this run: python *, numpy *, jax *, jaxlib *, flax *, cpu (cpu), git *",
      "*baseline: python *, numpy *, jax *, jaxlib *, flax *, cpu (cpu), git *",
      "*case*max abs err*max rel err*tolerance*status*",
      "*pool:output *rtol=1e-05 atol=1e-05*FAIL*",
      "1 arrays: 1 fail",  # one row: jit and eager agree with each other
      "*elements differ*",
      "*environment changes*",
  ])
  # Issue 29, finding 4: the report is printed once (pytest.fail inside the except block
  # printed it a second time, as the exception it was handling).
  assert _failures(result.stdout.str()).count("'pool' differs from its baseline") == 1


NONFINITE_TEST = """
import jax.numpy as jnp
import numpy as np

X = np.array([1.0, 0.0, 4.0], np.float32)


def test_log(nnx_regression):
  nnx_regression.check("log", jnp.log, X)


def test_log_allowed(nnx_regression):
  nnx_regression.check("log_allowed", jnp.log, X, allow_nonfinite=True)


def test_ints(nnx_regression):
  nnx_regression.check("ints", lambda x: x // 2, np.arange(4))
"""


def test_plugin_refuses_to_record_nonfinite_outputs_unless_allowed(pytester):
  pytester.makepyfile(test_nonfinite=NONFINITE_TEST)
  result = pytester.runpytest(*PLUGIN)
  result.assert_outcomes(failed=3)
  result.stdout.fnmatch_lines([
      "*nnx_regression: 'log' was not recorded: its outputs are not all finite (*). Fix the "
      "model, or pass allow_nonfinite=True if they should be.",
  ])
  root = pytester.path / "_regression" / "test_nonfinite"
  assert sorted(p.name for p in root.iterdir()) == ["ints", "log_allowed"]
  result = pytester.runpytest(*PLUGIN)
  result.assert_outcomes(failed=1, passed=2)  # -inf is compared like any number


def test_plugin_names_changed_parameters(pytester):
  _write(pytester)
  pytester.runpytest(*PLUGIN)
  _write(pytester, seed=1)  # a different init: the stored weights no longer match
  result = pytester.runpytest(*PLUGIN, "-k", "linear")
  result.assert_outcomes(failed=1)
  # Said before the table: a fresh initialisation that moved (seed 1 instead of 0).
  result.stdout.fnmatch_lines([
      "the initialisation changed: 1 of 2 parameter leaves differ (first: `kernel`); every "
      "output below ran on the new weights. Pass store_params=True to load stored weights and "
      "compare the computation alone",
      "case *",
  ])


def test_plugin_update_flag_rewrites_baselines(pytester):
  _write(pytester)
  pytester.runpytest(*PLUGIN)
  _write(pytester, scale="2.0")
  result = pytester.runpytest(*PLUGIN, "--nnx-regression-update")
  result.assert_outcomes(passed=2)
  result.stdout.fnmatch_lines(["updated 2 baseline(s) (--nnx-regression-update):"])
  pytester.runpytest(*PLUGIN).assert_outcomes(passed=2)


def test_plugin_check_only_compares_and_never_writes(pytester, monkeypatch):
  # NNX_REGRESSION_CHECK_ONLY is how `rehearse --pytest` runs a user's tests.
  _write(pytester)
  monkeypatch.setenv("NNX_REGRESSION_CHECK_ONLY", "1")
  result = pytester.runpytest(*PLUGIN, "-k", "pool")
  result.assert_outcomes(failed=1)
  result.stdout.fnmatch_lines([
      "*nnx_regression: no baseline for 'pool' at *pool, and none was written "
      "(NNX_REGRESSION_CHECK_ONLY is set: compare only). Record it in your own environment: "
      "run the test once without it.",
  ])
  assert not (pytester.path / "_regression").exists()
  monkeypatch.setenv("NNX_REGRESSION_CHECK_ONLY", "0")  # "0" and "" mean off
  pytester.runpytest(*PLUGIN, "-k", "pool").assert_outcomes(failed=1)  # written now
  monkeypatch.setenv("NNX_REGRESSION_CHECK_ONLY", "1")
  pytester.runpytest(*PLUGIN, "-k", "pool").assert_outcomes(passed=1)


def test_plugin_check_only_refuses_the_update_flag(pytester, monkeypatch):
  _write(pytester)
  monkeypatch.setenv("NNX_REGRESSION_CHECK_ONLY", "1")
  result = pytester.runpytest(*PLUGIN, "--nnx-regression-update")
  assert result.ret == pytest.ExitCode.USAGE_ERROR
  result.stderr.fnmatch_lines([
      "*--nnx-regression-update writes baselines, and NNX_REGRESSION_CHECK_ONLY=1 forbids it; "
      "drop one of the two.",
  ])


def test_plugin_reports_unused_baselines_at_the_end(pytester):
  _write(pytester)
  pytester.runpytest(*PLUGIN)
  _write(pytester, name="pool_renamed")
  result = pytester.runpytest(*PLUGIN)
  result.assert_outcomes(failed=1, passed=1)  # the renamed one is new
  result.stdout.fnmatch_lines([
      "1 unused baseline(s) (no test used them this session; delete them or fix the test names):",
      "*_regression*test_models*pool",
  ])
  # A partial run (-k) cannot tell unused from deselected, so it stays quiet.
  result = pytester.runpytest(*PLUGIN, "-k", "linear")
  result.assert_outcomes(passed=1)
  assert "unused baseline" not in result.stdout.str()


def test_plugin_rejects_a_name_used_twice_and_bad_names(pytester):
  pytester.makepyfile(test_names="""
import numpy as np
import numpy as np
import pytest

def test_twice(nnx_regression):
  nnx_regression.check("same", lambda x: x + 1, np.ones(2, np.float32))
  with pytest.raises(ValueError, match="'same' is already used by test_names.py::test_twice"):
    nnx_regression.check("same", lambda x: x + 1, np.ones(2, np.float32))

def test_bad_name(nnx_regression):
  with pytest.raises(ValueError, match="`name` must be letters, digits"):
    nnx_regression.check("../escape", lambda x: x, np.ones(2, np.float32))

def test_bad_input(nnx_regression):
  with pytest.raises(TypeError, match=r"`inputs\\[0\\]` must be an array; got str"):
    nnx_regression.check("bad_input", lambda x: x, "not an array")
""")
  result = pytester.runpytest(*PLUGIN)
  result.assert_outcomes(failed=1, passed=2)  # test_twice: its first check wrote a baseline


def test_plugin_damaged_baseline_fails_with_the_reason(pytester):
  _write(pytester)
  pytester.runpytest(*PLUGIN)
  pool = pytester.path / "_regression" / "test_models" / "pool"
  npz = pool / store.arrays_name(json.loads((pool / "manifest.json").read_text()))
  npz.write_bytes(npz.read_bytes()[:100])
  result = pytester.runpytest(*PLUGIN, "-k", "pool")
  result.assert_outcomes(failed=1)
  result.stdout.fnmatch_lines(
      [f"*nnx_regression: baseline *pool: {npz.name} is truncated or damaged*"]
  )


BN_TEST = """
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

PAD = {pad}
X = jnp.asarray(np.linspace(-1, 1, 2 * 8 * 8 * 3, dtype=np.float32).reshape(2, 8, 8, 3))


class Net(nnx.Module):
  def __init__(self, rngs):
    self.conv = nnx.Conv(3, 4, (3, 3), padding=PAD, rngs=rngs)
    self.bn = nnx.BatchNorm(4, rngs=rngs)
    self.fc = nnx.Linear(4, 2, rngs=rngs)

  def __call__(self, x):
    return self.fc(jnp.mean(jax.nn.relu(self.bn(self.conv(x))), axis=(1, 2)))


def test_logits(nnx_regression):
  model = Net(nnx.Rngs(0))
  model.eval()
  {before}
  nnx_regression.check("logits", model, X)


def test_grads(nnx_regression):
  model = Net(nnx.Rngs(0))
  nnx_regression.check_grad("grads", lambda m, x: jnp.mean(m(x) ** 2), model, X)
"""


def _bn(pytester, pad="1", before="pass"):
  return pytester.makepyfile(test_bn=BN_TEST.format(pad=pad, before=before))


def test_plugin_html_page_of_the_sessions_failing_checks(pytester):
  _bn(pytester)
  pytester.runpytest(*PLUGIN)
  _bn(pytester, pad="0")  # the convolution's padding: shapes (2, 8, 8, 4) -> (2, 6, 6, 4)
  page = pytester.path / "page.html"
  result = pytester.runpytest(*PLUGIN, "--nnx-regression-html", str(page))
  result.assert_outcomes(failed=2)
  # The layer's configuration says why: nnx.Conv's padding went from 1 to 0 (the test file).
  result.stdout.fnmatch_lines([
      "first moved at `conv` (Conv): padding: 1 -> 0; shape (2, 8, 8, 4) -> (2, 6, 6, 4)",
      f"HTML report of 2 failing check(s): {page}",
  ])
  text = page.read_text()
  assert ("test_bn/logits: first moved at `conv` (Conv): padding: 1 -&gt; 0; shape (2, 8, 8, 4) "
          "-&gt; (2, 6, 6, 4)") in text
  assert "<figure>" in text and "Environments" in text  # the figures, the stamps side by side
  # Failures first: the first row of the table is a failing one.
  table = text[text.index("<h2>Cases</h2>"):]
  assert table.index("FAIL") < table.index("PASS")
  for name in ("logits", "grads"):
    assert (pytester.path / "_regression" / "test_bn" / f"{name}.obtained").is_dir()


KEYWORD_TEST = """
import jax.numpy as jnp
import numpy as np

X = np.arange(6, dtype=np.float32).reshape(2, 3) / 7


def scaled(x, factor=1.0, name="a"):
  return x * factor if name == "a" else -x


def test_keywords(nnx_regression):
  nnx_regression.check("keywords", scaled, X, factor={factor}, call_kwargs={{"name": "a"}})
"""


def test_plugin_jit_only_option_and_keyword_calls(pytester):
  # `name` is the check's own argument: the call's goes through call_kwargs.
  pytester.makepyfile(test_kw=KEYWORD_TEST.format(factor=2.0))
  pytester.runpytest(*PLUGIN, "--nnx-regression-jit-only")
  manifest = json.loads(
      (pytester.path / "_regression" / "test_kw" / "keywords" / "manifest.json").read_text())
  assert manifest["call"] == {"kwargs": {"factor": 2.0, "name": "a"}, "eager": False}
  x = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
  np.testing.assert_array_equal(store.read_baseline(
      pytester.path / "_regression" / "test_kw" / "keywords").arrays["output"], x * 2)
  pytester.makepyfile(test_kw=KEYWORD_TEST.format(factor=3.0))
  result = pytester.runpytest(*PLUGIN)  # with the eager run this time
  result.assert_outcomes(failed=1)
  result.stdout.fnmatch_lines(["call keyword `factor`: 2.0 -> 3.0"])


def test_plugin_html_needs_a_writable_place(pytester):
  _bn(pytester)
  result = pytester.runpytest(*PLUGIN, "--nnx-regression-html", str(pytester.path / "no" / "p"))
  assert result.ret == pytest.ExitCode.USAGE_ERROR
  result.stderr.fnmatch_lines([f"*--nnx-regression-html *: directory {pytester.path / 'no'} "
                               "does not exist."])


def test_plugin_regression_dir_keeps_baselines_outside_the_tests(pytester, tmp_path):
  _bn(pytester)
  outside = tmp_path / "baselines"
  # DIR mirrors the test directories relative to pytest's rootdir (here the test directory).
  pytester.runpytest(*PLUGIN, f"--nnx-regression-dir={outside}", "-k", "logits")
  assert not (pytester.path / "_regression").exists()
  assert (outside / "test_bn" / "logits" / "manifest.json").is_file()
  pytester.runpytest(*PLUGIN, f"--nnx-regression-dir={outside}",
                     "-k", "logits").assert_outcomes(passed=1)


def test_plugin_does_not_advise_deleting_baselines_of_tests_that_failed_before_check(pytester):
  _bn(pytester)
  pytester.runpytest(*PLUGIN)
  _bn(pytester, before="raise RuntimeError('broken before the check')")
  result = pytester.runpytest(*PLUGIN)
  result.assert_outcomes(failed=1, passed=1)
  out = result.stdout.str()
  assert "unused baseline" not in out and "delete them" not in out
  result.stdout.fnmatch_lines([
      "1 baseline(s) not reached: the test that records each failed, errored or was skipped "
      "before its check (keep them):",
      "  *_regression*test_bn*logits (test_bn.py::test_logits)",
  ])


DUPLICATE_TEST = """
import numpy as np
import pytest

X = np.arange(4, dtype=np.float32)


@pytest.mark.xdist_group("a")
def test_a(nnx_regression):
  nnx_regression.check("logits", lambda x: x + 1, X)


@pytest.mark.xdist_group("b")
def test_b(nnx_regression):
  nnx_regression.check("logits", lambda x: x + 2, X)
"""


def test_plugin_a_name_used_by_two_xdist_workers_is_refused_and_nothing_overwritten(pytester):
  # Issue 29: serially the second check("logits") of a module is refused; under -n 2 each
  # worker had its own session, both wrote, and the next run failed one against the other.
  pytest.importorskip("xdist")
  pytester.makepyfile(test_dup=DUPLICATE_TEST)
  result = pytester.runpytest_subprocess(*PLUGIN, "-p", "xdist.plugin", "-n", "2",
                                         "--dist", "loadgroup", "-v")
  out = result.stdout.str()
  assert "[gw0]" in out and "[gw1]" in out  # the two tests ran on two workers
  result.assert_outcomes(failed=2)  # one wrote its baseline (rerun to compare), one refused
  (line,) = [line.split("ValueError: ", 1)[1] for line in out.splitlines()
              if line.startswith("E ") and "is already used by" in line]
  first = "test_dup.py::test_a" if "already used by test_dup.py::test_a" in line else (
      "test_dup.py::test_b")
  second = "test_dup.py::test_b" if first.endswith("a") else "test_dup.py::test_a"
  assert line == (f"`name` 'logits' is already used by {first} in this session; baseline names "
                  f"must be unique within a test module (rename the check of {second} or of "
                  f"{first}). Nothing was compared or written.")
  assert _failures(out).count("no baseline for 'logits'; wrote one") == 1
  manifest = json.loads((pytester.path / "_regression" / "test_dup" / "logits" /
                         "manifest.json").read_text())
  assert manifest["test"] == first  # recorded by the first, not overwritten by the second
