"""specdec_jax.train without training: the gin files, relative paths, the
learning-rate schedules, the batches and the command line's checks (train ->
save -> load -> speculative decoding: tests/e2e/test_train_e2e.py).
"""
import pathlib

import gin
import numpy as np
import pytest

from specdec_jax import train as train_lib
from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils
from specdec_jax.files import io_utils
from specdec_jax.core.models import T5Config
from specdec_jax.training import config
from specdec_jax.training import data as data_lib


# ---------------------------------------------------------------------------
# gin files and the command line (no training).
# ---------------------------------------------------------------------------
def test_model_gin_files_sizes():
  sizes = {}
  for name in ("multi30k_target", "multi30k_draft_4m", "multi30k_draft_1m"):
    config = gin_reader.read_t5_config(f"models/{name}.gin")
    assert config.vocab_size == 8000
    assert config.mlp_activations == ("gelu", "linear")
    assert not config.logits_via_embedding
    sizes[name] = config.num_params
  assert 10e6 <= sizes["multi30k_target"] <= 20e6
  assert 3e6 <= sizes["multi30k_draft_4m"] <= 5e6
  assert 0.8e6 <= sizes["multi30k_draft_1m"] <= 1.2e6


@pytest.mark.parametrize("name, model", [
    ("multi30k_target", "multi30k_target"),
    ("multi30k_draft_1m", "multi30k_draft_1m"),
    ("multi30k_draft_4m", "multi30k_draft_4m"),
    ("multi30k_draft_4m_distill", "multi30k_draft_4m"),
])
def test_train_gin_files_parse(name, model):
  gin.clear_config()
  try:
    train_lib.parse_gin([f"train/{name}.gin"], [])
    assert T5Config() == gin_reader.read_t5_config(f"models/{model}.gin")
    assert gin.query_parameter("%MODEL_DIR") == (
        f"outputs/multi30k/{name[len('multi30k_'):]}")
    assert gin.query_parameter("%SPM_MODEL_PATH") == (
        "outputs/multi30k/spm/multi30k.model")
    assert gin.query_parameter("%MULTI30K_DIR") == "../shared/data/multi30k"
    assert gin.query_parameter("%NUM_STEPS") > 0
    if name.endswith("distill"):
      teacher = gin_reader.read_t5_config(
          gin.query_parameter("train.teacher_model_gin"))
      assert teacher == gin_reader.read_t5_config("models/multi30k_target.gin")
      assert gin.query_parameter("%TEACHER_DIR") == "outputs/multi30k/target"
  finally:
    gin.clear_config()


@pytest.mark.parametrize("size", ["1m", "4m"])
def test_shared_encoder_gin_files(size):
  """The shared-encoder drafts: the standalone drafts' decoders, no encoder,
  reading the 38M target's width; distilled from the shipped target; the
  run's draft/ file binds the same config."""
  name = f"multi30k_shared_encoder_{size}"
  config = gin_reader.read_t5_config(f"models/{name}.gin")
  standalone = gin_reader.read_t5_config(f"models/multi30k_draft_{size}.gin")
  teacher = gin_reader.read_t5_config("models/multi30k_target_38m.gin")
  assert config == standalone.replace(num_encoder_layers=0,
                                      encoder_width=teacher.emb_dim)
  assert gin_reader.read_t5_config(f"models/draft/{name}.gin",
                                   scope="draft") == config
  gin.clear_config()
  try:
    train_lib.parse_gin([f"train/{name}.gin"], [])
    assert T5Config() == config
    assert gin.query_parameter("%MODEL_DIR") == f"outputs/multi30k/{name[9:]}"
    assert gin.query_parameter("%TEACHER_DIR") == (
        "pretrained/multi30k/target_38m")
    assert gin_reader.read_t5_config(
        gin.query_parameter("train.teacher_model_gin")) == teacher
    assert gin.query_parameter("train.distill_weight") == 1.0
    assert gin.query_parameter("train.train_vocab") is False
    # The standalone draft's steps and schedule.
    gin.clear_config()
    train_lib.parse_gin([f"train/multi30k_draft_{size}.gin"], [])
    steps = gin.query_parameter("%NUM_STEPS")
    rate = gin.query_parameter("train.learning_rate")
    gin.clear_config()
    train_lib.parse_gin([f"train/{name}.gin"], [])
    assert gin.query_parameter("%NUM_STEPS") == steps
    assert gin.query_parameter("train.learning_rate") == rate
  finally:
    gin.clear_config()


def test_relative_paths_cwd_then_repository(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "here").mkdir()
  assert io_utils.resolve_path("here") == str(tmp_path / "here")
  # What exists only in the repository is read from it...
  assert io_utils.resolve_path("configs/data/captions_en_de.tsv") == str(
      io_utils.REPO_DIR / "configs" / "data" / "captions_en_de.tsv")
  # ...and what exists nowhere is created here, never in the checkout
  # (issue 44: MODEL_DIR='outputs/...' wrote into it).
  assert io_utils.resolve_path("outputs/nowhere_x") == str(
      tmp_path / "outputs" / "nowhere_x")
  assert io_utils.resolve_path("../shared/data/multi30k") == str(
      io_utils.REPO_DIR.parent / "shared" / "data" / "multi30k")
  assert io_utils.resolve_path("/abs/x") == "/abs/x"


