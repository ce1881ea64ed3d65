"""Training a feature-level draft: `python -m specdec_jax.train` with
`train.feature_drafter` (`training.feature_trainer`).

* The head's tokens are the most frequent target ids (ties by id; padding
  never).
* The shipped gin files parse into the shipped draft's config, distilled
  from the shipped 38M target.
* A short run against a small random teacher (Multi30k data, the shipped
  vocabulary): the loss falls, the checkpoint (T5X layout, head_tokens,
  feature_config.json) loads back, and the trained draft drafts exactly for
  its teacher (greedy identity); a warm start from it keeps its head and
  starts from its loss. Bad settings are refused before training.
* The export of a cheaper head (fewer tokens, lower rank) of the shipped
  draft.
"""
import subprocess
import sys

import gin
import jax
import numpy as np
import pytest

from specdec_jax import checkpoints
from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.config import gin_reader
from specdec_jax.data import tasks
from specdec_jax import train as train_lib
from specdec_jax.core.models import FeatureDrafterConfig
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import init_params
from specdec_jax.training import checkpointing
from specdec_jax.checkpoints import feature_draft as feature_checkpoint
from specdec_jax.data import vocab as vocabulary
from specdec_jax.training.feature_trainer import head_tokens_from_targets

from conftest import MULTI30K
from conftest import REPO
from conftest import require_shared
from conftest import tiny_config

SPM = REPO / "pretrained" / "multi30k" / "multi30k.model"
GIN = "train/multi30k_feature_drafter.gin"


def test_head_tokens_are_the_most_frequent_targets():
  targets = np.array([[5, 5, 3, 1, 0], [3, 7, 7, 1, 0], [7, 2, 1, 0, 0]])
  # Counts: 1 x3, 7 x3, 3 x2, 5 x2, 2 x1; ties by id (3 before 5).
  assert head_tokens_from_targets(targets, 3, 10).tolist() == [1, 3, 7]
  assert head_tokens_from_targets(targets, 4, 10).tolist() == [1, 3, 5, 7]
  # Fewer seen ids than K: unseen ids (never padding) fill the head.
  head = head_tokens_from_targets(targets, 8, 10)
  assert 0 not in head and len(set(head.tolist())) == 8


def test_shipped_gin_files_parse():
  gin.clear_config()
  try:
    train_lib.parse_gin([GIN], [])
    config = FeatureDrafterConfig()  # pylint: disable=no-value-for-parameter
    target = gin_reader.read_t5_config(
        gin.query_parameter("train.teacher_model_gin"))
    assert config.feature_dim == target.emb_dim
    assert config.vocab_size == target.vocab_size
    assert gin.query_parameter("%TEACHER_DIR") == (
        "pretrained/multi30k/target_38m")
    assert gin.query_parameter("%MODEL_DIR") == "outputs/multi30k/feature_1m"
    assert 0.8e6 <= config.num_params <= 1.2e6
  finally:
    gin.clear_config()


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
  """A random tiny teacher over the shipped 8000-piece vocabulary."""
  require_shared(MULTI30K / "train.en")
  directory = tmp_path_factory.mktemp("teacher")
  config = tiny_config(vocab_size=8000)
  params = init_params(config, jax.random.PRNGKey(0))
  ckpt = checkpoints.save_params(params, str(directory), step=1)
  checkpointing.write_model_config(ckpt, config)
  return directory, T5Model(config, params)


def _train(model_dir, teacher, **extra):
  bindings = [
      f"MULTI30K_DIR = '{MULTI30K}'", f"SPM_MODEL_PATH = '{SPM}'",
      f"MODEL_DIR = '{model_dir}'", f"TEACHER_DIR = '{teacher}'",
      "NUM_STEPS = 30", "train.teacher_model_gin = None",
      "FeatureDrafterConfig.feature_dim = 16",
      "FeatureDrafterConfig.emb_dim = 8", "FeatureDrafterConfig.num_heads = 2",
      "FeatureDrafterConfig.head_dim = 4", "FeatureDrafterConfig.mlp_dim = 16",
      "FeatureDrafterConfig.head_size = 500"
  ]
  gin.clear_config()
  try:
    train_lib.parse_gin([GIN], bindings)
    return train_lib.train(batch_size=8, num_train_examples=400,
                           learning_rate=1e-2, warmup_steps=5,
                           log_every_steps=5, save_every_steps=15,
                           eval_num_examples=8, eval_batch_size=8, **extra)
  finally:
    gin.clear_config()


