"""pytest plugin: the ``nnx_regression`` fixture, version-stamped baselines for your models.

A test hands the fixture a name, an NNX module or a function, and inputs::

  def test_encoder(nnx_regression):
    model = Encoder(rngs=nnx.Rngs(0))
    nnx_regression.check("encoder_fwd", model, x)

The first run writes a baseline to ``<test dir>/_regression/<test module>/<name>/``
(the same stamped manifest + ``.npz`` format as ``python -m nnx_pool.regression``) and
fails, saying so. Later runs compile the call, warm it up, run it under
``jax.jit`` (one program that also returns every submodule's output, to name the first
layer that moved), and compare it with the baseline under per-dtype
tolerances (:mod:`nnx_pool.regression.tolerance`, kind ``"model"``; pass ``rtol``/``atol``
to override), reporting a table and what changed in the environment. The
module's ``nnx.Param`` weights and the inputs are stored too: if they changed
(a new PRNG default, say), the failure says so. A baseline whose floating
outputs hold NaN or infinity is refused (``chex.assert_tree_all_finite``), as
that is nearly always a bug being frozen in; pass ``allow_nonfinite=True`` when
the non-finite values are the point.

Options:

* ``--nnx-regression-update`` rewrites the baselines of the tests that run.
* ``--nnx-regression-eager`` also runs every check eagerly (``eager=True`` unless a check
  passes ``eager`` itself), comparing the eager result with the baseline too: jit and eager
  must agree. It compiles every operation one by one: most of a check's time on a large
  model.
* ``--nnx-regression-jit-only`` runs every check under ``jax.jit`` only (``eager=False``
  unless a check passes ``eager`` itself): no submodule's output is returned, so a failure
  cannot name the first layer that moved.
* ``NNX_REGRESSION_CHECK_ONLY=1`` in the environment (:data:`CHECK_ONLY_ENV`) forbids
  writing: a missing baseline fails its test and nothing is written, a failing check's
  obtained results go to a temporary directory (the report names it), and
  ``--nnx-regression-update`` is a usage error. ``rehearse --pytest`` runs your tests
  this way, so that a rehearsal never writes into the tree.

At the end of a session, the terminal summary lists baselines written or
updated, and baselines next to the test modules that ran which no test used
(only for modules that ran in full, and not after ``-x`` stopped the run).

Under ``nnx-pool-regression launch -n N -- pytest`` (its variables set) the plugin starts
JAX's distributed runtime and refuses pytest-xdist; process 0 writes and lists the
baselines (:mod:`nnx_pool.regression.processes`). Without them it never starts the runtime.

Register with the ``pytest11`` entry point, or ``-p nnx_pool.regression.pytest_plugin``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from .constants import CHECK_ONLY_ENV, baseline_name_problem

KIND = "pytest"
DIRNAME = "_regression"
# The user property of a failing check: [its baseline, where what it obtained was written].
OBTAINED = "nnx_regression_obtained"
# Under pytest-xdist: the directory (made by the controller, handed to each worker) in which
# every worker claims the baselines its tests use, so that two tests of two workers cannot
# use one name; the key of pytest-xdist's workerinput that names it.
_CLAIMS = "nnx_regression_claims"


@dataclasses.dataclass
class _SessionState:
  update: bool
  check_only: bool = False
  directory: Path | None = None
  html: Path | None = None
  used: dict[Path, str] = dataclasses.field(default_factory=dict)
  written: list[tuple[Path, str]] = dataclasses.field(default_factory=list)
  updated: list[tuple[Path, str]] = dataclasses.field(default_factory=list)
  modules: set[Path] = dataclasses.field(default_factory=set)
  partial: set[Path] = dataclasses.field(default_factory=set)
  not_passed: set[str] = dataclasses.field(default_factory=set)
  wrote: set[str] = dataclasses.field(default_factory=set)  # tests that recorded a new name
  # Each failing check's baseline, and where what it obtained lies (None: beside it).
  failed_checks: list[tuple[Path, Path | None]] = dataclasses.field(default_factory=list)
  claims: Path | None = None  # pytest-xdist: see _CLAIMS
  own_claims: bool = False  # this process made `claims` (the controller), and removes it
  stopped_early: bool = False
  stamp: dict[str, Any] | None = None
  page: str | None = None


_STATE = pytest.StashKey[_SessionState]()


def pytest_addoption(parser: pytest.Parser) -> None:
  group = parser.getgroup("nnx-regression", "nnx-pool numeric regression baselines")
  group.addoption(
      "--nnx-regression-update", action="store_true", default=False,
      help="rewrite the nnx_regression baselines of the tests that run",
  )
  group.addoption(
      "--nnx-regression-dir", metavar="DIR", default=None,
      help="keep the nnx_regression baselines under DIR (mirroring the test directories "
           "relative to the rootdir) instead of in _regression/ beside each test module",
  )
  group.addoption(
      "--nnx-regression-jit-only", action="store_true", default=False,
      help="run the nnx_regression checks under jax.jit only, without the submodules' "
           "outputs (a failure then cannot name the first layer that moved); a check's own "
           "eager= still decides",
  )
  group.addoption(
      "--nnx-regression-eager", action="store_true", default=False,
      help="also run the nnx_regression checks eagerly, comparing jit and eager with the "
           "baseline (compiles every operation one by one: slow on a large model); a "
           "check's own eager= still decides",
  )
  group.addoption(
      "--nnx-regression-html", metavar="OUT", default=None,
      help="write one HTML page of the session's failing nnx_regression checks to OUT "
           "(needs matplotlib: pip install 'nnx-pool[report]')",
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
  if config.getoption("nnx_regression_jit_only") and config.getoption("nnx_regression_eager"):
    raise pytest.UsageError("--nnx-regression-jit-only and --nnx-regression-eager ask for "
                            "opposite runs; pass one of the two.")
  state = _SessionState(update=update, check_only=check_only())
  directory = config.getoption("nnx_regression_dir")
  if directory is not None:
    state.directory = Path(directory).absolute()
    if state.directory.exists() and not state.directory.is_dir():
      raise pytest.UsageError(f"--nnx-regression-dir {directory}: is not a directory; name a "
                              "directory (it is created if missing).")
  page = config.getoption("nnx_regression_html")
  if page is not None:
    state.html = Path(page).absolute()
    problem = _page_problem(page, state.html)
    if problem:
      raise pytest.UsageError(problem)
  from .processes.initialize import join_problem  # no JAX, unless launched

  problem = join_problem(config.getoption("numprocesses", None), hasattr(config, "workerinput"))
  if problem:
    raise pytest.UsageError(problem)
  workerinput = getattr(config, "workerinput", None)
  if workerinput is not None and workerinput.get(_CLAIMS):
    state.claims = Path(workerinput[_CLAIMS])
  config.stash[_STATE] = state
  config.pluginmanager.register(_Tracker(state), "nnx-regression-tracker")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
  """pytest-xdist's controller, starting a worker: hands it the directory of claims."""
  state = node.config.stash.get(_STATE, None)
  if state is None:
    return
  if state.claims is None:
    state.claims, state.own_claims = Path(tempfile.mkdtemp(prefix="nnx-regression-claims-")), True
  node.workerinput[_CLAIMS] = str(state.claims)


