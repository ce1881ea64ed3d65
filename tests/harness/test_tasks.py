"""Tests for specdec_jax.data.vocab and specdec_jax.data.tasks (offline).

A tiny SentencePiece model is trained in the test (`task_helpers`); the
seqio tasks read local files. The TFDS tasks on mocked data, and the
import without TensorFlow in a fresh process: tests/e2e/test_tasks_e2e.py.
"""
import os
import random

import numpy as np
import pytest

from specdec_jax.data import tasks
from specdec_jax.data import vocab as vocab_lib

from task_helpers import tiny_spm

TEST_SUFFIX = "_pytest_tiny_spm"


@pytest.fixture(scope="module")
def spm_path(tmp_path_factory):
  return tiny_spm(tmp_path_factory.mktemp("spm"))


@pytest.fixture(scope="module")
def vocab(spm_path):
  return vocab_lib.get_vocabulary(spm_path, extra_ids=10)


@pytest.fixture(scope="module")
def task_names(spm_path):
  return tasks.register_tasks(spm_path, extra_ids=10, suffix=TEST_SUFFIX)


# ----------------------------------------------------------------------------
# Vocabulary.
# ----------------------------------------------------------------------------


def test_train_sentencepiece_uses_t5_ids(spm_path):
  import sentencepiece as spm
  assert spm_path.endswith("tiny.model") and os.path.isfile(spm_path)
  assert os.path.isfile(spm_path[:-len(".model")] + ".vocab")
  # Atomic write: the temporary training directory is gone.
  assert sorted(os.listdir(
      os.path.dirname(spm_path))) == ["corpus.txt", "tiny.model", "tiny.vocab"]
  sp = spm.SentencePieceProcessor(model_file=spm_path)
  assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
  assert sp.get_piece_size() == 160
  assert sp.id_to_piece(1) == "</s>"


def test_seqio_vocabulary_ids(vocab, spm_path):
  vocab_lib.check_t5_vocabulary(vocab)
  vocab_lib.check_t5_vocabulary(spm_path)
  assert vocab.eos_id == 1 and vocab.unk_id == 2 and vocab.pad_id == 0
  assert vocab.vocab_size == 160 + 10


def test_check_t5_vocabulary_rejects_default_spm_ids(tmp_path, spm_path):
  import sentencepiece as spm
  corpus = os.path.join(os.path.dirname(spm_path), "corpus.txt")
  prefix = str(tmp_path / "default_ids")
  spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix,
                                 vocab_size=160, minloglevel=2)
  bad = vocab_lib.get_vocabulary(prefix + ".model", extra_ids=0)
  with pytest.raises(ValueError, match=r"pad_id=-1, eos_id=2, unk_id=0"):
    vocab_lib.check_t5_vocabulary(bad)
  with pytest.raises(ValueError, match="does not follow T5 conventions"):
    vocab_lib.check_t5_vocabulary(prefix + ".model")


def test_train_sentencepiece_validates_inputs(tmp_path):
  with pytest.raises(ValueError, match="not found"):
    vocab_lib.train_sentencepiece(tmp_path / "nope.txt", tmp_path / "m", 100)
  (tmp_path / "c.txt").write_text("a b c\n")
  with pytest.raises(ValueError, match="pad_id"):
    vocab_lib.train_sentencepiece(tmp_path / "c.txt", tmp_path / "m", 100,
                                  pad_id=3)


def test_load_vocabulary_reads_now_and_names_a_bad_file(tmp_path, spm_path):
  vocab = vocab_lib.load_vocabulary(spm_path, extra_ids=10)
  assert vocab.vocab_size == 170
  not_a_model = tmp_path / "notes.model"
  not_a_model.write_text("hello, I am text\n")
  with pytest.raises(ValueError) as e:
    vocab_lib.load_vocabulary(str(not_a_model), extra_ids=0)
  message = str(e.value)
  assert f"SPM_MODEL_PATH={str(not_a_model)!r}" in message
  assert "is not a SentencePiece model" in message
  assert "Traceback" not in message


