"""pytest plugin: the ``nnx_regression`` fixture, version-stamped baselines for your models.

A test hands the fixture a name, an NNX module or a function, and inputs::

  def test_encoder(nnx_regression):
    model = Encoder(rngs=nnx.Rngs(0))
    nnx_regression.check("encoder_fwd", model, x)

The first run writes a baseline to ``<test dir>/_regression/<test module>/<name>/``
(the same stamped manifest + ``.npz`` format as ``python -m nnx_pool.regression``) and
fails, saying so. Later runs compile the call, warm it up, run it under
``jax.jit`` and eagerly, and compare both with the baseline under per-dtype
tolerances (:mod:`nnx_pool.regression.tolerance`, kind ``"model"``; pass ``rtol``/``atol``
to override), reporting a table and what changed in the environment. The
module's ``nnx.Param`` weights and the inputs are stored too: if they changed
(a new PRNG default, say), the failure says so. A baseline whose floating
outputs hold NaN or infinity is refused (``chex.assert_tree_all_finite``), as
that is nearly always a bug being frozen in; pass ``allow_nonfinite=True`` when
the non-finite values are the point.

Options:

* ``--nnx-regression-update`` rewrites the baselines of the tests that run.
* ``NNX_REGRESSION_CHECK_ONLY=1`` in the environment (:data:`CHECK_ONLY_ENV`) forbids
  writing: a missing baseline fails its test and nothing is written, and
  ``--nnx-regression-update`` is a usage error. ``rehearse --pytest`` runs your tests
  this way, so that a rehearsal never records a baseline.

At the end of a session, the terminal summary lists baselines written or
updated, and baselines next to the test modules that ran which no test used
(only for modules that ran in full, and not after ``-x`` stopped the run).

Register with the ``pytest11`` entry point, or ``-p nnx_pool.regression.pytest_plugin``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from nnx_pool.regression.constants import CHECK_ONLY_ENV, NAME

KIND = "pytest"
DIRNAME = "_regression"


@dataclasses.dataclass
class _SessionState:
  update: bool
  check_only: bool = False
  used: dict[Path, str] = dataclasses.field(default_factory=dict)
  written: list[Path] = dataclasses.field(default_factory=list)
  updated: list[Path] = dataclasses.field(default_factory=list)
  modules: set[Path] = dataclasses.field(default_factory=set)
  partial: set[Path] = dataclasses.field(default_factory=set)
  stopped_early: bool = False
  stamp: dict[str, Any] | None = None


_STATE = pytest.StashKey[_SessionState]()


def pytest_addoption(parser: pytest.Parser) -> None:
  group = parser.getgroup("nnx-regression", "nnx-pool numeric regression baselines")
  group.addoption(
      "--nnx-regression-update", action="store_true", default=False,
      help="rewrite the nnx_regression baselines of the tests that run",
  )


def check_only() -> bool:
  """Whether :data:`CHECK_ONLY_ENV` forbids writing baselines in this process."""
  return os.environ.get(CHECK_ONLY_ENV, "") not in ("", "0")


def pytest_configure(config: pytest.Config) -> None:
  update = bool(config.getoption("nnx_regression_update"))
  if update and check_only():
    raise pytest.UsageError(
        f"--nnx-regression-update writes baselines, and {CHECK_ONLY_ENV}="
        f"{os.environ[CHECK_ONLY_ENV]} forbids it; drop one of the two.")
  config.stash[_STATE] = _SessionState(update=update, check_only=check_only())


def pytest_deselected(items: list[pytest.Item]) -> None:
  for item in items:
    state = item.config.stash.get(_STATE, None)
    if state is not None:
      state.partial.add(Path(item.path))


def pytest_collection_finish(session: pytest.Session) -> None:
  state = session.config.stash[_STATE]
  state.modules.update(Path(item.path) for item in session.items)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
  state = session.config.stash[_STATE]
  state.stopped_early = bool(session.shouldfail or session.shouldstop) or exitstatus == 2


def _baselines_under(module: Path) -> list[Path]:
  root = module.parent / DIRNAME / module.stem
  if not root.is_dir():
    return []
  return sorted(p for p in root.iterdir() if (p / "manifest.json").is_file())


def unused_baselines(state: _SessionState) -> list[Path]:
  """Baselines next to fully-run test modules that no ``check`` call used."""
  unused = []
  for module in sorted(state.modules - state.partial):
    unused += [p for p in _baselines_under(module) if p.resolve() not in state.used]
  return unused


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
  state = config.stash.get(_STATE, None)
  if state is None:
    return
  lines = []
  if state.written:
    lines.append(f"wrote {len(state.written)} new baseline(s) (rerun to compare):")
    lines += [f"  {p}" for p in state.written]
  if state.updated:
    lines.append(f"updated {len(state.updated)} baseline(s) (--nnx-regression-update):")
    lines += [f"  {p}" for p in state.updated]
  if state.stopped_early:
    if state.modules:
      lines.append("unused baselines not checked: the session stopped early")
  else:
    unused = unused_baselines(state)
    if unused:
      lines.append(f"{len(unused)} unused baseline(s) (no test used them this session; "
                   "delete them or fix the test names):")
      lines += [f"  {p}" for p in unused]
  if lines:
    terminalreporter.section("nnx_regression")
    for line in lines:
      terminalreporter.write_line(line)


class Regression:
  """The object the ``nnx_regression`` fixture returns."""

  def __init__(self, request: pytest.FixtureRequest):
    self._request = request
    self._state = request.config.stash[_STATE]

  def path_for(self, name: str) -> Path:
    """The baseline directory of ``name`` for the requesting test module."""
    module = Path(self._request.node.path)
    return module.parent / DIRNAME / module.stem / name

  def check(
      self, name: str, module_or_fn: Any, *inputs: Any,
      rtol: float | None = None, atol: float | None = None, allow_nonfinite: bool = False,
  ) -> None:
    """Compares ``module_or_fn(*inputs)`` with the stored baseline ``name``.

    Args:
      name: the baseline's name, unique within the test module (letters,
        digits and ``_.-``).
      module_or_fn: an ``nnx.Module`` or a function of arrays.
      *inputs: the arrays to call it with.
      rtol: relative tolerance for floating outputs (default: per dtype).
      atol: absolute tolerance for floating outputs (default: per dtype).
      allow_nonfinite: record a baseline whose outputs hold NaN or infinity
        (default: refuse it, saying which output).

    Raises:
      ValueError: ``name`` is malformed or already used in this session.
      TypeError: an input is not an array, or ``allow_nonfinite`` is not a bool.
    """
    __tracebackhide__ = True
    if not isinstance(name, str) or not NAME.match(name):
      raise ValueError(f"`name` must be letters, digits and _.- only; got {name!r}.")
    for bound, label in ((rtol, "rtol"), (atol, "atol")):
      if bound is not None and not (isinstance(bound, (int, float)) and bound >= 0):
        raise ValueError(f"`{label}` must be a non-negative number or None; got {bound!r}.")
    if not isinstance(allow_nonfinite, bool):
      raise TypeError(f"`allow_nonfinite` must be a bool; got {allow_nonfinite!r}.")
    path = self.path_for(name)
    key = path.resolve()
    nodeid = self._request.node.nodeid
    if key in self._state.used:
      raise ValueError(
          f"`name` {name!r} is already used by {self._state.used[key]} in this session; "
          "baseline names must be unique within a test module."
      )
    self._state.used[key] = nodeid
    from nnx_pool.regression import _fixture_core

    if self._state.stamp is None:
      from nnx_pool.regression.stamp import collect_stamp

      self._state.stamp = collect_stamp(git_dir=self._request.config.rootpath)
    run = _fixture_core.execute(module_or_fn, inputs, rtol=rtol, atol=atol)
    exists = (path / "manifest.json").exists()
    if not exists and self._state.check_only:
      pytest.fail(
          f"nnx_regression: no baseline for {name!r} at {path}, and none was written "
          f"({CHECK_ONLY_ENV} is set: compare only). Record it in your own environment: "
          "run the test once without it.",
          pytrace=False,
      )
    if self._state.update or not exists:
      nonfinite = None if allow_nonfinite else _fixture_core.nonfinite_outputs(run)
      if nonfinite:
        pytest.fail(
            f"nnx_regression: {name!r} was not recorded: its outputs are not all finite "
            f"({nonfinite}). Fix the model, or pass allow_nonfinite=True if they should be.",
            pytrace=False,
        )
      _fixture_core.write(path, run, self._state.stamp, nodeid=nodeid, name=name)
      if exists:
        self._state.updated.append(path)
        return
      self._state.written.append(path)
      pytest.fail(
          f"nnx_regression: no baseline for {name!r}; wrote one to {path} "
          f"({_fixture_core.stamp_label(self._state.stamp)}). Rerun to compare.",
          pytrace=False,
      )
    failure = _fixture_core.compare(path, run, self._state.stamp, name=name)
    if failure:
      pytest.fail(failure, pytrace=False)


@pytest.fixture
def nnx_regression(request: pytest.FixtureRequest) -> Regression:
  """Compares a module's or function's outputs with a stamped baseline beside the test."""
  return Regression(request)
