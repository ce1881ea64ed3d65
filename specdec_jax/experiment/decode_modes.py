"""Decode modes: one object for each way a run decodes speculatively.

ACCEPTANCE and DECODE name a mode (`named`, gin's `decode_mode`), a frozen
dataclass holding its own settings as fields naming their macros
(`TreeMode.width = %TREE_WIDTH`). A mode owns what differs between modes:
its checks, acceptance rule, decoders, cache rows, call pricing, cost
model, metrics keys, settings record and label; no other module compares
ACCEPTANCE or DECODE to a string (`tests/project/test_architecture.py`).
"""
import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import gin
import numpy as np

from specdec_jax.config import flag_utils
from specdec_jax.config import gin_utils
from specdec_jax.config.gin_utils import setting
from specdec_jax.core import decoding
from specdec_jax.core.decoding import beam_decoders
from specdec_jax.core.decoding import block_acceptance
from specdec_jax.experiment import batches
from specdec_jax.experiment import drafter_registry
from specdec_jax.experiment.drafter_registry import is_int
from specdec_jax.experiment.drafter_registry import is_real
from specdec_jax.metrics import analysis
from specdec_jax.metrics import step_costs

Decoder = decoding.Decoder
SAMPLE = "sample"
DECODES = (SAMPLE, "beam")
SPECULATION_ON, SPECULATION_OFF, SPECULATION_AUTO = "on", "off", "auto"
SPECULATIONS = (SPECULATION_ON, SPECULATION_OFF, SPECULATION_AUTO)
AUTO = "auto"  # GAMMA / TREE_WIDTH chosen by the run (`pilots`)
# TREE_WIDTH='auto' considers trees of at most this many nodes 1 + k·γ.
AUTO_TREE_MAX_NODES = 25


