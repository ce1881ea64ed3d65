"""A tiny (target, draft) pair written as `train` writes its MODEL_DIR
(`training.checkpointing`: the folder's own model_config.json beside
checkpoint_5/, whose DIGESTS.json records the vocabulary), with a
160-piece SentencePiece model: what tests/harness/test_pairs.py and
test_model_size_checks.py load and break instead of the shipped 38M pair."""
import json
import pathlib
import shutil
from typing import Dict

import jax

from conftest import tiny_config
from specdec_jax.checkpoints import digests
from specdec_jax.core.models import init_params
from specdec_jax.training import checkpointing
from task_helpers import tiny_spm

STEP = 5
# 160 pieces padded to 256 rows (T5X's rule, `loading.vocabulary_fits`).
VOCAB_SIZE = 256
CONFIGS = {
    "target": tiny_config(vocab_size=VOCAB_SIZE),
    "draft": tiny_config(vocab_size=VOCAB_SIZE, num_encoder_layers=1,
                         num_decoder_layers=1),
}


def write_pair(root: pathlib.Path) -> Dict[str, pathlib.Path]:
  """{'target', 'draft': the MODEL_DIRs, 'spm': the vocabulary} in `root`."""
  root.mkdir(parents=True, exist_ok=True)
  spm = tiny_spm(root)
  out = {"spm": pathlib.Path(spm)}
  for role, config in CONFIGS.items():
    model_dir = root / role
    params = init_params(config, jax.random.PRNGKey(0))["params"]
    checkpointing.write_model_config(str(model_dir), config)
    checkpointing.save_checkpoint(str(model_dir), STEP, params, {}, config,
                                  vocabulary_file=spm)
    out[role] = model_dir
  return out


def step_folder(model_dir: pathlib.Path) -> pathlib.Path:
  return model_dir / f"checkpoint_{STEP}"


def edited_copy(model_dir: pathlib.Path, dst: pathlib.Path,
                keep_digests: bool = True, **changes) -> pathlib.Path:
  """A copy of `model_dir` whose checkpoint's model_config.json has
  `changes` (its DIGESTS.json kept, so the edit is a mismatch, or
  removed: the config is all there is to go by)."""
  shutil.copytree(model_dir, dst)
  config_file = step_folder(dst) / checkpointing.MODEL_CONFIG_FILE
  fields = json.loads(config_file.read_text())
  fields.update(changes)
  config_file.write_text(json.dumps(fields))
  if not keep_digests:
    (step_folder(dst) / digests.MANIFEST_FILE).unlink()
  return dst
