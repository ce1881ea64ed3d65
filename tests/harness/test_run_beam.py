"""The run and sweep commands with beam search (DECODE='beam').

* Bad beam settings (the beam macros, and what speculative beam search
  needs: T=0, a fixed γ, LENIENCE=1, ACCEPTANCE='token', TREE_WIDTH=1, a
  draft model) stop the run before any model is loaded, naming the macro;
  nothing is written.
* A tiny run end to end writes speculative top beams identical to the
  target's own beam search (batch 1 and batch 3, two (k, u, γ)), records the
  beam settings and counts, and prices nothing it cannot (c, theory: null).
* A sweep over BEAM_WIDTH runs.
"""
import json

import numpy as np
import pytest

from specdec_jax.config import gin_utils
from specdec_jax import run as run_lib
from specdec_jax.metrics import run_metrics
from specdec_jax import sweep
from specdec_jax.core.decoding import beam_decoders
from specdec_jax.core.decoding import beam_search
from specdec_jax.experiment import arguments
from specdec_jax.experiment import summary
from specdec_jax.reporting import beam_table

from conftest import random_model
from conftest import tiny_config

pytestmark = pytest.mark.usefixtures("clean_gin")

# A tiny, fast run: three examples of at most 6 tokens, one-layer target.
SMALL = [
    "NUM_EXAMPLES = 3", "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 6}",
    "target/T5Config.num_encoder_layers = 1",
    "target/T5Config.num_decoder_layers = 1"
]


def _parse(bindings):
  gin_utils.parse_gin(["local_tiny.gin"], bindings, finalize=False)


@pytest.mark.parametrize(
    "bindings,expect",
    [
        (["DECODE = 'beams'"], ["DECODE='beams': allowed: 'sample'"]),
        (["DECODE = 'beam'", "BEAM_SIZE = 0"
         ], ["BEAM_SIZE=0: allowed: an integer >= 1"]),
        (["DECODE = 'beam'", "BEAM_ALPHA = -0.5"
         ], ["BEAM_ALPHA=-0.5: allowed: a finite number >= 0"]),
        (["DECODE = 'beam'", "BEAM_SIZE = 4", "BEAM_WIDTH = 3"
         ], ["BEAM_WIDTH=3 with BEAM_SIZE=4", "an integer >= BEAM_SIZE = 4"]),
        (["DECODE = 'beam'", "BEAM_SIZE = 2", "GAMMA = 2", "BEAM_ROWS = 7"
         ], ["BEAM_ROWS=7", "from 2 (one row per beam) to", "= 6"]),
        (["BEAM_SIZE = 2"], ["BEAM_SIZE=2 with DECODE='sample'"]),
        (["DECODE = 'beam'", "TEMPERATURE = 1.0"
         ], ["DECODE='beam' with TEMPERATURE=1.0", "allowed: TEMPERATURE=0"]),
        (["DECODE = 'beam'", "GAMMA = 'auto'"
         ], ["DECODE='beam' with GAMMA='auto'", "an integer GAMMA >= 1"]),
        (["DECODE = 'beam'", "LENIENCE = 0.5"
         ], ["DECODE='beam' with LENIENCE=0.5", "allowed: LENIENCE=1"]),
        (["DECODE = 'beam'", "ACCEPTANCE = 'block'"
         ], ["DECODE='beam' with ACCEPTANCE='block'", "ACCEPTANCE='token'"]),
        (["DECODE = 'beam'", "ACCEPTANCE = 'tree'", "TREE_WIDTH = 2"
         ], ["DECODE='beam' with ACCEPTANCE='tree'"]),
        (["DECODE = 'beam'", "TREE_WIDTH = 2"
         ], ["DECODE='beam' with TREE_WIDTH=2", "allowed: TREE_WIDTH=1"]),
        (["DECODE = 'beam'", "DRAFTER = 'prompt_lookup'"], [
            "DECODE='beam' with DRAFTER='prompt_lookup'",
            "allowed: DRAFTER 'model' or 'shared_encoder'"
        ]),
        (["DECODE = 'beam'", "DRAFTER = 'bigram'"
         ], ["DECODE='beam' with DRAFTER='bigram'"]),
        (["DECODE = 'beam'", "ADAPTIVE_THRESHOLD = 0.5"
         ], ["DECODE='beam' with ADAPTIVE_THRESHOLD=0.5"]),
        (["DECODE = 'beam'", "MODE = 'alpha'"
         ], ["DECODE='beam' with MODE='alpha'"]),
        # The byte vocabulary's 259 tokens: at most 129 beams.
        (["DECODE = 'beam'", "BEAM_SIZE = 130", "GAMMA = 1"
         ], ["BEAM_SIZE=130", "Allowed: 1 to 129"]),
    ])
