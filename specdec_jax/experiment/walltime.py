"""MODE='walltime': both decoders timed over the examples (the paper's
experiment), the cost coefficient c, and the `RunMetrics` they make.

The steps, in order: compile every decoder for every input width
(`compile_decoders`); decode each batch with the target alone and with
speculative decoding, timing each call (`decode_examples`); time one target
step, one draft step (or one guess) and the (γ+1)-token verification call
the one way `timing` defines (`step_times`); put it together
(`walltime_metrics`).
"""
import dataclasses
import time
from typing import Any, Callable, Dict, List, Optional

from absl import logging
import jax
import numpy as np

from specdec_jax import analysis
from specdec_jax import multihost
from specdec_jax import run_metrics
from specdec_jax import timing
from specdec_jax.experiment import arguments
from specdec_jax.experiment import drafting
from specdec_jax.experiment import traces

# A decoder as `run.Experiment._decoders` makes it: (batch [B, S], rng) ->
# output (`decoding.DecodeOutput` / `SpeculativeOutput`).
Decoder = Callable[[jax.Array, jax.Array], Any]


@dataclasses.dataclass(frozen=True)
class Decoded:
  """Both decoders' outputs over all examples (N of them, T = max decode
  length), on the host.

  Attributes:
    base_tokens: [N, T] the target alone's tokens (0 after EOS).
    spec_tokens: [N, T] speculative decoding's tokens.
    per_example: N predictions.jsonl records (`traces.traces`).
    time_base / time_spec: seconds of all timed calls of each decoder.
    calls_base / calls_spec: target calls of each decoder.
    histogram: [γ + 1] target calls that kept n = 0..γ guesses.
    beta_sum / beta_count: Σ β and the acceptance trials it is over.
  """
  base_tokens: np.ndarray
  spec_tokens: np.ndarray
  per_example: List[Dict[str, Any]]
  time_base: float
  time_spec: float
  calls_base: int
  calls_spec: int
  histogram: np.ndarray
  beta_sum: float
  beta_count: float

  @property
  def tokens_generated(self) -> int:
    return int(np.sum(self.spec_tokens != 0))

  @property
  def alpha(self) -> float:
    """Kept guesses / acceptance trials (beta_count counts the trials whose
    context reached the output, so guesses cut by EOS are not counted)."""
    kept = float(np.arange(len(self.histogram)) @ self.histogram)
    return kept / max(self.beta_count, 1.0)

  @property
  def alpha_beta(self) -> float:
    return self.beta_sum / max(self.beta_count, 1.0)


@dataclasses.dataclass(frozen=True)
class StepTimes:
  """Seconds of one call of each kind (`timing.call_seconds`).

  Attributes:
    target_step_s: one one-token target call.
    draft_step_s: one one-token draft call (other drafters: one guess).
    verification_call_s: the target's (γ+1)-token call.
  """
  target_step_s: float
  draft_step_s: float
  verification_call_s: float

  @property
  def cost_coefficient(self) -> float:
    """c of Definition 3.7."""
    return self.draft_step_s / self.target_step_s


def compile_decoders(feed: multihost.Feeder, baseline: Decoder,
                     speculative: Decoder, rng: jax.Array) -> float:
  """Compiles and runs both decoders once per input width; the seconds."""
  t0 = time.perf_counter()
  widths = feed.first_of_each_width()
  for b in widths:
    batch = feed.batch(b)
    jax.block_until_ready(baseline(batch, rng))
    jax.block_until_ready(speculative(batch, rng))
  compile_s = time.perf_counter() - t0
  logging.info(
      "Compiled and warmed up both decoders for input widths %s "
      "in %.1fs", [feed.batch_width(b) for b in widths], compile_s)
  return compile_s


def decode_examples(vocab, feed: multihost.Feeder, baseline: Decoder,
                    speculative: Decoder, rng: jax.Array, gamma: int,
                    on_batch: Optional[Callable[..., None]] = None) -> Decoded:
  """Both decoders on every batch (same rng per batch), each call timed.

  `on_batch(base_tokens [b, T], spec_tokens [b, T], records)` is called
  after each batch with its kept rows (predictions.jsonl as it goes).
  """
  base_tokens, spec_tokens, per_example = [], [], []
  time_base = time_spec = 0.0
  calls_base = calls_spec = 0
  histogram = np.zeros(gamma + 1, np.int64)
  beta_sum = beta_count = 0.0
  for i, (batch, keep) in enumerate(feed.batches()):
    brng = jax.random.fold_in(rng, i)
    out_b, dt_b = timing.timed(baseline, batch, brng)
    out_s, dt_s = timing.timed(speculative, batch, brng)
    out_b, out_s = multihost.to_host((out_b, out_s))  # every row
    time_base += dt_b
    time_spec += dt_s
    calls_base += int(np.sum(np.asarray(out_b.target_calls)[keep]))
    calls_spec += int(np.sum(np.asarray(out_s.target_calls)[keep]))
    histogram += np.asarray(out_s.accepted_histogram)[keep].sum(0)
    beta_sum += float(np.sum(np.asarray(out_s.beta_sum)[keep]))
    beta_count += float(np.sum(np.asarray(out_s.beta_count)[keep]))
    base_tokens.append(np.asarray(out_b.tokens)[keep])
    spec_tokens.append(np.asarray(out_s.tokens)[keep])
    records = traces.traces(vocab, out_s, keep)
    per_example.extend(records)
    if on_batch is not None:
      on_batch(base_tokens[-1], spec_tokens[-1], records)
    logging.info(
        "batch %d/%d: baseline %.3fs, speculative %.3fs (running speedup "
        "%.2fx)", i + 1, feed.num_batches, dt_b, dt_s,
        time_base / max(time_spec, 1e-9))
  return Decoded(np.concatenate(base_tokens), np.concatenate(spec_tokens),
                 per_example, time_base, time_spec, calls_base, calls_spec,
                 histogram, beta_sum, beta_count)


