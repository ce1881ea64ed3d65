"""The speculative loop driven by scripted stubs, case by case (T5X's
decoding_test.py style): no neural network, expected tokens and statistics
written out by hand.

The target (`decoding_helpers.ScriptedTarget`) has a fixed greedy path y per
row and poisons the logits of any position fed a token other than y's, so a
loop that feeds or reads a wrong position emits POISON; the drafter
guesses from a script, whatever the context (draft_probs None: one-hot q).
Conventions: V = 8, EOS = 1, tokens 2..6 are ordinary, 7 is POISON;
`wrong(t)` is a guess different from t.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.decoding import loops
from specdec_jax.core.drafters import guesses

from decoding_helpers import ScriptedDrafter
from decoding_helpers import ScriptedTarget
from decoding_helpers import chisquare_pvalue
from decoding_helpers import count_sequences
from decoding_helpers import greedy_pair
from decoding_helpers import overflow_checks
from decoding_helpers import scripted_next_probs
from decoding_helpers import sequence_distribution

V = 8
EOS = 1
POISON = V - 1
NONE = decoding.NO_TOKEN
SIGNIFICANCE = 1e-3

# y_1, y_2, ...: an ordinary path without EOS.
Y = [2, 3, 4, 5, 6] * 4


def wrong(token):
  return 2 if token != 2 else 3


def with_wrong(path, positions):
  """`path` with the guesses at the given (1-based) positions wrong."""
  return [wrong(t) if i + 1 in positions else t for i, t in enumerate(path)]


def decode(target, drafter, *, gamma, max_len, statistics=True,
           method=sampling.Greedy()):
  batch = target.expected_fed.shape[0]
  return decoding.speculative_sample(target, drafter,
                                     np.ones((batch, 2), np.int32),
                                     jax.random.PRNGKey(0), gamma=gamma,
                                     max_decode_length=max_len, method=method,
                                     eos_id=EOS, statistics=statistics)


def assert_trace(out, rows):
  """rows[b] = (drafts, accepted, next) lists for the row's target calls."""
  calls = np.asarray(out.target_calls)
  # Sliced in numpy: slicing the JAX arrays would compile a program per
  # slice shape.
  draft_tokens = np.asarray(out.trace_draft_tokens)
  num_accepted = np.asarray(out.trace_num_accepted)
  next_token = np.asarray(out.trace_next_token)
  for b, (drafts, accepted, nexts) in enumerate(rows):
    n = len(accepted)
    assert calls[b] == n, (b, calls[b])
    np.testing.assert_array_equal(draft_tokens[b, :n], drafts)
    np.testing.assert_array_equal(num_accepted[b, :n], accepted)
    np.testing.assert_array_equal(next_token[b, :n], nexts)
    # Slots past the row's calls are never written (-1: no call).
    assert np.all(num_accepted[b, n:] == -1)
    assert not np.any(draft_tokens[b, n:])


# ---------------------------------------------------------------------------
# γ = 4, max_decode_length = 5: a rejection at each position (rows 0-3), all
# accepted (row 4); rows 0-3 reach max_decode_length inside their second
# block, row 4 finishes in its first iteration.
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def each_position():
  guesses = [with_wrong(Y, {r + 1}) for r in range(4)] + [Y]
  return greedy_pair([Y] * 5, guesses, V)


def test_rejection_at_each_position_and_max_length_mid_block(each_position):
  out = decode(*each_position, gamma=4, max_len=5)
  np.testing.assert_array_equal(out.tokens, [[2, 3, 4, 5, 6]] * 5)
  np.testing.assert_array_equal(out.lengths, [5] * 5)
  np.testing.assert_array_equal(out.target_calls, [2, 2, 2, 2, 1])
  assert_trace(
      out,
      [
          # Rejected at 1: y_1 from the target; then 4 guesses fill the output
          # (max length 5 cuts the block before the target's token).
          ([[3, 3, 4, 5], [3, 4, 5, 6]], [0, 4], [2, NONE]),
          ([[2, 2, 4, 5], [4, 5, 6, 2]], [1, 3], [3, NONE]),
          ([[2, 3, 2, 5], [5, 6, 2, 3]], [2, 2], [4, NONE]),
          ([[2, 3, 4, 2], [6, 2, 3, 4]], [3, 1], [5, NONE]),
          ([[2, 3, 4, 5]], [4], [6]),
      ])
  # Histogram of kept guesses: guesses accepted but cut by max_decode_length
  # are not counted.
  np.testing.assert_array_equal(
      out.accepted_histogram,
      [[1, 0, 0, 0, 1], [0, 1, 0, 1, 0], [0, 0, 2, 0, 0], [0, 1, 0, 1, 0],
       [0, 0, 0, 0, 1]])
  # Trials: tests whose context is on the output (min(kept tokens, γ)).
  np.testing.assert_array_equal(out.beta_count, [5, 5, 5, 5, 4])
  # One-hot p and q: β = 1 for a right guess, 0 for a wrong one.
  np.testing.assert_allclose(out.beta_sum, [4, 4, 4, 4, 4])
  s = out.statistics()
  assert s["alpha_hat"] == pytest.approx(20 / 24)
  assert s["alpha_beta"] == pytest.approx(20 / 24)
  assert s["target_calls"] == 9 and s["tokens_generated"] == 25
  assert s["accepted_histogram"] == [1, 2, 2, 2, 2]


