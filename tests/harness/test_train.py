"""Tests of specdec_jax.train: train -> save -> load -> speculative decoding.

A tiny target and draft (gin/train/tiny_ci.gin, tiny_ci_draft.gin) are trained
once per module on a slice of Multi30k from ../shared (skipped with a message
when absent); the other tests reuse their vocabulary, checkpoints and compiled
train steps, which keeps the whole file within ~2 minutes on a 2-core CPU.
"""
import json
import os
import pathlib

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import MULTI30K
from conftest import require_shared
from specdec_jax import checkpoints
from specdec_jax.core import decoding
from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils
from specdec_jax.config import paths
from specdec_jax.data import tasks
from specdec_jax import train as train_lib
from specdec_jax.training import checkpointing
from specdec_jax.training import data as data_lib
from specdec_jax.training import optimizer as optimizer_lib
from specdec_jax.data import vocab as vocabulary
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import init_params
from specdec_jax.core.models import param_shapes

STEPS = 200  # For the target and the draft; checkpoints every 100.


def _gin_train(gin_file, bindings=(), **kwargs):
  """Runs train() under a gin file from gin/, with macro bindings."""
  gin.clear_config()
  try:
    train_lib.parse_gin([gin_file], list(bindings))
    return train_lib.train(**kwargs)
  finally:
    gin.clear_config()


def _macros(root, model_dir, spm_path, **extra):
  out = [
      f"MULTI30K_DIR = '{MULTI30K}'", f"SPM_MODEL_PATH = '{spm_path}'",
      f"MODEL_DIR = '{model_dir}'"
  ]
  out += [f"{k} = {v!r}" for k, v in extra.items()]
  return out


def _checkpoint_steps(model_dir):
  return [s for s, _ in checkpoints.list_checkpoints(str(model_dir))]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  require_shared(MULTI30K / "train.en")
  return tmp_path_factory.mktemp("train")


@pytest.fixture(scope="module")
def spm_path(workdir):
  return str(workdir / "spm" / "tiny.model")


@pytest.fixture(scope="module")
def target(workdir, spm_path):
  """The tiny_ci target, trained with a vocabulary trained on the fly."""
  assert not os.path.exists(spm_path)
  return _gin_train(
      "train/tiny_ci.gin",
      _macros(workdir, workdir / "target", spm_path, NUM_STEPS=STEPS))


@pytest.fixture(scope="module")
def draft(workdir, spm_path, target):
  del target  # Trained first: it makes the vocabulary.
  return _gin_train(
      "train/tiny_ci_draft.gin",
      _macros(workdir, workdir / "draft", spm_path, NUM_STEPS=STEPS),
      eval_num_examples=0)


def _first_last(history, key, n=20):
  values = np.array([h[key] for h in history])
  return values[:n].mean(), values[-n:].mean()


@pytest.mark.slow
def test_loss_decreases(target, draft):
  for result in (target, draft):
    assert result.start_step == 0 and result.step == STEPS
    assert len(result.history) == STEPS
    first, last = _first_last(result.history, "loss")
    assert np.isfinite(last)
    assert last < first - 1.5, (first, last)
  # The bigger model fits better.
  assert target.metrics["final_ce"] < draft.metrics["final_ce"]


@pytest.mark.slow
def test_checkpoints_and_metrics(workdir, target, draft):
  for result, name in ((target, "target"), (draft, "draft")):
    model_dir = workdir / name
    # Saved every 100 steps, the last 2 kept.
    assert _checkpoint_steps(model_dir) == [STEPS - 100, STEPS]
    ckpt = checkpoints.latest_checkpoint(str(model_dir))
    assert ckpt == str(model_dir / f"checkpoint_{STEPS}") == result.checkpoint
    loaded = checkpoints.load_t5x_params(ckpt,
                                         expected=param_shapes(result.config))
    jax.tree_util.tree_map(np.testing.assert_array_equal, loaded,
                           jax.device_get(result.params["params"]))
    for f in ("train_state.msgpack", "model_config.json"):
      assert (model_dir / f"checkpoint_{STEPS}" / f).is_file()
    stored = json.loads((model_dir / "model_config.json").read_text())
    assert gin_reader.t5_config_from_fields(stored,
                                            "model config") == result.config
    metrics = json.loads((model_dir / "train_metrics.json").read_text())
    assert metrics["step"] == STEPS and metrics["steps_per_second"] > 0
    assert metrics["tokens_per_second"] > 0
    assert metrics["final_loss"] < metrics["first_window_loss"]
    assert not [n for n in os.listdir(model_dir) if n.startswith(".staging")]
  # Greedy BLEU of the target on 32 validation sentences was computed.
  ev = json.loads((workdir / "target" / "train_metrics.json").read_text())
  assert ev["eval"]["num_examples"] == 32
  assert 0.0 <= ev["eval"]["bleu"] <= 100.0
  assert ev["eval"]["samples"][0]["prediction"] is not None
  assert "eval" not in draft.metrics
  assert target.config.num_params > 3 * draft.config.num_params


