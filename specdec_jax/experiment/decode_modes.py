"""Decode modes: one object for each way a run decodes speculatively.

The registry beside the drafter registry (`drafter_registry`):

* `token`: Algorithm 1's token verification (LENIENCE < 1: Appendix A.5's
  lenient rule, not exact);
* `block`: block verification (exact, never fewer kept guesses);
* `tree`: tree verification over TREE_WIDTH draft branches;
* `beam`: speculative beam search (DECODE='beam': the target's own beam
  search, exactly);
* the target alone (`TargetAloneMode`, SPECULATION='off' or 'auto'
  choosing it): the run's baseline decoder in the speculative decoder's
  place, for any of the modes above.

A mode owns what differs between them: its checks, its acceptance rule, its
two decoders, the rows its caches hold, the pricing of its calls, its cost
model, its metrics keys and its label. The run picks one (`mode_of`), the
report and the summary read it back from metrics.json (`of_metrics`).
Outside this module no code compares ACCEPTANCE or DECODE to a string
(`tests/project/test_architecture.py`); a drafter declares the modes it supports
(`DrafterSpec.decode_modes`).
"""
import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core.decoding import beam_decoders
from specdec_jax.core.decoding import block_acceptance
from specdec_jax.core.decoding import outputs
from specdec_jax.experiment import beam_settings
from specdec_jax.experiment import drafter_registry
from specdec_jax.metrics import analysis
from specdec_jax.metrics import step_costs

Decoder = decoding.Decoder
# DECODE's values: sampling (each ACCEPTANCE) or beam search.
SAMPLE = "sample"
DECODES = (SAMPLE, "beam")
# SPECULATION's values: speculative decoding (the default), the target
# alone, or the run's choice between them (`auto_mode`).
SPECULATION_ON, SPECULATION_OFF, SPECULATION_AUTO = "on", "off", "auto"
SPECULATIONS = (SPECULATION_ON, SPECULATION_OFF, SPECULATION_AUTO)


@dataclasses.dataclass(frozen=True)
class DecodeMode:
  """What one decode mode means; subclasses override what differs.

  Attributes:
    name: its ACCEPTANCE value ('token', 'block', 'tree'), or 'beam'.
    description: a few words for error messages.
    one_path: each target call verifies one path of guesses: the run
      records guess traces and β, Theorem 3.8's per-iteration bound and
      the efficiency split (a tree or beam run counts kept guesses only).
    priced: c and Theorem 3.8 are priced (they model sampling one
      sequence, not beams).
    branches: TREE_WIDTH draft branches per call.
    beam: DECODE='beam'.
    own_settings: the run arguments only this mode records (a run of
      another mode drops them: earlier results stay the same run).
    exactness_tests: where the chi-square tests of its distribution are.
    target_alone: the target alone holds the speculative decoder's place
      (`TargetAloneMode`).
  """
  name: str = "token"
  description: str = "Algorithm 1"
  one_path: bool = True
  priced: bool = True
  branches: bool = False
  beam: bool = False
  own_settings: Tuple[str, ...] = ()
  exactness_tests: str = "tests/core/test_decoding.py"
  target_alone: bool = False

  def check(self, args: Any) -> None:
    """What this mode needs of the other settings; ValueError."""
    del args

  def acceptance_rule(self, args: Any) -> Optional[decoding.AcceptanceRule]:
    """The rule the speculative loop runs (None: Algorithm 1)."""
    del args
    return None

  def decoders(
      self, args: Any, target: Any, drafter: Any, gamma: int,
      acceptance: Optional[decoding.AcceptanceRule]) -> Tuple[Decoder, Decoder]:
    """(the target alone, speculative), checked once."""
    return (self.baseline_decoder(args, target),
            self.speculative_decoder(args, target, drafter, gamma, acceptance))

  def baseline_decoder(self, args: Any, target: Any) -> Decoder:
    """The target alone, sampling as the run does."""
    return decoding.baseline_decoder(target,
                                     max_decode_length=args.max_decode_length,
                                     method=args.method())

  def speculative_decoder(
      self, args: Any, target: Any, drafter: Any, gamma: int,
      acceptance: Optional[decoding.AcceptanceRule]) -> Decoder:
    """The speculative loop with `acceptance`."""
    return decoding.speculative_decoder(
        decoding.speculative_target(target, drafter), drafter, gamma=gamma,
        max_decode_length=args.max_decode_length, method=args.method(),
        acceptance=acceptance)

  def cache_rows(self, args: Any) -> int:
    """The rows the decoders' caches hold."""
    return args.batch_size

  def label(self, args: Any) -> str:
    """What metrics.json's `draft_model` adds for this mode."""
    del args
    return ""

  def pricing_words(self, args: Any) -> str:
    """The log line before the calls are priced."""
    return ("Pricing c: target calls of 1 and γ+1 = "
            f"{args.gamma + 1} tokens and the drafter's guesses, interleaved")

  def price(
      self, args: Any, drafter: Any, target: Any, batch: Any, fill: int,
      context: Any, pricing: step_costs.Pricing = step_costs.PRICING
  ) -> Tuple[float, float, float]:
    """(a target step, one guess, the verification call) in seconds
    (`step_costs.price_calls`; arguments as there)."""
    gamma = args.gamma
    by_k, t_draft = step_costs.price_calls(args, drafter, target, batch,
                                           (1, gamma + 1), fill, context,
                                           pricing)
    return by_k[1], t_draft, by_k[gamma + 1]

  def measured_theory(self, alpha: float, gamma: int, c: float,
                      call_cost: float, tokens_per_call: float) -> float:
    """The speedup this mode's cost model predicts at the measured call
    cost (target steps per verification call)."""
    del tokens_per_call
    return float(analysis.expected_speedup(alpha, gamma, c,
                                           call_cost=call_cost))

  def guesses_per_call(self, args: Any) -> Optional[int]:
    """Guesses drafted per call, or None: read from the traces."""
    del args
    return None

  def metrics(self, args: Any, decoded: Any) -> Dict[str, Any]:
    """metrics.json's keys of this mode (DECODE and its own)."""
    del decoded
    return {"decode": args.decode}


