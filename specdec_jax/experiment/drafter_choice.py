"""Which drafter a run uses: the DRAFTER gin macro and its settings.

`DrafterSettings` holds what `run` reads from gin (DRAFTER, NGRAM_CORPUS,
NGRAM_ORDER, PROMPT_LOOKUP_MAX, INNER_DRAFTER, INNER_GAMMA,
ADAPTIVE_THRESHOLD), checks it before anything is loaded (`check`), and
builds the drafter (`build`) once the models and the n-gram table exist.
`check_lenience` and `choose_gamma` (GAMMA='auto', Theorem 3.8) are the
run's other choices about drafting; `propose_seconds` prices a drafter
that is not a model step (for the cost coefficient c).
"""
import dataclasses
import functools
import math
import numbers
import statistics
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import analysis
from specdec_jax import sampling
from specdec_jax import timing
from specdec_jax.drafters.hierarchical import HierarchicalDrafter
from specdec_jax.drafters.model import ModelDrafter
from specdec_jax.drafters.ngram import NGramDrafter
from specdec_jax.drafters.ngram import NGramTable
from specdec_jax.drafters.ngram import build_ngram_table
from specdec_jax.drafters.prompt_lookup import PromptLookupDrafter
from specdec_jax.experiment import ngram_corpus as corpus_lib

DRAFTERS = ("model", "unigram", "bigram", "ngram", "prompt_lookup",
            "hierarchical", "shared_encoder")
# Drafters that are a draft model's decoder steps ('shared_encoder': a draft
# decoder reading the target's encoder output, `models.SharedEncoderModel`).
MODEL_DRAFTERS = ("model", "shared_encoder")
INNER_DRAFTERS = ("prompt_lookup", "unigram", "bigram", "ngram")
NGRAM_ORDERS = {"unigram": 1, "bigram": 2}
DEFAULT_NGRAM_ORDER = 3  # DRAFTER='ngram' without NGRAM_ORDER.
# GAMMA='auto': decode the first AUTO_GAMMA_EXAMPLES examples with γ =
# AUTO_GAMMA_PILOT, then take Theorem 3.8's best γ <= AUTO_GAMMA_MAX for
# the measured α and c.
AUTO_GAMMA = "auto"
AUTO_GAMMA_PILOT = 4
AUTO_GAMMA_MAX = 12
AUTO_GAMMA_EXAMPLES = 8
# The verification call's cost is measured at these K = γ + 1 and
# interpolated linearly in between (on a CPU it grows with K; the theorem's
# "one step" would make near-free drafters pick γ = AUTO_GAMMA_MAX).
AUTO_GAMMA_CALL_KS = (1, 2, 4, 7, AUTO_GAMMA_MAX + 1)


def _is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
  return (isinstance(value, numbers.Real) and not isinstance(value, bool) and
          math.isfinite(value))


def check_lenience(lenience: Any) -> None:
  """LENIENCE in (0, 1] (1 = exact); raises ValueError."""
  if not (_is_real(lenience) and 0 < lenience <= 1):
    raise ValueError(
        f"LENIENCE={lenience!r}: allowed: a number in (0, 1] (1 = exact "
        "speculative decoding; l < 1 accepts more guesses and no longer "
        "samples the target's distribution).")


def check_gamma(gamma: Any) -> None:
  """GAMMA: 'auto' or a number (`decoding.check_settings` checks that it is
  an integer >= 1); raises ValueError for any other string."""
  if isinstance(gamma, str) and gamma != AUTO_GAMMA:
    raise ValueError(f"GAMMA={gamma!r}: allowed: an integer >= 1, or "
                     f"'{AUTO_GAMMA}' (Theorem 3.8's best γ for the α and c "
                     "measured on the first examples).")


