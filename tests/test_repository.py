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


# One job a file: no module of the package or of the kit holds more than this many lines
# (the NumPy mirror, nnx_pool/reference.py, one function per module of the library, aside).
MAX_LINES = 500
LONG_ALLOWED = {"nnx_pool/reference.py"}
SOURCES = sorted(path.relative_to(ROOT).as_posix()
                 for folder in ("nnx_pool", "regression") for path in (ROOT / folder).rglob("*.py")
                 if "__pycache__" not in path.parts)


@pytest.mark.parametrize("name", [n for n in SOURCES if n not in LONG_ALLOWED])
def test_no_module_is_longer_than_500_lines(name):
  lines = len((ROOT / name).read_text().splitlines())
  assert lines <= MAX_LINES, f"{name} has {lines} lines: split it by job"


def test_the_line_count_sees_the_modules_of_every_folder():
  assert "regression/cli/dispatch.py" in SOURCES and "nnx_pool/__init__.py" in SOURCES
  assert "regression/fixture/model_state/state.py" in SOURCES and LONG_ALLOWED <= set(SOURCES)


def test_the_kit_imports_its_own_modules_relatively():
  # regression/ is installed as nnx_pool.regression: a name that exists only once installed.
  # Inside the folder every import of the kit is relative (`from .store import ...`), so the
  # folder reads as itself; the library under test, `nnx_pool`, is imported by its name.
  import ast

  found = []
  for name in SOURCES:
    if not name.startswith("regression/"):
      continue
    for node in ast.walk(ast.parse((ROOT / name).read_text(), name)):
      modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0
                 else [])
      found += [f"{name}:{node.lineno}" for module in modules
                if module == "nnx_pool.regression" or module.startswith("nnx_pool.regression.")]
  assert found == []


def test_every_folder_of_the_kit_is_a_package():
  # A folder of modules without __init__.py still imports (a namespace package), but has no
  # docstring saying what the room holds.
  folders = {(ROOT / name).parent for name in SOURCES if name.startswith("regression/")}
  bare = [f.relative_to(ROOT).as_posix() for f in folders if not (f / "__init__.py").is_file()]
  assert sorted(bare) == []


def test_the_package_imports_its_own_modules_relatively():
  # Inside nnx_pool every import of the package is relative (`from ._geometry import ...`).
  absolute = []
  for path in sorted((ROOT / "nnx_pool").glob("*.py")):
    absolute += [f"{path.name}:{number}: {line.strip()}"
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if re.match(r"\s*(from nnx_pool[. ]|import nnx_pool)", line)]
  assert absolute == [], "imports inside nnx_pool are relative (from ._x import y)"
