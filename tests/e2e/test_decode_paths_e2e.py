"""A run with the draft on a chosen decode path (DRAFT_DECODE_PATH) writes
the backend's run's predictions and records the paths each model ran on
(metrics.json's `decode_paths`). The settings refused before loading:
tests/harness/test_decode_path_settings.py."""
import json

import gin
import pytest

from specdec_jax import run as run_lib
from specdec_jax.core.models import decode_paths
from specdec_jax.experiment import loading

from run_helpers import parse_local_tiny

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("clean_gin")]


def _run(out, *bindings):
  """local_tiny.gin, greedy, 3 examples of at most 8 tokens, unpriced."""
  parse_local_tiny([
      f"OUTPUT_DIR = '{out}'", "NUM_EXAMPLES = 3",
      "TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': 8}",
      "PRICE_CALL_COST = False", *bindings
  ])
  metrics = run_lib.run()
  rows = [
      json.loads(line)
      for line in (out / "predictions.jsonl").read_text().splitlines()
  ]
  return metrics, json.loads((out / "metrics.json").read_text()), rows


def test_a_draft_on_the_packed_path_writes_the_default_runs_predictions(
    tmp_path):
  _, default, default_rows = _run(tmp_path / "default")
  backend = {
      role: decode_paths.default_path(loading.model_config(role))
      for role in ("target", "draft")
  }
  assert default["decode_paths"] == backend
  gin.clear_config()
  _, packed, packed_rows = _run(tmp_path / "packed",
                                "DRAFT_DECODE_PATH = 'packed'")
  assert packed["decode_paths"] == {
      "target": backend["target"],
      "draft": "packed"
  }
  assert packed["settings"]["run"]["draft_decode_path"] == "packed"
  assert "draft_decode_path" not in default["settings"]["run"]
  # Exact: the target's greedy outputs, the default run's predictions.
  assert packed["greedy_outputs_identical"] is True
  assert [r["prediction"] for r in packed_rows
         ] == [r["prediction"] for r in default_rows]
  assert len(packed_rows) == 3


def test_a_draft_under_chosen_tiles_writes_the_default_runs_predictions(
    tmp_path):
  """DRAFT_TILES: the draft's GPU kernels (interpret mode here) as one
  kernel over many programs with loads before each barrier; the same
  predictions, the preset recorded."""
  _, _, default_rows = _run(tmp_path / "default")
  gin.clear_config()
  _, tiled, tiled_rows = _run(tmp_path / "tiled", "DRAFT_DECODE_PATH = 'fused'",
                              "DRAFT_TILES = 'tall_mma_persistent_prefetch'")
  assert tiled["decode_paths"]["draft"] == "fused"
  assert tiled["settings"]["run"]["draft_tiles"] == (
      "tall_mma_persistent_prefetch")
  assert tiled["greedy_outputs_identical"] is True
  assert [r["prediction"] for r in tiled_rows
         ] == [r["prediction"] for r in default_rows]
