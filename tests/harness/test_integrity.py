"""Integrity of what the harness reads back from disk (issue 42).

A crafted DIGESTS.json, a truncated cached CPU kernel, a vocabulary swapped
under a training run, a corrupt compilation cache, a garbled
feature_config.json: each is refused or repaired, with a message naming the
file, instead of reading anything, crashing or training on garbage (those
that start processes or train: tests/e2e/test_integrity_e2e.py, with the
compilation cache's lock between processes).
"""
import json
import os
import time

import pytest

from specdec_jax.files import compilation_cache
from specdec_jax import checkpoints
from specdec_jax.files import io_utils
from specdec_jax.checkpoints import digests
from specdec_jax.checkpoints import feature_draft
from specdec_jax.core import kernels

import kernel_helpers


# ---------------------------------------------------------------------------
# 1. DIGESTS.json entries stay inside the checkpoint folder.
# ---------------------------------------------------------------------------
def _manifest_folder(tmp_path, name):
  """A checkpoint folder whose DIGESTS.json lists one entry, `name`."""
  folder = tmp_path / "checkpoint_1"
  folder.mkdir()
  (folder / "ok.bin").write_bytes(b"weights")
  files = {
      "ok.bin": {
          "bytes": 7,
          "sha256": digests.digest(b"weights")
      },
      name: {
          "bytes": 1,
          "sha256": "0" * 64
      }
  }
  (folder / digests.MANIFEST_FILE).write_text(
      json.dumps({
          "algorithm": "sha256",
          "files": files
      }))
  return folder


@pytest.fixture
def reads(monkeypatch):
  """Every path `io_utils.read_bytes` is asked for; /dev files refused (a
  read of /dev/zero would fill the memory before failing)."""
  seen = []
  real = io_utils.read_bytes

  def read_bytes(path, *args, **kwargs):
    seen.append(os.fspath(path))
    assert not os.fspath(path).startswith("/dev/"), f"read {path}"
    return real(path, *args, **kwargs)

  monkeypatch.setattr(io_utils, "read_bytes", read_bytes)
  return seen


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "device", "symlink"])
def test_manifest_entries_stay_inside_the_folder(tmp_path, reads, kind):
  secret = tmp_path / "secret.txt"
  secret.write_text("private")
  name = {
      "dotdot": "../secret.txt",
      "absolute": str(secret),
      "device": "/dev/zero",
      "symlink": "link.txt",
  }[kind]
  folder = _manifest_folder(tmp_path, name)
  if kind == "symlink":
    os.symlink(secret, folder / "link.txt")
  with pytest.raises(checkpoints.CheckpointError) as e:
    digests.verify_manifest(str(folder))
  message = str(e.value)
  assert str(folder) in message and repr(name) in message
  assert "allowed" in message.lower()
  assert not any(p.endswith(("secret.txt", "link.txt", "zero")) for p in reads)
  # The loader refuses it the same way, before reading an array.
  with pytest.raises(checkpoints.CheckpointError, match="DIGESTS.json entry"):
    checkpoints.load_t5x_params(str(folder))


def test_manifest_entry_that_is_not_a_regular_file(tmp_path, reads):
  folder = _manifest_folder(tmp_path, "sub")
  (folder / "sub").mkdir()
  with pytest.raises(checkpoints.CheckpointError, match="not a regular file"):
    digests.verify_manifest(str(folder))
  assert reads == [str(folder / digests.MANIFEST_FILE)]


def test_manifest_inside_entries_still_verify(tmp_path):
  folder = tmp_path / "checkpoint_1"
  (folder / "state").mkdir(parents=True)
  (folder / "state" / "a.bin").write_bytes(b"abc")
  os.symlink("state/a.bin", folder / "alias.bin")  # Inside: followed.
  digests.write_manifest(str(folder))
  assert digests.verify_manifest(str(folder))


# ---------------------------------------------------------------------------
# 2. A truncated cached CPU kernel is rebuilt, not loaded (in a fresh
#    process too: tests/e2e/test_integrity_e2e.py).
# ---------------------------------------------------------------------------
@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
  return kernel_helpers.fake_compiler(tmp_path, monkeypatch)


