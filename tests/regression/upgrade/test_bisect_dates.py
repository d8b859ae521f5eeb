"""``bisect --good-date --bad-date`` (issue 39): the days walked, what changed, each change alone.

A fake registry of upload times and a fake resolver stand in for the index and ``uv pip
compile --exclude-newer``; the steps are judged by a stand-in that says which set moves the
numbers. Nothing is installed and nothing reaches the network.
"""

from __future__ import annotations

import datetime as dt

import pytest

from nnx_pool.regression.upgrade import bisect_dates, date_plan
from nnx_pool.regression.upgrade.bisect_plan import GOOD, MOVED, SKIP
from nnx_pool.regression.upgrade.bisect_steps import RECORDED, Step
from nnx_pool.regression.upgrade.installer import PipSettings
from nnx_pool.regression.upgrade.rehearse_plan import RehearsalError


def _at(text: str) -> dt.datetime:
  return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


# A registry's upload times (UTC): jax and jaxlib 0.10.0 on 2026-07-14, ml-dtypes 0.5.4 the
# same day, numpy 2.4.6 on 2026-05-02 and flax 0.12.8 on 2026-08-20; the releases before the
# good day and after the bad day are outside the walk.
REGISTRY = {
    "jax": {"0.9.2": _at("2026-02-10T09:00"), "0.10.0": _at("2026-07-14T18:30"),
            "0.10.2": _at("2026-09-15T00:00")},
    "jaxlib": {"0.9.2": _at("2026-02-10T08:00"), "0.10.0": _at("2026-07-14T17:00")},
    "ml-dtypes": {"0.5.3": _at("2026-01-01T00:00"), "0.5.4": _at("2026-07-14T23:59")},
    "numpy": {"2.4.5": _at("2026-02-01T00:00"), "2.4.6": _at("2026-05-02T12:00")},
    "flax": {"0.12.6": _at("2026-02-20T00:00"), "0.12.8": _at("2026-08-20T00:00")},
}


def world(day: dt.date) -> dict[str, str]:
  """The newest release of each package uploaded by the end of ``day``: what uv resolves."""
  end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.UTC)
  return {name: max((v for v, when in releases.items() if when < end), key=lambda v: tuple(
      map(int, v.split("."))))
          for name, releases in REGISTRY.items()}


GOOD_DAY, BAD_DAY = dt.date(2026, 3, 1), dt.date(2026, 9, 1)


def test_upload_days_are_the_days_between_on_which_a_release_appeared():
  assert date_plan.upload_days(REGISTRY, GOOD_DAY, BAD_DAY) == [
      dt.date(2026, 5, 2), dt.date(2026, 7, 14), dt.date(2026, 8, 20)]


def test_the_world_on_a_day_is_what_was_uploaded_by_its_end():
  assert date_plan.exclude_newer(dt.date(2026, 7, 14)) == "2026-07-15T00:00:00Z"
  assert world(dt.date(2026, 7, 14))["jax"] == "0.10.0"
  assert world(dt.date(2026, 7, 13))["jax"] == "0.9.2"


def test_changes_and_singles_pair_jax_with_its_jaxlib():
  old, new = world(dt.date(2026, 7, 13)), world(dt.date(2026, 7, 14))
  assert date_plan.changes(old, new) == [
      "jax 0.9.2 -> 0.10.0", "jaxlib 0.9.2 -> 0.10.0", "ml-dtypes 0.5.3 -> 0.5.4"]
  assert date_plan.singles(old, new) == [{"jax": "0.10.0", "jaxlib": "0.10.0"},
                                         {"ml-dtypes": "0.5.4"}]
  assert date_plan.changes({"a": "1"}, {"b": "2"}) == ["a 1 -> (none)", "b (none) -> 2"]
  assert date_plan.applied({"a": "1", "c": "3"}, {"a": None, "b": "2"}) == {"b": "2", "c": "3"}


def _runner(moves):
  """A step stand-in: records on the first call; a set moves the numbers when ``moves`` says."""
  calls = []

  def run_step(n, day, requirements, record):
    calls.append((day, tuple(requirements)))
    step = Step(day, label=str(day))  # type: ignore[arg-type]
    if record:
      step.verdict = RECORDED
    else:
      step.verdict = MOVED if moves(requirements) else GOOD
    return step

  return run_step, calls


def test_date_walk_names_the_first_day_everything_on_it_and_the_change_that_moved():
  run_step, calls = _runner(lambda reqs: "jax==0.10.0" in reqs)
  said = []
  points = [GOOD_DAY, *date_plan.upload_days(REGISTRY, GOOD_DAY, BAD_DAY), BAD_DAY]
  found = bisect_dates.date_walk(points, world, run_step, said.append)
  assert found.exit_code == 1
  assert found.answer == (
      "first moved: 2026-07-14: jax 0.9.2 -> 0.10.0, jaxlib 0.9.2 -> 0.10.0, ml-dtypes 0.5.3 -> "
      "0.5.4 (last good: 2026-05-02); alone, jax 0.9.2 -> 0.10.0, jaxlib 0.9.2 -> 0.10.0 moves it")
  # Recorded on the good day, checked on the bad; then 07-14 (the middle), then 05-02; then
  # each change alone on 05-02's set.
  assert [day for day, _ in calls[:4]] == [GOOD_DAY, BAD_DAY, dt.date(2026, 7, 14),
                                          dt.date(2026, 5, 2)]
  alone = [set(reqs) for _, reqs in calls[4:]]
  base = set(date_plan.pinned(world(dt.date(2026, 5, 2))))
  assert alone == [base - {"jax==0.9.2", "jaxlib==0.9.2"} | {"jax==0.10.0", "jaxlib==0.10.0"},
                   base - {"ml-dtypes==0.5.3"} | {"ml-dtypes==0.5.4"}]
  assert said[-1].startswith("bisect: step 6: alone: ml-dtypes 0.5.3 -> 0.5.4: good")


