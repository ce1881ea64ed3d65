"""`timing.call_seconds`: the one way run prices c and the verification call.

No timing is asserted beyond positivity (the machine may be shared); what
is asserted is what is timed and in which order (on real tiny models:
tests/e2e/test_timing_e2e.py).
"""

import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.metrics import timing


def _no_cache(model, inputs, max_len):
  del model, inputs, max_len


def test_call_seconds_interleaves_rounds():
  order = []

  def call_loop(model, cache, fill, *, k, steps):
    order.append((model, k, steps, int(fill[0])))
    return jnp.zeros(())

  timing.call_seconds(
      {
          "a": ("target", 1),
          "b": ("target", 3),
          "c": ("draft", 1)
      }, np.zeros((1, 4), np.int32), fill=2, cache_len=6, steps=5, repeats=3,
      programs=timing.CallPrograms(start=_no_cache, call_loop=call_loop))
  kinds = [("target", 1, 5, 2), ("target", 3, 5, 2), ("draft", 1, 5, 2)]
  # A warm-up (compilation) round, then `repeats` rounds of every kind.
  assert order == kinds * 4


def test_call_seconds_takes_medians_of_ratios_within_rounds():
  # Stand-in wall times by (kind, round); round 1 is a load burst that
  # slows both kinds alike.
  seconds = iter([
      9.0,
      9.0,  # warm-up (compilation)
      1.0,
      2.0,
      10.0,
      10.0,
      1.0,
      3.0
  ])
  result = timing.call_seconds({
      "step": ("m", 1),
      "call": ("m", 3)
  }, np.zeros((1, 4), np.int32), fill=2, cache_len=6, steps=4, repeats=3,
                               clock=lambda fn, r: (None, next(seconds)),
                               programs=timing.CallPrograms(start=_no_cache))
  assert result["step"] == pytest.approx(1.0 / 4)  # median of 1, 10, 1
  # Per-round ratios 2, 1, 3: their median, not 3 / 1 (ratio of medians).
  assert result["call"] / result["step"] == pytest.approx(2.0)


def test_a_wide_call_is_timed_in_fewer_calls_and_priced_per_call():
  """Batch 8: a 13-token call (104 rows) runs 16 calls per timed program
  (`steps_for_rows`), the step all 32; each is priced per call."""
  cost = {1: 0.01, 13: 0.06}  # stand-in seconds of one call, by k
  ran = []

  def call_loop(model, cache, fill, *, k, steps):
    del model, cache, fill
    ran.append((k, steps))
    return jnp.zeros(())

  def clock(fn, r):
    fn(r)
    k, steps = ran[-1]
    return None, steps * cost[k] * (3.0 if r == 1 else 1.0)  # a load burst

  result = timing.call_seconds({
      "step": ("m", 1),
      "call": ("m", 13)
  }, np.zeros((8, 4), np.int32), fill=2, cache_len=16, steps=32, repeats=3,
                               clock=clock, programs=timing.CallPrograms(
                                   start=_no_cache, call_loop=call_loop))
  assert sorted(set(ran)) == [(1, 32), (13, timing.MIN_STEPS)]
  assert result["step"] == pytest.approx(0.01)
  assert result["call"] == pytest.approx(0.06)


def test_steps_for_rows():
  assert timing.steps_for_rows(32, 16) == 32
  assert timing.steps_for_rows(32, 32) == 16
  assert timing.steps_for_rows(32, 24) == 21
  assert timing.steps_for_rows(32, 40) == timing.MIN_STEPS == 16
  assert timing.steps_for_rows(32, 200) == timing.MIN_STEPS
  assert timing.steps_for_rows(3, 200) == 3  # never more than asked


@pytest.mark.parametrize("fill,k", [(6, 1), (4, 3), (-1, 1)])
def test_call_seconds_rejects_a_call_that_does_not_fit(fill, k):
  with pytest.raises(ValueError, match=rf"fill={fill} and k={k}.*"
                     r"cache_len=6"):
    timing.call_seconds({"x": (None, k)}, np.zeros((1, 4), np.int32), fill=fill,
                        cache_len=6)