def test_statistics_off_carries_the_algorithm_state_only(each_position):
  target, drafter = each_position
  on = decode(target, drafter, gamma=4, max_len=5)
  off = decode(target, drafter, gamma=4, max_len=5, statistics=False)
  np.testing.assert_array_equal(off.tokens, on.tokens)
  np.testing.assert_array_equal(off.lengths, on.lengths)
  assert off.stats is None
  with pytest.raises(ValueError, match="statistics=False"):
    _ = off.target_calls
  state = jax.eval_shape(
      functools.partial(decoding.init_speculative_state, target, drafter,
                        gamma=4, max_decode_length=5, statistics=False),
      jnp.ones((5, 2), jnp.int32))
  assert state.stats is None
  # iteration, the target's length, buffer, length, done: nothing else.
  assert len(jax.tree_util.tree_leaves(state)) == 5


def _checked_loop():
  """The loop under checkify, a fresh function (traced with the stubs'
  overflow assertions inside `overflow_checks()`)."""
  return checkify.checkify(
      jax.jit(
          functools.partial(decoding.speculative_loop, gamma=4,
                            max_decode_length=5, method=sampling.Greedy())))


def test_loop_never_writes_past_the_state_under_checkify(each_position):
  """The stub asserts (checkify.debug_check) every chunk fits its state."""
  target, drafter = each_position
  with overflow_checks():
    err, out = _checked_loop()(target, drafter, jnp.ones((5, 2), jnp.int32),
                               jax.random.PRNGKey(0), jnp.int32(EOS))
  assert err.get() is None
  np.testing.assert_array_equal(out.tokens, [[2, 3, 4, 5, 6]] * 5)


def test_a_drafter_overflowing_its_state_is_reported_under_checkify(
    each_position):
  """A model drafter whose state is too short for the loop: under checkify
  the target protocol's overflow assertion fires instead of a silent clamp."""
  target, _ = each_position

  @structs.dataclass
  class ShortDrafter(drafters.ModelDrafter):

    def init(self, encoder_input_tokens, max_len, encoder_output=None):
      return drafters.ModelDrafter.init(self, encoder_input_tokens, 3)

  with overflow_checks():
    err, _ = _checked_loop()(target, ShortDrafter(target),
                             jnp.ones((5, 2), jnp.int32), jax.random.PRNGKey(0),
                             jnp.int32(EOS))
  assert "past max_len" in str(err.get())


def test_a_stub_program_is_the_same_whatever_was_traced_before(each_position):
  """Outside `overflow_checks()` the stubs trace no check: a traced checkify
  check bakes a process-wide error code into the program, so the same loop
  traced after another check was another program, which the persistent
  compilation cache never served again (every scripted loop was compiled
  in every run of the suite)."""
  target, drafter = each_position

  def lowered():
    loop = jax.jit(
        functools.partial(decoding.speculative_loop, gamma=4,
                          max_decode_length=5, method=sampling.Greedy()))
    return loop.lower(target, drafter, jnp.ones((5, 2), jnp.int32),
                      jax.random.PRNGKey(0), jnp.int32(EOS)).as_text()

  first = lowered()
  # A check traced in between advances checkify's error codes.
  checkify.checkify(lambda x: checkify.check(x > 0, "x <= 0"))(1.0)
  assert lowered() == first


# ---------------------------------------------------------------------------
# γ = 4, max_decode_length = 8: EOS inside an accepted block, as the
# target's token after a rejection, guessed but rejected, and as the bonus
# token; rows finish at iterations 1, 1, 3 and 1.
# ---------------------------------------------------------------------------
EOS_PATHS = [
    [2, 3, EOS, 4, 5, 6],  # y_3 = EOS, guessed and accepted.
    [2, EOS],  # y_2 = EOS, the target's token.
    Y,  # no EOS; the draft guesses EOS first.
    [2, 3, 4, 5, EOS],  # EOS as the bonus token after 4 accepted.
]
EOS_GUESSES = [EOS_PATHS[0], [2, 5], [EOS] + Y[1:], EOS_PATHS[3]]


