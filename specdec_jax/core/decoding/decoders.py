"""Decoders checked once: the entry points a run calls batch after batch.

`temperature_sample` and `speculative_sample` check every argument on the
host at every call (`decoding.checks`): right for a direct caller, wasted in
a run that decodes thousands of batches with the same models and settings
(the checks copy the batch to the host and flatten both models' pytrees
inside the timed region). `baseline_decoder` and `speculative_decoder` run
the same checks once, when they are built, and return a function of the
batch alone that calls the jitted loop directly, the models' and settings'
arrays flattened once (`LoopProgram.bound`).
"""
from typing import Any, Callable, Optional

import jax
import numpy as np

from specdec_jax.core import sampling
from specdec_jax.core.acceptance import ExactAcceptance
from specdec_jax.core.decoding import loops
from specdec_jax.core.decoding.programs import token_batch
from specdec_jax.core.decoding.checks import as_drafter
from specdec_jax.core.decoding.checks import check_eos_id
from specdec_jax.core.decoding.checks import check_settings
from specdec_jax.core.decoding.checks import check_speculative_args
from specdec_jax.core.decoding.checks import check_target
from specdec_jax.core.decoding.checks import resolve_method
from specdec_jax.core.protocols import AcceptanceRule
from specdec_jax.core.protocols import Target

# (encoder_input_tokens [B, S] int32, rng) -> `DecodeOutput` or
# `SpeculativeOutput`. The batch is not checked: it must hold ids in
# [0, vocab_size) (a run's batches come from its own vocabulary).
Decoder = Callable[[jax.Array, jax.Array], Any]


def baseline_decoder(target: Target, *, max_decode_length: int,
                     method: sampling.SamplingMethod,
                     eos_id: int = loops.EOS_ID) -> Decoder:
  """`temperature_sample` with its settings checked now, not per call.

  Raises:
    ValueError naming the bad argument.
  """
  check_settings(max_decode_length=max_decode_length)
  method = resolve_method(method)
  check_target(target)
  check_eos_id(eos_id)
  program = loops.BASELINE_PROGRAM.bound(
      target, eos_id=np.int32(eos_id), max_decode_length=int(max_decode_length),
      method=method)

  def decode(encoder_input_tokens: jax.Array, rng: jax.Array):
    return program(token_batch(encoder_input_tokens), rng)

  return decode


def speculative_decoder(target: Target, drafter: Any, *, gamma: int,
                        max_decode_length: int, method: sampling.SamplingMethod,
                        acceptance: Optional[AcceptanceRule] = None,
                        eos_id: int = loops.EOS_ID,
                        statistics: bool = True) -> Decoder:
  """`speculative_sample` with its settings checked now, not per call.

  Args: as `speculative_sample`'s, less the batch and the rng.

  Raises:
    ValueError naming the bad argument.
  """
  drafter = as_drafter(drafter)
  method = check_speculative_args(target, drafter, gamma=gamma,
                                  max_decode_length=max_decode_length,
                                  method=method, temperature=None, top_k=None,
                                  top_p=None, acceptance=acceptance)
  check_eos_id(eos_id)
  if not isinstance(statistics, bool):
    raise ValueError(f"statistics must be True or False, got {statistics!r}.")
  program = loops.SPECULATIVE_PROGRAM.bound(
      target, drafter, eos_id=np.int32(eos_id), gamma=int(gamma),
      max_decode_length=int(max_decode_length), method=method,
      acceptance=ExactAcceptance() if acceptance is None else acceptance,
      statistics=statistics)

  def decode(encoder_input_tokens: jax.Array, rng: jax.Array):
    return program(token_batch(encoder_input_tokens), rng)

  return decode
