"""Issue 36, items 2 and 11, in the store: any array key that round-trips is stored, and no
write goes through a symbolic link.

Expected values are written out here: the keys and arrays given, the bytes of the files that
a link points to before the write, and the zip's own member names (read with :mod:`zipfile`,
not the store's reader).
"""

import zipfile
from pathlib import Path

import numpy as np
import pytest

from nnx_pool.regression import store


def _files(root: Path) -> dict[str, bytes]:
  """Every file under ``root`` (links not followed) with its bytes."""
  return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
          if p.is_file()}


def _symlink(link: Path, target: Path, directory: bool = True) -> None:
  """Makes ``link`` a symbolic link to ``target``; skips where this platform cannot (Windows
  without the privilege)."""
  try:
    link.symlink_to(target, target_is_directory=directory)
  except (OSError, NotImplementedError) as e:
    pytest.skip(f"cannot make a symbolic link here: {e}")


# ------------------------------------------------------------------ item 11: keys

# Keys that were refused ("array key must be a plain string"), each with its array. Two pairs
# differ only by case: members of one zip, never two files, so both are kept apart.
ROUND_TRIP = {
    "grad/poids_α": np.array([1.0, 2.0], np.float32),
    "grad/Poids_α": np.array([3.0, 4.0], np.float32),
    "output/a b": np.array([5], np.int32),
    "output/A B": np.array([6], np.int32),
    "weights/名前.kernel": np.array([[7.0]], np.float64),
    "output/é~!@#$%^&*+{}|;\"<>?": np.array(True),
}


def test_any_key_that_round_trips_is_stored_and_read_back(tmp_path):
  out = store.write_baseline(tmp_path / "b", {"kind": "t"}, ROUND_TRIP)
  base = store.read_baseline(out)
  assert sorted(base.arrays) == sorted(ROUND_TRIP)
  for key, value in ROUND_TRIP.items():
    np.testing.assert_array_equal(base.arrays[key], value)
    assert base.arrays[key].dtype == value.dtype
  assert sorted(base.manifest["arrays"]) == sorted(ROUND_TRIP)
  # The zip holds each key as its own member, <key>.npy, under its UTF-8 name.
  (npz,) = out.glob("arrays-*.npz")
  with zipfile.ZipFile(npz) as z:
    assert sorted(z.namelist()) == sorted(f"{key}.npy" for key in ROUND_TRIP)


@pytest.mark.parametrize("key", ["a\\b", "a\x00b", "tab\there", "lone\ud800", ""])
def test_a_key_that_cannot_round_trip_is_refused_in_one_line(tmp_path, key):
  # NUL ends a zip member's name when read; zipfile on Windows reads "\\" back as "/"; a lone
  # surrogate has no UTF-8.
  with pytest.raises(ValueError) as info:
    store.write_baseline(tmp_path / "b", {}, {key: np.zeros(1)})
  message = str(info.value)
  assert "\n" not in message and repr(key) in message
  assert not (tmp_path / "b").exists()


# ------------------------------------------------------------------ item 2: links


def test_a_baseline_directory_that_is_a_link_is_replaced_never_written_through(tmp_path):
  other = store.write_baseline(tmp_path / "b", {"kind": "t"}, {"x": np.arange(3)})
  kept = _files(other)
  link = tmp_path / "a"
  _symlink(link, other)
  # Without force: refused, naming the link; nothing written anywhere.
  with pytest.raises(FileExistsError) as info:
    store.write_baseline(link, {"kind": "t"}, {"x": np.arange(4)})
  assert str(info.value) == (
      f"`out` {link} is a symbolic link (to {other}), and baselines are never written through "
      "a link; pass --force to replace the link itself with a directory (what it points to is "
      "kept), or choose another directory.")
  assert link.is_symlink() and _files(other) == kept
  # With force: the link becomes a directory of its own; what it pointed to is untouched.
  # Before: b's arrays were replaced by a's.
  store.write_baseline(link, {"kind": "t"}, {"x": np.arange(4)}, force=True)
  assert not link.is_symlink() and link.is_dir()
  assert _files(other) == kept
  np.testing.assert_array_equal(store.read_baseline(link).arrays["x"], [0, 1, 2, 3])
  np.testing.assert_array_equal(store.read_baseline(other).arrays["x"], [0, 1, 2])
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no temporary left


def test_a_dangling_link_is_replaced_and_a_linked_file_is_not_written_through(tmp_path):
  link = tmp_path / "a"
  _symlink(link, tmp_path / "nowhere")
  # Before: FileExistsError from mkdir (the link exists, its target does not).
  store.write_baseline(link, {"kind": "t"}, {"x": np.arange(2)}, force=True)
  assert not link.is_symlink() and not (tmp_path / "nowhere").exists()
  # A file of the baseline linked to a file elsewhere: the write replaces the link.
  elsewhere = tmp_path / "notes.json"
  elsewhere.write_text("{}")
  (link / "manifest.json").unlink()
  _symlink(link / "manifest.json", elsewhere, directory=False)
  store.write_baseline(link, {"kind": "t"}, {"x": np.arange(5)}, force=True)
  assert elsewhere.read_text() == "{}" and not (link / "manifest.json").is_symlink()
  np.testing.assert_array_equal(store.read_baseline(link).arrays["x"], np.arange(5))
