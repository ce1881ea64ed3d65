"""A feature-level draft's checkpoint for local_tiny.gin's target, shared by
tests/harness/test_run_feature_drafter.py and
tests/e2e/test_run_feature_drafter_e2e.py."""
import jax
import numpy as np

from specdec_jax.core.models import FeatureDrafterConfig
from specdec_jax.core.models.feature_drafter import init_feature_params
from specdec_jax.checkpoints import feature_draft as feature_checkpoint

VOCAB = 259  # local_tiny.gin's byte vocabulary
WIDTH = 64  # local_tiny.gin's target emb_dim


def write_feature_checkpoint(folder, feature_dim=WIDTH, vocab_size=VOCAB,
                             seed=0) -> str:
  """A random tiny feature draft's checkpoint (as training writes it);
  its head: the first 100 ids (EOS among them)."""
  config = FeatureDrafterConfig(vocab_size=vocab_size, feature_dim=feature_dim,
                                emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16,
                                head_size=100)
  params = init_feature_params(config, jax.random.PRNGKey(seed))
  feature_checkpoint.save(str(folder), 10, params, np.arange(100), config)
  return str(folder)
