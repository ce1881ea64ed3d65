"""Beam search equals T5X's `decoding.beam_search` (../shared/fixtures/t5x_beam).

The reference beams were computed by T5X itself: on the tiny random-weight
fixture (K = 2 and 4; random weights never emit EOS, so these test the
search and the reordering of the cache; on the shipped 38M Multi30k
target, whose beams finish: tests/e2e/test_speculative_beam_e2e.py).
Tokens must be equal, scores equal to float32 tolerance.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core.decoding import beam_search

from beam_helpers import assert_same_beams
from beam_helpers import load_reference
from beam_helpers import load_tiny_target


@pytest.fixture(scope="module")
def reference():
  return load_reference()


@pytest.fixture(scope="module")
def tiny_target():
  return load_tiny_target()


@pytest.mark.parametrize("beam_size,alpha", [(2, 0.6), (4, 0.6), (4, 0.0)])
def test_tiny_beams_equal_t5x(reference, tiny_target, beam_size, alpha):
  name = f"tiny_k{beam_size}_alpha{alpha}"
  out = beam_search.beam_search(tiny_target,
                                reference["tiny_encoder_input_tokens"],
                                beam_size=beam_size, max_decode_len=12,
                                alpha=alpha)
  assert_same_beams(out.tokens, out.scores, reference[f"{name}_decodes"],
                    reference[f"{name}_scores"], name)
  # No beam finishes on random weights: T5X runs all 12 steps.
  assert int(out.steps) == 12
  np.testing.assert_array_equal(out.best, out.tokens[:, -1])


def test_forgetting_the_cache_reordering_is_detected(reference, tiny_target):
  """Power: a search that does not reorder the cache by beam (each beam
  keeps its slot's cache, T5X's `cache_gather_beams` left out) must not
  match T5X's beams."""
  original = beam_search.beam_rows
  try:
    beam_search.beam_rows = lambda indices, width: jnp.arange(indices.size)
    # A fresh function to trace: jit's cache may hold the real program.
    loop = jax.jit(lambda *a, **kw: beam_search.beam_search_loop(*a, **kw),
                   static_argnames=("beam_size", "max_decode_len"))
    out = loop(tiny_target, jnp.asarray(reference["tiny_encoder_input_tokens"]),
               jnp.float32(0.6), jnp.int32(1), beam_size=4, max_decode_len=12)
  finally:
    beam_search.beam_rows = original
  assert not np.array_equal(np.asarray(out.tokens),
                            reference["tiny_k4_alpha0.6_decodes"])


def test_brevity_penalty_matches_t5x_formula():
  lengths = jnp.arange(1, 40)
  np.testing.assert_allclose(beam_search.brevity_penalty(0.6, lengths),
                             ((5.0 + np.arange(1, 40)) / 6.0)**0.6, rtol=1e-6)
  np.testing.assert_array_equal(beam_search.brevity_penalty(0.0, lengths), 1.0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(beam_size=0), "beam_size"),
    (dict(beam_size=2.0), "beam_size"),
    (dict(alpha=-0.1), "alpha"),
    (dict(alpha=float("nan")), "alpha"),
    (dict(max_decode_len=0), "max_decode_len"),
])
def test_bad_settings_are_named(kwargs, match):
  settings = dict(beam_size=2, alpha=0.6, max_decode_len=4)
  settings.update(kwargs)
  with pytest.raises(ValueError, match=match):
    beam_search.check_beam_settings(**settings)


def test_gather_rows_reorders_every_leaf():
  state = {"a": jnp.arange(6).reshape(3, 2), "b": jnp.arange(3) * 10}
  out = beam_search.gather_rows(state, jnp.array([2, 2, 0]))
  np.testing.assert_array_equal(out["a"], [[4, 5], [4, 5], [0, 1]])
  np.testing.assert_array_equal(out["b"], [20, 20, 0])
  with pytest.raises(ValueError, match="leading axis"):
    beam_search.gather_rows({
        "a": jnp.zeros((3, 2)),
        "b": jnp.zeros((4,))
    }, jnp.array([0]))
