"""Tests for ``rehearse``: the plan, the cache, pip's failures, and a run through a stand-in venv.

The fast tests never install anything: where a rehearsal runs end to end, ``venv`` is
replaced by a stand-in whose ``bin/python`` is a shell script that logs its arguments
and plays pip, ``check`` or pytest from files the test writes. The one test marked
``rehearsal`` installs real wheels from the registry (jax 0.9.2); ``make test`` leaves
it out and ``make test-rehearsal`` runs it.
"""

import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nnx_pool.regression import cli, pytest_plugin, rehearse
from nnx_pool.regression.rehearse import RehearsalError, Requirement, make_plan
from nnx_pool.regression.report import Report, Row
from nnx_pool.regression.stamp import SHIPPED, installed_versions

ROOT = Path(__file__).resolve().parents[1]
# The stand-in runs report jax 0.9.2; the change they show starts from the jax installed
# here (0.10.2 in the main CI job, 0.7.0 in the floor job).
REHEARSED_JAX = f"jax {importlib.metadata.version('jax')} -> 0.9.2 (rehearsal)"
PINS = {"flax": "0.12.8", "jax": "0.10.2", "jaxlib": "0.10.2", "numpy": "2.4.6",
        "optax": "0.2.8", "pytest": "9.2.0"}

# pip 23.2.1's output (the pip that `python -m venv` installs on Python 3.11), captured from
# real runs against PyPI; the long "from versions" list is cut.
PIP_NO_MATCH = """\
Looking in indexes: https://pypi.org/simple
ERROR: Ignored the following versions that require a different python version: 0.11.0 \
Requires-Python >=3.12
ERROR: Could not find a version that satisfies the requirement jax==0.0.1 (from versions: 0.0, \
0.1, 0.1.1, 0.10.2)
ERROR: No matching distribution found for jax==0.0.1
"""
PIP_CONFLICT = """\
Collecting jax==0.9.2
  Downloading jax-0.9.2-py3-none-any.whl (3.1 MB)
INFO: pip is looking at multiple versions of flax to determine which version is compatible \
with other requirements. This could take a while.
ERROR: Cannot install chex==0.1.92, flax==0.12.8, jax==0.9.2 and nnx-pool because these \
package versions have conflicting dependencies.

The conflict is caused by:
    The user requested jax==0.9.2
    nnx-pool 0.1.0 depends on jax>=0.7.0
    chex 0.1.92 depends on jax>=0.7.0
    flax 0.12.8 depends on jax>=0.10.0

To fix this you could try to:
1. loosen the range of package versions you've specified
2. remove package versions to allow pip attempt to solve the dependency conflict

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/#dealing-with-dependency-conflicts
"""

# ------------------------------------------------------------ the command line


def test_rehearse_parser_reads_requirements_then_options():
  args = cli._parser().parse_args([
      "rehearse", "jax==0.9.2", "flax>=0.12", "--baseline", "base", "--json", "r.json",
      "--no-cache", "-k", "avg_", "--dry-run", "--pytest", "tests/a.py", "tests/b.py"])
  assert args.command == "rehearse"
  assert args.requirements == ["jax==0.9.2", "flax>=0.12"]
  assert (args.baseline, args.json, args.pattern) == ("base", "r.json", "avg_")
  assert (args.cache, args.dry_run, args.html) == (False, True, None)
  assert args.pytest == ["tests/a.py", "tests/b.py"]
  defaults = cli._parser().parse_args(["rehearse", "jax==0.9.2"])
  assert (defaults.baseline, defaults.cache, defaults.pytest) == (str(SHIPPED), True, [])


def test_rehearse_parser_needs_a_requirement(capsys):
  with pytest.raises(SystemExit) as exit_:
    cli._parser().parse_args(["rehearse"])
  assert exit_.value.code == 2
  assert "REQ" in capsys.readouterr().err


# ------------------------------------------------------------------ the plan


