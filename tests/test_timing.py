"""`timing.call_seconds`: the one way run prices c and the verification call.

No timing is asserted beyond positivity (the machine may be shared); what
is asserted is what is timed and in which order.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import timing

from conftest import random_model, tiny_config


def test_call_seconds_times_each_kind_of_call():
  target = random_model(tiny_config(), seed=0)
  draft = random_model(tiny_config(num_decoder_layers=1), seed=1)
  inputs = np.full((2, 5), 3, np.int32)
  seconds = timing.call_seconds(
      {"step": (target, 1), "verify": (target, 4), "draft": (draft, 1)},
      inputs, fill=3, cache_len=8, steps=2, repeats=2)
  assert sorted(seconds) == ["draft", "step", "verify"]
  assert all(isinstance(s, float) and s > 0 for s in seconds.values())


def test_call_seconds_interleaves_rounds(monkeypatch):
  order = []

  def call_loop(model, cache, fill, *, k, steps):
    order.append((model, k, steps, int(fill[0])))
    return jnp.zeros(())

  monkeypatch.setattr(timing, "start", lambda model, inputs, max_len: None)
  monkeypatch.setattr(timing, "call_loop", call_loop)
  timing.call_seconds({"a": ("target", 1), "b": ("target", 3),
                       "c": ("draft", 1)}, np.zeros((1, 4), np.int32),
                      fill=2, cache_len=6, steps=5, repeats=3)
  kinds = [("target", 1, 5, 2), ("target", 3, 5, 2), ("draft", 1, 5, 2)]
  # A warm-up (compilation) round, then `repeats` rounds of every kind.
  assert order == kinds * 4


def test_call_seconds_takes_medians_of_ratios_within_rounds(monkeypatch):
  # Stand-in wall times by (kind, round); round 1 is a load burst that
  # slows both kinds alike.
  seconds = iter([9.0, 9.0,             # warm-up (compilation)
                  1.0, 2.0, 10.0, 10.0, 1.0, 3.0])
  monkeypatch.setattr(timing, "start", lambda model, inputs, max_len: None)
  monkeypatch.setattr(timing, "timed", lambda fn, r: (None, next(seconds)))
  result = timing.call_seconds({"step": ("m", 1), "call": ("m", 3)},
                               np.zeros((1, 4), np.int32), fill=2,
                               cache_len=6, steps=4, repeats=3)
  assert result["step"] == pytest.approx(1.0 / 4)  # median of 1, 10, 1
  # Per-round ratios 2, 1, 3: their median, not 3 / 1 (ratio of medians).
  assert result["call"] / result["step"] == pytest.approx(2.0)


@pytest.mark.parametrize("fill,k", [(6, 1), (4, 3), (-1, 1)])
def test_call_seconds_rejects_a_call_that_does_not_fit(fill, k):
  with pytest.raises(ValueError, match=rf"fill={fill} and k={k}.*"
                     r"cache_len=6"):
    timing.call_seconds({"x": (None, k)}, np.zeros((1, 4), np.int32),
                        fill=fill, cache_len=6)
