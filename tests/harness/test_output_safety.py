"""What a run writes into OUTPUT_DIR stays there, and says what failed.

Issue 42's probe: a planted symbolic link made a run overwrite a file
outside OUTPUT_DIR (the default folders sit under world-writable /tmp); a
full disk left an empty `.partial` that blocked the next run, with an
error naming another file; two takers of one stale lock both held it; a
lock that is a folder gave a bare "[Errno 21]". No JAX compilation here.
"""
import errno
import json
import os
import random
import threading
import time

import pytest

from specdec_jax.config.flag_utils import ConfigError
from specdec_jax.experiment import runner
from specdec_jax.experiment import predictions as predictions_lib
from specdec_jax.files import io_utils
from specdec_jax.files import output_folder
from specdec_jax.terminal import console

PARTIAL = predictions_lib.PARTIAL_FILE


def _settings(gamma):
  return {"run": {"gamma": gamma}}


# ---------------------------------------------------------------------------
# (1) Planted links are replaced, never written through.
# ---------------------------------------------------------------------------
def test_planted_partial_link_is_not_followed(tmp_path):
  """The probe's case: settings copied in, `.partial` a link to a victim;
  `open(..., "w")` truncated the victim and published the link."""
  victim = tmp_path / "victim.txt"
  victim.write_text("precious\n")
  out = tmp_path / "out"
  out.mkdir()
  (out / runner.SETTINGS_FILE).write_text(json.dumps({"settings": _settings(4)
                                                     }))
  (out / PARTIAL).symlink_to(victim)
  lock = runner.check_output_dir(str(out), _settings(4), overwrite=False)
  try:
    writer = predictions_lib.PredictionsWriter(str(out))
    writer.add([{"index": 0}])
    writer.finish(1)
  finally:
    lock.release()
  assert victim.read_text() == "precious\n"
  published = out / "predictions.jsonl"
  assert not published.is_symlink()
  assert published.read_text() == '{"index": 0}\n'


@pytest.mark.parametrize("name", ["metrics.json", "predictions.jsonl"])
def test_planted_result_link_is_replaced_not_followed(tmp_path, name):
  """The temp-file-then-rename helper replaces a link at the destination
  (a guard: this already held before issue 42)."""
  victim = tmp_path / "victim.txt"
  victim.write_text("precious\n")
  (tmp_path / name).symlink_to(victim)
  io_utils.write_json(tmp_path / name, {"a": 1})
  assert victim.read_text() == "precious\n"
  assert not (tmp_path / name).is_symlink()
  assert json.loads((tmp_path / name).read_text()) == {"a": 1}


def test_atomic_write_sets_mode_on_its_own_file(tmp_path, monkeypatch):
  """The temporary file's mode is set through its descriptor: a path-based
  chmod would follow a link swapped in under the temporary name."""

  def no_chmod(*args, **kwargs):
    raise AssertionError(f"os.chmod{args}: by path, follows links")

  monkeypatch.setattr(io_utils.os, "chmod", no_chmod)
  io_utils.write_json(tmp_path / "metrics.json", {"a": 1})
  assert io_utils.create_new(str(tmp_path / output_folder.LOCK_FILE), b"x")
  mode = (tmp_path / "metrics.json").stat().st_mode & 0o777
  assert mode == 0o666 & ~io_utils._umask()  # pylint: disable=protected-access


# ---------------------------------------------------------------------------
# (2) A full disk: the failed file named, no empty `.partial` left behind.
# ---------------------------------------------------------------------------
class _Full:
  """A text file whose every write fails as on a full disk."""

  def __init__(self, f):
    self._f = f

  def write(self, text):
    del text
    raise OSError(errno.ENOSPC, "No space left on device")

  def __getattr__(self, name):
    return getattr(self._f, name)


def test_full_disk_before_any_row_names_partial_and_blocks_nothing(
    tmp_path, monkeypatch):
  """The probe's case: an empty `.partial` stayed, and a run of other
  settings was refused because of it; the error named predictions.jsonl."""
  real_open = open
  monkeypatch.setattr(predictions_lib, "open",
                      lambda *a, **k: _Full(real_open(*a, **k)), raising=False)
  out = str(tmp_path)
  partial = os.path.join(out, PARTIAL)
  lock = runner.check_output_dir(out, _settings(4), overwrite=False)
  try:
    writer = predictions_lib.PredictionsWriter(out)
    writer.add([{"index": 0}, {"index": 1}])
    with pytest.raises(predictions_lib.OutputWriteError) as e:
      writer.finish(2)
  finally:
    lock.release()
  text = str(e.value)
  assert f"writing {partial} failed: No space left on device" in text
  assert "Kept: the summary above, no predictions rows (of 2)" in text
  assert not os.path.lexists(partial)
  assert os.listdir(out) == []  # nothing kept: the settings record went too
  runner.check_output_dir(out, _settings(7), overwrite=False).release()