@pytest.mark.parametrize(("text", "name", "versioned", "exact"), [
    ("jax==0.9.2", "jax", True, "0.9.2"),
    (" jax == 0.9.2 ", "jax", True, "0.9.2"),
    ("jax[cuda12]==0.9.2", "jax", True, "0.9.2"),
    ("flax>=0.12,<0.13", "flax", True, None),
    ("jax==0.9.*", "jax", True, None),
    ("ML_Dtypes~=0.5", "ml-dtypes", True, None),
    ("optax", "optax", False, None),
    ("jax (==0.9.2)", "jax", True, "0.9.2"),
    ("jax==0.9.2; python_version >= '3.11'", "jax", True, "0.9.2"),
    ("mylib @ https://example.org/mylib-1.0-py3-none-any.whl", "mylib", True, None),
    ("./wheels/jax-0.9.2-py3-none-any.whl", None, True, None),
])
def test_requirement_parse_names_and_versions(text, name, versioned, exact):
  req = Requirement.parse(text)
  assert (req.name, req.versioned, req.exact) == (name, versioned, exact)


@pytest.mark.parametrize("text", ["", "  ", "--index-url=https://x", "jax 0.9.2", "jax==1\nflax"])
def test_requirement_parse_refuses_what_is_no_requirement(text):
  with pytest.raises(RehearsalError, match=r"^rehearse: .* is not a requirement"):
    Requirement.parse(text)


