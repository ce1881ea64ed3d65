"""`run` and `sweep` with DRAFTER='feature' (the feature-level draft).

* Bad settings stop the run before any model is loaded, naming the macro:
  no DRAFT_CHECKPOINT_PATH, a checkpoint that is not a feature draft's, one
  for another target width or vocabulary, MODE='alpha', adaptive γ.
* c's pricing of a feature draft runs for real (`step_costs.price_calls`),
  and with ACCEPTANCE='tree' the tree call and the branches, with the
  target's features.
* A sweep's models of another drafter kind are not reused for it.
* Checking and loading work with gin's config locked, as `run` has it.

Runs end to end (exact at T = 0, recorded; T = 1; a tree):
tests/e2e/test_run_feature_drafter_e2e.py.
"""
import os
import subprocess
import sys

from conftest import REPO
from conftest import jit_call
from conftest import random_model
from conftest import tiny_config
from feature_helpers import VOCAB
from feature_helpers import WIDTH
from feature_helpers import write_feature_checkpoint
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import parse_local_tiny

from specdec_jax import run as run_lib
from specdec_jax import sweep
from specdec_jax.checkpoints import digests
from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.core.models import FeatureDrafterConfig
from specdec_jax.core.models import FeatureDraftModel
from specdec_jax.core.models.feature_drafter import init_feature_params
from specdec_jax.experiment import arguments
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import loading
from specdec_jax.experiment.plan import Models
from specdec_jax.experiment.plan import Providers
from specdec_jax.experiment.plan import RunPlan
from specdec_jax.metrics import step_costs

# A cleared gin configuration before and after each test (conftest.py).
pytestmark = pytest.mark.usefixtures("clean_gin")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return write_feature_checkpoint(tmp_path_factory.mktemp("feature"))


def _fail(*args, **kwargs):
  raise AssertionError("loaded a model / decoded before validating")


NO_LOAD = Providers(load_model=_fail, decoders=_fail, load_feature_draft=_fail)


def _run_error(out, bindings) -> str:
  parse_local_tiny([f"OUTPUT_DIR = '{out}'", "DRAFTER = 'feature'", *bindings])
  with pytest.raises(run_lib.ConfigError) as e:
    run_lib.run(providers=NO_LOAD)
  assert not out.exists()
  return str(e.value)


def test_bad_feature_settings_fail_before_loading(tmp_path, checkpoint):
  cases = [
      ([], [
          "DRAFTER='feature' with DRAFT_CHECKPOINT_PATH=None",
          "allowed: the folder of a feature draft's checkpoint"
      ]),
      ([f"DRAFT_CHECKPOINT_PATH = '{tmp_path}'"],
       ["no feature_config.json: not a feature-level draft's checkpoint"]),
      ([f"DRAFT_CHECKPOINT_PATH = '{checkpoint}'", "MODE = 'alpha'"],
       ["DRAFTER='feature' with MODE='alpha'", "allowed: DRAFTER='model'"]),
      ([f"DRAFT_CHECKPOINT_PATH = '{checkpoint}'", "ADAPTIVE_THRESHOLD = 0.5"],
       ["ADAPTIVE_THRESHOLD=0.5 with DRAFTER='feature'"]),
  ]
  for bindings, expect in cases:
    import gin  # pylint: disable=g-import-not-at-top
    gin.clear_config()
    message = _run_error(tmp_path / "out", bindings)
    for text in expect:
      assert text in message, (text, message)


@pytest.mark.parametrize("feature_dim,vocab_size,expect", [
    (32, VOCAB, "reads features of width 32 over a vocabulary of 259, but "
     "the target has emb_dim 64"),
    (WIDTH, 300, "features of width 64 over a vocabulary of 300"),
])
def test_a_draft_for_another_target_fails_before_loading(
    tmp_path, feature_dim, vocab_size, expect):
  ckpt = write_feature_checkpoint(tmp_path / "other", feature_dim, vocab_size)
  message = _run_error(tmp_path / "out", [f"DRAFT_CHECKPOINT_PATH = '{ckpt}'"])
  assert expect in message, message
  assert f"allowed: a feature draft trained for this target (feature_dim = " \
         f"{WIDTH}, vocab_size = {VOCAB})" in message


