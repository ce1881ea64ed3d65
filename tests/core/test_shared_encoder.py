"""A shared-encoder draft: a draft decoder reading the target's encoder.

* The config and parameter layout: `num_encoder_layers = 0` with
  `encoder_width` (the target's emb_dim) has no `encoder/` parameters and
  cross-attention key/value kernels [encoder_width, heads * head_dim];
  `num_params` counts them; inconsistent settings are refused.
* The protocol: the speculative loop hands the target's encoder output
  (`Target.encoder_output`) to `Drafter.init`, and the draft starts from it
  (same state as encoding the inputs with the target's encoder itself).
* The target's own decoder as the draft is always accepted.

Exactness, as for every drafter (greedy identity, γ 1, 3, 7, batch of 4
and of 1, the pair, adaptive γ, inside the hierarchical drafter; the
target's distribution at T = 1 and with top-k + top-p), is the drafter
contract's: test_drafter_contract.py.
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

from conftest import GREEDY_LEN
from conftest import greedy_world
from conftest import jit_call
from conftest import random_model
from conftest import tiny_config
from drafter_helpers import shared_draft

# The loop's prefill, compiled as one program (eagerly, each of its
# operations would be a program of its own).
_init_speculative_state = jax.jit(
    decoding.init_speculative_state,
    static_argnames=("gamma", "max_decode_length", "statistics"))


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


def test_a_perfect_shared_encoder_draft_is_always_accepted():
  """The target's own decoder as the shared-encoder draft: α = 1."""
  world = greedy_world()
  draft = shared_draft(world.target, 0.0, seed=0)
  spec = decoding.speculative_sample(world.target, draft, world.inputs[:1],
                                     jax.random.PRNGKey(2), gamma=3,
                                     max_decode_length=GREEDY_LEN, eos_id=-1)
  assert spec.statistics()["alpha_hat"] == 1.0


def test_models_exports():
  assert models.SharedEncoderModel is SharedEncoderModel
  assert models.EncoderOutput._fields == ("encoded", "valid")
