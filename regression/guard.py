"""Numeric baselines of your own model: what the ``nnx_regression`` fixture does, without pytest.

:class:`Guard` keeps baselines in one directory and offers the fixture's two checks::

  from nnx_pool.regression.guard import Guard

  guard = Guard("baselines")
  guard.check("logits", model, x)                      # the outputs of model(x)
  guard.check_grad("grads", loss_fn, model, x, y)      # loss_fn(model, x, y) and its gradient

The first call of a name records its baseline and returns an :class:`Outcome` saying so
(the fixture fails the test then, asking for a rerun); later calls compare with it and
raise :class:`RegressionFailure`, whose message is the report, when anything moved. The
pytest fixture (:mod:`nnx_pool.regression.pytest_plugin`) is this class with a path per
test module and pytest's options. The numeric work is in the fixture's room,
:mod:`nnx_pool.regression.fixture`. Where JAX runs several processes (``jax.distributed``),
every process calls the same checks on the same global arrays, and only process 0 reads
and writes (:mod:`nnx_pool.regression.processes.across`).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flax import nnx

from .constants import CHECK_ONLY_ENV, NAME, WEIGHTS_DIR, baseline_name_problem
from .fixture import comparison, files, running
from .fixture.recording import Recording
from .fixture.weight_sets import load_weight_set
from .processes.arrays import layout_line
from .processes.group import current as processes_group
from .report import Report, render
from .stamp import collect_stamp
from .store import BaselineError

# A failure's text lists at most this many rows, the worst first; the JSON and HTML all.
MAX_ROWS = 20


@dataclasses.dataclass
class Outcome:
  """What a check did.

  Attributes:
    status: ``passed``, ``written`` (no baseline: one was recorded), ``updated``
      (re-recorded on request), ``failed`` or ``refused`` (nothing could be compared or
      written: a missing baseline in check-only mode, non-finite outputs, a damaged file).
    path: the baseline directory.
    message: what to tell the user ("" when it passed).
    report: the comparison, when one was made.
    written: what a write put on disk (its size), when one was made.
    obtained: where a failing check wrote what it obtained, else None.
  """

  status: str
  path: Path
  message: str = ""
  report: Report | None = None
  written: files.Written | None = None
  obtained: Path | None = None


@dataclasses.dataclass
class Plan:
  """What a check does with its baseline: ``path``; whether it ``exists``; whether to
  ``compare`` with it (else write it); the baseline read (``base``) and its stored
  ``weights`` (``store_params``), when comparing."""

  path: Path
  exists: bool
  compare: bool
  base: Any = None
  weights: Any = None


class RegressionFailure(AssertionError):
  """A check failed; ``outcome`` says how (its message is this exception's)."""

  def __init__(self, outcome: Outcome):
    super().__init__(outcome.message)
    self.outcome = outcome


class RegressionNote(UserWarning):
  """What a check wants its user to know without failing: a passing refactor that renamed
  the model's variables, stored weights that a fresh initialisation no longer gives, an
  array recorded with a floored tolerance."""


def _validate(name: Any, rtol: Any, atol: Any, allow_nonfinite: Any, store_params: Any,
              eager: Any = None, rename: Any = None) -> None:
  if not isinstance(name, str) or not NAME.match(name):
    raise ValueError(f"`name` must be letters, digits and _.- only; got {name!r}.")
  for bound, label in ((rtol, "rtol"), (atol, "atol")):
    if bound is not None and not (isinstance(bound, (int, float)) and not isinstance(bound, bool)
                                  and bound >= 0):
      raise ValueError(f"`{label}` must be a non-negative number or None; got {bound!r}.")
  for flag, label in ((allow_nonfinite, "allow_nonfinite"), (store_params, "store_params")):
    if not isinstance(flag, bool):
      raise TypeError(f"`{label}` must be a bool; got {flag!r}.")
  if eager is not None and not isinstance(eager, bool):
    raise TypeError(f"`eager` must be None (the default), True or False; got {eager!r}.")
  if rename is not None and not callable(rename) and not (
      isinstance(rename, Mapping) and all(isinstance(k, str) and isinstance(v, str) and k and v
                                          for k, v in rename.items())):
    raise TypeError(f"`rename` must be a mapping of path parts to new ones, e.g. "
                    f"{{'se.conv_reduce': 'se.fc1'}}, or a function of a dotted path; got "
                    f"{rename!r}.")


def stamp_label(stamp: Mapping[str, Any]) -> str:
  """``jax 0.10.2, flax 0.12.8, cpu`` for messages."""
  versions = stamp.get("versions", {})
  backend = stamp.get("backend", {})
  return f"jax {versions.get('jax')}, flax {versions.get('flax')}, {backend.get('platform')}"


def merged_keywords(call_kwargs: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
  """The keyword arguments a check passes to the model: ``**kwargs`` and ``call_kwargs``
  (for names that are the check's own options, :data:`OWN_OPTIONS`), which may not share
  a name."""
  if call_kwargs is None:
    return dict(kwargs)
  if not isinstance(call_kwargs, Mapping) or not all(isinstance(k, str) for k in call_kwargs):
    raise TypeError(f"`call_kwargs` must be a dict of keyword arguments for the call; got "
                    f"{call_kwargs!r}.")
  both = sorted(set(call_kwargs) & set(kwargs))
  if both:
    raise ValueError(f"call keyword {both[0]!r} is given twice, as a keyword argument and in "
                     f"`call_kwargs`; pass it once.")
  return {**kwargs, **call_kwargs}


def _told(outcome: Outcome, rec: Recording | None, name: str) -> Outcome:
  """Warns what a check has to say without failing: a refactor that passed (its headline's
  one line), results recorded with a floored tolerance."""
  report = outcome.report
  if outcome.status == "passed" and report is not None and report.headline:
    outcome.message = f"nnx_regression: {name!r} passed; " + "; ".join(report.headline)
    warnings.warn(outcome.message, RegressionNote, stacklevel=3)
  if outcome.status in ("written", "updated") and rec is not None and rec.floored():
    keys = rec.floored()
    warnings.warn(
        f"nnx_regression: {name!r}: {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''} "
        f"({len(keys)} result(s)) hold no normal number (all zero or subnormal), so their "
        "tolerance could not follow their scale and was floored: they must stay (almost) "
        "exactly zero. Pass atol= if they may move.", RegressionNote, stacklevel=3)
  return outcome


class Guard:
  """Baselines of a model's outputs and gradients in one directory.

  Args:
    directory: where the baselines go, one directory per name (``directory/<name>/``);
      weight sets kept with ``store_params=True`` go to ``directory/../_weights/``.
    update: re-record every baseline checked instead of comparing.
    check_only: never write a baseline: a missing one is refused (default: read
      ``NNX_REGRESSION_CHECK_ONLY`` from the environment).
    test: what recorded the baselines, stored in their manifests (the fixture's test id).
    stamp: the environment stamp to record (default: collected on first use).
  """

  def __init__(self, directory: str | os.PathLike, *, update: bool = False,
               check_only: bool | None = None, test: str = "",
               stamp: Mapping[str, Any] | None = None):
    self.directory = Path(directory)
    self.update = update
    if check_only is None:
      check_only = os.environ.get(CHECK_ONLY_ENV, "") not in ("", "0")
    self.check_only = check_only
    self.test = test
    self._stamp = dict(stamp) if stamp is not None else None

  @property
  def stamp(self) -> dict[str, Any]:
    """The stamp recorded with each baseline (collected once)."""
    if self._stamp is None:
      self._stamp = collect_stamp()
    return self._stamp

  def path_for(self, name: str) -> Path:
    """The baseline directory of ``name``."""
    return self.directory / name

  def check(self, name: str, module_or_fn: Any, *inputs: Any, rtol: float | None = None,
            atol: float | None = None, allow_nonfinite: bool = False,
            store_params: bool = False, eager: bool | None = None, rename: Any = None,
            call_kwargs: Mapping[str, Any] | None = None, **kwargs: Any) -> Outcome:
    """Compares ``module_or_fn(*inputs, **kwargs)`` under ``jax.jit`` with the baseline ``name``.

    Args:
      name: the baseline's name (letters, digits and ``_.-``).
      module_or_fn: an ``nnx.Module`` or a function of arrays.
      *inputs: the arrays to call it with.
      rtol, atol: the output tolerance (default: per dtype, kind ``model``, its ``atol``
        scaled to each baseline array's magnitude: :mod:`nnx_pool.regression.tolerance`).
      allow_nonfinite: record outputs that hold NaN or infinity (default: refuse them).
      store_params: store the module's weights whole (once per set of weights, shared by
        every baseline that stores the same) and load them into it before it runs, so that
        a changed initialisation cannot move an output; by default only their fingerprint
        is stored.
      eager: None (the default): one jitted program, which returns every submodule's
        output beside the result; their fingerprints name the first layer that moved.
        True: also run the call eagerly (every operation compiled one by one: slow on a
        large model) and compare that result with the baseline too, so jit and eager must
        agree. False: jit only, without the submodules' outputs: a failure cannot say
        which layer moved first (only shapes, modes and configurations are compared).
      rename: with ``store_params``, the new names of the stored weights' paths, for a
        model whose variables were renamed: a mapping of path parts
        (``{"se.conv_reduce": "se.fc1"}``) or a function of a dotted path.
      call_kwargs: keyword arguments for the call whose names are this method's own
        (``call_kwargs={"name": ...}``); the others can be given directly.
      **kwargs: keyword arguments for the call (``training=False``): Python bools,
        numbers, strings (static under ``jax.jit``) or arrays (traced, stored as inputs).
        They are recorded, and a change of them is reported first.

    Returns:
      The :class:`Outcome` (``passed``, ``written`` or ``updated``). A pass after a
      refactor that renamed variables (every result within tolerance) warns
      :class:`RegressionNote`, as does recording an all-zero result.

    Raises:
      RegressionFailure: the outputs, the model's schema, modes, weights, inputs or call
        keywords moved, or nothing could be compared; its message is the report.
      ValueError, TypeError: a malformed argument.
    """
    __tracebackhide__ = True
    _validate(name, rtol, atol, allow_nonfinite, store_params, eager, rename)
    keywords = merged_keywords(call_kwargs, kwargs)
    if store_params and not isinstance(module_or_fn, nnx.Module):
      raise TypeError(f"`store_params=True` needs an nnx.Module; got "
                      f"{type(module_or_fn).__name__}, which has no parameters to store.")
    recs: list[Recording] = []

    def execute(weights: Any) -> Recording:
      recs.append(running.execute(module_or_fn, inputs, rtol=rtol, atol=atol, weights=weights,
                                  store_params=store_params, kwargs=keywords, eager=eager,
                                  rename=rename))
      return recs[-1]

    return _told(self._run(name, allow_nonfinite, store_params, execute),
                 recs[-1] if recs else None, name)

  def check_grad(self, name: str, loss_fn: Callable[..., Any], model: nnx.Module, *inputs: Any,
                 wrt: Any = nnx.Param, rtol: float | None = None, atol: float | None = None,
                 allow_nonfinite: bool = False, store_params: bool = False,
                 eager: bool | None = None, rename: Any = None,
                 call_kwargs: Mapping[str, Any] | None = None, **kwargs: Any) -> Outcome:
    """Compares ``loss_fn(model, *inputs, **kwargs)`` and its gradient with the baseline ``name``.

    The gradient is the one ``nnx.grad(loss_fn, argnums=nnx.DiffState(0, wrt))`` gives,
    with respect to the variables of ``model`` that ``wrt`` selects; both are run under
    ``jax.jit`` (and eagerly with ``eager=True``) and compared under the ``gradient``
    tolerances (:mod:`nnx_pool.regression.tolerance`). BatchNorm statistics, Dropout's RNG state and
    any other state of the model may be there, in train or eval mode.

    Args:
      name, rtol, atol, allow_nonfinite, store_params, eager, rename, call_kwargs: as for
        :meth:`check` (``eager=True`` also takes the gradient eagerly, which compiles
        every operation of the backward pass one by one: slow on a large model).
      loss_fn: ``loss_fn(model, *inputs, **kwargs)``, returning a floating scalar.
      model: the ``nnx.Module`` to differentiate.
      *inputs: the arrays to call ``loss_fn`` with after the model.
      wrt: an nnx filter of the variables to differentiate by (default ``nnx.Param``).
      **kwargs: keyword arguments for ``loss_fn``, as for :meth:`check`.

    Returns, Raises: as :meth:`check`.
    """
    __tracebackhide__ = True
    _validate(name, rtol, atol, allow_nonfinite, store_params, eager, rename)
    keywords = merged_keywords(call_kwargs, kwargs)
    recs: list[Recording] = []

    def execute(weights: Any) -> Recording:
      recs.append(running.execute_grad(loss_fn, model, inputs, wrt=wrt, rtol=rtol, atol=atol,
                                       weights=weights, store_params=store_params,
                                       kwargs=keywords, eager=eager, rename=rename))
      return recs[-1]

    return _told(self._run(name, allow_nonfinite, store_params, execute),
                 recs[-1] if recs else None, name)

  # ------------------------------------------------------------------ the one path

  def _refuse(self, path: Path, message: str) -> RegressionFailure:
    return RegressionFailure(Outcome("refused", path, f"nnx_regression: {message}"))

  def _run(self, name: str, allow_nonfinite: bool, store_params: bool,
           execute: Callable[[Any], Recording]) -> Outcome:
    __tracebackhide__ = True
    problem = baseline_name_problem(name)
    if problem:
      raise ValueError(problem)
    if self.directory.name.lower() == WEIGHTS_DIR:
      raise ValueError(f"`directory` {self.directory} is named {WEIGHTS_DIR!r}, where the "
                       "stored weight sets of the baselines beside it lie; choose another.")
    group = processes_group()
    if group is not None:  # several processes: process 0 reads, writes and decides
      from .processes.across import run_across

      return run_across(self, group, name, allow_nonfinite, store_params, execute)
    plan = self._plan(name, store_params)
    return self._finish(name, plan, self._execute(name, plan, execute), allow_nonfinite,
                        store_params)

  def _plan(self, name: str, store_params: bool) -> Plan:
    """What a check will do with its baseline (compare or write), read before it runs."""
    __tracebackhide__ = True
    path = self.path_for(name)
    if self.check_only and self.update:
      raise self._refuse(path, f"update=True writes baselines, and check_only ({CHECK_ONLY_ENV})"
                         " forbids it; drop one of the two.")
    exists = (path / "manifest.json").exists()
    if not exists and self.check_only:
      raise self._refuse(path, (
          f"no baseline for {name!r} at {path}, and none was written ({CHECK_ONLY_ENV} is set: "
          "compare only). Record it in your own environment: run the test once without it."))
    plan = Plan(path, exists, exists and not self.update)
    if plan.compare:
      try:
        plan.base = files.load(path)
        if store_params and plan.base.manifest.get("weights_set"):
          plan.weights = load_weight_set(path, plan.base.manifest)[1]
      except BaselineError as e:
        raise self._refuse(path, str(e)) from None
    return plan

  def _execute(self, name: str, plan: Plan, execute: Callable[[Any], Recording]) -> Recording:
    __tracebackhide__ = True
    try:
      return execute(plan.weights)
    except running.UnstorableLeaf as e:
      raise self._refuse(plan.path, f"{name!r} was not compared or written: {e}") from None
    except ValueError as e:
      if plan.weights is None or "stored weight" not in str(e):
        raise
      raise self._refuse(plan.path, f"{name!r}: {e}") from None

  def _stamp_of(self, rec: Recording) -> dict[str, Any]:
    """The stamp of a run: this environment's, and how its inputs lay."""
    return {**self.stamp, "layout": rec.layout} if rec.layout else self.stamp

  def _finish(self, name: str, plan: Plan, rec: Recording, allow_nonfinite: bool,
              store_params: bool) -> Outcome:
    """Compares the run with the baseline, or writes it: the outcome."""
    __tracebackhide__ = True
    path = plan.path
    if plan.compare:
      return self._compare(name, path, plan.base, rec, store_params)
    nonfinite = None if allow_nonfinite else running.nonfinite_outputs(rec)
    if nonfinite:
      raise self._refuse(path, (
          f"{name!r} was not recorded: its outputs are not all finite ({nonfinite}). Fix the "
          "model, or pass allow_nonfinite=True if they should be."))
    try:
      written = files.write(path, rec, self._stamp_of(rec), nodeid=self.test, name=name)
    except OSError as e:  # a read-only tree, a full disk, a directory holding other files
      raise self._refuse(path, f"{name!r} was not recorded: could not write {path} "
                         f"({e.strerror or e}); nothing was replaced.") from None
    if plan.exists:
      return Outcome("updated", path, f"nnx_regression: updated {name!r} at {path} "
                     f"({written.describe()}).", written=written)
    return Outcome("written", path, (
        f"nnx_regression: no baseline for {name!r}; wrote one to {path} ({written.describe()}; "
        f"{stamp_label(self.stamp)}). Rerun to compare."), written=written)

  def _compare(self, name: str, path: Path, base: Any, rec: Recording,
               store_params: bool) -> Outcome:
    __tracebackhide__ = True
    if rec.fresh is not None:
      rec.weights_set = base.manifest.get("weights_set")
    report = comparison.compare(base, rec, self._stamp_of(rec), name=name)
    if store_params and not base.manifest.get("weights_set"):
      report.notes.append("store_params=True, but the baseline holds no weights (recorded "
                          "without it): the model ran on its own; pass --nnx-regression-update "
                          "to store them")
    if report.exit_code == 0:
      moved = layout_line(base.manifest.get("stamp", {}).get("layout"), rec.layout)
      report.headline += [moved] if moved else []
      if not self.check_only:  # check-only mode writes and removes nothing in the tree
        files.remove_obtained(path)
      return Outcome("passed", path, report=report)
    obtained = self._keep_obtained(name, path, rec, report)
    cause = f": {report.cause}" if report.cause else ""
    message = (f"nnx_regression: {name!r} differs from its baseline {path}{cause}\n"
               f"{render(report, limit=MAX_ROWS)}")
    raise RegressionFailure(Outcome("failed", path, message, report, obtained=obtained))

  def _keep_obtained(self, name: str, path: Path, rec: Recording,
                     report: Report) -> Path | None:
    """Writes what a failing check obtained, and says where in a note of the report; a write
    that fails is that one note, and the report stays whole. In check-only mode the file
    goes to a temporary directory, never beside the baseline."""
    where = None if self.check_only else files.obtained_path(path)
    try:
      obtained = files.write_obtained(path, rec, self._stamp_of(rec), nodeid=self.test, name=name,
                                      check_only=self.check_only)
    except OSError as e:  # a read-only tree, a full disk: the report matters more
      report.notes.append(
          f"what this run obtained was not written ({where or 'a temporary directory'}: "
          f"{e.strerror or e}); the report above is whole, but `nnx-pool-regression report` "
          "cannot draw it again")
      return None
    again = (f"`nnx-pool-regression report {path} --html OUT`" if not self.check_only else
             f"`nnx-pool-regression report {path} --obtained {obtained} --html OUT`")
    kept = (f" ({CHECK_ONLY_ENV} is set: nothing was written beside the baseline)"
            if self.check_only else "")
    report.notes.append(f"what this run obtained is in {obtained}{kept}: {again} draws this "
                        "report again")
    return obtained