def test_bad_beam_settings_fail_before_loading(bindings, expect, tmp_path,
                                               no_load):
  out = tmp_path / "out"
  _parse([f"OUTPUT_DIR = '{out}'", *bindings])
  with pytest.raises(run_lib.ConfigError) as e:
    run_lib.run(providers=no_load)
  assert not out.exists()
  for text in expect:
    assert text in str(e.value), (text, str(e.value))


def test_beam_defaults_and_resolved_width_and_rows(tmp_path):
  from specdec_jax.experiment import beam_settings  # pylint: disable=g-import-not-at-top
  args = arguments.run_arguments({"output_dir": str(tmp_path)})
  assert (args.decode, args.beam_size, args.beam_alpha, args.beam_width,
          args.beam_rows) == ("sample", 4, 0.6, None, None)
  beam = arguments.run_arguments({
      "output_dir": str(tmp_path),
      "decode": "beam",
      "beam_size": 2,
      "gamma": 1
  })
  assert beam_settings.width(beam) == 2 and beam_settings.rows(beam) == 4
  # 2u = 8 rows would be more than γ·u + k = 1·4 + 2 = 6: the default stops
  # at all of the draft's beams.
  wide = arguments.run_arguments({
      "output_dir": str(tmp_path),
      "decode": "beam",
      "beam_size": 2,
      "beam_width": 4,
      "gamma": 1
  })
  assert beam_settings.rows(wide) == 6


def test_beam_settings_are_recorded_for_beam_runs_only(tmp_path):
  """A sampling run's settings record is as before DECODE existed (its
  OVERWRITE comparison with earlier runs holds); a beam run's has them."""
  from specdec_jax.experiment import output_dir  # pylint: disable=g-import-not-at-top

  class Vocab:
    vocab_size = 32

  config = tiny_config(vocab_size=32)

  def record(**overrides):
    args = arguments.run_arguments({"output_dir": str(tmp_path), **overrides})
    return output_dir.settings_record(args, config, config, Vocab())["run"]

  keys = {"decode", "beam_size", "beam_alpha", "beam_width", "beam_rows"}
  assert not keys & set(record())
  beam = record(decode="beam", beam_size=2, beam_width=3, gamma=2)
  assert {
      k: beam[k] for k in keys
  } == {
      "decode": "beam",
      "beam_size": 2,
      "beam_alpha": 0.6,
      "beam_width": 3,
      "beam_rows": None
  }