@pytest.mark.slow
def test_speculative_greedy_equals_target_greedy(workdir, spm_path, target,
                                                 draft):
  # Reload both from their checkpoints, as a decoding run would.
  models = []
  for name, result in (("target", target), ("draft", draft)):
    ckpt = checkpoints.latest_checkpoint(str(workdir / name))
    params = checkpoints.load_t5x_params(ckpt,
                                         expected=param_shapes(result.config))
    models.append(T5Model(result.config, {"params": params}))
  target_model, draft_model = models
  sp = vocabulary.load_sentencepiece(spm_path)
  examples = tasks.load_examples(source_file=MULTI30K / "val.en",
                                 reference_file=MULTI30K / "val.de",
                                 num_examples=32)
  inputs = tasks.encode_batch(sp, [e["input"] for e in examples], 32)
  inputs = inputs[:, :int((inputs > 0).sum(1).max())]
  rng = jax.random.PRNGKey(0)
  base = decoding.temperature_sample(target_model, inputs, rng,
                                     max_decode_length=32)
  spec = decoding.speculative_sample(target_model,
                                     decoding.ModelDrafter(draft_model), inputs,
                                     rng, gamma=3, max_decode_length=32)
  np.testing.assert_array_equal(np.asarray(spec.tokens),
                                np.asarray(base.tokens))
  np.testing.assert_array_equal(np.asarray(spec.lengths),
                                np.asarray(base.lengths))
  # Trained models produce German-looking, EOS-terminated output.
  assert (np.asarray(base.lengths) < 32).mean() > 0.5
  text = tasks.decode_tokens(sp, np.asarray(base.tokens))
  assert any(w in " ".join(text).split() for w in ("Ein", "Eine", "Mann"))


@pytest.mark.slow
def test_resume_restores_params_optimizer_and_step(workdir, spm_path, draft):
  del draft  # Compiled the step function that these runs reuse.
  n = 10
  resumed, straight = workdir / "resume", workdir / "straight"
  args = dict(eval_num_examples=0, save_every_steps=n, keep_checkpoints=0)
  first = _gin_train("train/tiny_ci_draft.gin",
                     _macros(workdir, resumed, spm_path, NUM_STEPS=n), **args)
  assert (first.start_step, first.step) == (0, n)
  assert _checkpoint_steps(resumed) == [n]
  step, _, opt_state = checkpointing.restore_checkpoint(
      str(resumed / f"checkpoint_{n}"), first.config,
      jax.tree_util.tree_map(jnp.zeros_like, first.opt_state))
  assert step == n
  counts = [
      int(x) for x in jax.tree_util.tree_leaves(opt_state) if np.ndim(x) == 0
  ]
  assert counts and all(c == n for c in counts)  # Adam's step counts.
  jax.tree_util.tree_map(np.testing.assert_array_equal, opt_state,
                         jax.device_get(first.opt_state))

  # "Restart": the same command with twice the steps continues at step n.
  second = _gin_train("train/tiny_ci_draft.gin",
                      _macros(workdir, resumed, spm_path, NUM_STEPS=2 * n),
                      **args)
  assert (second.start_step, second.step) == (n, 2 * n)
  assert [h["step"] for h in second.history] == list(range(n + 1, 2 * n + 1))
  assert _checkpoint_steps(resumed) == [n, 2 * n]
  fresh = init_params(second.config, jax.random.PRNGKey(0))
  diffs = jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()),
                                 second.params, fresh)
  assert min(jax.tree_util.tree_leaves(diffs)) > 0

  # Identical to an uninterrupted run: the optimizer state, the data order
  # and the dropout keys were all restored, not restarted.
  whole = _gin_train("train/tiny_ci_draft.gin",
                     _macros(workdir, straight, spm_path, NUM_STEPS=2 * n),
                     **args)
  np.testing.assert_allclose([h["loss"] for h in whole.history[n:]],
                             [h["loss"] for h in second.history], rtol=1e-5)
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
      second.params, whole.params)

  # Rerunning a finished run trains nothing and keeps its checkpoints.
  again = _gin_train("train/tiny_ci_draft.gin",
                     _macros(workdir, resumed, spm_path, NUM_STEPS=2 * n),
                     **args)
  assert (again.start_step, again.step, again.history) == (2 * n, 2 * n, [])


