"""One statistics interface: every decoder's output is a `CallStatistics`
with the same summary keys, and its numbers agree with each other."""
import jax
import numpy as np
import pytest

from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core.decoding import beam_decoders
from specdec_jax.core.decoding.outputs import CallStatistics

from conftest import GREEDY_LEN
from conftest import greedy_world

GAMMA = 3


@pytest.fixture(scope="module")
def outputs():
  """{name: output} of the five decoders on conftest's greedy world (the
  target-alone, token and tree programs of test_decoding.py's and
  test_tree_acceptance.py's greedy tests)."""
  world = greedy_world()
  target, draft, enc = world.target, world.draft, world.inputs
  rng = jax.random.PRNGKey(0)
  greedy = dict(max_decode_length=GREEDY_LEN, method=sampling.Greedy(),
                eos_id=world.eos)
  beam = dict(beam_size=2, max_decode_length=GREEDY_LEN, alpha=0.6,
              eos_id=world.eos)
  return {
      "target alone": decoding.baseline_decoder(target, **greedy)(enc, rng),
      "token": decoding.speculative_decoder(target, draft, gamma=GAMMA,
                                            **greedy)(enc, rng),
      "tree": decoding.tree_decoder(target, draft, gamma=GAMMA, tree_width=2,
                                    **greedy)(enc, rng),
      "beam": beam_decoders.beam_decoder(target, **beam)(enc, rng),
      "speculative beam": beam_decoders.speculative_beam_decoder(
          target, draft, gamma=GAMMA, **beam)(enc, rng),
  }


def test_every_output_has_the_same_summary(outputs):
  keys = None
  for name, out in outputs.items():
    assert isinstance(out, CallStatistics), name
    summary = out.statistics()
    keys = keys or set(summary)
    assert set(summary) >= keys and keys <= set(summary), name
    # The numbers agree with each other and with the per-row fields.
    calls = np.asarray(out.target_calls)
    hist = np.asarray(out.accepted_histogram)
    trace = np.asarray(out.trace_num_accepted)
    assert summary["target_calls"] == int(calls.sum()) > 0, name
    np.testing.assert_array_equal(hist.sum(1), calls, err_msg=name)
    np.testing.assert_array_equal((trace >= 0).sum(1), calls, err_msg=name)
    assert summary["tokens_per_target_call"] == pytest.approx(
        summary["tokens_generated"] / summary["target_calls"]), name
    assert summary["accepted_histogram"] == hist.sum(0).tolist(), name


def test_the_target_alone_is_gamma_zero(outputs):
  for name in ("target alone", "beam"):
    out = outputs[name]
    assert out.gamma == 0 and out.statistics()["alpha_hat"] is None, name
    assert out.statistics()["acceptance_trials"] == 0, name
  for name in ("token", "tree", "speculative beam"):
    summary = outputs[name].statistics()
    assert summary["gamma"] == GAMMA, name
    assert 0.0 <= summary["alpha_hat"] <= 1.0, name
    # Each call emits its kept guesses + 1 (beam: steps); EOS may cut one.
    hist = np.asarray(summary["accepted_histogram"])
    assert summary["tokens_generated"] <= int(
        np.sum((np.arange(GAMMA + 1) + 1) * hist)), name
