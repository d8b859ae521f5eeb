"""Tests for regression.store: lossless dtypes, no unpickling, damage detection, atomic writes."""

import io
import json
import os
import re
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
    "float8_e4m3fn": np.array([0.0, -0.0, 448.0, 0.1], ml_dtypes.float8_e4m3fn),
    "int4": np.array([-8, -1, 0, 7], ml_dtypes.int4),
    "int8": np.array([-128, -1, 0, 127], np.int8),
    "int32": np.array([-(2**31), -1, 0, 2**31 - 1], np.int32),
    "uint8": np.array([0, 1, 254, 255], np.uint8),
    "bool": np.array([[True, False], [False, True]]),
}


def _bits(a: np.ndarray) -> bytes:
  return a.dtype.name.encode() + np.ascontiguousarray(a).tobytes()


def _umask() -> int:
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def _arrays_file(out: Path) -> Path:
  """The arrays file the manifest of ``out`` names."""
  return out / store.arrays_name(json.loads((out / "manifest.json").read_text()))


def _snapshot(path: Path) -> dict:
  return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("dtype", sorted(ROUND_TRIP))
def test_store_round_trip_is_bit_exact(tmp_path, dtype):
  # Expected: the very same bytes and dtype name back, for every dtype the kit stores.
  a = ROUND_TRIP[dtype]
  if dtype in ("float64", "float32", "float16", "bfloat16"):
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
  with np.load(_arrays_file(tmp_path / "b"), allow_pickle=False) as npz:
    assert npz["b"].dtype == np.uint16 and npz["h"].dtype == np.uint16


@pytest.mark.parametrize("bad", [np.array([{}], dtype=object), np.array(["s"]),
                                 np.array(["2020-01-01"], "datetime64[D]")],
                         ids=["object", "str", "datetime"])
def test_store_refuses_arrays_it_cannot_hold_without_pickling(tmp_path, bad):
  with pytest.raises(TypeError, match=re.escape(f"'bad' has dtype {bad.dtype}, which a baseline")):
    write_baseline(tmp_path / "b", {}, {"bad": bad})
  assert not (tmp_path / "b").exists()


def test_store_digest_depends_on_dtype_and_shape():
  a = np.zeros(4, np.float32)
  assert store.digest(a) != store.digest(a.view(np.int32))
  assert store.digest(a) != store.digest(a.reshape(2, 2))
  assert store.digest(a) == store.digest(a.copy())


def test_store_files_are_named_by_content_and_readable_by_others(tmp_path):
  out = tmp_path / "b"
  write_baseline(out, {"kind": "one"}, {"a": np.zeros(3)})
  first = _arrays_file(out).name
  assert sorted(os.listdir(out)) == sorted(["manifest.json", first])
  assert first.startswith("arrays-") and first.endswith(".npz")
  for name in os.listdir(out):  # not the 0600 of a temporary file
    assert (out / name).stat().st_mode & 0o777 == 0o666 & ~_umask()
  write_baseline(out, {"kind": "two"}, {"a": np.ones(3)}, force=True)
  assert _arrays_file(out).name != first
  assert sorted(os.listdir(out)) == sorted(["manifest.json", _arrays_file(out).name])


# --------------------------------------------------------------- damage


def _baseline(tmp_path: Path) -> Path:
  out = tmp_path / "base"
  arrays = {"a": np.arange(6, dtype=np.float32), "b": np.ones(2, np.int8)}
  write_baseline(out, {"kind": "test"}, arrays)
  return out


def _rewrite_npz(path: Path, arrays: dict) -> None:
  # np.savez pickles object arrays by default: exactly the hostile file we must refuse.
  with open(_arrays_file(path), "wb") as f:
    np.savez(f, **arrays)


def _raw(path: Path) -> dict:
  with np.load(_arrays_file(path), allow_pickle=False) as npz:
    return {k: npz[k] for k in npz.files}