@pytest.mark.slow
def test_distillation_kl_decreases(workdir, spm_path, target, draft):
  del draft
  result = _gin_train(
      "train/tiny_ci_draft.gin",
      _macros(workdir, workdir / "distill", spm_path,
              NUM_STEPS=40), distill_from=str(workdir / "target"),
      distill_temperature=1.0, distill_weight=0.8, eval_num_examples=0)
  kl = np.array([h["kl"] for h in result.history])
  assert np.all(np.isfinite(kl)) and np.all(kl >= -1e-4)
  first, last = kl[:5].mean(), kl[-5:].mean()
  assert last < first - 0.5, (first, last)
  assert result.metrics["distill_from"] == target.checkpoint
  # The loss is 0.8 KL + 0.2 CE (+ z-loss).
  h = result.history[-1]
  np.testing.assert_allclose(h["loss"],
                             0.8 * h["kl"] + 0.2 * h["ce"] + 1e-4 * h["z"],
                             rtol=1e-4)


@pytest.mark.slow
def test_shared_encoder_draft_trains_on_the_frozen_target_encoder(
    workdir, spm_path, target):
  """gin/train/tiny_ci_shared_encoder.gin: a draft decoder without an
  encoder, distilled on the target's frozen encoder output; its checkpoint
  (T5X layout, no encoder/) loads and drafts exactly for the target."""
  model_dir = workdir / "shared_encoder"
  teacher_ckpt = target.checkpoint
  before = checkpoints.load_t5x_params(teacher_ckpt,
                                       expected=param_shapes(target.config))
  result = _gin_train(
      "train/tiny_ci_shared_encoder.gin",
      _macros(workdir, model_dir, spm_path, NUM_STEPS=40,
              TEACHER_DIR=str(workdir / "target")), eval_num_examples=8,
      eval_batch_size=8)
  config = result.config
  assert config.num_encoder_layers == 0 and config.encoder_width == 64
  # The student has no encoder; its cross-attention reads width 64.
  params = result.params["params"]
  assert sorted(params) == ["decoder", "token_embedder"]
  cross = params["decoder"]["layers_0"]["encoder_decoder_attention"]
  assert cross["key"]["kernel"].shape == (64, 32)
  assert config.num_params == sum(
      x.size for x in jax.tree_util.tree_leaves(params))
  kl = np.array([h["kl"] for h in result.history])
  assert np.all(np.isfinite(kl)) and kl[-5:].mean() < kl[:5].mean() - 0.5
  assert result.metrics["distill_from"] == teacher_ckpt
  assert 0.0 <= result.metrics["eval"]["bleu"] <= 100.0  # On the teacher's.
  # The teacher (its encoder included) is untouched by training.
  after = checkpoints.load_t5x_params(teacher_ckpt,
                                      expected=param_shapes(target.config))
  jax.tree_util.tree_map(np.testing.assert_array_equal, before, after)
  jax.tree_util.tree_map(np.testing.assert_array_equal,
                         jax.device_get(target.params["params"]), after)
  # The checkpoint: T5X layout, the model's config next to it.
  ckpt = checkpoints.latest_checkpoint(str(model_dir))
  loaded = checkpoints.load_t5x_params(ckpt, expected=param_shapes(config))
  jax.tree_util.tree_map(np.testing.assert_array_equal, loaded,
                         jax.device_get(params))
  stored = json.loads((model_dir / "model_config.json").read_text())
  assert gin_reader.t5_config_from_fields(stored, "model config") == config
  # It drafts for the target: greedy identity, some guesses kept.
  target_model = T5Model(target.config, {"params": after})
  draft_model = T5Model(config, {"params": loaded})
  sp = vocabulary.load_sentencepiece(spm_path)
  examples = tasks.load_examples(source_file=MULTI30K / "val.en",
                                 reference_file=MULTI30K / "val.de",
                                 num_examples=16)
  inputs = tasks.encode_batch(sp, [e["input"] for e in examples], 32)
  inputs = inputs[:, :int((inputs > 0).sum(1).max())]
  rng = jax.random.PRNGKey(0)
  base = decoding.temperature_sample(target_model, inputs, rng,
                                     max_decode_length=32)
  spec = decoding.speculative_sample(target_model, draft_model, inputs, rng,
                                     gamma=3, max_decode_length=32)
  np.testing.assert_array_equal(np.asarray(spec.tokens),
                                np.asarray(base.tokens))
  assert spec.statistics()["alpha_hat"] > 0.1


