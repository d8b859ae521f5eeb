"""The shipped baseline against this environment: a numeric drift fails the suite.

regression/baseline/ was recorded on CPU with the versions in constraints.txt.
On those versions every case must pass. On other versions (the floor job runs
jax 0.7.0 / flax 0.11.2) the same tolerances apply, so this test is also the
upgrade check that the README's `make check` runs.
"""

import json

import pytest

from nnx_pool.regression.cli import main


@pytest.mark.slow
def test_shipped_baseline_passes_in_this_environment(tmp_path, capsys):
  report_path = tmp_path / "check.json"
  code = main(["check", "--json", str(report_path)])
  table = capsys.readouterr().out
  assert code == 0, f"regression check failed (exit {code}):\n{table}"
  report = json.loads(report_path.read_text())
  statuses = {row["status"] for row in report["rows"]}
  assert statuses == {"PASS"}, table
