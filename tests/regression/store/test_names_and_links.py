"""Issue 36, item 11, in the store: any array key that round-trips is stored.

Expected values are written out here: the keys and arrays given, and the zip's own member
names (read with :mod:`zipfile`, not the store's reader).
"""

import zipfile

import numpy as np
import pytest

from nnx_pool.regression import store

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