@dataclasses.dataclass(frozen=True)
class TokenMode(DecodeMode):
  """Algorithm 1 (LENIENCE < 1: the lenient rule)."""

  def acceptance_rule(self, args):
    if args.lenience == 1:
      return None
    return decoding.LenientAcceptance(np.float32(args.lenience))


@dataclasses.dataclass(frozen=True)
class BlockMode(DecodeMode):
  """Block verification: exact only."""
  name: str = "block"
  description: str = "block verification"
  own_settings: Tuple[str, ...] = ("acceptance",)

  def check(self, args):
    _exact_only(self, args)

  def acceptance_rule(self, args):
    del args
    return block_acceptance.BlockAcceptance()

  def label(self, args):
    del args
    return f" {self.name}"


@dataclasses.dataclass(frozen=True)
class TreeMode(DecodeMode):
  """Tree verification: k = TREE_WIDTH branches of γ guesses per call."""
  name: str = "tree"
  description: str = "tree verification"
  one_path: bool = False
  branches: bool = True
  own_settings: Tuple[str, ...] = ("acceptance", "tree_width",
                                   "tree_without_replacement")
  exactness_tests: str = "tests/core/test_tree_acceptance.py"

  def check(self, args):
    _exact_only(self, args)
    _check_drafter(self, args,
                   "tree verification drafts its branches with a draft model")
    if args.adaptive_threshold is not None:
      raise ValueError(
          f"ACCEPTANCE='tree' with ADAPTIVE_THRESHOLD="
          f"{args.adaptive_threshold!r}: tree verification drafts γ guesses "
          "per branch every call; allowed: ADAPTIVE_THRESHOLD=None with "
          "'tree'.")

  def speculative_decoder(self, args, target, drafter, gamma, acceptance):
    del acceptance  # `tree_decoder` makes its own rule
    return decoding.tree_decoder(
        decoding.speculative_target(target, drafter), drafter, gamma=gamma,
        tree_width=args.tree_width, max_decode_length=args.max_decode_length,
        method=args.method(), without_replacement=args.tree_without_replacement)

  def label(self, args):
    return f" tree k={args.tree_width}"

  def pricing_words(self, args):
    return ("Pricing c: a target step, the tree call over 1 + k·γ = "
            f"{1 + args.tree_width * args.gamma} nodes and the drafter's k "
            "branches, interleaved")

  def price(self, args, drafter, target, batch, fill, context,
            pricing=step_costs.PRICING):
    return step_costs.price_tree_calls(args, drafter, target, batch, fill,
                                       context, pricing)

  def measured_theory(self, alpha, gamma, c, call_cost, tokens_per_call):
    # The tree's own cost model: the measured tokens per call over an
    # iteration's measured cost (γ depths of k branches, the tree call).
    del alpha
    return tokens_per_call / (gamma * c + call_cost)

  def guesses_per_call(self, args):
    return args.gamma * args.tree_width


