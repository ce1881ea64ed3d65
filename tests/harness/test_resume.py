"""MODE='infer' resumes an interrupted run (`resume`): the tally's state,
the record's checks, the checkpoints' timing and the writer's kept rows
(a real run interrupted and resumed: tests/e2e/test_run_e2e.py)."""
import json
from types import SimpleNamespace

import numpy as np
import pytest

from specdec_jax.checkpoints import digests
from specdec_jax.experiment import batches
from specdec_jax.experiment import predictions
from specdec_jax.experiment import resume
from specdec_jax.files import io_utils

SETTINGS = {"run": {"gamma": 3, "output_dir": "/o"}, "target": {}, "draft": {}}
EXAMPLES = [{
    "input": f"a house {i}",
    "reference": f"ein Haus {i}"
} for i in range(6)]


def _out(rng, rows=2, gamma=3, length=6):
  """A one-path decoder's output on the host, random counts."""
  histogram = rng.integers(0, 3, size=(rows, gamma + 1))
  calls = histogram.sum(1)
  trace = np.full((rows, length), -1)
  for r in range(rows):
    trace[r, :calls[r]] = rng.integers(0, gamma + 1, size=calls[r])
  return SimpleNamespace(
      target_calls=calls, accepted_histogram=histogram,
      tokens=rng.integers(0, 5, size=(rows, length)),
      beta_count=rng.integers(1, 9, size=rows), beta_sum=rng.random(rows) * 4,
      trace_num_accepted=trace, lengths=rng.integers(1, length, size=rows),
      first_round_histogram=rng.integers(0, 3, size=(rows, 3)))


def _json(value):
  return json.loads(json.dumps(value))


CHAIN = SimpleNamespace(target_alone=False, one_path=True, replays=True)


def test_tally_state_survives_json():
  rng = np.random.default_rng(0)
  tally = batches.Tally()
  for seconds in (0.5, 0.25):
    tally.add(_out(rng), np.array([0, 1]), CHAIN, seconds)
  back = batches.Tally.from_state(json.loads(json.dumps(tally.state())))
  assert back.alpha == tally.alpha and back.alpha_beta == tally.alpha_beta
  assert back.interval() == tally.interval()
  assert back.lengths == tally.lengths and back.chains == tally.chains
  np.testing.assert_array_equal(back.histogram, tally.histogram)
  np.testing.assert_array_equal(back.rounds, tally.rounds)
  # Counting goes on as in the tally it was.
  more = _out(rng)
  tally.add(more, np.array([1]), CHAIN, 0.1)
  back.add(more, np.array([1]), CHAIN, 0.1)
  assert back.state() == tally.state()
  with pytest.raises(ValueError, match=r"unknown \['speedup'\]"):
    batches.Tally.from_state({"speedup": 2.0})