def test_sentencepiece_file_reads_as_seqio_does_without_tensorflow(spm_path):
  """A local model without extra ids is read without seqio (no TensorFlow
  at a run's start), and encodes and decodes exactly as seqio's does."""
  ours = vocab_lib.load_vocabulary(spm_path, extra_ids=0)
  assert isinstance(ours, vocab_lib.SentencePieceFile)
  theirs = vocab_lib.get_vocabulary(spm_path, extra_ids=0)
  assert (ours.vocab_size, ours.eos_id, ours.unk_id,
          ours.pad_id) == (theirs.vocab_size, theirs.eos_id, theirs.unk_id,
                           theirs.pad_id)
  texts = ["the house and das haus", "Gräber ung sch!", "", "  x  y ", "€ ∞"]
  for text in texts:
    assert ours.encode(text) == theirs.encode(text), text
  rng = random.Random(1)
  id_lists = [[
      rng.randrange(0, ours.vocab_size + 20) for _ in range(rng.randint(0, 12))
  ] for _ in range(200)] + [[5, 6, 1, 7, 8], [0, 0, 1], [1], []]
  for ids in id_lists:  # ids beyond the model, EOS inside, padding
    assert ours.decode(ids) == theirs.decode(ids), ids
  # The seqio vocabulary is still what a model with extra ids gets.
  assert not isinstance(vocab_lib.load_vocabulary(spm_path, extra_ids=10),
                        vocab_lib.SentencePieceFile)


def test_default_vocabulary_is_lazy():
  v = vocab_lib.get_vocabulary()
  assert v.sentencepiece_model_file == vocab_lib.DEFAULT_SPM_PATH
  assert v.extra_ids == 100
  assert v._model is None  # pylint: disable=protected-access


# ----------------------------------------------------------------------------
# encode_batch / decode_tokens.
# ----------------------------------------------------------------------------


def test_encode_batch_eos_truncation_padding(vocab):
  texts = ["ka ne ri", "the house and the haus " * 5, "x"]
  full = [vocab.encode(t) for t in texts]
  out = tasks.encode_batch(vocab, texts, max_length=12)
  assert out.shape == (3, 12) and out.dtype == np.int32
  for row, ids in zip(out, full):
    n = min(len(ids), 11)
    np.testing.assert_array_equal(row[:n], ids[:n])
    assert row[n] == 1  # EOS last
    assert (row[n + 1:] == 0).all()  # padding
  assert len(full[1]) > 11 and out[1, -1] == 1  # truncated, EOS kept
  with pytest.raises(ValueError):
    tasks.encode_batch(vocab, texts, max_length=0)
  # Full lengths (EOS included) tell which rows were truncated.
  same, lengths = tasks.encode_batch(vocab, texts, 12, return_lengths=True)
  np.testing.assert_array_equal(same, out)
  assert lengths.tolist() == [len(ids) + 1 for ids in full]
  assert (lengths > 12).tolist() == [False, True, False]


def test_decode_tokens_stops_at_eos_and_ignores_pad(vocab):
  texts = ["ka ne ri", "the house"]
  enc = tasks.encode_batch(vocab, texts, max_length=16)
  assert tasks.decode_tokens(vocab, enc) == texts
  junk = enc.copy()
  junk[0, len(vocab.encode(texts[0])) + 1:] = vocab.encode("was")[0]
  # Leading pad (decoder start) is ignored too.
  shifted = np.concatenate([np.zeros((2, 1), np.int32), junk], axis=1)
  assert tasks.decode_tokens(vocab, shifted) == texts
  with pytest.raises(ValueError, match="2-D"):
    tasks.decode_tokens(vocab, enc[0])


# ----------------------------------------------------------------------------
# Local files.
# ----------------------------------------------------------------------------


def _write(path, text):
  path.write_text(text, encoding="utf-8")
  return str(path)


def test_read_parallel_text_files_and_tsv(tmp_path):
  en = _write(tmp_path / "x.en", "Hello world.\nGood morning.\n")
  de = _write(tmp_path / "x.de", "Hallo Welt.\r\nGuten Morgen.")
  pairs = tasks.read_parallel_text(en, de)
  assert pairs == [("Hello world.", "Hallo Welt."),
                   ("Good morning.", "Guten Morgen.")]
  tsv = _write(tmp_path / "x.tsv", "Hello world.\tHallo Welt.\n"
               "Good morning.\tGuten Morgen.\n")
  assert tasks.read_parallel_text(tsv) == pairs


