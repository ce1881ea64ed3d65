"""scripts/benchmark_loop_overhead.py on tiny random models: what it
measures adds up (no timing asserted: the machine may be shared)."""
import numpy as np
import pytest

from conftest import load_script, random_model, tiny_config


@pytest.mark.slow
def test_iteration_split_adds_up():
  script = load_script("benchmark_loop_overhead")
  target = random_model(tiny_config(), seed=0)
  draft = random_model(tiny_config(num_decoder_layers=1), seed=1)
  inputs = [np.asarray([[5, 6, 7, 1]], np.int32)]
  result = script.measure(target, draft, inputs, gamma=2, short=2, long=6,
                          rounds=2)
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
