"""Feature-level (EAGLE-style) drafts for tests.

* `feature_draft`: a random feature draft for a target (the core's tests);
  `greedy_case`: the feature drafter's greedy world (a V = 8 target).
* `write_feature_checkpoint`: a checkpoint for local_tiny.gin's target,
  shared by tests/harness/test_run_feature_drafter.py and
  tests/e2e/test_run_feature_drafter_e2e.py.
"""
import functools

import jax
import numpy as np

from specdec_jax.core.models import FeatureDraftModel
from specdec_jax.core.models import FeatureDrafterConfig
from specdec_jax.core.models.feature_drafter import init_feature_params
from specdec_jax.checkpoints import feature_draft as feature_checkpoint

from conftest import random_model
from conftest import tiny_config

VOCAB = 259  # local_tiny.gin's byte vocabulary
WIDTH = 64  # local_tiny.gin's target emb_dim
GREEDY_LEN = 14  # max_decode_length of `greedy_case`'s decodes


def feature_draft(target, head_size: int, seed: int,
                  scale: float = 1.0) -> FeatureDraftModel:
  """A random feature draft for `target` whose head leaves out the last
  vocab_size - head_size tokens but one (token 1, EOS, stays in)."""
  vocab = target.config.vocab_size
  config = FeatureDrafterConfig(vocab_size=vocab,
                                feature_dim=target.config.emb_dim, emb_dim=8,
                                num_heads=2, head_dim=4, mlp_dim=16,
                                head_size=head_size)
  params = init_feature_params(config, jax.random.PRNGKey(seed))
  params = jax.tree_util.tree_map(lambda x: scale * x, params)
  head = np.concatenate([np.arange(1, head_size), [vocab - 1]]).astype(np.int32)
  return FeatureDraftModel.for_target(config, params, head, target.unpacked())


@functools.lru_cache(maxsize=None)
def greedy_case():
  """(target V = 8, draft, inputs [4, 6]): seed 22 is a random draft that
  agrees with the target's argmax on some guesses (α̂ 0.40 at γ = 3); its
  head leaves out tokens 0 and 6, and row 2's greedy output is all 0s, so
  those guesses are always rejected."""
  target = random_model(tiny_config(vocab_size=8), seed=11)
  draft = feature_draft(target, 6, seed=22)
  rng = np.random.default_rng(1)
  inputs = rng.integers(2, 8, size=(4, 6)).astype(np.int32)
  inputs[2, 3:] = 0
  return target, draft, inputs


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