def pytest_unconfigure(config: pytest.Config) -> None:
  state = config.stash.get(_STATE, None)
  if state is not None and state.own_claims and state.claims is not None:
    shutil.rmtree(state.claims, ignore_errors=True)


def _claim(claims: Path, key: Path, nodeid: str) -> str | None:
  """Claims the baseline ``key`` for ``nodeid`` across pytest-xdist's workers; returns the
  test that claimed it first when that is another one (the file's creation is atomic)."""
  claim = claims / hashlib.sha256(str(key).encode()).hexdigest()[:32]
  try:
    fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  except FileExistsError:
    holder = ""
    for _ in range(100):  # the claimant writes its test id right after creating the file
      holder = claim.read_text(encoding="utf-8")
      if holder:
        break
      time.sleep(0.01)
    return None if holder == nodeid else holder or "a test of another pytest-xdist worker"
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    f.write(nodeid)
  return None


def _page_problem(given: str, page: Path) -> str | None:
  """Why the page cannot be written, found before any test runs; None if it can."""
  import importlib.util

  if importlib.util.find_spec("matplotlib") is None:
    return (f"--nnx-regression-html {given}: the page draws its figures with matplotlib, which "
            "is not installed: pip install 'nnx-pool[report]'.")
  if page.is_dir():
    return f"--nnx-regression-html {given}: is a directory; name the file to write."
  if not page.parent.is_dir():
    return f"--nnx-regression-html {given}: directory {page.parent} does not exist."
  return _inside_baseline(given)


