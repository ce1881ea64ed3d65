"""The run and sweep commands with beam search (DECODE='beam').

* Bad beam settings (the beam macros, and what speculative beam search
  needs: T=0, a fixed γ, LENIENCE=1, ACCEPTANCE='token', TREE_WIDTH=1, a
  draft model) stop the run before any model is loaded, naming the macro;
  nothing is written.
* The beam decoders on a tiny model, and the memory check.

A run and a sweep end to end: tests/e2e/test_run_beam_e2e.py.
"""
from conftest import random_model
from conftest import tiny_config
import numpy as np
import pytest
from run_helpers import certify_arguments
from run_helpers import parse_local_tiny

from specdec_jax import run as run_lib
from specdec_jax.core.decoding import beam_decoders
from specdec_jax.core.decoding import beam_search
from specdec_jax.experiment import arguments
from specdec_jax.experiment import decode_modes

pytestmark = pytest.mark.usefixtures("clean_gin")


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
        (["BEAM_SIZE = 2"], [
            "BEAM_SIZE=2 with ACCEPTANCE='token'", "only DECODE='beam' reads it"
        ]),
        (["DECODE = 'beam'", "TEMPERATURE = 1.0"
         ], ["DECODE='beam' with TEMPERATURE=1.0", "allowed: TEMPERATURE=0"]),
        (["DECODE = 'beam'", "GAMMA = 'auto'"
         ], ["DECODE='beam' with GAMMA='auto'", "an integer GAMMA >= 1"]),
        (["DECODE = 'beam'", "LENIENCE = 0.5"
         ], ["LENIENCE=0.5 with DECODE='beam'", "allowed: LENIENCE=1.0"]),
        (["DECODE = 'beam'", "ACCEPTANCE = 'block'"
         ], ["DECODE='beam' with ACCEPTANCE='block'", "ACCEPTANCE='token'"]),
        (["DECODE = 'beam'", "ACCEPTANCE = 'tree'", "TREE_WIDTH = 2"
         ], ["DECODE='beam' with ACCEPTANCE='tree'"]),
        (["DECODE = 'beam'", "TREE_WIDTH = 2"
         ], ["TREE_WIDTH=2 with DECODE='beam'", "allowed: TREE_WIDTH=1"]),
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
  parse_local_tiny([f"OUTPUT_DIR = '{out}'", *bindings])
  with pytest.raises(run_lib.ConfigError) as e:
    run_lib.run(providers=no_load)
  assert not out.exists()
  for text in expect:
    assert text in str(e.value), (text, str(e.value))


def test_beam_defaults_and_resolved_width_and_rows():
  assert certify_arguments(["DECODE = 'beam'"
                           ]).decode_mode == (decode_modes.BeamMode(
                               size=4, alpha=0.6, width=None, rows=None))
  beam = certify_arguments(["DECODE = 'beam'", "BEAM_SIZE = 2", "GAMMA = 1"])
  assert beam.decode_mode.draft_width() == 2
  assert beam.decode_mode.num_rows(beam.gamma) == 4
  # 2u = 8 rows would be more than γ·u + k = 1·4 + 2 = 6: the default stops
  # at all of the draft's beams.
  wide = decode_modes.BeamMode(size=2, width=4)
  assert wide.num_rows(1) == 6


def test_beam_settings_are_recorded_for_beam_runs_only():
  """A sampling run's settings record is as before DECODE existed (its
  OVERWRITE comparison with earlier runs holds); a beam run's has them."""
  from specdec_jax.experiment import plan as plan_lib  # pylint: disable=g-import-not-at-top

  class Vocab:
    vocab_size = 32

  config = tiny_config(vocab_size=32)

  def record(*bindings):
    args = certify_arguments(list(bindings))
    return plan_lib.settings_record(args, decode_modes.mode_of(args), config,
                                    config, Vocab())["run"]

  keys = {"decode", "beam_size", "beam_alpha", "beam_width", "beam_rows"}
  assert not keys & set(record())
  beam = record("DECODE = 'beam'", "BEAM_SIZE = 2", "BEAM_WIDTH = 3",
                "GAMMA = 2")
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


def test_the_memory_check_counts_the_beam_rows(tmp_path, monkeypatch):
  """A beam run holds B·(R + k) cache rows: refused, naming the beam macros
  (before any model loads: `plan.RunPlan.build` runs it)."""
  from specdec_jax.checkpoints import sizes  # pylint: disable=g-import-not-at-top
  from specdec_jax.experiment import plan  # pylint: disable=g-import-not-at-top
  config = tiny_config(vocab_size=32)
  overrides = {"output_dir": str(tmp_path), "batch_size": 2, "gamma": 2}
  sample = arguments.run_arguments(overrides)
  beam = arguments.run_arguments({
      **overrides, "decode_mode": decode_modes.BEAM
  })
  # Room for the sampled run's 2 rows, not the beam run's 2·(8 + 4) = 24
  # (its largest phase: `plan.program_estimates`).
  both = {"target": config, "draft": config}
  phases = plan.program_estimates(both, 24, 512, 128)
  need = max(sum(parts.values()) for parts in phases.values())
  monkeypatch.setattr(sizes, "available_bytes", lambda: need // 2)
  modes = decode_modes.mode_of
  plan._check_memory(sample, modes(sample), config, config)  # pylint: disable=protected-access
  with pytest.raises(run_lib.ConfigError) as e:
    plan._check_memory(beam, modes(beam), config, config)  # pylint: disable=protected-access
  assert "BATCH_SIZE=24" in str(e.value)
  assert "BEAM_ROWS + BEAM_SIZE = 8 + 4" in str(e.value)
