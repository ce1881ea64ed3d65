"""The contract every drafter keeps, through every loop it runs in.

One table (`DRAFTERS`: each drafter, the world it is tested in, and for the
tree loop its branches) and three properties over it:

* **Greedy identity**: at T = 0 the speculative output equals the target's
  alone, token for token: a batch of 4 (EOS ending one row early and one
  late, in the worlds that have one) at several γ (and tree widths k), and
  a batch of one. Guesses were both kept and rejected, so a drafter that
  never guesses, or a case that never rejects, cannot pass vacuously.
* **Distribution**: at T = 1, and at T = 0.8 with top-k 3 and top-p 0.9
  together, the first 3 tokens follow the target's distribution enumerated
  exactly from its logits (chi-square, significance 1e-3, fixed seeds),
  again with guesses kept and rejected.
* **Power**: in each world the same check, on draws with the same seed,
  fails for a rule that is not exact (lenience 0.1; a tree rule that
  forgets the residual), so a pass says something.

The worlds:

* scripted (`drafter_helpers`): a context-dependent scripted target, V = 8
  for greedy identity (inputs that prompt lookup half matches, an n-gram
  corpus that guesses some tokens right, a scripted draft model close to
  the target), V = 5 for the distribution (20,000 draws);
* feature: a V = 8 T5 target and a random feature draft
  (`feature_helpers.greedy_case`; no EOS), and for the distribution the
  V = 5 T5 target of `conftest.distribution_world` (12,000 draws);
* shared: `conftest.greedy_world`'s V = 32 T5 target (the one
  test_decoding.py decodes) with a noisy shared-encoder draft, and the
  same distribution world.

Each drafter's own behaviour (n-gram tables, prompt-lookup matches,
adaptive γ's bookkeeping, the feature hand-over, the shared encoder's
state) is tested in its own file; the decode loop itself with T5 drafts in
test_decoding.py.
"""
import dataclasses
import functools
from typing import Any, Callable, Optional

import jax
import numpy as np
import pytest

from specdec_jax.core import acceptance as acceptance_lib
from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.core.models import SharedEncoderModel

from conftest import DIST_EOS
from conftest import DIST_STEPS
from conftest import GREEDY_LEN
from conftest import GREEDY_VOCAB
from conftest import distribution_world
from conftest import greedy_world
import drafter_helpers
from drafter_helpers import DIST_V
from drafter_helpers import GREEDY_V
from drafter_helpers import METHOD_IDS
from drafter_helpers import METHODS
from drafter_helpers import SIGNIFICANCE
from drafter_helpers import shared_draft
import feature_helpers
from feature_helpers import feature_draft
from test_tree_acceptance import UncorrectedTreeAcceptance

NONE = drafters.NO_GUESS


@dataclasses.dataclass(frozen=True)
class Case:
  """What a drafter is built from: the world's target and draft model, the
  n-gram corpus (scripted world) and the vocabulary size."""
  target: Any
  draft: Any
  corpus: Any
  vocab: int


@dataclasses.dataclass(frozen=True)
class Drafter:
  """A row of the contract.

  Attributes:
    world: 'scripted', 'feature' or 'shared'.
    build: Case -> the drafter.
    tree: decoded by `tree_speculative_sample` (k branches), not the chain.
    check: the drafter's own extra assertions on an output, (out, γ).
  """
  world: str
  build: Callable[[Case], Any]
  tree: bool = False
  check: Optional[Callable[[Any, int], None]] = None


def _bigram(case, threshold=0.0):
  return drafters.NGramDrafter(
      drafters.build_ngram_table(case.corpus, case.vocab, order=2), threshold)


def _lookup(case):
  return drafters.PromptLookupDrafter(vocab=case.vocab, max_ngram=2)


def _model(case, threshold=None):
  return drafters.ModelDrafter(case.draft, confidence_threshold=threshold)


def _pair(case):
  return SharedEncoderModel.pair(case.target, case.draft)


def _hierarchical(model, inner):
  return lambda case: drafters.HierarchicalDrafter(model(case), inner(case),
                                                   inner_gamma=2)


def _suffixes(out):
  """Adaptive γ: each iteration's guesses are a prefix (stops are final)."""
  guessed = np.asarray(out.trace_draft_tokens) != NONE
  assert not np.any(np.diff(guessed.astype(int), axis=-1) > 0)
  return guessed