def call_costs(call_seconds: Dict[int, float]) -> np.ndarray:
  """[AUTO_GAMMA_MAX] verification-call costs in target steps, entry γ-1
  for γ: the K = γ+1 call's seconds over the K = 1 call's, linearly
  interpolated between the measured K (`call_seconds`: K -> seconds, K = 1
  included)."""
  ks = sorted(call_seconds)
  if ks[0] != 1:
    raise ValueError(f"call_seconds needs K=1 (the target step); got K={ks}")
  ratios = [call_seconds[k] / call_seconds[1] for k in ks]
  return np.interp(np.arange(2, AUTO_GAMMA_MAX + 2), ks, ratios)


def choose_gamma(alpha: float, cost_coefficient: float,
                 costs: Optional[np.ndarray] = None) -> int:
  """GAMMA='auto': the γ <= AUTO_GAMMA_MAX maximizing Theorem 3.8, with the
  verification call priced by `costs` ([AUTO_GAMMA_MAX], `call_costs`) or
  at one step when None."""
  alpha = min(max(float(alpha), 0.0), 1.0)
  return analysis.optimal_gamma(alpha, max(float(cost_coefficient), 0.0),
                                max_gamma=AUTO_GAMMA_MAX, call_costs=costs)


@dataclasses.dataclass(frozen=True)
class DrafterSettings:
  """The run's drafter (docs/usage/macros.md).

  Attributes:
    drafter: DRAFTER, one of DRAFTERS ('model': the draft T5 model;
      'shared_encoder': a draft decoder without an encoder, reading the
      target's encoder output).
    ngram_corpus: NGRAM_CORPUS, the corpus of 'unigram' / 'bigram' /
      'ngram' (also as INNER_DRAFTER): text or a .npz of ids (`corpus`).
    ngram_order: NGRAM_ORDER: n of 'ngram' (default 3); None otherwise, or
      the order the name says.
    prompt_lookup_max: PROMPT_LOOKUP_MAX, longest suffix prompt lookup
      matches.
    inner_drafter: INNER_DRAFTER of 'hierarchical'.
    inner_gamma: INNER_GAMMA, its guesses per inner iteration.
    adaptive_threshold: ADAPTIVE_THRESHOLD in (0, 1) (adaptive γ), or None.
  """
  drafter: str = "model"
  ngram_corpus: Optional[str] = None
  ngram_order: Optional[int] = None
  prompt_lookup_max: int = 3
  inner_drafter: str = "prompt_lookup"
  inner_gamma: int = 4
  adaptive_threshold: Optional[float] = None

  @property
  def _ngram_name(self) -> Optional[str]:
    """The n-gram drafter in use ('unigram', 'bigram', 'ngram'), if any."""
    for name in (self.drafter, self.inner_drafter
                 if self.drafter == "hierarchical" else None):
      if name in ("unigram", "bigram", "ngram"):
        return name
    return None

  @property
  def uses_draft_model(self) -> bool:
    return self.drafter in ("model", "shared_encoder", "hierarchical")

  @property
  def is_model_step(self) -> bool:
    """The guesses are the draft model's decoder steps (priced as one)."""
    return self.drafter in MODEL_DRAFTERS

  def check_draft_config(self, draft_config: Any, target_config: Any) -> None:
    """DRAFTER against the draft's T5Config: 'shared_encoder' needs a
    decoder without an encoder that reads the target's width; the other
    model drafters need a draft with its own encoder. Raises ValueError."""
    if not self.uses_draft_model:
      return
    shared = not draft_config.has_encoder
    if self.drafter == "shared_encoder" and not shared:
      raise ValueError(
          "DRAFTER='shared_encoder': the draft has an encoder of its own "
          f"(draft/T5Config.num_encoder_layers = "
          f"{draft_config.num_encoder_layers}); allowed: a draft decoder "
          "with num_encoder_layers = 0 and encoder_width = the target's "
          f"emb_dim ({target_config.emb_dim}), e.g. "
          "gin/models/draft/multi30k_shared_encoder_1m.gin.")
    if shared and self.drafter != "shared_encoder":
      raise ValueError(
          f"DRAFTER={self.drafter!r}: the draft has no encoder of its own "
          "(draft/T5Config.num_encoder_layers = 0: a shared-encoder draft); "
          "allowed: DRAFTER='shared_encoder'.")
    if shared and draft_config.encoder_width != target_config.emb_dim:
      raise ValueError(
          f"DRAFTER='shared_encoder': draft/T5Config.encoder_width = "
          f"{draft_config.encoder_width} but the target's emb_dim is "
          f"{target_config.emb_dim}; allowed: encoder_width = "
          f"{target_config.emb_dim} (the draft reads the target's encoder "
          "output).")

  @property
  def order(self) -> Optional[int]:
    """The n-gram order, or None without an n-gram drafter."""
    name = self._ngram_name
    if name is None:
      return None
    return NGRAM_ORDERS.get(name, self.ngram_order or DEFAULT_NGRAM_ORDER)

  def check(self, mode: str = "walltime") -> None:
    """Every setting, before anything is loaded; raises ValueError naming
    the gin macro, the value and what is allowed."""
    if self.drafter not in DRAFTERS:
      raise ValueError(f"DRAFTER={self.drafter!r}: allowed: "
                       f"{', '.join(map(repr, DRAFTERS))}.")
    if mode != "walltime" and self.drafter not in MODEL_DRAFTERS:
      raise ValueError(
          f"DRAFTER={self.drafter!r} with MODE={mode!r}: MODE='alpha' "
          "measures the draft model's α (Corollary 3.6); allowed: "
          "DRAFTER='model' or 'shared_encoder' (or MODE='walltime').")
    if self.drafter == "hierarchical" and (self.inner_drafter
                                           not in INNER_DRAFTERS):
      raise ValueError(f"INNER_DRAFTER={self.inner_drafter!r}: allowed: "
                       f"{', '.join(map(repr, INNER_DRAFTERS))}.")
    for macro, value in (("PROMPT_LOOKUP_MAX", self.prompt_lookup_max),
                         ("INNER_GAMMA", self.inner_gamma)):
      if not _is_int(value) or value < 1:
        raise ValueError(f"{macro}={value!r}: allowed: an integer >= 1.")
    if self.ngram_order is not None:
      name = self._ngram_name
      if not _is_int(self.ngram_order) or self.ngram_order < 1:
        raise ValueError(f"NGRAM_ORDER={self.ngram_order!r}: allowed: an "
                         "integer >= 1 (or None).")
      if name in NGRAM_ORDERS and self.ngram_order != NGRAM_ORDERS[name]:
        raise ValueError(
            f"NGRAM_ORDER={self.ngram_order!r} contradicts {name!r} (order "
            f"{NGRAM_ORDERS[name]}); allowed: None, or DRAFTER='ngram' for "
            "another order.")
    if self._ngram_name and not self.ngram_corpus:
      raise ValueError(
          f"NGRAM_CORPUS={self.ngram_corpus!r}: the {self._ngram_name!r} "
          "drafter counts a corpus; allowed: a text file (one sentence per "
          "line, e.g. the training targets) or a .npz of token ids.")
    threshold = self.adaptive_threshold
    if threshold is not None:
      if not (_is_real(threshold) and 0 < threshold < 1):
        raise ValueError(
            f"ADAPTIVE_THRESHOLD={threshold!r}: allowed: a number in (0, 1) "
            "(a row stops guessing after a guess less likely than it), or "
            "None (off).")
      if self.drafter not in (*MODEL_DRAFTERS, "unigram", "bigram", "ngram"):
        raise ValueError(
            f"ADAPTIVE_THRESHOLD={threshold!r} with DRAFTER="
            f"{self.drafter!r}: allowed with DRAFTER 'model', "
            "'shared_encoder', 'unigram', 'bigram' or 'ngram' (prompt lookup "
            "stops by itself when its match runs out).")

  def ngram_table(self, vocab: Any, vocab_size: int,
                  corpus_path: Optional[str] = None) -> Optional[NGramTable]:
    """The n-gram table (None without an n-gram drafter), counted now.

    Args:
      vocab: the run's vocabulary (tokenizes a text corpus).
      vocab_size: the models' vocabulary size.
      corpus_path: NGRAM_CORPUS resolved to a path (default: as given).

    Raises:
      ValueError naming NGRAM_CORPUS: missing, empty, another vocabulary.
    """
    if self.order is None:
      return None
    path = corpus_path or self.ngram_corpus
    sentences = corpus_lib.read_corpus(path, vocab, vocab_size)
    try:
      return build_ngram_table(sentences, vocab_size, self.order)
    except ValueError as e:
      raise ValueError(f"NGRAM_CORPUS={path!r}: {e}") from None

  def build(self, draft_model: Any, table: Optional[NGramTable],
            vocab_size: int) -> Any:
    """The drafter (for DRAFTER='model' or 'shared_encoder' without a
    threshold, the draft model itself: `decoding.speculative_sample` wraps
    it as always; a shared-encoder draft is a `models.SharedEncoderModel`,
    started from the target's encoder output)."""
    threshold = self.adaptive_threshold

    def cheap(name):
      if name == "prompt_lookup":
        return PromptLookupDrafter(vocab=vocab_size,
                                   max_ngram=self.prompt_lookup_max)
      return NGramDrafter(table, 0.0 if threshold is None else threshold)

    if self.drafter in MODEL_DRAFTERS:
      return (draft_model if threshold is None else ModelDrafter(
          draft_model, confidence_threshold=threshold))
    if self.drafter == "hierarchical":
      return HierarchicalDrafter(draft_model, cheap(self.inner_drafter),
                                 inner_gamma=self.inner_gamma)
    return cheap(self.drafter)

  def label(self, draft_name: str) -> str:
    """What the run's draft is called in metrics.json and the report."""
    if self.drafter in MODEL_DRAFTERS:
      return draft_name
    name = self.drafter
    if self.order is not None and name == "ngram":
      name = f"{self.order}-gram"
    if name == "hierarchical":
      inner = self.inner_drafter
      if self.order is not None and inner == "ngram":
        inner = f"{self.order}-gram"
      return f"{draft_name}+{inner}"
    return name

  def record(self) -> Dict[str, Any]:
    """The settings that matter for this drafter (metrics.json)."""
    out: Dict[str, Any] = {"drafter": self.drafter}
    if self.order is not None:
      out.update(ngram_order=self.order, ngram_corpus=self.ngram_corpus)
    if "prompt_lookup" in (self.drafter, self.inner_drafter
                           if self.drafter == "hierarchical" else None):
      out["prompt_lookup_max"] = self.prompt_lookup_max
    if self.drafter == "hierarchical":
      out.update(inner_drafter=self.inner_drafter, inner_gamma=self.inner_gamma)
    out["adaptive_threshold"] = self.adaptive_threshold
    return out


