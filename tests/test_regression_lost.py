"""Issue 29, "nothing lost": the fixture's files never collide, never lie, never hide a report.

Through :class:`nnx_pool.regression.guard.Guard` (the fixture without pytest) on functions of
two numbers and an ``nnx.Linear``, so each check compiles in milliseconds: names that would
collide with the kit's own files are refused; a stored weight set is checked against its
content address; check-only mode writes nothing into the tree; a write that fails leaves the
report whole; ``report`` reads obtained files wherever they are, and refuses damaged ones
with one line. The CLI's refusals and the pytest plugin's (xdist, the report printed once)
are in tests/test_regression_cli.py and tests/test_regression_plugin.py.
"""

import errno
import json
import re
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_pool.regression import cli, store
from nnx_pool.regression.fixture.weight_sets import load_weight_set, read_weight_set
from nnx_pool.regression.guard import Guard, RegressionFailure

X = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)


def _scaled(scale: float):
  return lambda x: x * scale


def _failure(call) -> RegressionFailure:
  with pytest.raises(RegressionFailure) as info:
    call()
  return info.value


def _tree(root: Path) -> list[str]:
  """Every file and directory under ``root``, relative to it (sorted)."""
  return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


# ----------------------------------------------------------- names of the kit's own files


@pytest.mark.parametrize("name", [".", "..", ".hidden", "foo.obtained", "Foo.OBTAINED",
                                  "_weights", "_Weights"])
def test_a_name_that_would_collide_with_the_kits_files_is_refused(tmp_path, name):
  # Before: `foo.obtained` was a baseline that `foo`'s failing check overwrote (and its
  # passing check deleted); `.` and `..` named the directory itself or its parent.
  guard = Guard(tmp_path / "mod")
  with pytest.raises(ValueError, match=r"^`name` may not ") as info:
    guard.check(name, _scaled(1.0), X)
  assert repr(name) in str(info.value)
  assert not tmp_path.joinpath("mod").exists() and _tree(tmp_path) == []


def test_foo_obtained_is_refused_and_foo_keeps_its_obtained_file(tmp_path):
  guard = Guard(tmp_path)
  assert guard.check("foo", _scaled(1.0), X).status == "written"
  _failure(lambda: guard.check("foo", _scaled(2.0), X))
  with pytest.raises(ValueError, match="a failing check of 'foo' writes its results to "
                                       "'foo.obtained'"):
    guard.check("foo.obtained", _scaled(3.0), X)
  assert json.loads((tmp_path / "foo.obtained" / "manifest.json").read_text())["kind"] == (
      "pytest-obtained")


def test_a_guard_directory_named_like_the_weight_sets_is_refused(tmp_path):
  # Its weight sets would go to <dir>/../_weights: the directory itself.
  with pytest.raises(ValueError, match="`directory` .*_weights is named '_weights'"):
    Guard(tmp_path / "_weights").check("logits", _scaled(1.0), X)
  assert _tree(tmp_path) == []


# ------------------------------------------------------------ weight sets by their address


def _linear(seed: int) -> nnx.Linear:
  return nnx.Linear(2, 3, rngs=nnx.Rngs(seed))


def test_a_weight_set_replaced_by_another_is_named_and_rewritten_by_an_update(tmp_path):
  root = tmp_path / "mod"
  guard = Guard(root)
  assert guard.check("a", _linear(0), X, store_params=True).status == "written"
  assert guard.check("b", _linear(1), X, store_params=True).status == "written"
  sets = {name: json.loads((root / name / "manifest.json").read_text())["weights_set"]
          for name in ("a", "b")}
  weights = tmp_path / "_weights"
  assert sorted(p.name for p in weights.iterdir()) == sorted(sets.values())
  # Set a's directory now holds set b's files (another set's content under a's address).
  shutil.rmtree(weights / sets["a"])
  shutil.copytree(weights / sets["b"], weights / sets["a"])
  # Before: a ran on b's weights, and its headline said "fresh initialisation still gives
  # the same weights"; now the set is refused, named, in one line.
  failure = _failure(lambda: Guard(root).check("a", _linear(0), X, store_params=True))
  assert failure.outcome.status == "refused"
  message = str(failure)
  assert "\n" not in message
  assert message.startswith(f"nnx_regression: weight set {weights / sets['a']}: its content is "
                            f"not the weight set named {sets['a']} (it hashes to {sets['b']}")
  assert message.endswith("--nnx-regression-update rewrites it. (the weights of baseline "
                          f"{root / 'a'})")
  # Before: the update trusted it ("shared, already stored"); now it writes the set again.
  outcome = Guard(root, update=True).check("a", _linear(0), X, store_params=True)
  assert outcome.status == "updated"
  assert f"_weights/{sets['a']} (rewritten: its content did not match its name)" in (
      outcome.message)
  assert read_weight_set(weights / sets["a"]).manifest["kind"] == "pytest-weights"
  assert Guard(root).check("a", _linear(0), X, store_params=True).status == "passed"
  # A set that matches its name is shared, not written again.
  again = Guard(root, update=True).check("b", _linear(1), X, store_params=True)
  assert f"_weights/{sets['b']} (shared, already stored)" in again.message