def test_truncated_kernel_is_rebuilt_by_build(kernel_cache):
  path = kernels.build()
  size = path.stat().st_size
  assert kernel_helpers.builds(kernel_cache) == 1
  assert kernels.build(
  ) == path and kernel_helpers.builds(kernel_cache) == 1  # Cached.
  with open(path, "r+b") as f:
    f.truncate(size // 2)
  assert kernels.build() == path and kernel_helpers.builds(kernel_cache) == 2
  assert path.stat().st_size == size
  # A library without its record (an older version's) is rebuilt too.
  for record in path.parent.glob("*.json"):
    record.unlink()
  kernels.build()
  assert kernel_helpers.builds(kernel_cache) == 3


# ---------------------------------------------------------------------------
# 3. A corrupt compilation cache entry is named once and removed (in a
#    fresh process: tests/e2e/test_integrity_e2e.py).
# ---------------------------------------------------------------------------
def test_cache_repair_removes_only_that_module_entries(tmp_path):
  folder = tmp_path / "jax-cache"
  folder.mkdir()
  for name in ("jit_f-ab12-cache", "jit_f-ab12-atime", "jit_fg-cd34-cache"):
    (folder / name).write_bytes(b"x")
  assert compilation_cache.repair_entry(
      str(folder), "Error reading persistent compilation cache entry for "
      "'jit_f': error: Error -3 while decompressing data") == "jit_f"
  assert sorted(p.name for p in folder.iterdir()) == ["jit_fg-cd34-cache"]
  assert compilation_cache.repair_entry(str(folder), "another warning") is None
  # A TPU program compiled ahead of time (COMPILE_TOPOLOGY) cannot load
  # without a TPU client: not corrupt, kept.
  (folder / "jit_g-ef56-cache").write_bytes(b"x")
  assert compilation_cache.repair_entry(
      str(folder), "Error reading persistent compilation cache entry for "
      "'jit_g': JaxRuntimeError: INVALID_ARGUMENT: PjRtCompiler must be "
      "constructed with a Client to call DeserializeLoadedExecutable.") is None
  assert (folder / "jit_g-ef56-cache").exists()
  # A cache JAX cannot open fails every read: its entries are not corrupt.
  assert compilation_cache.repair_entry(
      str(folder), "Error reading persistent compilation cache entry for "
      "'jit_g': RuntimeError: Please install the `filelock` package to set "
      "`jax_compilation_cache_max_size`") is None
  assert (folder / "jit_g-ef56-cache").exists()


# ---------------------------------------------------------------------------
# 4. An invalid feature_config.json is named.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "{not json", '{"nope": 1}', "[1, 2]", '{"vocab_size": -3}',
    '{"dtype": "nope"}'
])
def test_invalid_feature_config_names_the_file(tmp_path, text):
  path = tmp_path / feature_draft.FEATURE_CONFIG_FILE
  path.write_text(text)
  with pytest.raises(ValueError) as e:
    feature_draft.read_config(str(tmp_path))
  assert str(path) in str(e.value) and "allowed" in str(e.value).lower()


def test_a_locked_cache_write_scans_and_evicts_nothing(tmp_path):
  """JAX's size-limited cache scans every entry on each write (a cold test
  suite spent most of its compile time there); after
  `skip_eviction_scans` nothing is scanned or evicted, and the lock stays."""
  from jax._src import lru_cache  # pylint: disable=g-import-not-at-top
  assert compilation_cache.skip_eviction_scans()
  cache = lru_cache.LRUCache(str(tmp_path), max_size=10)
  cache.put("a", b"12345678")
  cache.put("b", b"87654321")  # 16 bytes > 10: JAX's scan would evict "a"
  assert cache.get("a") == b"12345678" and cache.get("b") == b"87654321"
  assert cache.eviction_enabled and (tmp_path / ".lockfile").exists()


def test_a_cache_entry_appears_whole_or_not_at_all(tmp_path, monkeypatch):
  """`atomic_writes`: a writer that dies mid-write (here: the write raises
  after half the bytes) leaves no entry for a reader to abort on; the next
  write puts the whole entry in place, and no partial file is left."""
  from jax._src import lru_cache  # pylint: disable=g-import-not-at-top
  assert compilation_cache.atomic_writes()
  cache = lru_cache.LRUCache(str(tmp_path), max_size=1 << 20)
  path_type = type(cache.path)  # etils' epath.Path where installed
  write = path_type.write_bytes

  def dies_halfway(self, data):
    write(self, data[:len(data) // 2])
    raise OSError("killed")

  monkeypatch.setattr(path_type, "write_bytes", dies_halfway)
  with pytest.raises(OSError, match="killed"):
    cache.put("k", b"0123456789")
  assert not (tmp_path / "k-cache").exists() and cache.get("k") is None
  monkeypatch.setattr(path_type, "write_bytes", write)
  cache.put("k", b"0123456789")
  assert cache.get("k") == b"0123456789"
  assert sorted(
      p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
          "k-atime", "k-cache"
      ]
  # This process's next write reused its partial file's name.
  assert not list(tmp_path.glob(".k.*.partial"))


def test_a_cache_folder_from_before_the_lock_gets_its_access_times(tmp_path):
  (tmp_path / "jit_f-abc-cache").write_bytes(b"x")
  (tmp_path / "jit_g-def-cache").write_bytes(b"y")
  (tmp_path / "jit_g-def-atime").write_bytes((7).to_bytes(8, "little"))
  assert compilation_cache.add_missing_atimes(str(tmp_path)) == 1
  assert len((tmp_path / "jit_f-abc-atime").read_bytes()) == 8
  assert (tmp_path / "jit_g-def-atime").read_bytes() == (7).to_bytes(
      8, "little")
  assert compilation_cache.add_missing_atimes(str(tmp_path / "none")) == 0


def test_a_killed_writers_old_partial_file_is_removed(tmp_path):
  """`remove_stale_partials`: an hour-old `.<key>.<pid>.partial` goes; a
  fresh one (a writer still writing) and the entries stay."""
  old, fresh = tmp_path / ".k.123.partial", tmp_path / ".j.456.partial"
  entry = tmp_path / "k-cache"
  for path in (old, fresh, entry):
    path.write_bytes(b"x")
  hour_ago = time.time() - 3601
  os.utime(old, (hour_ago, hour_ago))
  os.utime(entry, (hour_ago, hour_ago))
  assert compilation_cache.remove_stale_partials(str(tmp_path)) == 1
  assert not old.exists() and fresh.exists() and entry.exists()
  assert compilation_cache.remove_stale_partials(str(tmp_path / "none")) == 0