def test_gin_search_path_and_flag_rewrite():
  assert io_utils.GIN_DIR == pathlib.Path(train_lib.__file__).parents[1] / "gin"
  assert (io_utils.GIN_DIR / "train" / "tiny_ci.gin").is_file()
  assert gin_utils.rewrite_gin_args([
      "prog", "--gin.NUM_STEPS=5", "--gin_file=x.gin"
  ]) == ["prog", "--gin_bindings=NUM_STEPS=5", "--gin_file=x.gin"]
  with pytest.raises(ValueError, match="nope.gin.*not found"):
    train_lib.parse_gin(["train/nope.gin"], [])


# ---------------------------------------------------------------------------
# Pieces (no model).
# ---------------------------------------------------------------------------
def test_schedules():
  cos = config.make_schedule(learning_rate=1.0, warmup_steps=10, decay="cosine",
                             decay_steps=110, final_learning_rate_fraction=0.1)
  np.testing.assert_allclose(
      [float(cos(s)) for s in (0, 4, 9, 10, 60, 110, 200)],
      [0.1, 0.5, 1.0, 1.0, 0.55, 0.1, 0.1], rtol=1e-5)
  rsqrt = config.make_schedule(learning_rate=1.0, warmup_steps=100,
                               decay="rsqrt", decay_steps=0)
  np.testing.assert_allclose([float(rsqrt(s)) for s in (49, 99, 399)],
                             [0.5, 1.0, 0.5], rtol=1e-5)
  with pytest.raises(ValueError, match="Unknown decay"):
    config.make_schedule(learning_rate=1.0, warmup_steps=1, decay="step",
                         decay_steps=1)


class _CharVocab:
  """encode/eos_id like a SentencePiece model: one id per character."""

  def eos_id(self):
    return 1

  def encode(self, text):
    return [3 + ord(c) % 50 for c in text]


def test_batches_deterministic_disjoint_and_shifted():
  rng = np.random.default_rng(0)
  pairs = [(f"{i:03d}" + "x" * int(rng.integers(0, 27)),
            "y" * int(rng.integers(1, 30))) for i in range(203)]
  kwargs = dict(input_prefix="> ", max_input_length=24, max_target_length=20,
                batch_size=10, seed=3, length_bucket=8)
  padding = {}
  for window in (0, 5):
    data = data_lib.ParallelData(_CharVocab(), pairs, sort_window=window,
                                 **kwargs)
    again = data_lib.ParallelData(_CharVocab(), pairs, sort_window=window,
                                  **kwargs)
    assert data.steps_per_epoch == 20
    seen, real, total = set(), 0, 0
    for step in range(data.steps_per_epoch):
      b = data.batch(step)
      for k, v in again.batch(step).items():
        np.testing.assert_array_equal(b[k], v)
      enc, dec_in = b["encoder_input_tokens"], b["decoder_input_tokens"]
      tgt = b["decoder_target_tokens"]
      assert enc.shape[1] % 8 == 0 or enc.shape[1] == 24
      assert tgt.shape[1] % 8 == 0 or tgt.shape[1] == 20
      assert (dec_in[:, 0] == 0).all()
      np.testing.assert_array_equal(dec_in[:, 1:], tgt[:, :-1])
      assert ((tgt == 1).sum(1) == 1).all()  # One EOS per row, kept.
      rows = {(tuple(r[r > 0]), tuple(t[t > 0])) for r, t in zip(enc, tgt)}
      assert not rows & seen
      seen |= rows
      real += (enc > 0).sum() + (tgt > 0).sum()
      total += enc.size + tgt.size
    padding[window] = 1 - real / total
    # The next epoch is a different order.
    assert not np.array_equal(
        data.batch(20)["decoder_target_tokens"],
        data.batch(0)["decoder_target_tokens"])
  assert padding[5] < padding[0]


@pytest.mark.parametrize("flag,message", [
    ("--gin_bindings=train.learning_rate=float('nan')",
     "--gin.train.learning_rate=float('nan'): not a gin binding: 'float' is "
     "not a gin value"),
    ("--gin_bindings=train.grad_clip_norm=float('inf')",
     "--gin.train.grad_clip_norm=float('inf'): not a gin binding: 'float'"),
    ("--gin.NUM_STEPS=x", "--gin.NUM_STEPS=x: not a gin binding: 'x' is not "
     "a gin value"),
    ("--gin.NUM_STEP=3", "--gin.NUM_STEP=3: unknown gin macro 'NUM_STEP'"),
])
def test_bad_bindings_are_one_line(flag, message, capsys):
  """Issue 37 (4, 5): tracebacks from gin's parser, and a misspelled macro
  that trained all 300 steps."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.FLAGS.unparse_flags()
  try:
    code = train_lib.cli(["train", "--gin_file=train/tiny_ci.gin", flag])
  finally:
    flags.FLAGS.unparse_flags()
    gin.clear_config()
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2
  assert err == [line for line in err if not line.startswith("Traceback")]
  assert err[-1].startswith(f"train: error: {message}"), err
  if "NUM_STEP=" in flag:
    assert "did you mean NUM_STEPS?" in err[-1]