def test_rows_kept_on_a_full_disk_stay_protected(tmp_path, monkeypatch):
  """Only an empty `.partial` goes: rows written before the disk filled
  are kept (docs/usage/failures.md), and still refused to other settings."""
  real_open = open

  class FullAfterOne:

    def __init__(self, f):
      self._f, self._left = f, 1

    def write(self, text):
      if not self._left:
        raise OSError(errno.ENOSPC, "No space left on device")
      self._left -= 1
      return self._f.write(text)

    def __getattr__(self, name):
      return getattr(self._f, name)

  monkeypatch.setattr(predictions_lib, "open",
                      lambda *a, **k: FullAfterOne(real_open(*a, **k)),
                      raising=False)
  out = str(tmp_path)
  lock = runner.check_output_dir(out, _settings(4), overwrite=False)
  try:
    writer = predictions_lib.PredictionsWriter(out)
    writer.add([{"index": 0}])
    writer.add([{"index": 1}])
    with pytest.raises(predictions_lib.OutputWriteError, match="1 predictions"):
      writer.finish(2)
  finally:
    lock.release()
  assert (tmp_path / PARTIAL).read_text() == '{"index": 0}\n'
  with pytest.raises(ConfigError, match=f"holds {PARTIAL}, which was kept"):
    runner.check_output_dir(out, _settings(7), overwrite=False)


def test_empty_partial_of_a_killed_run_blocks_nothing(tmp_path):
  """A run killed before its first row leaves an empty `.partial`: it
  holds nothing to protect."""
  out = str(tmp_path)
  runner.check_output_dir(out, _settings(4), overwrite=False)  # held...
  (tmp_path / PARTIAL).write_text("")
  (tmp_path / output_folder.LOCK_FILE).unlink()  # ...and killed
  runner.check_output_dir(out, _settings(7), overwrite=False).release()


# ---------------------------------------------------------------------------
# (3) A stale lock is taken over by exactly one of several starters.
# ---------------------------------------------------------------------------
def _race(folder, starters):
  """`starters` threads call `acquire` at once: a Lock or LockedError each."""
  barrier = threading.Barrier(starters)
  results = []

  def start():
    barrier.wait()
    try:
      results.append(output_folder.acquire(folder, "racer"))
    except output_folder.LockedError as e:
      results.append(e)

  threads = [threading.Thread(target=start) for _ in range(starters)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=60)
  return results


def test_stale_lock_is_taken_over_by_exactly_one(tmp_path, monkeypatch):
  """The probe saw two takers of one stale lock in 1 of 200 trials: each
  read it, saw it stale and unlinked whatever was there, the first taker's
  new lock included. A random pause before each unlink of the lock widens
  that window: the code before issue 42 fails in the first trial."""
  real_unlink = os.unlink

  def slow_unlink(path, *args, **kwargs):
    if os.path.basename(os.fspath(path)) == output_folder.LOCK_FILE:
      time.sleep(random.uniform(0, 0.02))
    return real_unlink(path, *args, **kwargs)

  monkeypatch.setattr(io_utils.os, "unlink", slow_unlink)
  stale = {
      "program": "run",
      "pid": 1,
      "host": "elsewhere",
      "started": time.time() - 3 * 24 * 3600,  # older than 24 h: stale
      "started_utc": "x",
      "token": "stale"
  }
  for trial in range(8):
    (tmp_path / output_folder.LOCK_FILE).write_text(json.dumps(stale))
    results = _race(str(tmp_path), starters=6)
    holders = [r for r in results if isinstance(r, output_folder.Lock)]
    for lock in holders:
      lock.release()
    assert len(results) == 6, (trial, results)
    assert len(holders) == 1, (trial, results)
    assert os.listdir(tmp_path) == [], trial


# ---------------------------------------------------------------------------
# (4) A lock that is not a file: one line naming it and what to do.
# ---------------------------------------------------------------------------
def test_lock_that_is_a_folder_is_one_clear_line(tmp_path, capsys):
  """The probe's case: a bare "[Errno 21] Is a directory"."""
  lock = tmp_path / output_folder.LOCK_FILE
  lock.mkdir()

  def body():
    runner.check_output_dir(str(tmp_path), _settings(4), overwrite=False)

  assert console.run_cli("run", body, (ConfigError,)) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("run: error: OUTPUT_DIR="), err
  assert f"{lock} is a folder, not a lock file" in err[0]
  assert f"rmdir {lock}" in err[0]
  assert lock.is_dir()  # left as it is


def test_lock_that_is_a_link_is_refused_not_read(tmp_path):
  """A planted link is not read through (it could name a FIFO or
  /dev/zero) nor taken over: the run is refused, naming it."""
  target = tmp_path / "elsewhere.json"
  target.write_text("{}")
  out = tmp_path / "out"
  out.mkdir()
  (out / output_folder.LOCK_FILE).symlink_to(target)
  with pytest.raises(output_folder.LockedError,
                     match="is a symbolic link, not a"):
    output_folder.acquire(str(out))
  assert (out / output_folder.LOCK_FILE).is_symlink()