@pytest.mark.slow
def test_shared_encoder_student_needs_a_teacher_of_its_width(
    tmp_path, workdir, spm_path, target):
  student = T5Config(vocab_size=1000, emb_dim=16, num_heads=2, head_dim=8,
                     mlp_dim=32, num_encoder_layers=0, num_decoder_layers=1,
                     encoder_width=32)
  with pytest.raises(ValueError, match=r"set distill_from"):
    train_lib.train(**_tiny_call(tmp_path, spm_path, model_config=student))
  with pytest.raises(ValueError, match=r"teacher .* has emb_dim 64"):
    train_lib.train(**_tiny_call(tmp_path, spm_path, model_config=student,
                                 distill_from=target.checkpoint))
  _assert_nothing_trained(tmp_path)


# ---------------------------------------------------------------------------
# Bad input: a clear ValueError before anything is trained or written.
# ---------------------------------------------------------------------------
def _tiny_call(tmp_path, spm_path, **overrides):
  kwargs = dict(
      model_dir=str(tmp_path / "model"), num_steps=5,
      model_config=T5Config(vocab_size=1000, emb_dim=16, num_heads=2,
                            head_dim=8, mlp_dim=32, num_encoder_layers=1,
                            num_decoder_layers=1),
      source_file=str(MULTI30K / "train.en"),
      reference_file=str(MULTI30K / "train.de"), spm_model_path=spm_path,
      batch_size=4, eval_num_examples=0)
  kwargs.update(overrides)
  return kwargs


def _assert_nothing_trained(tmp_path):
  assert not _checkpoint_steps(tmp_path / "model")


def test_bad_corpus(tmp_path, spm_path, target):
  del target  # The vocabulary exists.
  src, ref = tmp_path / "x.en", tmp_path / "x.de"
  src.write_text("a dog\na cat\nthe man\n")
  ref.write_text("ein Hund\neine Katze\n")
  with pytest.raises(ValueError, match=r"Line count mismatch.*x\.en.*3.*x\.de"):
    train_lib.train(**_tiny_call(tmp_path, spm_path, source_file=str(src),
                                 reference_file=str(ref)))
  ref.write_text("ein Hund\n\nder Mann\n")
  with pytest.raises(ValueError, match=r"x\.de:2: empty reference line"):
    train_lib.train(**_tiny_call(tmp_path, spm_path, source_file=str(src),
                                 reference_file=str(ref)))
  with pytest.raises(ValueError, match=r"not found.*missing\.en"):
    train_lib.train(
        **_tiny_call(tmp_path, spm_path, source_file=str(tmp_path /
                                                         "missing.en")))
  _assert_nothing_trained(tmp_path)


def test_bad_vocabulary(tmp_path, spm_path, target):
  del target
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(
      f"a small dog number {i} runs" for i in range(50)) + "\n")
  # SentencePiece's own defaults: unk 0, bos 1, eos 2, no pad.
  spm.SentencePieceTrainer.train(input=str(corpus),
                                 model_prefix=str(tmp_path / "bad"),
                                 vocab_size=40, hard_vocab_limit=False,
                                 minloglevel=2)
  with pytest.raises(ValueError, match=r"bad\.model.*does not follow T5"):
    train_lib.train(**_tiny_call(tmp_path, str(tmp_path / "bad.model")))
  with pytest.raises(ValueError, match=r"nothere\.model does not exist"):
    train_lib.train(**_tiny_call(tmp_path, str(tmp_path / "nothere.model")))
  # A model vocab_size smaller than the vocabulary.
  with pytest.raises(ValueError, match=r"1000 pieces.*vocab_size is 500"):
    train_lib.train(**_tiny_call(
        tmp_path, spm_path, model_config=T5Config(
            vocab_size=500, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
            num_encoder_layers=1, num_decoder_layers=1)))
  _assert_nothing_trained(tmp_path)