def _edit_manifest(path: Path, **changes) -> None:
  manifest = json.loads((path / "manifest.json").read_text())
  manifest.update(changes)
  (path / "manifest.json").write_text(json.dumps(manifest))


ARRAYS = r"arrays-[0-9a-f]{16}\.npz"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncated", f"{ARRAYS} is truncated or damaged"),
        ("edited_manifest", "edited after recording"),
        ("wrong_dtype", "'a' is stored as float64 but manifest.json says float32"),
        ("missing_key", f"'b' listed in manifest.json is missing from {ARRAYS}"),
        ("extra_key", f"'c' in {ARRAYS} is not listed in manifest.json"),
        ("object_array", "object array; refusing to unpickle"),
        ("changed_value", "'a' does not match its digest"),
        ("not_json", "not valid JSON"),
        ("newer_format", "format version 99 is newer"),
        ("older_format", "has no known format_version \\(got 0\\)"),
        ("no_manifest", "manifest.json is missing"),
        ("no_arrays", f"{ARRAYS}, named by manifest.json, is missing"),
        ("no_table", "has no 'arrays' table"),
        ("nan", "not valid JSON"),
    ],
)
def test_store_damaged_baseline_raises_one_line_reason(tmp_path, damage, message):
  out = _baseline(tmp_path)
  raw = _raw(out)
  npz, manifest_path = _arrays_file(out), out / "manifest.json"
  if damage == "truncated":
    npz.write_bytes(npz.read_bytes()[: len(npz.read_bytes()) // 2])
  elif damage == "edited_manifest":
    _edit_manifest(out, kind="edited")
  elif damage == "wrong_dtype":
    _rewrite_npz(out, {**raw, "a": raw["a"].astype(np.float64)})
  elif damage == "missing_key":
    _rewrite_npz(out, {"a": raw["a"]})
  elif damage == "extra_key":
    _rewrite_npz(out, {**raw, "c": raw["a"]})
  elif damage == "object_array":
    _rewrite_npz(out, {**raw, "a": np.array([{"x": 1}], dtype=object)})  # a listed array
  elif damage == "changed_value":
    _rewrite_npz(out, {**raw, "a": raw["a"] + 1})
  elif damage == "not_json":
    manifest_path.write_text("{not json")
  elif damage in ("newer_format", "older_format"):
    _edit_manifest(out, format_version=99 if damage == "newer_format" else 0)
  elif damage == "no_manifest":
    manifest_path.unlink()
  elif damage == "no_arrays":
    npz.unlink()
  elif damage == "no_table":
    manifest = json.loads(manifest_path.read_text())
    manifest["arrays"] = [manifest["arrays"]]
    manifest["manifest_sha256"] = store.format._checksum(manifest)
    manifest_path.write_text(json.dumps(manifest))
  elif damage == "nan":  # Python's json reads NaN, which the checksum cannot cover
    _edit_manifest(out, kind=float("nan"))
  with pytest.raises(BaselineError, match=message) as info:
    read_baseline(out)
  text = str(info.value)
  assert "\n" not in text
  assert text.startswith(f"baseline {out}: ")  # names the path
  assert "record" in text or "upgrade nnx-pool" in text  # and the fix


def test_store_missing_directory_says_how_to_record(tmp_path):
  with pytest.raises(BaselineError, match="no such directory; record one with `record --out"):
    read_baseline(tmp_path / "nowhere")
  (tmp_path / "file").write_text("")
  with pytest.raises(BaselineError, match="file: cannot open it .*; pass a baseline directory"):
    read_baseline(tmp_path / "file")


@pytest.mark.parametrize("name", ["manifest.json", "arrays"])
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_store_a_file_that_is_not_a_regular_file_is_refused_without_hanging(
    tmp_path, name, kind):
  out = _baseline(tmp_path)
  path = out / "manifest.json" if name == "manifest.json" else _arrays_file(out)
  path.unlink()
  if kind == "directory":
    path.mkdir()
  else:
    os.mkfifo(path)  # a reader that opened it blocking would wait for a writer
  fds = len(os.listdir("/proc/self/fd"))
  errors = []
  reader = threading.Thread(  # both read the manifest: neither may block on a FIFO
      target=lambda: errors.append((_error(out), store.stored_format_version(out))), daemon=True)
  reader.start()
  reader.join(timeout=10)
  if reader.is_alive():
    with open(os.open(path, os.O_WRONLY | os.O_NONBLOCK), "wb"):  # unblock it, then fail
      pytest.fail("read_baseline hung on a FIFO")
  version = None if name == "manifest.json" else 3  # the version this nnx-pool writes
  assert errors == [(f"baseline {out}: {path.name} is not a regular file; remove it and "
                     f"{store.read._FIX}.", version)]
  assert len(os.listdir("/proc/self/fd")) == fds  # nothing left open


def _error(out: Path) -> str:
  try:
    read_baseline(out)
  except BaselineError as e:
    return str(e)
  return "no error"


def test_store_reads_format_version_1_and_force_replaces_it(tmp_path):
  # Version 1 kept the arrays in `arrays.npz`.
  out = _baseline(tmp_path)
  _arrays_file(out).rename(out / "arrays.npz")
  manifest = json.loads((out / "manifest.json").read_text())
  manifest["format_version"] = 1
  manifest["manifest_sha256"] = store.format._checksum(manifest)
  (out / "manifest.json").write_text(json.dumps(manifest))
  old = read_baseline(out)
  assert old.manifest["format_version"] == 1
  np.testing.assert_array_equal(old.arrays["a"], np.arange(6, dtype=np.float32))
  with pytest.raises(FileExistsError, match="pass --force"):
    write_baseline(out, {"kind": "new"}, {"a": np.zeros(2)})
  write_baseline(out, {"kind": "new"}, {"a": np.zeros(2)}, force=True)
  assert sorted(os.listdir(out)) == sorted(["manifest.json", _arrays_file(out).name])
  assert read_baseline(out).manifest["format_version"] == store.FORMAT_VERSION == 3


def test_store_keeps_a_zero_dimensional_array_zero_dimensional(tmp_path):
  # A check_grad loss is a 0-d array; np.ascontiguousarray would store it as shape (1,),
  # which then fails its own digest (the shape is part of it).
  out = write_baseline(tmp_path / "b", {"kind": "t"},
                       {"loss": np.float32(2.5) * np.ones((), np.float32),
                        "half": np.array(1.5, np.float16)})
  arrays = read_baseline(out).arrays
  assert arrays["loss"].shape == () and arrays["loss"] == np.float32(2.5)
  assert arrays["half"].shape == () and arrays["half"].dtype == np.float16


def test_store_format_version_2_baselines_still_load(tmp_path):
  # nnx-pool 0.1.0 wrote format version 2: the same files as 3 (arrays-<hex>.npz named by
  # the digest of the array table); only what a fixture baseline holds changed.
  out = _baseline(tmp_path)
  manifest = json.loads((out / "manifest.json").read_text())
  manifest["format_version"] = 2
  manifest["manifest_sha256"] = store.format._checksum(manifest)
  (out / "manifest.json").write_text(json.dumps(manifest))
  old = read_baseline(out)
  assert old.manifest["format_version"] == 2
  np.testing.assert_array_equal(old.arrays["a"], np.arange(6, dtype=np.float32))


# -------------------------------------------------------------- writing


def test_store_refuses_to_overwrite_without_force(tmp_path):
  out = _baseline(tmp_path)
  before = _snapshot(out)
  with pytest.raises(FileExistsError, match="pass --force"):
    write_baseline(out, {"kind": "other"}, {"a": np.zeros(1)})
  assert _snapshot(out) == before
  write_baseline(out, {"kind": "other"}, {"a": np.zeros(1)}, force=True)
  assert read_baseline(out).manifest["kind"] == "other"


@pytest.mark.parametrize("force", [False, True])
def test_store_never_replaces_a_directory_that_is_not_a_baseline(tmp_path, force):
  (tmp_path / "home").mkdir()
  (tmp_path / "home" / "notes.txt").write_text("precious")
  with pytest.raises(FileExistsError, match="'notes.txt'.*refusing to replace it even with --f"):
    write_baseline(tmp_path / "home", {}, {"a": np.zeros(1)}, force=force)
  assert os.listdir(tmp_path / "home") == ["notes.txt"]
  out = _baseline(tmp_path)  # a baseline with a stranger in it is refused as well
  (out / "notes.txt").write_text("precious")
  before = _snapshot(out)
  with pytest.raises(FileExistsError, match="refusing to replace it even with --force"):
    write_baseline(out, {}, {"a": np.zeros(1)}, force=True)
  assert _snapshot(out) == before


def test_store_never_replaces_a_newer_format_even_with_force(tmp_path):
  out = _baseline(tmp_path)
  _edit_manifest(out, format_version=store.FORMAT_VERSION + 1)
  before = _snapshot(out)
  with pytest.raises(FileExistsError, match="newer than this nnx-pool writes .* even with"):
    write_baseline(out, {}, {"a": np.zeros(1)}, force=True)
  assert _snapshot(out) == before


class Crash(BaseException):
  """The process dies here (as a SIGKILL would, but the test process lives on)."""


# Every step of a record in order: (seam, which call of it crashes, what a reader sees then).
CRASH_POINTS = [
    ("_write_file", 1, "old"),  # half the arrays are in a temporary file
    ("_fsync_dir", 1, "old"),  # the arrays file is in place, the manifest is not written
    ("_write_file", 2, "old"),  # half the manifest is in a temporary file
    ("_fsync_dir", 2, "new"),  # the manifest was swapped in: committed
    ("_fsync_dir", 3, "new"),  # the old arrays file is not deleted yet
]


@pytest.mark.parametrize(("seam", "call", "sees"), CRASH_POINTS,
                         ids=[f"{s}-{c}" for s, c, _ in CRASH_POINTS])
def test_store_a_record_that_dies_at_any_point_leaves_old_or_new_whole(
    tmp_path, monkeypatch, seam, call, sees):
  out = _baseline(tmp_path)
  before = read_baseline(out).arrays
  new = {"a": np.full(3, 7.0), "c": np.zeros(2, ml_dtypes.bfloat16)}
  real, calls = getattr(store.write, seam), []

  def dying(*args):
    calls.append(args)
    if len(calls) == call:
      if seam == "_write_file":
        args[0].write_bytes(args[1][: len(args[1]) // 2])
      raise Crash
    return real(*args)

  monkeypatch.setattr(store.write, seam, dying)
  with pytest.raises(Crash):
    write_baseline(out, {"kind": "new"}, new, force=True)
  monkeypatch.undo()
  after = read_baseline(out)
  expected = before if sees == "old" else new
  assert after.manifest["kind"] == ("test" if sees == "old" else "new")
  assert sorted(after.arrays) == sorted(expected)
  assert all(_bits(after.arrays[k]) == _bits(np.asarray(expected[k])) for k in expected)
  assert [p.name for p in tmp_path.iterdir()] == ["base"]
  write_baseline(out, {"kind": "next"}, {"a": np.zeros(1)}, force=True)  # cleans up after it
  assert sorted(os.listdir(out)) == sorted(["manifest.json", _arrays_file(out).name])


def test_store_each_file_is_fsynced_before_it_is_renamed_into_place(tmp_path, monkeypatch):
  # Durability order: a rename may reach the disk only after the data it names, and
  # the manifest (the commit) only after the arrays file it names.
  out = _baseline(tmp_path)
  events, real_fsync, real_replace = [], os.fsync, os.replace

  def name(path: str) -> str:
    return {str(out): "<dir>", str(tmp_path): "<parent>"}.get(path, Path(path).name[:5])

  def fsync(fd):
    events.append(("fsync", name(os.readlink(f"/proc/self/fd/{fd}"))))
    real_fsync(fd)

  def replace(src, dst):
    events.append(("replace", Path(dst).name[:6]))
    real_replace(src, dst)

  monkeypatch.setattr(os, "fsync", fsync)
  monkeypatch.setattr(os, "replace", replace)
  monkeypatch.delenv("NNX_POOL_FSYNC", raising=False)  # the default (the suite sets 0)
  write_baseline(out, {"kind": "new"}, {"a": np.zeros(3)}, force=True)
  assert events == [
      ("fsync", ".tmp-"), ("replace", "arrays"), ("fsync", "<dir>"),
      ("fsync", ".tmp-"), ("replace", "manife"), ("fsync", "<dir>"), ("fsync", "<parent>"),
  ]
  # NNX_POOL_FSYNC=0 (a CI runner's throwaway disk): the same renames in the same order,
  # no fsync; the new recording is whole.
  events.clear()
  monkeypatch.setenv("NNX_POOL_FSYNC", "0")
  write_baseline(out, {"kind": "newer"}, {"a": np.ones(3)}, force=True)
  monkeypatch.undo()
  assert events == [("replace", "arrays"), ("replace", "manife")]
  assert json.loads((out / "manifest.json").read_text())["kind"] == "newer"


def test_store_a_first_record_that_fails_leaves_nothing(tmp_path, monkeypatch):
  def full_disk(path, data):
    path.write_bytes(data[:10])
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(store.write, "_write_file", full_disk)
  with pytest.raises(OSError, match="No space left"):
    write_baseline(tmp_path / "new", {}, {"a": np.zeros(3)})
  assert list(tmp_path.iterdir()) == []


def test_store_a_reader_whose_arrays_vanish_reads_the_new_manifest(tmp_path, monkeypatch):
  # Deterministically: a record finishes between the reader's manifest and its arrays.
  out = _baseline(tmp_path)
  real, parsed = store.read._parse_manifest, []

  def then_a_record_finishes(path, data):
    parsed.append(real(path, data))
    if len(parsed) == 1:
      write_baseline(out, {"kind": "new"}, {"a": np.full(4, 2.0)}, force=True)
    return parsed[-1]

  monkeypatch.setattr(store.read, "_parse_manifest", then_a_record_finishes)
  baseline = read_baseline(out)
  assert [m["kind"] for m, _ in parsed] == ["test", "new"]  # it read the manifest again
  assert baseline.manifest["kind"] == "new"
  np.testing.assert_array_equal(baseline.arrays["a"], np.full(4, 2.0))


def test_store_reads_during_forced_records_pair_each_manifest_with_its_arrays(tmp_path):
  # A writer replaces the baseline in a loop, alternating two recordings; every read
  # must see one whole recording (its manifest's "kind" matches its array), never a
  # manifest of one and arrays of the other (a digest mismatch) or a missing file.
  out = tmp_path / "base"
  versions = {k: np.full(50_000, k, np.float32) for k in (1.0, 2.0)}
  write_baseline(out, {"kind": 1.0}, {"a": versions[1.0]})
  stop, errors = threading.Event(), []

  def writer():
    try:
      while not stop.is_set():
        for kind, array in versions.items():
          write_baseline(out, {"kind": kind}, {"a": array}, force=True)
    except BaseException as e:  # reported below
      errors.append(e)

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
  assert errors == []
  assert seen == {1.0, 2.0}  # the reads did overlap the writes


def test_store_a_second_writer_waits_for_the_first_then_refuses_or_replaces(
    tmp_path, monkeypatch):
  # The first record is mid-write (holding the lock) when the second starts. The second
  # must wait, then see the first one's baseline: without force it refuses, with force
  # it replaces it whole. Without the lock it would write its own, then be overwritten.
  out = tmp_path / "base"
  real, inside, release = store.write._write_file, threading.Event(), threading.Event()

  def slow_write(path, data):
    inside.set()
    release.wait(timeout=10)
    real(path, data)

  monkeypatch.setattr(store.write, "_write_file", slow_write)
  results = {}
  first = threading.Thread(target=lambda: results.update(first=_try_write(out, "first")))
  first.start()
  assert inside.wait(timeout=10)
  second = threading.Thread(target=lambda: results.update(second=_try_write(out, "second")))
  second.start()
  time.sleep(0.3)
  assert second.is_alive()  # waiting for the lock
  release.set()
  first.join(timeout=10)
  second.join(timeout=10)
  assert results == {"first": "written",
                     "second": f"baseline {out} exists; pass --force to replace it."}
  assert read_baseline(out).manifest["kind"] == "first"
  assert _try_write(out, "third", force=True) == "written"
  third = read_baseline(out)
  assert third.manifest["kind"] == "third" and list(third.arrays) == ["third"]
  assert sorted(os.listdir(out)) == sorted(["manifest.json", _arrays_file(out).name])


def _try_write(out: Path, kind: str, *, force: bool = False) -> str:
  try:
    write_baseline(out, {"kind": kind}, {kind: np.zeros(2)}, force=force)
  except FileExistsError as e:
    return str(e)
  return "written"


def test_store_stale_temporary_files_do_not_block_a_record(tmp_path):
  # A first record killed mid-write leaves a directory holding only its temporary file.
  out = tmp_path / "base"
  out.mkdir()
  (out / ".tmp-4242-deadbeef").write_bytes(b"PK\x03\x04 partial")
  write_baseline(out, {"kind": "test"}, {"a": np.zeros(2)})  # no force needed: no baseline
  assert sorted(os.listdir(out)) == sorted(["manifest.json", _arrays_file(out).name])


# The child runs the real `record` command (a one-case stand-in batch) and stalls
# inside the array write, after part of the file is on disk.
_KILLED_CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from nnx_pool.regression import cli, store
    from nnx_pool.regression.batch import Batch, Case

    out, marker = Path(sys.argv[1]), Path(sys.argv[2])
    real = store.write._write_file

    def slow_write(path, data):
      if not data.startswith(b"PK"):  # the manifest
        return real(path, data)
      with open(path, "wb") as f:
        f.write(data[:20])
        f.flush()
      marker.touch()
      time.sleep(60)

    store.write._write_file = slow_write
    batch = lambda: Batch([Case("double", lambda: (lambda x: 2 * x), input="one")])
    sys.exit(cli.main(["record", "--out", str(out), "--force"], batch=batch))
""")


def test_store_record_killed_with_sigkill_leaves_the_old_baseline(tmp_path):
  out = _baseline(tmp_path)
  before = _snapshot(out)
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
  stale = sorted(set(os.listdir(out)) - set(before))
  assert len(stale) == 1 and stale[0].startswith(".tmp-")  # the killed writer's temp file
  assert {k: v for k, v in _snapshot(out).items() if k in before} == before
  assert read_baseline(out).manifest["kind"] == "test"
  write_baseline(out, {"kind": "next"}, {"a": np.zeros(1)}, force=True)
  assert not (out / stale[0]).exists()  # the next record removes it
  assert read_baseline(out).manifest["kind"] == "next"


def test_store_npz_is_a_plain_zip_of_npy_files(tmp_path):
  out = _baseline(tmp_path)
  with zipfile.ZipFile(_arrays_file(out)) as z:
    assert sorted(z.namelist()) == ["a.npy", "b.npy"]


# ------------------------------------------- issue 29: keys, dtypes, hostile files


def test_store_any_key_round_trips_even_one_named_like_a_savez_argument(tmp_path):
  # np.savez_compressed(npz, **arrays) raised TypeError for `file`, wrote `allow_pickle` as its
  # own flag (the baseline then lacked it), and stored `x` and `x.npy` as one member `x.npy`.
  arrays = {"file": np.arange(3.0), "allow_pickle": np.ones(2, np.int8),
            "x": np.zeros(2, np.float32), "x.npy": np.full(3, 7, np.int32),
            "compress": np.array(True), "a/b.npy": np.arange(4, dtype=np.uint8)}
  out = write_baseline(tmp_path / "b", {"kind": "test"}, arrays)
  back = read_baseline(out).arrays
  assert sorted(back) == sorted(arrays)
  for key, value in arrays.items():  # the bytes and dtype written, each under its own key
    assert _bits(back[key]) == _bits(value), key
  with zipfile.ZipFile(_arrays_file(out)) as z:  # one member per key: <key>.npy
    assert sorted(z.namelist()) == sorted(f"{k}.npy" for k in arrays)


def test_store_old_savez_files_load_unchanged(tmp_path):
  # Every baseline written before issue 29 went through np.savez_compressed: the same
  # manifest, and members <key>.npy of its own. They load, the shipped one included.
  out = tmp_path / "old"
  out.mkdir()
  arrays = {"a": np.arange(6, dtype=np.float32), "h": np.ones((2, 2), ml_dtypes.bfloat16),
            "loss": np.array(2.5, np.float32)}
  manifest, stored = store.build_manifest({"kind": "test"}, arrays)
  np.savez_compressed(out / store.arrays_name(manifest), **stored)
  (out / "manifest.json").write_text(json.dumps(manifest))
  back = read_baseline(out).arrays
  assert all(_bits(back[k]) == _bits(v) for k, v in arrays.items())
  shipped = read_baseline(REPO / "regression" / "baseline")
  assert shipped.manifest["format_version"] == 3 and len(shipped.arrays) == len(
      shipped.manifest["arrays"])


def _ml_dtypes() -> list[str]:
  """Every dtype ml_dtypes 0.7 defines (bfloat16, the float8/6/4 kinds, int1..int4, ...)."""
  return sorted(n for n in dir(ml_dtypes) if isinstance(getattr(ml_dtypes, n), type)
                and issubclass(getattr(ml_dtypes, n), np.generic))


@pytest.mark.parametrize("name", ["complex64", "complex128", "int16", "int64", "uint16",
                                  "uint32", "uint64", *_ml_dtypes()])
def test_store_every_bit_pattern_of_every_dtype_round_trips(tmp_path, name):
  # Expected: the bit patterns written (all of them for 1- and 2-byte types, NaN payloads
  # and the values outside a narrow int's range included), under the same dtype name.
  dtype = store.dtype_by_name(name)
  bits = {1: np.arange(256, dtype=np.uint8), 2: np.arange(65536, dtype=np.uint16)}.get(
      dtype.itemsize)
  if bits is None:
    bits = np.random.default_rng(0).integers(0, 255, 64 * dtype.itemsize, np.uint8)
  a = bits.view(dtype).reshape(-1, 2)
  back = read_baseline(write_baseline(tmp_path / "b", {}, {"x": a})).arrays["x"]
  assert back.dtype == dtype and back.dtype.name == name
  assert _bits(back) == _bits(a)


def _recommit(out: Path, manifest: dict, members: dict[str, bytes]) -> Path:
  """Rewrites a baseline as a hostile writer would: any manifest, sealed with a valid
  checksum, and an arrays file of the given members, named as that manifest names it."""
  for old in out.glob("arrays-*.npz"):
    old.unlink()
  manifest["manifest_sha256"] = store.format._checksum(manifest)
  (out / "manifest.json").write_text(json.dumps(manifest))
  with zipfile.ZipFile(out / store.arrays_name(manifest), "w") as z:
    for name, data in members.items():
      z.writestr(name, data)
  return out


def _npy(array: np.ndarray, shape: tuple | None = None) -> bytes:
  """The .npy bytes of ``array``, the header claiming ``shape`` if given."""
  f = io.BytesIO()
  np.lib.format.write_array(f, array, allow_pickle=False)
  data = f.getvalue()
  if shape is None:
    return data
  header = io.BytesIO()
  np.lib.format.write_array_header_1_0(
      header, {"descr": np.lib.format.dtype_to_descr(array.dtype), "fortran_order": False,
               "shape": shape})
  return header.getvalue() + array.tobytes()


HUGE = (2**40,)  # 8 TiB of float64: np.load allocates it (MemoryError) before reading a byte


@pytest.mark.parametrize(("damage", "message"), [
    ("deep_json", "manifest.json is not valid JSON \\(nested too deeply\\)"),
    ("huge_header", r"array 'a' in arrays-\w+\.npz has shape \(1099511627776,\) but "
                    r"manifest.json says \(6,\)"),
    ("huge_everywhere", r"array 'a' in arrays-\w+\.npz holds 48 bytes of data where its shape "
                        r"\(1099511627776,\) needs 8796093022208"),
    ("wrong_member", r"array 'a' in arrays-\w+\.npz has shape \(2,\) but manifest.json says "
                     r"\(6,\)"),
    ("same_shape_other_values", "array 'a' does not match its digest"),
    ("entry_not_a_dict", "malformed entry for array 'a'"),
    ("shape_not_a_list", "malformed entry for array 'a'"),
    ("negative_shape", "malformed entry for array 'a'"),
    ("dtype_not_a_string", "malformed entry for array 'a'"),
    ("digest_missing", "malformed entry for array 'a'"),
    ("stored_as_lies", "malformed entry for array 'a'"),
    ("not_npy", r"array 'a' in arrays-\w+\.npz has no readable .npy header"),
    ("manifest_a_list", "manifest.json is not an nnx-pool-regression manifest"),
    ("version_a_string", "has no known format_version \\(got '3'\\)"),
])
def test_store_hostile_or_damaged_files_give_one_line(tmp_path, damage, message):
  # Before issue 29: RecursionError (deep_json), MemoryError (huge_*), AttributeError or
  # TypeError (the wrong types); now every one is the one-line BaselineError.
  out = _baseline(tmp_path)
  manifest = json.loads((out / "manifest.json").read_text())
  entry = manifest["arrays"]["a"]
  a, b = np.arange(6, dtype=np.float32), np.ones(2, np.int8)
  members = {"a.npy": _npy(a), "b.npy": _npy(b)}
  if damage == "deep_json":
    (out / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
  elif damage == "manifest_a_list":
    (out / "manifest.json").write_text(json.dumps([manifest]))
  elif damage == "version_a_string":
    _recommit(out, {**manifest, "format_version": "3"}, members)
  else:
    if damage == "huge_header":
      members["a.npy"] = _npy(np.arange(6, dtype=np.float64), HUGE)
      entry.update(dtype="float64", stored_as="float64")
    elif damage == "huge_everywhere":  # the manifest claims it too
      members["a.npy"] = _npy(np.arange(6, dtype=np.float64), HUGE)
      entry.update(dtype="float64", stored_as="float64", shape=list(HUGE))
    elif damage == "wrong_member":
      members["a.npy"] = _npy(np.zeros(2, np.float32))
    elif damage == "same_shape_other_values":
      members["a.npy"] = _npy(a + 1)
    elif damage == "entry_not_a_dict":
      manifest["arrays"]["a"] = "float32"
    elif damage == "shape_not_a_list":
      entry["shape"] = "6"
    elif damage == "negative_shape":
      entry["shape"] = [-6]
    elif damage == "dtype_not_a_string":
      entry["dtype"] = 5
    elif damage == "digest_missing":
      del entry["digest"]
    elif damage == "stored_as_lies":
      entry["stored_as"] = "int32"
    elif damage == "not_npy":
      members["a.npy"] = b"not an npy file at all"
    _recommit(out, manifest, members)
  with pytest.raises(BaselineError, match=message) as info:
    read_baseline(out)
  text = str(info.value)
  assert "\n" not in text and text.startswith(f"baseline {out}: ")
  assert store.stored_format_version(out) in (None, 3, "3")  # never raises either