# Few timed calls: nothing is compared in time.
FEW_STEPS = step_costs.Pricing(steps=2, repeats=1)


def _tiny_pair():
  target = random_model(tiny_config(vocab_size=32), seed=1)
  config = FeatureDrafterConfig(vocab_size=32,
                                feature_dim=target.config.emb_dim, emb_dim=8,
                                num_heads=2, head_dim=4, mlp_dim=16,
                                head_size=20)
  draft = FeatureDraftModel.for_target(
      config, init_feature_params(config, jax.random.PRNGKey(2)), np.arange(20),
      target)
  return target, draft


def test_pricing_a_feature_draft_runs_its_propose():
  """c's numerator: one real propose of γ guesses with the target's
  features over the context (few steps: nothing is compared in time)."""
  target, draft = _tiny_pair()
  args = arguments.RunArguments(
      gamma=2, output_dir="/tmp/unused", task_feature_lengths={
          "inputs": 8,
          "targets": 6
      })
  inputs = jnp.asarray([[3, 4, 5, 1], [6, 7, 1, 0]], jnp.int32)
  context = jnp.asarray([[5, 6, 7, 8, 9, 1], [9, 8, 7, 1, 0, 0]], jnp.int32)
  drafter = drafters.FeatureDrafter(draft)
  # Without the target's features its propose cannot run at all.
  # (Its state built as one program each; the refused call itself eager.)
  state = jit_call(drafter, "init", inputs, 9,
                   target.encoder_output(jit_call(target, "start", inputs, 9)))
  with pytest.raises(ValueError, match="needs target_features"):
    drafter.propose(state, jnp.zeros((2, 9), jnp.int32),
                    jnp.zeros((2,), jnp.int32), jax.random.PRNGKey(0), gamma=2,
                    method=args.method())
  by_k, t_draft = step_costs.price_calls(args, drafter, target, inputs, (1, 3),
                                         3, context, FEW_STEPS)
  assert set(by_k) == {1, 3}
  assert t_draft > 0 and np.isfinite(t_draft)
  # The features handed over are the target's own over the context.
  keeping = target.with_features()
  buffer = jnp.pad(context, ((0, 0), (1, 0)))[:, :5]
  features = step_costs.context_features(keeping, inputs, buffer, 9)
  _, cache = jit_call(keeping, "decode_chunk", buffer,
                      jit_call(keeping, "start", inputs, 9))
  # (Two programs: float32 rounding apart.)
  np.testing.assert_allclose(features, keeping.features(cache), rtol=1e-5,
                             atol=1e-5)
  assert float(jnp.abs(features[:, :5]).sum()) > 0


def test_a_sweep_reloads_the_draft_of_another_kind(tmp_path, checkpoint):
  """Points of one model group share the target; a feature point after a
  'model' point loads its own draft (and the other way round)."""
  target, draft = _tiny_pair()
  loaded = []

  def load_feature_draft(path, target_model):
    loaded.append(path)
    assert target_model is target
    return draft

  t5_draft = random_model(tiny_config(vocab_size=32), seed=3)
  providers = Providers(load_model=lambda *a: t5_draft,
                        load_feature_draft=load_feature_draft)
  parse_local_tiny(
      ["DRAFTER = 'feature'", f"DRAFT_CHECKPOINT_PATH = '{checkpoint}'"])
  feature_plan = RunPlan.build(arguments.run_arguments(), providers)
  models = feature_plan.load_models(Models(None, target, t5_draft))
  assert models.draft is draft and loaded == [checkpoint]
  assert feature_plan.load_models(models).draft is draft  # kept
  assert len(loaded) == 1
  import gin  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  parse_local_tiny(["DRAFTER = 'model'"])
  model_plan = RunPlan.build(arguments.run_arguments(), providers)
  again = model_plan.load_models(models)
  assert again.draft is t5_draft and again.target is target


