"""The shipped baseline against this environment: a numeric drift fails the suite.

regression/baseline/ was recorded on CPU with the versions in constraints.txt.
On those versions every case must pass. On other versions (the floor job runs
jax 0.7.0 / flax 0.11.2) the same tolerances apply, so this test is also the
upgrade check.

`make test` runs a deterministic sample of the batch, not all of it: the full batch
(42 s of CPU, most of it XLA compiling, measured on the 2-core machine) is what
`make check` runs, and CI runs `make check` on the pinned and on the floor versions.
The sample: every case whose name's CRC-32 is a multiple of :data:`SAMPLE_EVERY` (a
new case falls in or out by its name alone, so the sample does not shift when cases
are added), and every error case (they compile nothing): every 12th case, not every 8th,
took this file from 8.4 s to 5.5 s of CPU (`pytest tests/regression/batch/test_shipped.py`,
2 cores). The gates built from ``nnx.Linear`` or ``nnx.BatchNorm`` layers and the attention pools
(:data:`LEFT_TO_MAKE_CHECK`) fall outside it: they are the costliest cases (1-3 s each:
building those layers compiles Flax's initialisers, and the eager run compiles op by
op), and tests/test_gates_timm.py and tests/test_attention.py check their values
against timm 1.0.31's forward in the suite. ECA (a 1-D convolution of k weights) stays
in. Every case, sampled or not, is still checked for what costs no compiling: the batch
and the baseline hold the same cases with the same declarations (a NEW, GONE or STALE
case fails here).
"""

import json
import zlib

import pytest

from nnx_pool.regression import commands
from nnx_pool.regression.batch import Batch, load_batch
from nnx_pool.regression.batch.baseline import declaration_changes
from nnx_pool.regression.cli import main
from nnx_pool.regression.stamp import SHIPPED

SAMPLE_EVERY = 12  # 10 of the 103 cases that compute something (9 modules), and the error
# cases: 13 of the 23 modules in all
LEFT_TO_MAKE_CHECK = frozenset({
    "SqueezeExcitation", "EffectiveSqueezeExcitation", "CBAM", "LightCBAM", "GlobalContext",
    "AttentionPool", "AttentionPoolLatent"})


def _sampled(batch: Batch) -> list[str]:
  return [case.name for case in batch.cases
          if case.raises is not None or (case.module not in LEFT_TO_MAKE_CHECK
                                         and zlib.crc32(case.name.encode()) % SAMPLE_EVERY == 0)]


def test_every_case_of_the_batch_is_in_the_shipped_baseline_as_declared():
  # No case runs: what `check` reports as NEW, GONE or STALE without computing anything.
  batch = load_batch()
  entries = commands.load(SHIPPED).manifest["cases"]
  assert sorted(case.name for case in batch.cases) == sorted(entries)
  stale = {case.name: declaration_changes(entries[case.name]["declaration"],
                                          case.describe())
           for case in batch.cases}
  assert not {name: changes for name, changes in stale.items() if changes}


@pytest.mark.slow
def test_shipped_baseline_passes_in_this_environment(tmp_path, capsys):
  batch = load_batch()
  sample = _sampled(batch)
  # A sample of most modules, not the batch: `make check` runs the rest.
  assert len({c.module for c in batch.cases if c.name in sample}) >= 13
  assert len(sample) < len(batch.cases) / 2
  report_path = tmp_path / "check.json"
  code = main(["check", "--json", str(report_path)],
              batch=lambda: Batch([c for c in batch.cases if c.name in sample], batch.notes))
  table = capsys.readouterr().out
  report = json.loads(report_path.read_text())
  # The cases left out of the sample are in the baseline but not in the batch handed to
  # `check`, so it lists them GONE (and exits 1 for that); every case it ran passes.
  statuses = {row["case"]: row["status"] for row in report["rows"]}
  assert {name for name, status in statuses.items() if status != "GONE"} == set(sample), table
  assert {statuses[name] for name in sample} == {"PASS"}, table
  left_out = {c.name for c in batch.cases} - set(sample)
  assert {name for name, status in statuses.items() if status == "GONE"} == left_out
  assert code == 1, table