def test_a_baseline_naming_a_weight_set_outside_the_weights_directory_is_refused(tmp_path):
  guard = Guard(tmp_path / "mod")
  guard.check("a", _linear(0), X, store_params=True)
  manifest = json.loads((tmp_path / "mod" / "a" / "manifest.json").read_text())
  with pytest.raises(store.BaselineError, match=r"names the weight set '\.\./mod/a', which is "
                                                r"no weight set's name \(16 hex digits\)"):
    load_weight_set(tmp_path / "mod" / "a", {**manifest, "weights_set": "../mod/a"})


# ------------------------------------------------------------------ check-only mode


def test_check_only_writes_nothing_into_the_tree_and_says_where_the_results_went(
    tmp_path, capsys):
  root = tmp_path / "mod"
  Guard(root).check("f", _scaled(1.0), X)
  before = _tree(tmp_path)
  # Before: a failing check wrote mod/f.obtained/ (what rehearse --pytest runs under).
  failure = _failure(lambda: Guard(root, check_only=True).check("f", _scaled(1.5), X))
  assert _tree(tmp_path) == before
  obtained = failure.outcome.obtained
  assert obtained is not None and not obtained.is_relative_to(tmp_path)
  assert obtained.name == "f.obtained" and obtained.parent.parent.name.startswith(
      "nnx-regression-obtained-")
  note = (f"what this run obtained is in {obtained} (NNX_REGRESSION_CHECK_ONLY is set: nothing "
          f"was written beside the baseline): `nnx-pool-regression report {root / 'f'} "
          f"--obtained {obtained} --html OUT` draws this report again")
  assert note in failure.outcome.report.notes
  # `report --obtained` draws the same failure from there: x * 1.5 against x, at most
  # 0.5 * |2.0| = 1.0 apart (hand computation).
  assert cli.main(["report", str(root / "f"), "--obtained", str(obtained)]) == 1
  out = capsys.readouterr().out
  assert "f:output" in out and "FAIL" in out
  assert cli.main(["report", str(root / "f")]) == 2  # nothing beside the baseline
  assert "no obtained results beside it (f.obtained)" in capsys.readouterr().err
  # A passing check in check-only mode removes nothing either.
  Guard(root).check("g", _scaled(1.0), X)
  _failure(lambda: Guard(root).check("g", _scaled(2.0), X))  # g.obtained, in the tree
  kept = _tree(tmp_path)
  assert Guard(root, check_only=True).check("g", _scaled(1.0), X).status == "passed"
  assert _tree(tmp_path) == kept


def test_a_write_that_fails_leaves_the_report_whole_with_one_line_more(tmp_path, monkeypatch):
  root = tmp_path / "mod"
  Guard(root).check("f", _scaled(1.0), X)
  real = store.write_baseline

  def read_only(out, *args, **kwargs):
    if Path(out).name.endswith(".obtained"):
      raise OSError(errno.EROFS, "Read-only file system", str(out))
    return real(out, *args, **kwargs)

  monkeypatch.setattr(store, "write_baseline", read_only)
  # Before: OSError: [Errno 30] Read-only file system, in place of the regression report.
  failure = _failure(lambda: Guard(root).check("f", _scaled(1.5), X))
  message = str(failure)
  assert message.startswith(f"nnx_regression: 'f' differs from its baseline {root / 'f'}\n")
  assert "f:output" in message and "FAIL" in message  # the table
  assert (f"what this run obtained was not written ({root / 'f.obtained'}: Read-only file "
          "system); the report above is whole, but `nnx-pool-regression report` cannot draw it "
          "again") in message
  assert failure.outcome.obtained is None
  # Recording on a read-only tree: one line, and nothing replaced.
  monkeypatch.setattr(store, "write_baseline", lambda *a, **k: (_ for _ in ()).throw(
      OSError(errno.EROFS, "Read-only file system")))
  refused = _failure(lambda: Guard(root).check("new", _scaled(1.0), X))
  assert str(refused) == (f"nnx_regression: 'new' was not recorded: could not write "
                          f"{root / 'new'} (Read-only file system); nothing was replaced.")


