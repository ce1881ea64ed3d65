"""Adaptive γ (paper §3.5): a model drafter that stops when unsure.

* Bookkeeping by hand (strict scripted target drafting for itself): rows
  stop where the draft is unsure, keep all their guesses, catch up after a
  full acceptance, and α counts only real guesses.
* The draft loop ends as soon as every row has stopped.
* The §3.5 bound and GAMMA='auto''s choice (Theorem 3.8).

Exactness through the decoder (greedy identity for γ ∈ {3, 7} and batch 1,
the target's distribution at T > 0 with and without top-k/top-p; γ = 1
cannot stop early) is the drafter contract's: test_drafter_contract.py,
for this drafter and the n-gram drafter's adaptive γ.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.metrics import analysis
from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.core import sampling

from decoding_helpers import ScriptedTarget

NONE = drafters.NO_GUESS

# ---------------------------------------------------------------------------
# By hand: V = 8, γ = 4, max_decode_length = 10. The target drafts for
# itself (every guess right) and is strict (a wrong feed emits POISON 7).
# Its confidence in generated token t is low (scale 0.5: top probability
# 0.19 < 0.5) at t = 3 and 7 in row 0, never in row 1.
# ---------------------------------------------------------------------------
V = 8
Y = [2, 3, 4, 5, 6] * 3


def _confidence_script(low_rows):
  logits = np.zeros((2, 16, V), np.float32)
  fed = np.zeros((2, 16), np.int32)
  for b, low in enumerate(low_rows):
    ys = [0] + Y
    fed[b] = ys[:16]
    for t in range(1, 16):  # Position t-1 predicts generated token t.
      logits[b, t - 1, ys[t]] = 0.5 if t in low else 10.0
  return ScriptedTarget(position_logits=jnp.asarray(logits), bigram=jnp.zeros(
      (V, V), jnp.float32), expected_fed=jnp.asarray(fed))


def test_rows_stop_where_unsure_and_keep_every_guess():
  target = _confidence_script([{3, 7}, set()])
  out = decoding.speculative_sample(
      target, drafters.ModelDrafter(target, confidence_threshold=0.5),
      np.ones((2, 2), np.int32), jax.random.PRNGKey(0), gamma=4,
      max_decode_length=10, eos_id=1)
  np.testing.assert_array_equal(out.tokens, [Y[:10]] * 2)
  y = lambda t: Y[t - 1]  # pylint: disable=unnecessary-lambda-assignment
  # Row 0: guesses y1..y3 (y3 unsure) + y4; y5..y7 + y8; y9..y12 cut at 10
  # (the target's catch-up after each full acceptance fed the right tokens,
  # or POISON would have been rejected). Row 1: 4 + 1 tokens twice.
  np.testing.assert_array_equal(
      out.trace_draft_tokens[0, :3],
      [[y(1), y(2), y(3), NONE], [y(5), y(6), y(7), NONE],
       [y(9), y(10), y(11), y(12)]])
  np.testing.assert_array_equal(out.trace_num_accepted[0, :3], [3, 3, 2])
  np.testing.assert_array_equal(out.trace_next_token[0, :3],
                                [y(4), y(8), decoding.NO_TOKEN])
  np.testing.assert_array_equal(out.trace_num_accepted[1, :2], [4, 4])
  np.testing.assert_array_equal(out.target_calls, [3, 2])
  # Trials are real guesses only: 3 + 3 + 2 in row 0, 4 + 4 in row 1.
  np.testing.assert_array_equal(out.beta_count, [8, 8])
  assert out.statistics()["alpha_hat"] == 1.0


def test_draft_loop_ends_when_every_row_has_stopped():
  """Row 0 stops after guess 2, row 1 after guess 4: the γ = 6 loop runs 4
  draft steps, not 6 (the model state holds 4 positions)."""
  draft = _confidence_script([{2}, {4}])
  drafter = drafters.ModelDrafter(draft, confidence_threshold=0.5)
  state = drafter.init(jnp.ones((2, 2), jnp.int32), 16)
  buffer = jnp.zeros((2, 16), jnp.int32)
  state, tokens, probs = jax.jit(lambda s: drafter.propose(
      s, buffer, jnp.zeros((2,), jnp.int32), jax.random.PRNGKey(0), gamma=6,
      method=sampling.Greedy()))(state)
  assert probs is None
  np.testing.assert_array_equal(
      tokens, [[2, 3] + [NONE] * 4, [2, 3, 4, 5] + [NONE] * 2])
  np.testing.assert_array_equal(state.model_state.length, [4, 4])
  np.testing.assert_array_equal(state.length, [2, 4])  # Fed for real.


def test_adaptive_settings_are_static_and_default_off():
  target = _confidence_script([set(), set()])
  assert not drafters.ModelDrafter(target).may_stop_early
  assert drafters.ModelDrafter(target, 0.3).may_stop_early
  # Static: not a leaf of the pytree (a new threshold is a new program).
  assert len(jax.tree_util.tree_leaves(drafters.ModelDrafter(target, 0.3))) \
      == len(jax.tree_util.tree_leaves(drafters.ModelDrafter(target)))


# ---------------------------------------------------------------------------
# §3.5 bound and GAMMA='auto'.
# ---------------------------------------------------------------------------
def test_per_iteration_gamma_bound_by_hand():
  # Three calls, γ = 4, c = 0.1: kept 3, 3, 2 of 3, 3, 4 guesses; 10 tokens.
  bound = analysis.per_iteration_gamma_bound([3, 3, 2], [3, 3, 4], 4, 0.1,
                                             tokens=10)
  assert bound["fixed"] == pytest.approx(10 / (3 * 1.4))
  assert bound["achieved"] == pytest.approx(10 / (3 + 0.1 * 10))
  assert bound["oracle"] == pytest.approx(10 / (3 + 0.1 * 8))
  with pytest.raises(ValueError, match=r"iteration 1: kept=4, guessed=3"):
    analysis.per_iteration_gamma_bound([1, 4], [2, 3], 4, 0.1, tokens=5)


def test_optimal_gamma_prices_the_verification_call():
  # A near-free drafter (c = 0) at α = 0.8: with the theorem's one-step
  # call the longest γ wins; when a (γ+1)-token call costs 1 + 0.2 γ steps,
  # (1 - 0.8^(γ+1)) / (0.2 (1 + 0.2 γ)) peaks at γ = 4.
  assert analysis.optimal_gamma(0.8, 0.0, max_gamma=12) == 12
  costs = 1 + 0.2 * np.arange(1, 13)
  speedups = [(1 - 0.8**(g + 1)) / (0.2 * (1 + 0.2 * g)) for g in range(1, 13)]
  assert analysis.optimal_gamma(
      0.8, 0.0, max_gamma=12,
      call_costs=costs) == 1 + int(np.argmax(speedups)) == 4
  with pytest.raises(ValueError, match=r"call_costs has shape \(3,\)"):
    analysis.optimal_gamma(0.8, 0.0, max_gamma=12, call_costs=[1, 1, 1])
