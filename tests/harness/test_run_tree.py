"""The run and sweep commands with tree verification (ACCEPTANCE='tree').

* Bad tree settings (TREE_WIDTH, and what 'tree' needs: LENIENCE=1, a draft
  model without adaptive γ) stop the run before any model is loaded,
  naming the macro; nothing is written.
* The tree loop's two calls are priced as the loop makes them
  (`step_costs`: the tree call over 1 + k·γ nodes scores what
  `decode_tree` scores; the tree drafter proposes what `propose_tree` does).

Tiny runs end to end (exact, recorded; a sweep over TREE_WIDTH; GAMMA=
'auto' with TREE_WIDTH='auto'): tests/e2e/test_run_tree_e2e.py.
"""

from conftest import jit_call
from conftest import perturbed
from conftest import random_model
from conftest import tiny_config
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import certify_arguments
from run_helpers import parse_local_tiny

from specdec_jax import run as run_lib
from specdec_jax.core import drafters
from specdec_jax.core import sampling
from specdec_jax.core.decoding import tree_acceptance
from specdec_jax.experiment import arguments
from specdec_jax.experiment import decode_modes
from specdec_jax.metrics import step_costs
from specdec_jax.metrics import timing

pytestmark = pytest.mark.usefixtures("clean_gin")


@pytest.mark.parametrize(
    "bindings,expect",
    [
        (["TREE_WIDTH = 0", "ACCEPTANCE = 'tree'"
         ], ["TREE_WIDTH=0: allowed: an integer >= 1"]),
        (["TREE_WIDTH = 2.5", "ACCEPTANCE = 'tree'"], ["TREE_WIDTH=2.5"]),
        (["TREE_WIDTH = 3"], [
            "TREE_WIDTH=3 with ACCEPTANCE='token'",
            "allowed: TREE_WIDTH=1 (its default), or ACCEPTANCE='tree'"
        ]),
        (["TREE_WIDTH = 2", "ACCEPTANCE = 'block'"
         ], ["TREE_WIDTH=2 with ACCEPTANCE='block'"]),
        (["TREE_WITHOUT_REPLACEMENT = False"
         ], ["TREE_WITHOUT_REPLACEMENT=False with ACCEPTANCE='token'"]),
        (["TREE_WITHOUT_REPLACEMENT = 1", "ACCEPTANCE = 'tree'"
         ], ["TREE_WITHOUT_REPLACEMENT=1", "allowed: True or False"]),
        (["ACCEPTANCE = 'tree'", "LENIENCE = 0.5"], [
            "LENIENCE=0.5 with ACCEPTANCE='tree'",
            "allowed: LENIENCE=1.0 (its default), or ACCEPTANCE='token'"
        ]),
        (["ACCEPTANCE = 'tree'", "DRAFTER = 'prompt_lookup'"], [
            "ACCEPTANCE='tree' with DRAFTER='prompt_lookup'",
            "allowed: DRAFTER 'model' or 'shared_encoder'"
        ]),
        (["ACCEPTANCE = 'tree'", "ADAPTIVE_THRESHOLD = 0.5"
         ], ["ACCEPTANCE='tree' with ADAPTIVE_THRESHOLD=0.5"]),
        (["TREE_WIDTH = 'wide'", "ACCEPTANCE = 'tree'"
         ], ["TREE_WIDTH='wide': allowed: an integer >= 1", "or 'auto'"]),
        (["TREE_WIDTH = 'auto'"], ["TREE_WIDTH='auto' with ACCEPTANCE='token'"
                                  ]),
        ([
            "ACCEPTANCE = 'tree'", "TREE_WIDTH = 'auto'", "GAMMA = 25",
            "TASK_FEATURE_LENGTHS = {'inputs': 8, 'targets': 32}"
        ], ["TREE_WIDTH='auto' with GAMMA=25", "allowed: GAMMA <= 24"]),
        # No tree GAMMA='auto' could choose (the choice failed after loading).
        (["ACCEPTANCE = 'tree'", "TREE_WIDTH = 25", "GAMMA = 'auto'"
         ], ["GAMMA='auto' with TREE_WIDTH=25", "allowed: TREE_WIDTH <= 24"]),
        (["ACCEPTANCE = 'tree'", "TREE_WIDTH = 260"
         ], ["TREE_WIDTH=260 is more than the models' vocab_size (259)"]),
        ([
            "ACCEPTANCE = 'tree'", "TREE_WIDTH = 'auto'",
            "COMPILE_TOPOLOGY = 'v4-8'"
        ], ["TREE_WIDTH='auto' with COMPILE_TOPOLOGY='v4-8'"]),
    ])
