"""`pairs.load_pair` and `checkpoints.load_model` on a tiny pair that
`train`'s own functions write (`pair_helpers`; the shipped pair decoding
exactly: tests/e2e/test_pairs_e2e.py): it loads `train`'s MODEL_DIR,
resolves paths as the commands do, and refuses, in one line naming the
argument and the resolved path, what `run` refuses (issue 59, defects 5
and 6, and load_pair's weak spots). The sizes it checks before building
anything: tests/harness/test_model_size_checks.py.
"""
import numpy as np
import pytest

from specdec_jax import checkpoints
from specdec_jax import pairs
from specdec_jax.checkpoints import digests
from specdec_jax.files import io_utils
from specdec_jax.data import vocab as vocab_lib
from specdec_jax.experiment import loading
from specdec_jax.files import compilation_cache

from conftest import REPO
import pair_helpers

PAIR = REPO / "pretrained" / "multi30k"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  return pair_helpers.write_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture
def cache_calls(monkeypatch):
  """The calls `load_pair` makes to turn on the compilation cache (none
  really made: the suite runs with its own cache)."""
  calls = []
  monkeypatch.setattr(compilation_cache, "enable", lambda: calls.append(1))
  return calls


def _load(pair, target=None, draft=None, spm=None, **kwargs):
  return pairs.load_pair(str(target or pair["target"]),
                         str(draft or pair["draft"]), str(spm or pair["spm"]),
                         **kwargs)


def test_a_folder_without_model_config_is_named(tmp_path):
  with pytest.raises(checkpoints.CheckpointError,
                     match="model_config.json not found"):
    checkpoints.load_model(str(tmp_path))


def test_load_model_reads_the_config_the_export_wrote():
  config = checkpoints.model_config(str(PAIR / "target_38m"))
  assert config.vocab_size == 8000
  assert np.dtype(config.dtype) == np.float32
  assert config.num_decoder_layers >= 1


# ---------------------------------------------------------------------------
# Defect 6: train's MODEL_DIR (its own model_config.json beside
# checkpoint_N) stood for no checkpoint: "not a T5X checkpoint".
# ---------------------------------------------------------------------------
def test_load_pair_loads_trains_model_dir(pair, cache_calls):
  assert (pair["target"] / "model_config.json").is_file()  # as train writes
  assert checkpoints.checkpoint_path(str(pair["target"])) == str(
      pair_helpers.step_folder(pair["target"]))
  loaded = _load(pair)
  assert loaded.target.config == pair_helpers.CONFIGS["target"]
  assert loaded.draft.config == pair_helpers.CONFIGS["draft"]
  tokens = loaded.target_alone(loaded.encode(["ka ne ri"], 8),
                               max_decode_length=4).tokens
  assert np.asarray(tokens).shape == (1, 4)
  assert cache_calls == [1]  # the commands' compilation cache, turned on


def test_the_compilation_cache_can_be_left_off(pair, cache_calls):
  _load(pair, compilation_cache=False)
  assert not cache_calls


