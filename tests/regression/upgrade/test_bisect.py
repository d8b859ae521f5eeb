"""Tests for ``bisect``: the range of releases, the halving, skips, refusals, and runs end to end.

The fast tests install nothing: the registry's releases come from a stand-in lister, and
where a bisect runs end to end, ``venv`` is replaced by a stand-in whose ``bin/python`` is a
shell script that plays pip, ``record``/``check`` and pytest, each release's verdict read
from files the test writes (the releases listed in ``moved`` fail, those in
``uninstallable`` fail to install). The one test marked ``rehearsal`` installs real wheels
from the registry; ``make test-rehearsal`` runs it.
"""

import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.version import Version

from nnx_pool.regression import cli
from nnx_pool.regression.report import Report, Row
from nnx_pool.regression.upgrade import bisect, bisect_plan, rehearse_env
from nnx_pool.regression.upgrade.bisect_plan import (
  GOOD,
  MOVED,
  SKIP,
  Halving,
  Listing,
  find_span,
  parse_index,
  parse_set,
  partner_of,
  releases_between,
)
from nnx_pool.regression.upgrade.rehearse_plan import RehearsalError


def V(text: str) -> Version:
  return Version(text)


def _listing(*versions: str, yanked: dict[str, str] | None = None) -> Listing:
  return Listing(tuple(sorted(map(V, versions))),
                 {V(v): why for v, why in (yanked or {}).items()})


# What `pip index versions jax` and `... jaxlib` listed here (pip 26.3, this machine's registry,
# 2026-12), cut to 0.4.30 .. 0.10.2. jax 0.4.32 is yanked (PyPI gives no reason); jaxlib has no
# 0.4.37 and no 0.5.2, and jax 0.9.0.1 came with a jaxlib 0.9.0.1.
JAX = _listing("0.4.30", "0.4.31", "0.4.33", "0.4.34", "0.4.35", "0.4.36", "0.4.37", "0.4.38",
               "0.5.0", "0.5.1", "0.5.2", "0.5.3", "0.9.0", "0.9.0.1", "0.9.1", "0.9.2", "0.10.0",
               "0.10.1", "0.10.2", yanked={"0.4.32": "no reason given"})
JAXLIB = _listing("0.4.30", "0.4.31", "0.4.33", "0.4.34", "0.4.35", "0.4.36", "0.4.38", "0.5.0",
                  "0.5.1", "0.5.3", "0.9.0", "0.9.0.1", "0.9.1", "0.9.2", "0.10.0", "0.10.1",
                  "0.10.2")
# The flax the stand-in pip installs: this environment's, which the rehearsal pins.
FLAX = importlib.metadata.version("flax")
SEVEN = ("0.9.0", "0.9.0.1", "0.9.1", "0.9.2", "0.10.0", "0.10.1", "0.10.2")


def _span(good: str = "jax==0.9.0", bad: str = "jax==0.10.2"):
  return find_span(parse_set(good, "--good"), parse_set(bad, "--bad"))


# ------------------------------------------------------------ the sets and the one package


def test_find_span_of_jax_pairs_each_release_with_its_jaxlib():
  span = _span("jax==0.9.0 flax==0.12.6", "flax==0.12.6 jax==0.10.2")
  assert (span.package, span.good, span.bad, span.partner) == ("jax", V("0.9.0"), V("0.10.2"),
                                                               "jaxlib")
  assert span.common == ("flax==0.12.6",)
  assert span.requirements(V("0.9.2"), V("0.9.2")) == ["jax==0.9.2", "jaxlib==0.9.2",
                                                       "flax==0.12.6"]


def test_find_span_counts_jax_and_jaxlib_as_one_package():
  span = _span("jax==0.9.0 jaxlib==0.9.0", "jax==0.10.2 jaxlib==0.10.2")
  assert (span.package, span.partner, span.common) == ("jax", "jaxlib", ())
  # A jaxlib both sets name alike stays as named: only jax is walked.
  span = _span("jax==0.9.0 jaxlib==0.9.0", "jax==0.9.2 jaxlib==0.9.0")
  assert (span.package, span.partner, span.common) == ("jax", None, ("jaxlib==0.9.0",))
  assert span.requirements(V("0.9.1"), V("0.9.1")) == ["jax==0.9.1", "jaxlib==0.9.0"]


