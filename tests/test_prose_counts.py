"""Counts in prose come from the code: every "N cases" the README, the guides and the docs
pages say of the kit's own batch is the batch's size.

Fenced blocks and inline code are left out: they quote the unedited output of real runs, each
at the revision its text names (guide 7's jax 0.7.0 run had 102 cases), and the CHANGELOG is
history.
"""

import re
from pathlib import Path

from nnx_pool.regression.batch import load_batch

ROOT = Path(__file__).resolve().parents[1]
# docs/evidence/ is left out with the CHANGELOG: it reports past runs (102 cases at jax 0.7.0).
PROSE = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "guides").glob("*.md"))]
CASES = re.compile(r"\b(\d+) cases\b")
CODE = re.compile(r"`[^`]*`")


def _prose_lines(path: Path):
  fenced = False
  for number, line in enumerate(path.read_text().splitlines(), 1):
    if line.lstrip().startswith("```"):
      fenced = not fenced
    elif not fenced:
      yield number, CODE.sub("", line)


def test_every_case_count_in_prose_is_the_batchs():
  size = len(load_batch().cases)
  wrong = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
           for path in PROSE for number, line in _prose_lines(path)
           for count in CASES.findall(line) if int(count) != size]
  assert wrong == [], f"the batch has {size} cases"


def test_the_pattern_finds_counts_outside_fences_only(tmp_path):
  page = tmp_path / "page.md"
  page.write_text("It ran 7 cases.\n```text\n9 cases: 9 pass\n```\nthe 12 cases, `3 cases`\n")
  assert [CASES.findall(line) for _, line in _prose_lines(page)] == [["7"], ["12"]]
