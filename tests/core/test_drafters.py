"""Negligible-cost drafters (n-gram, prompt lookup) and a draft of a draft.

* n-gram table construction and prompt-lookup matching: hand-written
  expectations.
* The hierarchical drafter proposes exactly the draft model's own greedy
  guesses (its inner loop keeps M_q's state right).
* Bad input: clear errors.

Their exactness through the decoder (greedy identity, the target's
distribution, adaptive γ) is the drafter contract's:
test_drafter_contract.py.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.core import sampling
from specdec_jax.core.drafters import prompt_lookup

from drafter_helpers import DIST_V
from drafter_helpers import GREEDY_V
from drafter_helpers import check_greedy_identity
from drafter_helpers import distribution_case

NONE = drafters.NO_GUESS

# ---------------------------------------------------------------------------
# n-gram table: V = 8; counts worked out by hand.
# ---------------------------------------------------------------------------
CORPUS = [[2, 3, 4, 1], [2, 3, 5, 1], [3, 4, 1], [2, 2, 3, 4, 1]]
# Next-token counts 1:4, 2:4, 3:4, 4:3, 5:1: N = 16, T = 5 types.
UNIGRAM = (np.array([0, 4, 4, 4, 3, 1, 0, 0]) + 5 / 8) / 21

# Jitted, as the decoder runs them (one compilation per table shape instead
# of one per eager op).
_next_probs = jax.jit(lambda table, context: table.next_probs(context))


def _probs(table, *contexts):
  width = table.order - 1
  context = np.array([c[len(c) - width:] if width else [] for c in contexts],
                     np.int32).reshape(len(contexts), width)
  return np.asarray(_next_probs(table, jnp.asarray(context)), np.float64)


def test_ngram_table_counts_by_hand():
  unigram = drafters.build_ngram_table(CORPUS, 8, order=1)
  np.testing.assert_allclose(_probs(unigram, ()), [UNIGRAM], rtol=1e-6)
  bigram = drafters.build_ngram_table(CORPUS, 8, order=2)
  # After the start token 0: 2, 2, 3, 2 (N = 4, T = 2): a = 3/6, 1/6 and
  # backoff 2/6 to the unigram. After 2: 3, 3, 2, 3. Unseen 7: the unigram.
  after_start = UNIGRAM / 3 + np.array([0, 0, 3, 1, 0, 0, 0, 0]) / 6
  after_two = UNIGRAM / 3 + np.array([0, 0, 1, 3, 0, 0, 0, 0]) / 6
  np.testing.assert_allclose(_probs(bigram, [0], [2], [7]),
                             [after_start, after_two, UNIGRAM], rtol=1e-6)
  trigram = drafters.build_ngram_table(CORPUS, 8, order=3)
  # (2, 3) -> 4, 5, 4: a = 2/5, 1/5, backoff 2/5 to the bigram after 3
  # (4, 5, 4, 4: a = 3/6, 1/6, backoff 1/3 to the unigram).
  after_three = UNIGRAM / 3 + np.array([0, 0, 0, 0, 3, 1, 0, 0]) / 6
  expected = 2 / 5 * after_three + np.array([0, 0, 0, 0, 2, 1, 0, 0]) / 5
  # (0, 0), the sentence start at order 3, has the counts of (0,) and backs
  # off to the bigram after 0; the unseen (7, 3) backs off to after 3.
  start = after_start / 3 + np.array([0, 0, 3, 1, 0, 0, 0, 0]) / 6
  np.testing.assert_allclose(_probs(trigram, [2, 3], [0, 0], [7, 3]),
                             [expected, start, after_three], rtol=1e-5)
  for table in (unigram, bigram, trigram):
    assert table.order in (1, 2, 3) and table.vocab_size == 8


def test_ngram_table_keeps_the_most_frequent_continuations():
  table = drafters.build_ngram_table(CORPUS, 8, order=2, max_continuations=1)
  # After 0 only 2 (a = 3/6) is stored: the rest goes to the unigram.
  np.testing.assert_allclose(_probs(table, [0]),
                             [UNIGRAM / 2 + np.eye(8)[2] / 2], rtol=1e-6)
  assert table.levels[0].width == 1


def test_ngram_table_rejects_bad_corpora():
  with pytest.raises(
      ValueError, match=r"token id 9 is outside the model's "
      r"vocabulary \[0, 8\).*another vocabulary"):
    drafters.build_ngram_table([[2, 9, 1]], 8, order=2)
  with pytest.raises(ValueError, match="no tokens"):
    drafters.build_ngram_table([[]], 8, order=2)
  with pytest.raises(ValueError, match="order must be an integer >= 1"):
    drafters.build_ngram_table(CORPUS, 8, order=0)


# ---------------------------------------------------------------------------
# Prompt lookup: matching by hand.
# ---------------------------------------------------------------------------
INPUT = [5, 6, 7, 5, 6, 2, 1, 0, 0]


@jax.jit
def _propose_three(drafter, state, buffer, length):
  """Prompt lookup's γ = 3 guesses at T = 0 (one program per max_ngram)."""
  return drafter.propose(state, buffer, length, jax.random.PRNGKey(0), gamma=3,
                         method=sampling.Greedy())


