"""Issue 36, item 12: the directory ``NNX_POOL_CACHE`` names is checked as the cache under it
is: others may not write to it unless its sticky bit is set (POSIX; Windows has no such
modes). Anyone who may rename entries there could move ``rehearse/`` away and put their own
in its place, whose environments a rehearsal would run.

Through :func:`~nnx_pool.regression.upgrade.rehearse_cache.take`, the step every rehearsal
takes before it builds or runs an environment; expected modes written out.
"""

import os

import pytest

from nnx_pool.regression.upgrade import rehearse_cache
from nnx_pool.regression.upgrade.rehearse_plan import RehearsalError

pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permission bits")

ENTRY = "0123456789abcdef"  # a cache entry's name (a plan's key)


@pytest.fixture
def root(tmp_path, monkeypatch):
  """The directory NNX_POOL_CACHE names (its cache, ``rehearse/``, not made yet)."""
  root = tmp_path / "shared"
  root.mkdir()
  monkeypatch.setenv(rehearse_cache.CACHE_ENV, str(root))
  yield root
  root.chmod(0o700)


def _take() -> None:
  entry = rehearse_cache.cache_root() / ENTRY
  rehearse_cache.take(entry, waiting=lambda: None).release()


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_a_cache_root_others_may_write_without_the_sticky_bit_is_refused(root, mode):
  root.chmod(mode)
  # Before: only rehearse/ under it was checked (made 0700), and this root was used.
  with pytest.raises(RehearsalError) as info:
    _take()
  writers = "its group and every user" if mode == 0o777 else "its group"
  assert str(info.value) == (
      f"rehearse: the directory {root} that holds the cache may be written by {writers} (mode "
      f"{mode:04o}, without the sticky bit): another user could rename the cache away and put "
      f"one there whose environments rehearse would run; run `chmod go-w {root}` (or `chmod "
      f"+t {root}`), or set NNX_POOL_CACHE to a directory of your own.")
  assert not (root / "rehearse" / ENTRY).exists()


@pytest.mark.parametrize("mode", [0o1777, 0o755, 0o700])
def test_a_cache_root_with_the_sticky_bit_or_private_is_used(root, mode):
  root.chmod(mode)
  _take()
  assert (root / "rehearse" / ENTRY).is_dir()
  assert (root / "rehearse").stat().st_mode & 0o777 == 0o700
