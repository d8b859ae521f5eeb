"""Tests for regression.store: lossless dtypes, no unpickling, damage detection, atomic writes."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import nnx_pool.regression
from nnx_pool.regression import store
from nnx_pool.regression.store import BaselineError, read_baseline, write_baseline

REPO = Path(nnx_pool.regression.__file__).resolve().parents[1]

# Bit patterns chosen to break a lossy round trip: NaN payloads, -0, subnormals,
# the largest finite value, and every integer extreme.
ROUND_TRIP = {
    "float64": np.array([0.0, -0.0, 1e-310, np.inf, -np.inf, np.finfo(np.float64).max, np.pi]),
    "float32": np.array([0.0, -0.0, 1e-40, np.inf, np.finfo(np.float32).max, 0.1], np.float32),
    "float16": np.array([0.0, -0.0, 6e-8, np.inf, 65504.0, 0.1], np.float16),
    "bfloat16": np.array([0.0, -0.0, 1e-40, np.inf, 3.3e38, 0.1], ml_dtypes.bfloat16),
    "int8": np.array([-128, -1, 0, 127], np.int8),
    "int32": np.array([-(2**31), -1, 0, 2**31 - 1], np.int32),
    "uint8": np.array([0, 1, 254, 255], np.uint8),
    "bool": np.array([[True, False], [False, True]]),
}


def _bits(a: np.ndarray) -> bytes:
  return a.dtype.name.encode() + np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("dtype", sorted(ROUND_TRIP))
def test_store_round_trip_is_bit_exact(tmp_path, dtype):
  # Expected: the very same bytes and dtype name back, for every dtype the kit stores.
  a = ROUND_TRIP[dtype]
  if a.dtype.kind == "f" or dtype == "bfloat16":
    nan_bits = {"float64": np.uint64(0x7FF8000000000123), "float32": np.uint32(0x7FC00123),
                "float16": np.uint16(0x7E01), "bfloat16": np.uint16(0x7FC1)}[dtype]
    a = np.concatenate([a, np.array([nan_bits]).view(a.dtype)])
  write_baseline(tmp_path / "b", {"kind": "test"}, {"x": a.reshape(-1, 1) if a.ndim == 1 else a})
  back = read_baseline(tmp_path / "b").arrays["x"]
  assert back.dtype == a.dtype
  assert _bits(back) == _bits(a.reshape(back.shape))


def test_store_half_precision_is_stored_as_raw_bits(tmp_path):
  write_baseline(tmp_path / "b", {}, {"h": ROUND_TRIP["float16"], "b": ROUND_TRIP["bfloat16"]})
  manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
  assert manifest["arrays"]["h"]["stored_as"] == "uint16"
  assert manifest["arrays"]["b"]["dtype"] == "bfloat16"
  assert manifest["arrays"]["b"]["stored_as"] == "uint16"
  with np.load(tmp_path / "b" / "arrays.npz", allow_pickle=False) as npz:
    assert npz["b"].dtype == np.uint16


def test_store_refuses_object_arrays_when_writing(tmp_path):
  with pytest.raises(TypeError, match="'bad' has dtype object"):
    write_baseline(tmp_path / "b", {}, {"bad": np.array([{}], dtype=object)})
  assert not (tmp_path / "b").exists()


def test_store_digest_depends_on_dtype_and_shape():
  a = np.zeros(4, np.float32)
  assert store.digest(a) != store.digest(a.view(np.int32))
  assert store.digest(a) != store.digest(a.reshape(2, 2))
  assert store.digest(a) == store.digest(a.copy())


# --------------------------------------------------------------- damage


def _baseline(tmp_path: Path) -> Path:
  out = tmp_path / "base"
  arrays = {"a": np.arange(6, dtype=np.float32), "b": np.ones(2, np.int8)}
  write_baseline(out, {"kind": "test"}, arrays)
  return out


def _rewrite_npz(path: Path, arrays: dict) -> None:
  # np.savez pickles object arrays by default: exactly the hostile file we must refuse.
  with open(path / "arrays.npz", "wb") as f:
    np.savez(f, **arrays)


def _raw(path: Path) -> dict:
  with np.load(path / "arrays.npz", allow_pickle=False) as npz:
    return {k: npz[k] for k in npz.files}


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncated", "arrays.npz is truncated or damaged"),
        ("edited_manifest", "edited after recording"),
        ("wrong_dtype", "'a' is stored as float64 but manifest.json says float32"),
        ("missing_key", "'b' listed in manifest.json is missing from arrays.npz"),
        ("object_array", "object array; refusing to unpickle"),
        ("changed_value", "'a' does not match its digest"),
        ("not_json", "not valid JSON"),
        ("newer_format", "format version 99 is newer"),
        ("no_manifest", "manifest.json is missing"),
    ],
)
def test_store_damaged_baseline_raises_one_line_reason(tmp_path, damage, message):
  out = _baseline(tmp_path)
  raw = _raw(out)
  manifest_path = out / "manifest.json"
  if damage == "truncated":
    data = (out / "arrays.npz").read_bytes()
    (out / "arrays.npz").write_bytes(data[: len(data) // 2])
  elif damage == "edited_manifest":
    manifest = json.loads(manifest_path.read_text())
    manifest["kind"] = "edited"
    manifest_path.write_text(json.dumps(manifest))
  elif damage == "wrong_dtype":
    _rewrite_npz(out, {**raw, "a": raw["a"].astype(np.float64)})
  elif damage == "missing_key":
    _rewrite_npz(out, {"a": raw["a"]})
  elif damage == "object_array":
    _rewrite_npz(out, {**raw, "evil": np.array([{"x": 1}], dtype=object)})
  elif damage == "changed_value":
    _rewrite_npz(out, {**raw, "a": raw["a"] + 1})
  elif damage == "not_json":
    manifest_path.write_text("{not json")
  elif damage == "newer_format":
    manifest = json.loads(manifest_path.read_text())
    manifest["format_version"] = 99
    manifest_path.write_text(json.dumps(manifest))
  elif damage == "no_manifest":
    manifest_path.unlink()
  with pytest.raises(BaselineError, match=message) as info:
    read_baseline(out)
  assert "\n" not in str(info.value)


def test_store_missing_directory_says_how_to_record(tmp_path):
  with pytest.raises(BaselineError, match="no such directory; record one with `record --out"):
    read_baseline(tmp_path / "nowhere")


# -------------------------------------------------------------- writing


def test_store_refuses_to_overwrite_without_force(tmp_path):
  out = _baseline(tmp_path)
  before = (out / "manifest.json").read_bytes()
  with pytest.raises(FileExistsError, match="pass --force"):
    write_baseline(out, {"kind": "other"}, {"a": np.zeros(1)})
  assert (out / "manifest.json").read_bytes() == before
  write_baseline(out, {"kind": "other"}, {"a": np.zeros(1)}, force=True)
  assert read_baseline(out).manifest["kind"] == "other"


def test_store_force_never_replaces_a_directory_that_is_not_a_baseline(tmp_path):
  (tmp_path / "home").mkdir()
  (tmp_path / "home" / "notes.txt").write_text("precious")
  with pytest.raises(FileExistsError, match="refusing to replace it even with --force"):
    write_baseline(tmp_path / "home", {}, {"a": np.zeros(1)}, force=True)
  assert (tmp_path / "home" / "notes.txt").read_text() == "precious"


def test_store_write_that_fails_midway_keeps_the_old_baseline(tmp_path, monkeypatch):
  out = _baseline(tmp_path)
  before = read_baseline(out).arrays

  def broken_write(path, arrays):
    path.write_bytes(b"PK\x03\x04 half")
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(store, "_write_npz", broken_write)
  with pytest.raises(OSError, match="No space left"):
    write_baseline(out, {"kind": "new"}, {"a": np.zeros(3)}, force=True)
  after = read_baseline(out)
  assert after.manifest["kind"] == "test"
  assert all(_bits(after.arrays[k]) == _bits(before[k]) for k in before)
  assert [p.name for p in tmp_path.iterdir()] == ["base"]  # the temp dir was removed


@pytest.mark.parametrize("exchange", [True, False], ids=["rename-exchange", "two-renames"])
def test_store_reads_during_forced_records_pair_each_manifest_with_its_arrays(
    tmp_path, monkeypatch, exchange):
  # A writer replaces the baseline in a loop, alternating two recordings; every read
  # must see one whole recording (its manifest's "kind" matches its array), never a
  # manifest of one and arrays of the other (a digest mismatch) or a missing file,
  # also where the OS has no atomic exchange and the swap is two renames.
  if not exchange:
    monkeypatch.setattr(store, "_rename_exchange", lambda a, b: False)
  out = tmp_path / "base"
  versions = {k: np.full(50_000, k, np.float32) for k in (1.0, 2.0)}
  write_baseline(out, {"kind": 1.0}, {"a": versions[1.0]})
  stop = threading.Event()

  def writer():
    while not stop.is_set():
      for kind, array in versions.items():
        write_baseline(out, {"kind": kind}, {"a": array}, force=True)

  thread = threading.Thread(target=writer)
  thread.start()
  try:
    seen = set()
    for _ in range(300):
      baseline = read_baseline(out)
      kind = baseline.manifest["kind"]
      np.testing.assert_array_equal(baseline.arrays["a"], versions[kind])
      seen.add(kind)
  finally:
    stop.set()
    thread.join()
  assert seen == {1.0, 2.0}  # the reads did overlap the writes


@pytest.mark.parametrize("name", ["manifest.json", "arrays.npz"])
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_store_a_file_that_is_not_a_regular_file_is_refused_without_hanging(
    tmp_path, name, kind):
  out = _baseline(tmp_path)
  (out / name).unlink()
  if kind == "directory":
    (out / name).mkdir()
  else:
    os.mkfifo(out / name)  # a reader that opened it blocking would wait for a writer
  fds = len(os.listdir("/proc/self/fd"))
  with pytest.raises(BaselineError, match=f"{name} is not a regular file"):
    read_baseline(out)
  assert len(os.listdir("/proc/self/fd")) == fds  # nothing left open


def test_store_swap_without_atomic_exchange_still_replaces(tmp_path, monkeypatch):
  # Where renameat2 is missing, two renames swap the directories.
  out = _baseline(tmp_path)
  monkeypatch.setattr(store, "_rename_exchange", lambda a, b: False)
  write_baseline(out, {"kind": "new"}, {"a": np.zeros(3)}, force=True)
  assert read_baseline(out).manifest["kind"] == "new"
  assert [p.name for p in tmp_path.iterdir()] == ["base"]


def test_store_crash_between_fallback_renames_points_at_the_old_baseline(tmp_path, monkeypatch):
  out = _baseline(tmp_path)
  monkeypatch.setattr(store, "_rename_exchange", lambda a, b: False)
  real_rename = os.rename
  calls = []

  def crash_on_second(src, dst):
    calls.append(src)
    if len(calls) == 2:
      raise KeyboardInterrupt  # the process dies between the two renames
    real_rename(src, dst)

  monkeypatch.setattr(store.os, "rename", crash_on_second)
  with pytest.raises(KeyboardInterrupt):
    write_baseline(out, {"kind": "new"}, {"a": np.zeros(3)}, force=True)
  monkeypatch.setattr(store.os, "rename", real_rename)
  with pytest.raises(BaselineError, match=r"interrupted record left the previous one at .*\.old-"):
    read_baseline(out)
  (old,) = tmp_path.glob(".base.old-*")
  assert read_baseline(old).manifest["kind"] == "test"


# The child runs the real `record` command (a one-case stand-in batch) and stalls
# inside the array write, after part of the file is on disk.
_KILLED_CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import jax.numpy as jnp
    from nnx_pool.regression import cli, store
    from nnx_pool.regression.batch import Batch, Case

    out, marker = Path(sys.argv[1]), Path(sys.argv[2])

    def slow_write(path, arrays):
      with open(path, "wb") as f:
        f.write(b"PK\\x03\\x04 partial npz")
        f.flush()
      marker.touch()
      time.sleep(60)

    store._write_npz = slow_write
    batch = lambda: Batch([Case("double", lambda: (lambda x: 2 * x), input="one")])
    sys.exit(cli.main(["record", "--out", str(out), "--force"], batch=batch))
""")