def test_a_file_of_inputs_alone_has_no_references(tmp_path):
  """SOURCE_FILE without REFERENCE_FILE: a file with no tab on any line is
  inputs alone (T5X's infer decodes such files); a TSV's lines all hold
  one tab; a mix is named at its first line of the other kind."""
  plain = _write(tmp_path / "x.en", "A dog runs.\nTwo men play.\n")
  assert tasks.load_examples(source_file=plain, input_prefix="p: ") == [{
      "input": "p: A dog runs.",
      "reference": None
  }, {
      "input": "p: Two men play.",
      "reference": None
  }]
  assert tasks.read_inputs_and_references(plain, max_lines=1) == [
      ("A dog runs.", None)
  ]
  with pytest.raises(ValueError, match=r"x\.en:2: empty source"):
    tasks.load_examples(source_file=_write(tmp_path / "x.en", "a\n \n"))
  with pytest.raises(
      ValueError, match=r"m\.tsv:2: expected exactly 2 .* got "
      r"1 \(a file of inputs alone has no tab on any line\)"):
    tasks.load_examples(source_file=_write(tmp_path / "m.tsv", "a\tb\nc\n"))
  # Training needs references: its reader still wants pairs.
  with pytest.raises(ValueError, match=r"x\.en:1: expected exactly 2"):
    tasks.read_parallel_text(_write(tmp_path / "x.en", "a\n"))


@pytest.mark.parametrize("files,pattern", [
    ({
        "a.en": "a\nb\nc\n",
        "a.de": "x\ny\n"
    }, r"a\.en has 3 lines but .*a\.de has 2 lines .*a\.en:3"),
    ({
        "a.en": "a\n\nc\n",
        "a.de": "x\ny\nz\n"
    }, r"a\.en:2: empty source"),
    ({
        "a.en": "a\nb\nc\n",
        "a.de": "x\ny\n  \n"
    }, r"a\.de:3: empty reference"),
    ({
        "a.en": "",
        "a.de": ""
    }, r"a\.en is empty"),
    ({
        "a.tsv": "a\tx\nb\ty\tz\n"
    }, r"a\.tsv:2: expected exactly 2 .* got 3"),
    ({
        "a.tsv": "a\tx\nb\n"
    }, r"a\.tsv:2: expected exactly 2 .* got 1"),
    ({
        "a.tsv": "a\tx\n\t y\n"
    }, r"a\.tsv:2: empty source"),
    ({
        "a.tsv": "a\t\n"
    }, r"a\.tsv:1: empty reference"),
    ({
        "a.en": "a\n"
    }, r"Reference file not found: .*a\.de"),
    ({}, r"(TSV|Source) file not found: .*a\.tsv"),
])
def test_read_parallel_text_errors(tmp_path, files, pattern):
  for name, text in files.items():
    _write(tmp_path / name, text)
  if "a.tsv" in files or not files:
    args = (str(tmp_path / "a.tsv"),)
  else:
    args = (str(tmp_path / "a.en"), str(tmp_path / "a.de"))
  with pytest.raises(ValueError, match=pattern):
    tasks.read_parallel_text(*args)
  with pytest.raises(ValueError, match=pattern):
    tasks.load_examples(source_file=args[0],
                        reference_file=args[1] if len(args) > 1 else None)


def test_load_examples_from_local_files(tmp_path):
  en = _write(tmp_path / "x.en", "one\ntwo\nthree\n")
  de = _write(tmp_path / "x.de", "eins\nzwei\ndrei\n")
  got = tasks.load_examples(source_file=en, reference_file=de,
                            input_prefix=tasks.WMT_ENDE_PREFIX, num_examples=2)
  assert got == [
      {
          "input": "translate English to German: one",
          "reference": "eins"
      },
      {
          "input": "translate English to German: two",
          "reference": "zwei"
      },
  ]
  tsv = _write(tmp_path / "x.tsv", "an article\ta summary\n")
  assert tasks.load_examples(source_file=tsv) == [{
      "input": "an article",
      "reference": "a summary"
  }]