def propose_seconds(drafter: Any, encoder_input_tokens: np.ndarray,
                    buffer: np.ndarray, length: np.ndarray, *, gamma: int,
                    method: sampling.SamplingMethod, max_len: int,
                    steps: int = 16, repeats: int = 5) -> float:
  """Median seconds of one `drafter.propose` of γ guesses (compilation
  excluded) at `length` (and length + 1: `timing.propose_loop`), on a real
  context.

  Args:
    drafter: any `Drafter`.
    encoder_input_tokens: [B, S] int32 the inputs its state is built from.
    buffer: [B, T] int32 a token buffer (e.g. the target's own output with
      the start token first) and length [B] int32 the known tokens in it.
    gamma, method: as in the decode loop; max_len: the drafter's state size.
  """
  state = drafter.init(jnp.asarray(encoder_input_tokens, jnp.int32), max_len)
  args = (drafter, state, jnp.asarray(buffer, jnp.int32),
          jnp.asarray(length, jnp.int32), jax.random.PRNGKey(0))
  # The draft-loop program the decode benchmark times too (one definition).
  run = functools.partial(timing.propose_loop, gamma=gamma, method=method,
                          steps=steps)
  jax.block_until_ready(run(*args))  # Compile.
  times = [timing.timed(run, *args)[1] for _ in range(repeats)]
  return statistics.median(times) / steps
