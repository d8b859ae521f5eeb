"""The kit's one lock between processes: exclusive, on a directory, gone when its holder dies.

Two users: the baseline store (a writer holds the directory a baseline lies in) and
``rehearse`` (a run holds its cached environment's directory). Where :mod:`fcntl`
exists (POSIX), the lock is a ``flock`` on the directory itself, and no file is
written. Elsewhere (Windows) it is ``msvcrt.locking`` on the first byte of
:data:`LOCK_FILE` inside the directory, created where missing and left in place: an
empty file, safe to delete when nothing runs. Either way the lock belongs to an open
file, so the system frees it when its holder closes it or dies: no stale lock to clean.

The platform's module is imported where a lock is taken, never when this module is
imported, so that importing the store (and with it the kit's commands) works on every
platform.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

LOCK_FILE = ".nnx-pool.lock"  # the file locked where a directory cannot be (Windows)
_POLL_S = (0.02, 0.25)  # the first wait between two tries, and the longest


class Busy(TimeoutError):
  """Another process held the lock for longer than the caller would wait."""


class Gone(FileNotFoundError):
  """The directory was removed or replaced while this process waited for its lock."""


class Held:
  """A lock this process holds; :meth:`release` (or leaving a ``with`` block) frees it."""

  def __init__(self, fd: int, unlock: Callable[[int], None]):
    self._fd: int | None = fd
    self._unlock = unlock

  def release(self) -> None:
    """Frees the lock; a second call does nothing."""
    if self._fd is not None:
      fd, self._fd = self._fd, None
      try:
        self._unlock(fd)
      finally:
        os.close(fd)

  def __enter__(self) -> Held:
    return self

  def __exit__(self, *exc: object) -> None:
    self.release()


def exclusive(directory: str | os.PathLike, *, timeout_s: float | None = None,
              waiting: Callable[[], None] | None = None) -> Held:
  """Takes the exclusive lock on ``directory``, waiting for its holder if another has it.

  ``with exclusive(path): ...`` holds it for the block. Errors are raised by the call,
  before the block starts.

  Args:
    directory: an existing directory.
    timeout_s: how long to wait for another holder: None waits as long as it takes,
      0 tries once.
    waiting: called once, when another process holds the lock and this one waits.

  Raises:
    Busy: another process still held it after ``timeout_s``.
    Gone: the directory was removed or replaced while this one waited.
    OSError: the directory cannot be opened (FileNotFoundError when it does not exist).
  """
  directory = Path(directory)
  try_lock, unlock, target = _platform(directory)
  fd = _open(target, directory)
  try:
    _wait(fd, try_lock, timeout_s, waiting, directory)
    held = Held(fd, unlock)
  except BaseException:
    os.close(fd)
    raise
  try:
    still_there = os.path.samestat(os.fstat(fd), os.stat(target))
  except FileNotFoundError:
    still_there = False
  if not still_there:
    held.release()
    raise Gone(errno.ENOENT, "removed while waiting for its lock", str(directory))
  return held


def _open(target: Path, directory: Path) -> int:
  if target == directory:
    return os.open(directory, os.O_RDONLY)
  return os.open(target, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o666)


def _wait(fd: int, try_lock: Callable[[int], bool], timeout_s: float | None,
          waiting: Callable[[], None] | None, directory: Path) -> None:
  """Tries the lock until it is taken; raises Busy after ``timeout_s`` (0: one try)."""
  if try_lock(fd):
    return
  if waiting is not None:
    waiting()
  deadline = None if timeout_s is None else time.monotonic() + timeout_s
  pause = _POLL_S[0]
  while deadline is None or time.monotonic() < deadline:
    time.sleep(pause if deadline is None else max(min(pause, deadline - time.monotonic()), 0))
    if try_lock(fd):
      return
    pause = min(pause * 2, _POLL_S[1])
  raise Busy(errno.EAGAIN, f"held by another process for over {timeout_s:g} s", str(directory))


def _platform(directory: Path) -> tuple[Callable[[int], bool], Callable[[int], None], Path]:
  """This platform's try-lock and unlock, and the path they lock (the directory, or a file)."""
  try:
    import fcntl
  except ImportError:  # Windows: no fcntl
    try:
      import msvcrt
    except ImportError:
      raise OSError(errno.ENOSYS, "this platform has no file lock (neither fcntl nor msvcrt)",
                    str(directory)) from None

    # msvcrt's stub declares these on Windows only, where this branch runs.
    def try_msvcrt(fd: int) -> bool:
      try:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # pyright: ignore[reportAttributeAccessIssue]  # the file position stays at 0
      except OSError as e:
        if e.errno in (errno.EACCES, errno.EDEADLOCK):  # another process has it
          return False
        raise
      return True

    return try_msvcrt, lambda fd: msvcrt.locking(fd, msvcrt.LK_UNLCK, 1), directory / LOCK_FILE  # pyright: ignore[reportAttributeAccessIssue]

  def try_flock(fd: int) -> bool:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      return False
    return True

  return try_flock, lambda fd: fcntl.flock(fd, fcntl.LOCK_UN), directory
