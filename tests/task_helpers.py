"""A tiny SentencePiece model for the task tests (tests/harness/test_tasks.py,
tests/e2e/test_tasks_e2e.py), trained in the test on a made-up corpus that
covers every character mocked TFDS text and the task prefixes use."""
import pathlib
import random
import string

from specdec_jax.data import tasks
from specdec_jax.data import vocab as vocab_lib


def _write_corpus(path: pathlib.Path) -> pathlib.Path:
  rng = random.Random(0)
  syllables = ("ka ne ri to mu sa le di pho gra ber ung sch ein der die das "
               "und the and of to in is was house haus").split()
  lines = []
  for _ in range(400):
    words = [
        "".join(rng.choice(syllables)
                for _ in range(rng.randint(1, 3)))
        for _ in range(rng.randint(3, 12))
    ]
    lines.append(" ".join(words))
  # Cover all characters that mocked TFDS text / the task prefixes use.
  lines.append(" ".join(string.ascii_letters + string.digits))
  lines.append(tasks.WMT_ENDE_PREFIX + tasks.CNN_DM_PREFIX)
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


def tiny_spm(folder: pathlib.Path) -> str:
  """The path of a 160-piece T5-style model trained in `folder`."""
  corpus = _write_corpus(folder / "corpus.txt")
  return vocab_lib.train_sentencepiece([corpus], folder / "tiny",
                                       vocab_size=160)