def test_load_examples_argument_validation(tmp_path):
  with pytest.raises(ValueError, match="exactly one of"):
    tasks.load_examples()
  with pytest.raises(ValueError, match="exactly one of"):
    tasks.load_examples(mixture_or_task_name="x", source_file="y")


# ----------------------------------------------------------------------------
# seqio tasks (mocked TFDS).
# ----------------------------------------------------------------------------


def test_default_tasks_registered_without_touching_vocab():
  import seqio
  names = tasks.register_default_tasks()
  assert names == [tasks.WMT_ENDE_TASK, tasks.CNN_DM_TASK]
  for name in names:
    task = seqio.get_mixture_or_task(name)
    v = task.output_features["targets"].vocabulary
    assert v.sentencepiece_model_file == vocab_lib.DEFAULT_SPM_PATH
    assert v._model is None  # pylint: disable=protected-access
  assert tasks.get_task_kind(tasks.WMT_ENDE_TASK) == "translation"
  assert tasks.get_task_kind(tasks.CNN_DM_TASK) == "summarization"
  src = seqio.get_mixture_or_task(tasks.WMT_ENDE_TASK).source
  assert src.tfds_dataset.name == "wmt_t2t_translate/de-en:1.0.0"
  src = seqio.get_mixture_or_task(tasks.CNN_DM_TASK).source
  assert src.tfds_dataset.name == "cnn_dailymail:3.4.0"


def test_unprepared_tfds_data_is_named_not_downloaded(tmp_path, spm_path):
  """A task whose TFDS data is not prepared: one error naming the task, the
  folder and how to prepare it; nothing downloaded (it had started to
  generate WMT inside the run and died on a missing module)."""
  names = tasks.register_tasks(spm_path, extra_ids=10, suffix="_unprepared",
                               tfds_data_dir=str(tmp_path))
  for name in names:
    with pytest.raises(
        ValueError, match=rf"Task '{name}': Dataset \w+: could not find data "
        rf"in {tmp_path}\..* A run does not download or prepare TFDS data: "
        r"prepare it once first \(docs/usage/reproduce_table2\.md"):
      tasks.load_examples(mixture_or_task_name=name, num_examples=2)
  assert not list(tmp_path.iterdir())


def test_register_tasks_is_idempotent(task_names, spm_path):
  assert tasks.register_tasks(spm_path, extra_ids=10,
                              suffix=TEST_SUFFIX) == task_names
  with pytest.raises(ValueError, match="different configuration"):
    tasks.register_tasks(spm_path, extra_ids=0, suffix=TEST_SUFFIX)


def test_local_task_end_to_end(tmp_path, spm_path, vocab):
  import seqio
  en = _write(tmp_path / "x.en", "the house\nka ne ri\n")
  de = _write(tmp_path / "x.de", "das haus\nmu sa le\n")
  name = tasks.register_local_task("specdec_local" + TEST_SUFFIX, en, de,
                                   spm_model_path=spm_path, extra_ids=10)
  assert tasks.get_task_kind(name) == "translation"
  ds = seqio.get_mixture_or_task(name).get_dataset(sequence_length=None,
                                                   split="validation",
                                                   shuffle=False)
  exs = list(ds.as_numpy_iterator())
  assert [vocab.decode(e["inputs"].tolist()) for e in exs] == [
      "translate English to German: the house",
      "translate English to German: ka ne ri"
  ]
  assert [e["targets"][-1] for e in exs] == [1, 1]
  assert tasks.load_examples(mixture_or_task_name=name) == [{
      "input": "translate English to German: the house",
      "reference": "das haus"
  }, {
      "input": "translate English to German: ka ne ri",
      "reference": "mu sa le"
  }]
  with pytest.raises(ValueError, match=r"x\.en:2: empty source"):
    tasks.register_local_task("specdec_bad" + TEST_SUFFIX,
                              _write(tmp_path / "x.en", "a\n\n"), de,
                              spm_model_path=spm_path)
