"""specdec_jax.data.tasks end to end (the rest: tests/harness/test_tasks.py):
importing it loads no TensorFlow (a fresh process), and the registered TFDS
tasks build examples from TFDS's mocked data
(``tfds.testing.mock_data(policy=MockPolicy.USE_CODE)``: random examples
from the dataset classes shipped with TFDS; no downloads).
"""
import subprocess
import sys

import pytest

from specdec_jax.data import tasks
from specdec_jax.data import vocab as vocab_lib

from conftest import REPO
from task_helpers import tiny_spm

# Not test_tasks.py's suffix: a worker may register both modules' tasks,
# each with its own SentencePiece model.
TEST_SUFFIX = "_pytest_e2e_spm"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
  """(task names, vocabulary) on a tiny SentencePiece model."""
  spm_path = tiny_spm(tmp_path_factory.mktemp("spm"))
  return (tasks.register_tasks(spm_path, extra_ids=10, suffix=TEST_SUFFIX),
          vocab_lib.get_vocabulary(spm_path, extra_ids=10))


def test_import_does_not_load_tensorflow():
  code = ("import sys, specdec_jax.data.tasks, specdec_jax.data.vocab, "
          "specdec_jax.metrics.quality; "
          "bad = [m for m in ('tensorflow', 'seqio', 'tensorflow_datasets') "
          "if m in sys.modules]; assert not bad, bad")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.parametrize("index,prefix", [(0, tasks.WMT_ENDE_PREFIX),
                                          (1, tasks.CNN_DM_PREFIX)])
def test_tfds_tasks_end_to_end_with_mock_data(registered, index, prefix):
  import seqio
  import tensorflow_datasets as tfds
  task_names, vocab = registered
  name = task_names[index]
  task = seqio.get_mixture_or_task(name)
  assert task.output_features["inputs"].vocabulary.sentencepiece_model_file \
      == vocab.sentencepiece_model_file
  with tfds.testing.mock_data(num_examples=3,
                              policy=tfds.testing.MockPolicy.USE_CODE):
    ds = task.get_dataset(sequence_length={
        "inputs": 512,
        "targets": 512
    }, split="validation", shuffle=False, try_in_mem_cache=False)
    exs = list(ds.as_numpy_iterator())
    loaded = tasks.load_examples(mixture_or_task_name=name, split="test",
                                 num_examples=2)
  assert len(exs) == 3
  for ex in exs:
    assert ex["inputs"][-1] == 1 and ex["targets"][-1] == 1
    assert 1 not in ex["inputs"][:-1].tolist()
    decoded = vocab.decode(ex["inputs"].tolist())
    assert decoded.startswith(prefix.strip())
    raw = ex["inputs_pretokenized"].decode()
    assert raw.startswith(prefix)
    # The tiny vocab covers the mock alphabet: decoding is lossless up to
    # whitespace normalization.
    assert decoded == " ".join(raw.split())
  assert len(loaded) == 2
  for ex, got in zip(exs, loaded):  # deterministic mock data, same order
    assert set(got) == {"input", "reference"}
    assert got["input"] == ex["inputs_pretokenized"].decode()
    assert got["reference"] == ex["targets_pretokenized"].decode()
    assert got["input"].startswith(prefix)