def _inside_baseline(given: str | Path) -> str | None:
  """Why the page may not go where ``--nnx-regression-html`` says: inside a baseline's
  directory (the CLI's rule for ``--json``/``--html``); None if it may."""
  from .store import inside_baseline_problem  # the store needs NumPy: not on import

  return inside_baseline_problem("--nnx-regression-html", given)


def baseline_root(config: pytest.Config, module: Path) -> Path:
  """The directory of a test module's baselines: ``<dir>/_regression/<module>``, or
  ``<--nnx-regression-dir>/<dir relative to the rootdir>/<module>``."""
  state = config.stash.get(_STATE, None)
  if state is None or state.directory is None:
    return module.parent / DIRNAME / module.stem
  try:
    relative = module.parent.resolve().relative_to(Path(config.rootpath).resolve())
  except ValueError:  # a test outside the rootdir: keyed by its absolute directory
    relative = Path(*module.parent.resolve().parts[1:])
  return state.directory / relative / module.stem


def pytest_deselected(items: list[pytest.Item]) -> None:
  for item in items:
    state = item.config.stash.get(_STATE, None)
    if state is not None:
      state.partial.add(Path(item.path))


def pytest_collection_finish(session: pytest.Session) -> None:
  state = session.config.stash[_STATE]
  state.modules.update(Path(item.path) for item in session.items)


class _Tracker:
  """Follows test outcomes (also those xdist workers send): which tests did not pass, and
  which checks failed (their baselines, from the reports' user properties)."""

  def __init__(self, state: _SessionState):
    self.state = state

  def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
    if report.failed or report.skipped:
      self.state.not_passed.add(report.nodeid)
    for name, value in getattr(report, "user_properties", ()):
      if name != OBTAINED:
        continue
      baseline, obtained = value if isinstance(value, (list, tuple)) else (value, None)
      check = (Path(baseline), None if obtained is None else Path(obtained))
      if check not in self.state.failed_checks:
        self.state.failed_checks.append(check)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
  state = session.config.stash[_STATE]
  state.stopped_early = bool(session.shouldfail or session.shouldstop) or exitstatus == 2
  from .processes.group import follower, note_exit_status

  note_exit_status(exitstatus)  # what a process out of step ends with
  if state.html is not None and not hasattr(session.config, "workerinput") and follower() is None:
    state.page = write_page(state.failed_checks, state.html)


def write_page(baselines: list[Any], page: Path) -> str:
  """Writes the HTML page of the failing checks listed (each a baseline's path, or ``(path,
  obtained)``); what to print."""
  from .fixture.from_disk import session_report
  from .report import html

  # Again when it is written: this session may have recorded a baseline around it since.
  problem = _inside_baseline(page)
  if problem:
    return f"the HTML report was not written: {problem}"
  report = session_report(baselines)
  try:
    html.write_html(report, page)
  except OSError as e:
    return f"could not write the HTML report {page} ({e.strerror or e})"
  failing = len(baselines)
  return f"HTML report of {failing} failing check(s): {page}"


