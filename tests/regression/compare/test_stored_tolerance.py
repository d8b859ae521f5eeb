"""``diff`` and ``report`` compute each array's tolerance as ``check`` does (issue 36, item 5).

A manifest's tolerances can be edited: with ``atol`` set to 1e30 in the first baseline, an
output changed to ``3x + 7`` passed ``diff`` and ``report``. Both now compare under the
kit's tolerance for the array's kind, dtype and scale, keep one the test passed, and say
where a stored one is looser, naming the array. Expected tolerances come from the rules
docs/regression.md states: float32 ``window`` outputs ``rtol = atol = 1e-6``; a user's
float32 output ``rtol = 1e-5``, ``atol = min(1e-5, 1024 eps S)``.
"""

import hashlib
import json

import jax.numpy as jnp
import pytest

from nnx_pool.regression import cli, commands
from nnx_pool.regression.batch import Case
from nnx_pool.regression.guard import Guard

X = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)  # scale S = 5


def _edit(directory, change):
  """Edits a baseline's manifest as a person would, checksum included (sha256 of the
  manifest's sorted, compact JSON without its checksum)."""
  path = directory / "manifest.json"
  manifest = json.loads(path.read_text())
  change(manifest)
  body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
  text = json.dumps(body, sort_keys=True, separators=(",", ":"))
  manifest["manifest_sha256"] = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
  path.write_text(json.dumps(manifest))


def _loosen(results):
  for tol in results.values():
    tol.update(rule="allclose", rtol=1e30, atol=1e30)


def test_diff_recomputes_a_tolerance_edited_in_the_first_baseline(tmp_path):
  a, b = tmp_path / "a", tmp_path / "b"
  assert commands.record([Case("lin", lambda: (lambda x: x), input="one", module="fn",
                               config="x")], a, reps=1).exit_code == 0
  assert commands.record([Case("lin", lambda: (lambda x: 3 * x + 7), input="one", module="fn",
                               config="x")], b, reps=1).exit_code == 0
  _edit(a, lambda m: _loosen(m["cases"]["lin"]["results"]))
  report = commands.diff(a, b)
  assert report.exit_code == 1
  (row,) = report.rows
  assert row.status == "FAIL" and row.tolerance == "rtol=1e-06 atol=1e-06"
  assert (f"`lin:output`: the tolerance stored in {a} (rtol=1e+30 atol=1e+30) is looser than "
          "the one for its dtype and scale (rtol=1e-06 atol=1e-06): compared with the latter"
          ) in report.notes
  assert any(note.startswith("`lin:grad/input`: ") for note in report.notes)


@pytest.fixture
def failed(tmp_path):
  """A function's baseline (``a``: x, ``b``: x) and the obtained file of a check it failed
  (``a``: x + 1, ``b``: x + 0.1), both with ``atol=0.5`` passed by the test."""
  guard = Guard(tmp_path)
  assert guard.check("f", lambda x: {"a": x, "b": x}, X, atol=0.5).status == "written"
  with pytest.raises(AssertionError):
    guard.check("f", lambda x: {"a": x + 1, "b": x + 0.1}, X, atol=0.5)
  return tmp_path / "f"


def _rows(capsys):
  out = capsys.readouterr().out
  return out, {line.split()[0]: line.split()[-1] for line in out.splitlines()
               if line.startswith("f:output/")}


def test_report_keeps_the_tests_tolerance_and_says_it_is_looser(failed, capsys):
  assert cli.main(["report", str(failed)]) == 1
  out, rows = _rows(capsys)
  # atol=0.5 kept: 1 > 0.5 fails, 0.1 passes (the kit's atol of 1e-5 would fail both).
  assert rows == {"f:output/a": "FAIL", "f:output/b": "PASS"}
  assert ("`output/b`: compared with the tolerance the test set (rtol=1e-05 atol=0.5), "
          "looser than the kit's for its dtype and scale (rtol=1e-05 atol=1e-05)") in out


def test_report_recomputes_a_tolerance_edited_on_disk(failed, capsys):
  _edit(failed, lambda m: (_loosen(m["results"]), m.update(tolerance_override=None)))
  obtained = failed.parent / "f.obtained"
  _edit(obtained, lambda m: (_loosen(m["results"]), m.update(tolerance_override=None)))
  assert cli.main(["report", str(failed)]) == 1
  out, rows = _rows(capsys)
  assert rows == {"f:output/a": "FAIL", "f:output/b": "FAIL"}  # the kit's atol 1e-5
  for where in ("the baseline", "the obtained file"):
    assert (f"`output/b`: the tolerance stored in {where} (rtol=1e+30 atol=1e+30) is looser "
            "than the one for its dtype and scale (rtol=1e-05 atol=1e-05): compared with "
            "the latter") in out


def test_report_reads_the_tests_tolerance_from_a_manifest_without_the_field(failed, capsys):
  # Manifests written before `tolerance_override`: the reason says the test set the numbers.
  _edit(failed.parent / "f.obtained", lambda m: m.pop("tolerance_override"))
  assert cli.main(["report", str(failed)]) == 1
  assert _rows(capsys)[1] == {"f:output/a": "FAIL", "f:output/b": "PASS"}
