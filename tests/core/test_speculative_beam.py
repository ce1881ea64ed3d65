"""Speculative beam search returns the target's own beams (`beam_search`).

Identity on every sentence, for several (k, u, γ, R), batch 1 and batch > 1,
with drafts good and bad; a deliberately wrong acceptance (no check that the
replayed beams were scored) must fail the same comparison; a perfect draft
must be accepted in full (the draft's state follows the beams).
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tools.benchmarks import beam as beam_benchmark
from specdec_jax.core.decoding import beam_search
from specdec_jax.core.decoding import speculative_beam

from conftest import perturbed
from conftest import random_model
from beam_helpers import assert_same_beams
from beam_helpers import load_reference
from beam_helpers import load_tiny_target

MAX_LEN = 12


@pytest.fixture(scope="module")
def t5x_tiny():
  """(target, inputs [4, 10]): the T5X tiny fixture model and its inputs."""
  return load_tiny_target(), load_reference()["tiny_encoder_input_tokens"]


def baseline(target, inputs, k, alpha=0.6, eos_id=1):
  return beam_search.beam_search(target, inputs, beam_size=k,
                                 max_decode_len=MAX_LEN, alpha=alpha,
                                 eos_id=eos_id)


@pytest.mark.parametrize("k,u,gamma,rows,draft_kind", [
    (2, 2, 1, None, "random"),
    (2, 4, 3, None, "perturbed"),
    (4, 8, 2, 20, "random"),
])
def test_identical_to_baseline_batched(t5x_tiny, k, u, gamma, rows, draft_kind):
  target, inputs = t5x_tiny
  draft = (random_model(target.config.replace(num_decoder_layers=1), seed=2)
           if draft_kind == "random" else perturbed(target, 0.05, seed=1))
  # eos_id 78 is a token this random model emits often: beams finish, so
  # the finished set, the brevity penalty and early stopping are exercised.
  for eos_id in (1, 78):
    base = baseline(target, inputs, k, eos_id=eos_id)
    spec = speculative_beam.speculative_beam_search(target, draft, inputs,
                                                    beam_size=k, width=u,
                                                    gamma=gamma, num_rows=rows,
                                                    max_decode_len=MAX_LEN,
                                                    eos_id=eos_id)
    assert_same_beams(spec.tokens, spec.scores, base.tokens, base.scores,
                      f"k={k} u={u} gamma={gamma} eos={eos_id}")
    # Each element stops on its own; the baseline steps all until all stop.
    assert int(np.max(spec.steps)) == int(base.steps)
    histogram = np.asarray(spec.steps_per_call)
    assert histogram[0] == 0 and histogram.sum() >= int(spec.calls)
    assert (histogram * np.arange(gamma + 2)).sum() == int(np.sum(spec.steps))
  # eos 78 did end beams: the finished set was exercised.
  assert np.any(np.asarray(base.tokens) == 78)


def test_identical_to_baseline_batch_one(t5x_tiny):
  target, inputs = t5x_tiny
  draft = perturbed(target, 0.05, seed=3)
  base = baseline(target, inputs, 4, alpha=0.0)
  for i in range(inputs.shape[0]):
    spec = speculative_beam.speculative_beam_search(
        target, draft, inputs[i:i + 1], beam_size=4, width=4, gamma=2,
        max_decode_len=MAX_LEN, alpha=0.0)
    assert_same_beams(spec.tokens, spec.scores, base.tokens[i:i + 1],
                      base.scores[i:i + 1], f"sentence {i}")


def test_perfect_draft_is_accepted_in_full(t5x_tiny):
  """The target as its own draft, every draft beam scored: each call but
  the last takes γ+1 steps (this fails if the draft's state lost track of
  the beams, which identity alone would not show)."""
  target, inputs = t5x_tiny
  k = u = 2
  gamma = 3
  spec = speculative_beam.speculative_beam_search(target, target, inputs,
                                                  beam_size=k, width=u,
                                                  gamma=gamma,
                                                  num_rows=gamma * u + k,
                                                  max_decode_len=MAX_LEN)
  base = baseline(target, inputs, k)
  assert_same_beams(spec.tokens, spec.scores, base.tokens, base.scores,
                    "perfect draft")
  assert int(spec.calls) == math.ceil(MAX_LEN / (gamma + 1))


def _broken_match(match):
  """Every live beam 'found' (an unscored one gets row 0's logits)."""

  def broken(beams, row_seqs, depth, offset):
    found, row = match(beams, row_seqs, depth, offset)
    return jnp.ones_like(found), jnp.where(found, row, 0)

  return broken


@pytest.mark.parametrize("broken", ["no_membership_check", "no_threshold"])
def test_accepting_unscored_steps_fails(t5x_tiny, monkeypatch, broken):
  """Power: replaying a step without checking that each live beam was
  scored (taking another row's logits), or leaving unscored beams out
  without checking that they are below the step's 2k-th candidate, must
  break the identity."""
  target, inputs = t5x_tiny
  draft = random_model(target.config.replace(num_decoder_layers=1), seed=2)
  if broken == "no_membership_check":
    monkeypatch.setattr(speculative_beam, "_match",
                        _broken_match(speculative_beam._match))
  else:
    monkeypatch.setattr(speculative_beam, "_step_is_scored",
                        lambda beams, found, values: jnp.array(True))
  # A fresh function to trace: jit's cache may hold the real program.
  loop = jax.jit(
      lambda *a, **kw: speculative_beam.speculative_beam_loop(*a, **kw),
      static_argnames=("beam_size", "width", "gamma", "num_rows",
                       "max_decode_len"))
  spec = loop(target, draft, jnp.asarray(inputs), jnp.float32(0.6),
              jnp.int32(1), beam_size=2, width=2, gamma=3, num_rows=4,
              max_decode_len=MAX_LEN)
  base = baseline(target, inputs, 2)
  assert not np.array_equal(np.asarray(spec.tokens), np.asarray(base.tokens))


@pytest.mark.parametrize("kwargs,match", [
    (dict(gamma=0), "gamma"),
    (dict(width=1), "width"),
    (dict(num_rows=1), "num_rows"),
    (dict(num_rows=100), "num_rows"),
])
def test_bad_settings_are_named(kwargs, match):
  settings = dict(beam_size=2, width=2, gamma=2, num_rows=4)
  settings.update(kwargs)
  with pytest.raises(ValueError, match=match):
    speculative_beam.check_speculative_beam_settings(**settings)


def test_benchmark_script_configurations():
  """tools.benchmarks.beam times the baseline and
  γ × u configurations (u as multiples of k, R = 2u unless given), and
  rejects bad counts."""
  args = beam_benchmark.parse_args(["--gammas", "2,3", "--widths", "1,2"])
  names = [c["name"] for c in beam_benchmark.configurations(args)]
  assert names == [
      "beam", "spec_g2_u4_r8", "spec_g2_u8_r16", "spec_g3_u4_r8",
      "spec_g3_u8_r16"
  ]
  with pytest.raises(SystemExit):
    beam_benchmark.parse_args(["--rounds", "0"])