@dataclasses.dataclass(frozen=True)
class DecodeMode:
  """What one decode mode (`name`: its ACCEPTANCE value, or 'beam') means;
  subclasses override what differs. `one_path`: each target call verifies
  one path of guesses (the run records traces, β, Theorem 3.8's bound);
  `priced`: c and Theorem 3.8 apply (they model sampling one sequence);
  `replays`: its rows' kept guesses by call replay at another γ as a
  chain's (`replay`: exact for a chain at T = 0; a tree's, a model)."""
  name = "token"
  description = "Algorithm 1"
  decode = SAMPLE
  one_path = True
  priced = True
  replays = True
  branches = False
  beam = False
  exactness_tests = "tests/core/test_decoding.py"
  target_alone = False
  lenience = 1.0
  auto_width = False

  choice = property(lambda self: ("ACCEPTANCE", self.name))
  acceptance = property(lambda self: self.name)
  reads = drafter_registry.DrafterSpec.reads  # the macros of its settings

  def record(self) -> Dict[str, Any]:
    """What its runs' settings record adds: how it was chosen and its
    settings, under the run arguments' names."""
    return {self.choice[0].lower(): self.choice[1], **gin_utils.settings(self)}

  def check(self, args: Any) -> None:
    """Its own settings and what it needs of the run's; ValueError."""
    del args

  def check_vocab(self, args: Any, vocab_size: int) -> None:
    """Its settings against the models' vocab_size; ValueError."""
    del args, vocab_size

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
    (`step_costs.price_calls`)."""
    gamma = args.gamma
    by_k, t_draft = step_costs.price_calls(args, drafter, target, batch,
                                           (1, gamma + 1), fill, context,
                                           pricing)
    return by_k[1], t_draft, by_k[gamma + 1]

  def measured_theory(self, alpha: float, gamma: int, c: float,
                      call_cost: float, tokens_per_call: float) -> float:
    """The speedup its cost model predicts at the measured call cost."""
    del tokens_per_call
    return float(analysis.expected_speedup(alpha, gamma, c,
                                           call_cost=call_cost))

  def guesses_per_call(self, args: Any) -> Optional[int]:
    """Guesses drafted per call, or None: read from the traces."""
    del args
    return None

  def metrics(self, args: Any, decoded: Any) -> Dict[str, Any]:
    """metrics.json's keys of this mode (DECODE and its own)."""
    del args, decoded
    return {"decode": self.decode}


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TokenMode(DecodeMode):
  """ACCEPTANCE='token': Algorithm 1.

  Attributes:
    lenience: Appendix A.5's l in (0, 1]; 1 = exact (the default); l < 1
      is NOT the target's distribution.
  """
  lenience: float = setting("LENIENCE", 1.0)

  def record(self):
    # As before the modes existed: LENIENCE is recorded with the drafter's
    # settings. A mode registered on this one records its name.
    return {} if self.name == TokenMode.name else {"acceptance": self.name}

  def check(self, args):
    if not (is_real(self.lenience) and 0 < self.lenience <= 1):
      raise ValueError(f"LENIENCE={self.lenience!r}: allowed: a number in "
                       "(0, 1] (1 = exact; l < 1 is not the target's "
                       "distribution).")

  def acceptance_rule(self, args):
    if self.lenience == 1:
      return None
    return decoding.LenientAcceptance(np.float32(self.lenience))


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BlockMode(DecodeMode):
  """ACCEPTANCE='block': block verification (exact only)."""
  name = "block"
  description = "block verification"

  def acceptance_rule(self, args):
    del args
    return block_acceptance.BlockAcceptance()

  def label(self, args):
    del args
    return f" {self.name}"


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TreeMode(DecodeMode):
  """ACCEPTANCE='tree': k = `width` branches of γ guesses per call.

  Attributes:
    width: k, the draft branches per target call (an integer >= 1; k = 1
      is Algorithm 1 run by the tree loop), or 'auto' (the k <= 4, and
      with GAMMA='auto' the γ, of the best predicted speedup for the
      acceptance and call costs measured on the first examples).
    without_replacement: at T > 0 the k first guesses are drawn without
      replacement (distinct; recursive rejection sampling at depth 1)
      rather than independently; both exact.
  """
  width: Union[int, str] = setting("TREE_WIDTH", 1)
  without_replacement: bool = setting("TREE_WITHOUT_REPLACEMENT", True)
  name = "tree"
  description = "tree verification"
  one_path = False
  # Its rows' waits replay as a chain's: on the shipped pair at batch 8
  # (k 2 and 3, γ 3-7) within 0.03 of the measured factors.
  replays = True
  branches = True
  exactness_tests = "tests/core/test_tree_acceptance.py"

  @property
  def auto_width(self) -> bool:
    return self.width == AUTO

  def check(self, args):
    width, gamma = self.width, args.gamma
    if width != AUTO and (not is_int(width) or width < 1):
      raise ValueError(f"TREE_WIDTH={width!r}: allowed: an integer >= 1 (the "
                       "draft branches per target call of ACCEPTANCE='tree'), "
                       f"or '{AUTO}'.")
    _check_drafter(self, args,
                   "tree verification drafts its branches with a draft model")
    if self.auto_width and is_int(gamma) and 1 + gamma > AUTO_TREE_MAX_NODES:
      raise ValueError(
          f"TREE_WIDTH='{AUTO}' with GAMMA={gamma}: the choice considers "
          f"trees of at most {AUTO_TREE_MAX_NODES} nodes (1 + k·γ); allowed: "
          f"GAMMA <= {AUTO_TREE_MAX_NODES - 1}, or GAMMA='{AUTO}', or an "
          "integer TREE_WIDTH.")
    if (gamma == AUTO and is_int(width) and
        args.speculation != SPECULATION_AUTO and
        1 + width > AUTO_TREE_MAX_NODES):
      raise ValueError(
          f"GAMMA='{AUTO}' with TREE_WIDTH={width}: the choice considers "
          f"trees of at most {AUTO_TREE_MAX_NODES} nodes (1 + k·γ); allowed: "
          f"TREE_WIDTH <= {AUTO_TREE_MAX_NODES - 1}, or TREE_WIDTH="
          f"'{AUTO}', or an integer GAMMA.")
    if self.auto_width and args.compile_topology is not None:
      raise ValueError(f"TREE_WIDTH='{AUTO}' with COMPILE_TOPOLOGY="
                       f"{args.compile_topology!r}: allowed: an integer "
                       "TREE_WIDTH >= 1 (the programs are compiled for one).")

  def check_vocab(self, args, vocab_size):
    # At T = 0 the k branches start with the k likeliest tokens.
    if (args.method().is_greedy and not self.auto_width and
        self.width > vocab_size):
      raise ValueError(f"TREE_WIDTH={self.width} is more than the models' "
                       f"vocab_size ({vocab_size}): greedy branches start with "
                       f"distinct tokens. Allowed: 1 to {vocab_size}.")

  def speculative_decoder(self, args, target, drafter, gamma, acceptance):
    del acceptance  # `tree_decoder` makes its own rule
    return decoding.tree_decoder(decoding.speculative_target(target, drafter),
                                 drafter, gamma=gamma, tree_width=self.width,
                                 max_decode_length=args.max_decode_length,
                                 method=args.method(),
                                 without_replacement=self.without_replacement)

  def label(self, args):
    return f" tree k={self.width}"

  def pricing_words(self, args):
    return ("Pricing c: a target step, the tree call over 1 + k·γ = "
            f"{1 + self.width * args.gamma} nodes and the drafter's k "
            "branches, interleaved")

  def price(self, args, drafter, target, batch, fill, context,
            pricing=step_costs.PRICING):
    return step_costs.price_tree_calls(args, drafter, target, batch, fill,
                                       context, pricing)

  def measured_theory(self, alpha, gamma, c, call_cost, tokens_per_call):
    # Tokens per call over an iteration's cost (γ depths, the tree call).
    del alpha
    return tokens_per_call / (gamma * c + call_cost)

  def guesses_per_call(self, args):
    return args.gamma * self.width


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BeamMode(DecodeMode):
  """DECODE='beam': the target's own beam search, and the draft's beams
  verified by the target, identical beams (docs/design/beyond_the_paper.md).

  Attributes:
    size: k, the beams kept (T5X's num_decodes), an integer >= 1 and at
      most half the vocabulary.
    alpha: the brevity penalty's exponent α, ((5 + length) / 6) ** α, a
      number >= 0 (T5X's 0.6; 0 = none).
    width: u, the draft's beam width, an integer >= BEAM_SIZE; None =
      BEAM_SIZE.
    rows: the candidate sequences the target scores per call (each a live
      beam and γ draft tokens), an integer from BEAM_SIZE to GAMMA·u +
      BEAM_SIZE; None = 2u (at most GAMMA·u + BEAM_SIZE).
  """
  size: int = setting("BEAM_SIZE", 4)
  alpha: float = setting("BEAM_ALPHA", 0.6)  # T5X's default
  width: Optional[int] = setting("BEAM_WIDTH", None)
  rows: Optional[int] = setting("BEAM_ROWS", None)
  name = "beam"
  description = "speculative beam search"
  decode = "beam"
  one_path = False
  priced = False
  replays = False
  beam = True
  exactness_tests = "tests/core/test_speculative_beam.py"

  choice = property(lambda self: ("DECODE", self.decode))
  acceptance = TokenMode.name  # the target replays its own beam steps

  def draft_width(self) -> int:
    """u, the draft's beam width (None: BEAM_SIZE)."""
    return self.size if self.width is None else self.width

  def num_rows(self, gamma: int) -> int:
    """The candidate rows of a target call (None: 2u, at most γ·u + k,
    all the draft's beams)."""
    if self.rows is not None:
      return self.rows
    return min(2 * self.draft_width(), gamma * self.draft_width() + self.size)

  def check(self, args):
    k, alpha, u, r, gamma = (self.size, self.alpha, self.width, self.rows,
                             args.gamma)
    if not is_int(k) or k < 1:
      raise ValueError(f"BEAM_SIZE={k!r}: allowed: an integer >= 1 (the "
                       "beams kept).")
    if not (is_real(alpha) and alpha >= 0):
      raise ValueError(f"BEAM_ALPHA={alpha!r}: allowed: a finite number >= 0 "
                       "(the brevity penalty's exponent; T5X: 0.6).")
    if u is not None and (not is_int(u) or u < k):
      raise ValueError(f"BEAM_WIDTH={u!r} with BEAM_SIZE={k}: allowed: None "
                       f"(= BEAM_SIZE) or an integer >= BEAM_SIZE = {k} (the "
                       "draft's beam width u >= k).")
    most = gamma * self.draft_width() + k if is_int(gamma) else None
    if r is not None and most and (not is_int(r) or not k <= r <= most):
      raise ValueError(
          f"BEAM_ROWS={r!r} with BEAM_SIZE={k}, BEAM_WIDTH={self.draft_width()}"
          f", GAMMA={gamma}: allowed: None (= 2·BEAM_WIDTH) or an integer "
          f"from {k} (one row per beam) to GAMMA·BEAM_WIDTH + BEAM_SIZE = "
          f"{most}.")
    _check_beam_rules(args)
    _check_drafter(self, args, "the draft model runs its own beam search")

  def check_vocab(self, args, vocab_size):
    # Each element stops on its own, as T5X's only with 2k candidates.
    try:
      beam_decoders.check_beam_vocab(self.size, vocab_size)
    except ValueError as e:
      raise ValueError(f"BEAM_SIZE={self.size}: {e} Allowed: 1 to "
                       f"{vocab_size // 2}.") from None

  def baseline_decoder(self, args, target):
    return beam_decoders.beam_decoder(target, beam_size=self.size,
                                      max_decode_length=args.max_decode_length,
                                      alpha=self.alpha)

  def speculative_decoder(self, args, target, drafter, gamma, acceptance):
    del acceptance  # the target replays its own beam steps
    return beam_decoders.speculative_beam_decoder(
        target, drafter, beam_size=self.size, gamma=gamma,
        max_decode_length=args.max_decode_length, alpha=self.alpha,
        width=self.draft_width(), num_rows=self.num_rows(args.gamma))

  def cache_rows(self, args):
    return args.batch_size * (self.num_rows(args.gamma) + self.size)

  def label(self, args):
    return (f" beam k={self.size} u={self.draft_width()} "
            f"rows={self.num_rows(args.gamma)}")

  def price(self, args, drafter, target, batch, fill, context,
            pricing=step_costs.PRICING):
    raise ValueError("DECODE='beam': c and Theorem 3.8 are not priced (they "
                     "model sampling one sequence, not beams).")

  def guesses_per_call(self, args):
    return args.gamma * self.draft_width()

  def metrics(self, args, decoded):
    """`steps_per_target_call`: beam-search steps per speculative target
    call, each call m = n + 1 steps for n kept draft steps."""
    histogram = decoded.spec.histogram
    steps = float((np.arange(len(histogram)) + 1) @ histogram)
    return dict(decode=self.decode, beam_size=self.size,
                beam_alpha=float(self.alpha), beam_width=self.draft_width(),
                beam_rows=self.num_rows(args.gamma),
                steps_per_target_call=steps / max(decoded.spec.calls, 1))


