"""tools.benchmarks.loop_overhead on tiny
random models: what it measures adds up (no timing asserted: the machine may
be shared)."""
import numpy as np
import pytest

from tools.benchmarks import loop_overhead

from conftest import random_model, tiny_config


@pytest.mark.slow
def test_iteration_split_adds_up():
  target = random_model(tiny_config(), seed=0)
  draft = random_model(tiny_config(num_decoder_layers=1), seed=1)
  inputs = [np.asarray([[5, 6, 7, 1]], np.int32)]
  result = loop_overhead.measure(target, draft, inputs, gamma=2, short=2,
                                 long=6, rounds=2)
  split = result["iteration_split_s"]
  assert sorted(split) == sorted([
      "draft_propose", "draft_model_steps", "verification_call", "bookkeeping",
      "iteration_fixed_length", "while_loop"
  ])
  for key in ("draft_propose", "draft_model_steps", "verification_call",
              "iteration_fixed_length"):
    assert split[key] > 0, key
  # Forced lengths (EOS off): every iteration emits 1..γ+1 tokens, and the
  # short decode takes fewer iterations than the long one.
  assert 1 <= result["tokens_per_iteration"] <= 3
  assert result["lengths"] == [2, 6] and result["gamma"] == 2
  # The fixed cost's split: its timed parts are positive, and the rests are
  # each decoder's intercept less exactly those parts.
  fixed = result["fixed_split_s"]
  for key in ("dispatch", "target_start", "draft_start", "baseline_one_token",
              "speculative_one_token"):
    assert fixed[key] > 0, key
  np.testing.assert_allclose(
      fixed["baseline_one_token_rest"], fixed["baseline_one_token"] -
      fixed["dispatch"] - fixed["target_start"] - result["target_step_s"])
  np.testing.assert_allclose(
      fixed["baseline_rest"], result["baseline_fixed_per_example_s"] -
      fixed["dispatch"] - fixed["target_start"])
  np.testing.assert_allclose(
      fixed["speculative_rest"], result["speculative_fixed_per_example_s"] -
      fixed["dispatch"] - fixed["target_start"] - fixed["draft_start"])