@pytest.fixture(scope="module")
def eos_cases():
  return greedy_pair(EOS_PATHS, EOS_GUESSES, V)


def test_eos_cases(eos_cases):
  out = decode(*eos_cases, gamma=4, max_len=8)
  np.testing.assert_array_equal(
      out.tokens, [[2, 3, EOS, 0, 0, 0, 0, 0], [2, EOS, 0, 0, 0, 0, 0, 0],
                   [2, 3, 4, 5, 6, 2, 3, 4], [2, 3, 4, 5, EOS, 0, 0, 0]])
  np.testing.assert_array_equal(out.lengths, [3, 2, 8, 5])
  assert_trace(
      out,
      [
          # All 4 guesses accepted, but the output ends at the EOS (3 kept):
          # the 4th guess and the target's token are thrown away.
          ([[2, 3, EOS, 4]], [3], [NONE]),
          ([[2, 5, 2, 2]], [1], [EOS]),
          # The guessed EOS is rejected: it does not end the row.
          ([[EOS, 3, 4, 5], [3, 4, 5, 6], [3, 4, 5, 6]], [0, 4, 2
                                                         ], [2, 2, NONE]),
          ([[2, 3, 4, 5]], [4], [EOS]),
      ])
  np.testing.assert_array_equal(
      out.accepted_histogram,
      [[0, 0, 0, 1, 0], [0, 1, 0, 0, 0], [1, 0, 1, 0, 1], [0, 0, 0, 0, 1]])
  np.testing.assert_array_equal(out.beta_count, [3, 2, 7, 4])
  np.testing.assert_allclose(out.beta_sum, [3, 1, 6, 4])
  assert out.statistics()["alpha_hat"] == pytest.approx(14 / 16)


def test_baseline_on_the_scripted_target(eos_cases):
  target, _ = eos_cases
  out = decoding.temperature_sample(target, np.ones((4, 2), np.int32),
                                    jax.random.PRNGKey(0), max_decode_length=8,
                                    eos_id=EOS)
  np.testing.assert_array_equal(out.tokens,
                                decode(*eos_cases, gamma=4, max_len=8).tokens)
  np.testing.assert_array_equal(out.target_calls, [3, 2, 8, 5])


def test_model_drafter_of_a_non_t5_target(eos_cases):
  """`ModelDrafter` drafts with any `Target`: the stub drafting for itself
  (lagging after full acceptance, so its 2-token catch-up runs) accepts
  every guess that reaches the output."""
  target, _ = eos_cases
  out = decode(target, drafters.ModelDrafter(target), gamma=3, max_len=8)
  np.testing.assert_array_equal(
      out.tokens, [[2, 3, EOS, 0, 0, 0, 0, 0], [2, EOS, 0, 0, 0, 0, 0, 0],
                   [2, 3, 4, 5, 6, 2, 3, 4], [2, 3, 4, 5, EOS, 0, 0, 0]])
  assert out.statistics()["alpha_hat"] == 1.0
  # Row 2: 4 + 4 tokens in two calls (the second lags by one).
  np.testing.assert_array_equal(out.target_calls, [1, 1, 2, 2])


# ---------------------------------------------------------------------------
# γ = 3, max_decode_length = 8: every guess accepted (row 0), every first
# guess rejected (row 1).
# ---------------------------------------------------------------------------
def test_all_accepted_and_all_rejected():
  target, drafter = greedy_pair([Y, Y], [Y, with_wrong(Y, set(range(1, 17)))],
                                V)
  out = decode(target, drafter, gamma=3, max_len=8)
  np.testing.assert_array_equal(out.tokens, [Y[:8], Y[:8]])
  w = [wrong(t) for t in Y]
  assert_trace(out, [
      ([[2, 3, 4], [6, 2, 3]], [3, 3], [5, 4]),
      ([w[i:i + 3] for i in range(8)], [0] * 8, Y[:8]),
  ])
  np.testing.assert_array_equal(out.accepted_histogram,
                                [[0, 0, 0, 2], [8, 0, 0, 0]])
  np.testing.assert_array_equal(out.beta_count, [6, 8])
  np.testing.assert_allclose(out.beta_sum, [6, 0])
  assert out.statistics()["alpha_hat"] == pytest.approx(6 / 14)


# ---------------------------------------------------------------------------
# Distribution at temperature > 0 with scripted (context-dependent) logits:
# a deterministic drafter (no q: one-hot q implied) and a sampling one.
# ---------------------------------------------------------------------------
SAMPLES = 20_000
STEPS = 3
DIST_V = 5


