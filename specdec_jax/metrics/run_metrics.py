"""metrics.json's one schema, `RunMetrics`: `run` writes `to_dict()`,
readers call `load` / `RunMetrics.from_dict`, which checks every known key
(`MetricsError` naming the key and the value), fills the keys older files
lack with their defaults and ignores unknown ones. tools/generate_docs.py
writes docs/usage/outputs.md from this class and its docstring. The file
names of a run folder live here too.
"""
import dataclasses
import json
import math
from typing import Any, Dict, List, Mapping, Optional

METRICS_FILE = "metrics.json"  # `RunMetrics`, written last: "done"
PREDICTIONS_FILE = "predictions.jsonl"  # one record per example
ALPHA_FILE = "alpha.json"  # MODE='alpha': Corollary 3.6's estimate
INFER_FILE = "infer.json"  # MODE='infer': what was decoded, how fast

# predictions.jsonl's `inputs`: the example's features as T5X names them
# (t5x/infer.py writes a task's `*_pretokenized` features).
INPUTS_FEATURE = "inputs_pretokenized"
TARGETS_FEATURE = "targets_pretokenized"

# One name per formula: the summary (stdout), `run`'s log line (stderr) and
# the report print a theory number with its name, docs/usage/outputs.md
# defines each under its key.
MEASURED_THEORY_NAME = "Theorem 3.8 at the measured call cost"
IDEAL_THEORY_NAME = "Theorem 3.8 at call cost 1 (the paper's ideal)"
THEORY_NAMES = {
    "theoretical_speedup_measured_call_cost": MEASURED_THEORY_NAME,
    "theoretical_speedup": IDEAL_THEORY_NAME,
}
# ACCEPTANCE='tree': `theoretical_speedup_measured_call_cost` holds this.
TREE_THEORY_NAME = "the tree's cost model at the measured call cost"
# metrics.json's `alpha` (and infer.json's), wherever it is printed.
ALPHA_NAME = "kept guesses / acceptance trials"


class MetricsError(ValueError):
  """A metrics.json that does not follow `RunMetrics` (names the key)."""


# What a key may hold (the words are those of the error message).
NAME = "a non-empty string"
TEXT = "a string"
INT = "an integer >= 0"
POS_INT = "an integer >= 1"
NONNEG = "a number >= 0"
NUMBER = "a number"  # a fitted value, which noise may make negative
POS = "a number > 0"
PROB = "a number in [0, 1]"
FRACTION = "a number in (0, 1]"
BOOL = "true or false"
OBJECT = "a JSON object"
COUNTS = "a list of integers >= 0"
BLEU = '{"baseline": number, "speculative": number}'
ROUGE = ('{"baseline": {name: number}, "speculative": {name: number}}')
SPEEDUPS = ('{"fixed_gamma_speedup": number, "achieved_speedup": number, '
            '"oracle_speedup": number} (null: no iterations)')

_REQUIRED = dataclasses.MISSING


