"""The README opens the door: at most 200 lines, the two commands CI runs, links that resolve.

The reference material (the modules' table, installing, the suite's costs, the repository's
layout) lives on docs/ pages, which the site serves beside the README.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 200
SHELL_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _commands(markdown: str) -> list[str]:
  """Each command of the page's ``sh`` blocks, without its comment."""
  return [line.split("#", 1)[0].strip() for block in SHELL_BLOCK.findall(markdown)
          for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_readme_has_at_most_200_lines():
  count = len(README.read_text(encoding="utf-8").splitlines())
  assert count <= MAX_LINES, (
      f"README.md has {count} lines, over {MAX_LINES}: move reference material to its docs/ "
      f"page (docs/modules.md, docs/install.md, docs/development.md) and link it")


def test_readme_gives_the_two_commands_and_ci_runs_the_test_one():
  commands = _commands(README.read_text(encoding="utf-8"))
  assert "make check" in commands and "make test" in commands, commands
  targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
  assert {"check", "test"} <= set(targets)
  ci = [line.split() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
  assert any(words[:2] == ["make", "test"] for words in ci), "CI does not run `make test`"
  assert any(words[:2] == ["make", "check"] for words in ci), "CI does not run `make check`"


def test_the_command_finder_reads_sh_blocks_only():
  page = "```sh\nmake check   # a comment\n\nmake test\n```\n```text\nmake nothing\n```\n"
  assert _commands(page) == ["make check", "make test"]


def test_readme_relative_links_resolve():
  text = re.sub(r"^```.*?^```", "", README.read_text(encoding="utf-8"), flags=re.S | re.M)
  targets = [t for t in LINK.findall(re.sub(r"`[^`]*`", "", text)) if "://" not in t]
  assert len(targets) > 10
  missing = [t for t in targets if not (ROOT / t).exists()]
  assert missing == [], f"README.md links to missing files: {missing}"