@pytest.mark.parametrize(
    "method,sample_draft,gamma", [
        (sampling.Sampling(1.0), False, 2),
        (sampling.Sampling(0.7, top_p=0.9), False, 3),
        (sampling.Sampling(0.7, top_p=0.9), True, 2),
        (sampling.Sampling(0.8, top_k=3, top_p=0.9), True, 3),
    ],
    ids=["T1-onehot-q", "T0.7-p0.9-onehot-q", "T0.7-p0.9-q", "T0.8-k3-p0.9-q"])
def test_scripted_output_has_the_target_distribution(method, sample_draft,
                                                     gamma):
  rs = np.random.RandomState(1)
  target = ScriptedTarget(
      position_logits=jnp.asarray(rs.randn(1, 8, DIST_V), jnp.float32),
      bigram=jnp.asarray(rs.randn(DIST_V, DIST_V), jnp.float32),
      expected_fed=-jnp.ones((1, 8), jnp.int32))
  drafter = ScriptedDrafter(
      jnp.asarray(2.0 * rs.randn(1, 8, DIST_V), jnp.float32),
      sample=sample_draft)
  exact = sequence_distribution(
      scripted_next_probs(target,
                          (method.temperature, method.top_k, method.top_p)),
      DIST_V, STEPS, EOS)
  assert abs(sum(exact.values()) - 1.0) < 1e-9
  assert len(exact) >= 8  # A distribution worth testing.
  out = decoding.speculative_sample(target, drafter,
                                    np.ones((SAMPLES, 2), np.int32),
                                    jax.random.PRNGKey(gamma), gamma=gamma,
                                    max_decode_length=STEPS, method=method,
                                    eos_id=EOS)
  observed, expected = count_sequences(out.tokens, exact)
  assert chisquare_pvalue(observed, expected) > SIGNIFICANCE
  alpha = out.statistics()["alpha_hat"]
  assert 0.05 < alpha < 0.95, alpha  # Both paths of the accept step ran.


def _emit_with_scatter(buffer, length, done, guessed, num_accepted, next_token,
                       eos_id, max_decode_length, written=None):
  """`loops.emit_verdict` as it was written before 2026-11-29: the window
  stacked, its EOS by argmax, written by a vmapped dynamic_update_slice."""
  gamma = guessed.shape[1]
  emitted = jnp.concatenate([guessed, next_token[:, None]], axis=1)
  emitted = jnp.where(
      jnp.arange(gamma + 1)[None, :] == num_accepted[:, None],
      next_token[:, None], emitted)
  active = jnp.logical_not(done)
  valid = jnp.arange(gamma + 1)[None, :] < (num_accepted + 1)[:, None]
  is_eos = (emitted == eos_id) & valid
  hit_eos = jnp.any(is_eos, axis=1)
  num_new = jnp.where(hit_eos, jnp.argmax(is_eos, axis=1) + 1, num_accepted + 1)
  new_length = jnp.where(active, jnp.minimum(length + num_new,
                                             max_decode_length), length)
  buffer = jax.vmap(
      lambda row, new, start: jax.lax.dynamic_update_slice(row, new, (start,)))(
          buffer, emitted if written is None else written(emitted), length + 1)
  done = done | (active & (hit_eos | (new_length >= max_decode_length)))
  return buffer, new_length, done


@pytest.mark.parametrize("partial", [False, True])
def test_emit_verdict_is_the_scattered_window(partial):
  # The buffer written by selects, the EOS found by selects: the same
  # buffer, lengths and done flags as a scatter and an argmax, over random
  # verdicts with EOS anywhere, rows done, and windows that start at the
  # buffer's end (where dynamic_update_slice clamps the start).
  rng = np.random.default_rng(0)
  batch, gamma, max_len = 64, 3, 12
  size = max_len + gamma + 2
  for _ in range(20):
    buffer = rng.integers(0, 5, (batch, size)).astype(np.int32)
    length = rng.integers(0, size, batch).astype(np.int32)
    done = rng.random(batch) < 0.3
    guessed = rng.integers(-1 if partial else 0, 5,
                           (batch, gamma)).astype(np.int32)
    num_accepted = rng.integers(0, gamma + 1, batch).astype(np.int32)
    next_token = rng.integers(0, 5, batch).astype(np.int32)
    args = (buffer, length, done, guessed, num_accepted, next_token,
            np.int32(EOS), max_len, guesses.feedable if partial else None)
    got = loops.emit_verdict(*args)
    want = _emit_with_scatter(*args)
    for g, w in zip(got, want):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