@dataclasses.dataclass(frozen=True)
class BeamMode(DecodeMode):
  """Speculative beam search: the target's beam search, exactly."""
  name: str = "beam"
  description: str = "speculative beam search"
  one_path: bool = False
  priced: bool = False
  beam: bool = True
  own_settings: Tuple[str, ...] = ("decode", "beam_size", "beam_alpha",
                                   "beam_width", "beam_rows")
  exactness_tests: str = "tests/core/test_speculative_beam.py"

  def check(self, args):
    if SAMPLING[args.acceptance] is not TOKEN:
      raise ValueError(
          f"DECODE='beam' with ACCEPTANCE={args.acceptance!r}: the target "
          "replays its own beam steps over the draft's beams; allowed: "
          "ACCEPTANCE='token'.")
    beam_settings.check_rules(args)
    _check_drafter(self, args, "the draft model runs its own beam search")

  def baseline_decoder(self, args, target):
    return beam_decoders.beam_decoder(target, beam_size=args.beam_size,
                                      max_decode_length=args.max_decode_length,
                                      alpha=args.beam_alpha)

  def speculative_decoder(self, args, target, drafter, gamma, acceptance):
    del acceptance  # the target replays its own beam steps
    return beam_decoders.speculative_beam_decoder(
        target, drafter, beam_size=args.beam_size, gamma=gamma,
        max_decode_length=args.max_decode_length, alpha=args.beam_alpha,
        width=beam_settings.width(args), num_rows=beam_settings.rows(args))

  def cache_rows(self, args):
    # A speculative beam call holds every element's candidate rows and
    # beams.
    return args.batch_size * (beam_settings.rows(args) + args.beam_size)

  def label(self, args):
    return (f" beam k={args.beam_size} u={beam_settings.width(args)} "
            f"rows={beam_settings.rows(args)}")

  def price(self, args, drafter, target, batch, fill, context,
            pricing=step_costs.PRICING):
    raise ValueError("DECODE='beam': c and Theorem 3.8 are not priced (they "
                     "model sampling one sequence, not beams).")

  def guesses_per_call(self, args):
    return args.gamma * beam_settings.width(args)

  def metrics(self, args, decoded):
    """`steps_per_target_call`: beam-search steps per speculative target
    call, each call m = n + 1 steps for n kept draft steps."""
    steps = float((np.arange(len(decoded.histogram)) + 1) @ decoded.histogram)
    return {
        "decode": args.decode,
        "beam_size": args.beam_size,
        "beam_alpha": float(args.beam_alpha),
        "beam_width": beam_settings.width(args),
        "beam_rows": beam_settings.rows(args),
        "steps_per_target_call": steps / max(decoded.calls_spec, 1),
    }


@dataclasses.dataclass(frozen=True)
class TargetAloneMode(DecodeMode):
  """SPECULATION='off' (or 'auto' choosing it): the target alone, with the
  settings of the mode it replaces (`search`: its baseline decoder, its
  checks and recorded settings); nothing is drafted or priced, and a
  walltime run decodes once (`target_alone.TargetAloneDecoder`)."""
  name: str = "off"
  description: str = "the target alone (SPECULATION='off')"
  one_path: bool = False
  priced: bool = False
  target_alone: bool = True
  search: Optional[DecodeMode] = None

  def check(self, args):
    self.search.check(args)

  def acceptance_rule(self, args):
    return self.search.acceptance_rule(args)

  def decoders(self, args, target, drafter, gamma, acceptance):
    del drafter, acceptance  # nothing is drafted
    baseline = self.baseline_decoder(args, target)
    return baseline, TargetAloneDecoder(baseline, gamma)

  def baseline_decoder(self, args, target):
    return self.search.baseline_decoder(args, target)

  def cache_rows(self, args):
    return self.search.cache_rows(args)

  def label(self, args):
    del args
    return " speculation off"

  def price(self, args, drafter, target, batch, fill, context,
            pricing=step_costs.PRICING):
    raise ValueError("SPECULATION='off': nothing is drafted, so c and "
                     "Theorem 3.8 are not priced.")

  def guesses_per_call(self, args):
    del args
    return 0

  def metrics(self, args, decoded):
    return self.search.metrics(args, decoded)