def test_speculative_target_keeps_features_only_for_a_feature_drafter():
  target, draft = _tiny_pair()
  assert decoding.speculative_target(target,
                                     drafters.FeatureDrafter(draft)) \
      .keep_features is True
  assert decoding.speculative_target(target, target) is target


def test_checks_and_loading_work_with_gin_locked(checkpoint):
  """`run` locks gin's config before it checks and loads: nothing on the
  feature draft's path may register a gin configurable then (importing
  `specdec_jax.training` did: RuntimeError). A fresh process, so that no
  other test has imported it."""
  code = (
      "import sys\n"
      "from specdec_jax.config import gin_utils\n"
      "from specdec_jax.experiment import arguments, plan\n"
      "gin_utils.parse_gin(['local_tiny.gin'], [\"DRAFTER = 'feature'\", "
      f"\"DRAFT_CHECKPOINT_PATH = '{checkpoint}'\"], finalize=True)\n"
      "models = plan.RunPlan.build(arguments.run_arguments()).load_models()\n"
      "assert type(models.draft).__name__ == 'FeatureDraftModel'\n"
      "assert 'specdec_jax.training' not in sys.modules\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, cwd=REPO, timeout=300, env={
                            **os.environ, "PYTHONPATH": str(REPO)
                        })
  assert proc.returncode == 0, proc.stderr[-3000:]


def test_pricing_a_feature_tree_runs_its_propose_tree():
  target, draft = _tiny_pair()
  args = arguments.RunArguments(
      gamma=2, output_dir="/tmp/unused",
      decode_mode=decode_modes.TreeMode(width=2), task_feature_lengths={
          "inputs": 8,
          "targets": 6
      })
  inputs = jnp.asarray([[3, 4, 5, 1], [6, 7, 1, 0]], jnp.int32)
  context = jnp.asarray([[5, 6, 7, 8, 9, 1], [9, 8, 7, 1, 0, 0]], jnp.int32)
  step, per_guess, tree = step_costs.price_tree_calls(
      args, drafters.FeatureDrafter(draft), target, inputs, 3, context,
      FEW_STEPS)
  assert min(step, per_guess, tree) > 0
  assert np.isfinite([step, per_guess, tree]).all()


def test_table2_sweep_points_all_pass_the_checks(tmp_path):
  """configs/table2_multi30k_feature.yaml: the feature draft beside the
  shared-encoder and distilled drafts; every point passes `run`'s checks
  with the shipped checkpoints (nothing loaded)."""
  points = sweep.parse_sweep_args(
      [str(REPO / "configs" / "table2_multi30k_feature.yaml")])
  assert len(points) == 16
  assert sum(p.get("ACCEPTANCE") == "tree" for p in points) == 2
  files = {p["gin_file"] for p in points}
  assert files == {
      "multi30k_38m_feature_1m.gin", "multi30k_38m_shared_1m.gin",
      "multi30k_38m_1m_distill.gin", "multi30k_38m_4m_distill.gin"
  }
  sweep.check_keys(points, [], [], [])
  sweep.validate_points(points, str(tmp_path / "r"), [], [], [],
                        providers=NO_LOAD)


def test_shipped_feature_draft_records_its_vocabulary():
  """pretrained/multi30k/feature_1m: digests verified, and the vocabulary
  its target was trained with recorded, as the other shipped checkpoints
  do (a run refuses another SentencePiece model)."""
  shipped = REPO / "pretrained" / "multi30k"
  ckpt = loading.checkpoint_dir(str(shipped / "feature_1m"))
  assert digests.verify_manifest(ckpt)
  record = digests.vocabulary_record(ckpt)
  spm = (shipped / "multi30k.model").read_bytes()
  assert record == {
      "bytes": len(spm),
      "file": "multi30k.model",
      "sha256": digests.digest(spm)
  }
  assert record == digests.vocabulary_record(
      loading.checkpoint_dir(str(shipped / "target_38m")))