def test_date_walk_says_when_only_the_combination_installs():
  # A stand-in where only the two days' whole sets install: no change installs alone.
  points = [dt.date(2026, 7, 13), dt.date(2026, 7, 14)]
  ends = {points[0]: world(points[0]), points[1]: world(points[1])}
  installs = {"jax": "0.10.0", "jaxlib": "0.10.0"}

  def resolve(day):
    return ends[day]

  def run_step(n, day, requirements, record):
    step = Step(day, label=str(day))  # type: ignore[arg-type]
    complete = set(requirements) in ({*date_plan.pinned(ends[points[0]])},
                                     {*date_plan.pinned(ends[points[1]])})
    step.verdict = (RECORDED if record else SKIP if not complete
                    else MOVED if all(f"{k}=={v}" in requirements for k, v in installs.items())
                    else GOOD)
    return step

  found = bisect_dates.date_walk(points, resolve, run_step, lambda line: None)
  assert found.answer.endswith("; no change installs alone: only the combination installs")


def test_date_walk_with_the_bad_day_passing_says_nothing_moved():
  run_step, _ = _runner(lambda reqs: False)
  found = bisect_dates.date_walk([GOOD_DAY, BAD_DAY], world, run_step, lambda line: None)
  assert (found.exit_code, found.answer) == (
      0, "nothing moved: 2026-09-01 passes against the baselines recorded with 2026-03-01; "
         "nothing to bisect")


def test_date_walk_does_not_check_a_day_whose_set_is_a_checked_days():
  # 08-20 (flax) moves; 05-02 and 07-14 are checked, 08-20 is the bad day's set already.
  run_step, calls = _runner(lambda reqs: "flax==0.12.8" in reqs)
  points = [GOOD_DAY, *date_plan.upload_days(REGISTRY, GOOD_DAY, BAD_DAY), BAD_DAY]
  found = bisect_dates.date_walk(points, world, run_step, lambda line: None)
  assert found.answer == "first moved: 2026-08-20: flax 0.12.6 -> 0.12.8 (last good: 2026-07-14)"
  assert [day for day, _ in calls] == [GOOD_DAY, BAD_DAY, dt.date(2026, 7, 14)]
  # The step whose report the command prints: the bad day's, which holds 08-20's set.
  assert found.moved is not None and found.moved.release == BAD_DAY


def test_read_upload_times_takes_each_releases_first_file_and_refuses_an_index_without_them():
  page = {"files": [
      {"filename": "jax-0.10.0-py3-none-any.whl", "upload-time": "2026-07-14T18:30:00.1Z"},
      {"filename": "jax-0.10.0.tar.gz", "upload-time": "2026-07-14T18:00:00Z"},
      {"filename": "jax-0.9.2.tar.gz", "upload-time": "2026-02-10T09:00:00Z"}]}
  assert date_plan.read_upload_times(page, "https://pypi.org/simple") == {
      "0.10.0": _at("2026-07-14T18:00"), "0.9.2": _at("2026-02-10T09:00")}
  with pytest.raises(RehearsalError, match=r"the index https://mirror.example/simple gives no "
                     r"upload times \(PEP 700's upload-time\) for jax-0.9.2.tar.gz"):
    date_plan.read_upload_times({"files": [{"filename": "jax-0.9.2.tar.gz"}]},
                                "https://mirror.example/simple")


def test_dated_locations_leave_out_local_ones_with_a_line_each():
  settings = PipSettings(extra_index_urls=("file:///srv/pypi/simple", "https://m.example/simple"),
                         find_links=("/srv/wheels",))
  assert date_plan.dated_locations(settings) == (
      ["https://pypi.org/simple", "https://m.example/simple"],
      ["left out file:///srv/pypi/simple: a local index has no upload times",
       "left out find-links /srv/wheels: a folder of files has no upload times"])


def test_bisect_dates_refuses_bad_dates_and_a_set_that_does_not_change(monkeypatch):
  assert bisect_dates.bisect_dates("2026-13-01", "2026-09-01").error == (
      "bisect: --good-date '2026-13-01' is not a date; give it as YYYY-MM-DD, e.g. --good-date "
      "2026-03-01.")
  assert bisect_dates.bisect_dates("2026-09-01", "2026-03-01").error.startswith(
      "bisect: --good-date 2026-09-01 is not before --bad-date 2026-03-01")
  found = bisect_dates.bisect_dates("2026-03-01", "2026-03-02", resolver=lambda day: {"a": "1"},
                                    registry=lambda name: {})
  assert (found.exit_code, found.answer) == (
      0, "nothing changed: the set resolves alike on 2026-03-01 and 2026-03-02")


@pytest.mark.parametrize("argv, error", [
    (["--good-date", "2026-03-01"], "give both --good-date and --bad-date"),
    (["--good-date", "2026-03-01", "--bad-date", "2026-09-01", "--good", "jax==0.9.0"],
     "--good-date and --bad-date bisect the whole set by date; give them without --good, "
     "--bad, --resolve or --pre"),
    (["--good", "jax==0.9.0"], "give --good and --bad (requirement sets"),
])
def test_cli_bisect_by_date_refuses_mixed_or_missing_ends(capsys, argv, error):
  from nnx_pool.regression.cli import main

  assert main(["bisect", *argv]) == 2
  assert f"error: bisect: {error}" in capsys.readouterr().err
