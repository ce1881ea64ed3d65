"""Tree verification (`decoding.tree_acceptance`, `decoding.tree_loop`) is exact.

What must hold:
* exact enumeration, on a 3-token vocabulary with context-dependent p and q,
  k = 2 and 3 branches of γ = 2: the first two emitted tokens are
  distributed exactly as the target's (float64, 1e-12), and the same
  enumeration with a wrong rule (a rejected candidate leaves p uncorrected)
  is off by more than 1e-3 (power check); the expected tokens per
  iteration grow with k;
* the JAX rule's outcomes on fixed trees follow that enumerated reference
  (chi-square, significance 1e-3, fixed seeds);
* k = 1 is Algorithm 1: the same verdicts as `ExactAcceptance`, draw for
  draw, sampled and greedy, and the same decodes as `speculative_sample`
  with the same key (tiny T5, T = 0.7, top-p 0.9, batch 4);
* the whole decoder's first three tokens follow the target's enumerated
  distribution at T = 1, T = 0.7 with top-p 0.9, and T = 0.8 with top-k 3
  (decoder-only example target and draft, batch of 20 000 rows, chi-square
  at 1e-3), and a wrong rule fails the same test;
* at T = 0 the output is token-identical to `temperature_sample` on a tiny
  T5, for k = 1, 2 and 4, batch 3 (with and without EOS).
"""
import contextlib
import functools
import itertools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.decoding import tree_acceptance
from specdec_jax.core.decoding.tree_acceptance import chain_parents
from specdec_jax.core.decoding.tree_acceptance import TreeAcceptance

from conftest import GREEDY_LEN
from conftest import greedy_world
from decoder_only_helpers import DecoderOnlyLM
from decoder_only_helpers import next_logits
from decoding_helpers import chisquare_pvalue
from decoding_helpers import count_sequences
from decoding_helpers import reference_standardize
from decoding_helpers import sequence_distribution

SIGNIFICANCE = 1e-3
V = 3
GAMMA = 2


def _tables(seed):
  """Context-dependent p and q on V tokens: fns of the prefix tuple."""

  def dist(name, prefix):
    # Seeded by the prefix: the same tables whatever the order of calls.
    code = sum((x + 1) * (V + 1)**i for i, x in enumerate(prefix))
    rs = np.random.RandomState([seed, code, name == "q"])
    logits = 1.5 * rs.randn(V)
    if name == "q" and len(prefix) % 2:  # Some zeros in q's support.
      logits[rs.randint(V)] = -np.inf
    probs = np.exp(logits - logits.max())
    return probs / probs.sum()

  return (lambda prefix: dist("p", prefix)), (lambda prefix: dist("q", prefix))


def _normalized_residual(r, q):
  res = np.maximum(r - q, 0.0)
  return res / res.sum() if res.sum() > 0 else r


def iteration_outcomes(tree, context, p_fn, q_fn, correct=True, distinct=False):
  """{emitted tuple: probability} of one iteration given the k branches
  `tree` [k][γ] after `context` (the rule, in float64; `correct=False`
  keeps r = p after a rejection: a wrong rule; `distinct`: the first tokens
  were drawn without replacement)."""
  out = {}
  gamma = len(tree[0])

  def walk(depth, path, alive, mass):
    prefix = context + path
    r = p_fn(prefix)
    if depth < gamma:
      for j in alive:
        q = q_fn(prefix)
        if distinct and depth == 0:
          q = np.where(np.isin(np.arange(V), [b[0] for b in tree[:j]]), 0, q)
          q = q / q.sum()
        x = tree[j][depth]
        a = min(1.0, r[x] / q[x]) if q[x] > 0 else 0.0
        if a > 0:
          walk(depth + 1, path + (x,),
               [i for i in alive if tree[i][depth] == x], mass * a)
        mass *= 1.0 - a
        if correct:
          r = _normalized_residual(r, q)
    for y in range(V):
      out[path + (y,)] = out.get(path + (y,), 0.0) + mass * r[y]

  walk(0, (), list(range(len(tree))), 1.0)
  return out


def _branch_probability(branch, context, q_fn):
  prob = 1.0
  for d, x in enumerate(branch):
    prob *= q_fn(context + tuple(branch[:d]))[x]
  return prob


