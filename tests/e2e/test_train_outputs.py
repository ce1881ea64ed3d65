"""Issue 44: what `train` leaves beside its checkpoints lets `run` use them
with no hand-written gin and no "unverified" warning: DIGESTS.json (every
file and the vocabulary) in each checkpoint, as_target.gin / as_draft.gin
in the model folder; and its first step (the compile) is a progress line.

One tiny_ci model, 2 steps, on Multi30k from ../shared (skipped without).
"""
import json
import logging

import gin
import pytest

from conftest import MULTI30K
from conftest import require_shared
from conftest import tiny_config
from specdec_jax.config import flag_utils
from specdec_jax import checkpoints
from specdec_jax.config import gin_utils
from specdec_jax.multihost import partitioning
from specdec_jax import run as run_lib
from specdec_jax import train as train_lib
from specdec_jax.checkpoints import digests
from specdec_jax.experiment import loading
from specdec_jax.training import checkpointing

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(model_dir, spm path, the training's log lines)."""
  require_shared(MULTI30K / "train.en")
  root = tmp_path_factory.mktemp("train_outputs")
  model_dir, spm = root / "tiny_target", root / "spm" / "tiny.model"
  records = []
  handler = logging.Handler()
  handler.emit = records.append
  logging.getLogger().addHandler(handler)
  level = logging.getLogger().level
  logging.getLogger().setLevel(logging.INFO)
  gin.clear_config()
  try:
    train_lib.parse_gin(["train/tiny_ci.gin"], [
        f"MULTI30K_DIR = '{MULTI30K}'", f"SPM_MODEL_PATH = '{spm}'",
        f"MODEL_DIR = '{model_dir}'", "NUM_STEPS = 2",
        "train.eval_num_examples = 0"
    ])
    train_lib.train()
  finally:
    gin.clear_config()
    logging.getLogger().removeHandler(handler)
    logging.getLogger().setLevel(level)
  return model_dir, spm, [r.getMessage() for r in records]


def test_each_checkpoint_has_digests_with_its_vocabulary(trained):
  model_dir, spm, _ = trained
  ckpt = checkpoints.latest_checkpoint(str(model_dir))
  assert digests.verify_manifest(ckpt)  # every file listed, all match
  manifest = json.loads((model_dir / ckpt / digests.MANIFEST_FILE).read_text())
  assert {"train_state.msgpack", "model_config.json"} <= set(manifest["files"])
  assert digests.vocabulary_record(ckpt)["sha256"] == digests.digest(
      spm.read_bytes())


def test_the_first_step_is_a_progress_line_with_its_seconds(trained):
  lines = trained[2]
  start = "step 1/2: compiling the train step"
  assert any(l.startswith(start) and ": done in " not in l for l in lines)
  assert any(l.startswith(start) and ": done in " in l for l in lines)
  assert any(l.startswith("Setting up ") and ": done in " in l for l in lines)


def test_run_gin_files_bind_the_model_by_role(trained):
  model_dir, spm, _ = trained
  text = (model_dir / checkpointing.RUN_GIN_FILES["draft"]).read_text()
  assert "draft/T5Config.emb_dim = 64\n" in text
  assert "draft/T5Config.mlp_activations = ('gelu', 'linear')\n" in text
  assert f"DRAFT_CHECKPOINT_PATH = '{model_dir}'" in text
  assert "DRAFT_NAME = 'tiny_target'\n" in text
  assert f"SPM_MODEL_PATH = '{spm}'\n" in text
  assert "target/T5Config" not in text and "TARGET_" not in text


@pytest.mark.usefixtures("clean_gin")
def test_run_decodes_with_them_verified_and_named(trained, tmp_path, caplog):
  """An experiment file, then the trained model's gin files as target and
  draft: it runs, reads verified checkpoints (no "unverified" warning)
  and names the models after their folder."""
  model_dir, _, _ = trained
  caplog.set_level("INFO")
  gin_utils.parse_gin([
      "pretrained_multi30k.gin",
      str(model_dir / "as_target.gin"),
      str(model_dir / "as_draft.gin")
  ], [
      f"OUTPUT_DIR = '{tmp_path}'", "NUM_EXAMPLES = 2", "MODE = 'infer'",
      "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}"
  ], finalize=False, check_macros=True)
  record = run_lib.run()
  assert record["target_model"] == "tiny_target"
  assert record["draft_model"].startswith("tiny_target")
  assert record["num_examples"] == 2
  text = caplog.text
  assert "unverified" not in text and "records no vocabulary digest" not in text
  assert text.count("Read checkpoint ") == 2


def test_a_missing_model_under_outputs_points_to_the_shipped_pairs(
    tmp_path, monkeypatch):
  """multi30k_1m.gin & co. read models trained here (outputs/...): when
  they are missing, the error names the shipped pairs."""
  monkeypatch.chdir(tmp_path)
  with pytest.raises(flag_utils.ConfigError,
                     match=r"does not exist .*pretrained_multi30k\.gin"):
    loading.vocabulary("outputs/no_such/spm.model", 0)
  with pytest.raises(
      checkpoints.CheckpointError,
      match=(r"TARGET_CHECKPOINT_PATH='outputs/no_such': .* does "
             r"not exist .*multi30k_38m_1m\.gin")):
    loading.load_model(tiny_config(), "outputs/no_such", 0,
                       partitioning.make_mesh(1, 1), "target")
  assert loading.trained_here_hint("pretrained/multi30k/target_38m") == ""