def _stopped_early(out, gamma):
  """Some guesses made and some not: rows stopped before γ."""
  guessed = _suffixes(out)
  if gamma > 1:
    assert 0 < guessed.sum() < guessed.size


def _adaptive_model_stops(out, gamma):
  """Some iterations stopped before γ, some after more than one guess."""
  guessed = _suffixes(out)
  calls = np.asarray(out.target_calls)
  made = np.concatenate(
      [guessed[b, :calls[b]].sum(-1) for b in range(len(calls))])
  assert made.min() < gamma and made.max() > 1, made
  assert 0 < guessed.sum() < guessed.size


DRAFTERS = {
    # The scripted world: drafters that need no neural network.
    "bigram": Drafter("scripted", _bigram),
    # Adaptive γ of the n-gram drafter: the same program, rows stop early.
    "bigram_adaptive": Drafter("scripted", lambda c: _bigram(c, 0.5),
                               check=_stopped_early),
    "prompt_lookup": Drafter("scripted", _lookup),
    "hierarchical": Drafter("scripted", _hierarchical(lambda c: c.draft,
                                                      _lookup)),
    "hierarchical_bigram": Drafter("scripted",
                                   _hierarchical(lambda c: c.draft, _bigram)),
    # Adaptive γ (paper §3.5): a model drafter that stops when unsure.
    "adaptive": Drafter("scripted", lambda c: _model(c, 0.6),
                        check=_adaptive_model_stops),
    # A feature-level draft reading the target's hidden states.
    "feature": Drafter("feature", lambda c: drafters.FeatureDrafter(c.draft)),
    "feature_tree": Drafter("feature",
                            lambda c: drafters.FeatureDrafter(c.draft),
                            tree=True),
    # A draft decoder reading the target's encoder output.
    "shared": Drafter("shared", _model),
    "shared_pair": Drafter("shared", _pair),
    "shared_adaptive": Drafter("shared", lambda c: _model(c, 0.6),
                               check=_stopped_early),
    "shared_hierarchical": Drafter("shared", _hierarchical(_pair, _lookup)),
}


# ---------------------------------------------------------------------------
# The worlds: greedy cases and sampled ones.
# ---------------------------------------------------------------------------
def _greedy_case(world):
  """(Case, inputs [4, S], eos, the target's own output: tokens [4, L] and
  lengths [4])."""
  if world == "scripted":
    target, draft, inputs, eos, corpus, base = drafter_helpers.greedy_case()
    return Case(target, draft, corpus, GREEDY_V), inputs, eos, base
  if world == "feature":
    target, draft, inputs = feature_helpers.greedy_case()
    base = decoding.temperature_sample(target, inputs, jax.random.PRNGKey(0),
                                       max_decode_length=GREEDY_LEN, eos_id=-1)
    return Case(target.with_features(), draft, None, 8), inputs, -1, base
  world = greedy_world()
  case = Case(world.target, _shared_greedy_draft(), None, GREEDY_VOCAB)
  return case, world.inputs, world.eos, world.baseline()


@functools.lru_cache(maxsize=None)
def _shared_greedy_draft():
  return shared_draft(greedy_world().target, 0.3, seed=12)


def _max_len(world):
  return drafter_helpers.MAX_LEN if world == "scripted" else GREEDY_LEN


def _decode(entry, case, inputs, rng, gamma, max_len, eos, width=None,
            **kwargs):
  drafter = entry.build(case)
  if entry.tree:
    return decoding.tree_speculative_sample(case.target, drafter, inputs, rng,
                                            gamma=gamma, tree_width=width,
                                            max_decode_length=max_len,
                                            eos_id=eos, **kwargs)
  return decoding.speculative_sample(case.target, drafter, inputs, rng,
                                     gamma=gamma, max_decode_length=max_len,
                                     eos_id=eos, **kwargs)


def _kept_and_rejected(entry, out):
  stats = out.statistics()
  if entry.tree:
    hist = stats["accepted_histogram"]
    assert hist[0] > 0 and sum(hist[1:]) > 0, hist
  else:
    assert 0.0 < stats["alpha_hat"] < 1.0, stats