def _key(kind: str, default: Any = _REQUIRED, *, omit_none: bool = False):
  """A field: its kind, its default for older files (none: required), and
  whether `to_dict` leaves it out when None."""
  return dataclasses.field(default=default, metadata={
      "kind": kind,
      "omit_none": omit_none
  })


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunMetrics:
  """One walltime run of `run` (`metrics.json`).

  Fields without a default are in every metrics.json ever written; the others
  default to what a file written before they existed means (None: not recorded).
  Walltimes exclude compilation (every decoder is compiled and run on each input
  width first; calls end with `block_until_ready`).

  Attributes:
    task: the task's label (TASK, else the seqio task, else 'local').
    target_model: TARGET_NAME, the target's label ('' when unset).
    draft_model: the label the report groups runs by: DRAFT_NAME for the draft
      model, else the drafter ('bigram', '1m+prompt_lookup'), followed by '
      adaptive t', ' auto-γ' or ' l=0.5' for those variants.
    gamma: γ, guesses per target call (GAMMA='auto': the chosen one).
    temperature: sampling temperature (0: greedy).
    top_k: top-k of the sampling (0: off).
    top_p: top-p of the sampling (1: off).
    batch_size: rows decoded together (BATCH_SIZE; the paper: 1).
    alpha: α̂, "kept guesses / acceptance trials" wherever it is printed (the
      summary, the log, the report's α column): the guesses kept in the output
      over the acceptance tests whose context reached the output (a call that
      kept n < γ guesses ran n + 1 tests, one that kept all γ ran γ; tests past
      the output's end, EOS or the length limit, are not counted). Not the share
      of drafted guesses kept, Σ n·h[n] / (γ·Σ h[n]) of `accepted_histogram` h,
      which is lower: a call stops testing at its first rejection.
      ACCEPTANCE='tree' and DECODE='beam': along the kept path, min(n + 1, γ)
      trials per call that kept n (with k branches it exceeds one branch's α).
    alpha_beta: mean of β = Σ min(p, q) over the positions visited (Corollary
      3.6), another estimate of the same α; null for ACCEPTANCE='tree' (the tree
      loop computes no β).
    alpha_stderr: standard error of α estimated from `accepted_histogram` alone
      (`analysis.alpha_from_acceptance_counts`: min(n + 1, γ) trials per call,
      each output's last call included, so its α is a little lower than
      `alpha`'s).
    accepted_histogram: [γ + 1] target calls that kept n = 0..γ guesses.
    num_examples: examples decoded.
    tokens_generated: tokens of the speculative outputs.
    tokens_generated_baseline: tokens of the target-alone outputs.
    target_calls_baseline: target calls of the target alone (one a token).
    target_calls_speculative: target calls of speculative decoding.
    tokens_per_target_call: tokens_generated / target_calls_speculative.
    walltime_baseline_s: seconds the target alone took for all examples.
    walltime_speculative_s: seconds speculative decoding took.
    speedup: walltime_baseline_s / walltime_speculative_s.
    compile_time_s: seconds spent compiling and warming up both decoders.
    target_step_s: one one-token target call (`timing.call_seconds`: 32 calls in
      one compiled loop, fewer at a batch over 16 rows, 5 rounds interleaved
      with the drafter's guesses and the verification call, median).
    draft_step_s: one guess as the loop makes it: a `propose` of γ guesses (a
      draft model's γ steps with their sampling and bookkeeping, state rolled
      back each call), divided by γ; ACCEPTANCE='tree': one `propose_tree` of k
      branches (and its rollback to one), divided by γ.
    cost_coefficient_c: c = draft_step_s / target_step_s (Definition 3.7; the
      median of the per-round ratios); null for DECODE='beam' (not priced, as
      are the step and call seconds and the theory keys below: Theorem 3.8
      models one sampled sequence, not a beam search) and with
      PRICE_CALL_COST=False.
    call_cost_priced: false when PRICE_CALL_COST=False skipped pricing the calls
      after the decode: c, the step and call seconds, the overheads and every
      theory key are then null, and the summary gives no theory (absent when
      priced, and for DECODE='beam', which is never priced).
    theoretical_speedup: "Theorem 3.8 at call cost 1 (the paper's ideal)": (1 −
      α^(γ+1)) / ((1 − α)(γc + 1)) at the measured α, γ and c, the (γ+1)-token
      verification call costing one target step as the theorem assumes
      (ACCEPTANCE='tree': still the one-branch formula, a reference, not the
      tree's prediction); null for DECODE='beam'.
    verification_call_s: the target's (γ+1)-token verification call
      (ACCEPTANCE='tree': the tree call over 1 + k·γ nodes).
    verification_cost_ratio: verification_call_s / target_step_s, the median of
      the per-round ratios (Theorem 3.8 assumes 1).
    theoretical_speedup_measured_call_cost: "Theorem 3.8 at the measured call
      cost": the same with verification_cost_ratio in place of 1, (1 − α^(γ+1))
      / ((1 − α)(γc + verification_cost_ratio)); the theory the summary and the
      log print beside the speedup (ACCEPTANCE='tree': "the tree's cost model at
      the measured call cost", tokens_per_target_call / (γ·c +
      verification_cost_ratio)).
    iteration_overhead: speculative walltime per target call (each example's
      fixed cost included) over its parts, γ·draft_step_s + verification_call_s:
      1 = the loop costs nothing beyond its model calls.
    baseline_overhead: the target alone's walltime per token (fixed cost
      included) over target_step_s.
    theory_tokens_per_call: Equation (1) at the measured α and γ (token and
      block verification; null for trees and beams).
    theory_tokens_per_call_with_ends: the same with each output's last call cut
      at its end (`analysis.expected_tokens_per_call_with_ends`).
    efficiency_split: {"sentence_ends", "acceptance", "output_lengths",
      "batch", "time"}: factors whose product is speedup /
      theoretical_speedup_measured_call_cost (`overheads.efficiency_split`):
      the sentence ends' cost in tokens per call, measured tokens per call over
      the i.i.d. prediction with ends, the baseline's tokens over the
      speculative ones, what waiting for a batch's slowest row costs
      (`overheads.batch_factor`: rows' calls per loop iteration, speculative
      over baseline; 1 at batch 1), and the rest, baseline_overhead /
      iteration_overhead / batch: each loop's walltime per iteration over its
      model calls' (files before 2026-12-02: no "batch", which "time" held).
      ACCEPTANCE='tree': "output_lengths", "batch" and "time" only (its
      model reads the measured tokens per call; none before 2026-12-02).
    fixed_cost_per_example_s: {"baseline", "speculative"}: each decoder's
      walltime per example that does not grow with its loop's iterations
      (dispatch, both encoders, set-up): the intercept of a least-squares line
      of each batch's seconds against its iterations, over its rows; null with
      fewer than 3 batches or a single iteration count. A fitted intercept, not
      a measured time: it can be negative (timing noise, or batches whose
      seconds do not grow in a straight line), and then means "no fixed cost
      measurable", not a gain.
    marginal_baseline_overhead: that line's slope for the baseline (one more
      token) / target_step_s: baseline_overhead without the fixed cost.
    marginal_iteration_overhead: the speculative line's slope (one more
      iteration) / (γ·draft_step_s + verification_call_s): iteration_overhead
      without the fixed cost.
    greedy_outputs_identical: at T = 0, whether every example's speculative
      tokens equal the target's, which exact speculative decoding guarantees;
      null at T > 0, where outputs are samples, compared by distribution instead
      (the chi-square tests of tests/core/test_decoding.py, and alpha vs
      alpha_beta).
    greedy_identical_examples: at T = 0, how many examples are identical.
    bleu: {"baseline", "speculative"} corpus BLEU (translation tasks; bleu
      and rouge are absent when the examples have no references).
    rouge: {"baseline", "speculative"} -> {rouge type: F-measure} (summarization
      tasks).
    quality_noise: at T > 0 with BLEU: {"metric": "bleu", "difference":
      speculative − baseline, "p_value", "resamples"}: sacrebleu's paired
      bootstrap test of that difference over the examples. At T > 0 the two
      outputs are different samples, so their BLEU differs by sampling noise
      (exact speculative decoding samples the target's distribution); a small
      p_value on an exact run would say otherwise. Absent at T = 0, for ROUGE
      and in older files.
    random_weights: true when a checkpoint path is unset (α, speedup and quality
      then mean nothing).
    backend: JAX's backend ('cpu', 'gpu', 'tpu').
    device_kind: the first device's kind.
    num_devices: devices over all hosts.
    machine: what ran it, as `auto`'s price cache keys its prices: {"host",
      "cpu" (vendor, family, model and stepping: a model name alone, "AMD
      EPYC", names processor kinds of different instruction sets), "cpus"
      (those the process may use), "backend", "device_kind", "devices",
      "jax", "cpu_kernel" (the instruction set the CPU kernel ran,
      SPECDEC_JAX_KERNEL_ISA's cap applied; false: off; null: not a CPU
      run)}. Absent in older files.
    decode_paths: {"target", "draft"}: the decode path each model ran on,
      'xla', 'cpu_kernel', 'packed' or 'fused' (docs/usage/gpu.md, "Decode
      path"): TARGET_DECODE_PATH / DRAFT_DECODE_PATH, or the backend's where
      None; the draft's null without a T5 draft model (the n-gram, prompt
      lookup and feature drafters, SPECULATION='off'). alpha.json and
      infer.json record it too.
    synthetic: true for numbers that are not model measurements (fixtures).
    num_examples_requested: NUM_EXAMPLES (more than num_examples when the data
      has fewer).
    inputs_length: TASK_FEATURE_LENGTHS['inputs'].
    inputs_truncated: inputs longer than inputs_length (cut to their first
      inputs_length - 1 tokens plus EOS).
    longest_input_tokens: the longest input, EOS included, before cutting.
    settings: what the OVERWRITE rule compares: every run argument but
      OUTPUT_DIR / OVERWRITE / MODE / PRICE_CALL_COST, both model configs
      (DRAFTER='feature': the draft's own feature_config.json), the vocabulary.
    drafter: DRAFTER ('model' before the option existed).
    drafter_settings: the drafter's own settings (`DrafterSpec.record`).
    lenience: Appendix A.5's l (1: exact).
    acceptance: ACCEPTANCE, how the target verified the guesses: 'token'
      (Algorithm 1), 'block' (block verification) or 'tree' (tree verification);
      all exact.
    tree_width: ACCEPTANCE='tree': TREE_WIDTH, k draft branches per target call
      (absent for other runs).
    tree_without_replacement: ACCEPTANCE='tree': TREE_WITHOUT_REPLACEMENT,
      whether the k first guesses were drawn without replacement at T > 0
      (absent for other runs).
    exact: false when lenience < 1 (outputs not the target's distribution).
    adaptive_threshold: ADAPTIVE_THRESHOLD (null: γ guesses every call).
    gamma_auto: GAMMA='auto''s pilot measurements and choice (else null;
      SPECULATION='auto''s choice limited to the run's mode); ACCEPTANCE='tree'
      with GAMMA and/or TREE_WIDTH 'auto': also the chosen k
      (`chosen_tree_width`), the acceptance and c by k, the tree call's cost by
      nodes and the predicted speedup of every (γ, k); both:
      `batch_factor_by_gamma` [γ = 1 ..], what rows waiting for a batch's
      slowest cost each γ (multiplied into its prediction; 1 at batch 1;
      none before 2026-12-02, for trees before that day's second change);
      `calibration` (the timed pilot's measured and modelled speedup, κ and
      the overhead per call in every prediction), `chosen_predicted_speedup`
      and `chosen_model_speedup` (the choice's, with and without it; none
      before that day's third change).
    guesses_per_target_call: real guesses made per target call (≤ γ;
      ACCEPTANCE='tree': k·γ; DECODE='beam': γ·u draft beam nodes).
    per_iteration_gamma: §3.5's bound, Theorem 3.8's cost model on the run's own
      iterations: {fixed_gamma_speedup (γ guesses every call), achieved_speedup
      (the guesses made), oracle_speedup (exactly the guesses kept)}; null for
      ACCEPTANCE='tree' and DECODE='beam' (a one-sequence model).
    decode: DECODE, what both decoders searched for: 'sample' (sampling or
      greedy decoding) or 'beam' (beam search: the baseline the target's own,
      the speculative run speculative beam search; outputs are the top beams,
      `greedy_outputs_identical` compares them; a "guess" is a draft beam step:
      accepted_histogram counts the calls that kept n of the γ draft steps,
      alpha is kept / trials as for a tree run).
    beam_size: DECODE='beam': BEAM_SIZE, k (absent for other runs).
    beam_alpha: DECODE='beam': BEAM_ALPHA, the brevity penalty's exponent.
    beam_width: DECODE='beam': u, the draft's beam width (BEAM_WIDTH).
    beam_rows: DECODE='beam': the candidate rows per target call (BEAM_ROWS).
    steps_per_target_call: DECODE='beam': beam-search steps per speculative
      target call (the baseline: 1), over the batch elements still searching.
    speculation: 'off' when the target alone decoded (SPECULATION='off', or
      'auto' chose it: only the baseline decoder ran, its output and seconds are
      the speculative columns, speedup 1 by definition); 'auto' when
      SPECULATION='auto' chose a speculative mode (absent: 'on').
    auto: SPECULATION='auto': `choice` (mode, γ, k, predicted speedup), `reason`
      (the stdout line `auto: ...`), `candidates` (each mode, γ, k with its
      predicted speedup and the α, c, call cost, tokens per call and, for
      chains and trees, `batch_factor` it used), `pilots` (α per mode, each from a pilot
      decode sized by its 95% interval; one tree pilot at the widest k, with
      every k's a_1 in `first_depth_by_width`; a chain or tree pilot's
      `batch_factor_by_gamma`: what rows waiting for a batch's slowest cost each
      γ, replayed from its accepted counts as a chain's, 1 at batch 1; none
      before 2026-12-02, for trees before that day's second change), `prices` (the measured call costs, whether they
      were `cached`, and `target_cached`: the target's calls from an entry of
      another draft or method), `calibration` (the timed chain pilot's measured
      and modelled speedup, κ, their ratio, and `overhead_steps`, the loop's own
      work per target call that κ implies, added to every chain prediction's
      call), `tree_calibration` (the same for the tree pilot and the tree
      predictions), `min_gain` and the seconds the choice took; `segments`, the
      batches each choice decoded in a row (label, mode, γ, k, first batch,
      batches, examples, its predicted and measured speedup with its 95%
      interval, both decoders' seconds, α by the pilots' estimator, its [γ + 1]
      histogram, target calls, tokens per call, seconds compiling it), and
      `switches`, each re-choice between batches (after which batch, from and
      to, the measured speedup and interval against the prediction, the measured
      α, κ = the cost model's measured error for the choice's family and the
      `overhead_steps` it implies, the candidates predicted again, each with its
      `basis`, the `auto:` line) (absent for other runs). How the other keys
      cover the batches of a run that switched: docs/usage/running.md.
  """
  task: str = _key(NAME)
  target_model: str = _key(TEXT)
  draft_model: str = _key(TEXT)
  gamma: int = _key(POS_INT)
  temperature: float = _key(NONNEG)
  top_k: int = _key(INT, 0)
  top_p: float = _key(FRACTION, 1.0)
  batch_size: int = _key(POS_INT, 1)
  alpha: float = _key(PROB)
  alpha_beta: Optional[float] = _key(PROB, None)
  alpha_stderr: Optional[float] = _key(NONNEG, None)
  accepted_histogram: Optional[List[int]] = _key(COUNTS, None)
  num_examples: int = _key(INT)
  tokens_generated: int = _key(INT)
  tokens_generated_baseline: Optional[int] = _key(INT, None)
  target_calls_baseline: int = _key(INT)
  target_calls_speculative: int = _key(INT)
  tokens_per_target_call: Optional[float] = _key(NONNEG, None)
  walltime_baseline_s: float = _key(NONNEG)
  walltime_speculative_s: float = _key(NONNEG)
  speedup: float = _key(POS)
  compile_time_s: Optional[float] = _key(NONNEG, None)
  target_step_s: Optional[float] = _key(NONNEG, None)
  draft_step_s: Optional[float] = _key(NONNEG, None)
  cost_coefficient_c: Optional[float] = _key(NONNEG, None)
  call_cost_priced: Optional[bool] = _key(BOOL, None, omit_none=True)
  theoretical_speedup: Optional[float] = _key(POS, None)
  verification_call_s: Optional[float] = _key(NONNEG, None)
  verification_cost_ratio: Optional[float] = _key(NONNEG, None)
  theoretical_speedup_measured_call_cost: Optional[float] = _key(POS, None)
  iteration_overhead: Optional[float] = _key(NONNEG, None)
  baseline_overhead: Optional[float] = _key(NONNEG, None)
  theory_tokens_per_call: Optional[float] = _key(NONNEG, None, omit_none=True)
  theory_tokens_per_call_with_ends: Optional[float] = _key(
      NONNEG, None, omit_none=True)
  efficiency_split: Optional[Dict[str, float]] = _key(OBJECT, None,
                                                      omit_none=True)
  fixed_cost_per_example_s: Optional[Dict[str, float]] = _key(
      OBJECT, None, omit_none=True)
  marginal_baseline_overhead: Optional[float] = _key(NUMBER, None,
                                                     omit_none=True)
  marginal_iteration_overhead: Optional[float] = _key(NUMBER, None,
                                                      omit_none=True)
  greedy_outputs_identical: Optional[bool] = _key(BOOL, None)
  greedy_identical_examples: Optional[int] = _key(INT, None)
  bleu: Optional[Dict[str, float]] = _key(BLEU, None, omit_none=True)
  rouge: Optional[Dict[str, Dict[str, float]]] = _key(ROUGE, None,
                                                      omit_none=True)
  quality_noise: Optional[Dict[str, Any]] = _key(OBJECT, None, omit_none=True)
  random_weights: Optional[bool] = _key(BOOL, None)
  backend: Optional[str] = _key(TEXT, None)
  device_kind: Optional[str] = _key(TEXT, None)
  num_devices: Optional[int] = _key(POS_INT, None)
  machine: Optional[Dict[str, Any]] = _key(OBJECT, None, omit_none=True)
  decode_paths: Optional[Dict[str, Any]] = _key(OBJECT, None, omit_none=True)
  synthetic: bool = _key(BOOL, False)
  num_examples_requested: Optional[int] = _key(INT, None)
  inputs_length: Optional[int] = _key(INT, None)
  inputs_truncated: Optional[int] = _key(INT, None)
  longest_input_tokens: Optional[int] = _key(INT, None)
  settings: Optional[Dict[str, Any]] = _key(OBJECT, None)
  drafter: str = _key(NAME, "model")
  drafter_settings: Optional[Dict[str, Any]] = _key(OBJECT, None)
  lenience: float = _key(FRACTION, 1.0)
  acceptance: str = _key(NAME, "token")
  tree_width: Optional[int] = _key(POS_INT, None, omit_none=True)
  tree_without_replacement: Optional[bool] = _key(BOOL, None, omit_none=True)
  exact: bool = _key(BOOL, True)
  adaptive_threshold: Optional[float] = _key(PROB, None)
  gamma_auto: Optional[Dict[str, Any]] = _key(OBJECT, None)
  guesses_per_target_call: Optional[float] = _key(NONNEG, None)
  per_iteration_gamma: Optional[Dict[str,
                                     Optional[float]]] = _key(SPEEDUPS, None)
  decode: str = _key(NAME, "sample")
  beam_size: Optional[int] = _key(POS_INT, None, omit_none=True)
  beam_alpha: Optional[float] = _key(NONNEG, None, omit_none=True)
  beam_width: Optional[int] = _key(POS_INT, None, omit_none=True)
  beam_rows: Optional[int] = _key(POS_INT, None, omit_none=True)
  steps_per_target_call: Optional[float] = _key(NONNEG, None, omit_none=True)
  speculation: Optional[str] = _key(NAME, None, omit_none=True)
  auto: Optional[Dict[str, Any]] = _key(OBJECT, None, omit_none=True)

  @classmethod
  def from_dict(cls, data: Any) -> "RunMetrics":
    """A metrics.json's object checked and normalized, older files given the
    defaults; MetricsError names a missing key or a wrong value."""
    if not isinstance(data, dict):
      raise MetricsError(
          "not a speculative-decoding metrics file (expected a JSON object, "
          f"got {type(data).__name__})")
    fields = dataclasses.fields(cls)
    missing = [
        f.name for f in fields if f.default is _REQUIRED and f.name not in data
    ]
    if missing:
      raise MetricsError("not a speculative-decoding metrics file (missing "
                         f"required keys: {', '.join(missing)})")
    values = {}
    for f in fields:
      if f.name in data:
        values[f.name] = _checked(f.name, data[f.name], f.metadata["kind"],
                                  optional=f.default is not _REQUIRED)
    return cls(**values)

  def to_dict(self) -> Dict[str, Any]:
    """metrics.json's object: every key in field order (omit_none ones
    only when set)."""
    out = {}
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if value is None and f.metadata["omit_none"]:
        continue
      out[f.name] = value
    return out


