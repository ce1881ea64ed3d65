"""MODE='infer': the speculative decoder only, T5X's prediction rows."""
import json
import pathlib

import pytest

from specdec_jax.config import gin_utils
from specdec_jax import run as run_lib
from specdec_jax.experiment import arguments
from specdec_jax.experiment import summary

BEFORE_43 = pathlib.Path(__file__).parents[1] / "fixtures" / "before_issue43"

pytestmark = pytest.mark.usefixtures("clean_gin")


def _rows(path: pathlib.Path):
  return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_infer_writes_the_speculative_column_of_a_walltime_run(
    tmp_path, caplog):
  """Same settings and seed: every prediction is the walltime run's
  `speculative` text (a sampled tree run: the same draws), with no
  baseline decode and no pricing."""
  caplog.set_level("INFO")
  out = tmp_path / "infer"
  gin_utils.parse_gin(["local_tiny.gin"], [
      f"OUTPUT_DIR = '{out}'", "MODE = 'infer'", "TEMPERATURE = 1.0",
      "ACCEPTANCE = 'tree'", "TREE_WIDTH = 2"
  ], finalize=False)
  record = run_lib.run()
  walltime = _rows(BEFORE_43 / "tree" / "predictions.jsonl")
  rows = _rows(out / "predictions.jsonl")
  assert [r["prediction"] for r in rows] == [r["speculative"] for r in walltime]
  assert [r["inputs"] for r in rows] == [r["input"] for r in walltime]
  assert [r["targets"] for r in rows] == [r["reference"] for r in walltime]
  assert all(
      set(r) == {"index", "inputs", "prediction", "targets", "target_calls"}
      for r in rows)
  assert not (out / "metrics.json").exists()
  written = json.loads((out / "infer.json").read_text())
  assert written == json.loads(json.dumps(record))
  assert written["mode"] == "infer" and written["decode_mode"] == "tree"
  assert written["num_examples"] == len(walltime) == 12
  assert written["target_calls"] == sum(r["target_calls"] for r in rows)
  assert written["tokens_per_target_call"] > 1 and 0 <= written["alpha"] <= 1
  assert set(written["quality"]) == {"bleu"}
  # Nothing but the speculative decoder ran: no baseline, no pricing.
  assert "Compiling both decoders" not in caplog.text
  assert "Pricing c" not in caplog.text
  assert "infer: batch 12/12" in caplog.text and "ETA" in caplog.text
  lines = summary.summary_lines(record, arguments.run_arguments())
  assert lines[1].startswith("inference: 12 examples decoded speculatively "
                             "(tree)")
  assert lines[2].startswith("quality: BLEU ")
  assert lines[-1].startswith(f"results: {out / 'predictions.jsonl'}, ")


def test_infer_is_a_mode_and_beams_may_infer():
  args = arguments.RunArguments(output_dir="/tmp/unused", mode="infer",
                                decode="beam", beam_size=2)
  assert args.mode == "infer"
  with pytest.raises(gin_utils.ConfigError, match="MODE='alph'"):
    arguments.RunArguments(output_dir="/tmp/unused", mode="alph")
