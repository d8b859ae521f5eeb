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
  # pyproject.toml's build backend, called as `pip wheel --no-build-isolation` calls it (with
  # this venv's setuptools), without pip around it: 0.26 s of CPU instead of 0.79 s
  # (`/usr/bin/time`, 2 cores).
  out = tmp_path_factory.mktemp("wheel")
  build = ("import importlib, sys, tomllib\n"
           "with open('pyproject.toml', 'rb') as f:\n"
           "  backend = tomllib.load(f)['build-system']['build-backend']\n"
           "importlib.import_module(backend).build_wheel(sys.argv[1])\n")
  done = _run(Path(sys.executable), "-c", build, str(out), cwd=ROOT)
  assert done.returncode == 0, done.stdout + done.stderr
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

# One interpreter of the fresh venv, in the user's project, first runs the kit's
# `python -m nnx_pool.regression` three times as `-m` runs it (runpy.run_module with
# alter_sys=True: the package's own __main__, from the wheel), before anything of nnx_pool is
# imported, as in an interpreter of its own: record without --out, info, check; then the first
# pytest session there (as `python -m pytest`: the plugin loads through its entry point), whose
# user test imports their own `regression` after the kit ran (neither shadows the other). Each
# start of an interpreter that imports JAX costs 1.3-1.7 s of CPU: with separate starts of these
# five (pytest, a where-is-it query, info, record, check) the file took 12.4 s of CPU (user +
# sys), with one 7.8 s (`/usr/bin/time` around `pytest tests/test_install.py`, 2 cores, twice
# each, 2026-12-07). The second pytest session stays a `python -m pytest` of its own: in a fresh
# process, the plugin loads and reads from disk the baseline the first one wrote.
_FIRST_RUN = """\
import contextlib, hashlib, importlib.util, io, json, runpy, sys
from pathlib import Path

report, options = sys.argv[1], sys.argv[2:]
# Where the wheel put the package, found without importing it.
package = Path(importlib.util.find_spec("nnx_pool").origin)
shipped = package.parent / "regression" / "baseline"


def files(directory):
  return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def kit(*argv):
  out, err = io.StringIO(), io.StringIO()
  sys.argv = ["nnx_pool.regression", *argv]
  code = "did not exit"  # __main__ ends with sys.exit
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      runpy.run_module("nnx_pool.regression", run_name="__main__", alter_sys=True)
    except SystemExit as e:
      code = e.code
  return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


found = {"before": files(shipped)}
found["record"] = kit("record")
found["after"] = files(shipped)
found["info"] = kit("info")
found["check"] = kit("check", "-k", "avg_k2_one", "--json", report)
import nnx_pool
from nnx_pool.regression import stamp

found.update(package=nnx_pool.__file__, shipped=str(stamp.SHIPPED), looked_in=str(shipped))
import pytest

print("pytest exit", int(pytest.main(options)), flush=True)
print(%r + json.dumps(found))
"""
_KIT = "----- the kit: "


@pytest.fixture(scope="module")
def first_run(python, project, tmp_path_factory) -> tuple[str, str, dict]:
  """The first pytest session's output, the interpreter's stderr, and what the kit did before
  it in the same interpreter (before, record, after, info, check, package, shipped,
  looked_in), with the check's --json report."""
  report = tmp_path_factory.mktemp("report") / "r.json"
  done = _run(python, "-c", _FIRST_RUN % _KIT, str(report), *_NOT_THE_USERS, cwd=project)
  ran_pytest, _, kit = done.stdout.partition(_KIT)
  assert kit, done.stdout + done.stderr
  found = json.loads(kit)
  found["report"] = json.loads(report.read_text()) if report.is_file() else None
  return ran_pytest, done.stderr, found


def test_pytest_in_a_project_with_its_own_regression_package(python, project, first_run):
  output, stderr, _ = first_run
  assert "Error while loading plugin" not in output + stderr
  assert output.splitlines()[-1] == "pytest exit 1", output + stderr
  assert "1 failed, 1 passed" in output
  assert "nnx_regression: no baseline for 'double'; wrote one to" in output
  second = _run(python, "-m", "pytest", *_NOT_THE_USERS, cwd=project)
  assert second.returncode == 0, second.stdout + second.stderr
  assert "2 passed" in second.stdout


def test_python_dash_m_regression_runs_the_users_package(python, project):
  done = _run(python, "-m", "regression", cwd=project)
  assert (done.returncode, done.stdout) == (0, f"{MARKER}\n")


def test_the_kit_runs_from_the_wheel(first_run):
  _, _, found = first_run
  info = found["info"]
  assert info["code"] == 0, info
  assert f"  jax{' ' * 28}{jax.__version__}" in info["stdout"]
  package = Path(found["package"])
  assert package.name == "__init__.py" and not package.is_relative_to(ROOT)


def test_record_without_out_refuses_to_write_into_the_installed_package(first_run):
  _, _, found = first_run
  assert Path(found["shipped"]) == Path(found["looked_in"])  # the directory snapshotted
  assert "manifest.json" in found["before"]
  done = found["record"]
  assert done["code"] == 2, done
  (line,) = done["stderr"].splitlines()
  assert line.startswith("error: record: no --out given") and "pass --out DIR" in line
  assert found["after"] == found["before"]


def test_check_from_the_wheel_shows_an_unknown_git_revision(first_run):
  _, _, found = first_run
  done = found["check"]
  assert done["code"] == 0, done
  header = done["stdout"].splitlines()[0]
  assert header.startswith("this run: python ") and header.endswith(", git unknown")
  changes = found["report"]["stamp_changes"]
  assert not [c for c in changes if c.startswith("git")], changes
  assert "1 cases: 1 pass" in done["stdout"]
