"""A run's plan in three stages, each complete when built: `RunPlan`
(settings), `Loaded` (models, drafter), `DecodePlan` (choices, decoders)."""
import dataclasses

import pytest

from specdec_jax.config import gin_utils
from specdec_jax.experiment import arguments
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import plan as plan_lib

pytestmark = pytest.mark.usefixtures("clean_gin")


def _plan(tmp_path, *bindings, providers=None):
  gin_utils.parse_gin(["local_tiny.gin"], [
      f"OUTPUT_DIR = '{tmp_path / 'out'}'", "NUM_EXAMPLES = 2",
      "TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 6}", *bindings
  ], finalize=False)
  return plan_lib.RunPlan.build(arguments.run_arguments(), providers)


def test_no_stage_has_a_field_filled_later():
  for stage in (plan_lib.RunPlan, plan_lib.Loaded, plan_lib.DecodePlan):
    later = {f.name for f in dataclasses.fields(stage)
            } & {"models", "drafter", "baseline", "speculative"}
    # Each stage has exactly what it was built with, nothing optional.
    for f in dataclasses.fields(stage):
      if f.name in later:
        assert f.default is dataclasses.MISSING, (stage.__name__, f.name)
  assert not {f.name for f in dataclasses.fields(plan_lib.RunPlan)
             } & {"models", "drafter", "baseline", "speculative", "auto"}


def test_the_mesh_is_built_once_and_the_models_use_it(tmp_path, monkeypatch):
  plan = _plan(tmp_path)
  built = []
  real = plan_lib.partitioning.make_mesh
  monkeypatch.setattr(plan_lib.partitioning, "make_mesh",
                      lambda *a: built.append(a) or real(*a))
  models = plan.load_models()
  assert plan.mesh is models.mesh and plan.mesh is plan.mesh
  assert len(built) == 1


def test_decoders_are_built_once_the_choices_are_made(tmp_path):
  plan = _plan(tmp_path, "GAMMA = 'auto'")
  loaded = plan.load(plan.load_models())
  with pytest.raises(ValueError, match="chosen before the decoders"):
    loaded.decoding()
  chosen = loaded.decoding(gamma=3)
  assert chosen.args.gamma == 3 and plan.args.gamma == "auto"
  assert chosen.models is loaded.models and chosen.drafter is loaded.drafter
  assert callable(chosen.baseline) and callable(chosen.speculative)
  # Another mode's decoders carry that mode's acceptance rule.
  block = loaded.decoding(gamma=2, decode_mode=decode_modes.BLOCK)
  assert type(block.acceptance).__name__ == "BlockAcceptance"
  assert chosen.acceptance is None  # Algorithm 1
