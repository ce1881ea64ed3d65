"""The run and sweep commands with beam search (DECODE='beam') end to end.

A tiny run writes speculative top beams identical to the target's own beam
search (batch 1 and batch 3, two (k, u, γ)), records the beam settings and
counts, and prices nothing it cannot (c, theory: null); a sweep over
BEAM_WIDTH runs and `beam_table` renders it.
"""
import json

import numpy as np
import pytest

from specdec_jax import run as run_lib
from specdec_jax import sweep
from specdec_jax.experiment import arguments
from specdec_jax.experiment import summary
from specdec_jax.metrics import run_metrics
from tools import beam_table

from run_helpers import parse_local_tiny

# A cleared gin configuration before and after each test (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("clean_gin")]

# A tiny, fast run: three examples of at most 6 tokens, one-layer target.
SMALL = [
    "NUM_EXAMPLES = 3", "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 6}",
    "target/T5Config.num_encoder_layers = 1",
    "target/T5Config.num_decoder_layers = 1"
]


def _rows(out):
  return [
      json.loads(line)
      for line in (out / "predictions.jsonl").read_text().splitlines()
  ]


@pytest.mark.parametrize("batch,k,width,gamma", [(1, 2, 2, 2), (3, 3, 6, 3)])
def test_beam_run_end_to_end(batch, k, width, gamma, tmp_path):
  out = tmp_path / "out"
  parse_local_tiny([
      f"OUTPUT_DIR = '{out}'", "DECODE = 'beam'", f"BEAM_SIZE = {k}",
      f"BEAM_WIDTH = {width}", f"GAMMA = {gamma}", f"BATCH_SIZE = {batch}",
      *SMALL
  ])
  metrics = run_lib.run()
  written = json.loads((out / "metrics.json").read_text())
  run_metrics.RunMetrics.from_dict(written)  # the schema reads it back
  rows = _rows(out)
  assert len(rows) == 3
  assert [r["prediction"] for r in rows] == [r["aux"]["baseline"] for r in rows]
  assert written["greedy_outputs_identical"] is True
  assert written["greedy_identical_examples"] == 3
  assert (written["decode"], written["beam_size"], written["beam_alpha"],
          written["beam_width"], written["beam_rows"]) == ("beam", k, 0.6,
                                                           width, 2 * width)
  assert written["draft_model"].endswith(f" beam k={k} u={width} "
                                         f"rows={2 * width}")
  run_settings = written["settings"]["run"]
  assert run_settings["decode"] == "beam" and run_settings["beam_size"] == k
  # Not priced: Theorem 3.8 and c are for sampling one sequence.
  for key in ("cost_coefficient_c", "theoretical_speedup", "target_step_s",
              "verification_cost_ratio", "per_iteration_gamma", "alpha_beta"):
    assert written[key] is None, key
  counts = [n for r in rows for n in r["aux"]["accepted_counts"]]
  assert len(counts) == written["target_calls_speculative"]
  assert np.bincount(counts, minlength=gamma +
                     1).tolist() == written["accepted_histogram"]
  # Every call took kept + 1 beam steps; the baseline one step per call.
  steps = sum(n + 1 for n in counts)
  assert steps == written["target_calls_baseline"]
  assert written["steps_per_target_call"] == pytest.approx(steps / len(counts))
  assert written["alpha"] == pytest.approx(
      sum(counts) / sum(min(n + 1, gamma) for n in counts))
  lines = summary.summary_lines(metrics, arguments.run_arguments())
  assert f"γ={gamma}, beam search k={k}, 3 examples" in lines[0]
  assert "(greedy)" not in lines[0]
  assert "speculative beam search (k=" in lines[1]
  assert "no theory line" in lines[1]
  assert "identical to the target's on 3/3 examples" in lines[1]


def test_a_sweep_over_beam_width(tmp_path):
  points = sweep.parse_sweep_args(["BEAM_WIDTH=2,4"])
  results = tmp_path / "sweep"
  sweep.run_sweep(points, str(results), ["local_tiny.gin"],
                  ["DECODE = 'beam'", "BEAM_SIZE = 2", "GAMMA = 2", *SMALL])
  written = sorted(
      (json.loads(p.read_text()) for p in results.glob("*/metrics.json")),
      key=lambda m: m["beam_width"])
  assert [m["beam_width"] for m in written] == [2, 4]
  assert all(m["greedy_outputs_identical"] for m in written)
  # tools/beam_table.py: one row per beam run (the report leaves them out).
  page = beam_table.render(beam_table.load_runs(str(results)))
  rows = [
      line for line in page.splitlines() if line.startswith("| BEAM_WIDTH=")
  ]
  assert len(rows) == 2 and all(r.endswith("| 3/3 |") for r in rows)
  assert "| 2 | 4 | 8 | 2 |" in rows[1]  # k, u, R = 2u, γ