@dataclasses.dataclass(frozen=True)
class TargetAloneMode:
  """SPECULATION='off' (or 'auto' choosing it): the target alone in the
  place of `search`, which it is in all but what follows: nothing is
  drafted or priced, and a walltime run decodes once."""
  search: DecodeMode
  name = "off"
  description = "the target alone (SPECULATION='off')"
  one_path = False
  priced = False
  replays = False
  target_alone = True

  def __getattr__(self, name: str) -> Any:
    if name == "search" or name.startswith("__"):  # a copy not yet filled
      raise AttributeError(name)
    return getattr(self.search, name)

  def decoders(self, args, target, drafter, gamma, acceptance):
    del drafter, acceptance  # nothing is drafted
    baseline = self.search.baseline_decoder(args, target)
    return baseline, batches.TargetAloneDecoder(baseline, gamma)

  def label(self, args):
    del args
    return " speculation off"

  def price(self, *args, **kwargs):
    raise ValueError("SPECULATION='off': nothing is drafted, so c and "
                     "Theorem 3.8 are not priced.")

  def guesses_per_call(self, args):
    del args
    return 0


def target_alone(mode: DecodeMode) -> TargetAloneMode:
  """The target alone in `mode`'s place."""
  return mode if mode.target_alone else TargetAloneMode(search=mode)