def _interrupted(folder, rows=4, per_batch=2, extra=""):
  """An interrupted run's folder: `rows` rows checkpointed (batches of
  `per_batch`), `extra` text written after them."""
  ident = resume.identity(SETTINGS, EXAMPLES)
  writer = predictions.PredictionsWriter(str(folder))
  tally = batches.Tally()
  rng = np.random.default_rng(1)
  clock = iter(range(100)).__next__
  checkpoints = resume.Checkpointer(str(folder), ident, writer, period_s=0,
                                    clock=clock)
  for b in range(rows // per_batch):
    keep = np.arange(per_batch)
    tally.add(_out(rng, rows=per_batch), keep, CHAIN, 0.1)
    writer.add([{
        "inputs": {},
        "prediction": f"Haus {b}/{j}",
        "aux": {}
    } for j in keep])
    checkpoints.after(tally)
  writer._file.write(extra)  # pylint: disable=protected-access
  writer.close()
  return ident, tally


def test_load_resumes_the_checkpointed_rows_only(tmp_path):
  ident, tally = _interrupted(tmp_path, extra='{"half a row')
  resumed = resume.load(str(tmp_path), ident)
  assert resumed.batches == 2 and resumed.examples == 4
  assert resumed.texts() == ["Haus 0/0", "Haus 0/1", "Haus 1/0", "Haus 1/1"]
  assert _json(resumed.new_tally().state()) == _json(tally.state())
  assert resume.Resumed.from_json(_json(resumed.to_json())) == resumed
  # A writer of the resumed run starts with those rows, their digest held.
  writer = predictions.PredictionsWriter(str(tmp_path),
                                         kept_lines=resumed.lines)
  writer.close()
  text = (tmp_path / predictions.PARTIAL_FILE).read_text()
  assert text == "".join(resumed.lines) and writer.written == 4
  assert writer.digest() == digests.digest(text.encode("utf-8"))


@pytest.mark.parametrize("change, logged", [
    ("settings", "an interrupted run of other settings"),
    ("examples", "an interrupted run of other examples"),
    ("row edited", "does not hold unchanged"),
    ("rows cut", "does not hold unchanged"),
    ("record", "not a version 1 record"),
    ("no rows", "cannot resume"),
])
def test_load_starts_over_and_says_why(tmp_path, caplog, change, logged):
  caplog.set_level("INFO")
  ident, _ = _interrupted(tmp_path)
  partial = tmp_path / predictions.PARTIAL_FILE
  state = tmp_path / resume.STATE_FILE
  if change == "settings":
    ident = resume.identity({**SETTINGS, "run": {"gamma": 4}}, EXAMPLES)
  elif change == "examples":
    ident = resume.identity(SETTINGS, EXAMPLES[:-1])
  elif change == "row edited":
    partial.write_text(partial.read_text().replace("Haus 1/0", "Haus 1/9"))
  elif change == "rows cut":
    partial.write_text("".join(partial.read_text().splitlines(True)[:3]))
  elif change == "record":
    state.write_text(json.dumps({"version": 0}))
  else:
    partial.unlink()
  assert resume.load(str(tmp_path), ident) == resume.Resumed()
  assert logged in caplog.text


def test_no_record_is_a_fresh_start(tmp_path):
  assert resume.load(str(tmp_path), {}) == resume.Resumed()
  assert resume.Resumed().new_tally().state() == batches.Tally().state()


def test_checkpoints_wait_their_period_and_need_every_row(tmp_path):
  now = [0.0]
  writer = predictions.PredictionsWriter(str(tmp_path))
  checkpoints = resume.Checkpointer(str(tmp_path), {}, writer, period_s=60,
                                    clock=lambda: now[0])
  tally = batches.Tally()
  rng = np.random.default_rng(2)
  state = tmp_path / resume.STATE_FILE

  def batch():
    tally.add(_out(rng, rows=1), np.array([0]), CHAIN, 0.1)
    writer.add([{"inputs": {}, "prediction": "x", "aux": {}}])

  batch()
  now[0] = 59.0
  checkpoints.after(tally)
  assert not state.exists() and checkpoints.saved == 0
  now[0] = 60.0
  checkpoints.after(tally)
  assert json.loads(state.read_text())["batches"] == 1
  batch()
  checkpoints.after(tally, force=True)  # Ctrl-C: at once
  assert json.loads(state.read_text())["rows"] == 2 and checkpoints.saved == 2
  # Interrupted between the tally and the rows: no checkpoint of it.
  tally.add(_out(rng, rows=1), np.array([0]), CHAIN, 0.1)
  checkpoints.after(tally, force=True)
  assert json.loads(state.read_text())["batches"] == 2
  writer.close()
  checkpoints.finish()
  assert not state.exists()
  # Another process (not the writer) saves nothing.
  quiet = resume.Checkpointer(
      str(tmp_path), {},
      predictions.PredictionsWriter(str(tmp_path), enabled=False), period_s=0)
  quiet.after(batches.Tally(), force=True)
  assert not state.exists() and quiet.saved == 0
  assert quiet.writer.kept() == ("no predictions rows here (process 0 "
                                 "writes them)")


def test_gcs_rows_are_uploaded_at_a_checkpoint_and_dropped_at_the_end(
    monkeypatch):
  """gs:// has no append: a checkpoint uploads every row so far as the
  `.partial` object, removed once predictions.jsonl is written."""
  objects, removed = {}, []
  monkeypatch.setattr(io_utils, "atomic_write",
                      lambda path, data: objects.__setitem__(path, data))
  monkeypatch.setattr(io_utils, "remove", removed.append)
  writer = predictions.PredictionsWriter("gs://b/out",
                                         kept_lines=['{"a": 1}\n'])
  writer.add([{"b": 2}])
  assert writer.kept() == "no predictions rows"  # nothing uploaded yet
  assert writer.durable()
  partial = "gs://b/out/" + predictions.PARTIAL_FILE
  assert objects[partial] == '{"a": 1}\n{"b": 2}\n'
  writer.add([{"c": 3}])
  assert writer.kept() == f"2 predictions rows in {partial}"
  writer.finish(3)
  assert objects["gs://b/out/predictions.jsonl"] == (
      '{"a": 1}\n{"b": 2}\n{"c": 3}\n')
  assert removed == [partial]
