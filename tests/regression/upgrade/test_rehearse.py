"""Tests for ``rehearse``: the plan, the cache, pip's failures, and a run through a stand-in venv.

The fast tests never install anything: where a rehearsal runs end to end, ``venv`` is
replaced by a stand-in whose ``bin/python`` is a shell script that logs its arguments
and plays pip, ``check`` or pytest from files the test writes. The user's tests are run
for real once, in a tiny virtual environment that borrows this one's packages (no
install). The one test marked ``rehearsal`` installs real wheels from the registry
(jax 0.9.2); ``make test`` leaves it out and ``make test-rehearsal`` runs it.
"""

import dataclasses
import importlib.metadata
import json
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import tomllib
import venv
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as Pep508

import nnx_pool
from nnx_pool.regression import cli
from nnx_pool.regression.stamp import SHIPPED, installed_versions
from nnx_pool.regression.store import lock
from nnx_pool.regression.upgrade import (
  pip_messages,
  rehearse,
  rehearse_cache,
  rehearse_env,
  rehearse_plan,
  rehearse_pytest,
  rehearse_source,
)
from nnx_pool.regression.upgrade.rehearse_plan import RehearsalError, Requirement, make_plan

ROOT = Path(__file__).resolve().parents[3]
# The stand-in runs report jax 0.9.2; the change they show starts from the jax installed
# here (0.10.2 in the main CI job, 0.7.0 in the floor job).
REHEARSED_JAX = f"jax {importlib.metadata.version('jax')} -> 0.9.2 (rehearsal)"
PINS = {"flax": "0.12.8", "jax": "0.10.2", "jaxlib": "0.10.2", "numpy": "2.4.6",
        "optax": "0.2.8", "pytest": "9.2.0"}
# What those packages require (their Requires-Dist, flax 0.12.8's and optax 0.2.8's cut short).
DEPENDS = {
    "flax": ("numpy>=1.23.2", "jax>=0.10.0", "optax", 'pytest; extra == "testing"'),
    "optax": ("absl-py>=0.7.1", "chex>=0.1.87", "jax>=0.5.3", "jaxlib>=0.5.3", "numpy>=1.18.0"),
    "chex": ("jax>=0.7.0", "numpy>=1.24.1"),
    "numpy": (),
    "jax": ("jaxlib<=0.10.2,>=0.10.2", "ml_dtypes>=0.5.0", "numpy>=2.0"),
    "pytest": ("pluggy<2,>=1.5", 'pygments>=2.7.2; extra == "dev"'),
    "sybil": ('pytest>=8; extra == "pytest"',),
}

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
  args = cli.make_parser().parse_args([
      "rehearse", "jax==0.9.2", "flax>=0.12", "--baseline", "base", "--json", "r.json",
      "--no-cache", "-k", "avg_", "--dry-run", "--resolve", "--pytest", "tests/a.py",
      "tests/b.py"])
  assert args.command == "rehearse"
  assert args.requirements == ["jax==0.9.2", "flax>=0.12"]
  assert (args.baseline, args.json, args.pattern) == ("base", "r.json", "avg_")
  assert (args.cache, args.dry_run, args.html, args.resolve) == (False, True, None, True)
  assert args.pytest == ["tests/a.py", "tests/b.py"]
  defaults = cli.make_parser().parse_args(["rehearse", "jax==0.9.2"])
  assert (defaults.baseline, defaults.cache, defaults.pytest) == (str(SHIPPED), True, None)
  assert defaults.batch is True
  assert (defaults.resolve, defaults.clear_cache) == (False, False)


def test_rehearse_needs_a_requirement_or_clear_cache(capsys):
  assert cli.main(["rehearse"]) == 2
  assert capsys.readouterr().err == (
      "error: rehearse: name at least one requirement, e.g. jax==0.9.2 (or pass --clear-cache "
      "alone).\n")


def test_rehearse_clear_cache_runs_alone(capsys):
  assert cli.main(["rehearse", "--clear-cache", "jax==0.9.2", "--resolve"]) == 2
  assert capsys.readouterr().err == (
      "error: rehearse --clear-cache takes no REQ, --resolve; run it alone.\n")


# ------------------------------------------------------------------ the plan


@pytest.mark.parametrize(("text", "pip_reads", "name", "versioned", "exact"), [
    ("jax==0.9.2", "jax==0.9.2", "jax", True, "0.9.2"),
    (" jax == 0.9.2 ", "jax==0.9.2", "jax", True, "0.9.2"),
    ("jax[cuda12]==0.9.2", "jax[cuda12]==0.9.2", "jax", True, "0.9.2"),
    ("jax==0.9.2+cpu", "jax==0.9.2+cpu", "jax", True, "0.9.2+cpu"),
    ("flax>=0.12,<0.13", "flax<0.13,>=0.12", "flax", True, None),
    ("jax==0.9.*", "jax==0.9.*", "jax", True, None),
    ("ML_Dtypes~=0.5", "ML_Dtypes~=0.5", "ml-dtypes", True, None),
    ("optax", "optax", "optax", False, None),
    ("jax (==0.9.2)", "jax==0.9.2", "jax", True, "0.9.2"),
    ("jax==0.9.2; python_version >= '3.11'", 'jax==0.9.2; python_version >= "3.11"', "jax",
     True, "0.9.2"),
    ("mylib @ https://example.org/mylib-1.0-py3-none-any.whl",
     "mylib @ https://example.org/mylib-1.0-py3-none-any.whl", "mylib", True, None),
])
def test_requirement_parse_names_and_versions(text, pip_reads, name, versioned, exact):
  req = Requirement.parse(text)
  assert (req.name, req.versioned, req.exact) == (name, versioned, exact)
  # packaging 24 writes `mylib@ URL`, 26 `mylib @ URL`; PEP 508 and pip read both.
  assert req.text.replace(" @ ", "@ ") == pip_reads.replace(" @ ", "@ ")


# Each was accepted before (issue 21, item 3), the text written to pip's requirements file
# as it was, where pip honours an option after a requirement. The reason in parentheses is
# the first line of packaging's own (its wording differs between releases).
@pytest.mark.parametrize("text", [
    "", "  ", "--index-url=https://x", "jax 0.9.2", "jax==1\nflax",
    "jax==0.9.2 --config-settings=x=y", "jax ==0.9.2 optax", "jax==0.9.2; --hash=sha256:0",
])
def test_requirement_parse_refuses_what_is_no_pep508_requirement(text):
  with pytest.raises(InvalidRequirement) as packaging_says:
    Pep508(text)
  reason = str(packaging_says.value).splitlines()[0]
  with pytest.raises(RehearsalError) as error:
    Requirement.parse(text)
  assert str(error.value) == (
      f"rehearse: {text!r} is not a requirement ({reason}); give one PEP 508 requirement per "
      "argument, a name, optional [extras], then a version specifier, e.g. jax==0.9.2 or "
      "'flax>=0.12', and no pip options.")