def target_alone(mode: DecodeMode) -> TargetAloneMode:
  """The target alone in `mode`'s place (its baseline, checks, settings)."""
  if mode.target_alone:
    return mode  # type: ignore[return-value]
  return TargetAloneMode(search=mode, branches=mode.branches, beam=mode.beam,
                         own_settings=mode.own_settings,
                         exactness_tests=mode.exactness_tests)


TOKEN = TokenMode()
BLOCK = BlockMode()
TREE = TreeMode()
BEAM = BeamMode()
# ACCEPTANCE's values: the modes of DECODE='sample'.
SAMPLING: Dict[str, DecodeMode] = {m.name: m for m in (TOKEN, BLOCK, TREE)}


def register(mode: DecodeMode) -> None:
  """Makes ACCEPTANCE=mode.name decode with `mode` (an extension with its
  own acceptance rule, or a test's planted bug); drafters that draft for
  it list its name in their spec's `decode_modes`."""
  if not isinstance(mode, DecodeMode) or mode.beam:
    raise TypeError("mode must be a sampling DecodeMode, got "
                    f"{type(mode).__name__}")
  SAMPLING[mode.name] = mode


def search_mode_of(args: Any) -> DecodeMode:
  """The mode DECODE and ACCEPTANCE name: DECODE='beam', else ACCEPTANCE's
  (whatever SPECULATION says)."""
  if args.decode == BEAM.name:
    return BEAM
  return SAMPLING[args.acceptance]


def mode_of(args: Any) -> DecodeMode:
  """The run's mode: `search_mode_of`, or with SPECULATION='off' the
  target alone in its place."""
  mode = search_mode_of(args)
  if getattr(args, "speculation", SPECULATION_ON) == SPECULATION_OFF:
    return target_alone(mode)
  return mode


def of_metrics(record: Mapping[str, Any]) -> DecodeMode:
  """The mode a metrics.json (or compile.json's settings) recorded; runs
  from before these keys: token verification."""
  if record.get("decode") == BEAM.name:
    mode: DecodeMode = BEAM
  else:
    mode = SAMPLING.get(record.get("acceptance") or TOKEN.name, TOKEN)
  if record.get("speculation") == SPECULATION_OFF:
    return target_alone(mode)
  return mode


def check_values(args: Any) -> None:
  """DECODE and ACCEPTANCE among the registry's names; ValueError."""
  if args.decode not in DECODES:
    raise ValueError(f"DECODE={args.decode!r}: allowed: 'sample' (sampling "
                     "or greedy decoding, the default) or 'beam' (beam "
                     "search).")
  if args.acceptance not in SAMPLING:
    words = "; ".join(f"{m.name!r}: {m.description}" for m in SAMPLING.values())
    raise ValueError(f"ACCEPTANCE={args.acceptance!r}: allowed: "
                     f"{', '.join(repr(a) for a in SAMPLING)} ({words}).")


def check_speculation(args: Any) -> None:
  """SPECULATION among its values, and what 'off' / 'auto' cannot run
  with; ValueError naming the macro, the value and what is allowed."""
  value = getattr(args, "speculation", SPECULATION_ON)
  if not isinstance(value, str) or value not in SPECULATIONS:
    raise ValueError(
        f"SPECULATION={value!r}: allowed: 'on' (speculative decoding, the "
        "default), 'off' (the target alone) or 'auto' (the run prices the "
        "decode modes on this machine and picks the fastest, the target "
        "alone included).")
  if value == SPECULATION_ON:
    return
  if args.mode == "alpha":
    raise ValueError(f"SPECULATION={value!r} with MODE='alpha': α is "
                     "measured with the draft; allowed: SPECULATION='on' "
                     "with MODE='alpha'.")
  if args.compile_topology is not None:
    raise ValueError(f"SPECULATION={value!r} with COMPILE_TOPOLOGY="
                     f"{args.compile_topology!r}: the programs are compiled "
                     "for one decode mode; allowed: SPECULATION='on'.")
  if value == SPECULATION_AUTO and (args.lenience != 1 or
                                    args.adaptive_threshold is not None):
    raise ValueError(
        "SPECULATION='auto' with LENIENCE="
        f"{args.lenience!r}, ADAPTIVE_THRESHOLD={args.adaptive_threshold!r}: "
        "'auto' chooses among exact modes of fixed γ; allowed: LENIENCE=1 "
        "and ADAPTIVE_THRESHOLD=None with 'auto', or SPECULATION='on'.")


def check(args: Any) -> None:
  """The run's mode against the other settings (ValueError naming the
  macro, its value and what is allowed)."""
  check_speculation(args)
  check_values(args)
  beam_settings.check_values(args)
  mode = mode_of(args)
  if not mode.beam:
    beam_settings.check_unused(args)
  mode.check(args)


