"""A shared-encoder draft: a draft decoder reading the target's encoder.

* The config and parameter layout: `num_encoder_layers = 0` with
  `encoder_width` (the target's emb_dim) has no `encoder/` parameters and
  cross-attention key/value kernels [encoder_width, heads * head_dim];
  `num_params` counts them; inconsistent settings are refused.
* The protocol: the speculative loop hands the target's encoder output
  (`Target.encoder_output`) to `Drafter.init`, and the draft starts from it
  (same state as encoding the inputs with the target's encoder itself).
* Exactness, as for every drafter: greedy identity (γ 1, 3, 7; batch of 4
  and of 1; adaptive γ; inside the hierarchical drafter) and the target's
  distribution at T = 1 and with top-k + top-p (chi-square against the
  enumerated distribution of `test_decoding`).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.core import models
from specdec_jax.core.models import SharedEncoderModel
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import init_params

from conftest import jit_call
from conftest import random_model
from conftest import tiny_config
from decoding_helpers import chisquare_pvalue
import test_decoding

MAX_LEN = 14
NONE = drafters.NO_GUESS

# The loop's prefill, compiled as one program (eagerly, each of its
# operations would be a program of its own).
_init_speculative_state = jax.jit(
    decoding.init_speculative_state,
    static_argnames=("gamma", "max_decode_length", "statistics"))


def shared_draft(target: T5Model, scale: float, seed: int) -> T5Model:
  """A decoder without an encoder: the target's decoder (and embedding)
  with Gaussian noise, reading the target's encoder output (a draft that
  agrees with the target often but not always)."""
  base = target.unpacked().params["params"]
  own = {"token_embedder": base["token_embedder"], "decoder": base["decoder"]}
  leaves, treedef = jax.tree_util.tree_flatten(own)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  noisy = [
      x + scale * jnp.std(x) * jax.random.normal(k, x.shape)
      for x, k in zip(leaves, keys)
  ]
  config = target.config.replace(num_encoder_layers=0,
                                 encoder_width=target.config.emb_dim)
  return T5Model(config, {
      "params": jax.tree_util.tree_unflatten(treedef, noisy)
  }).prepared_for_decoding()


# ---------------------------------------------------------------------------
# Config and parameters.
# ---------------------------------------------------------------------------
def test_layout_has_no_encoder_and_wide_cross_attention():
  config = T5Config(vocab_size=16, emb_dim=8, num_heads=2, head_dim=4,
                    mlp_dim=16, num_encoder_layers=0, num_decoder_layers=2,
                    encoder_width=24)
  params = init_params(config, jax.random.PRNGKey(0))["params"]
  assert sorted(params) == ["decoder", "token_embedder"]
  layer = params["decoder"]["layers_1"]["encoder_decoder_attention"]
  assert layer["key"]["kernel"].shape == (24, 8)
  assert layer["value"]["kernel"].shape == (24, 8)
  assert layer["query"]["kernel"].shape == (8, 8)
  assert layer["out"]["kernel"].shape == (8, 8)
  assert config.num_params == sum(
      x.size for x in jax.tree_util.tree_leaves(params))
  assert not config.has_encoder and config.cross_attention_input_dim == 24
  # Every model with an encoder is unchanged (encoder_width None = emb_dim).
  plain = tiny_config()
  assert plain.encoder_width is None and plain.cross_attention_input_dim == 16
  assert plain.num_params == sum(x.size for x in jax.tree_util.tree_leaves(
      init_params(plain, jax.random.PRNGKey(0))))


@pytest.mark.parametrize("fields,match", [
    (dict(num_encoder_layers=0), "needs its width"),
    (dict(encoder_width=16), "encoder_width=16"),
    (dict(num_encoder_layers=-1), "integer >= 0"),
    (dict(num_encoder_layers=0, encoder_width=0), "positive integer"),
])
def test_inconsistent_configs_are_refused(fields, match):
  with pytest.raises(ValueError, match=match):
    tiny_config(**fields)


def test_pairing_checks_widths_and_standalone_start_needs_an_encoder():
  target = random_model(tiny_config(), seed=1)
  draft = shared_draft(target, 0.1, seed=2)
  with pytest.raises(ValueError, match="no encoder of its own"):
    draft.start(jnp.ones((1, 3), jnp.int32), 4)
  wrong = T5Model(draft.config.replace(encoder_width=8), draft.params)
  with pytest.raises(ValueError, match="encoder_width is 8"):
    SharedEncoderModel.pair(target, wrong)
  with pytest.raises(ValueError, match="has an encoder of its own"):
    SharedEncoderModel.pair(target, target)
  with pytest.raises(ValueError, match="width 16"):
    wrong.start_from_encoder_output(
        jit_call(target, "encode", jnp.ones((1, 3), jnp.int32)), 4)


def test_the_draft_starts_from_the_targets_encoding():
  """`ModelDrafter.init` with the target's encoder output gives the state
  the pair's own `start` (encoding with the target's encoder) gives; the
  loop passes it (`init_speculative_state`)."""
  target = random_model(tiny_config(), seed=1)
  draft = shared_draft(target, 0.1, seed=2)
  pair = SharedEncoderModel.pair(target, draft)
  inputs = jnp.asarray([[3, 4, 5, 1, 0], [6, 7, 1, 0, 0]], jnp.int32)
  encoder_output = target.encoder_output(jit_call(target, "start", inputs, 8))
  assert encoder_output.encoded.shape == (2, 5, 16)
  np.testing.assert_array_equal(encoder_output.valid, inputs > 0)
  for model in (draft, pair):
    state = jit_call(drafters.ModelDrafter(model), "init", inputs, 8,
                     encoder_output)
    own = jit_call(pair, "start", inputs, 8)
    for a, b in zip(jax.tree_util.tree_leaves(state.model_state),
                    jax.tree_util.tree_leaves(own)):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  loop_state = _init_speculative_state(target, drafters.ModelDrafter(draft),
                                       inputs, gamma=2, max_decode_length=5)
  np.testing.assert_array_equal(loop_state.draft_state.model_state.encoded,
                                loop_state.target_state.encoded)
  # Teacher forcing from the target's encoding = cached decoding.
  dec = jnp.asarray([[0, 5, 6], [0, 7, 8]], jnp.int32)
  forced = jit_call(pair, "teacher_forced_logits", inputs, dec,
                    jnp.ones_like(dec))
  cached, _ = jit_call(pair, "decode_chunk", dec,
                       jit_call(pair, "start", inputs, 8))
  np.testing.assert_allclose(forced, cached, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# Exactness.
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def greedy_case():
  target = random_model(tiny_config(vocab_size=32), seed=11)
  draft = shared_draft(target, 0.3, seed=12)
  rng = np.random.default_rng(1)
  inputs = rng.integers(2, 32, size=(4, 6)).astype(np.int32)
  inputs[2, 3:] = 0
  free = np.asarray(
      decoding.temperature_sample(target, inputs, jax.random.PRNGKey(0),
                                  max_decode_length=MAX_LEN, eos_id=-1).tokens)

  def first(tok, row):
    hits = np.flatnonzero(free[row] == tok)
    return hits[0] if hits.size else MAX_LEN

  eos = next(tok for tok in range(2, 32)
             if min(first(tok, r) for r in range(4)) <= 3 and max(
                 first(tok, r) for r in range(4)) >= MAX_LEN - 4)
  return target, draft, inputs, eos


DRAFTERS = {
    "bare": lambda target, draft: drafters.ModelDrafter(draft),
    "pair": lambda target, draft: SharedEncoderModel.pair(target, draft),
    "adaptive": lambda target, draft: drafters.ModelDrafter(
        draft, confidence_threshold=0.6),
    "hierarchical": lambda target, draft: drafters.HierarchicalDrafter(
        SharedEncoderModel.pair(target, draft),
        drafters.PromptLookupDrafter(vocab=draft.vocab_size, max_ngram=2),
        inner_gamma=2),
}


@pytest.mark.parametrize("name,gamma", [("bare", 1), ("bare", 3), ("bare", 7),
                                        ("pair", 3), ("adaptive", 3),
                                        ("hierarchical", 3)])
def test_greedy_identity(greedy_case, name, gamma):
  target, draft, inputs, eos = greedy_case
  base = decoding.temperature_sample(target, inputs, jax.random.PRNGKey(0),
                                     max_decode_length=MAX_LEN, eos_id=eos)
  lengths = np.asarray(base.lengths)
  assert lengths.min() <= 4 and lengths.max() >= MAX_LEN - 4, lengths
  drafter = DRAFTERS[name](target, draft)
  spec = decoding.speculative_sample(target, drafter, inputs,
                                     jax.random.PRNGKey(1), gamma=gamma,
                                     max_decode_length=MAX_LEN, eos_id=eos)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  np.testing.assert_array_equal(spec.lengths, base.lengths)
  stats = spec.statistics()
  assert 0.0 < stats["alpha_hat"] < 1.0, stats  # Kept and rejected.
  if name == "adaptive":
    guessed = np.asarray(spec.trace_draft_tokens) != NONE
    assert 0 < guessed.sum() < guessed.size
  if name == "bare":  # Batch of one, each row alone.
    for row in (0, 1):
      one = decoding.speculative_sample(target, drafter, inputs[row:row + 1],
                                        jax.random.PRNGKey(2), gamma=gamma,
                                        max_decode_length=MAX_LEN, eos_id=eos)
      np.testing.assert_array_equal(one.tokens, base.tokens[row:row + 1])


def test_a_perfect_shared_encoder_draft_is_always_accepted(greedy_case):
  """The target's own decoder as the shared-encoder draft: α = 1."""
  target, _, inputs, _ = greedy_case
  draft = shared_draft(target, 0.0, seed=0)
  spec = decoding.speculative_sample(target, draft, inputs[:1],
                                     jax.random.PRNGKey(2), gamma=3,
                                     max_decode_length=MAX_LEN, eos_id=-1)
  assert spec.statistics()["alpha_hat"] == 1.0