def test_find_span_of_flax_has_no_partner():
  span = _span("flax==0.12.0 jax==0.10.2", "flax==0.12.8 jax==0.10.2")
  assert (span.package, span.good, span.bad, span.partner, span.common) == (
      "flax", V("0.12.0"), V("0.12.8"), None, ("jax==0.10.2",))


@pytest.mark.parametrize(("good", "bad", "message"), [
    ("jax==0.9.0 flax", "FLAX jax==0.9.0", "--good and --bad are the same set (jax==0.9.0 flax)"),
    ("jax==0.9.0", "jax==0.9", "--good and --bad are the same set (jax==0.9.0)"),
    ("jax==0.9.0 flax==0.12.6", "jax==0.10.2 flax==0.12.8",
     "--good and --bad differ in 2 packages: flax (flax==0.12.6 -> flax==0.12.8), jax "
     "(jax==0.9.0 -> jax==0.10.2); bisect walks one package's releases."),
    ("jax==0.9.0", "jax==0.10.2 flax==0.12.8",
     "differ in 2 packages: flax (not named -> flax==0.12.8), jax"),
    ("jax>=0.9", "jax==0.10.2", "--good has jax>=0.9: bisect walks the releases of jax from one "
     "exact release to another; name one with == on each side, e.g. --good 'jax==0.9.0'."),
    ("optax", "jax==0.10.2 optax", "--good does not name it"),
    ("", "jax==0.10.2", "--good is empty"),
    ("jax==0.9.0 jax==0.9.1", "jax==0.10.2", "names jax twice (jax==0.9.0 and jax==0.9.1)"),
    ("jax==0.9.0", "jax=0.10.2", "--bad: 'jax=0.10.2' is not a requirement"),
])
def test_find_span_refuses_sets_it_cannot_bisect(good, bad, message):
  with pytest.raises(RehearsalError, match="^bisect: ") as caught:
    _span(good, bad)
  assert message in str(caught.value)


# ------------------------------------------------------------ the registry's releases


# pip 26.3's `pip index versions jax -vv` against PyPI (2026-12), cut to the lines it reads and a
# few it must pass over: a yanked sdist and wheel, a wheel for another platform.
_FILES = "https://files.pythonhosted.org/packages"
PIP_INDEX_VV = "\n".join([
    "Created temporary directory: /nowhere/pip-ephem-wheel-cache",
    "  Skipping link: yanked for reason: Bad jaxlib GPU release: "
    f"{_FILES}/97/7b/1e93/jax-0.4.0.tar.gz (from https://pypi.org/simple/jax/) "
    "(requires-python:>=3.8)",
    f"  Skipping link: yanked for reason: <none given>: {_FILES}/ef/36/841f/"
    "jax-0.4.32-py3-none-any.whl (from https://pypi.org/simple/jax/) (requires-python:>=3.10)",
    "  Skipping link: none of the wheel's tags (cp312-cp312-win_amd64) are compatible (run pip "
    f"debug --verbose to show compatible tags): {_FILES}/aa/jaxlib-0.9.2-cp312-cp312-"
    "win_amd64.whl (from https://pypi.org/simple/jaxlib/)",
    "jax (0.10.2)",
    "Available versions: 0.10.2, 0.10.1, 0.10.0, 0.9.2, 0.9.1, 0.9.0.1, 0.9.0, 0.4.33, 0.4.31",
    "  INSTALLED: 0.10.2",
    "  LATEST:    0.10.2",
])


def test_parse_index_reads_the_releases_and_the_yanked_ones_with_their_reason():
  listing = parse_index(PIP_INDEX_VV)
  assert listing.versions == tuple(map(V, ("0.4.31", "0.4.33", *SEVEN)))
  assert listing.yanked == {V("0.4.0"): "Bad jaxlib GPU release", V("0.4.32"): "no reason given"}


def test_parse_index_without_a_versions_line_refuses():
  with pytest.raises(RehearsalError, match="printed no 'Available versions' line"):
    parse_index("ERROR: No matching distribution found for jaxx\n")


