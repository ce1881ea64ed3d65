"""The shipped pair end to end: `pairs.load_pair` loads it from its folders
and decodes exactly (its other tests: tests/harness/test_pairs.py), and
`python -m tools.benchmarks.compare_with_t5x --pair=pretrained` decodes it with T5X too
(needs a T5X checkout, not a dependency, at $T5X_PATH or /tmp/t5x; skips
without one; its flags: tests/harness/test_compare_with_t5x.py).
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from specdec_jax import pairs
from specdec_jax.core.models import SharedEncoderModel
from specdec_jax.data import tasks
from specdec_jax.data import vocab as vocab_lib

from conftest import REPO

PAIR = REPO / "pretrained" / "multi30k"
SCRIPT = REPO / "scripts" / "compare_with_t5x.py"
T5X_PATH = pathlib.Path(os.environ.get("T5X_PATH", "/tmp/t5x"))

pytestmark = pytest.mark.slow

CAPTIONS = [
    "A man in a blue shirt is riding a bicycle down the street.",
    "Two children are playing in the sand at the beach."
]


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


def test_pretrained_pair_against_t5x(tmp_path):
  if not (T5X_PATH / "t5x" / "decoding.py").is_file():
    pytest.skip(f"no T5X checkout at {T5X_PATH} (set T5X_PATH): T5X is not "
                "a dependency of this project.")
  output = tmp_path / "t5x_pair.json"
  env = dict(
      os.environ,
      PYTHONPATH=os.pathsep.join([str(REPO),
                                  os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run([
      sys.executable,
      str(SCRIPT), f"--t5x_path={T5X_PATH}", "--pair=pretrained",
      "--num_examples=2", "--gammas=2", "--max_decode_length=8", "--repeats=1",
      f"--output={output}"
  ], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  pair = json.loads(output.read_text())["pair"]
  assert pair["all_identical"] and pair["params_tree_matches_t5x_init"]
  assert pair["identical_to_baseline"] == {"t5x": 2, "speculative_gamma2": 2}
  assert set(pair["ratio_median"]) == {
      "t5x_over_baseline", "t5x_over_speculative_gamma2",
      "baseline_over_speculative_gamma2"
  }
