"""`pairs.load_pair`: a shipped pair from its folders, decoding exactly."""
import numpy as np
import pytest

from specdec_jax import checkpoints
from specdec_jax import pairs
from specdec_jax.data import tasks
from specdec_jax.data import vocab as vocab_lib
from specdec_jax.core.models import SharedEncoderModel

from conftest import REPO

PAIR = REPO / "pretrained" / "multi30k"
CAPTIONS = [
    "A man in a blue shirt is riding a bicycle down the street.",
    "Two children are playing in the sand at the beach."
]


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["draft_1m_distill_38m", "shared_encoder_1m"])
def test_a_shipped_pair_loads_and_decodes_exactly(draft):
  pair = pairs.load_pair(str(PAIR / "target_38m"), str(PAIR / draft),
                         str(PAIR / "multi30k.model"))
  assert isinstance(pair.draft,
                    SharedEncoderModel) == (draft == "shared_encoder_1m")
  inputs = pair.encode(CAPTIONS, 32)
  # The run's own encoding of the same texts.
  vocabulary = vocab_lib.SentencePieceFile(str(PAIR / "multi30k.model"))
  expected = tasks.encode_batch(vocabulary, CAPTIONS, 32)
  assert (inputs == expected).all()
  spec = pair.speculative(inputs, gamma=3, max_decode_length=24)
  base = pair.target_alone(inputs, max_decode_length=24)
  assert (spec.tokens == base.tokens).all()  # greedy: the target's tokens
  texts = pair.decode(spec.tokens)
  assert all(t and t[0].isupper() for t in texts), texts
  assert spec.statistics()["tokens_per_target_call"] > 1


def test_a_folder_without_model_config_is_named(tmp_path):
  with pytest.raises(checkpoints.CheckpointError,
                     match="model_config.json not found"):
    checkpoints.load_model(str(tmp_path))


def test_load_model_reads_the_config_the_export_wrote():
  config = checkpoints.model_config(str(PAIR / "target_38m"))
  assert config.vocab_size == 8000
  assert np.dtype(config.dtype) == np.float32
  assert config.num_decoder_layers >= 1
