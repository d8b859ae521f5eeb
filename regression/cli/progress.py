"""The progress line: which case, step or figure runs, on one line of stderr that is rewritten
in place and cleared at the end, only when stderr is a terminal."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from typing import TextIO


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