def unused_baselines(state: _SessionState, config: pytest.Config | None = None
                     ) -> tuple[list[Path], list[tuple[Path, str]]]:
  """Baselines next to fully-run test modules that no ``check`` call used, and those not
  reached (:func:`~nnx_pool.regression.fixture.unused.unused_and_unreached`)."""
  from .fixture.unused import unused_and_unreached

  roots = [module.parent / DIRNAME / module.stem if config is None
           else baseline_root(config, module) for module in sorted(state.modules - state.partial)]
  return unused_and_unreached(roots, state.used, state.not_passed, state.wrote)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
  state = config.stash.get(_STATE, None)
  if state is None:
    return
  from .processes.group import follower

  index = follower()
  if index is not None:  # process 0 writes, lists and draws; this one only ran the checks
    terminalreporter.section("nnx_regression")
    terminalreporter.write_line(f"process {index}: baselines, obtained files and the HTML page "
                                "are written and listed by process 0")
    return
  lines = []
  if state.written:
    lines.append(f"wrote {len(state.written)} new baseline(s) (rerun to compare):")
    lines += [f"  {p} ({size})" for p, size in state.written]
  if state.updated:
    lines.append(f"updated {len(state.updated)} baseline(s) (--nnx-regression-update):")
    lines += [f"  {p} ({size})" for p, size in state.updated]
  if state.stopped_early:
    if state.modules:
      lines.append("unused baselines not checked: the session stopped early")
  else:
    unused, unreached = unused_baselines(state, config)
    if unused:
      lines.append(f"{len(unused)} unused baseline(s) (no test used them this session; "
                   "delete them or fix the test names):")
      lines += [f"  {p}" for p in unused]
    if unreached:
      lines.append(f"{len(unreached)} baseline(s) not reached: the test that records each "
                   "failed, errored or was skipped before its check (keep them):")
      lines += [f"  {p} ({test})" for p, test in unreached]
  if state.page:
    lines.append(state.page)
  if lines:
    terminalreporter.section("nnx_regression")
    for line in lines:
      terminalreporter.write_line(line)


