"""A feature-level (EAGLE-style) draft: it reads the target's hidden states.

* The target hands them over: a T5 cache started `with_features()` keeps
  the decoder's top hidden states, equal to a plain teacher-forced pass's,
  after chunks and a rollback; its logits are the plain model's, bit for
  bit; a plain cache keeps none and says so.
* The draft's cached decoding (chunks, any split) equals its teacher-forced
  pass (the training path); q is 0 exactly off the head's tokens. A head
  restricted to fewer tokens gives q renormalised over them; a low-rank
  head is the SVD's best and the network reads it as its product.

Exactness through the loop (greedy identity, γ 1, 3, 5, batch of 4 and of
1; the target's distribution at T = 1 and with top-k + top-p, a head that
leaves a token out; the lenient rule failing the same check) is the
drafter contract's: test_drafter_contract.py. The shipped draft with the
shipped 38M target: tests/e2e/test_feature_draft_e2e.py.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.core.models import FeatureDraftModel
from specdec_jax.core.models import FeatureDrafterConfig
from specdec_jax.core.models import Transformer
from specdec_jax.core.models.feature_drafter import FeatureDecoder
from specdec_jax.core.models.feature_drafter import init_feature_params
from specdec_jax.core.models.feature_drafter import low_rank_head
from specdec_jax.core.models.feature_drafter import restrict_head
from specdec_jax.core.models.feature_drafter import shifted_features

from conftest import jit_call
from conftest import random_model
from conftest import tiny_config
from feature_helpers import feature_draft


# ---------------------------------------------------------------------------
# The target's hidden states.
# ---------------------------------------------------------------------------
def test_kept_features_equal_a_teacher_forced_pass():
  target = random_model(tiny_config(), seed=1)
  keeping = target.with_features()
  inputs = jnp.asarray([[3, 4, 5, 1, 0], [6, 7, 1, 0, 0]], jnp.int32)
  dec = jnp.asarray([[0, 5, 6, 9, 2, 4], [0, 7, 8, 3, 3, 11]], jnp.int32)
  plain_cache = jit_call(target, "start", inputs, 8)
  assert plain_cache.features is None
  with pytest.raises(ValueError, match="with_features"):
    target.features(plain_cache)
  cache = jit_call(keeping, "start", inputs, 8)
  # Feed 3 positions, roll back to 2 (as after a rejection), feed 4.
  for lo, hi in ((0, 3), (2, 6)):
    cache = jit_call(keeping, "truncate", cache, jnp.asarray([lo, lo]))
    plain_cache = jit_call(target, "truncate", plain_cache,
                           jnp.asarray([lo, lo]))
    logits, cache = jit_call(keeping, "decode_chunk", dec[:, lo:hi], cache)
    expected, plain_cache = jit_call(target, "decode_chunk", dec[:, lo:hi],
                                     plain_cache)
    np.testing.assert_array_equal(logits, expected)  # Same decode path.
  module = Transformer(target.config)
  params = target.unpacked().params
  encode = jax.jit(functools.partial(module.apply, method=Transformer.encode))
  decode = jax.jit(
      functools.partial(module.apply, method=Transformer.decode_hidden))
  encoded = encode(params, inputs)
  hidden, logits = decode(params, encoded, inputs, dec, jnp.ones_like(dec))
  features = np.asarray(keeping.features(cache))
  assert features.shape == (2, 8, target.config.emb_dim)
  np.testing.assert_allclose(features[:, :6], hidden, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(expected, logits[:, 2:], rtol=1e-4, atol=1e-4)
  # A state's features at positions < length are all a drafter may read.
  assert np.asarray(keeping.length(cache)).tolist() == [6, 6]


def test_loop_refuses_a_target_that_keeps_no_features():
  target = random_model(tiny_config(), seed=1)
  drafter = drafters.FeatureDrafter(feature_draft(target, 12, seed=2))
  with pytest.raises(ValueError, match="with_features"):
    decoding.speculative_sample(target, drafter, jnp.ones((1, 3), jnp.int32),
                                jax.random.PRNGKey(0), gamma=2,
                                max_decode_length=4)


# ---------------------------------------------------------------------------
# The draft model.
# ---------------------------------------------------------------------------
def test_cached_decoding_equals_teacher_forcing_and_q_is_off_head_zero():
  target = random_model(tiny_config(), seed=3)
  draft = feature_draft(target, 10, seed=4)
  rs = np.random.RandomState(0)
  batch, length, width = 2, 6, target.config.emb_dim
  feats = jnp.asarray(rs.randn(batch, length, width), jnp.float32)
  tokens = jnp.asarray(rs.randint(0, 16, size=(batch, length)), jnp.int32)
  inputs = jnp.asarray([[3, 4, 5, 1], [6, 7, 1, 0]], jnp.int32)
  enc = target.encoder_output(jit_call(target, "start", inputs, 8))
  prev = shifted_features(feats)
  assert float(jnp.abs(prev[:, 0]).max()) == 0.0
  np.testing.assert_array_equal(prev[:, 1:], feats[:, :-1])
  forced = jax.jit(FeatureDecoder(draft.config).apply)
  forced_f, forced_l = forced(draft.params, prev,
                              jnp.take(draft.embedding, tokens, axis=0),
                              enc.encoded, enc.valid,
                              jnp.ones((batch, length), bool))
  cache = jit_call(draft, "start_from_encoder_output", enc, 8)
  outs = []
  for lo, hi in ((0, 1), (1, 4), (4, 6)):
    f, logits, cache = jit_call(draft, "decode_chunk", prev[:, lo:hi],
                                tokens[:, lo:hi], cache)
    outs.append((f, logits))
  np.testing.assert_allclose(jnp.concatenate([o[0] for o in outs], 1), forced_f,
                             rtol=1e-4, atol=1e-5)
  logits = jnp.concatenate([o[1] for o in outs], 1)
  np.testing.assert_allclose(logits[..., draft.head_tokens], forced_l,
                             rtol=1e-4, atol=1e-4)
  q = np.asarray(jax.nn.softmax(logits, axis=-1))
  off = np.setdiff1d(np.arange(16), np.asarray(draft.head_tokens))
  assert off.size == 6 and (q[..., off] == 0.0).all()
  np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-5)


def test_bad_configs_and_pairings_are_refused():
  with pytest.raises(ValueError, match="head_size=20"):
    FeatureDrafterConfig(vocab_size=16, head_size=20)
  with pytest.raises(ValueError, match="emb_dim must be a positive"):
    FeatureDrafterConfig(emb_dim=0)
  target = random_model(tiny_config(), seed=1)
  config = FeatureDrafterConfig(vocab_size=16, feature_dim=8, emb_dim=8,
                                num_heads=2, head_dim=4, mlp_dim=16,
                                head_size=4)
  params = init_feature_params(config, jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="features of width 8"):
    FeatureDraftModel.for_target(config, params, np.arange(4), target)
  config = config.__class__(**{**config.__dict__, "feature_dim": 16})
  with pytest.raises(ValueError, match=r"expected \(4,\)"):
    FeatureDraftModel.for_target(config, params, np.arange(5), target)
  assert config.num_params == sum(x.size for x in jax.tree_util.tree_leaves(
      init_feature_params(config, jax.random.PRNGKey(0))))


def _step_logits(draft, target):
  """Logits [2, 3, V] of one 3-position chunk of `draft` from a fresh cache."""
  rs = np.random.RandomState(5)
  inputs = jnp.asarray([[3, 4, 5, 1], [6, 7, 1, 0]], jnp.int32)
  enc = target.encoder_output(jit_call(target, "start", inputs, 8))
  feats = jnp.asarray(rs.randn(2, 3, target.config.emb_dim), jnp.float32)
  tokens = jnp.asarray(rs.randint(0, 16, size=(2, 3)), jnp.int32)
  _, logits, _ = jit_call(draft, "decode_chunk", feats, tokens,
                          jit_call(draft, "start_from_encoder_output", enc, 8))
  return np.asarray(logits)


def test_a_restricted_head_is_the_draft_renormalised_over_its_tokens():
  target = random_model(tiny_config(), seed=3)
  draft = feature_draft(target, 12, seed=4)
  keep = [1, 2, 5, 9, 15]
  config, params, head = restrict_head(draft.config, draft.params,
                                       draft.head_tokens, [9, 1, 15, 2, 5])
  assert config.head_size == 5 and head.tolist() == keep
  small = FeatureDraftModel.for_target(config, params, head, target.unpacked())
  assert small.config.num_params == draft.config.num_params - 7 * 8
  full, cut = _step_logits(draft, target), _step_logits(small, target)
  np.testing.assert_allclose(cut[..., keep], full[..., keep], rtol=1e-5,
                             atol=1e-5)
  q_full = np.asarray(jax.nn.softmax(full, -1))[..., keep]
  q_cut = np.asarray(jax.nn.softmax(cut, -1))
  np.testing.assert_allclose(q_cut[..., keep],
                             q_full / q_full.sum(-1, keepdims=True), rtol=1e-5)
  assert (np.delete(q_cut, keep, axis=-1) == 0.0).all()
  with pytest.raises(ValueError, match=r"keep_tokens \[13\] are not in"):
    restrict_head(draft.config, draft.params, draft.head_tokens, [1, 13])
  with pytest.raises(ValueError, match="distinct and non-empty"):
    restrict_head(draft.config, draft.params, draft.head_tokens, [1, 1])


def test_a_low_rank_head_is_the_best_rank_r_head():
  target = random_model(tiny_config(), seed=3)
  draft = feature_draft(target, 12, seed=4)
  kernel = np.asarray(draft.params["params"]["logits_dense"]["kernel"])
  config, params = low_rank_head(draft.config, draft.params, 3)
  down = np.asarray(params["params"]["head_down"]["kernel"])
  up = np.asarray(params["params"]["logits_dense"]["kernel"])
  assert down.shape == (8, 3) and up.shape == (3, 12)
  assert config.num_params == sum(
      x.size for x in jax.tree_util.tree_leaves(params))
  # Eckart-Young: the error is the dropped singular values' norm.
  s = np.linalg.svd(kernel, compute_uv=False)
  np.testing.assert_allclose(np.linalg.norm(kernel - down @ up),
                             np.sqrt((s[3:]**2).sum()), rtol=1e-4)
  # The network reads head_down then logits_dense: the same logits as a
  # full head whose kernel is their product.
  low = FeatureDraftModel.for_target(config, params, draft.head_tokens,
                                     target.unpacked())
  tree = dict(params["params"])
  del tree["head_down"]
  tree["logits_dense"] = {"kernel": jnp.asarray(down @ up)}
  product = FeatureDraftModel.for_target(draft.config, {"params": tree},
                                         draft.head_tokens, target.unpacked())
  np.testing.assert_allclose(_step_logits(low, target),
                             _step_logits(product, target), rtol=1e-4,
                             atol=1e-4)
  with pytest.raises(ValueError, match="head_rank must be None or an integer"):
    low_rank_head(draft.config, draft.params, 8)
  with pytest.raises(ValueError, match="has rank 3 already"):
    low_rank_head(config, params, 2)
