"""Every third-party import is a declared dependency, and every dependency is imported."""

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Import names whose distribution is spelled otherwise.
DISTRIBUTION = {"ml_dtypes": "ml-dtypes", "xdist": "pytest-xdist"}
LOCAL = {"nnx_pool", "benchmarks", "conftest", "make_figures", "_sharding_worker", "_resnet",
         "_effnet", "link_layout"}
# Installed code may import an optional extra's distribution only in the modules
# named here, and only inside functions, so that the kit runs without the extra.
OPTIONAL = {"matplotlib": ("report", ["regression/report/html.py"]),
            "uv": ("upgrade", ["regression/upgrade/installer.py"])}


def _normalise(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _declared(*groups: str) -> set[str]:
  requirements = list(PYPROJECT["project"]["dependencies"])
  for group in groups:
    requirements += PYPROJECT["project"]["optional-dependencies"][group]
  return {_normalise(re.match(r"[A-Za-z0-9_.\-]+", r).group()) for r in requirements}


def _type_checking_only(tree: ast.AST) -> set[ast.AST]:
  """The nodes under ``if TYPE_CHECKING:``, which only type checkers read (not at run time)."""
  return {inner for node in ast.walk(tree)
          if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
          and node.test.id == "TYPE_CHECKING"
          for statement in node.body for inner in ast.walk(statement)}


def _imported(*paths: Path) -> dict[str, set[str]]:
  """Third-party distributions imported at run time by the files under ``paths``, and where."""
  found: dict[str, set[str]] = {}
  files = [p for path in paths for p in ([path] if path.is_file() else path.rglob("*.py"))]
  for file in files:
    tree = ast.parse(file.read_text(), str(file))
    static = _type_checking_only(tree)
    for node in ast.walk(tree):
      if node in static:
        continue
      if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [node.module]
      else:
        continue
      for name in names:
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top in LOCAL:
          continue
        dist = _normalise(DISTRIBUTION.get(top, top))
        found.setdefault(dist, set()).add(str(file.relative_to(ROOT)))
  # Strings passed to pytest.importorskip("torch") count as imports too.
  for file in files:
    for match in re.finditer(r"importorskip\(\s*\"([A-Za-z0-9_]+)\"", file.read_text()):
      top = match.group(1)
      found.setdefault(_normalise(DISTRIBUTION.get(top, top)), set()).add(
          str(file.relative_to(ROOT)))
  return found


def test_installed_code_imports_exactly_its_runtime_dependencies():
  imported = _imported(ROOT / "nnx_pool", ROOT / "regression")
  # The pytest plugin imports pytest, and only pytest loads the plugin: not a run-time need.
  imported.pop("pytest")
  for dist in OPTIONAL:  # tested below
    imported.pop(dist, None)
  declared = _declared()
  undeclared = {d: sorted(files) for d, files in imported.items() if d not in declared}
  assert undeclared == {}, f"imported but not in [project] dependencies: {undeclared}"
  # jaxlib is never imported by name: jax imports it, and the pair must match, so it is
  # declared beside jax with the same floor. flatbuffers neither: jax.export's serialize
  # imports it, and jax does not declare it.
  unused = declared - set(imported) - {"jaxlib", "flatbuffers"}
  assert unused == set(), f"declared but imported nowhere in nnx_pool/ or regression/: {unused}"


def test_tests_guides_and_benchmarks_import_only_declared_packages():
  paths = [ROOT / "tests", ROOT / "guides", ROOT / "benchmarks", ROOT / "conftest.py"]
  imported = _imported(*paths)
  # pytest is what runs this code; it is also declared in the `test` extra.
  # The site's browser test (`make test-site`) drives Chromium through the `docs` extra's
  # Playwright, and only there.
  undeclared = {d: sorted(files) for d, files in imported.items()
                if d not in _declared("test", "parity")
                and not (d in _declared("docs") and set(files) == {"tests/test_site.py"})}
  assert undeclared == {}, f"imported but not declared (run time, test or parity): {undeclared}"
  assert {"pytest", "hypothesis", "sybil", "torch"} <= set(imported)


def test_the_pytest_plugin_is_the_only_installed_module_importing_pytest():
  imported = _imported(ROOT / "nnx_pool", ROOT / "regression")
  assert sorted(imported.get("pytest", set())) == ["regression/pytest_plugin.py"]


def test_optional_extras_are_imported_lazily_by_their_modules_alone():
  imported = _imported(ROOT / "nnx_pool", ROOT / "regression")
  for dist, (extra, files) in OPTIONAL.items():
    assert dist in _declared(extra) - _declared(), f"{dist} is not an optional `{extra}` extra"
    assert sorted(imported.get(dist, set())) == files
    for file in files:
      module = ast.parse((ROOT / file).read_text(), file)
      top = {alias.name.split(".")[0] for node in module.body if isinstance(node, ast.Import)
             for alias in node.names}
      top |= {node.module.split(".")[0] for node in module.body
              if isinstance(node, ast.ImportFrom) and node.module}
      assert dist not in top, f"{file} imports {dist} at module level; import it where it is used"
