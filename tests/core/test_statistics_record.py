"""The loop's statistics record against the per-row update it replaced.

`StatisticsRecord` writes one slice per iteration at the loop's iteration
number and counts target calls, the histogram, the trials and β's sum
after the loop. The oracle here is the former `SpeculativeStatistics.update`
(kept below as it was: per-row counters, a running β sum, a histogram
scatter and three trace scatters at slot min(target_calls, T-1), done rows
left alone), carried by the same loop in a program of its own; every field
of `speculative_sample`'s output must match it bit for bit, β's float sum
included. Cases (scripted stubs, no network): greedy blocks cut by
max_decode_length and by EOS, rows finishing at different iterations, a
row whose T-th call writes the last slot, sampling with and without the
draft's q, and a drafter that stops early (NO_GUESS slots).
"""
import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.core import sampling
from specdec_jax.core import structs

from decoding_helpers import ScriptedDrafter
from decoding_helpers import ScriptedTarget
from decoding_helpers import greedy_pair

V = 8
EOS = 1
NONE = decoding.NO_TOKEN
Y = [2, 3, 4, 5, 6] * 4


def _wrong(token):
  return 2 if token != 2 else 3


@structs.dataclass
class OldStatistics(decoding.SpeculativeStatistics):
  """The per-row update the record replaced (the oracle)."""

  @classmethod
  def zeros(cls, batch, gamma, max_decode_length):

    def z(*shape):
      return jnp.zeros(shape, jnp.int32)

    return cls(
        target_calls=z(batch), accepted_histogram=z(batch, gamma + 1),
        beta_sum=jnp.zeros((batch,), jnp.float32), beta_count=z(batch),
        trace_draft_tokens=z(batch, max_decode_length,
                             gamma), trace_num_accepted=jnp.full(
                                 (batch, max_decode_length), -1, jnp.int32),
        trace_next_token=z(batch, max_decode_length))

  def update(self, *, iteration, active, draft_tokens, verdict, beta, num_kept,
             num_guesses: Optional[jax.Array] = None):
    del iteration  # The slot was each row's own call count.
    batch, gamma = draft_tokens.shape
    rows = jnp.arange(batch)
    act = active.astype(jnp.int32)
    n = verdict.num_accepted
    kept_guesses = jnp.minimum(n, num_kept)
    next_kept = active & (num_kept > n)
    trials = jnp.minimum(num_kept,
                         gamma if num_guesses is None else num_guesses)
    visited = jnp.arange(gamma)[None, :] < trials[:, None]
    slot = jnp.minimum(self.target_calls, self.trace_num_accepted.shape[1] - 1)

    def record(trace, value):
      old = trace[rows, slot]
      mask = active.reshape((batch,) + (1,) * (old.ndim - 1))
      return trace.at[rows, slot].set(jnp.where(mask, value, old))

    return OldStatistics(
        target_calls=self.target_calls + act,
        accepted_histogram=self.accepted_histogram.at[rows,
                                                      kept_guesses].add(act),
        beta_sum=self.beta_sum + jnp.sum(jnp.where(visited, beta, 0.0), axis=1),
        beta_count=self.beta_count + trials,
        trace_draft_tokens=record(self.trace_draft_tokens, draft_tokens),
        trace_num_accepted=record(self.trace_num_accepted, kept_guesses),
        trace_next_token=record(self.trace_next_token,
                                jnp.where(next_kept, verdict.next_token, NONE)))


@functools.partial(jax.jit, static_argnames=("gamma", "max_len", "method"))
def _oracle(target, drafter, inputs, rng, *, gamma, max_len, method):
  """The speculative loop carrying `OldStatistics` (its own program)."""
  s = decoding.init_speculative_state(target, drafter, inputs, gamma=gamma,
                                      max_decode_length=max_len,
                                      statistics=False)
  s = s.replace(stats=OldStatistics.zeros(inputs.shape[0], gamma, max_len))
  body = functools.partial(decoding.speculative_iteration, target, drafter,
                           decoding.ExactAcceptance(), rng=rng,
                           eos_id=jnp.int32(EOS), gamma=gamma,
                           max_decode_length=max_len, method=method)
  return lax.while_loop(lambda s: jnp.logical_not(jnp.all(s.done)), body,
                        s).stats


FIELDS = ("target_calls", "accepted_histogram", "beta_count",
          "trace_draft_tokens", "trace_num_accepted", "trace_next_token")


