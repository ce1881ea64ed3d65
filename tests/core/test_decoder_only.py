"""A decoder-only target through the `Target` seam (no T5 type anywhere).

`decoder_only_helpers.DecoderOnlyLM` reads a prompt into a KV-cache-like
state (`start`), names the loop's first token (`start_token`: the last
prompt token) and exposes its length. Both loops decode it exactly:

* greedy: the speculative loop (with a decoder-only draft model, or a
  deterministic drafter) emits the baseline's tokens, token for token, and
  both follow the float64 reference's argmax path;
* T = 1: the first two tokens of many rows fit the enumerated distribution
  of the float64 reference (chi-square, significance 1e-3, fixed seeds).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.core import protocols
from specdec_jax.core import sampling

from conftest import jit_call
from decoder_only_helpers import DecoderOnlyLM
from decoder_only_helpers import next_logits
from decoding_helpers import chisquare_pvalue
from decoding_helpers import count_sequences
from decoding_helpers import sequence_distribution

V = 6
EOS = 1
SIGNIFICANCE = 1e-3
# Right-padded prompts of different lengths (0 = padding).
PROMPTS = np.array([[3, 4, 5, 2, 0], [5, 0, 0, 0, 0], [2, 2, 4, 0, 0]],
                   np.int32)


def _prompt(row):
  return tuple(int(t) for t in row if t != 0)


def _greedy_reference(model, prompt, steps, eos):
  """The argmax path after `prompt`, in float64, stopping after EOS."""
  out = []
  while len(out) < steps and (not out or out[-1] != eos):
    out.append(int(np.argmax(next_logits(model, prompt + tuple(out)))))
  return out + [0] * (steps - len(out))


def test_decoder_only_model_implements_the_target_protocol():
  model = DecoderOnlyLM.random(0, V)
  assert isinstance(model, protocols.Target)
  decoding.check_target(model)  # No error.
  state = jit_call(model, "start", jnp.asarray(PROMPTS), 4)
  np.testing.assert_array_equal(jit_call(model, "length", state), [0, 0, 0])
  np.testing.assert_array_equal(
      jit_call(model, "start_token", jnp.asarray(PROMPTS)), [2, 5, 4])
  _, state = jit_call(model, "decode_chunk", jnp.ones((3, 2), jnp.int32), state)
  np.testing.assert_array_equal(jit_call(model, "length", state), [2, 2, 2])
  state = jit_call(model, "truncate", state, jnp.array([1, 3, 0]))
  np.testing.assert_array_equal(jit_call(model, "length", state), [1, 2, 0])


def test_decoder_only_logits_follow_the_prompt_and_the_cache():
  # The traced model agrees with the float64 reference after the prefill
  # and after a chunk; a K-token chunk equals K one-token calls.
  model = DecoderOnlyLM.random(1, V)
  inputs = jnp.asarray(PROMPTS)
  chunk = np.array([[3, 4], [2, 5], [4, 4]], np.int32)
  logits, _ = jit_call(model, "decode_chunk", jnp.asarray(chunk),
                       jit_call(model, "start", inputs, 4))
  state = jit_call(model, "start", inputs, 4)
  for b, row in enumerate(PROMPTS):
    prompt = _prompt(row)
    # The chunk's first token is fed after the prompt's last one: the
    # logits at chunk slot j follow prompt[:-1] + chunk[:j+1].
    for j in range(2):
      np.testing.assert_allclose(
          logits[b, j], next_logits(model,
                                    prompt[:-1] + tuple(chunk[b, :j + 1])),
          rtol=1e-5, atol=1e-5)
  for j in range(2):
    one, state = jit_call(model, "decode_chunk", jnp.asarray(chunk[:, j:j + 1]),
                          state)
    np.testing.assert_allclose(one[:, 0], logits[:, j], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("drafter_kind", ["model", "prompt_lookup"])
@pytest.mark.parametrize("gamma", [1, 3])
def test_greedy_speculative_equals_greedy_baseline(drafter_kind, gamma):
  target = DecoderOnlyLM.random(2, V)
  draft = (drafters.ModelDrafter(DecoderOnlyLM.random(3, V, scale=2.0))
           if drafter_kind == "model" else drafters.PromptLookupDrafter(
               vocab=V, max_ngram=2))
  inputs = jnp.asarray(PROMPTS)
  steps = 10
  base = decoding.temperature_sample(target, inputs, jax.random.PRNGKey(0),
                                     max_decode_length=steps, eos_id=EOS)
  spec = decoding.speculative_sample(target, draft, inputs,
                                     jax.random.PRNGKey(0), gamma=gamma,
                                     max_decode_length=steps, eos_id=EOS)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  np.testing.assert_array_equal(spec.lengths, base.lengths)
  for b, row in enumerate(PROMPTS):
    np.testing.assert_array_equal(
        base.tokens[b], _greedy_reference(target, _prompt(row), steps, EOS))
  # Rows have different prompts, so a loop reading the wrong row's cache or
  # prompt would not have matched the reference above.
  assert len({tuple(t) for t in np.asarray(base.tokens)}) > 1


@pytest.mark.parametrize("decoder", ["baseline", "speculative"])
def test_first_tokens_have_the_target_distribution(decoder):
  target = DecoderOnlyLM.random(4, V, scale=1.5)
  prompt = (3, 5, 2)
  steps, samples = 2, 3000
  method = sampling.Sampling(temperature=1.0)

  def next_probs(prefix):
    logits = next_logits(target, prompt + prefix)
    p = np.exp(logits - logits.max())
    return p / p.sum()

  exact = sequence_distribution(next_probs, V, steps, EOS)
  assert abs(sum(exact.values()) - 1.0) < 1e-9
  inputs = jnp.asarray(np.tile(np.array(prompt, np.int32), (samples, 1)))
  if decoder == "baseline":
    out = decoding.temperature_sample(target, inputs, jax.random.PRNGKey(11),
                                      max_decode_length=steps, method=method,
                                      eos_id=EOS)
  else:
    draft = drafters.ModelDrafter(DecoderOnlyLM.random(5, V, scale=1.5))
    out = decoding.speculative_sample(target, draft, inputs,
                                      jax.random.PRNGKey(12), gamma=2,
                                      max_decode_length=steps, method=method,
                                      eos_id=EOS)
  observed, expected = count_sequences(out.tokens, exact)
  assert chisquare_pvalue(observed, expected) > SIGNIFICANCE