def test_interleaved_timer_rotates_the_order_per_round():
  order = []
  clock = lambda fn, r: (fn(r), 1.0 + (r >= 0))  # pylint: disable=unnecessary-lambda-assignment
  fns = {name: (lambda r, name=name: order.append((r, name))) for name in "abc"}
  timer = timing.InterleavedTimer(4, log=lambda _: None, rotate=True,
                                  clock=clock)
  times, _ = timer(fns)
  assert order == [
      (-1, "a"),
      (-1, "b"),
      (-1, "c"),  # warm-up, in order
      (0, "a"),
      (0, "b"),
      (0, "c"),
      (1, "b"),
      (1, "c"),
      (1, "a"),
      (2, "c"),
      (2, "a"),
      (2, "b"),
      (3, "a"),
      (3, "b"),
      (3, "c")
  ]
  assert {
      n: t.tolist() for n, t in times.items()
  } == {
      n: [2.0] * 4 for n in "abc"
  }
  assert timer.first_call_s == dict.fromkeys("abc", 1.0)
  # Without rotate every round runs in the given order.
  order.clear()
  timing.InterleavedTimer(2, log=lambda _: None, clock=clock)(fns)
  assert [n for r, n in order if r >= 0] == list("abcabc")


def test_interleaved_timer_stops_before_a_round_that_would_not_fit():
  """Each round of two programs takes 2 x 2 s here: with 10 s left a
  second round (1.25 x 4 s) fits, a third (after 8 s) does not."""
  left = [10.0]
  clock = lambda fn, r: (fn(r), 2.0)  # pylint: disable=unnecessary-lambda-assignment
  asked = []

  def allows(seconds):
    asked.append(seconds)
    return left[0] - 4.0 * len(asked) > seconds

  fns = {name: (lambda r: r) for name in "ab"}
  times, outs = timing.InterleavedTimer(5, log=lambda _: None,
                                        clock=clock)(fns, keep=["b"],
                                                     allows=allows)
  assert asked == [5.0, 5.0]  # Before rounds 1 and 2, never before 0.
  assert {n: len(t) for n, t in times.items()} == {"a": 2, "b": 2}
  assert outs == {"b": [0, 1]}
  # Nothing allowed: the first round still runs (a median needs one).
  times, _ = timing.InterleavedTimer(5, log=lambda _: None,
                                     clock=clock)(fns, allows=lambda _: False)
  assert {n: len(t) for n, t in times.items()} == {"a": 1, "b": 1}


def test_a_proposer_is_priced_by_its_propose_loop():
  """A `Proposer` entry runs `propose_loop` with γ = its k, interleaved
  with the target's calls, on its own state (no cache built for it)."""
  seen = []

  def propose_loop(drafter, state, buffer, fill, rng, *, gamma, method, steps):
    seen.append(("propose", gamma, steps, drafter, state, method))

  programs = timing.CallPrograms(
      start=lambda model, inputs, max_len: model,
      call_loop=lambda model, cache, fill, k, steps: seen.append(
          ("call", k, steps)), propose_loop=propose_loop)
  proposer = timing.Proposer("drafter", "state", np.zeros((1, 9), np.int32),
                             "greedy")
  result = timing.call_seconds({
      "step": ("target", 1),
      "draft": (proposer, 3)
  }, np.zeros((1, 4), np.int32), fill=5, cache_len=6, steps=4, repeats=2,
                               clock=lambda fn, r: (fn(r), 2.0 + r % 2),
                               programs=programs)
  assert ("propose", 3, 4, "drafter", "state", "greedy") in seen
  assert ("call", 1, 4) in seen and all(
      s[1] != 3 for s in seen if s[0] == "call")
  # fill + γ would not fit a 6-slot cache, but a proposer has its own state.
  assert set(result) == {"step", "draft"}