def speculation_keys(speculation: str,
                     auto: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
  """metrics.json's (and infer.json's) `speculation` (unless 'on') and
  `auto` (when given) keys."""
  out: Dict[str, Any] = {}
  if speculation != "on":
    out["speculation"] = speculation
  if auto is not None:
    out["auto"] = dict(auto)
  return out


def switched(auto: Optional[Mapping[str, Any]]) -> bool:
  """Whether an `auto` record (metrics.json's) switched choices."""
  return bool(auto and auto.get("switches"))


def load(text: str) -> RunMetrics:
  """A metrics.json's text, checked; MetricsError: not JSON, or not a
  `RunMetrics`."""
  try:
    data = json.loads(text)
  except ValueError as e:
    raise MetricsError(f"not valid JSON ({e})") from None
  return RunMetrics.from_dict(data)


# -- Checking one value -------------------------------------------------------
def is_number(v: Any) -> bool:
  """A finite int or float (not a bool)."""
  return (isinstance(v, (int, float)) and not isinstance(v, bool) and
          math.isfinite(v))


def _number(value: Any, kind: str) -> Any:
  """The value normalized to a number `kind` allows, or None."""
  if not is_number(value):
    return None
  if kind in (INT, POS_INT):
    if not float(value).is_integer():
      return None
    value = int(value)
    return value if value >= (1 if kind == POS_INT else 0) else None
  value = float(value)
  ok = {
      NUMBER: True,
      NONNEG: value >= 0,
      POS: value > 0,
      PROB: 0 <= value <= 1,
      FRACTION: 0 < value <= 1
  }[kind]
  return value if ok else None


def _sides_ok(value: Any, side_ok) -> bool:
  """A {"baseline", "speculative"} object whose two values pass side_ok."""
  return isinstance(value, dict) and all(
      side_ok(value.get(s)) for s in ("baseline", "speculative"))


_SPEEDUP_NAMES = ("fixed_gamma_speedup", "achieved_speedup", "oracle_speedup")
# The kinds that are kept as they are when they pass.
_PLAIN = {
    NAME: lambda v: isinstance(v, str) and bool(v),
    TEXT: lambda v: isinstance(v, str),
    BOOL: lambda v: isinstance(v, bool),
    OBJECT: lambda v: isinstance(v, dict),
    BLEU: lambda v: _sides_ok(v, is_number),
    ROUGE: lambda v: _sides_ok(
        v, lambda s: isinstance(s, dict) and bool(s) and all(
            is_number(x) for x in s.values())),
    SPEEDUPS: lambda v: isinstance(v, dict) and set(_SPEEDUP_NAMES) <= set(v)
              and all(v[n] is None or _number(v[n], NONNEG) is not None
                      for n in _SPEEDUP_NAMES),
}


def _checked(key: str, value: Any, kind: str, optional: bool) -> Any:
  """`value` normalized to `kind`; None stays None where the key has a
  default (older writers; non-finite numbers, written as null)."""
  if value is None and optional:
    return None
  if kind in _PLAIN:
    if _PLAIN[kind](value):
      return value
  elif kind == COUNTS:
    if isinstance(value, list) and all(
        _number(v, INT) is not None for v in value):
      return [int(v) for v in value]
  elif _number(value, kind) is not None:
    return _number(value, kind)
  raise MetricsError(f"key {key!r} must be {kind}, got {value!r}")


def as_mapping(metrics: RunMetrics, data: Mapping[str, Any]) -> Dict[str, Any]:
  """`data` (a metrics.json's object) with `metrics`' checked values and
  defaults in place: what the report reads."""
  return {**data, **metrics.to_dict()}