TOKEN = TokenMode()
BLOCK = BlockMode()
TREE = TreeMode()
BEAM = BeamMode()
# ACCEPTANCE's values: the modes of DECODE='sample'.
SAMPLING: Dict[str, DecodeMode] = {m.name: m for m in (TOKEN, BLOCK, TREE)}


def register(mode: DecodeMode) -> None:
  """Makes ACCEPTANCE=mode.name decode with `mode` (an extension, or a
  test's planted bug; drafters list it in their `decode_modes`)."""
  if not isinstance(mode, DecodeMode) or mode.beam:
    raise TypeError("mode must be a sampling DecodeMode, got "
                    f"{type(mode).__name__}")
  SAMPLING[mode.name] = mode


@gin.configurable("decode_mode")
def named(acceptance: str = TOKEN.name, decode: str = SAMPLE) -> DecodeMode:
  """The mode ACCEPTANCE and DECODE name, with its settings as gin binds
  them.

  Args:
    acceptance: how the target verifies the guesses, all exact: 'token'
      (Algorithm 1, the default), 'block' (block verification, Sun et al.
      2025: never fewer kept guesses in expectation; the same as 'token'
      at temperature 0) or 'tree' (tree verification: TREE_WIDTH draft
      branches of γ guesses, scored in one target call of 1 +
      TREE_WIDTH·γ tokens; needs DRAFTER 'model', 'shared_encoder' or
      'feature').
    decode: what both decoders search for: 'sample' (the default: sampling
      or greedy decoding, TEMPERATURE) or 'beam' (beam search, as T5X's;
      `BeamMode`).

  Raises ConfigError naming the macro, its value and what is allowed.
  """
  if not isinstance(decode, str) or decode not in DECODES:
    raise flag_utils.ConfigError(
        f"DECODE={decode!r}: allowed: 'sample' (sampling or greedy decoding, "
        "the default) or 'beam' (beam search).")
  if not isinstance(acceptance, str) or acceptance not in SAMPLING:
    words = "; ".join(f"{m.name!r}: {m.description}" for m in SAMPLING.values())
    raise flag_utils.ConfigError(
        f"ACCEPTANCE={acceptance!r}: allowed: "
        f"{', '.join(repr(a) for a in SAMPLING)} ({words}).")
  if decode == BEAM.decode:
    if acceptance != TOKEN.name:
      raise flag_utils.ConfigError(
          f"DECODE='beam' with ACCEPTANCE={acceptance!r}: allowed: "
          "ACCEPTANCE='token' (the target replays its own beam steps).")
    return gin_utils.configured(BEAM)
  return gin_utils.configured(SAMPLING[acceptance])