def test_a_short_run_trains_a_draft_that_drafts_exactly(tmp_path, teacher_dir):
  directory, teacher = teacher_dir
  result = _train(tmp_path / "feature", directory)
  losses = [h["loss"] for h in result.history]
  assert len(losses) == 6 and losses[-1] < losses[0], losses
  assert set(result.metrics["eval"]) >= {"alpha0_1", "alpha1_2", "off_head_1"}
  ckpt = checkpoints.latest_checkpoint(str(tmp_path / "feature"))
  assert ckpt.endswith("checkpoint_30") and result.checkpoint == ckpt
  config, params, head = feature_checkpoint.load(ckpt)
  assert config.head_size == 500 and head.dtype == np.int32
  assert 1 in head and 0 not in head and len(set(head.tolist())) == 500
  jax.tree_util.tree_map(np.testing.assert_allclose, params,
                         jax.device_get(result.params))
  draft = feature_checkpoint.load_draft_model(ckpt, teacher)
  sp = vocabulary.load_sentencepiece(str(SPM))
  examples = tasks.load_examples(source_file=MULTI30K / "val.en",
                                 reference_file=MULTI30K / "val.de",
                                 num_examples=6)
  inputs = tasks.encode_batch(sp, [e["input"] for e in examples], 32)
  inputs = inputs[:, :int((inputs > 0).sum(1).max())]
  rng = jax.random.PRNGKey(0)
  base = decoding.temperature_sample(teacher, inputs, rng, max_decode_length=12)
  spec = decoding.speculative_sample(teacher.with_features(),
                                     drafters.FeatureDrafter(draft), inputs,
                                     rng, gamma=3, max_decode_length=12)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  # A trained draft of a fresh run's directory is never overwritten.
  with pytest.raises(ValueError, match="fresh model_dir"):
    _train(tmp_path / "feature", directory)
  # A warm start continues from it: its head tokens, and a loss at step 5
  # below the fresh run's at step 5 (same data order, same rate).
  warm = _train(tmp_path / "warm", directory, num_steps=5,
                feature_init_from=ckpt)
  assert warm.history[0]["loss"] < result.history[0]["loss"] - 0.1, (
      warm.history[0], result.history[0])
  _, _, warm_head = feature_checkpoint.load(warm.checkpoint)
  np.testing.assert_array_equal(warm_head, head)
  with pytest.raises(ValueError, match=r"differs .* in \['head_size'\]"):
    _train(
        tmp_path / "other", directory, num_steps=5, feature_init_from=ckpt,
        feature_drafter=FeatureDrafterConfig(vocab_size=8000, feature_dim=16,
                                             emb_dim=8, num_heads=2, head_dim=4,
                                             mlp_dim=16, head_size=400))


def test_a_feature_draft_needs_a_teacher(tmp_path):
  gin.clear_config()
  try:
    train_lib.parse_gin([GIN], [f"MULTI30K_DIR = '{MULTI30K}'"])
    with pytest.raises(ValueError, match="set train.distill_from"):
      train_lib.train(model_dir=str(tmp_path / "x"), distill_from=None,
                      teacher_model_gin=None)
  finally:
    gin.clear_config()


def test_export_of_a_cheaper_head(tmp_path):
  """tools/export_feature_drafter.py --head_size/--head_rank on the
  shipped draft: the K most frequent of its head tokens in the training
  targets, a rank-R head, float32; other targets are refused."""
  require_shared(MULTI30K / "train.de")
  shipped = REPO / "pretrained" / "multi30k" / "feature_1m"
  args = [
      sys.executable, "-m", "tools.export_feature_drafter", "--model_dir",
      str(shipped), "--spm",
      str(SPM), "--dtype", "float32", "--head_size", "500", "--head_rank", "16",
      "--train_targets"
  ]
  done = subprocess.run(
      args + [str(MULTI30K / "train.de"), "--out",
              str(tmp_path / "a")], capture_output=True, text=True, cwd=REPO,
      check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  config, params, head = feature_checkpoint.load(
      checkpoints.latest_checkpoint(str(tmp_path / "a")))
  _, _, full_head = feature_checkpoint.load(
      checkpoints.latest_checkpoint(str(shipped)))
  assert (config.head_size, config.head_rank) == (500, 16)
  assert set(head.tolist()) < set(full_head.tolist()) and 1 in head
  assert params["params"]["head_down"]["kernel"].shape == (config.emb_dim, 16)
  refused = subprocess.run(
      args + [str(MULTI30K / "train.en"), "--out",
              str(tmp_path / "b")], capture_output=True, text=True, cwd=REPO,
      check=False)
  assert refused.returncode == 2 and "not its training targets" in (
      refused.stderr)
  assert not (tmp_path / "b").exists()
