"""The four commands behind the CLI: ``record``, ``check``, ``diff`` and ``info``.

Each takes plain arguments, returns a :class:`~nnx_pool.regression.report.Report`, and
never prints; :mod:`nnx_pool.regression.cli` renders it. ``record``, ``check`` and ``diff``
work on a batch baseline and live in the batch's room (:mod:`nnx_pool.regression.batch`);
``record`` and ``check`` call an optional ``progress(n, total, case_name)`` before each case
(the CLI's progress line). The CLI calls them through this module.
"""

from __future__ import annotations

from .batch.baseline import KIND, load
from .batch.check import check
from .batch.diff import diff
from .batch.record import record
from .report import Report
from .stamp import collect_stamp

__all__ = ["KIND", "check", "diff", "info", "load", "record"]


def info() -> Report:
  """The current environment stamp."""
  return Report(command="info", stamp=collect_stamp())