class Regression:
  """The object the ``nnx_regression`` fixture returns: ``check`` and ``check_grad``.

  Both are those of :class:`nnx_pool.regression.guard.Guard`, on the test module's
  baseline directory, failing the test where the guard raises or records.
  """

  def __init__(self, request: pytest.FixtureRequest):
    self._request = request
    self._state = request.config.stash[_STATE]

  def path_for(self, name: str) -> Path:
    """The baseline directory of ``name`` for the requesting test module."""
    return baseline_root(self._request.config, Path(self._request.node.path)) / name

  def _eager(self, eager: bool | None) -> bool | None:
    """A check's ``eager``: its own, else False under ``--nnx-regression-jit-only``, True
    under ``--nnx-regression-eager``, else None (the guard's default)."""
    if eager is None and self._request.config.getoption("nnx_regression_jit_only", False):
      return False
    if eager is None and self._request.config.getoption("nnx_regression_eager", False):
      return True
    return eager

  def check(
      self, name: str, module_or_fn: Any, *inputs: Any,
      rtol: float | None = None, atol: float | None = None, allow_nonfinite: bool = False,
      store_params: bool = False, eager: bool | None = None, rename: Any = None,
      call_kwargs: Any = None, **kwargs: Any,
  ) -> None:
    """Compares ``module_or_fn(*inputs, **kwargs)`` with the stored baseline ``name``.

    Args:
      name: the baseline's name, unique within the test module (letters,
        digits and ``_.-``).
      module_or_fn: an ``nnx.Module`` or a function of arrays.
      *inputs: the arrays to call it with.
      rtol: relative tolerance for floating outputs (default: per dtype).
      atol: absolute tolerance for floating outputs (default: per dtype, scaled to each
        baseline array's magnitude).
      allow_nonfinite: record a baseline whose outputs hold NaN or infinity
        (default: refuse it, saying which output).
      store_params: store the module's weights whole (once per set of weights) and load
        them before running, so a changed initialisation cannot move the outputs (default:
        store a fingerprint of them, which says that the initialisation changed).
      eager: None (the default, unless ``--nnx-regression-jit-only`` or
        ``--nnx-regression-eager`` says otherwise): one jitted program, which also returns
        every submodule's output, to name the first layer that moved; True: also run it
        eagerly, jit and eager both compared; False: jit only, no per-layer values.
      rename: with ``store_params``, the stored weights' new path parts
        (``{"se.conv_reduce": "se.fc1"}``) or a function of a path.
      call_kwargs: call keywords whose names are this method's own options.
      **kwargs: keyword arguments for the call (``training=False``), recorded.

    Raises:
      ValueError: ``name`` is malformed or already used in this session.
      TypeError: an input is not an array, or a flag is not a bool (``eager``: or None).
    """
    __tracebackhide__ = True
    self._run(name, lambda guard: guard.check(
        name, module_or_fn, *inputs, rtol=rtol, atol=atol, allow_nonfinite=allow_nonfinite,
        store_params=store_params, eager=self._eager(eager), rename=rename,
        call_kwargs=call_kwargs, **kwargs))

  def check_grad(
      self, name: str, loss_fn: Any, model: Any, *inputs: Any, wrt: Any = None,
      rtol: float | None = None, atol: float | None = None, allow_nonfinite: bool = False,
      store_params: bool = False, eager: bool | None = None, rename: Any = None,
      call_kwargs: Any = None, **kwargs: Any,
  ) -> None:
    """Compares ``loss_fn(model, *inputs, **kwargs)`` and its gradient by ``wrt`` (default
    ``nnx.Param``) with the stored baseline ``name``; see
    :meth:`nnx_pool.regression.guard.Guard.check_grad`."""
    __tracebackhide__ = True

    def run(guard):
      from flax import nnx

      return guard.check_grad(name, loss_fn, model, *inputs, wrt=nnx.Param if wrt is None else wrt,
                              rtol=rtol, atol=atol, allow_nonfinite=allow_nonfinite,
                              store_params=store_params, eager=self._eager(eager),
                              rename=rename, call_kwargs=call_kwargs, **kwargs)

    self._run(name, run)

  def _run(self, name: str, call: Any) -> None:
    __tracebackhide__ = True
    problem = baseline_name_problem(name)
    if problem:
      raise ValueError(problem)
    path = self.path_for(name)
    key = path.resolve()
    nodeid = self._request.node.nodeid
    holder = self._state.used.get(key)
    if holder is None and self._state.claims is not None:  # another pytest-xdist worker's?
      holder = _claim(self._state.claims, key, nodeid)
    if holder is not None:
      raise ValueError(
          f"`name` {name!r} is already used by {holder} in this session; baseline names "
          f"must be unique within a test module (rename the check of {nodeid} or of "
          f"{holder}). Nothing was compared or written."
      )
    self._state.used[key] = nodeid
    from .guard import Guard, RegressionFailure

    if self._state.stamp is None:
      from .stamp import collect_stamp

      self._state.stamp = collect_stamp(git_dir=self._request.config.rootpath)
    guard = Guard(path.parent, update=self._state.update, check_only=self._state.check_only,
                  test=nodeid, stamp=self._state.stamp)
    failure = None
    try:
      outcome = call(guard)
    except RegressionFailure as e:
      failure = e
    if failure is not None:  # failed outside the except block: no chained copy of the report
      if failure.outcome.obtained is not None:
        self._request.node.user_properties.append(
            (OBTAINED, [str(failure.outcome.path), str(failure.outcome.obtained)]))
      pytest.fail(str(failure), pytrace=False)
    if outcome.status == "updated":
      self._state.updated.append((path, outcome.written.describe()))
    elif outcome.status == "written":
      self._state.written.append((path, outcome.written.describe()))
      self._state.wrote.add(nodeid)
      pytest.fail(outcome.message, pytrace=False)


@pytest.fixture
def nnx_regression(request: pytest.FixtureRequest) -> Regression:
  """Compares a module's or function's outputs with a stamped baseline beside the test."""
  return Regression(request)
