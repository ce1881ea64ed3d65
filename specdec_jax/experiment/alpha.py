"""MODE='alpha': α as Corollary 3.6 measures it, without walltimes.

Sample from the target, then average β = Σ_x min(p(x), q(x)) over the
positions of those samples (`alpha.json`): cheap enough to run for many
(task, draft, temperature) settings.
"""
from typing import Any, Dict

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.metrics import analysis
from specdec_jax.core import decoding
from specdec_jax import multihost
from specdec_jax.core import sampling
from specdec_jax.experiment import arguments
from specdec_jax.core.models import T5Model


@jax.jit
def beta_per_position(target: T5Model, draft: T5Model, inputs, outputs, lengths,
                      method: sampling.SamplingMethod):
  """β_t = Σ_x min(p_t(x), q_t(x)) along target-generated outputs [B, T].

  Both models read the same teacher-forced prefixes (the target's samples),
  so β_t is Definition 3.1's β at position t of a target sequence.

  Returns (beta [B, T], valid [B, T]) with valid = positions < lengths [B].
  """
  decoder_inputs = jnp.pad(outputs[:, :-1], ((0, 0), (1, 0)))
  valid = jnp.arange(outputs.shape[1])[None, :] < lengths[:, None]
  ones = jnp.ones_like(outputs)
  logits_p = target.teacher_forced_logits(inputs, decoder_inputs, ones)
  # A shared-encoder draft (`SharedEncoderModel`) reads the target's encoder.
  logits_q = draft.teacher_forced_logits(inputs, decoder_inputs, ones)
  p = method.standardize(logits_p)
  q = method.standardize(logits_q)
  return sampling.acceptance_beta(p, q), valid


def sampled_betas(args: arguments.RunArguments, feed: multihost.Feeder,
                  target: T5Model, draft: T5Model) -> np.ndarray:
  """[positions] β at every position of target samples, over all batches."""
  rng = jax.random.PRNGKey(args.seed)
  method = args.method()
  betas = []
  for i, (batch, keep) in enumerate(feed.batches()):
    out = decoding.temperature_sample(target, batch, jax.random.fold_in(rng, i),
                                      max_decode_length=args.max_decode_length,
                                      method=method)
    beta, valid = beta_per_position(target, draft, batch, out.tokens,
                                    out.lengths, method)
    beta, valid = multihost.to_host((beta, valid))  # every row
    beta, valid = np.asarray(beta)[keep], np.asarray(valid)[keep]
    betas.append(beta[valid])
  return np.concatenate(betas)


def alpha_record(args: arguments.RunArguments, betas: np.ndarray,
                 num_examples: int, data_info: Dict[str, Any],
                 settings: Dict[str, Any]) -> Dict[str, Any]:
  """alpha.json: Corollary 3.6's α (mean β) with its standard error."""
  mean, stderr = analysis.alpha_from_beta_samples(betas)
  return {
      "task": args.label,
      "target_model": args.target_name,
      "draft_model": args.draft_name,
      "temperature": args.temperature,
      "top_k": args.top_k,
      "top_p": args.top_p,
      "num_examples": num_examples,
      "num_positions": int(betas.size),
      "alpha_beta": mean,
      "alpha_beta_stderr": stderr,
      "random_weights": args.random_weights,
      **data_info,
      "settings": settings,
  }