def _tree_probability(tree, context, q_fn, distinct):
  """Probability of the k branches `tree` (i.i.d., or with the first
  tokens drawn without replacement)."""
  prob = np.prod([_branch_probability(b, context, q_fn) for b in tree])
  if distinct:
    firsts = [b[0] for b in tree]
    if len(set(firsts)) < len(firsts):
      return 0.0
    q = q_fn(context)
    for j in range(1, len(tree)):
      prob /= 1.0 - sum(q[x] for x in firsts[:j])
  return prob


def first_tokens(context, width, p_fn, q_fn, correct=True, distinct=False):
  """{emitted tuple: probability} over every tree of k branches."""
  out = {}
  branches = list(itertools.product(range(V), repeat=GAMMA))
  if distinct:  # Branches past q_1's support are never candidates.
    width = min(width, int(np.count_nonzero(q_fn(context))))
  for tree in itertools.product(branches, repeat=width):
    prob = _tree_probability(tree, context, q_fn, distinct)
    if prob == 0:
      continue
    for emitted, mass in iteration_outcomes(tree, context, p_fn, q_fn, correct,
                                            distinct).items():
      out[emitted] = out.get(emitted, 0.0) + prob * mass
  return out


def first_two(width, p_fn, q_fn, correct=True, distinct=False):
  """[V, V] probability of the first two emitted tokens."""
  two = np.zeros((V, V))
  for emitted, prob in first_tokens((), width, p_fn, q_fn, correct,
                                    distinct).items():
    if len(emitted) >= 2:
      two[emitted[0], emitted[1]] += prob
    else:  # The next iteration emits the second token.
      nxt = first_tokens(emitted, width, p_fn, q_fn, correct, distinct)
      for more, prob2 in nxt.items():
        two[emitted[0], more[0]] += prob * prob2
  return two


@pytest.mark.parametrize("width,seed,distinct", [(2, 0, False), (2, 1, False),
                                                 (3, 2, False), (2, 0, True),
                                                 (3, 2, True)])
def test_enumerated_first_two_tokens_are_exactly_the_targets(
    width, seed, distinct):
  p_fn, q_fn = _tables(seed)
  exact = np.stack([p_fn(())[y] * p_fn((y,)) for y in range(V)])
  np.testing.assert_allclose(first_two(width, p_fn, q_fn, distinct=distinct),
                             exact, atol=1e-12)
  wrong = first_two(width, p_fn, q_fn, correct=False, distinct=distinct)
  assert np.abs(wrong - exact).max() > 1e-3


@pytest.mark.parametrize("seed", [0, 2])
def test_more_branches_emit_more_tokens_per_call(seed):
  """The point of the tree: E[tokens per iteration] grows with k (exact)."""
  p_fn, q_fn = _tables(seed)
  for distinct in (False, True):
    means = [
        sum(
            len(e) * m for e, m in first_tokens((
            ), k, p_fn, q_fn, distinct=distinct).items()) for k in (1, 2, 3)
    ]
    assert means[0] < means[1] < means[2], (distinct, means)


# ---------------------------------------------------------------------------
# The JAX rule against the enumerated reference.
# ---------------------------------------------------------------------------
ROWS = 40_000