def test_store_record_killed_with_sigkill_leaves_the_old_baseline(tmp_path):
  out = _baseline(tmp_path)
  before = (out / "arrays.npz").read_bytes(), (out / "manifest.json").read_bytes()
  marker = tmp_path / "writing"
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
  child = subprocess.Popen(
      [sys.executable, "-c", _KILLED_CHILD, str(out), str(marker)], cwd=REPO, env=env,
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
  )
  try:
    deadline = time.monotonic() + 60
    while not marker.exists():
      if child.poll() is not None:
        pytest.fail(f"child exited early: {child.stderr.read().decode()}")
      if time.monotonic() > deadline:
        pytest.fail("child never started writing")
      time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=10) == -signal.SIGKILL
  finally:
    if child.poll() is None:
      child.kill()
    child.stderr.close()
  assert ((out / "arrays.npz").read_bytes(), (out / "manifest.json").read_bytes()) == before
  assert read_baseline(out).manifest["kind"] == "test"
  stale = list(tmp_path.glob(".base.tmp-*"))
  assert len(stale) == 1  # the killed writer's temp dir, never swapped in
  assert stale[0].stat().st_mode & 0o777 == 0o777 & ~store._umask()
  write_baseline(out, {"kind": "next"}, {"a": np.zeros(1)}, force=True)
  assert not stale[0].exists()  # the next record removes it (its pid is dead)
  assert read_baseline(out).manifest["kind"] == "next"


def test_store_npz_is_a_plain_zip_of_npy_files(tmp_path):
  out = _baseline(tmp_path)
  with zipfile.ZipFile(out / "arrays.npz") as z:
    assert sorted(z.namelist()) == ["a.npy", "b.npy"]