def test_releases_between_walks_every_release_in_order_the_patch_release_included():
  walk = releases_between(JAX, _span())
  assert walk.releases == tuple(map(V, SEVEN))  # 0.9.0.1 between 0.9.0 and 0.9.1
  assert walk.left_out == ()
  assert walk.steps() == 3  # ceil(log2(6)): at most 3 checks between the two ends


def test_releases_between_walks_from_good_to_bad_either_way():
  walk = releases_between(JAX, _span("jax==0.10.2", "jax==0.9.2"))
  assert walk.releases == tuple(map(V, ("0.10.2", "0.10.1", "0.10.0", "0.9.2")))


def test_releases_between_leaves_out_pre_releases_unless_asked():
  listing = _listing("0.9.2", "0.10.0rc1", "0.10.0rc2", "0.10.0", "0.10.1")
  walk = releases_between(listing, _span("jax==0.9.2", "jax==0.10.1"))
  assert walk.releases == tuple(map(V, ("0.9.2", "0.10.0", "0.10.1")))
  assert walk.left_out == ("jax 0.10.0rc1 (a pre-release; --pre walks them)",
                           "jax 0.10.0rc2 (a pre-release; --pre walks them)")
  walk = releases_between(listing, _span("jax==0.9.2", "jax==0.10.1"), pre=True)
  assert walk.releases == tuple(map(V, ("0.9.2", "0.10.0rc1", "0.10.0rc2", "0.10.0", "0.10.1")))


def test_releases_between_leaves_out_yanked_releases_and_names_them():
  walk = releases_between(JAX, _span("jax==0.4.30", "jax==0.4.34"))
  assert walk.releases == tuple(map(V, ("0.4.30", "0.4.31", "0.4.33", "0.4.34")))
  assert walk.left_out == ("jax 0.4.32 (yanked: no reason given)",)
  # A yanked end is walked from: pip installs a yanked release that == names.
  walk = releases_between(JAX, _span("jax==0.4.32", "jax==0.4.34"))
  assert walk.releases == tuple(map(V, ("0.4.32", "0.4.33", "0.4.34")))


def test_releases_between_refuses_an_end_the_registry_does_not_serve():
  with pytest.raises(RehearsalError) as caught:
    releases_between(JAX, _span("jax==0.9.3", "jax==0.10.2"))
  assert str(caught.value) == ("bisect: --good jax==0.9.3 is not a release the registry serves "
                               "here (the nearest it serves: 0.9.2, 0.10.0).")


def test_releases_between_refuses_neighbours_with_no_release_between():
  with pytest.raises(RehearsalError) as caught:
    releases_between(JAX, _span("jax==0.9.2", "jax==0.10.0"))
  assert str(caught.value) == (
      "bisect: the registry has no release of jax between 0.9.2 and 0.10.0: they are "
      "neighbours, so if your check fails with jax 0.10.0 and passes with 0.9.2, 0.10.0 is the "
      "release that moved it; there is nothing to bisect.")
  with pytest.raises(RehearsalError, match=r"between 0.4.31 and 0.4.33, besides jax 0.4.32 "
                     r"\(yanked: no reason given\):"):
    releases_between(JAX, _span("jax==0.4.31", "jax==0.4.33"))


@pytest.mark.parametrize(("jax", "jaxlib"), [
    ("0.9.2", "0.9.2"), ("0.9.0.1", "0.9.0.1"),
    ("0.5.2", "0.5.1"),  # no jaxlib 0.5.2: jax 0.5.2 requires jaxlib >=0.5.1,<=0.5.2 (PyPI)
    ("0.4.37", "0.4.36"),  # no jaxlib 0.4.37: jax 0.4.37 requires jaxlib >=0.4.36 (PyPI)
    ("0.4.29", None),  # nothing at or before it in this listing
])
def test_partner_of_pairs_jax_with_the_same_jaxlib_else_the_newest_before_it(jax, jaxlib):
  assert partner_of(V(jax), JAXLIB) == (None if jaxlib is None else V(jaxlib))


# ------------------------------------------------------------ the halving


def _halve(count: int, verdicts) -> tuple[list[int], Halving]:
  """Runs a Halving with a verdict per index; the indexes it checked, in order."""
  halving, checked = Halving(count), []
  while (index := halving.next()) is not None:
    checked.append(index)
    halving.mark(index, verdicts(index))
  return checked, halving


