"""Repository hygiene: no machine path (a home, temp or work directory) in what is shipped."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# An absolute path under a home, temp or scratch directory of some machine.
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:tmp|home|root|work|Users|private/var)/")
TEXT = {".py", ".md", ".toml", ".txt", ".json", ".cfg", ".ini", ".sh", ".yml", ".yaml", ""}


def _tracked() -> list[Path]:
  try:
    done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
  except (OSError, subprocess.CalledProcessError):
    pytest.skip("not a git checkout: the tracked files are unknown")
  return [ROOT / name for name in done.stdout.decode().split("\0") if name]


def test_no_machine_path_in_tracked_text_files():
  found = []
  for path in _tracked():
    if path.suffix not in TEXT or not path.is_file():
      continue
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
      if MACHINE_PATH.search(line):
        found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}")
  assert not found, "\n".join(found)


def test_the_pattern_sees_a_machine_path():
  slash = "/"  # spelt apart, so that this file does not hold the paths it tests
  assert MACHINE_PATH.search(f'baseline = "{slash}tmp/base-old"')
  assert MACHINE_PATH.search(f"see {slash}home/me/notes.md")
  assert not MACHINE_PATH.search("regression/baseline/manifest.json and ./tmp/x")


def test_the_version_is_written_once():
  # nnx_pool.__version__ is read from the installed metadata, which pyproject.toml writes.
  import importlib.metadata
  import tomllib

  import nnx_pool

  declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
  assert nnx_pool.__version__ == declared == importlib.metadata.version("nnx-pool")
  source = (ROOT / "nnx_pool" / "__init__.py").read_text()
  assert f'"{declared}"' not in source


def test_every_public_module_has_a_page_on_the_site():
  # docs/site_src/hooks.py's AREAS, read without importing mkdocs (the `docs` extra): a
  # private module no area lists sends its names to the catch-all page (the gates split
  # did, until its new modules were listed).
  import ast

  import nnx_pool

  tree = ast.parse((ROOT / "docs" / "site_src" / "hooks.py").read_text())
  areas = next(node.value for node in tree.body if isinstance(node, ast.Assign)
               and any(getattr(t, "id", None) == "AREAS" for t in node.targets))
  listed = {module for area in ast.literal_eval(areas) for module in area[2]}
  assert sorted(set(nnx_pool._WHERE.values()) - listed) == []


# One job a file (issue 37): the modules' files stay short enough to read as one job; the
# NumPy mirror, a loop per rule, is the exception.
MAX_MODULE_LINES = 500


def test_each_module_file_is_at_most_500_lines_and_imports_its_package_relatively():
  long, absolute = [], []
  for path in sorted((ROOT / "nnx_pool").glob("*.py")):
    lines = path.read_text().splitlines()
    if path.name != "reference.py" and len(lines) > MAX_MODULE_LINES:
      long.append(f"{path.name}: {len(lines)} lines")
    absolute += [f"{path.name}:{number}: {line.strip()}"
                 for number, line in enumerate(lines, 1)
                 if re.match(r"\s*(from nnx_pool[. ]|import nnx_pool)", line)]
  assert long == [], f"over {MAX_MODULE_LINES} lines: split by job"
  assert absolute == [], "imports inside nnx_pool are relative (from ._x import y)"