def assert_same(got, want):
  for name in FIELDS:
    np.testing.assert_array_equal(getattr(got, name), getattr(want, name),
                                  err_msg=name)
    assert np.asarray(getattr(got, name)).dtype == np.int32, name
  # Bit for bit: a float sum added in another order would differ here.
  np.testing.assert_array_equal(
      np.asarray(got.beta_sum, np.float32).view(np.int32),
      np.asarray(want.beta_sum, np.float32).view(np.int32), err_msg="beta_sum")


def check(target, drafter, *, batch, gamma, max_len, method):
  """`speculative_sample`'s statistics == the oracle's; returns the oracle
  for the case's own assertions."""
  inputs = jnp.ones((batch, 2), jnp.int32)
  rng = jax.random.PRNGKey(3)
  want = _oracle(target, drafter, inputs, rng, gamma=gamma, max_len=max_len,
                 method=method)
  out = decoding.speculative_sample(target, drafter, inputs, rng, gamma=gamma,
                                    max_decode_length=max_len, method=method,
                                    eos_id=EOS)
  assert_same(out.stats, want)
  np.testing.assert_array_equal(out.statistics()["accepted_histogram"],
                                np.sum(np.asarray(want.accepted_histogram), 0))
  return jax.tree_util.tree_map(np.asarray, want)


def test_greedy_blocks_cut_by_max_length_and_eos():
  """Rows 0-3 reach max_decode_length inside their second block after a
  rejection at each position, row 4 in its first; rows 5-8 meet EOS in an
  accepted block, as the target's token, guessed but rejected, and as the
  bonus token."""
  paths = [Y] * 5 + [[2, 3, EOS, 4], [2, EOS], Y, [2, 3, 4, 5, EOS]]
  guesses = [
      [_wrong(t) if i == r else t for i, t in enumerate(Y)] for r in range(4)
  ] + [Y, paths[5], [2, 5], [EOS] + Y[1:], paths[8]]
  want = check(*greedy_pair(paths, guesses, V), batch=9, gamma=4, max_len=5,
               method=sampling.Greedy())
  np.testing.assert_array_equal(want.target_calls, [2, 2, 2, 2, 1, 1, 1, 2, 1])
  assert np.sum(want.trace_next_token == NONE) >= 5  # Blocks cut inside.


def test_a_row_whose_last_call_fills_the_last_slot():
  """Row 1 rejects every guess: T = 8 calls, the last one at slot T-1,
  while row 0 finished after 2 and stays done for 6 iterations."""
  target, drafter = greedy_pair([Y, Y], [Y, [_wrong(t) for t in Y]], V)
  want = check(target, drafter, batch=2, gamma=3, max_len=8,
               method=sampling.Greedy())
  np.testing.assert_array_equal(want.target_calls, [2, 8])
  np.testing.assert_array_equal(want.trace_num_accepted[1], [0] * 8)
  np.testing.assert_array_equal(want.trace_next_token[1], Y[:8])


def _random_pair(seed, batch, sample_draft):
  rs = np.random.RandomState(seed)
  target = ScriptedTarget(
      position_logits=jnp.asarray(rs.randn(batch, 12, V), jnp.float32),
      bigram=jnp.asarray(rs.randn(V, V), jnp.float32), expected_fed=-jnp.ones(
          (1, 12), jnp.int32))
  drafter = ScriptedDrafter(
      jnp.asarray(target.position_logits + 0.5 * rs.randn(batch, 12, V),
                  jnp.float32), sample=sample_draft)
  return target, drafter


@pytest.mark.parametrize("sample_draft", [False, True],
                         ids=["onehot-q", "sampled-q"])
def test_sampling_with_rows_ending_at_random_iterations(sample_draft):
  """Random logits at T = 1: EOS ends rows at different iterations, β are
  fractions (Σ min(p, q) with the draft's q, p(x) without)."""
  target, drafter = _random_pair(0, 16, sample_draft)
  want = check(target, drafter, batch=16, gamma=3, max_len=7,
               method=sampling.Sampling(1.0))
  assert len(set(want.target_calls.tolist())) >= 3
  fractions = want.beta_sum - np.floor(want.beta_sum)
  assert np.count_nonzero(fractions) >= 8


def test_a_drafter_that_stops_early():
  """A model drafter stopping when unsure: NO_GUESS slots, fewer trials."""
  target, draft = _random_pair(1, 8, False)
  drafter = drafters.ModelDrafter(
      ScriptedTarget(position_logits=draft.guess_logits, bigram=target.bigram,
                     expected_fed=target.expected_fed),
      confidence_threshold=0.6)
  want = check(target, drafter, batch=8, gamma=4, max_len=9,
               method=sampling.Greedy())
  stopped = want.trace_draft_tokens == drafters.NO_GUESS
  assert np.any(stopped) and not np.all(stopped[want.trace_num_accepted >= 0])