def test_halving_of_the_seven_releases_names_0_10_0_after_two_checks():
  # SEVEN moves at 0.10.0 (index 4): 0.9.2 (3) first, then 0.10.0 (the earlier of 4 and 5).
  checked, halving = _halve(7, lambda i: MOVED if i >= 4 else GOOD)
  assert checked == [3, 4]
  assert (halving.good, halving.moved, halving.unsure()) == (3, 4, [])


def test_halving_finds_any_first_moved_release_within_its_bound():
  for count in range(2, 40):
    bound = 0 if count == 2 else (count - 2).bit_length()  # ceil(log2(count - 1)), by hand
    for first in range(1, count):
      checked, halving = _halve(count, lambda i, first=first: MOVED if i >= first else GOOD)
      assert (halving.good, halving.moved) == (first - 1, first)
      assert len(checked) <= bound, (count, first, checked)


def test_halving_goes_around_a_skipped_release():
  # 0.9.2 (3) cannot be installed; the first moved is 0.10.1 (5).
  checked, halving = _halve(7, lambda i: SKIP if i == 3 else MOVED if i >= 5 else GOOD)
  assert checked == [3, 2, 4, 5]
  assert (halving.good, halving.moved, halving.unsure()) == (4, 5, [])


def test_halving_says_when_a_skipped_release_may_be_the_first_moved():
  checked, halving = _halve(7, lambda i: SKIP if i == 3 else MOVED if i >= 4 else GOOD)
  assert checked == [3, 2, 4]
  assert (halving.good, halving.moved, halving.unsure()) == (2, 4, [3])


def test_halving_refuses_a_verdict_outside_the_range_or_unknown():
  halving = Halving(5)
  with pytest.raises(ValueError, match="`index` must lie between"):
    halving.mark(0, GOOD)
  with pytest.raises(ValueError, match="`verdict` must be 'good', 'moved' or 'skip'; got 'bad'"):
    halving.mark(2, "bad")
  with pytest.raises(ValueError, match="`count` must be 2 or more"):
    Halving(1)


def test_fits_reads_this_environments_versions():
  here = {"jax": "0.10.2", "jaxlib": "0.10.2", "flax": "0.12.8"}
  assert bisect_plan.fits(["jax==0.10.2", "jaxlib==0.10.2", "flax"], here)
  assert not bisect_plan.fits(["jax==0.10.2", "optax"], here)  # optax is not installed
  assert not bisect_plan.fits(["jax==0.9.2"], here)
  assert not bisect_plan.fits(["jax @ file:///wheels/jax-0.10.2-py3-none-any.whl"], here)


# ------------------------------------------------------------ runs through stand-in environments


FAKE_PYTHON = """#!/bin/sh
env=$(cd "$(dirname "$0")/.." && pwd)
jax=$(sed -n 's/^jax==//p' "$env/rehearsal-requirements.txt")
jaxlib=$(sed -n 's/^jaxlib==//p' "$env/rehearsal-requirements.txt")
flax=$(sed -n 's/^flax[=<]=//p' "$env/rehearsal-constraints.txt")  # as pip would: this one's
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  echo "pip jax $jax jaxlib $jaxlib" >> "$FAKE/log"
  if grep -qx "$jax" "$FAKE/uninstallable"; then
    echo "ERROR: No matching distribution found for jax==$jax"; exit 1
  fi
  site="$env/lib/python3/site-packages"
  for dist in "jax $jax" "jaxlib $jaxlib" "flax $flax"; do
    set -- $dist
    mkdir -p "$site/$1-$2.dist-info"
    printf 'Metadata-Version: 2.1\\nName: %s\\nVersion: %s\\n' "$1" "$2" \\
      > "$site/$1-$2.dist-info/METADATA"
  done
  exit 0
fi
if [ "$1" = "-c" ]; then  # the user's tests (rehearse_env.PYTEST_MAIN)
  shift 2
  echo "pytest jax $jax check-only=$NNX_REGRESSION_CHECK_ONLY $*" >> "$FAKE/log"
  if [ "$NNX_REGRESSION_CHECK_ONLY" = "0" ]; then echo "wrote 1 new baseline(s)"; exit 1; fi
  if grep -qx "$jax" "$FAKE/moved"; then
    echo "FAILED test_model.py::test_logits (jax $jax)"; exit 1
  fi
  echo "1 passed (jax $jax)"; exit 0
fi
if [ "$3" = "nnx_pool.regression" ]; then
  echo "$4 jax $jax" >> "$FAKE/log"
  [ "$4" = "record" ] && exit "$(cat "$FAKE/record_rc")"
  out=""; previous=""
  for arg in "$@"; do [ "$previous" = "--json" ] && out="$arg"; previous="$arg"; done
  if grep -qx "$jax" "$FAKE/moved"; then cp "$FAKE/moved.json" "$out"; exit 1; fi
  cp "$FAKE/passed.json" "$out"; exit 0
fi
exit 99
"""