def _dist_info(root: Path, name: str, version: str, direct_url: dict | None = None) -> None:
  info = root / f"{name.replace('-', '_')}-{version}.dist-info"
  info.mkdir()
  (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
  if direct_url is not None:
    (info / "direct_url.json").write_text(json.dumps(direct_url))


def test_installed_pins_leave_out_nnx_pool_and_path_or_url_installs(tmp_path):
  first, second = tmp_path / "a", tmp_path / "b"
  first.mkdir()
  second.mkdir()
  _dist_info(first, "jax", "0.10.2")
  _dist_info(first, "ML_Dtypes", "0.7.0")
  _dist_info(first, "nnx-pool", "0.1.0", {"url": "file:///src", "dir_info": {"editable": True}})
  _dist_info(first, "mylib", "1.0", {"url": "file:///src/mylib", "dir_info": {"editable": True}})
  _dist_info(first, "wheel-only", "2.0", {"url": "file:///w/wheel_only-2.0-py3-none-any.whl",
                                          "archive_info": {}})
  _dist_info(second, "jax", "0.4.0")  # shadowed by the first copy on the path
  _dist_info(second, "mylib", "0.9")  # shadowed by the editable one: not pinned either
  dists = importlib.metadata.distributions(path=[str(first), str(second)])
  assert rehearse.installed_pins(dists) == {"jax": "0.10.2", "ml-dtypes": "0.7.0"}


def test_installed_pins_of_this_environment_hold_jax_and_not_nnx_pool():
  pins = rehearse.installed_pins()
  assert pins["jax"] == installed_versions()["jax"]
  assert "nnx-pool" not in pins
  assert list(pins) == sorted(pins)


def test_this_source_of_a_checkout_is_copied_never_built_in_place(tmp_path):
  source = rehearse.this_source()
  assert source.root == ROOT and any(r.startswith("jax>=") for r in source.requires)
  requirement = source.requirement(["report"], tmp_path)
  assert requirement == f"nnx-pool[report] @ {(tmp_path / 'nnx-pool-source').as_uri()}"
  copied = {p.relative_to(tmp_path / "nnx-pool-source") for p in
            (tmp_path / "nnx-pool-source").rglob("*") if p.is_file()}
  assert {Path("pyproject.toml"), Path("nnx_pool/__init__.py"),
          Path("regression/baseline/manifest.json")} <= copied
  assert not any("__pycache__" in p.parts for p in copied)
  assert source.digest() == rehearse.this_source().digest()


@pytest.mark.parametrize(("direct_url", "expected"), [
    ({"url": "file:///w/nnx_pool-0.1.0-py3-none-any.whl", "archive_info": {}},
     "nnx-pool[report] @ file:///w/nnx_pool-0.1.0-py3-none-any.whl"),
    (None, "nnx-pool[report]==0.1.0"),
])
def test_this_source_of_an_installed_wheel_is_where_pip_got_it(
    monkeypatch, tmp_path, direct_url, expected):
  _dist_info(tmp_path, "nnx-pool", "0.1.0", direct_url)
  (dist,) = importlib.metadata.distributions(path=[str(tmp_path)])
  monkeypatch.setattr(rehearse, "source_checkout", lambda: None)
  monkeypatch.setattr(importlib.metadata, "distribution", lambda name: dist)
  source = rehearse.this_source()
  assert source.root is None
  assert source.requirement(["report"], tmp_path) == expected
  assert source.requirement([], tmp_path) == expected.replace("[report]", "")


def test_make_plan_a_requirement_releases_only_its_own_pin():
  plan = make_plan(["flax==0.12.5"], pins=PINS)
  assert plan.requirements == ("flax==0.12.5",)
  assert plan.constraints == ("jax==0.10.2", "jaxlib==0.10.2", "numpy==2.4.6", "optax==0.2.8",
                              "pytest==9.2.0")
  assert plan.extras == ()


def test_make_plan_jax_pinned_exactly_brings_jaxlib_to_the_same_version():
  plan = make_plan(["jax==0.9.2"], pins=PINS)
  assert plan.requirements == ("jax==0.9.2", "jaxlib==0.9.2")
  assert plan.changes == ("jax==0.9.2",)
  assert not any(c.startswith(("jax==", "jaxlib==")) for c in plan.constraints)
  assert make_plan(["jaxlib==0.9.2"], pins=PINS).requirements == ("jaxlib==0.9.2", "jax==0.9.2")


def test_make_plan_jax_range_releases_jaxlib_for_pip_to_choose():
  plan = make_plan(["jax<0.10"], pins=PINS)
  assert plan.requirements == ("jax<0.10",)
  assert not any(c.startswith("jaxlib") for c in plan.constraints)


def test_make_plan_naming_both_of_the_pair_chooses_each():
  plan = make_plan(["jax==0.9.2", "jaxlib==0.9.1"], pins=PINS)
  assert plan.requirements == ("jax==0.9.2", "jaxlib==0.9.1")


def test_make_plan_a_bare_name_keeps_the_pin_of_this_environment():
  plan = make_plan(["jax==0.9.2", "optax", "sybil"], pins=PINS)
  assert "optax==0.2.8" in plan.constraints
  assert plan.requirements == ("jax==0.9.2", "optax", "sybil", "jaxlib==0.9.2")


def test_make_plan_html_and_pytest_add_matplotlib_and_pytest():
  plan = make_plan(["jax==0.9.2"], pins=PINS, html=True, pytest=True)
  assert plan.extras == ("report",)
  assert plan.requirements[-1] == "pytest"
  assert "pytest==9.2.0" in plan.constraints  # pytest at this environment's version
  named = make_plan(["jax==0.9.2", "pytest==8.4.0"], pins=PINS, pytest=True)
  assert named.requirements.count("pytest") == 0 and "pytest==9.2.0" not in named.constraints


def test_make_plan_refuses_nnx_pool_and_an_empty_list():
  with pytest.raises(RehearsalError, match="names nnx-pool, which the rehearsal installs"):
    make_plan(["nnx_pool==0.0.9"], pins=PINS)
  with pytest.raises(RehearsalError, match="name at least one requirement"):
    make_plan([], pins=PINS)


def test_plan_key_is_stable_and_ignores_order():
  key = make_plan(["jax==0.9.2", "flax==0.12.6"], pins=PINS).key()
  assert len(key) == 16 and int(key, 16) >= 0
  assert make_plan(["flax==0.12.6", "jax==0.9.2"], pins=PINS).key() == key
  assert make_plan(["jax==0.9.2", "flax==0.12.6"], pins=dict(reversed(PINS.items()))).key() == key
  others = [
      make_plan(["jax==0.9.2", "flax==0.12.5"], pins=PINS),
      make_plan(["jax==0.9.2", "flax==0.12.6"], pins={**PINS, "numpy": "2.4.5"}),
      make_plan(["jax==0.9.2", "flax==0.12.6"], pins=PINS, html=True),
      make_plan(["jax==0.9.2", "flax==0.12.6"], pins=PINS, pytest=True),
      make_plan(["jax==0.9.2", "flax==0.12.6"], pins=PINS, requires=["jax>=0.8"]),
  ]
  assert len({key, *(p.key() for p in others)}) == 1 + len(others)


def test_cache_root_follows_nnx_pool_cache_then_xdg_then_home(monkeypatch, tmp_path):
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
  monkeypatch.delenv("NNX_POOL_CACHE", raising=False)
  assert rehearse.cache_root() == tmp_path / "home" / ".cache" / "nnx-pool" / "rehearse"
  assert rehearse.shown(rehearse.cache_root()) == "~/.cache/nnx-pool/rehearse"
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert rehearse.cache_root() == tmp_path / "xdg" / "nnx-pool" / "rehearse"
  monkeypatch.setenv("NNX_POOL_CACHE", str(tmp_path / "mine"))
  assert rehearse.cache_root() == tmp_path / "mine" / "rehearse"


# ------------------------------------------------------------------ reporting


def test_pip_failure_names_the_requirement_without_a_distribution():
  assert rehearse.pip_failure(PIP_NO_MATCH, ["jax==0.0.1", "flax==0.12.6"], PINS) == (
      "rehearse: pip could not install jax==0.0.1: "
      "No matching distribution found for jax==0.0.1")


def test_pip_failure_names_the_pin_in_the_way_of_a_conflict():
  assert rehearse.pip_failure(PIP_CONFLICT, ["jax==0.9.2"], {**PINS, "chex": "0.1.92"}) == (
      "rehearse: pip could not install jax==0.9.2: flax 0.12.8 depends on jax>=0.10.0 "
      "(flax 0.12.8 is this environment's version; name a flax version too)")


def test_pip_failure_of_a_pinned_constraint_and_of_an_unknown_error():
  output = ("ERROR: Cannot install jax==0.9.2 because these package versions have conflicting "
            "dependencies.\n\nThe conflict is caused by:\n    The user requested jax==0.9.2\n"
            "    jax 0.9.2 depends on numpy<2.4\n"
            "    The user requested (constraint) numpy==2.4.6\n\n")
  assert rehearse.pip_failure(output, ["jax==0.9.2"], PINS) == (
      "rehearse: pip could not install jax==0.9.2: jax 0.9.2 depends on numpy<2.4; The user "
      "requested (constraint) numpy==2.4.6 (numpy 2.4.6 is this environment's version; name a "
      "numpy version too)")
  assert rehearse.pip_failure("Some\nnetwork trouble\n\n", ["flax==0.12.6"], PINS) == (
      "rehearse: pip could not install flax==0.12.6: network trouble")


def test_rehearsal_changes_mark_only_the_versions_the_rehearsal_changed():
  old = {"versions": {"jax": "0.10.2", "flax": "0.11.2", "numpy": "2.4.6"}, "env": {}}
  new = {"versions": {"jax": "0.9.2", "flax": "0.12.8", "numpy": "2.4.6"},
         "env": {"XLA_FLAGS": "--x"}}
  here = {"jax": "0.10.2", "flax": "0.12.8", "numpy": "2.4.6"}
  assert rehearse.rehearsal_changes(old, new, here) == [
      "flax 0.11.2 -> 0.12.8",  # the baseline was recorded elsewhere: not the rehearsal's doing
      "jax 0.10.2 -> 0.9.2 (rehearsal)",
      "env XLA_FLAGS unset -> --x",
  ]


@pytest.mark.parametrize(("check", "tested", "code"), [
    (0, None, 0), (1, None, 1), (2, None, 2), (0, 0, 0), (0, 1, 1), (1, 0, 1), (0, 5, 2),
    (0, 4, 2), (1, 2, 2), (2, 1, 2), (0, 99, 2),
])
def test_combined_exit_is_the_worse_of_check_and_pytest(check, tested, code):
  assert rehearse.combined_exit(check, tested) == code


def test_the_check_only_variable_is_the_plugins():
  assert rehearse.CHECK_ONLY_ENV == pytest_plugin.CHECK_ONLY_ENV


# ------------------------------------------------- a run through a stand-in venv

FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$FAKE/log"
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  cat "$FAKE/pip_output"; exit "$(cat "$FAKE/pip_rc")"
fi
if [ "$3" = "nnx_pool.regression" ]; then
  while [ $# -gt 0 ]; do
    if [ "$1" = "--json" ]; then cp "$FAKE/report.json" "$2"; fi
    shift
  done
  exit "$(cat "$FAKE/check_rc")"
fi
if [ "$3" = "pytest" ]; then
  echo "check-only=$NNX_REGRESSION_CHECK_ONLY" >> "$FAKE/log"; exit "$(cat "$FAKE/pytest_rc")"
fi
exit 99
"""


class _StandInBuilder:
  """Replaces venv.EnvBuilder: the environment's python is FAKE_PYTHON."""

  created: list[Path] = []

  def __init__(self, *, with_pip: bool, symlinks: bool):
    assert with_pip

  def create(self, env):
    env = Path(env)
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text(FAKE_PYTHON)
    (env / "bin" / "python").chmod(0o755)
    (env / "pyvenv.cfg").write_text("home = nowhere\n")
    self.created.append(env)


class _Progress:
  def __init__(self):
    self.calls = []

  def __call__(self, n, total, what):
    self.calls.append((n, total, what))

  def clear(self):
    self.calls.append("clear")


def _check_report(code: int = 1) -> dict:
  here = installed_versions()
  report = Report(
      command="check", exit_code=code, baseline="/elsewhere/baseline",
      baseline_stamp={"versions": {**here, "jax": here["jax"]}, "git": {}},
      stamp={"versions": {**here, "jax": "0.9.2"}, "git": {"revision": None, "dirty": None}},
      rows=[Row("max_k2_one", "PASS", 0.0, 0.0, "exact"),
            Row("avg_k2_one", "FAIL" if code else "PASS", 2e-5, 1e-5, "rtol=1e-06 atol=1e-06",
                ["output: 1 of 9 elements differ"] if code else [])],
  )
  return report.to_json()


@dataclasses.dataclass
class StandIn:
  """The files the stand-in python reads, its log, and every process started."""

  dir: Path
  started: list[list[str]]

  def write(self, name: str, text: str) -> None:
    (self.dir / name).write_text(text)

  def log(self) -> list[str]:
    return (self.dir / "log").read_text().splitlines()


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
  """A stand-in venv and a record of every process started; returns the files it reads."""
  fake = tmp_path / "fake"
  fake.mkdir()
  for name, text in {"pip_output": "", "pip_rc": "0", "check_rc": "1", "pytest_rc": "0",
                     "log": ""}.items():
    (fake / name).write_text(text)
  (fake / "report.json").write_text(json.dumps(_check_report()))
  monkeypatch.setenv("FAKE", str(fake))
  monkeypatch.setenv("NNX_POOL_CACHE", str(tmp_path / "cache"))
  monkeypatch.setattr(rehearse.venv, "EnvBuilder", _StandInBuilder)
  _StandInBuilder.created = []
  started = []
  real_popen = subprocess.Popen

  class Recording(real_popen):
    def __init__(self, args, *a, **k):
      started.append([str(x) for x in args])
      super().__init__(args, *a, **k)

  monkeypatch.setattr(subprocess, "Popen", Recording)
  yield StandIn(fake, started)
  # The current environment is never touched: nothing ran this interpreter or its pip.
  envs = [tmp_path / "cache", *_StandInBuilder.created]  # the cache, and --no-cache's
  for args in started:
    assert args[0] == "git" or any(Path(args[0]).is_relative_to(env) for env in envs), args
    assert Path(args[0]).resolve() != Path(sys.executable).resolve()


def test_rehearse_an_unsatisfiable_requirement_exits_2_with_one_line(stand_in, capsys):
  stand_in.write("pip_output", PIP_NO_MATCH)
  stand_in.write("pip_rc", "1")
  assert cli.main(["rehearse", "jax==0.0.1"]) == 2
  out, err = capsys.readouterr()
  assert out == ""
  assert err == ("error: rehearse: pip could not install jax==0.0.1: "
                 "No matching distribution found for jax==0.0.1\n")
  root = Path(os.environ["NNX_POOL_CACHE"]) / "rehearse"
  assert list(root.iterdir()) == []  # the half-built environment is gone, nothing cached
  pip_calls = [a for a in stand_in.started if a[1:3] == ["-m", "pip"]]
  assert len(pip_calls) == 1 and pip_calls[0][3] == "install"


def test_rehearse_runs_check_there_and_reports_the_change_as_the_rehearsals(stand_in):
  stand_in.write("pip_output", "WARNING: Location ignored\nCollecting jax==0.9.2\n")
  progress = _Progress()
  report = rehearse.rehearse(["jax==0.9.2"], baseline="base", progress=progress)
  assert report.exit_code == 1 and report.error is None
  assert REHEARSED_JAX in report.stamp_changes
  assert report.baseline == "base"
  assert report.counts() == {"PASS": 1, "FAIL": 1}
  assert report.stamp["git"]["revision"]  # this checkout's, which the environment holds
  assert report.notes[-1].startswith("rehearsal: check ran in a separate environment with "
                                     "jax==0.9.2, everything else at this environment's")
  assert [c[:2] for c in progress.calls if c != "clear"][0] == (1, 3)
  steps = [c[2] for c in progress.calls if c != "clear"]
  assert steps[0] == "creating a virtual environment (python -m venv)"
  assert steps[1:3] == ["installing jax==0.9.2 jaxlib==0.9.2 and nnx-pool (pip)",
                        "pip: Collecting jax==0.9.2"]  # pip's lines, warnings left out
  assert steps[-1] == "running check" and progress.calls[-1] == "clear"
  (env,) = (Path(os.environ["NNX_POOL_CACHE"]) / "rehearse").iterdir()
  assert (env / "rehearsal-requirements.txt").read_text() == "jax==0.9.2\njaxlib==0.9.2\n"
  constraints = (env / "rehearsal-constraints.txt").read_text().splitlines()
  assert "flax==" + installed_versions()["flax"] in constraints
  assert not any(c.startswith(("jax==", "jaxlib==", "nnx-pool")) for c in constraints)
  log = stand_in.log()
  assert log[0].startswith("-m pip install -c ") and " nnx-pool @ file://" in log[0]
  assert log[1].startswith("-P -m nnx_pool.regression check --baseline ")
  assert f"--baseline {Path('base').absolute()} --json " in log[1]


def test_rehearse_reuses_a_cached_environment(stand_in):
  first = _Progress()
  rehearse.rehearse(["jax==0.9.2"], baseline="base", progress=first)
  again = _Progress()
  report = rehearse.rehearse(["jax==0.9.2"], baseline="base", progress=again)
  assert len(_StandInBuilder.created) == 1
  assert [c for c in again.calls if c != "clear"] == [(1, 1, "running check")]
  assert report.notes[-1].endswith("(reused)")
  log = stand_in.log()
  assert sum(line.startswith("-m pip") for line in log) == 1


def test_rehearse_interrupted_while_building_leaves_no_environment(stand_in, monkeypatch):
  def interrupted(self, env):
    (Path(env) / "bin").mkdir(parents=True)  # half built
    raise KeyboardInterrupt

  monkeypatch.setattr(_StandInBuilder, "create", interrupted)
  with pytest.raises(KeyboardInterrupt):
    rehearse.rehearse(["jax==0.9.2"], baseline="base")
  assert list((Path(os.environ["NNX_POOL_CACHE"]) / "rehearse").iterdir()) == []


def test_rehearse_no_cache_leaves_nothing_behind(stand_in):
  report = rehearse.rehearse(["jax==0.9.2"], baseline="base", cache=False)
  assert report.exit_code == 1
  assert "; a throwaway environment, built in " in report.notes[-1]
  assert not (Path(os.environ["NNX_POOL_CACHE"]) / "rehearse").exists()
  assert not Path(_StandInBuilder.created[0]).exists()


def test_rehearse_pytest_runs_comparing_only_and_folds_its_status(stand_in):
  stand_in.write("check_rc", "0")
  stand_in.write("report.json", json.dumps(_check_report(0)))
  stand_in.write("pytest_rc", "1")
  report = rehearse.rehearse(["jax==0.9.2"], baseline="base", pytest_paths=["tests/x.py"])
  assert report.exit_code == 1
  assert report.notes[-1] == ("rehearsal: pytest tests/x.py exited 1 (tests failed), "
                              "comparing only")
  log = stand_in.log()
  assert log[-2] == "-P -m pytest -p no:cacheprovider tests/x.py"
  assert log[-1] == "check-only=1"
  stand_in.write("pytest_rc", "5")
  assert rehearse.rehearse(["jax==0.9.2"], baseline="base",
                           pytest_paths=["tests/x.py"]).exit_code == 2


def test_rehearse_check_without_a_report_exits_2(stand_in, capsys):
  stand_in.write("report.json", "not json")
  stand_in.write("check_rc", "2")
  assert cli.main(["rehearse", "jax==0.9.2"]) == 2
  assert capsys.readouterr().err == (
      "error: rehearse: check in the rehearsal environment exited 2 without a readable report; "
      "its messages above say why.\n")


def test_rehearse_cli_prints_the_report_and_its_json(stand_in, capsys, tmp_path):
  out_json = tmp_path / "r.json"
  assert cli.main(["rehearse", "jax==0.9.2", "--json", str(out_json)]) == 1
  out = capsys.readouterr().out
  assert "environment changes" in out and f"  {REHEARSED_JAX}\n" in out
  assert "2 cases: 1 fail, 1 pass" in out
  data = json.loads(out_json.read_text())
  assert data["exit_code"] == 1
  assert REHEARSED_JAX in data["stamp_changes"]


def test_rehearse_malformed_requirement_exits_2_before_building(stand_in, capsys):
  assert cli.main(["rehearse", "jax 0.9.2"]) == 2
  assert capsys.readouterr().err.startswith("error: rehearse: 'jax 0.9.2' is not a requirement")
  assert _StandInBuilder.created == []


# ---------------------------------------------------------- the real rehearsal

# The registry's jax 0.9.2 and jaxlib 0.9.2; flax 0.12.8 needs jax>=0.10.0, and 0.12.6 is
# the newest flax that installs with jax 0.9.2 (pip's resolver, 2026-12).
REAL = ("jax==0.9.2", "jaxlib==0.9.2", "flax==0.12.6")


@pytest.mark.rehearsal
@pytest.mark.timeout(1500)
def test_rehearse_jax_0_9_2_against_the_shipped_baseline(tmp_path):
  out = tmp_path / "rehearsal.json"
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.setdefault("NNX_POOL_CACHE", str(tmp_path / "cache"))  # a fresh build unless told
  done = subprocess.run(
      [sys.executable, "-m", "nnx_pool.regression", "rehearse", *REAL, "--json", str(out)],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500, check=False)
  assert done.returncode in (0, 1), done.stderr
  data = json.loads(out.read_text())
  manifest = json.loads((SHIPPED / "manifest.json").read_text())
  recorded = manifest["stamp"]["versions"]
  assert data["stamp"]["versions"]["jax"] == "0.9.2"
  assert data["stamp"]["versions"]["flax"] == "0.12.6"
  for name, version in (("jax", "0.9.2"), ("jaxlib", "0.9.2"), ("flax", "0.12.6")):
    if recorded[name] != version:
      assert f"{name} {recorded[name]} -> {version} (rehearsal)" in data["stamp_changes"]
      assert f"  {name} {recorded[name]} -> {version} (rehearsal)\n" in done.stdout
  failing = [r for r in data["rows"] if r["status"] in ("FAIL", "ERROR", "NEW", "GONE", "STALE")]
  assert done.returncode == (1 if failing else 0), failing
  assert data["exit_code"] == done.returncode
  assert f"{len(data['rows'])} cases: " in done.stdout
