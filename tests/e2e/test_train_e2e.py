"""specdec_jax.train end to end: train -> save -> load -> speculative decoding
(the gin files, the command line's checks and the pieces without a model:
tests/harness/test_train.py).

A tiny target and draft (gin/train/tiny_ci.gin, tiny_ci_draft.gin) are trained
once per module on a slice of Multi30k from ../shared (skipped with a message
when absent); the other tests reuse their vocabulary, checkpoints and compiled
train steps, which keeps the whole file within ~2 minutes on a 2-core CPU.
The bad-input tests need the trained vocabulary and target (a teacher).
"""
import json
import os

from conftest import MULTI30K
from conftest import require_shared
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import checkpoints
from specdec_jax import train as train_lib
from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils
from specdec_jax.core import decoding
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import init_params
from specdec_jax.core.models import param_shapes
from specdec_jax.data import tasks
from specdec_jax.data import vocab as vocabulary
from specdec_jax.training import checkpointing
from specdec_jax.training import config

pytestmark = pytest.mark.slow

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


def test_loss_decreases(target, draft):
  for result in (target, draft):
    assert result.start_step == 0 and result.step == STEPS
    assert len(result.history) == STEPS
    first, last = _first_last(result.history, "loss")
    assert np.isfinite(last)
    assert last < first - 1.5, (first, last)
  # The bigger model fits better.
  assert target.metrics["final_ce"] < draft.metrics["final_ce"]


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
# The command line.
# ---------------------------------------------------------------------------
def test_command_line_resumes_finished_run(workdir, spm_path, draft):
  """main() with T5X-style flags; the finished draft run has nothing to do."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  train_lib.define_flags()
  train_lib.define_flags()  # Idempotent.
  # Parsing the flags sets absl's logger to --verbosity's level (WARNING):
  # put it back, or a later test in this process sees no INFO lines.
  absl_level = absl_logging.get_absl_logger().level
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
    absl_logging.get_absl_logger().setLevel(absl_level)
    gin.clear_config()
  metrics = json.loads((workdir / "draft" / "train_metrics.json").read_text())
  assert metrics["start_step"] == metrics["step"] == STEPS == draft.step
  assert _checkpoint_steps(workdir / "draft") == [STEPS - 100, STEPS]


# ---------------------------------------------------------------------------
# Each optimizer descends on a toy loss.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("optimizer", config.OPTIMIZERS)
def test_optimizers_descend(optimizer):
  tx = config.make_optimizer(optimizer=optimizer, schedule=lambda count: 0.01,
                             weight_decay=0.01, grad_clip_norm=1.0, adam_b1=0.9,
                             adam_b2=0.98, adam_eps=1e-9)
  params = {"w": jnp.ones((4, 3)), "scale": jnp.ones((3,))}
  loss = lambda p: jnp.sum(jnp.square(p["w"])) + jnp.sum(p["scale"]**2)
  state = tx.init(params)
  before = loss(params)
  for _ in range(3):
    updates, state = tx.update(jax.grad(loss)(params), state, params)
    params = jax.tree_util.tree_map(lambda p, u: p + u, params, updates)
  assert loss(params) < before
