"""Ground truth from T5X itself (../shared/fixtures/t5x_tiny).

Our loader reads T5X's checkpoint, our model reproduces T5X's logits, and
both our decoders reproduce T5X's greedy `decoding.temperature_sample`.
"""
import functools
import json

import jax
import numpy as np
import pytest

from specdec_jax import checkpoints
from specdec_jax.core import decoding
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import Transformer
from specdec_jax.core.models import param_shapes

from conftest import T5X_TINY
from conftest import perturbed
from conftest import random_model
from conftest import require_shared


@functools.partial(jax.jit, static_argnums=0)
def _forward(config, params, enc, dec, target):
  """The teacher-forced forward pass, compiled as one program."""
  return Transformer(config).apply(params, enc, dec, target)


@pytest.fixture(scope="module")
def fixture():
  require_shared(T5X_TINY)
  config = T5Config(**json.loads((T5X_TINY / "config.json").read_text()))
  reference = dict(np.load(T5X_TINY / "reference.npz"))
  return config, reference


@pytest.mark.parametrize("layout", ["legacy", "orbax"])
def test_model_reproduces_t5x_logits(fixture, layout):
  config, ref = fixture
  params = checkpoints.load_t5x_params(str(T5X_TINY / layout / "checkpoint_0"),
                                       expected=param_shapes(config)["params"])
  logits = _forward(config, {"params": params}, ref["encoder_input_tokens"],
                    ref["decoder_input_tokens"], ref["decoder_target_tokens"])
  np.testing.assert_allclose(logits, ref["logits"], atol=1e-4, rtol=1e-4)


def test_decoders_reproduce_t5x_greedy_tokens(fixture):
  config, ref = fixture
  params = checkpoints.load_t5x_params(str(T5X_TINY / "legacy" /
                                           "checkpoint_0"))
  target = T5Model(config, {"params": params})
  max_len = ref["greedy_tokens"].shape[1]
  base = decoding.temperature_sample(target, ref["encoder_input_tokens"],
                                     jax.random.PRNGKey(0),
                                     max_decode_length=max_len)
  np.testing.assert_array_equal(base.tokens, ref["greedy_tokens"])
  # Any draft gives the same greedy tokens: a near copy and an unrelated one.
  for draft in (perturbed(target, 0.1, seed=1),
                random_model(config.replace(num_decoder_layers=1), seed=2)):
    spec = decoding.speculative_sample(target, draft,
                                       ref["encoder_input_tokens"],
                                       jax.random.PRNGKey(1), gamma=3,
                                       max_decode_length=max_len)
    np.testing.assert_array_equal(spec.tokens, ref["greedy_tokens"])
