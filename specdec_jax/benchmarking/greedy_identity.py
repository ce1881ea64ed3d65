"""Temperature-0 exactness on this backend and dtype (real acceptance).

Greedy speculative decoding equals the target alone only if the target's
(γ+1)-token verification call picks the same argmax as one-token calls at
every position. In float32 on CPU their logits are bit-identical; in
bfloat16 on an accelerator the two matmul shapes may round differently and
flip a near-tie. This is the one exactness question the benchmark answers
(`--check_greedy_identity`); its timings use synthetic acceptance.
"""
from typing import Any, Dict

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.metrics import timing
from specdec_jax.core.models.t5 import T5Model

Array = jax.Array


@jax.jit
def _decode_chunk(model, tokens, cache):
  return model.decode_chunk(tokens, cache)


def _chunk_vs_steps(target: T5Model, encoder_inputs: Array,
                    decoder_inputs: Array) -> Dict[str, float]:
  """The target's logits for decoder_inputs [B, k] as one chunk vs k steps."""
  k = decoder_inputs.shape[1]
  cache = timing.start(target, encoder_inputs, max_len=k + 1)
  chunk_logits, _ = _decode_chunk(target, decoder_inputs, cache)
  step_logits = []
  for i in range(k):
    logits, cache = _decode_chunk(target, decoder_inputs[:, i:i + 1], cache)
    step_logits.append(logits[:, 0])
  chunk_logits = np.asarray(chunk_logits, np.float32)
  step_logits = np.asarray(jnp.stack(step_logits, axis=1), np.float32)
  return {
      "chunk_vs_step_max_abs_logit_diff": float(
          np.max(np.abs(chunk_logits - step_logits))),
      "chunk_vs_step_argmax_agreement": float(
          np.mean(chunk_logits.argmax(-1) == step_logits.argmax(-1))),
  }


def greedy_identity_check(target: T5Model, draft: T5Model,
                          encoder_inputs: Array, *, gamma: int,
                          max_decode_length: int) -> Dict[str, Any]:
  """Greedy speculative vs greedy target tokens, and chunk vs step logits.

  Decodes `encoder_inputs` [B, S] with both decoders (real acceptance, EOS
  never stops a row) and compares tokens, then feeds the baseline's first
  γ+1 decoder tokens to the target as one chunk and as γ+1 one-token calls
  and compares the logits.

  Returns:
    JSON-ready dict: rows, rows_identical, first_difference (per row, None
    where identical), chunk_vs_step_max_abs_logit_diff,
    chunk_vs_step_argmax_agreement (fraction of the B·(γ+1) positions),
    alpha_hat of the speculative run, gamma.
  """
  base = decoding.temperature_sample(target, encoder_inputs,
                                     jax.random.PRNGKey(0),
                                     max_decode_length=max_decode_length,
                                     eos_id=-1)
  spec = decoding.speculative_sample(target, draft, encoder_inputs,
                                     jax.random.PRNGKey(1), gamma=gamma,
                                     max_decode_length=max_decode_length,
                                     eos_id=-1)
  same = np.asarray(base.tokens) == np.asarray(spec.tokens)
  k = min(gamma + 1, max_decode_length)
  decoder_inputs = jnp.concatenate(
      [jnp.zeros_like(base.tokens[:, :1]), base.tokens[:, :k - 1]], axis=1)
  return {
      "gamma": gamma,
      "rows": int(same.shape[0]),
      "rows_identical": int(same.all(axis=1).sum()),
      "first_difference": [
          None if row.all() else int(np.argmin(row)) for row in same
      ],
      "alpha_hat": float(spec.alpha_hat),
      **_chunk_vs_steps(target, encoder_inputs, decoder_inputs),
  }
