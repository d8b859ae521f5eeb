"""tools/compile_census.py adds up the workers' files (the plugin itself is a maintainer's tool,
run as docs/development.md says)."""

import json
import runpy
from pathlib import Path

summary = runpy.run_path(str(Path(__file__).resolve().parents[1] / "tools" / "compile_census.py"))[
    "summary"]


def test_summary_adds_the_workers_files_up(tmp_path):
  for worker, (count, seconds) in enumerate([(3, 1.5), (1, 0.25)]):
    (tmp_path / f"{worker}.json").write_text(json.dumps({
        "cpu_s": 10.0, "events": {"/jax/core/compile/backend_compile_duration": seconds},
        "staging": {"tests/test_a.py": seconds / 2},
        "programs": {"jit_flat\ttests/test_a.py": [count, seconds],
                     "jit_run\ttests/test_b.py": [1, 0.5]}}))
  lines = summary(tmp_path).splitlines()
  assert lines[0] == "CPU of the processes that loaded the plugin: 20.0 s"
  assert lines[1] == "     1.8 s  /jax/core/compile/backend_compile_duration"
  assert "     1.8 s      4  jit_flat  tests/test_a.py" in lines
  assert "     1.0 s      2  jit_run  tests/test_b.py" in lines
  staged = lines.index("tracing and lowering by test file:")
  assert lines[staged + 1:staged + 3] == ["     0.9 s  tests/test_a.py", "by program name:"]
  assert lines[lines.index("by test file:") + 1:] == ["     1.8 s  tests/test_a.py",
                                                      "     1.0 s  tests/test_b.py"]