def mode_of(args: Any) -> DecodeMode:
  """The run's `decode_mode`, or the target alone (SPECULATION='off')."""
  if getattr(args, "speculation", SPECULATION_ON) == SPECULATION_OFF:
    return target_alone(args.decode_mode)
  return args.decode_mode


def tree_of(mode: DecodeMode) -> TreeMode:
  """A run's tree settings: its own, or the defaults ('auto''s trees)."""
  return mode if mode.branches else TREE


def of_metrics(record: Mapping[str, Any]) -> DecodeMode:
  """The mode a metrics.json (or compile.json's settings) recorded."""
  mode = (BEAM if record.get("decode") == BEAM.decode else SAMPLING.get(
      record.get("acceptance") or TOKEN.name, TOKEN))
  off = record.get("speculation") == SPECULATION_OFF
  return target_alone(mode) if off else mode


def _check_drafter(mode: DecodeMode, args: Any, why: str) -> None:
  supported = drafter_registry.supporting(mode.name)
  if args.drafting.name not in supported:
    raise ValueError(f"{gin_utils.choice_words([mode.choice])} with DRAFTER="
                     f"{args.drafting.name!r}: {why}; allowed: DRAFTER "
                     f"{' or '.join(repr(d) for d in supported)}.")


def _check_beam_rules(args: Any) -> None:
  """What DECODE='beam' needs of the sampling settings; ValueError."""
  for wrong, setting_words, why, allowed in (
      (args.temperature != 0, f"TEMPERATURE={args.temperature!r}",
       "beam search draws nothing", "TEMPERATURE=0"),
      (args.top_k != 0 or args.top_p != 1,
       f"TOPK={args.top_k!r}" if args.top_k != 0 else f"TOPP={args.top_p!r}",
       "beam search draws nothing, so TOPK and TOPP would change nothing",
       "TOPK=0 and TOPP=1 (off)"),
      (args.gamma == AUTO, "GAMMA='auto'",
       "Theorem 3.8's choice of γ is for sampling one sequence",
       "an integer GAMMA >= 1"), (args.mode == "alpha", f"MODE={args.mode!r}",
                                  "MODE='alpha' estimates α of sampling",
                                  "MODE='walltime'")):
    if wrong:
      raise ValueError(f"DECODE='beam' with {setting_words}: {why}; allowed: "
                       f"{allowed}.")