def step_times(args: arguments.RunArguments, drafter, target, draft,
               batch: jax.Array, fill: int) -> StepTimes:
  """One target step, one draft step (or guess) and the verification call
  (this process's seconds: `slowest`).

  All are timed the one way `timing` defines, interleaved
  (`drafting.call_seconds`): on `batch`, with the speculative loop's cache
  (max_decode_length + γ + 1 slots) filled to `fill` tokens (the mean
  output length).
  """
  gamma = args.gamma
  by_k, t_draft = drafting.call_seconds(args, drafter, target, draft, batch,
                                        (1, gamma + 1), fill)
  t_target, t_verify = by_k[1], by_k[gamma + 1]
  return StepTimes(t_target, t_draft, t_verify)


def slowest(decoded: Decoded, compile_s: float, steps: StepTimes):
  """(decoded, compile_s, steps) with the slowest process's seconds (the
  user waits for it), exchanged in one collective."""
  (time_base, time_spec, compile_s, t_target, t_draft,
   t_verify) = multihost.slowest(decoded.time_base, decoded.time_spec,
                                 compile_s, steps.target_step_s,
                                 steps.draft_step_s, steps.verification_call_s)
  return (dataclasses.replace(decoded, time_base=time_base,
                              time_spec=time_spec), compile_s,
          StepTimes(t_target, t_draft, t_verify))


def walltime_metrics(
    args: arguments.RunArguments, decoded: Decoded,
    quality: Dict[str, Dict[str, Any]], compile_s: float, steps: StepTimes,
    data_info: Dict[str, Any], settings: Dict[str, Any],
    gamma_auto: Optional[Dict[str, Any]]) -> run_metrics.RunMetrics:
  """The run's metrics.json.

  Args:
    args: the run's arguments (GAMMA='auto': with the chosen γ).
    decoded: both decoders' outputs.
    quality: {'bleu' or 'rouge': {'baseline': ..., 'speculative': ...}}.
    compile_s: `compile_decoders`' seconds (the slowest process's).
    steps: `step_times`.
    data_info: the examples' counts (`run_metrics.RunMetrics`' data keys).
    settings: the run's settings record (`output_dir.settings_record`).
    gamma_auto: GAMMA='auto''s pilot and choice, or None.
  """
  gamma, c = args.gamma, steps.cost_coefficient
  alpha = decoded.alpha
  ratio = steps.verification_call_s / steps.target_step_s
  greedy = args.temperature == 0
  base, spec = decoded.base_tokens, decoded.spec_tokens
  tokens = decoded.tokens_generated
  return run_metrics.RunMetrics(
      task=args.label,
      target_model=args.target_name,
      gamma=gamma,
      temperature=args.temperature,
      top_k=args.top_k,
      top_p=args.top_p,
      batch_size=args.batch_size,
      alpha=float(alpha),
      alpha_beta=float(decoded.alpha_beta),
      alpha_stderr=float(
          analysis.alpha_standard_error_from_counts(decoded.histogram, gamma)),
      accepted_histogram=decoded.histogram.tolist(),
      num_examples=len(base),
      tokens_generated=tokens,
      tokens_generated_baseline=int(np.sum(base != 0)),
      target_calls_baseline=decoded.calls_base,
      target_calls_speculative=decoded.calls_spec,
      tokens_per_target_call=tokens / max(decoded.calls_spec, 1),
      walltime_baseline_s=decoded.time_base,
      walltime_speculative_s=decoded.time_spec,
      speedup=decoded.time_base / decoded.time_spec,
      compile_time_s=compile_s,
      target_step_s=steps.target_step_s,
      draft_step_s=steps.draft_step_s,
      cost_coefficient_c=c,
      theoretical_speedup=float(
          analysis.expected_speedup(min(alpha, 1.0), gamma, c)),
      verification_call_s=steps.verification_call_s,
      verification_cost_ratio=ratio,
      theoretical_speedup_measured_call_cost=float(
          analysis.expected_speedup(min(alpha, 1.0), gamma, c,
                                    call_cost=ratio)),
      # Token-for-token identity is the test of exactness at T = 0 only:
      # sampled outputs (T > 0) are compared by distribution (null here).
      greedy_outputs_identical=(bool(np.array_equal(base, spec))
                                if greedy else None),
      greedy_identical_examples=(int(np.sum(np.all(base == spec, axis=1)))
                                 if greedy else None),
      **quality,
      random_weights=args.random_weights,
      backend=jax.default_backend(),
      device_kind=jax.devices()[0].device_kind,
      num_devices=jax.device_count(),
      synthetic=False,
      **data_info,
      settings=settings,
      **drafting.drafting_metrics(args, decoded.per_example, tokens, c,
                                  gamma_auto))