def test_requirement_parse_asks_a_path_or_url_for_its_name(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  wheel = "./wheels/jax-0.9.2-py3-none-any.whl"
  with pytest.raises(RehearsalError) as error:
    Requirement.parse(wheel)
  uri = "file://" + (tmp_path / "wheels" / "jax-0.9.2-py3-none-any.whl").as_posix()
  assert str(error.value) == (
      f"rehearse: {wheel!r} is a path or URL without a name; name the package it installs, as "
      f"PEP 508 writes it: 'NAME @ {uri}'.")
  with pytest.raises(RehearsalError, match=r"'NAME @ https://example\.org/x-1\.0\.tar\.gz'\.$"):
    Requirement.parse("https://example.org/x-1.0.tar.gz")


def test_requirement_parse_refuses_a_marker_false_here():
  with pytest.raises(RehearsalError) as error:
    Requirement.parse("jax==0.9.2; python_version < '3'")
  assert str(error.value) == (
      "rehearse: \"jax==0.9.2; python_version < '3'\" does not apply to this interpreter (its "
      "marker 'python_version < \"3\"' is false here); leave the marker out.")


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
  assert rehearse_plan.installed_pins(dists) == {"jax": "0.10.2", "ml-dtypes": "0.7.0"}


def test_installed_pins_of_this_environment_hold_jax_and_not_nnx_pool():
  pins = rehearse_plan.installed_pins()
  assert pins["jax"] == installed_versions()["jax"]
  assert "nnx-pool" not in pins
  assert list(pins) == sorted(pins)


def test_this_environment_is_read_again_once_a_folder_on_the_path_changes(tmp_path, monkeypatch):
  # Read once per state of sys.path (every bisect and rehearse step asks): a distribution
  # installed into a folder on it, or a folder added to it, is seen at the next call.
  site = tmp_path / "site"
  site.mkdir()
  monkeypatch.syspath_prepend(str(site))
  reads = []
  read = rehearse_plan.first_copies
  monkeypatch.setattr(rehearse_plan, "first_copies", lambda dists: reads.append(1) or read(dists))
  before = rehearse_plan.installed_pins()
  assert "stand-in-lib" not in before
  assert rehearse_plan.installed_pins() == before and rehearse_plan.installed_depends()
  assert len(reads) == 1
  _dist_info(site, "stand-in-lib", "1.0")
  os.utime(site, ns=(0, 0))  # a distinct time, whatever the file system's resolution
  assert rehearse_plan.installed_pins()["stand-in-lib"] == "1.0"
  other = tmp_path / "other"
  other.mkdir()
  _dist_info(other, "another-lib", "2.0")
  monkeypatch.syspath_prepend(str(other))
  assert rehearse_plan.installed_pins()["another-lib"] == "2.0"
  assert rehearse_plan.installed_depends()["another-lib"] == ()
  assert len(reads) == 3


def test_this_source_of_a_checkout_is_copied_never_built_in_place(tmp_path):
  source = rehearse_source.this_source()
  assert source.root == ROOT and any(r.startswith("jax>=") for r in source.requires)
  snapshot = source.snapshot(["report"], tmp_path)
  assert snapshot.requirement == f"nnx-pool[report] @ {(tmp_path / 'nnx-pool-source').as_uri()}"
  copied = {p.relative_to(tmp_path / "nnx-pool-source") for p in
            (tmp_path / "nnx-pool-source").rglob("*") if p.is_file()}
  assert {Path("pyproject.toml"), Path("nnx_pool/__init__.py"),
          Path("regression/baseline/manifest.json")} <= copied
  assert not any("__pycache__" in p.parts for p in copied)
  assert (tmp_path / "nnx-pool-source" / "nnx_pool" / "__init__.py").read_bytes() == (
      ROOT / "nnx_pool" / "__init__.py").read_bytes()
  assert snapshot.digest == source.digest() == rehearse_source.this_source().digest()
  # Everything pyproject.toml's build reads: itself, the readme, each package's directory
  # (setuptools' package-dir of the package or of its longest mapped parent, else the
  # package's own path), every module in them.
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())
  setuptools = project["tool"]["setuptools"]
  mapped = setuptools.get("package-dir", {})

  def folder_of(package: str) -> str:
    parts = package.split(".")
    for i in range(len(parts), 0, -1):
      if ".".join(parts[:i]) in mapped:
        return "/".join([mapped[".".join(parts[:i])], *parts[i:]])
    return "/".join(parts)

  folders = [folder_of(p) for p in setuptools["packages"]]
  assert {Path("pyproject.toml"), Path(project["project"]["readme"])} <= copied
  for folder in folders:
    modules = {p.relative_to(ROOT) for p in (ROOT / folder).glob("*.py")}
    assert modules and modules <= copied, folder


def test_subprocess_env_leaves_out_what_would_reach_this_interpreter(monkeypatch, tmp_path):
  # Each would send an import or an install of the rehearsal's to this environment's paths.
  leaks = ("PYTHONPATH", "PYTHONHOME", "PIP_USER", "PIP_TARGET", "PIP_PREFIX", "PIP_ROOT")
  elsewhere = str(tmp_path / "elsewhere")
  for name in leaks:
    monkeypatch.setenv(name, elsewhere)
  monkeypatch.setenv("PATH", elsewhere)
  monkeypatch.setenv("NNX_POOL_KEPT", "yes")  # anything else passes through
  monkeypatch.delenv("PYTHONNOUSERSITE", raising=False)
  env = tmp_path / "env"
  environ = rehearse_env.subprocess_env(env)
  assert not set(leaks) & set(environ)
  assert environ["PATH"] == f"{env / 'bin'}{os.pathsep}{elsewhere}"  # its python comes first
  assert (environ["VIRTUAL_ENV"], environ["PYTHONNOUSERSITE"], environ["NNX_POOL_KEPT"]) == (
      str(env), "1", "yes")


@pytest.mark.parametrize(("direct_url", "expected"), [
    ({"url": "file:///w/nnx_pool-0.1.0-py3-none-any.whl", "archive_info": {}},
     "nnx-pool[report] @ file:///w/nnx_pool-0.1.0-py3-none-any.whl"),
    (None, "nnx-pool[report]==0.1.0"),
])
def test_this_source_of_an_installed_wheel_is_where_pip_got_it(
    monkeypatch, tmp_path, direct_url, expected):
  _dist_info(tmp_path, "nnx-pool", "0.1.0", direct_url)
  (dist,) = importlib.metadata.distributions(path=[str(tmp_path)])
  monkeypatch.setattr(rehearse_source, "source_checkout", lambda: None)
  monkeypatch.setattr(importlib.metadata, "distribution", lambda name: dist)
  source = rehearse_source.this_source()
  assert source.root is None
  assert source.snapshot(["report"], tmp_path).requirement == expected
  assert source.snapshot([], tmp_path).requirement == expected.replace("[report]", "")


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
  # A local version and extras: the partner takes the version as written, without the extras.
  assert make_plan(["jax[cuda12]==0.9.2+cpu"], pins=PINS).requirements == (
      "jax[cuda12]==0.9.2+cpu", "jaxlib==0.9.2+cpu")
  # What pip reads is the parsed requirement, whatever the spacing given.
  assert make_plan([" jax == 0.9.2 "], pins=PINS).requirements == ("jax==0.9.2", "jaxlib==0.9.2")


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


def test_plan_key_is_the_requirement_set_not_this_environments_pins():
  key = make_plan(["jax==0.9.2", "flax==0.12.6"], pins=PINS).key()
  assert len(key) == 16 and int(key, 16) >= 0
  assert make_plan(["flax==0.12.6", "jax==0.9.2"], pins=PINS).key() == key
  assert make_plan([" jax == 0.9.2", "flax==0.12.6"], pins=PINS).key() == key
  # Anything installed or upgraded here keeps the key (issue 21, item 10: it was part of it).
  assert make_plan(["jax==0.9.2", "flax==0.12.6"], pins={**PINS, "numpy": "2.4.5"}).key() == key
  assert make_plan(["jax==0.9.2", "flax==0.12.6"], pins={**PINS, "rich": "14.0.0"}).key() == key
  assert make_plan(["jax==0.9.2", "flax==0.12.6"], pins=PINS, requires=["jax>=0.8"]).key() == key
  others = [
      make_plan(["jax==0.9.2", "flax==0.12.5"], pins=PINS),
      make_plan(["jax==0.9.2", "flax==0.12.6"], pins=PINS, html=True),
      make_plan(["jax==0.9.2", "flax==0.12.6"], pins=PINS, pytest=True),
      make_plan(["jax==0.9.2", "flax==0.12.6"], pins=PINS, resolve=True, depends=DEPENDS),
  ]
  assert len({key, *(p.key() for p in others)}) == 1 + len(others)


def test_make_plan_resolve_bounds_every_dependent_of_a_released_package_by_its_version_here():
  pins = {**PINS, "chex": "0.1.92", "sybil": "10.1.0"}
  plan = make_plan(["jax==0.9.2"], pins=pins, resolve=True, depends=DEPENDS)
  # flax, chex and optax require jax (optax through chex too); numpy and pytest do not, and
  # sybil needs pytest only with its extra.
  assert plan.resolved == ("chex", "flax", "optax")
  assert plan.constraints == ("chex<=0.1.92", "flax<=0.12.8", "numpy==2.4.6", "optax<=0.2.8",
                              "pytest==9.2.0", "sybil==10.1.0")
  assert plan.requirements == ("jax==0.9.2", "jaxlib==0.9.2")
  without = make_plan(["jax==0.9.2"], pins=pins, depends=DEPENDS)
  assert without.resolved == () and "flax==0.12.8" in without.constraints