def test_bad_tree_settings_fail_before_loading(bindings, expect, tmp_path,
                                               no_load):
  out = tmp_path / "out"
  parse_local_tiny([f"OUTPUT_DIR = '{out}'", *bindings])
  with pytest.raises(run_lib.ConfigError) as e:
    run_lib.run(providers=no_load)
  assert not out.exists()
  for text in expect:
    assert text in str(e.value), (text, str(e.value))


def test_tree_width_one_is_allowed_with_every_acceptance():
  for acceptance in ("token", "block", "tree"):
    args = certify_arguments([
        f"ACCEPTANCE = '{acceptance}'", "TREE_WIDTH = 1",
        "TREE_WITHOUT_REPLACEMENT = True"
    ])
    assert args.decode_mode.name == acceptance


def test_the_tree_calls_are_priced_as_the_loop_makes_them():
  config = tiny_config(vocab_size=32)
  target = random_model(config, seed=1)
  draft = perturbed(target, 0.3, seed=2)
  enc = np.random.default_rng(0).integers(2, 32, size=(2, 5)).astype(np.int32)
  width, gamma, fill = 2, 3, 4
  parents = tuple(int(p) for p in tree_acceptance.chain_parents(width, gamma))
  nodes = np.random.default_rng(1).integers(
      2, 32, size=(2, 1 + width * gamma)).astype(np.int32)
  cache = jit_call(target, "start", enc, 20)
  prefix = np.random.default_rng(2).integers(2, 32, size=(2, fill))
  _, cache = jit_call(target, "decode_chunk", jnp.asarray(prefix, jnp.int32),
                      cache)
  call = step_costs.TreeCall(target, parents)
  got, _ = jit_call(call, "decode_chunk", nodes, cache)
  want, _ = jit_call(target, "decode_tree", nodes, jnp.asarray(parents), cache)
  np.testing.assert_allclose(got, want, atol=1e-6)

  tree_drafter = drafters.TreeModelDrafter(draft)
  proposer = step_costs.TreeProposer(tree_drafter, width)
  state = jit_call(proposer, "init", enc, 20)
  buffer = jnp.asarray(np.pad(prefix, ((0, 0), (1, 8))), jnp.int32)
  length = jnp.full((2,), fill, jnp.int32)
  rng = jax.random.PRNGKey(0)
  method = sampling.Greedy()
  after, tokens, probs = jit_call(proposer, "propose", state, buffer, length,
                                  rng, gamma=gamma, method=method)
  _, want_tokens, _ = jit_call(tree_drafter, "propose_tree", state, buffer,
                               length, rng, gamma=gamma, width=width,
                               method=method)
  assert probs is None
  np.testing.assert_array_equal(tokens, np.reshape(want_tokens, (2, -1)))
  assert isinstance(after, type(state))  # one branch kept: as `init`'s

  # `price_tree_calls` times exactly these three calls (few steps here).
  args = arguments.run_arguments({
      "output_dir": "/tmp/unused",
      "decode_mode": decode_modes.TreeMode(width=width),
      "gamma": gamma,
      "temperature": 1.0,  # the drafter's q too
      "task_feature_lengths": {
          "inputs": 5,
          "targets": 10
      }
  })
  timed = []

  def spy(calls, *a, **kw):
    timed.append({name: k for name, (_, k) in calls.items()})
    timed.append((kw["steps"], kw["repeats"]))
    return timing.call_seconds(calls, *a, **kw)

  step, depth, tree = step_costs.price_tree_calls(
      args, draft, target, enc, fill, jnp.asarray(prefix),
      step_costs.Pricing(spy, steps=2, repeats=1))
  assert timed == [{
      "step": 1,
      "tree": 1 + width * gamma,
      "draft": gamma
  }, (2, 1)]
  assert step > 0 and depth > 0 and tree > 0