# ---------------------------------------------------------------------------
# Defect 5: the vocabulary checks `run` applies. A vocabulary of fewer
# pieces decoded garbage; one another checkpoint records, or another of the
# same size, loaded.
# ---------------------------------------------------------------------------
def _foreign_spm(pair, tmp_path):
  """The pair's SentencePiece model with two pieces swapped: its size, other
  ids."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(pair["spm"].read_bytes())
  a, b = proto.pieces[50], proto.pieces[60]
  a.piece, b.piece = b.piece, a.piece
  path = tmp_path / "foreign.model"
  path.write_bytes(proto.SerializeToString())
  return path


def test_a_vocabulary_of_fewer_pieces_is_refused(pair, tmp_path, cache_calls):
  """The 8000-id shipped pair decoded "inen ge Rock." with a 1000-piece
  model; here 100 pieces (padded: 128 rows) against 256 rows."""
  small = vocab_lib.train_sentencepiece([pair["spm"].parent / "corpus.txt"],
                                        tmp_path / "small", vocab_size=100)
  with pytest.raises(loading.ConfigError) as e:
    _load(pair, spm=small)
  message = str(e.value)
  assert message.startswith(f"the vocabulary has 100 ids (spm_model_path="
                            f"{small!r}) but target_folder's "
                            "model_config.json vocab_size = 256, more than 128")
  assert "\n" not in message and not cache_calls


def test_a_vocabulary_of_the_same_size_with_other_ids_is_refused(
    pair, tmp_path):
  foreign = _foreign_spm(pair, tmp_path)
  with pytest.raises(loading.ConfigError) as e:
    _load(pair, spm=foreign)
  message = str(e.value)
  assert message.startswith(f"spm_model_path: the vocabulary '{foreign}'")
  assert "target_folder's checkpoint" in message
  assert "'tiny.model', sha256" in message  # what DIGESTS.json records


def test_a_draft_recording_another_vocabulary_is_refused(pair, tmp_path):
  draft = pair_helpers.edited_copy(pair["draft"], tmp_path / "draft")
  digests.write_manifest(str(pair_helpers.step_folder(draft)),
                         str(_foreign_spm(pair, tmp_path)))
  with pytest.raises(loading.ConfigError) as e:
    _load(pair, draft=draft)
  message = str(e.value)
  assert message.startswith(f"spm_model_path: the vocabulary "
                            f"'{pair['spm']}'")
  assert "draft_folder's checkpoint" in message
  assert "'foreign.model', sha256" in message


# ---------------------------------------------------------------------------
# load_pair's weak spots: each one line naming the argument (or file and
# field), the resolved path and what is allowed.
# ---------------------------------------------------------------------------
def test_a_file_given_as_the_folder_is_named(pair):
  with pytest.raises(checkpoints.CheckpointError) as e:  # NotADirectoryError
    _load(pair, target=pair["spm"])
  assert str(e.value).startswith(f"target_folder='{pair['spm']}': "
                                 f"{pair['spm']} is a file, not a folder; "
                                 "allowed: a checkpoint folder")


def test_a_file_that_is_no_sentencepiece_model_is_named(pair):
  text = pair["spm"].parent / "corpus.txt"
  with pytest.raises(ValueError) as e:  # RuntimeError "INTERNAL: ...cc(109)"
    _load(pair, spm=text)
  message = str(e.value)
  assert message.startswith(f"spm_model_path={str(text)!r} is not a "
                            "SentencePiece model")
  assert "INTERNAL" not in message and ".cc(" not in message


def test_mlp_activations_as_a_string_is_named(pair, tmp_path):
  """A string is a sequence: 'gelu' was read as activations 'g', 'e', ...,
  and flax said it has no attribute 'g'."""
  draft = pair_helpers.edited_copy(pair["draft"], tmp_path / "draft",
                                   mlp_activations="gelu")
  config_file = pair_helpers.step_folder(draft) / "model_config.json"
  with pytest.raises(checkpoints.CheckpointError) as e:
    _load(pair, draft=draft)
  assert str(e.value).startswith(
      f"{config_file}: mlp_activations = 'gelu': allowed: a non-empty list "
      "of activation names, each one of linear, ")


def test_relative_paths_resolve_as_the_commands_resolve_them(
    pair, tmp_path, monkeypatch, cache_calls):
  """From here, else from the repository (`io_utils.resolve_path`): the
  repository is the pair's folder here, the current folder another."""
  monkeypatch.setattr(io_utils, "REPO_DIR", pair["spm"].parent)
  monkeypatch.chdir(tmp_path)
  loaded = pairs.load_pair("target", "draft", "tiny.model")
  assert loaded.vocabulary.sentencepiece_model_file == str(pair["spm"])
  # An error shows the path looked at, not the one given.
  with pytest.raises(checkpoints.CheckpointError) as e:
    pairs.load_pair("nowhere", "draft", "tiny.model")
  assert f"target_folder='nowhere': {tmp_path / 'nowhere'} does not exist" in (
      str(e.value))
