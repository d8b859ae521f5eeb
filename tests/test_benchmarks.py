"""Smoke test: the benchmark entry point runs end to end on tiny shapes (no timing claims)."""

import json

import pytest

from benchmarks.cases import CASES
from benchmarks.run import main


@pytest.mark.slow
def test_benchmarks_quick_run_writes_every_row(tmp_path, capsys):
  out = tmp_path / "bench.json"
  assert main(["--quick", "--rounds", "1", "--warmup", "0", "--json", str(out)]) == 0
  report = json.loads(out.read_text())
  assert [row["case"] for row in report["rows"]] == [case.name for case in CASES]
  for row in report["rows"]:
    for pass_name in ("forward", "backward"):
      medians = row[pass_name]["median_ms"]
      assert set(medians) >= {"ours", "flax"}
      best_peer = min(v for k, v in medians.items() if k != "ours")
      assert row[pass_name]["ratio_to_best_peer"] == pytest.approx(medians["ours"] / best_peer)
  table = capsys.readouterr().out
  assert all(case.name in table for case in CASES)
  assert f"jax {report['environment']['jax']}" in table


def test_benchmarks_unknown_filter_is_an_error():
  with pytest.raises(SystemExit):
    main(["-k", "no such case"])