def test_bad_teacher(tmp_path, workdir, spm_path, target):
  student = T5Config(vocab_size=1024, emb_dim=16, num_heads=2, head_dim=8,
                     mlp_dim=32, num_encoder_layers=1, num_decoder_layers=1)
  with pytest.raises(ValueError, match=r"vocab_size 1000 but the student has "
                     r"1024"):
    train_lib.train(**_tiny_call(tmp_path, spm_path, model_config=student,
                                 distill_from=str(workdir / "target")))
  # A teacher config that does not match the teacher's checkpoint.
  with pytest.raises(ValueError, match=r"Teacher config mismatch.*emb_dim"):
    train_lib.train(
        **_tiny_call(tmp_path, spm_path, distill_from=target.checkpoint,
                     teacher_config=target.config.replace(emb_dim=32)))
  with pytest.raises(ValueError, match=r"no checkpoint_<step> found"):
    train_lib.train(
        **_tiny_call(tmp_path, spm_path, distill_from=str(tmp_path /
                                                          "nowhere")))
  _assert_nothing_trained(tmp_path)


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
  assert paths.resolve_path("here") == str(tmp_path / "here")
  # What exists only in the repository is read from it...
  assert paths.resolve_path("configs/data/captions_en_de.tsv") == str(
      paths.REPO_DIR / "configs" / "data" / "captions_en_de.tsv")
  # ...and what exists nowhere is created here, never in the checkout
  # (issue 44: MODEL_DIR='outputs/...' wrote into it).
  assert paths.resolve_path("outputs/nowhere_x") == str(tmp_path / "outputs" /
                                                        "nowhere_x")
  assert paths.resolve_path("../shared/data/multi30k") == str(
      paths.REPO_DIR.parent / "shared" / "data" / "multi30k")
  assert paths.resolve_path("/abs/x") == "/abs/x"


def test_gin_search_path_and_flag_rewrite():
  assert paths.GIN_DIR == pathlib.Path(train_lib.__file__).parents[1] / "gin"
  assert (paths.GIN_DIR / "train" / "tiny_ci.gin").is_file()
  assert gin_utils.rewrite_gin_args([
      "prog", "--gin.NUM_STEPS=5", "--gin_file=x.gin"
  ]) == ["prog", "--gin_bindings=NUM_STEPS=5", "--gin_file=x.gin"]
  with pytest.raises(ValueError, match="nope.gin.*not found"):
    train_lib.parse_gin(["train/nope.gin"], [])


@pytest.mark.slow
def test_command_line_resumes_finished_run(workdir, spm_path, draft):
  """main() with T5X-style flags; the finished draft run has nothing to do."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  train_lib.define_flags()
  train_lib.define_flags()  # Idempotent.
  argv = gin_utils.rewrite_gin_args([
      "train", "--gin_file=train/tiny_ci_draft.gin",
      f"--gin.MODEL_DIR='{workdir / 'draft'}'",
      f"--gin.SPM_MODEL_PATH='{spm_path}'", f"--gin.MULTI30K_DIR='{MULTI30K}'",
      f"--gin.NUM_STEPS={STEPS}", "--gin_bindings=train.eval_num_examples = 0"
  ])
  gin.clear_config()
  try:
    flags.FLAGS(argv)
    train_lib.main(["train"])
  finally:
    flags.FLAGS.unparse_flags()
    gin.clear_config()
  metrics = json.loads((workdir / "draft" / "train_metrics.json").read_text())
  assert metrics["start_step"] == metrics["step"] == STEPS == draft.step
  assert _checkpoint_steps(workdir / "draft") == [STEPS - 100, STEPS]


# ---------------------------------------------------------------------------
# Pieces (no model).
# ---------------------------------------------------------------------------
def test_schedules():
  cos = optimizer_lib.make_schedule(learning_rate=1.0, warmup_steps=10,
                                    decay="cosine", decay_steps=110,
                                    final_learning_rate_fraction=0.1)
  np.testing.assert_allclose(
      [float(cos(s)) for s in (0, 4, 9, 10, 60, 110, 200)],
      [0.1, 0.5, 1.0, 1.0, 0.55, 0.1, 0.1], rtol=1e-5)
  rsqrt = optimizer_lib.make_schedule(learning_rate=1.0, warmup_steps=100,
                                      decay="rsqrt", decay_steps=0)
  np.testing.assert_allclose([float(rsqrt(s)) for s in (49, 99, 399)],
                             [0.5, 1.0, 0.5], rtol=1e-5)
  with pytest.raises(ValueError, match="Unknown decay"):
    optimizer_lib.make_schedule(learning_rate=1.0, warmup_steps=1, decay="step",
                                decay_steps=1)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", optimizer_lib.OPTIMIZERS)
def test_optimizers_descend(optimizer):
  tx = optimizer_lib.make_optimizer(optimizer=optimizer,
                                    schedule=lambda count: 0.01,
                                    weight_decay=0.01, grad_clip_norm=1.0,
                                    adam_b1=0.9, adam_b2=0.98, adam_eps=1e-9)
  params = {"w": jnp.ones((4, 3)), "scale": jnp.ones((3,))}
  loss = lambda p: jnp.sum(jnp.square(p["w"])) + jnp.sum(p["scale"]**2)
  state = tx.init(params)
  before = loss(params)
  for _ in range(3):
    updates, state = tx.update(jax.grad(loss)(params), state, params)
    params = jax.tree_util.tree_map(lambda p, u: p + u, params, updates)
  assert loss(params) < before


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