# (drafter, γ, tree width): each a compiled program. γ ∈ {1, 3, 7} where
# the drafter's own loop depends on γ (hierarchical: γ below, at and above
# its inner γ; the n-gram table's and prompt lookup's guesses run past the
# input at 7; the feature draft's catch-up after 1 to 5 kept guesses);
# the shared-encoder variants at 3 (γ's effect on a model drafter is
# test_decoding.py's).
GREEDY = [
    *[("hierarchical", g, None) for g in (1, 3, 7)],
    ("bigram", 1, None),
    ("bigram", 7, None),
    ("bigram_adaptive", 1, None),
    ("bigram_adaptive", 7, None),
    ("prompt_lookup", 7, None),
    ("adaptive", 3, None),
    ("adaptive", 7, None),
    *[("feature", g, None) for g in (1, 3, 5)],
    *[("feature_tree", 3, k) for k in (1, 2, 3)],
    *[("shared", g, None) for g in (1, 3, 7)],
    ("shared_pair", 3, None),
    ("shared_adaptive", 3, None),
    ("shared_hierarchical", 3, None),
]


def _id(name, gamma, width):
  return f"{name}-g{gamma}" + (f"-k{width}" if width else "")


@pytest.mark.parametrize("name,gamma,width", GREEDY,
                         ids=[_id(*p) for p in GREEDY])
def test_greedy_identity(name, gamma, width):
  entry = DRAFTERS[name]
  case, inputs, eos, base = _greedy_case(entry.world)
  out = _decode(entry, case, inputs, jax.random.PRNGKey(1), gamma,
                _max_len(entry.world), eos, width)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  _kept_and_rejected(entry, out)
  if entry.check:
    entry.check(out, gamma)


# Batch of one (a shape of its own), at γ = 3: the rows of each world that
# end early and late (the feature world's row 2 is padded and emits only
# token 0, which its draft's head cannot guess).
ONE_ROW = {"scripted": (0, 1), "feature": (0, 2), "shared": (0, 1)}

ONE_ROW_DRAFTERS = [
    "bigram", "prompt_lookup", "hierarchical_bigram", "adaptive", "feature",
    "shared"
]


@pytest.mark.parametrize("name", ONE_ROW_DRAFTERS)
def test_greedy_identity_batch_of_one(name):
  entry = DRAFTERS[name]
  case, inputs, eos, base = _greedy_case(entry.world)
  for row in ONE_ROW[entry.world]:
    one = dataclasses.replace(case, target=_one_row(case.target, row),
                              draft=_one_row(case.draft, row))
    # Without statistics: a smaller program (tokens only).
    out = _decode(entry, one, inputs[row:row + 1], jax.random.PRNGKey(2), 3,
                  _max_len(entry.world), eos, statistics=False)
    np.testing.assert_array_equal(out.tokens, base.tokens[row:row + 1])


def _one_row(model, row):
  """A scripted model restricted to one row; a T5 model as it is."""
  if isinstance(model, drafter_helpers.ScriptedTarget):
    return drafter_helpers.one_row(model, row)
  return model


# ---------------------------------------------------------------------------
# Distribution.
# ---------------------------------------------------------------------------
def _sampled_case(world):
  """(Case, the rows to decode) of a world's distribution test."""
  if world == "scripted":
    target, draft, inputs, corpus = drafter_helpers.distribution_case()
    rows = np.repeat(inputs, drafter_helpers.SAMPLES, axis=0)
    return Case(target, draft, corpus, DIST_V), rows
  dist = distribution_world()
  if world == "feature":
    draft = feature_draft(dist.target, DIST_V - 1, seed=22, scale=3.0)
    return Case(dist.target.with_features(), draft, None, DIST_V), dist.rows()
  return Case(dist.target, shared_draft(dist.target, 1.0, seed=22), None,
              DIST_V), dist.rows()


def _pvalue(name, method, gamma, width=None, rule=None, **kwargs):
  """(chi-square p-value, output) of the drafter's draws at `method`."""
  entry = DRAFTERS[name]
  if entry.world == "scripted":
    return drafter_helpers.distribution_pvalue(
        lambda draft, corpus: entry.build(Case(None, draft, corpus, DIST_V)),
        method, gamma, acceptance=rule)
  case, rows = _sampled_case(entry.world)
  # Seeds as each test was first written: 7 + γ (chain), 5 + k (tree).
  rng = jax.random.PRNGKey(5 + width if entry.tree else 7 + gamma)
  out = _decode(entry, case, rows, rng, gamma, DIST_STEPS, DIST_EOS, width,
                method=method, acceptance=rule, **kwargs)
  wrong = rule is not None
  pvalue = distribution_world().pvalue(out.tokens, method, impossible_ok=wrong)
  return pvalue, out


