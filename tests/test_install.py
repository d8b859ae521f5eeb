"""The package as a user meets it: a built wheel in a fresh venv, beside their own `regression`.

The wheel must install one top-level package, `nnx_pool`; its pytest plugin and its
`python -m nnx_pool.regression` must work in a project that has a `regression` package
of its own, and neither may shadow the other. Dependencies are not downloaded: the
fresh venv sees this interpreter's site-packages through a `.pth` file pointing at
links to them, minus nnx-pool's own (editable) install.
"""

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import jax
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
MARKER = "user regression package"

USER_TEST = '''
import numpy as np

import regression


def test_users_own_regression_package_is_importable():
  assert regression.MARKER == "{marker}"


def test_double(nnx_regression):
  nnx_regression.check("double", lambda x: x * 2, np.arange(6, dtype=np.float32))
'''


def _run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items()
         if k != "PYTHONPATH" and not k.startswith(("PYTEST_", "VIRTUAL_ENV"))}
  return subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=300, check=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
  out = tmp_path_factory.mktemp("wheel")
  done = _run(Path(sys.executable), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
              "--quiet", "-w", str(out), str(ROOT), cwd=out)
  assert done.returncode == 0, done.stderr
  (path,) = out.glob("nnx_pool-*.whl")
  return path


@pytest.fixture(scope="module")
def python(wheel, tmp_path_factory) -> Path:
  """A fresh venv's interpreter with the wheel installed and the dependencies visible."""
  base = tmp_path_factory.mktemp("venv")
  venv = base / "venv"
  assert _run(Path(sys.executable), "-m", "venv", "--without-pip", str(venv),
              cwd=base).returncode == 0
  python = venv / "bin" / "python"
  done = _run(Path(sys.executable), "-m", "pip", "--python", str(python), "install", "--quiet",
              "--no-deps", "--no-index", str(wheel), cwd=base)
  assert done.returncode == 0, done.stderr
  deps = base / "deps"
  deps.mkdir()
  ours = ("nnx_pool", "__editable__", "nnx_pool-")
  for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
    if not entry.name.startswith(ours) and not entry.name.startswith("__editable___nnx_pool"):
      (deps / entry.name).symlink_to(entry)
  purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                 cwd=base).stdout.strip()
  (Path(purelib) / "_nnx_pool_test_deps.pth").write_text(f"{deps}\n")
  return python


@pytest.fixture(scope="module")
def installed(python, project) -> tuple[Path, Path]:
  """Where the fresh venv imports nnx_pool from, and the shipped baseline it would record to.

  One interpreter answers both (each `python -c` start is one more interpreter).
  """
  done = _run(python, "-c", "import nnx_pool; from nnx_pool.regression import stamp; "
              "print(nnx_pool.__file__); print(stamp.SHIPPED)", cwd=project)
  assert done.returncode == 0, done.stderr
  package, shipped = done.stdout.splitlines()
  return Path(package), Path(shipped)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
  root = tmp_path_factory.mktemp("user_project")
  (root / "regression").mkdir()
  (root / "regression" / "__init__.py").write_text(f'MARKER = "{MARKER}"\n')
  (root / "regression" / "__main__.py").write_text(f'print("{MARKER}")\n')
  (root / "tests").mkdir()
  (root / "tests" / "test_user.py").write_text(USER_TEST.format(marker=MARKER))
  return root


def test_wheel_installs_one_top_level_package_with_the_baseline(wheel):
  with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    entry_points = z.read(entry_points).decode()
  tops = {n.split("/")[0] for n in names}
  assert {t for t in tops if not t.endswith(".dist-info")} == {"nnx_pool"}
  assert "nnx_pool/regression/baseline/manifest.json" in names
  # Every module of the kit's rooms (pyproject.toml lists each sub-package).
  kit = {f"nnx_pool/regression/{p.relative_to(ROOT / 'regression').as_posix()}"
         for p in (ROOT / "regression").rglob("*.py") if "__pycache__" not in p.parts}
  assert sorted(kit - set(names)) == []
  assert [n for n in names if n.startswith("nnx_pool/regression/baseline/arrays")]
  assert "nnx_regression = nnx_pool.regression.pytest_plugin" in entry_points
  assert "nnx-pool-regression = nnx_pool.regression.cli:main" in entry_points


# The fresh venv sees this one's packages, our test-only pytest plugins among them; a user's
# project has its own. Hypothesis' plugin alone costs 0.6 s of each session's 2.3 s; nnx-pool's
# plugin still loads through its entry point.
_NOT_THE_USERS = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")


def test_pytest_in_a_project_with_its_own_regression_package(python, project):
  first = _run(python, "-m", "pytest", *_NOT_THE_USERS, cwd=project)
  output = first.stdout + first.stderr
  assert "Error while loading plugin" not in output
  assert first.returncode == 1, output
  assert "1 failed, 1 passed" in output
  assert "nnx_regression: no baseline for 'double'; wrote one to" in output
  second = _run(python, "-m", "pytest", *_NOT_THE_USERS, cwd=project)
  assert second.returncode == 0, second.stdout + second.stderr
  assert "2 passed" in second.stdout


def test_python_dash_m_regression_runs_the_users_package(python, project):
  done = _run(python, "-m", "regression", cwd=project)
  assert (done.returncode, done.stdout) == (0, f"{MARKER}\n")


def test_the_kit_runs_from_the_wheel(python, project, installed):
  info = _run(python, "-m", "nnx_pool.regression", "info", cwd=project)
  assert info.returncode == 0, info.stderr
  assert f"  jax{' ' * 28}{jax.__version__}" in info.stdout
  package, _ = installed
  assert package.name == "__init__.py" and not package.is_relative_to(ROOT)


def test_record_without_out_refuses_to_write_into_the_installed_package(
    python, project, installed):
  _, shipped = installed
  assert (shipped / "manifest.json").is_file()
  before = {p.name: p.read_bytes() for p in shipped.iterdir()}
  done = _run(python, "-m", "nnx_pool.regression", "record", cwd=project)
  assert done.returncode == 2
  (line,) = done.stderr.splitlines()
  assert line.startswith("error: record: no --out given") and "pass --out DIR" in line
  assert {p.name: p.read_bytes() for p in shipped.iterdir()} == before


def test_check_from_the_wheel_shows_an_unknown_git_revision(python, project, tmp_path):
  report = tmp_path / "r.json"
  done = _run(python, "-m", "nnx_pool.regression", "check", "-k", "avg_k2_one",
              "--json", str(report), cwd=project)
  assert done.returncode == 0, done.stdout + done.stderr
  header = done.stdout.splitlines()[0]
  assert header.startswith("this run: python ") and header.endswith(", git unknown")
  changes = json.loads(report.read_text())["stamp_changes"]
  assert not [c for c in changes if c.startswith("git")], changes
  assert "1 cases: 1 pass" in done.stdout
