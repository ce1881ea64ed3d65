"""The model: T5X's parameter tree, and chunked cached decoding == full forward.

Chunked decode (any chunk sizes), one-token-at-a-time decode and the full
teacher-forced forward must give the same logits (fp32 tolerance), also after
a rollback by length, and with rows of a batch at different positions.
"""
import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core.models import T5Config
from specdec_jax.core.models import Transformer
from specdec_jax.core.models import param_shapes
from specdec_jax.core.models.config import json_fields
from specdec_jax.core.models.feature_drafter import FeatureDrafterConfig

from conftest import jit_call
from conftest import random_model
from conftest import tiny_config

ATOL = 2e-5


@functools.partial(jax.jit, static_argnums=0)
def _full_forward(config, params, enc, dec, target):
  """The teacher-forced forward pass, compiled as one program."""
  return Transformer(config).apply(params, enc, dec, target)


@pytest.fixture(scope="module")
def setup():
  config = tiny_config(vocab_size=32)
  model = random_model(config, seed=3)
  rng = np.random.default_rng(0)
  enc = rng.integers(2, 32, size=(3, 7)).astype(np.int32)
  enc[1, 4:] = 0  # padding
  enc[2, 2:] = 0
  dec = rng.integers(2, 32, size=(3, 9)).astype(np.int32)
  dec[:, 0] = 0  # start token
  full = _full_forward(config, model.params, enc, dec, np.ones_like(dec))
  return model, enc, dec, np.asarray(full)


def _decode_in_chunks(model, enc, dec, sizes, max_len=12):
  cache = jit_call(model, "start", jnp.asarray(enc), max_len)
  logits, pos = [], 0
  for k in sizes:
    out, cache = jit_call(model, "decode_chunk",
                          jnp.asarray(dec[:, pos:pos + k]), cache)
    logits.append(np.asarray(out))
    pos += k
  return np.concatenate(logits, axis=1), cache


@pytest.mark.parametrize("sizes", [[1] * 9, [2, 3, 4], [4, 1, 4], [9]])
def test_chunked_decode_matches_full_forward(setup, sizes):
  model, enc, dec, full = setup
  logits, cache = _decode_in_chunks(model, enc, dec, sizes)
  np.testing.assert_allclose(logits, full, atol=ATOL)
  np.testing.assert_array_equal(cache.length, [9, 9, 9])


def test_rollback_by_length_then_continue(setup):
  """Garbage written past the kept prefix is masked, then overwritten."""
  model, enc, dec, full = setup
  cache = jit_call(model, "start", jnp.asarray(enc), 12)
  _, cache = jit_call(model, "decode_chunk", jnp.asarray(dec[:, :4]), cache)
  # Speculate 5 wrong tokens, then keep only 1, 0 and 3 of them per row.
  garbage = jnp.full((3, 5), 17, jnp.int32)
  _, cache = jit_call(model, "decode_chunk", garbage, cache)
  keep = np.array([1, 0, 3])
  cache = cache.replace(length=jnp.asarray(4 + keep, jnp.int32))
  # Row r now continues from position 4 + keep[r]. Rows whose kept garbage
  # differs from the true sequence are compared against a full forward of
  # the sequence they actually hold.
  held = dec.copy()
  for r in range(3):
    held[r, 4:4 + keep[r]] = 17
  new_full = np.asarray(
      _full_forward(model.config, model.params, enc, held, np.ones_like(held)))
  # Feed 2 more true tokens at each row's own position.
  nxt = np.stack([held[r, 4 + keep[r]:6 + keep[r]] for r in range(3)])
  out, cache = jit_call(model, "decode_chunk", jnp.asarray(nxt), cache)
  for r in range(3):
    np.testing.assert_allclose(out[r], new_full[r, 4 + keep[r]:6 + keep[r]],
                               atol=ATOL)
  np.testing.assert_array_equal(cache.length, 6 + keep)
  # A full rollback to 0 then re-decoding reproduces the original logits.
  cache = cache.replace(length=jnp.zeros(3, jnp.int32))
  out, _ = jit_call(model, "decode_chunk", jnp.asarray(dec[:, :5]), cache)
  np.testing.assert_allclose(out, full[:, :5], atol=ATOL)


