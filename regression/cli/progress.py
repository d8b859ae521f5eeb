"""The progress line: which case, step or figure runs, on one line of stderr that is rewritten
in place and cleared at the end, only when stderr is a terminal; and the step lines of a
command that takes minutes (:func:`step_lines`), printed whatever stderr is."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from typing import TextIO

from ..upgrade.bisect_plan import duration


def _is_terminal(stream: TextIO | None) -> bool:
  try:
    return bool(stream is not None and stream.isatty())
  except (AttributeError, ValueError):  # no isatty, or a closed stream
    return False


def _columns(stream: TextIO) -> int:
  """The terminal's width; a terminal that reports 0 (unknown) falls back to COLUMNS, then 80."""
  try:
    columns = os.get_terminal_size(stream.fileno()).columns
  except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is an OSError
    columns = 0
  return columns or shutil.get_terminal_size().columns


class ProgressLine:
  """``check: case 17/104 max_k2s1_ties_zeros ...``, rewritten in place on one terminal line.

  ``label`` (``check: case``) comes first, then ``n/total`` and the name. Each
  call returns to the start of the line (``\\r``) and overwrites what the previous
  call wrote; :meth:`clear` blanks it. Text is cut to the terminal's width, so the
  line never wraps (a wrapped line cannot be rewritten with ``\\r``).
  """

  def __init__(self, stream: TextIO, label: str):
    self.stream = stream
    self.label = label
    self._shown = 0

  def __call__(self, n: int, total: int, name: str) -> None:
    text = f"{self.label} {n}/{total} {name} ..."[:max(_columns(self.stream) - 1, 1)]
    self.stream.write("\r" + text.ljust(self._shown))
    self.stream.flush()
    self._shown = len(text)

  def clear(self) -> None:
    """Blanks the line, leaving the cursor at its start."""
    if self._shown:
      self.stream.write("\r" + " " * self._shown + "\r")
      self.stream.flush()
      self._shown = 0


@contextlib.contextmanager
def progress_line(label: str | None) -> Iterator[ProgressLine | None]:
  """A progress line on stderr when it is a terminal (else None), cleared on the way out."""
  if label is None or not _is_terminal(sys.stderr):
    yield None
    return
  line = ProgressLine(sys.stderr, label)
  try:
    yield line
  finally:
    line.clear()


class StepLines:
  """Each step of a long command on a line of its own, with the time since the command began:
  ``rehearse: step 2/4, 3 s: installing jax==0.9.2 jaxlib==0.9.2 and nnx-pool (pip)``.

  Called as a progress line is (``lines(n, total, what)``): a new ``n`` prints its line,
  whatever ``stream`` is (a file, a pipe, CI's log), so that a run that takes minutes says
  what it does; further calls of the same step (pip's lines) go to ``live``, a progress line
  below it that rewrites itself, only on a terminal.
  """

  def __init__(self, stream: TextIO, label: str, live: ProgressLine | None):
    self.stream, self.label, self.live = stream, label, live
    self.started = time.monotonic()
    self.steps = 0  # the lines printed
    self._step: int | None = None

  def since(self) -> str:
    """The time since the command began."""
    return duration(time.monotonic() - self.started)

  def __call__(self, n: int, total: int, what: str) -> None:
    if n == self._step:
      if self.live is not None:
        self.live(n, total, what)
      return
    self._step, self.steps = n, self.steps + 1
    self.clear()
    where = f"step {n}/{total}, " if n else ""
    self.stream.write(f"{self.label}: {where}{self.since()}: {what}\n")
    self.stream.flush()

  def clear(self) -> None:
    if self.live is not None:
      self.live.clear()


@contextlib.contextmanager
def step_lines(label: str) -> Iterator[StepLines]:
  """:class:`StepLines` on stderr (a progress line below them on a terminal), cleared on the
  way out."""
  live = ProgressLine(sys.stderr, f"{label}: step") if _is_terminal(sys.stderr) else None
  lines = StepLines(sys.stderr, label, live)
  try:
    yield lines
  finally:
    lines.clear()