def _kept_and_rejected_sampled(entry, out):
  stats = out.statistics()
  if entry.tree:
    hist = stats["accepted_histogram"]
    assert hist[0] > 0 and hist[-1] > 0, hist  # Both outcomes exercised.
  elif entry.world == "scripted":
    assert 0.02 < stats["alpha_hat"] < 0.98, stats
  else:
    assert 0.1 < stats["alpha_hat"] < 0.95, stats


T1, FILTERED = METHODS  # T = 1; T = 0.8 with top-k 3 and top-p 0.9
# (drafter, method, γ, tree width, loop keywords): prompt lookup's guesses
# never read the method (what it changes for a deterministic drafter is
# the loop's one-hot q: test_speculative_loop.py), so it runs filtered
# only; the tree draws its first guesses with and without replacement.
DISTRIBUTION = [
    ("bigram", T1, 2, None, {}),
    ("bigram", FILTERED, 2, None, {}),
    ("bigram_adaptive", T1, 2, None, {}),
    ("bigram_adaptive", FILTERED, 2, None, {}),
    ("prompt_lookup", FILTERED, 2, None, {}),
    ("hierarchical", T1, 2, None, {}),
    ("hierarchical_bigram", FILTERED, 2, None, {}),
    ("adaptive", T1, 3, None, {}),
    ("adaptive", FILTERED, 3, None, {}),
    ("feature", T1, 3, None, {}),
    ("feature", FILTERED, 2, None, {}),
    ("feature_tree", T1, 2, 3, {}),
    ("feature_tree", T1, 2, 3, dict(without_replacement=False)),
    ("feature_tree", FILTERED, 2, 2, {}),
    ("shared", T1, 3, None, {}),
    ("shared", FILTERED, 2, None, {}),
]


def _dist_id(name, method, gamma, width, kwargs):
  return "-".join([
      _id(name, gamma, width), METHOD_IDS[METHODS.index(method)],
      *(["iid"] if kwargs else [])
  ])


@pytest.mark.parametrize("name,method,gamma,width,kwargs", DISTRIBUTION,
                         ids=[_dist_id(*p) for p in DISTRIBUTION])
def test_output_has_the_target_distribution(name, method, gamma, width, kwargs):
  entry = DRAFTERS[name]
  pvalue, out = _pvalue(name, method, gamma, width, **kwargs)
  assert pvalue > SIGNIFICANCE
  _kept_and_rejected_sampled(entry, out)
  if entry.check:
    entry.check(out, gamma)


# One per world and loop: the check above, the same drafter, settings and
# seed, with a rule that is not exact.
POWER = [
    ("bigram", 2, None, acceptance_lib.LenientAcceptance(lenience=0.1)),
    ("feature", 3, None, acceptance_lib.LenientAcceptance(lenience=0.1)),
    ("feature_tree", 2, 3, UncorrectedTreeAcceptance(True)),
    ("shared", 3, None, acceptance_lib.LenientAcceptance(lenience=0.1)),
]

POWER_IDS = ["scripted", "feature", "feature_tree", "shared"]


@pytest.mark.parametrize("name,gamma,width,rule", POWER, ids=POWER_IDS)
def test_power_a_wrong_rule_fails_the_same_check(name, gamma, width, rule):
  pvalue, _ = _pvalue(name, T1, gamma, width, rule=rule)
  assert pvalue < SIGNIFICANCE


def test_every_drafter_is_in_each_property():
  """A drafter added to the table without a greedy case fails here; every
  world has a distribution case and a power check."""
  assert {p[0] for p in GREEDY} | set(ONE_ROW_DRAFTERS) == set(DRAFTERS)
  worlds = {d.world for d in DRAFTERS.values()}
  assert {DRAFTERS[p[0]].world for p in DISTRIBUTION} == worlds
  assert {DRAFTERS[p[0]].world for p in POWER} == worlds