def test_param_tree_matches_t5x_layout():
  config = tiny_config(vocab_size=40, emb_dim=12, num_heads=3, head_dim=5,
                       mlp_dim=20)
  shapes = jax.tree_util.tree_map(lambda x: x.shape,
                                  param_shapes(config))["params"]
  layer = shapes["decoder"]["layers_1"]
  assert shapes["token_embedder"]["embedding"] == (40, 12)
  assert shapes["encoder"]["relpos_bias"]["rel_embedding"] == (3, 32)
  assert shapes["decoder"]["relpos_bias"]["rel_embedding"] == (3, 32)
  assert shapes["decoder"]["logits_dense"]["kernel"] == (12, 40)
  assert layer["self_attention"]["query"]["kernel"] == (12, 15)
  assert layer["encoder_decoder_attention"]["out"]["kernel"] == (15, 12)
  assert layer["mlp"]["wi_0"]["kernel"] == (12, 20)
  assert layer["mlp"]["wi_1"]["kernel"] == (12, 20)
  assert layer["mlp"]["wo"]["kernel"] == (20, 12)
  assert set(layer) == {
      "pre_self_attention_layer_norm", "self_attention",
      "pre_cross_attention_layer_norm", "encoder_decoder_attention",
      "pre_mlp_layer_norm", "mlp"
  }
  assert set(shapes["encoder"]["layers_0"]) == {
      "pre_attention_layer_norm", "attention", "pre_mlp_layer_norm", "mlp"
  }
  n = sum(
      np.prod(s) for s in jax.tree_util.tree_leaves(
          shapes, is_leaf=lambda x: isinstance(x, tuple)))
  assert n == config.num_params


def test_t5_1_1_xxl_shapes_without_allocation():
  xxl = T5Config(vocab_size=32128, emb_dim=4096, num_heads=64, head_dim=64,
                 mlp_dim=10240, num_encoder_layers=24, num_decoder_layers=24)
  shapes = param_shapes(xxl)["params"]
  assert shapes["decoder"]["layers_23"]["mlp"]["wi_1"]["kernel"].shape == (
      4096, 10240)
  assert 11.0e9 < xxl.num_params < 11.5e9  # "T5-XXL (11B)"


@pytest.mark.parametrize("field,value", [("emb_dim", 0), ("num_heads", -1),
                                         ("vocab_size", 2.5)])
def test_config_rejects_bad_sizes(field, value):
  with pytest.raises(ValueError, match=field):
    T5Config(**{field: value})


def test_json_fields_name_the_dtype_list_tuples_and_omit_what_is_asked():
  """A checkpoint's config file and a run's record: every field, JSON-ready
  (a dtype object or a tuple would not serialize, or not compare equal
  after a round trip)."""
  config = tiny_config(dtype=jnp.bfloat16)
  fields = json_fields(config)
  assert set(fields) == {f.name for f in dataclasses.fields(T5Config)}
  assert fields["dtype"] == "bfloat16"
  assert fields["mlp_activations"] == list(config.mlp_activations)
  assert fields["encoder_width"] is None
  assert json.loads(json.dumps(fields)) == fields
  assert "encoder_width" not in json_fields(config,
                                            omit_none=("encoder_width",))
  wide = dataclasses.replace(config, num_encoder_layers=0, encoder_width=48)
  assert json_fields(wide, omit_none=("encoder_width",))["encoder_width"] == 48
  feature = json_fields(
      FeatureDrafterConfig(vocab_size=8, feature_dim=4, head_size=4))
  assert feature["dtype"] == "float32" and feature["vocab_size"] == 8