def _tree_inputs(tree, p_fn, q_fn):
  """The rule's arrays for one tree [k][γ] at the empty context, ROWS rows."""
  width = len(tree)
  parents = chain_parents(width, GAMMA)
  paths = []
  for node in range(len(parents)):
    path, i = [], node
    while i > 0:
      path.append(tree[(i - 1) // GAMMA][(i - 1) % GAMMA])
      i = parents[i]
    paths.append(tuple(path[::-1]))
  target = np.stack([p_fn(path) for path in paths])  # [N, V]
  draft = np.stack([[q_fn(tuple(b[:d])) for d in range(GAMMA)] for b in tree])

  def rows(x):  # numpy: copies of the rows compile nothing.
    return np.broadcast_to(np.asarray(x, np.float32), (ROWS,) + x.shape)

  return (jnp.log(rows(target)), rows(draft),
          np.broadcast_to(np.asarray(tree, np.int32), (ROWS, width, GAMMA)))


@pytest.mark.parametrize("tree,distinct", [(((0, 2), (0, 0), (2, 1)), False),
                                           (((1, 1), (1, 1)), False),
                                           (((2, 2), (0, 2), (1, 2)), False),
                                           (((2, 2), (0, 2), (1, 2)), True),
                                           (((0, 0), (1, 2)), True)])
def test_rule_outcomes_follow_the_reference(tree, distinct):
  p_fn, q_fn = _tables(7)
  assert all(_branch_probability(b, (), q_fn) > 0 for b in tree)
  logits, draft, tokens = _tree_inputs(tree, p_fn, q_fn)
  rule = TreeAcceptance(first_without_replacement=distinct)
  verdict = jax.jit(rule.__call__,
                    static_argnums=4)(jax.random.PRNGKey(sum(map(sum, tree))),
                                      logits, tokens, draft,
                                      sampling.Sampling(1.0))
  n = np.asarray(verdict.num_accepted)
  branch = np.asarray(verdict.branch)
  emitted = [
      tuple(tree[b][:k]) + (int(y),)
      for k, b, y in zip(n, branch, np.asarray(verdict.next_token))
  ]
  exact = iteration_outcomes(tree, (), p_fn, q_fn, distinct=distinct)
  exact = {k: v for k, v in exact.items() if v > 0}
  observed, expected = count_sequences(
      [e + (0,) * (GAMMA + 1 - len(e)) for e in emitted], {
          k + (0,) * (GAMMA + 1 - len(k)): v for k, v in exact.items()
      })
  assert chisquare_pvalue(observed, expected) > SIGNIFICANCE


@pytest.mark.parametrize("tree,distinct", [(((0, 0), (0, 1), (0, 2)), False),
                                           (((2, 1), (2, 2), (0, 1)), False),
                                           (((2, 2), (0, 2), (1, 2)), True)])
def test_first_round_below_k_is_a_narrower_trees_acceptance(tree, distinct):
  """`first_round` < k' on a tree of k branches happens exactly as often as
  a tree of its first k' branches keeps a guess (enumerated). The first
  trees repeat their first guess: the rule often keeps a later branch
  (`verdict.branch` > 0) whose first guess branch 0 already passed."""
  p_fn, q_fn = _tables(7)
  logits, draft, tokens = _tree_inputs(tree, p_fn, q_fn)
  rule = TreeAcceptance(first_without_replacement=distinct)
  rounds = np.asarray(
      jax.jit(lambda *a: tree_acceptance.first_round(a[2], rule(*a)),
              static_argnums=4)(jax.random.PRNGKey(5), logits, tokens, draft,
                                sampling.Sampling(1.0)))
  assert rounds.min() >= 0 and rounds.max() <= len(tree)
  for narrower in range(1, len(tree) + 1):
    kept = sum(mass for emitted, mass in iteration_outcomes(
        tree[:narrower], (), p_fn, q_fn, distinct=distinct).items()
               if len(emitted) > 1)
    below = int(np.sum(rounds < narrower))
    if kept > 1 - 1e-12:  # its branches cover every token p can draw
      assert below == ROWS
      continue
    assert kept > 0 and chisquare_pvalue(np.array(
        [below, ROWS - below]), np.array([kept, 1 - kept])) > SIGNIFICANCE


@functools.partial(jax.jit, static_argnums=4)
def _both_verdicts(rng, logits, tokens, probs, method):
  """(k = 1 tree rule's, Algorithm 1's) verdicts, jitted as the decoder runs
  them (one program per method instead of one per eager op)."""
  return (TreeAcceptance()(rng, logits, tokens, probs, method),
          decoding.ExactAcceptance()(rng, logits, tokens, probs, method))


@functools.partial(jax.jit, static_argnums=0)
def _draw(method, rng, logits):
  """`method.draw`, jitted as the drafters run it."""
  return method.draw(rng, logits)


def test_one_branch_is_algorithm_1_draw_for_draw():
  rs = np.random.RandomState(0)
  batch, gamma, vocab = 2000, 3, 6
  logits = np.asarray(2 * rs.randn(batch, gamma + 1, vocab), np.float32)
  draft_logits = np.asarray(2 * rs.randn(batch, gamma, vocab), np.float32)
  method = sampling.Sampling(0.9, top_k=4)
  tokens, probs = _draw(method, jax.random.PRNGKey(1), draft_logits)
  rng = jax.random.PRNGKey(2)
  tree, exact = _both_verdicts(rng, logits, tokens, probs, method)
  np.testing.assert_array_equal(tree.num_accepted, exact.num_accepted)
  np.testing.assert_array_equal(tree.next_token, exact.next_token)
  assert len(set(np.asarray(exact.num_accepted).tolist())) == gamma + 1
  greedy = sampling.Greedy()
  argmax = np.argmax(draft_logits, -1).astype(np.int32)
  tree, exact = _both_verdicts(rng, logits, argmax, None, greedy)
  np.testing.assert_array_equal(tree.num_accepted, exact.num_accepted)
  np.testing.assert_array_equal(tree.next_token, exact.next_token)


# ---------------------------------------------------------------------------
# The whole decoder.
# ---------------------------------------------------------------------------
SAMPLES = 20_000
STEPS = 3
DIST_V = 5
EOS = 1
PROMPT = (3, 2)


@structs.dataclass
class UncorrectedTreeAcceptance(TreeAcceptance):
  """A wrong rule: after a rejected candidate the next one is tested
  against p itself, and a row that rejects all draws from p."""

  def __call__(self, rng, target_logits, draft_tokens, draft_probs, method):
    with _uncorrected():
      return super().__call__(rng, target_logits, draft_tokens, draft_probs,
                              method)


@contextlib.contextmanager
def _uncorrected():
  with mock.patch.object(tree_acceptance, "_residual", lambda r, q: r):
    yield


def _decoder_only_pair():
  return (DecoderOnlyLM.random(11, DIST_V, scale=1.0),
          DecoderOnlyLM.random(12, DIST_V, scale=1.0))


def _decoder_distribution(target, method):
  args = (method.temperature, method.top_k, method.top_p)

  def next_probs(prefix):
    return reference_standardize(next_logits(target, PROMPT + prefix), *args)

  return sequence_distribution(next_probs, DIST_V, STEPS, EOS)


def _decoder_pvalue(method, width, acceptance=None, seed=0, distinct=True):
  target, draft = _decoder_only_pair()
  exact = _decoder_distribution(target, method)
  assert abs(sum(exact.values()) - 1.0) < 1e-9 and len(exact) >= 8
  out = decoding.tree_speculative_sample(
      target, draft, np.tile(np.asarray(PROMPT, np.int32), (SAMPLES, 1)),
      jax.random.PRNGKey(seed), gamma=GAMMA, tree_width=width,
      max_decode_length=STEPS, method=method, eos_id=EOS, acceptance=acceptance,
      without_replacement=distinct)
  observed, expected = count_sequences(out.tokens, exact)
  return chisquare_pvalue(observed, expected), out


@pytest.mark.parametrize(
    "method,width,distinct", [
        (sampling.Sampling(1.0), 3, False),
        (sampling.Sampling(1.0), 3, True),
        (sampling.Sampling(0.7, top_p=0.9), 2, True),
        (sampling.Sampling(0.8, top_k=3), 3, True),
    ], ids=["T1-k3-iid", "T1-k3", "T0.7-p0.9-k2", "T0.8-topk3-k3"])
def test_decoder_output_has_the_target_distribution(method, width, distinct):
  pvalue, out = _decoder_pvalue(method, width, seed=width, distinct=distinct)
  assert pvalue > SIGNIFICANCE
  hist = out.statistics()["accepted_histogram"]
  assert hist[0] > 0 and hist[-1] > 0, hist  # Both outcomes exercised.


def test_a_wrong_rule_fails_the_decoder_test():
  pvalue, _ = _decoder_pvalue(sampling.Sampling(1.0), 3,
                              acceptance=UncorrectedTreeAcceptance(True),
                              seed=3)
  assert pvalue < SIGNIFICANCE


@pytest.fixture(scope="module")
def tiny_pair():
  """conftest's greedy world: a tiny T5 target, a noisy copy as its draft
  and 4 inputs (one padded), shared with test_decoding.py's greedy tests
  (the same target-alone program); one tree program per width."""
  world = greedy_world()
  return world.target, world.draft, world.inputs


@pytest.mark.parametrize("width,eos", [(1, -1), (2, "world"), (4, -1)])
def test_greedy_is_token_identical_to_the_target_alone(tiny_pair, width, eos):
  target, draft, enc = tiny_pair
  eos = greedy_world().eos if eos == "world" else eos  # early and late
  ref = decoding.temperature_sample(target, enc, jax.random.PRNGKey(0),
                                    max_decode_length=GREEDY_LEN, eos_id=eos)
  out = decoding.tree_speculative_sample(target, draft, enc,
                                         jax.random.PRNGKey(0), gamma=3,
                                         tree_width=width,
                                         max_decode_length=GREEDY_LEN,
                                         eos_id=eos)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  # Guesses were kept: fewer target calls than tokens.
  assert np.sum(out.target_calls) < np.sum(ref.lengths)
  # Each call's kept count, then -1: the histogram and calls agree with it.
  trace, calls = np.asarray(out.trace_num_accepted), np.asarray(
      out.target_calls)
  for row in range(len(enc)):
    made = trace[row, :calls[row]]
    assert np.all(made >= 0) and np.all(trace[row, calls[row]:] == -1)
    np.testing.assert_array_equal(np.bincount(made, minlength=4),
                                  out.accepted_histogram[row])
    assert np.sum(made + 1) >= out.lengths[row]  # n kept + 1 token per call
    # Every call has its first round: branch j < k kept a guess, or k none.
    rounds = np.asarray(out.first_round_histogram[row])
    assert rounds.shape == (width + 1,) and rounds.sum() == calls[row]
    assert rounds[width] == out.accepted_histogram[row][0]


def test_checked_decoder_and_bad_arguments(tiny_pair):
  """`tree_decoder` (settings checked once) decodes as the target alone;
  bad settings are named. The greedy k = 2 test's shapes: its programs."""
  target, draft, enc = tiny_pair
  decode = decoding.tree_decoder(target, draft, gamma=3, tree_width=2,
                                 max_decode_length=GREEDY_LEN,
                                 method=sampling.Greedy())
  ref = decoding.temperature_sample(target, enc, jax.random.PRNGKey(0),
                                    max_decode_length=GREEDY_LEN)
  np.testing.assert_array_equal(
      decode(enc, jax.random.PRNGKey(0)).tokens, ref.tokens)
  kwargs = dict(gamma=3, max_decode_length=GREEDY_LEN)
  rng = jax.random.PRNGKey(0)
  with pytest.raises(ValueError, match="tree_width must be an integer >= 1"):
    decoding.tree_speculative_sample(target, draft, enc, rng, tree_width=0,
                                     **kwargs)
  with pytest.raises(ValueError, match=r"tree_width \(33\) must be <= vocab"):
    decoding.tree_speculative_sample(target, draft, enc, rng, tree_width=33,
                                     **kwargs)
  with pytest.raises(ValueError, match="gamma must be an integer >= 1"):
    decoding.tree_speculative_sample(target, draft, enc, rng, tree_width=2,
                                     gamma=0, max_decode_length=GREEDY_LEN)
  with pytest.raises(ValueError, match="TreeTarget"):
    decoding.tree_speculative_sample(_NoTree(target), draft, enc, rng,
                                     tree_width=2, **kwargs)


@structs.dataclass
class _NoTree:
  """A `Target` without the tree call."""
  model: object

  vocab_size = property(lambda self: self.model.vocab_size)

  def start_token(self, inputs):
    return self.model.start_token(inputs)

  def start(self, inputs, max_len):
    return self.model.start(inputs, max_len)

  def length(self, state):
    return self.model.length(state)

  def decode_chunk(self, tokens, state):
    return self.model.decode_chunk(tokens, state)

  def truncate(self, state, length):
    return self.model.truncate(state, length)


def test_one_branch_decodes_exactly_as_algorithm_1(tiny_pair):
  """k = 1 is `speculative_sample`, token for token, with the same key."""
  target, draft, _ = tiny_pair
  enc = np.random.default_rng(0).integers(2, 32, size=(4, 5)).astype(np.int32)
  method = sampling.Sampling(0.7, top_p=0.9)
  token = decoding.speculative_sample(target, draft, enc, jax.random.PRNGKey(5),
                                      gamma=3, max_decode_length=12,
                                      method=method)
  tree = decoding.tree_speculative_sample(target, draft, enc,
                                          jax.random.PRNGKey(5), gamma=3,
                                          tree_width=1, max_decode_length=12,
                                          without_replacement=False,
                                          method=method)
  np.testing.assert_array_equal(tree.tokens, token.tokens)
  np.testing.assert_array_equal(tree.target_calls, token.target_calls)
  np.testing.assert_array_equal(tree.accepted_histogram,
                                token.accepted_histogram)