def test_the_run_decoders_return_the_top_beam_and_per_element_counts():
  """`beam_decoders`: the run's view of both searches (no harness)."""
  config = tiny_config(vocab_size=32)
  target = random_model(config, seed=1)
  draft = random_model(config.replace(num_decoder_layers=1), seed=2)
  enc = np.random.default_rng(0).integers(2, 32, size=(3, 5)).astype(np.int32)
  full = beam_search.beam_search(target, enc, beam_size=2, max_decode_len=7,
                                 alpha=0.6, eos_id=5)
  base = beam_decoders.beam_decoder(target, beam_size=2, max_decode_length=7,
                                    alpha=0.6, eos_id=5)(enc, None)
  spec = beam_decoders.speculative_beam_decoder(target, draft, beam_size=2,
                                                gamma=2, max_decode_length=7,
                                                alpha=0.6, width=3,
                                                eos_id=5)(enc, None)
  np.testing.assert_array_equal(base.tokens, full.best)
  np.testing.assert_array_equal(spec.tokens, full.best)
  assert int(np.max(base.target_calls)) == int(full.steps)
  calls = np.asarray(spec.target_calls)
  trace = np.asarray(spec.trace_num_accepted)
  hist = np.asarray(spec.accepted_histogram)
  assert np.all(calls >= 1)
  for b in range(3):
    kept = trace[b, :calls[b]]
    assert np.all((kept >= 0) & (kept <= 2))
    assert np.all(trace[b, calls[b]:] == -1)
    np.testing.assert_array_equal(np.bincount(kept, minlength=3), hist[b])
    # Each call takes kept + 1 steps: the element's own search's steps.
    assert int(np.sum(kept + 1)) == int(base.target_calls[b])


def _rows(out):
  return [
      json.loads(line)
      for line in (out / "predictions.jsonl").read_text().splitlines()
  ]


@pytest.mark.slow
@pytest.mark.parametrize("batch,k,width,gamma", [(1, 2, 2, 2), (3, 3, 6, 3)])
def test_beam_run_end_to_end(batch, k, width, gamma, tmp_path):
  out = tmp_path / "out"
  _parse([
      f"OUTPUT_DIR = '{out}'", "DECODE = 'beam'", f"BEAM_SIZE = {k}",
      f"BEAM_WIDTH = {width}", f"GAMMA = {gamma}", f"BATCH_SIZE = {batch}",
      *SMALL
  ])
  metrics = run_lib.run()
  written = json.loads((out / "metrics.json").read_text())
  run_metrics.RunMetrics.from_dict(written)  # the schema reads it back
  rows = _rows(out)
  assert len(rows) == 3
  assert [r["speculative"] for r in rows] == [r["baseline"] for r in rows]
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
  counts = [n for r in rows for n in r["accepted_counts"]]
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


@pytest.mark.slow
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
  # scripts/beam_table.py: one row per beam run (the report leaves them out).
  page = beam_table.render(beam_table.load_runs(str(results)))
  rows = [
      line for line in page.splitlines() if line.startswith("| BEAM_WIDTH=")
  ]
  assert len(rows) == 2 and all(r.endswith("| 3/3 |") for r in rows)
  assert "| 2 | 4 | 8 | 2 |" in rows[1]  # k, u, R = 2u, γ


def test_the_memory_check_counts_the_beam_rows(tmp_path, monkeypatch):
  """A beam run holds B·(R + k) cache rows: refused, naming the beam macros
  (before any model loads: `plan.RunPlan.build` runs it)."""
  from specdec_jax.experiment import memory  # pylint: disable=g-import-not-at-top
  from specdec_jax.experiment import plan  # pylint: disable=g-import-not-at-top
  config = tiny_config(vocab_size=32)
  overrides = {"output_dir": str(tmp_path), "batch_size": 2, "gamma": 2}
  sample = arguments.run_arguments(overrides)
  beam = arguments.run_arguments({**overrides, "decode": "beam"})
  # Room for the sampled run's 2 rows, not the beam run's 2·(8 + 4) = 24.
  need = sum(memory.estimate(config, 24, 512, 128).values()) + sum(
      memory.estimate(config, 24, 512, 128).values())
  monkeypatch.setattr(memory, "available_bytes", lambda: need // 2)
  plan._check_memory(sample, config, config)  # pylint: disable=protected-access
  with pytest.raises(run_lib.ConfigError) as e:
    plan._check_memory(beam, config, config)  # pylint: disable=protected-access
  assert "BATCH_SIZE=24" in str(e.value)
  assert "BEAM_ROWS + BEAM_SIZE = 8 + 4" in str(e.value)