def _make_env(env: Path) -> None:
  (env / "bin").mkdir(parents=True)
  (env / "lib" / "python3" / "site-packages").mkdir(parents=True)
  (env / "bin" / "python").write_text(FAKE_PYTHON)
  (env / "bin" / "python").chmod(0o755)
  (env / "pyvenv.cfg").write_text("home = nowhere\n")


class _StandInBuilder:
  """Replaces venv.EnvBuilder: the environment's python is FAKE_PYTHON."""

  def __init__(self, *, with_pip: bool, symlinks: bool):
    pass

  def create(self, env):
    _make_env(Path(env))


def _report_json(moved: bool) -> str:
  """What the stand-in's `check --json` writes: one case, failing where the release moved."""
  row = (Row("avg_k3_one", "FAIL", 2.4e-07, 6.3e-08, "exact",
             ["output_eager: 8 of 144 elements differ"]) if moved
         else Row("avg_k3_one", "PASS", 0.0, 0.0, "exact"))
  return json.dumps(Report(command="check", exit_code=int(moved), rows=[row]).to_json())


@pytest.fixture
def fake(monkeypatch, tmp_path):
  """Stand-in environments and registry; returns the folder of the files the stand-in reads."""
  folder = tmp_path / "fake"
  folder.mkdir()
  for name, text in {"log": "", "uninstallable": "", "record_rc": "0",
                     "moved": "0.10.0\n0.10.1\n0.10.2\n", "moved.json": _report_json(True),
                     "passed.json": _report_json(False)}.items():
    (folder / name).write_text(text)
  monkeypatch.setenv("FAKE", str(folder))
  monkeypatch.setenv("NNX_POOL_CACHE", str(tmp_path / "cache"))
  monkeypatch.setenv("NNX_POOL_REHEARSE_KEEP", "10")
  monkeypatch.setattr(rehearse_env.venv, "EnvBuilder", _StandInBuilder)
  monkeypatch.setattr(bisect, "this_environment", lambda: None)  # never this interpreter
  monkeypatch.setattr(bisect, "registry_releases",
                      lambda name, pre: {"jax": JAX, "jaxlib": JAXLIB}[name])
  return folder


def _log(folder: Path) -> list[str]:
  return (folder / "log").read_text().splitlines()


def _run(**options) -> tuple[bisect.Bisected, list[str]]:
  said: list[str] = []
  options.setdefault("good", "jax==0.9.0")
  options.setdefault("bad", "jax==0.10.2")
  found = bisect.bisect(options.pop("good"), options.pop("bad"), say=said.append, **options)
  return found, said