def test_cache_keep_count_reads_its_variable(monkeypatch):
  monkeypatch.delenv("NNX_POOL_REHEARSE_KEEP", raising=False)
  assert rehearse_cache.keep_count() == 3
  monkeypatch.setenv("NNX_POOL_REHEARSE_KEEP", "5")
  assert rehearse_cache.keep_count() == 5
  for bad in ("0", "-1", "two"):
    monkeypatch.setenv("NNX_POOL_REHEARSE_KEEP", bad)
    with pytest.raises(RehearsalError) as error:
      rehearse_cache.keep_count()
    assert str(error.value) == (
        "rehearse: NNX_POOL_REHEARSE_KEEP must be how many rehearsal environments to keep, a "
        f"whole number of 1 or more; got {bad!r}. Unset it to keep 3.")


def _entry(root: Path, name: str, used: float) -> Path:
  entry = root / name
  (entry / "env" / "bin").mkdir(parents=True)
  (entry / "env" / "pyvenv.cfg").write_text("home = nowhere\n")
  (entry / "last-used").write_text("")
  os.utime(entry / "last-used", (used, used))
  return entry


def test_prune_keeps_the_most_recently_used_and_any_in_use(tmp_path):
  now = time.time()
  names = [f"{n:016x}" for n in range(5)]  # entry n was last used n hours ago
  for n, name in enumerate(names):
    _entry(tmp_path, name, now - 3600 * n)
  (tmp_path / "not-a-key").mkdir()  # never ours to remove
  with lock.exclusive(tmp_path / names[4]):  # in use by another rehearsal
    assert rehearse_cache.prune(tmp_path, 2, current=names[3]) == [names[1], names[2]]
  assert sorted(p.name for p in tmp_path.iterdir()) == [names[0], names[3], names[4], "not-a-key"]
  assert rehearse_cache.prune(tmp_path, 2) == [names[4]]


def test_clear_cache_removes_every_environment_not_in_use(tmp_path):
  for n in range(3):
    _entry(tmp_path, f"{n:016x}", time.time())
  (tmp_path / f"{0:016x}" / "env" / "big").write_bytes(b"x" * 5000)
  (tmp_path / ".tmp-0123456789abcdef-x").mkdir()  # a build an older layout left
  with lock.exclusive(tmp_path / f"{2:016x}"):
    cleared = rehearse_cache.clear_cache(tmp_path)
  assert sorted(cleared.removed) == [f"{0:016x}", f"{1:016x}"]
  assert cleared.busy == [f"{2:016x}"]
  assert 5000 <= cleared.freed < 5100  # the file of 5000 bytes and three short ones
  assert [p.name for p in tmp_path.iterdir()] == [f"{2:016x}"]
  assert rehearse_cache.clear_cache(tmp_path / "nowhere").removed == []


def test_cache_root_follows_nnx_pool_cache_then_xdg_then_home(monkeypatch, tmp_path):
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
  monkeypatch.delenv("NNX_POOL_CACHE", raising=False)
  assert rehearse_cache.cache_root() == tmp_path / "home" / ".cache" / "nnx-pool" / "rehearse"
  assert rehearse_cache.shown(rehearse_cache.cache_root()) == "~/.cache/nnx-pool/rehearse"
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert rehearse_cache.cache_root() == tmp_path / "xdg" / "nnx-pool" / "rehearse"
  monkeypatch.setenv("NNX_POOL_CACHE", str(tmp_path / "mine"))
  assert rehearse_cache.cache_root() == tmp_path / "mine" / "rehearse"


# ------------------------------------------------------------------ reporting


def test_pip_failure_names_the_requirement_without_a_distribution():
  assert pip_messages.pip_failure(PIP_NO_MATCH, ["jax==0.0.1", "flax==0.12.6"], PINS) == (
      "rehearse: pip could not install jax==0.0.1: "
      "No matching distribution found for jax==0.0.1")


def test_pip_failure_names_the_pin_in_the_way_of_a_conflict_and_suggests_resolve():
  assert pip_messages.pip_failure(PIP_CONFLICT, ["jax==0.9.2"], {**PINS, "chex": "0.1.92"}) == (
      "rehearse: pip could not install jax==0.9.2: flax 0.12.8 depends on jax>=0.10.0 "
      "(flax 0.12.8 is this environment's version; name a flax version too, or pass --resolve "
      "to let pip choose one)")
  # With --resolve given already, naming a version is what is left.
  assert pip_messages.pip_failure(PIP_CONFLICT, ["jax==0.9.2"], PINS, resolve=True) == (
      "rehearse: pip could not install jax==0.9.2: flax 0.12.8 depends on jax>=0.10.0 "
      "(flax 0.12.8 is this environment's version; name a flax version too)")


# Dependents whose specifiers admit jax 0.9.2 only by PEP 440 rules the home-made subset did
# not read (~=, a wildcard, a pre-release bound): it listed each as part of the conflict.
@pytest.mark.parametrize("spec", ["~=0.9", "==0.9.*", ">=0.9.2rc1", "<0.10,!=0.9.1"])
def test_pip_failure_leaves_out_dependents_that_admit_the_requested_version(spec):
  output = PIP_CONFLICT.replace("    chex 0.1.92 depends on jax>=0.7.0\n",
                                f"    chex 0.1.92 depends on jax{spec}\n")
  assert pip_messages.pip_failure(output, ["jax==0.9.2"], PINS) == (
      "rehearse: pip could not install jax==0.9.2: flax 0.12.8 depends on jax>=0.10.0 "
      "(flax 0.12.8 is this environment's version; name a flax version too, or pass --resolve "
      "to let pip choose one)")


def test_resolved_notes_name_each_version_chosen_and_the_requirement_that_ruled_out_ours():
  pins = {**PINS, "chex": "0.1.92"}
  plan = make_plan(["jax==0.9.2"], pins=pins, resolve=True, depends=DEPENDS)
  there = {"flax": "0.12.6", "optax": "0.2.8", "chex": "0.1.92", "jax": "0.9.2",
           "jaxlib": "0.9.2", "numpy": "2.4.6"}
  assert rehearse.resolved_notes(plan, there, pins, DEPENDS) == [
      "rehearsal: --resolve chose flax 0.12.6 (flax 0.12.8, this environment's, requires "
      "jax>=0.10.0, which excludes jax 0.9.2)"]
  # A version chosen for no requirement of ours that the rehearsal excludes.
  assert rehearse.resolved_notes(plan, {**there, "optax": "0.2.7"}, pins, DEPENDS)[1] == (
      "rehearsal: --resolve chose optax 0.2.7 (the newest optax no newer than this "
      "environment's 0.2.8 that pip could install with the requirements)")
  assert rehearse.resolved_notes(plan, {**there, "flax": "0.12.8"}, pins, DEPENDS) == [
      "rehearsal: --resolve kept every dependent at this environment's version"]
  assert rehearse.resolved_notes(make_plan(["jax==0.9.2"], pins=PINS), there, PINS, {}) == []


def test_stale_pins_name_each_installed_version_a_constraint_no_longer_admits():
  there = {"numpy": "2.4.5", "flax": "0.12.6", "jax": "0.9.2", "optax": "0.2.8"}
  constraints = ["numpy==2.4.6", "flax<=0.12.8", "optax<=0.2.7", "rich==14.0.0"]
  assert rehearse_env.stale_pins(there, constraints) == ["numpy 2.4.5 -> 2.4.6",
                                                     "optax 0.2.8 -> <=0.2.7"]