@pytest.mark.parametrize(
    "generated,max_ngram,expected",
    [
        ([5, 6], 3, [7, 5, 6]),  # "5 6" at 0: copy what follows it.
        ([6], 3, [7, 5, 6]),  # "6" at 1.
        ([7, 5, 6], 3, [2, 1, NONE]),  # The longest suffix wins: "7 5 6" at 2,
        ([7, 5, 6], 2, [7, 5, 6]),  # but with max_ngram 2, "5 6" at 0.
        ([3, 2], 3, [1, NONE, NONE]),  # "2" at 5: then EOS, then padding.
        ([4], 3, [NONE] * 3),  # No match.
        ([6, 1], 3, [NONE] * 3),  # EOS is followed by padding only.
        ([], 3, [NONE] * 3),  # Nothing generated yet.
    ])
def test_prompt_lookup_matches_by_hand(generated, max_ngram, expected):
  drafter = drafters.PromptLookupDrafter(vocab=8, max_ngram=max_ngram)
  state = drafter.init(jnp.asarray([INPUT], jnp.int32), 16)
  buffer = jnp.asarray([[0] + generated + [3] * (15 - len(generated))],
                       jnp.int32)
  _, tokens, probs = _propose_three(drafter, state, buffer,
                                    jnp.asarray([len(generated)]))
  assert probs is None
  np.testing.assert_array_equal(tokens, [expected])


def test_prompt_lookup_rows_are_independent():
  inputs = jnp.asarray([INPUT, [4, 4, 3, 2, 1, 0, 0, 0, 0]], jnp.int32)
  buffer = jnp.asarray([[0, 5, 6, 9], [0, 4, 4, 9]], jnp.int32)
  start = jax.jit(prompt_lookup.lookup_start,
                  static_argnums=3)(inputs, buffer, jnp.asarray([2, 2]), 3)
  # Row 1: "4 4" at 0 (the first of the two "4" matches is not longer).
  np.testing.assert_array_equal(start, [2, 2])


# ---------------------------------------------------------------------------
# The hierarchical drafter's guesses (scripted target, see drafter_helpers).
# ---------------------------------------------------------------------------
def _hierarchical(draft, corpus):
  del corpus
  return drafters.HierarchicalDrafter(
      draft, drafters.PromptLookupDrafter(vocab=GREEDY_V, max_ngram=2),
      inner_gamma=2)


def test_hierarchical_proposes_the_draft_models_own_guesses():
  """At T = 0 the inner loop yields M_q's greedy continuation: the same
  guesses, iteration by iteration, as M_q drafting step by step."""
  outs = [
      check_greedy_identity(make, 3)
      for make in (lambda draft, corpus: drafters.ModelDrafter(draft),
                   _hierarchical)
  ]
  np.testing.assert_array_equal(outs[0].target_calls, outs[1].target_calls)
  np.testing.assert_array_equal(outs[0].trace_draft_tokens,
                                outs[1].trace_draft_tokens)


# ---------------------------------------------------------------------------
# Bad input.
# ---------------------------------------------------------------------------
def test_hierarchical_rejects_a_stateful_inner_drafter():
  _, draft, _, _ = distribution_case()
  with pytest.raises(ValueError, match="inner must be a PromptLookupDrafter"):
    drafters.HierarchicalDrafter(draft, drafters.ModelDrafter(draft))
  with pytest.raises(ValueError, match="inner_gamma must be an integer"):
    drafters.HierarchicalDrafter(draft,
                                 drafters.PromptLookupDrafter(vocab=DIST_V),
                                 inner_gamma=0)


def test_drafter_vocabulary_must_match_the_targets():
  target, _, inputs, _ = distribution_case()
  with pytest.raises(ValueError, match=r"draft vocab_size \(9\) must equal"):
    decoding.speculative_sample(target, drafters.PromptLookupDrafter(vocab=9),
                                inputs, jax.random.PRNGKey(0), gamma=2,
                                max_decode_length=3)
