"""`checkpoints.load_model` on a shipped pair's folders (`pairs.load_pair`
decoding exactly: tests/e2e/test_pairs_e2e.py)."""
import numpy as np
import pytest

from specdec_jax import checkpoints

from conftest import REPO

PAIR = REPO / "pretrained" / "multi30k"


def test_a_folder_without_model_config_is_named(tmp_path):
  with pytest.raises(checkpoints.CheckpointError,
                     match="model_config.json not found"):
    checkpoints.load_model(str(tmp_path))


def test_load_model_reads_the_config_the_export_wrote():
  config = checkpoints.model_config(str(PAIR / "target_38m"))
  assert config.vocab_size == 8000
  assert np.dtype(config.dtype) == np.float32
  assert config.num_decoder_layers >= 1