def settings_to_drop(args: Any) -> Tuple[str, ...]:
  """Run arguments that other modes own and this run's mode does not: a
  run records none of them (its results stay those of runs from before
  the modes existed)."""
  mode = mode_of(args)
  return tuple(
      dict.fromkeys(k for m in (*SAMPLING.values(), BEAM) if m is not mode
                    for k in m.own_settings if k not in mode.own_settings))


def _exact_only(mode: DecodeMode, args: Any) -> None:
  if args.lenience != 1:
    raise ValueError(f"ACCEPTANCE={mode.name!r} with LENIENCE="
                     f"{args.lenience!r}: {mode.description} is exact only; "
                     f"allowed: LENIENCE=1 with {mode.name!r}, or "
                     "ACCEPTANCE='token'.")


def _check_drafter(mode: DecodeMode, args: Any, why: str) -> None:
  supported = drafter_registry.supporting(mode.name)
  if args.drafter in supported:
    return
  setting = ("DECODE='beam'" if mode.beam else f"ACCEPTANCE={mode.name!r}")
  raise ValueError(f"{setting} with DRAFTER={args.drafter!r}: {why}; "
                   "allowed: DRAFTER "
                   f"{' or '.join(repr(d) for d in supported)}.")


# -- target alone --------------------------------------------------------------
# SPECULATION='off' (or 'auto' choosing it): the target alone in the place
# of the speculative decoder.
#
# `TargetAloneDecoder` runs the run's baseline decoder (the target's sampling
# or its own beam search) and returns its output in the shape the run reads
# from a speculative decoder (`TargetAloneOutput`: every target call kept
# n = 0 guesses), so that a walltime run, MODE='infer' and the summary need
# no branch of their own. A walltime run does not decode twice: it takes the
# baseline's output and seconds for the speculative column
# (`TargetAloneDecoder.of_baseline`), so the speedup is 1 by definition.
Array = jax.Array


@flax.struct.dataclass
class TargetAloneOutput(outputs.CallStatistics):
  """The target alone's output, read as a speculative decoder's of γ
  guesses per call (`CallStatistics` with the run's γ: a walltime run adds
  its histogram to the speculative column's [γ + 1] one).

  Attributes:
    tokens: [B, T] int32 the target's tokens (0 after EOS).
    lengths: [B] int32 tokens per row, EOS included.
    target_calls: [B] int32 target calls (one per token; beam search: one
      per step).
    accepted_histogram: [B, γ + 1] int32: every call in column 0 (no
      guess was made, so none was kept).
    trace_num_accepted: [B, T] int32: 0 for each call, -1 after the last.
  """
  tokens: Array
  lengths: Array
  target_calls: Array
  accepted_histogram: Array
  trace_num_accepted: Array


def as_target_alone_output(out: Any, gamma: int) -> TargetAloneOutput:
  """The baseline's `out` (a `CallStatistics` with γ = 0: every call in
  histogram column 0) with its histogram widened to γ + 1 columns."""
  histogram = jnp.asarray(out.accepted_histogram, jnp.int32)
  histogram = jnp.pad(histogram,
                      ((0, 0), (0, int(gamma) + 1 - histogram.shape[1])))
  return TargetAloneOutput(
      tokens=jnp.asarray(out.tokens), lengths=jnp.asarray(out.lengths),
      target_calls=jnp.asarray(out.target_calls,
                               jnp.int32), accepted_histogram=histogram,
      trace_num_accepted=jnp.asarray(out.trace_num_accepted, jnp.int32))


class TargetAloneDecoder:
  """The speculative decoder's place, held by the target alone.

  Attributes:
    baseline: the run's baseline decoder, (inputs [B, S], rng) -> output.
    gamma: the histogram's γ (columns γ + 1; metrics.json's `gamma`).
  """

  def __init__(self, baseline: Callable[[Array, Array], Any], gamma: int):
    self.baseline = baseline
    self.gamma = int(gamma)

  def __call__(self, encoder_input_tokens: Array,
               rng: Array) -> TargetAloneOutput:
    return self.of_baseline(self.baseline(encoder_input_tokens, rng))

  def of_baseline(self, out: Any) -> TargetAloneOutput:
    """The baseline's output of the same batch and rng, as this decoder's
    (a walltime run decodes once: `walltime.decode_examples`)."""
    return as_target_alone_output(out, self.gamma)