def test_bisect_names_the_first_moved_release_and_builds_one_environment_a_step(fake):
  found, said = _run(pytest_paths=["tests"])
  assert found.exit_code == 1 and found.error is None
  assert found.answer == (f"first moved: jax 0.10.0 (jaxlib 0.10.0, flax {FLAX}), "
                          "last good: jax 0.9.2")
  assert [(str(s.release), s.verdict) for s in found.steps] == [
      ("0.9.0", "recorded"), ("0.10.2", MOVED), ("0.9.2", GOOD), ("0.10.0", MOVED)]
  assert all(s.built for s in found.steps)
  assert said[0] == ("bisect: jax 0.9.0 -> 0.10.2: 7 releases (0.9.0, 0.9.0.1, 0.9.1, 0.9.2, "
                     "0.10.0, 0.10.1, 0.10.2); records in the first, checks the last, then at "
                     "most 3 between")
  assert said[1].startswith(f"bisect: step 1: jax 0.9.0 (jaxlib 0.9.0, flax {FLAX}): recorded, ")
  assert said[3].startswith(f"bisect: step 3: jax 0.9.2 (jaxlib 0.9.2, flax {FLAX}): good, ")
  assert " (environment built in " in said[3]
  assert found.total.startswith("bisect: 4 steps, 4 installs, ")
  assert found.total.endswith("GB of environments (4 in "
                              f"{Path(os.environ['NNX_POOL_CACHE']) / 'rehearse'})")
  # The kit's report and the user's tests' output of the first moved release.
  assert found.moved.report.rows[0].status == "FAIL"
  assert found.moved.tests == "FAILED test_model.py::test_logits (jax 0.10.0)\n"
  log = _log(fake)
  assert [line.split(" --nnx")[0] for line in log if not line.startswith("pip")] == [
      "record jax 0.9.0",
      "pytest jax 0.9.0 check-only=0 -p no:cacheprovider tests",  # records its baselines...
      "pytest jax 0.9.0 check-only=1 -p no:cacheprovider tests",  # ...and checks them there
      "check jax 0.10.2", "pytest jax 0.10.2 check-only=1 -p no:cacheprovider tests",
      "check jax 0.9.2", "pytest jax 0.9.2 check-only=1 -p no:cacheprovider tests",
      "check jax 0.10.0", "pytest jax 0.10.0 check-only=1 -p no:cacheprovider tests"]
  # The user's baselines go to the bisect's own directory, never beside their tests.
  assert all("--nnx-regression-dir=" in line for line in log if line.startswith("pytest"))
  assert "--nnx-regression-dir=" + str(Path.cwd()) not in "\n".join(log)


def test_bisect_reuses_the_cached_environments(fake):
  _run(batch=False, pytest_paths=["tests"])
  found, said = _run(batch=False, pytest_paths=["tests"])
  assert found.answer.startswith("first moved: jax 0.10.0 ")
  assert not any(s.built for s in found.steps)
  assert all(line.endswith("(environment reused)") for line in said[1:]), said
  assert found.total.startswith("bisect: 4 steps, 0 installs, ")
  assert sum(line.startswith("pip") for line in _log(fake)) == 4  # the first bisect's