def test_pip_failure_of_a_pinned_constraint_and_of_an_unknown_error():
  output = ("ERROR: Cannot install jax==0.9.2 because these package versions have conflicting "
            "dependencies.\n\nThe conflict is caused by:\n    The user requested jax==0.9.2\n"
            "    jax 0.9.2 depends on numpy<2.4\n"
            "    The user requested (constraint) numpy==2.4.6\n\n")
  # numpy is a dependency of jax, not a dependent: --resolve would not release it.
  assert pip_messages.pip_failure(output, ["jax==0.9.2"], PINS) == (
      "rehearse: pip could not install jax==0.9.2: jax 0.9.2 depends on numpy<2.4; The user "
      "requested (constraint) numpy==2.4.6 (numpy 2.4.6 is this environment's version; name a "
      "numpy version too)")
  assert pip_messages.pip_failure("Some\nnetwork trouble\n\n", ["flax==0.12.6"], PINS) == (
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
  # The shipped baseline (a tree with changes) against this checkout: one line, as check's.
  old["git"], new["git"] = ({"revision": "fe60abbedbcb09", "dirty": True},
                            {"revision": "a0bd2bb08ff1aa", "dirty": False})
  assert rehearse.rehearsal_changes(old, new, here)[-1] == (
      "git revision fe60abbedbcb (with uncommitted changes) -> a0bd2bb08ff1")


@pytest.mark.parametrize(("check", "tested", "code"), [
    (0, None, 0), (1, None, 1), (2, None, 2), (0, 0, 0), (0, 1, 1), (1, 0, 1), (0, 5, 2),
    (0, 4, 2), (1, 2, 2), (2, 1, 2), (0, 99, 2),
])
def test_combined_exit_is_the_worse_of_check_and_pytest(check, tested, code):
  assert rehearse.combined_exit(check, tested) == code


# ------------------------------------------------- a run through a stand-in venv

FAKE_PYTHON = """#!/bin/sh
if [ "$1" = "-c" ]; then  # the user's tests (rehearse_pytest.PYTEST_MAIN)
  shift 2
  echo "pytest $* (in $(pwd))" >> "$FAKE/log"
  echo "check-only=$NNX_REGRESSION_CHECK_ONLY" >> "$FAKE/log"
  if [ -f "$FAKE/foreign" ]; then cp "$FAKE/foreign" "$NNX_POOL_REHEARSE_FOREIGN"; exit 4; fi
  [ -f "$FAKE/pytest_result.json" ] && cp "$FAKE/pytest_result.json" "$NNX_POOL_PYTEST_RESULT"
  exit "$(cat "$FAKE/pytest_rc")"
fi
echo "$*" >> "$FAKE/log"
if [ "$1" = "-m" ] && [ "$2" = "pip" ] && [ "$4" = "--dry-run" ]; then  # pip_choices
  while [ $# -gt 0 ]; do
    if [ "$1" = "--report" ] && [ -f "$FAKE/pip_report.json" ]; then
      cp "$FAKE/pip_report.json" "$2"
    fi
    shift
  done
  if [ -f "$FAKE/pip_report.json" ]; then exit 0; fi
  echo "ERROR: No matching distribution found for jax<0.10,>=0.9"; exit 1
fi
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  if [ -d "$FAKE/site" ]; then cp -R "$FAKE/site/." "$VIRTUAL_ENV/lib/python3/site-packages/"; fi
  cat "$FAKE/pip_output"; exit "$(cat "$FAKE/pip_rc")"
fi
if [ "$3" = "nnx_pool.regression" ]; then
  while [ $# -gt 0 ]; do
    if [ "$1" = "--json" ]; then cp "$FAKE/report.json" "$2"; fi
    if [ "$1" = "--pytest-result" ]; then cp "$2" "$FAKE/handed.json"; fi
    shift
  done
  exit "$(cat "$FAKE/check_rc")"
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
    (env / "lib" / "python3" / "site-packages").mkdir(parents=True)
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


def _check_json(code: int = 1) -> str:
  """What `check --json` writes in the rehearsal environment (jax 0.9.2 there), as text.

  The shape is that of a real report (`check -k '*_k2_one' --json` against the shipped
  baseline, cut to two rows and one array each); with ``code`` 1, avg_k2_one fails where
  the baseline held 0 (a relative error of inf, which JSON holds as the string "inf").
  """
  here = installed_versions()
  fail = code == 1
  tolerance = {"rule": "allclose", "rtol": 1e-06, "atol": 1e-06, "reason": "window forward"}
  return json.dumps({
      "command": "check", "exit_code": code, "error": None, "baseline": "/elsewhere/baseline",
      "other": None, "dry_run": False, "counts": {"FAIL": 1, "PASS": 1} if fail else {"PASS": 2},
      "rows": [
          {"case": "max_k2_one", "status": "PASS", "max_abs": 0.0, "max_rel": 0.0,
           "tolerance": "exact", "details": [],
           "arrays": {"output": {"passed": True, "max_abs": 0.0, "max_rel": 0.0,
                                 "mismatches": 0, "size": 18, "message": "",
                                 "tolerance": {"rule": "exact", "rtol": 0.0, "atol": 0.0,
                                               "reason": "exact"}}}},
          {"case": "avg_k2_one", "status": "FAIL" if fail else "PASS",
           "max_abs": 2e-05 if fail else 0.0, "max_rel": "inf" if fail else 0.0,
           "tolerance": "rtol=1e-06 atol=1e-06",
           "details": ["output: 1 of 18 elements differ (first at (0, 1, 2, 1): 2e-05 vs "
                       "baseline 0)"] if fail else [],
           "arrays": {"output": {"passed": not fail, "max_abs": 2e-05 if fail else 0.0,
                                 "max_rel": "inf" if fail else 0.0, "mismatches": int(fail),
                                 "size": 18, "message": "", "tolerance": tolerance}}},
      ],
      "stamp_changes": [], "recorded": "2026-12-03T06:48:44+00:00 at git 041c3ae55664",
      "timings": [{"case": "max_k2_one", "compile_before": 0.0627, "compile_now": 0.0430,
                   "steady_before": 1.49e-05, "steady_now": 7.94e-06, "changed": []}],
      "notes": [],
      "stamp": {"versions": {**here, "jax": "0.9.2"}, "backend": {"platform": "cpu"},
                "git": {"revision": None, "dirty": None}},
      "baseline_stamp": {"versions": here, "backend": {"platform": "cpu"}, "git": {}},
  })


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
  (fake / "report.json").write_text(_check_json())
  monkeypatch.setenv("FAKE", str(fake))
  monkeypatch.setenv("NNX_POOL_CACHE", str(tmp_path / "cache"))
  monkeypatch.setattr(rehearse_env.venv, "EnvBuilder", _StandInBuilder)
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


def _cache() -> Path:
  return Path(os.environ["NNX_POOL_CACHE"]) / "rehearse"


def _steps(progress: _Progress) -> list[str]:
  return [c[2] for c in progress.calls if c != "clear"]


def _error(err: str) -> str:
  """The one error line at the end of stderr, after the steps' lines (and nothing else)."""
  *steps, last = err.splitlines()
  assert err.endswith("\n") and all(line.startswith("rehearse: ") for line in steps), err
  return last


def test_rehearse_an_unsatisfiable_requirement_exits_2_with_one_line(stand_in, capsys):
  stand_in.write("pip_output", PIP_NO_MATCH)
  stand_in.write("pip_rc", "1")
  assert cli.main(["rehearse", "jax==0.0.1"]) == 2
  out, err = capsys.readouterr()
  assert out == ""
  assert _error(err) == ("error: rehearse: pip could not install jax==0.0.1: "
                         "No matching distribution found for jax==0.0.1")
  assert list(_cache().iterdir()) == []  # the half-built environment is gone, nothing cached
  pip_calls = [a for a in stand_in.started if a[1:3] == ["-m", "pip"]]
  assert len(pip_calls) == 1 and pip_calls[0][3] == "install"


def test_rehearse_runs_check_there_and_reports_the_change_as_the_rehearsals(stand_in):
  stand_in.write("pip_output", "WARNING: Location ignored\nCollecting jax==0.9.2\n")
  progress = _Progress()
  report = rehearse.rehearse(["jax==0.9.2"], baseline="base", progress=progress)
  assert report.exit_code == 1 and report.error is None
  # The child's stamps differ in jax only: the one change, marked as the rehearsal's.
  assert report.stamp_changes == [REHEARSED_JAX]
  assert report.baseline == "base"
  # Its rows, as its JSON text holds them ("inf" read back as a float).
  assert [(r.case, r.status, r.max_abs, r.max_rel, r.tolerance, r.details)
          for r in report.rows] == [
      ("max_k2_one", "PASS", 0.0, 0.0, "exact", []),
      ("avg_k2_one", "FAIL", 2e-05, math.inf, "rtol=1e-06 atol=1e-06",
       ["output: 1 of 18 elements differ (first at (0, 1, 2, 1): 2e-05 vs baseline 0)"]),
  ]
  assert report.stamp["git"]["revision"]  # this checkout's, which the environment holds
  assert report.notes[-1].startswith("rehearsal: check ran in a separate environment with "
                                     "jax==0.9.2, everything else at this environment's")
  assert [c[:2] for c in progress.calls if c != "clear"][0] == (1, 3)
  steps = _steps(progress)
  assert steps[0] == "creating a virtual environment (python -m venv)"
  assert steps[1:3] == ["installing jax==0.9.2 jaxlib==0.9.2 and nnx-pool (pip)",
                        "pip: Collecting jax==0.9.2"]  # pip's lines, warnings left out
  assert steps[-1] == "running check" and progress.calls[-1] == "clear"
  (entry,) = _cache().iterdir()
  env = entry / "env"
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


def test_rehearse_a_cached_environment_follows_a_pin_that_moved_here(stand_in):
  rehearse.rehearse(["jax==0.9.2"], baseline="base")
  (entry,) = _cache().iterdir()
  numpy = installed_versions()["numpy"]
  # The environment holds an older numpy than this one (as if numpy was upgraded here since).
  _dist_info(next((entry / "env" / "lib").glob("python*/site-packages")), "numpy", "1.0.0")
  again = _Progress()
  report = rehearse.rehearse(["jax==0.9.2"], baseline="base", progress=again)
  assert len(_StandInBuilder.created) == 1  # the same environment, not a new one
  assert _steps(again)[0] == f"updating numpy 1.0.0 -> {numpy} to this environment's versions (pip)"
  assert report.notes[-1].endswith(" s)") and "(updated in " in report.notes[-1]
  installs = [line for line in stand_in.log() if line.startswith("-m pip install -c ")]
  assert len(installs) == 2


def _site(stand_in: StandIn, **versions: str) -> None:
  """What the stand-in pip installs from now on: these distributions at these versions."""
  site = stand_in.dir / "site"
  shutil.rmtree(site, ignore_errors=True)
  site.mkdir()
  for name, version in versions.items():
    _dist_info(site, name, version)


def _how(report) -> str:
  """How the rehearsal got its environment: the end of its note, ``(reused)``, ``(built ...)``."""
  note = next(n for n in report.notes if n.startswith("rehearsal: ") and "; environment " in n)
  return note[note.index(" (") + 2:-1]


def test_rehearse_an_entry_without_its_manifest_is_rebuilt_and_never_run(stand_in):
  # Issue 29, finding 9: an entry was used whenever env/pyvenv.cfg existed, so one planted in
  # a shared NNX_POOL_CACHE had its bin/python run. Now the manifest, written last, decides.
  plan = make_plan(["jax==0.9.2"], pins=installed_pins_here())
  planted = _cache() / plan.key() / "env"
  (planted / "bin").mkdir(parents=True)
  (planted / "pyvenv.cfg").write_text("home = nowhere\n")
  (planted / "bin" / "python").write_text(f"#!/bin/sh\ntouch {stand_in.dir / 'ran'}\n")
  (planted / "bin" / "python").chmod(0o755)
  report = rehearse.rehearse(["jax==0.9.2"], baseline="base")
  assert not (stand_in.dir / "ran").exists()
  assert _how(report).startswith("built in ") and _how(report).endswith(
      " s (replacing a cached one without a valid manifest)")
  assert len(_StandInBuilder.created) == 1
  manifest = json.loads((_cache() / plan.key() / "manifest.json").read_text())
  assert manifest["key"] == plan.key() and manifest["requirements"].startswith("sha256:")
  assert _how(rehearse.rehearse(["jax==0.9.2"], baseline="base")) == "reused"
  # A build cut short leaves no manifest: the next run builds again, running nothing there.
  (_cache() / plan.key() / "manifest.json").unlink()
  assert _how(rehearse.rehearse(["jax==0.9.2"], baseline="base")).startswith("built in ")
  assert len(_StandInBuilder.created) == 2


def installed_pins_here() -> dict:
  return rehearse_plan.installed_pins()


@pytest.mark.parametrize("who", ["group", "other", "owner"])
def test_rehearse_refuses_a_cache_directory_others_can_write(stand_in, capsys, monkeypatch, who):
  root = _cache()
  root.mkdir(parents=True)
  if who == "owner":  # as if another user had made it first
    monkeypatch.setattr(rehearse_cache.os, "geteuid", lambda: os.stat(root).st_uid + 1)
  else:
    root.chmod(0o770 if who == "group" else 0o707)
  assert cli.main(["rehearse", "jax==0.9.2"]) == 2
  why = {"group": "may be written by its group (mode 0770): another user could put an "
                  f"environment there that rehearse would run; run `chmod go-w {root}`, or",
         "other": "may be written by every user (mode 0707): another user could put an "
                  f"environment there that rehearse would run; run `chmod go-w {root}`, or",
         "owner": f"is owned by user {os.stat(root).st_uid}, not you (user "
                  f"{os.stat(root).st_uid + 1}): another user could put an environment there "
                  "that rehearse would run;"}[who]
  assert capsys.readouterr().err == (f"error: rehearse: the cache directory {root} {why} set "
                                     "NNX_POOL_CACHE to a directory of your own.\n")
  assert _StandInBuilder.created == [] and all(a[0] == "git" for a in stand_in.started)


def test_rehearse_makes_its_cache_directories_private(stand_in, monkeypatch):
  monkeypatch.setattr(os, "umask", os.umask)  # restored after the test
  os.umask(0o002)  # a user-private-group umask: directories 0775 by default
  try:
    rehearse.rehearse(["jax==0.9.2"], baseline="base")
  finally:
    os.umask(0o022)
  (entry,) = _cache().iterdir()
  for directory in (_cache().parent, _cache(), entry):
    assert directory.stat().st_mode & 0o777 == 0o700, directory


def test_rehearse_a_file_url_requirement_is_rebuilt_when_its_files_change(stand_in, tmp_path):
  # The refusal message recommends `NAME @ file:///dir`; its text never changes, its files do.
  mylib = tmp_path / "mylib"
  (mylib / "mylib").mkdir(parents=True)
  (mylib / "mylib" / "__init__.py").write_text("X = 1\n")
  requirement = f"mylib @ {mylib.as_uri()}"
  first = rehearse.rehearse([requirement], baseline="base")
  assert _how(first).startswith("built in ")
  (mylib / "build").mkdir()  # what an in-tree build leaves is not the package
  (mylib / "build" / "x.py").write_text("")
  assert _how(rehearse.rehearse([requirement], baseline="base")) == "reused"
  (mylib / "mylib" / "__init__.py").write_text("X = 2\n")
  again = rehearse.rehearse([requirement], baseline="base")
  # Named as `packaging` writes it: "mylib @ file://..." (packaging 24.2: "mylib@ file://...").
  named = str(Pep508(requirement))
  assert _how(again).startswith("built in ") and _how(again).endswith(
      f" s ({named} changed since the cached one was built)")
  assert len(_StandInBuilder.created) == 2 and len(list(_cache().iterdir())) == 1


def test_rehearse_a_range_is_resolved_again_and_rebuilt_when_pip_chooses_another(stand_in):
  _site(stand_in, jax="0.9.2", jaxlib="0.9.2")
  first = rehearse.rehearse(["jax>=0.9,<0.10"], baseline="base")
  assert _how(first).startswith("built in ")
  (entry,) = _cache().iterdir()
  resolved = json.loads((entry / "manifest.json").read_text())["resolved"]
  assert resolved == {"files": {}, "versions": {"jax": "0.9.2", "jaxlib": "0.9.2"}}
  # What `pip install --dry-run --report` says it would install (pip 23.2's report, cut short).
  report = {"version": "1", "install": [
      {"metadata": {"name": "jax", "version": "0.9.2"}},
      {"metadata": {"name": "jaxlib", "version": "0.9.2"}}]}
  stand_in.write("pip_report.json", json.dumps(report))
  progress = _Progress()
  assert _how(rehearse.rehearse(["jax>=0.9,<0.10"], baseline="base", progress=progress)) == (
      "reused")
  assert _steps(progress)[0] == "resolving jax, jaxlib again (pip install --dry-run)"
  dry_run = [a for a in stand_in.started if "--dry-run" in a][-1]
  assert dry_run[3:8] == ["install", "--dry-run", "--ignore-installed", "--quiet", "--report"]
  report["install"][0]["metadata"]["version"] = "0.9.3"  # a release since
  report["install"][1]["metadata"]["version"] = "0.9.3"
  stand_in.write("pip_report.json", json.dumps(report))
  _site(stand_in, jax="0.9.3", jaxlib="0.9.3")
  again = rehearse.rehearse(["jax>=0.9,<0.10"], baseline="base")
  assert _how(again).endswith(" s (pip now chooses jax 0.9.2 -> 0.9.3, jaxlib 0.9.2 -> 0.9.3)")
  assert json.loads((entry / "manifest.json").read_text())["resolved"]["versions"] == {
      "jax": "0.9.3", "jaxlib": "0.9.3"}
  # Offline: pip cannot resolve again; the environment is used as built, and says so.
  (stand_in.dir / "pip_report.json").unlink()
  offline = rehearse.rehearse(["jax>=0.9,<0.10"], baseline="base")
  assert _how(offline) == (
      "reused; pip could not resolve jax, jaxlib again (pip could not install jax<0.10,>=0.9: "
      "No matching distribution found for jax<0.10,>=0.9); kept the versions chosen when it "
      "was built")


def test_rehearse_a_cached_environment_whose_pip_is_older_says_reused(stand_in):
  # Issue 29: the venv's own pip (ensurepip's) is older than this environment's, which the
  # constraints pin; nothing installs pip, so every rerun "updated" it, in vain, for 5 s.
  _site(stand_in, pip="1.0")
  rehearse.rehearse(["jax==0.9.2"], baseline="base")
  progress = _Progress()
  report = rehearse.rehearse(["jax==0.9.2"], baseline="base", progress=progress)
  assert _how(report) == "reused"
  assert _steps(progress) == ["running check"]
  assert sum(line.startswith("-m pip install -c ") for line in stand_in.log()) == 1


def test_rehearse_stamps_the_nnx_pool_it_copied_not_one_edited_during_the_install(
    stand_in, monkeypatch, tmp_path):
  checkout = tmp_path / "checkout"
  for name in ("pyproject.toml", "README.md", "nnx_pool/__init__.py", "regression/cli.py"):
    (checkout / name).parent.mkdir(parents=True, exist_ok=True)
    (checkout / name).write_text(f"# {name}, before\n")
  source = rehearse_source.Source(checkout, None, None, ("jax>=0.7.0",))
  monkeypatch.setattr(rehearse, "this_source", lambda: source)
  real_pip = rehearse_env.run_pip

  def edited_during_the_install(env, args, **options):
    (checkout / "nnx_pool" / "__init__.py").write_text("# edited while pip ran\n")
    return real_pip(env, args, **options)

  monkeypatch.setattr(rehearse_env, "run_pip", edited_during_the_install)
  rehearse.rehearse(["jax==0.9.2"], baseline="base")
  monkeypatch.setattr(rehearse_env, "run_pip", real_pip)
  again = _Progress()
  rehearse.rehearse(["jax==0.9.2"], baseline="base", progress=again)
  # The edit came after the copy that was installed: the environment must take it now.
  assert _steps(again)[0] == ("reinstalling nnx-pool, changed since the environment was built "
                              "(pip --no-deps)")
  assert stand_in.log()[-2].startswith("-m pip install --no-deps --force-reinstall nnx-pool @ ")


def test_rehearse_keeps_the_most_recently_used_environments(stand_in, monkeypatch):
  monkeypatch.setenv("NNX_POOL_REHEARSE_KEEP", "2")
  keys = []
  for flax in ("0.12.4", "0.12.5", "0.12.6"):
    report = rehearse.rehearse(["jax==0.9.2", f"flax=={flax}"], baseline="base")
    keys.append(make_plan(["jax==0.9.2", f"flax=={flax}"], pins=PINS).key())
  assert sorted(p.name for p in _cache().iterdir()) == sorted(keys[1:])
  assert report.notes[-1] == ("rehearsal: removed 1 cached environment(s) used least recently, "
                              "keeping 2 (NNX_POOL_REHEARSE_KEEP changes it)")


def test_rehearse_clear_cache_empties_the_cache(stand_in, capsys):
  rehearse.rehearse(["jax==0.9.2"], baseline="base")
  capsys.readouterr()
  assert cli.main(["rehearse", "--clear-cache"]) == 0
  out = capsys.readouterr().out
  assert out.startswith(f"removed 1 rehearsal environment(s) from {_cache()}, ")
  assert out.endswith(" MB\n")
  assert list(_cache().iterdir()) == []
  assert cli.main(["rehearse", "--clear-cache"]) == 0
  assert capsys.readouterr().out == f"no rehearsal environment to remove in {_cache()}\n"


def test_rehearse_a_bad_keep_count_exits_2_before_building(stand_in, capsys, monkeypatch):
  monkeypatch.setenv("NNX_POOL_REHEARSE_KEEP", "none")
  assert cli.main(["rehearse", "jax==0.9.2"]) == 2
  assert capsys.readouterr().err.startswith(
      "error: rehearse: NNX_POOL_REHEARSE_KEEP must be how many rehearsal environments to keep")
  assert _StandInBuilder.created == []


def test_rehearse_a_second_rehearsal_waits_for_the_environment_in_use(stand_in):
  plan = make_plan(["jax==0.9.2"], pins=PINS)
  entry = _cache() / plan.key()
  entry.mkdir(parents=True)
  held = lock.exclusive(entry)  # another rehearsal's, which ends once this one waits

  class Releasing(_Progress):
    def __call__(self, n, total, what):
      super().__call__(n, total, what)
      if what.startswith("waiting"):
        threading.Timer(0.1, held.release).start()

  progress = Releasing()
  report = rehearse.rehearse(["jax==0.9.2"], baseline="base", progress=progress)
  assert report.exit_code == 1
  assert _steps(progress)[0] == "waiting for another rehearsal using this environment"
  assert _steps(progress)[1] == "creating a virtual environment (python -m venv)"


def test_rehearse_interrupted_while_building_leaves_no_environment(stand_in, monkeypatch):
  def interrupted(self, env):
    (Path(env) / "bin").mkdir(parents=True)  # half built
    raise KeyboardInterrupt

  monkeypatch.setattr(_StandInBuilder, "create", interrupted)
  with pytest.raises(KeyboardInterrupt):
    rehearse.rehearse(["jax==0.9.2"], baseline="base")
  assert list(_cache().iterdir()) == []


def test_rehearse_no_cache_leaves_nothing_behind(stand_in):
  report = rehearse.rehearse(["jax==0.9.2"], baseline="base", cache=False)
  assert report.exit_code == 1
  assert "; a throwaway environment, built in " in report.notes[-1]
  assert not _cache().exists()
  assert not Path(_StandInBuilder.created[0]).exists()


def test_rehearse_pytest_runs_the_users_tests_in_their_directory(stand_in, monkeypatch,
                                                                 tmp_path):
  project = tmp_path / "project"
  project.mkdir()
  monkeypatch.chdir(project)
  stand_in.write("check_rc", "0")
  stand_in.write("report.json", _check_json(0))
  stand_in.write("pytest_rc", "1")
  report = rehearse.rehearse(["jax==0.9.2"], baseline="base", pytest_paths=["tests/x.py"])
  assert report.exit_code == 1
  assert report.notes[-1] == ("rehearsal: pytest tests/x.py exited 1 (tests failed), "
                              "comparing only")
  log = stand_in.log()
  # `python -c PYTEST_MAIN`, not `python -P -m pytest` (issue 21, item 13): their directory
  # stays first on sys.path, so their own packages import.
  ran = log.index(f"pytest -p no:cacheprovider tests/x.py (in {project})")
  assert log[ran + 1] == "check-only=1"
  # Before check, which is handed their result for its report and page.
  check = next(i for i, line in enumerate(log) if "nnx_pool.regression check" in line)
  assert ran < check and " --pytest-result " in log[check]
  pytest_run = next(a for a in stand_in.started if a[1] == "-c")
  assert pytest_run[1:3] == ["-c", rehearse_pytest.PYTEST_MAIN] and "-P" not in pytest_run
  stand_in.write("pytest_rc", "5")
  assert rehearse.rehearse(["jax==0.9.2"], baseline="base",
                           pytest_paths=["tests/x.py"]).exit_code == 2


def test_rehearse_hands_pytest_everything_after_the_double_dash_untouched(stand_in, monkeypatch,
                                                                         tmp_path):
  # Issue 23: `--pytest tests -k logits` made -k the kit's case filter, and pytest ran every
  # test. After `--`, pytest's options reach pytest as written, and the kit's -k stays unset.
  monkeypatch.chdir(tmp_path)
  (tmp_path / "tests").mkdir()
  stand_in.write("check_rc", "0")
  stand_in.write("report.json", _check_json(0))
  code = cli.main(["rehearse", "jax==0.9.2", "--pytest", "tests", "--", "-k", "logits and not grad",
                   "--", "-x"])
  assert code == 0
  log = stand_in.log()
  check = next(line for line in log if "nnx_pool.regression check" in line)
  assert " -k " not in check  # the kit's cases are not filtered
  assert f"pytest -p no:cacheprovider tests -k logits and not grad -- -x (in {tmp_path})" in log
  pytest_run = next(a for a in stand_in.started if a[1] == "-c")
  assert pytest_run[-5:] == ["tests", "-k", "logits and not grad", "--", "-x"]


def test_rehearse_no_batch_runs_only_the_users_tests(stand_in, monkeypatch, tmp_path, capsys):
  monkeypatch.chdir(tmp_path)
  stand_in.write("check_rc", "0")
  stand_in.write("report.json", _check_json(0))  # what `info --json` writes holds a stamp too
  code = cli.main(["rehearse", "jax==0.9.2", "--no-batch", "--pytest", "--", "-k", "logits"])
  out = capsys.readouterr().out
  assert code == 0
  log = stand_in.log()
  assert not any("nnx_pool.regression check" in line for line in log)
  assert any(line.startswith("-P -m nnx_pool.regression info --json") for line in log)
  assert f"pytest -p no:cacheprovider -k logits (in {tmp_path})" in log
  # No table: the rehearsal's stamp against this environment's, its change marked.
  assert "case " not in out and REHEARSED_JAX in out
  assert "note: rehearsal: --no-batch: the kit's own cases did not run" in out
  assert "note: rehearsal: pytest -k logits exited 0 (passed), comparing only" in out


@pytest.mark.parametrize(("argv", "error"), [
    (["--", "-k", "x"], "the arguments after -- (-k x) are pytest's; pass --pytest [PATH...] "
                        "before the --."),
    (["--no-batch"], "--no-batch skips the kit's own cases, so there is nothing to run without "
                     "--pytest."),
    (["--no-batch", "-k", "avg", "--pytest", "tests"],
     "-k with --no-batch: those options are for the kit's own cases, which --no-batch skips; "
     "to select your tests, pass pytest's options after --: --pytest tests -- -k NAME."),
])
def test_rehearse_pytest_options_that_do_not_fit_exit_2(argv, error, capsys):
  assert cli.main(["rehearse", "jax==0.9.2", *argv]) == 2
  assert capsys.readouterr().err == f"error: rehearse: {error}\n"


@pytest.mark.parametrize(("argv", "fixed"), [
    (["--pytest", "tests", "-k", "logits"], "--pytest tests -- -k logits"),
    (["--pytest", "tests", "-k", "logits", "--no-batch", "--json", "r.json"],
     "--no-batch --json r.json --pytest tests -- -k logits"),
    (["--no-batch", "--pytest", "-x", "tests", "--", "-q"], "--no-batch --pytest -- -x tests -q"),
    (["--pytest", "tests", "--html=page.html"], "--pytest tests -- --html=page.html"),
])
def test_rehearse_a_pytest_option_before_the_double_dash_exits_2_naming_it(
    stand_in, capsys, argv, fixed):
  # Issue 29, finding 10: `--pytest tests -k logits` printed "-k 'logits' selected no cases",
  # ran every test and exited 0. Now nothing runs, and the line shows the command with --.
  assert cli.main(["rehearse", "jax==0.9.2", *argv]) == 2
  option = next(a for a in argv if a.startswith(("-k", "-x", "--html")))
  assert capsys.readouterr().err == (
      f"error: rehearse: {option} comes after --pytest but before --, where rehearse reads the "
      "options, not pytest (a -k there selected none of the kit's cases, and pytest ran every "
      "test); pytest's options go after a --: nnx-pool-regression rehearse jax==0.9.2 "
      f"{fixed}\n")
  assert _StandInBuilder.created == [] and stand_in.started == []


def test_rehearse_a_kit_pattern_or_a_test_path_that_selects_nothing_exits_2_before_building(
    stand_in, capsys, monkeypatch, tmp_path):
  # Issue 36, items 6 and 8: judged here, in seconds, before pip runs for minutes.
  monkeypatch.chdir(tmp_path)
  assert cli.main(["rehearse", "jax==0.9.2", "-k", "avg_k2_on3"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: rehearse: -k 'avg_k2_on3' selects none of the ")
  assert " cases (the nearest: avg_k2_one); a case is selected when its name contains " in err
  assert cli.main(["rehearse", "jax==0.9.2", "--pytest", "tests"]) == 2
  assert capsys.readouterr().err == (
      f"error: rehearse: --pytest tests: there is no tests in {tmp_path}; run it from the "
      "directory that holds your tests, or name them as pytest would take them there.\n")
  assert _StandInBuilder.created == [] and stand_in.started == []


def test_rehearse_pytest_refuses_a_run_that_imported_another_nnx_pool(stand_in, capsys,
                                                                      monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "tests").mkdir()
  stand_in.write("check_rc", "0")
  stand_in.write("report.json", _check_json(0))
  stand_in.write("foreign", str(tmp_path / "nnx_pool"))
  assert cli.main(["rehearse", "jax==0.9.2", "--pytest", "tests"]) == 2
  (entry,) = _cache().iterdir()
  rehearsed = next((entry / "env" / "lib").glob("python*/site-packages")) / "nnx_pool"
  assert _error(capsys.readouterr().err) == (
      f"error: rehearse: pytest would import nnx_pool from {tmp_path / 'nnx_pool'}, not the "
      f"rehearsed one ({rehearse_cache.shown(rehearsed)}), so its results would not be the "
      f"rehearsal's; a nnx_pool package in {tmp_path} (or a path your conftest adds) comes "
      "first. Run rehearse --pytest from a directory without one.")


def test_rehearse_resolve_reports_what_pip_chose(stand_in, monkeypatch):
  pins = {**PINS, "chex": "0.1.92"}
  monkeypatch.setattr(rehearse, "installed_pins", lambda: pins)
  monkeypatch.setattr(rehearse, "installed_depends", lambda: DEPENDS)
  site = stand_in.dir / "site"
  site.mkdir()
  for name, version in (("flax", "0.12.6"), ("optax", "0.2.8"), ("chex", "0.1.92"),
                        ("jax", "0.9.2"), ("jaxlib", "0.9.2")):
    _dist_info(site, name, version)  # what pip installed there
  report = rehearse.rehearse(["jax==0.9.2"], baseline="base", resolve=True)
  assert report.notes[-2].startswith(
      "rehearsal: check ran in a separate environment with jax==0.9.2, everything else at "
      "this environment's versions, or older where --resolve chose; environment ")
  assert report.notes[-1] == (
      "rehearsal: --resolve chose flax 0.12.6 (flax 0.12.8, this environment's, requires "
      "jax>=0.10.0, which excludes jax 0.9.2)")
  (entry,) = _cache().iterdir()
  constraints = (entry / "env" / "rehearsal-constraints.txt").read_text().splitlines()
  assert constraints == ["chex<=0.1.92", "flax<=0.12.8", "numpy==2.4.6", "optax<=0.2.8",
                         "pytest==9.2.0"]


def test_rehearse_check_without_a_report_exits_2(stand_in, capsys):
  stand_in.write("report.json", "not json")
  stand_in.write("check_rc", "2")
  assert cli.main(["rehearse", "jax==0.9.2"]) == 2
  assert _error(capsys.readouterr().err) == (
      "error: rehearse: check in the rehearsal environment exited 2 without a readable report; "
      "its messages above say why.")


def test_rehearse_cli_prints_the_report_and_its_json(stand_in, capsys, tmp_path):
  out_json = tmp_path / "r.json"
  assert cli.main(["rehearse", "jax==0.9.2", "--json", str(out_json)]) == 1
  out = capsys.readouterr().out.splitlines()
  # The child's two rows, laid out as check lays out its table.
  table = out.index("case        max abs err  max rel err  tolerance              status")
  assert out[table + 1:table + 7] == [
      "max_k2_one  0            0            exact                  PASS",
      "avg_k2_one  2e-05        inf          rtol=1e-06 atol=1e-06  FAIL",
      "2 cases: 1 fail, 1 pass",
      "",
      "details:",
      "  avg_k2_one: output: 1 of 18 elements differ (first at (0, 1, 2, 1): 2e-05 vs baseline 0)",
  ]
  changes = out.index("environment changes (baseline recorded 2026-12-03T06:48:44+00:00 at git "
                      "041c3ae55664):")
  assert out[changes + 1:changes + 3] == [f"  {REHEARSED_JAX}", ""]
  data = json.loads(out_json.read_text())
  assert (data["exit_code"], data["counts"], data["stamp_changes"]) == (
      1, {"FAIL": 1, "PASS": 1}, [REHEARSED_JAX])
  assert data["rows"][1]["max_rel"] == "inf"  # written back as JSON holds it


def test_rehearse_prints_each_steps_line_with_its_time_where_stderr_is_no_terminal(
    stand_in, capsys, monkeypatch, tmp_path):
  # Issue 36, item 13: with its output in a file, rehearse printed nothing for minutes.
  monkeypatch.chdir(tmp_path)
  (tmp_path / "tests").mkdir()
  stand_in.write("pip_output", "Collecting jax==0.9.2\nInstalling collected packages: jax\n")
  assert cli.main(["rehearse", "jax==0.9.2", "--pytest", "tests"]) == 1
  err = capsys.readouterr().err
  assert "\r" not in err  # stderr is no terminal here: lines, no progress line
  shown = [re.sub(r", \d+ s: ", ", T: ", line) for line in err.splitlines()]
  # Four steps: the environment created, pip, the user's tests, then check (handed their
  # result); pip's own lines go to the progress line of a terminal only.
  assert shown[:4] == [
      "rehearse: step 1/4, T: creating a virtual environment (python -m venv)",
      "rehearse: step 2/4, T: installing jax==0.9.2 jaxlib==0.9.2 pytest and nnx-pool (pip)",
      "rehearse: step 3/4, T: running pytest tests",
      "rehearse: step 4/4, T: running check",
  ]
  assert len(shown) == 5 and re.fullmatch(r"rehearse: finished in \d+ s", shown[4])


def test_rehearse_puts_the_users_tests_result_in_its_json_and_hands_it_to_check(
    stand_in, capsys, monkeypatch, tmp_path):
  # Issue 36, item 13: the report held pytest's exit status alone, and the page nothing of it.
  monkeypatch.chdir(tmp_path)
  (tmp_path / "tests").mkdir()
  stand_in.write("check_rc", "0")
  stand_in.write("report.json", _check_json(0))
  stand_in.write("pytest_rc", "1")
  stand_in.write("pytest_result.json", json.dumps(
      {"exit_status": 1, "counts": {"failed": 1, "passed": 2},
       "failed": ["tests/test_a.py::test_x"]}))
  out = tmp_path / "r.json"
  assert cli.main(["rehearse", "jax==0.9.2", "--json", str(out), "--pytest", "tests", "--",
                   "-k", "x or y"]) == 1
  expected = {"command": "pytest tests -k 'x or y'", "exit_status": 1, "meaning": "tests failed",
              "counts": {"failed": 1, "passed": 2}, "failed": ["tests/test_a.py::test_x"]}
  assert json.loads(out.read_text())["pytest"] == expected
  assert json.loads((stand_in.dir / "handed.json").read_text()) == expected  # check's page
  assert ("note: rehearsal: pytest tests -k 'x or y' exited 1 (tests failed; 1 failed, 2 "
          "passed), comparing only") in capsys.readouterr().out


def test_rehearse_pytest_main_writes_what_the_tests_found(monkeypatch, tmp_path):
  env = _borrowing_venv(tmp_path / "env")
  project = _project(tmp_path / "project")
  (project / "tests" / "test_more.py").write_text(
      "import pytest\n\n\ndef test_fails():\n  assert 1 == 2\n\n\n"
      "@pytest.mark.skip(reason='not here')\ndef test_skipped():\n  pass\n\n\n"
      "@pytest.fixture\ndef broken():\n  raise RuntimeError\n\n\n"
      "def test_errors(broken):\n  pass\n")
  monkeypatch.chdir(project)
  monkeypatch.setenv("PYTEST_ADDOPTS", "-q")
  monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
  result = tmp_path / "result.json"
  code = rehearse_pytest.run_pytest(env, ["tests"], rehearsed=Path(nnx_pool.__file__).parent,
                                    foreign=tmp_path / "foreign.txt", result=result)
  assert code == 1
  # tests/test_mine.py passes; of test_more.py's three, one fails, one is skipped and one
  # errors in its fixture's setup.
  assert rehearse_pytest.read_result(result, ["tests"], code, "tests failed") == {
      "command": "pytest tests", "exit_status": 1, "meaning": "tests failed",
      "counts": {"error": 1, "failed": 1, "passed": 1, "skipped": 1},
      "failed": ["tests/test_more.py::test_errors", "tests/test_more.py::test_fails"]}


@pytest.mark.parametrize("requirement", [
    "jax 0.9.2", "jax==0.9.2 --config-settings=x=y", "jax ==0.9.2 optax",
    "jax==0.9.2; --hash=sha256:0", "./wheels/jax-0.9.2-py3-none-any.whl"])
def test_rehearse_malformed_requirement_exits_2_before_pip_runs(stand_in, capsys, requirement):
  assert cli.main(["rehearse", "jaxlib==0.9.2", requirement]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"error: rehearse: {requirement!r} is ")
  assert err.count("\n") == 1
  assert _StandInBuilder.created == [] and stand_in.started == []


# ------------------------------------------------- the user's tests, for real


def _borrowing_venv(where: Path) -> Path:
  """A virtual environment without pip whose interpreter imports this one's packages."""
  venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(where)
  (site,) = rehearse_env.site_packages(where)
  borrowed = sysconfig.get_paths()["purelib"]  # jax, pytest, and nnx-pool (editable) here
  (site / "borrowed.pth").write_text(f"import site; site.addsitedir({borrowed!r})\n")
  return where


def _project(root: Path, *, stray: bool = False) -> Path:
  """A user's project: their package, and a test that imports it."""
  (root / "mypkg").mkdir(parents=True)
  (root / "mypkg" / "__init__.py").write_text("ANSWER = 42\n")
  (root / "tests").mkdir()
  (root / "tests" / "test_mine.py").write_text(
      "import mypkg\n\n\ndef test_answer():\n  assert mypkg.ANSWER == 42\n")
  if stray:
    (root / "nnx_pool").mkdir()
    (root / "nnx_pool" / "__init__.py").write_text("")
  return root


def test_rehearse_pytest_imports_the_users_own_package(monkeypatch, tmp_path):
  env = _borrowing_venv(tmp_path / "env")
  monkeypatch.chdir(_project(tmp_path / "project"))
  rehearsed = Path(nnx_pool.__file__).parent
  foreign = tmp_path / "foreign.txt"
  monkeypatch.setenv("PYTEST_ADDOPTS", "-q")
  monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # sys.path is the point, not plugins
  code = rehearse_pytest.run_pytest(env, ["tests"], rehearsed=rehearsed, foreign=foreign)
  assert code == 0 and not foreign.exists()
  # The command it replaced: -P keeps the project off sys.path, and `import mypkg` fails.
  old = subprocess.run([str(rehearse_env.interpreter(env)), "-P", "-m", "pytest", "-p",
                        "no:cacheprovider", "tests"], env=rehearse_env.subprocess_env(env),
                       capture_output=True, text=True, check=False)
  assert old.returncode == 2 and "No module named 'mypkg'" in old.stdout


def test_rehearse_pytest_guard_refuses_a_stray_nnx_pool_before_pytest_starts(monkeypatch,
                                                                             tmp_path):
  env = _borrowing_venv(tmp_path / "env")
  project = _project(tmp_path / "project", stray=True)
  monkeypatch.chdir(project)
  foreign = tmp_path / "foreign.txt"
  code = rehearse_pytest.run_pytest(env, ["tests"], rehearsed=Path(nnx_pool.__file__).parent,
                          foreign=foreign)
  assert code == 4
  assert foreign.read_text() == str(project / "nnx_pool")


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
