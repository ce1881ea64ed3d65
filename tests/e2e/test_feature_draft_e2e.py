"""The shipped feature-level draft (pretrained/multi30k/feature_1m) with
the shipped 38M target: it loads as its gin file says and decodes exactly
(the feature draft's quick tests: tests/core/test_feature_drafter.py)."""
import gin
import jax
import numpy as np
import pytest

from specdec_jax import checkpoints
from specdec_jax.checkpoints import feature_draft as feature_checkpoint
from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils  # noqa: F401 (registers FeatureDrafterConfig)
from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.core.models import FeatureDrafterConfig
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import param_shapes
from specdec_jax.data import vocab as vocab_lib

from conftest import REPO

pytestmark = pytest.mark.slow


@pytest.mark.usefixtures("clean_gin")
def test_shipped_feature_draft_loads_and_decodes_exactly():
  """pretrained/multi30k/feature_1m: bfloat16 on disk (digests verified),
  the config of its gin file, float32 after loading; with the 38M target,
  greedy output identical and most guesses kept on a simple caption."""
  shipped = REPO / "pretrained" / "multi30k"
  ckpt = checkpoints.latest_checkpoint(str(shipped / "feature_1m"))
  assert ckpt is not None
  gin.parse_config_file(
      str(REPO / "gin" / "models" / "multi30k_feature_drafter.gin"))
  assert feature_checkpoint.read_config(ckpt) == FeatureDrafterConfig()  # pylint: disable=no-value-for-parameter
  config = gin_reader.read_t5_config("models/multi30k_target_38m.gin")
  params = checkpoints.load_t5x_params(
      checkpoints.latest_checkpoint(str(shipped / "target_38m")),
      expected=param_shapes(config)["params"], dtype=np.float32)
  target = T5Model(config, {"params": params}).prepared_for_decoding()
  draft = feature_checkpoint.load_draft_model(ckpt, target)
  assert all(
      x.dtype == np.float32 for x in jax.tree_util.tree_leaves(draft.params))
  vocab = vocab_lib.get_vocabulary(str(shipped / "multi30k.model"), extra_ids=0)
  ids = vocab.encode("A man in a blue shirt is riding a bicycle.") + [1]
  inputs = np.asarray([ids], np.int32)
  base = decoding.temperature_sample(target, inputs, jax.random.PRNGKey(0),
                                     max_decode_length=16)
  spec = decoding.speculative_sample(target.with_features(),
                                     drafters.FeatureDrafter(draft), inputs,
                                     jax.random.PRNGKey(0), gamma=4,
                                     max_decode_length=16)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  assert float(spec.alpha_hat) > 0.5