def test_bisect_runs_a_set_this_environment_satisfies_here_and_installs_nothing_for_it(
    fake, monkeypatch, tmp_path):
  here = tmp_path / "here"
  _make_env(here)
  (here / "rehearsal-requirements.txt").write_text("jax==0.10.2\njaxlib==0.10.2\n")
  site = here / "lib" / "python3" / "site-packages"
  for name, version in (("jax", "0.10.2"), ("jaxlib", "0.10.2"), ("flax", "0.12.8"),
                        ("pytest", "9.2.0")):
    (site / f"{name}-{version}.dist-info").mkdir()
    (site / f"{name}-{version}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
  monkeypatch.setattr(bisect, "this_environment", lambda: here)
  found, said = _run(batch=False, pytest_paths=["tests"])
  assert said[2].startswith("bisect: step 2: jax 0.10.2 (jaxlib 0.10.2, flax 0.12.8): moved, ")
  assert said[2].endswith(" (this environment)")
  assert [s.built for s in found.steps] == [True, False, True, True]
  assert found.total.startswith("bisect: 4 steps, 3 installs, ")
  assert found.total.endswith(", and this environment)")
  assert [line for line in _log(fake) if line.startswith("pip")] == [
      "pip jax 0.9.0 jaxlib 0.9.0", "pip jax 0.9.2 jaxlib 0.9.2", "pip jax 0.10.0 jaxlib 0.10.0"]


def test_bisect_skips_a_release_that_cannot_be_installed_and_goes_around_it(fake):
  (fake / "uninstallable").write_text("0.9.2\n")
  (fake / "moved").write_text("0.10.1\n0.10.2\n")
  found, said = _run(batch=False, pytest_paths=["tests"])
  assert found.exit_code == 1
  assert [(str(s.release), s.verdict) for s in found.steps] == [
      ("0.9.0", "recorded"), ("0.10.2", MOVED), ("0.9.2", SKIP), ("0.9.1", GOOD),
      ("0.10.0", GOOD), ("0.10.1", MOVED)]
  assert said[3].startswith("bisect: step 3: jax 0.9.2: skipped, could not be installed: pip "
                            "could not install jax==0.9.2: No matching distribution found for "
                            "jax==0.9.2, ")
  assert found.answer == (f"first moved: jax 0.10.1 (jaxlib 0.10.1, flax {FLAX}), "
                          "last good: jax 0.10.0")


def test_bisect_names_a_skipped_release_that_may_be_the_first_moved(fake):
  (fake / "uninstallable").write_text("0.9.2\n")
  found, _ = _run(batch=False, pytest_paths=["tests"])
  assert found.exit_code == 1
  assert found.answer == (
      f"first moved: jax 0.10.0 (jaxlib 0.10.0, flax {FLAX}), last good: jax 0.9.1; jax 0.9.2 "
      "between them could not be checked (skipped), so the first moved may be it")


def test_bisect_exits_0_when_the_bad_set_passes(fake):
  (fake / "moved").write_text("")
  found, _ = _run()
  assert (found.exit_code, found.error, len(found.steps)) == (0, None, 2)
  assert found.answer == (f"nothing moved: jax 0.10.2 (jaxlib 0.10.2, flax {FLAX}) passes "
                          f"against the baselines recorded with jax 0.9.0 (jaxlib 0.9.0, flax "
                          f"{FLAX}); nothing to bisect")


@pytest.mark.parametrize(("uninstallable", "record_rc", "line", "error"), [
    ("0.9.0", "0", "bisect: step 1: jax 0.9.0: failed, could not be installed: pip could not "
     "install jax==0.9.0: No matching distribution found for jax==0.9.0, ",
     "bisect: could not record the baselines with --good (jax 0.9.0): could not be installed: "
     "pip could not install jax==0.9.0: No matching distribution found for jax==0.9.0."),
    ("0.10.2", "0", "bisect: step 2: jax 0.10.2: failed, could not be installed: pip could not "
     "install jax==0.10.2: ",
     "bisect: the --bad set (jax 0.10.2) could not be installed: pip could not install "
     "jax==0.10.2: No matching distribution found for jax==0.10.2; nothing was bisected."),
    ("", "2", f"bisect: step 1: jax 0.9.0 (jaxlib 0.9.0, flax {FLAX}): failed, record exited 2 "
     "(its messages above say why), ",
     f"bisect: could not record the baselines with --good (jax 0.9.0 (jaxlib 0.9.0, flax "
     f"{FLAX})): record exited 2 (its messages above say why)."),
])
def test_bisect_exits_2_when_an_end_cannot_be_installed_or_recorded(fake, uninstallable,
                                                                    record_rc, line, error):
  (fake / "uninstallable").write_text(uninstallable)
  (fake / "record_rc").write_text(record_rc)
  found, said = _run()
  assert found.exit_code == 2
  assert said[-1].startswith(line)
  assert found.error == error
  assert found.answer == ""


# ------------------------------------------------------------ the command line


def test_cli_bisect_prints_each_step_the_report_and_the_answer_last(fake, capsys):
  code = cli.main(["bisect", "--good", "jax==0.9.0", "--bad", "jax==0.10.2", "--no-batch",
                   "--pytest", "tests", "--", "-k", "logits"])
  out, err = capsys.readouterr()
  assert code == 1
  assert out.splitlines()[-1] == (f"first moved: jax 0.10.0 (jaxlib 0.10.0, flax {FLAX}), "
                                  "last good: jax 0.9.2")
  assert out.splitlines()[-2].startswith("bisect: 4 steps, 4 installs, ")
  assert "FAILED test_model.py::test_logits (jax 0.10.0)\n" in out
  assert [line.split(":")[1] for line in err.splitlines()] == [
      " jax 0.9.0 -> 0.10.2", " step 1", " step 2", " step 3", " step 4"]
  assert all(" -k logits --nnx-regression-dir=" in line for line in _log(fake)
             if line.startswith("pytest"))


def test_cli_bisect_prints_the_kits_report_where_its_cases_moved(fake, capsys):
  assert cli.main(["bisect", "--good", "jax==0.9.0", "--bad", "jax==0.10.2"]) == 1
  out = capsys.readouterr().out
  assert "avg_k3_one" in out and "1 cases: 1 fail" in out  # the stand-in check's table
  assert "output_eager: 8 of 144 elements differ" in out
  assert out.splitlines()[-1].startswith("first moved: jax 0.10.0 ")


@pytest.mark.parametrize(("argv", "error"), [
    (["--good", "jax==0.9.0", "--bad", "jax==0.9.0"], "error: bisect: --good and --bad are the "
     "same set (jax==0.9.0); name the release that passes with --good and the one that moved "
     "with --bad.\n"),
    (["--good", "jax==0.9.0 flax==0.12.6", "--bad", "jax==0.10.2 flax==0.12.8"],
     "error: bisect: --good and --bad differ in 2 packages: "),
    (["--good", "jax==0.9.2", "--bad", "jax==0.10.0"],
     "error: bisect: the registry has no release of jax between 0.9.2 and 0.10.0"),
    (["--good", "jax==0.9.0", "--bad", "jax==0.10.2", "--", "-x"],
     "error: bisect: the arguments after -- (-x) are pytest's; pass --pytest [PATH...] before "
     "the --.\n"),
    (["--good", "jax==0.9.0", "--bad", "jax==0.10.2", "--no-batch"],
     "error: bisect: --no-batch skips the kit's own cases, so there is nothing to run without "
     "--pytest\n"),
    (["--good", "jax==0.9.0", "--bad", "jax==0.10.2", "--no-batch", "-k", "avg", "--pytest"],
     "error: bisect: -k selects the kit's own cases, which --no-batch skips"),
])
def test_cli_bisect_refuses_bad_input_with_exit_2_before_building(fake, capsys, argv, error):
  assert cli.main(["bisect", *argv]) == 2
  out, err = capsys.readouterr()
  assert out == "" and err.startswith(error)
  assert _log(fake) == []  # nothing built, nothing run
  assert not (Path(os.environ["NNX_POOL_CACHE"]) / "rehearse").exists()


# ------------------------------------------------------------ real wheels


USER_TEST = '''\
import jax
import jax.numpy as jnp
from packaging.version import Version


def test_column_means(nnx_regression):
  x = jnp.arange(12.0).reshape(3, 4)
  # Deliberately version-dependent: from jax 0.10.0 on, this "model" adds 1e-3.
  shift = 1e-3 if Version(jax.__version__) >= Version("0.10.0") else 0.0
  nnx_regression.check("column_means", lambda a: a.mean(axis=0) + shift, x)
'''


@pytest.mark.rehearsal
@pytest.mark.timeout(1500)
def test_bisect_names_jax_0_10_0_with_real_wheels_in_at_most_4_installs(tmp_path):
  project = tmp_path / "project"
  (project / "tests").mkdir(parents=True)
  (project / "tests" / "test_moves.py").write_text(USER_TEST)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.setdefault("NNX_POOL_CACHE", str(tmp_path / "cache"))  # fresh builds unless told
  env["NNX_POOL_REHEARSE_KEEP"] = "10"  # keep every environment, to count them
  cache = Path(env["NNX_POOL_CACHE"]) / "rehearse"
  before = set(cache.iterdir()) if cache.is_dir() else set()
  started = time.monotonic()
  done = subprocess.run(
      [sys.executable, "-m", "nnx_pool.regression", "bisect", "--good", "jax==0.9.0", "--bad",
       "jax==0.10.2", "--resolve", "--no-batch", "--pytest", "tests"],
      cwd=project, env=env, capture_output=True, text=True, timeout=1500, check=False)
  minutes = (time.monotonic() - started) / 60
  assert done.returncode == 1, done.stderr
  lines = done.stdout.splitlines()
  assert lines[-1].startswith("first moved: jax 0.10.0 (jaxlib 0.10.0, flax "), lines[-1]
  assert lines[-1].endswith("), last good: jax 0.9.2")
  installs = int(lines[-2].split(" steps, ")[1].split(" install")[0])
  built = {e for e in cache.iterdir() if (e / "env" / "pyvenv.cfg").is_file()} - before
  assert installs <= 4 and len(built) <= installs, (lines[-2], built)
  assert "jax 0.9.0 -> 0.10.0" in done.stdout  # the failing test's report
  assert not (project / "tests" / "_regression").exists()  # the user's baselines: untouched
  print(done.stderr, lines[-2], f"({minutes:.1f} min measured here)", sep="\n")