@pytest.mark.parametrize("temperature,top_k,top_p,gamma", [
    (1.0, 0, 1.0, 3),
    (0.7, 3, 0.9, 2),
])
def test_output_has_the_target_distribution(temperature, top_k, top_p, gamma):
  target = random_model(tiny_config(vocab_size=test_decoding.VOCAB), seed=21)
  draft = shared_draft(target, 1.0, seed=22)
  inputs = np.array([[3, 4, 2, 1]], np.int32)
  exact = test_decoding._exact_sequence_distribution(  # pylint: disable=protected-access
      target, inputs, temperature, top_k, top_p)
  assert abs(sum(exact.values()) - 1.0) < 1e-5 and len(exact) >= 8
  out = decoding.speculative_sample(
      target, draft, np.repeat(inputs, test_decoding.SAMPLES, axis=0),
      jax.random.PRNGKey(7 + gamma), gamma=gamma,
      max_decode_length=test_decoding.STEPS, temperature=temperature,
      top_k=top_k, top_p=top_p, eos_id=test_decoding.EOS)
  keys = sorted(exact)
  index = {k: i for i, k in enumerate(keys)}
  observed = np.zeros(len(keys))
  for row in map(tuple, np.asarray(out.tokens)):
    assert row in index, f"sequence {row} has probability 0 under the target"
    observed[index[row]] += 1
  expected = np.array([exact[k] for k in keys])
  assert chisquare_pvalue(observed, expected) > test_decoding.SIGNIFICANCE
  alpha = out.statistics()["alpha_hat"]
  assert 0.1 < alpha < 0.95, alpha


def test_models_exports():
  assert models.SharedEncoderModel is SharedEncoderModel
  assert models.EncoderOutput._fields == ("encoded", "valid")