def test_check_only_refuses_an_update(tmp_path):
  Guard(tmp_path).check("f", _scaled(1.0), X)
  before = _tree(tmp_path)
  failure = _failure(lambda: Guard(tmp_path, update=True, check_only=True).check(
      "f", _scaled(2.0), X))
  assert "update=True writes baselines, and check_only" in str(failure)
  assert _tree(tmp_path) == before


# ----------------------------------------------------- report on damaged obtained files


@pytest.fixture
def failed(tmp_path) -> Path:
  """A baseline of x -> x whose last check (of x -> 1.5 x) failed: ``<root>/f`` and
  ``<root>/f.obtained``."""
  root = tmp_path / "mod"
  Guard(root).check("f", _scaled(1.0), X)
  _failure(lambda: Guard(root).check("f", _scaled(1.5), X))
  return root / "f"


def _reseal(path: Path, **changes) -> None:
  """Changes manifest fields and seals the manifest again (a valid checksum)."""
  manifest = json.loads((path / "manifest.json").read_text())
  for key, value in changes.items():
    if value is None:
      manifest.pop(key, None)
    else:
      manifest[key] = value
  manifest["manifest_sha256"] = store.format._checksum(manifest)
  (path / "manifest.json").write_text(json.dumps(manifest))


def test_report_of_an_obtained_file_without_timing_still_draws_the_failure(failed, capsys):
  # Before: KeyError: 'timing', reported as "the regression batch could not be imported".
  _reseal(Path(f"{failed}.obtained"), timing=None)
  assert cli.main(["report", str(failed)]) == 1
  captured = capsys.readouterr()
  assert "f:output" in captured.out and captured.err == ""


@pytest.mark.parametrize(("which", "changes", "message"), [
    ("obtained", {"results": ["output"]}, "field 'results' holds list, not a dict"),
    ("obtained", {"stamp": None}, "field 'stamp' holds nothing, not a dict"),
    ("obtained", {"timing": "fast"}, "field 'timing' holds str, not a dict"),
    ("obtained", {"results": {"output": {"rule": "allclose"}}},
     "holds a field the comparison cannot read \\(KeyError"),
    ("obtained", {"kind": "pytest"}, "is not an obtained file \\(kind 'pytest'\\)"),
    ("baseline", {"model": [1]}, "field 'model' holds list, not a dict"),
    ("baseline", {"results": {"output": 5}}, "field 'results' holds an entry that is not a "
                                             "dict"),
])
def test_report_of_a_damaged_file_exits_2_with_one_line(failed, capsys, which, changes,
                                                       message):
  _reseal(failed if which == "baseline" else Path(f"{failed}.obtained"), **changes)
  assert cli.main(["report", str(failed)]) == 2
  captured = capsys.readouterr()
  assert captured.out == "" and captured.err.count("\n") == 1
  assert captured.err.startswith("error: baseline ")
  assert re.search(message, captured.err), captured.err


def test_report_json_or_html_inside_a_baseline_is_refused(failed, capsys, tmp_path):
  # Before: `report B --json B/manifest.json` overwrote the baseline's own manifest.
  before = {p: p.read_bytes() for p in failed.parent.rglob("*") if p.is_file()}
  for flag, target in (("--json", failed / "manifest.json"), ("--json", failed / "new.json"),
                       ("--html", Path(f"{failed}.obtained") / "page.html")):
    assert cli.main(["report", str(failed), flag, str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag} {target}: lies inside ") and err.count("\n") == 1
  assert {p: p.read_bytes() for p in failed.parent.rglob("*") if p.is_file()} == before
  assert cli.main(["report", str(failed), "--json", str(tmp_path / "r.json")]) == 1


def test_a_model_whose_parameters_are_named_file_and_allow_pickle_stores_its_weights(tmp_path):
  # Before: np.savez_compressed(npz, **weights) raised TypeError ("multiple values for
  # argument 'file'"); a parameter `allow_pickle` alone was written, then unreadable.
  class Odd(nnx.Module):
    def __init__(self):
      self.file = nnx.Param(jnp.ones((1, 2), jnp.float32))
      self.allow_pickle = nnx.Param(jnp.full((1, 2), 2.0, jnp.float32))

    def __call__(self, x):
      return x * self.file[...] + self.allow_pickle[...]

  guard = Guard(tmp_path / "mod")
  assert guard.check("odd", Odd(), X, store_params=True).status == "written"
  assert guard.check("odd", Odd(), X, store_params=True).status == "passed"
  (weights,) = (tmp_path / "_weights").iterdir()
  assert sorted(store.read_baseline(weights).arrays) == ["allow_pickle", "file"]
