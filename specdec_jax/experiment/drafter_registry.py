"""Which drafter a run uses: the DRAFTER macro, looked up in a registry.

Each DRAFTER value names a small frozen spec (`DrafterSpec`) that checks the
run's drafter settings, builds the drafter, labels it in metrics.json and
records its settings; `DrafterSettings` holds what `run` reads from gin
(DRAFTER, NGRAM_CORPUS, NGRAM_ORDER, PROMPT_LOOKUP_MAX, INNER_DRAFTER,
INNER_GAMMA, ADAPTIVE_THRESHOLD) and asks its spec. A new drafter is one
`register_drafter` call (tests register fakes the same way).
"""
import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple

from specdec_jax.core.drafters.feature import FeatureDrafter
from specdec_jax.core.drafters.hierarchical import HierarchicalDrafter
from specdec_jax.core.drafters.model import ModelDrafter
from specdec_jax.core.drafters.ngram import NGramDrafter
from specdec_jax.core.drafters.ngram import NGramTable
from specdec_jax.core.drafters.ngram import build_ngram_table
from specdec_jax.core.drafters.prompt_lookup import PromptLookupDrafter
from specdec_jax.experiment import ngram_corpus as corpus_lib
from specdec_jax.checkpoints import feature_draft
from specdec_jax.experiment import values

DEFAULT_NGRAM_ORDER = 3  # DRAFTER='ngram' without NGRAM_ORDER.
# The largest NGRAM_ORDER: the table pads every corpus sentence with n
# tokens and holds every context of 1..n-1 tokens of every corpus token, so
# counting it grows as n² (n = 16: about 20 s and 1.3 GB for Multi30k's
# 29,000 sentences; n = 100000 ran 10 minutes past 7 GB without a word).
MAX_NGRAM_ORDER = 16
# The largest PROMPT_LOOKUP_MAX: each suffix length is compiled on its own,
# and compiling grows steeply with it (512 input tokens, on a CPU: 16 in
# 5 s, 32 in 19 s, 128 in 500 s).
MAX_PROMPT_LOOKUP = 16


@dataclasses.dataclass(frozen=True)
class DrafterSpec:
  """What one DRAFTER value means; subclasses override what differs.

  Attributes:
    uses_draft_model: the run loads the draft checkpoint.
    is_model_step: a guess is one draft-model decoder step (priced as one
      in c); otherwise one `propose` is timed and divided by γ.
    adaptive: ADAPTIVE_THRESHOLD (a row stops guessing early) applies.
    alpha_mode: MODE='alpha' (β of the draft's q) applies.
    reads_target_features: the draft reads the target's hidden states (a
      feature-level draft): DRAFT_CHECKPOINT_PATH is its own checkpoint
      (`check_draft_checkpoint`), not a T5 model of the gin draft/T5Config.
    decode_modes: the decode modes (`decode_modes` names) it drafts for:
      every drafter guesses one path; a tree needs k branches of a draft
      model, speculative beams a draft model's own beam search.
  """
  uses_draft_model: bool = False
  is_model_step: bool = False
  adaptive: bool = False
  alpha_mode: bool = False
  reads_target_features: bool = False
  decode_modes: Tuple[str, ...] = ("token", "block")

  def ngram_order(self, settings: "DrafterSettings") -> Optional[int]:
    """The n of the n-gram drafter this uses, or None."""
    del settings
    return None

  def check(self, settings: "DrafterSettings") -> None:
    """This drafter's own settings; raises ValueError naming the macro."""
    del settings

  def check_draft_config(self, draft_config: Any, target_config: Any) -> None:
    """The draft's T5Config against what this drafter needs."""
    del target_config
    if self.uses_draft_model and not draft_config.has_encoder:
      raise ValueError(
          "DRAFTER=...: the draft has no encoder of its own "
          "(draft/T5Config.num_encoder_layers = 0: a shared-encoder draft); "
          "allowed: DRAFTER='shared_encoder'.")

  def check_draft_checkpoint(self, checkpoint: Optional[str],
                             target_config: Any) -> Optional[Dict[str, Any]]:
    """A draft checkpoint that carries its own config, against the target.

    Args:
      checkpoint: DRAFT_CHECKPOINT_PATH's step folder (resolved), or None.
      target_config: the target's T5Config.

    Returns:
      The draft's config as settings record it, or None when the gin
      draft/T5Config describes the draft (every drafter but 'feature').
    """
    del checkpoint, target_config
    return None

  def build(self, settings: "DrafterSettings", draft_model: Any,
            table: Optional[NGramTable], vocab_size: int) -> Any:
    raise NotImplementedError

  def label(self, settings: "DrafterSettings", draft_name: str) -> str:
    """The draft's name in metrics.json and the report."""
    del draft_name
    return settings.drafter

  def record(self, settings: "DrafterSettings") -> Dict[str, Any]:
    """The settings that matter for this drafter (metrics.json)."""
    del settings
    return {}


@dataclasses.dataclass(frozen=True)
class ModelSpec(DrafterSpec):
  """The draft model's decoder steps ('model'); with `shared_encoder`, a
  draft decoder without an encoder reading the target's encoder output
  (`models.SharedEncoderModel`)."""
  uses_draft_model: bool = True
  is_model_step: bool = True
  adaptive: bool = True
  alpha_mode: bool = True
  shared_encoder: bool = False
  decode_modes: Tuple[str, ...] = ("token", "block", "tree", "beam")

  def check_draft_config(self, draft_config: Any, target_config: Any) -> None:
    shared = not draft_config.has_encoder
    if self.shared_encoder and not shared:
      raise ValueError(
          "DRAFTER='shared_encoder': the draft has an encoder of its own "
          f"(draft/T5Config.num_encoder_layers = "
          f"{draft_config.num_encoder_layers}); allowed: a draft decoder "
          "with num_encoder_layers = 0 and encoder_width = the target's "
          f"emb_dim ({target_config.emb_dim}), e.g. "
          "gin/models/draft/multi30k_shared_encoder_1m.gin.")
    if not self.shared_encoder:
      super().check_draft_config(draft_config, target_config)
    elif draft_config.encoder_width != target_config.emb_dim:
      raise ValueError(
          f"DRAFTER='shared_encoder': draft/T5Config.encoder_width = "
          f"{draft_config.encoder_width} but the target's emb_dim is "
          f"{target_config.emb_dim}; allowed: encoder_width = "
          f"{target_config.emb_dim} (the draft reads the target's encoder "
          "output).")

  def build(self, settings, draft_model, table, vocab_size):
    # Without a threshold the draft model itself: `speculative_decoder`
    # wraps it in a ModelDrafter as always.
    threshold = settings.adaptive_threshold
    return (draft_model if threshold is None else ModelDrafter(
        draft_model, confidence_threshold=threshold))

  def label(self, settings, draft_name):
    return draft_name


@dataclasses.dataclass(frozen=True)
class NGramSpec(DrafterSpec):
  """Counts of NGRAM_CORPUS (§3.6); `order` None: NGRAM_ORDER or 3."""
  adaptive: bool = True
  order: Optional[int] = None

  def ngram_order(self, settings):
    return self.order or settings.ngram_order or DEFAULT_NGRAM_ORDER

  def check(self, settings):
    name = settings.drafter
    if settings.ngram_order is not None and self.order is not None and (
        settings.ngram_order != self.order):
      raise ValueError(
          f"NGRAM_ORDER={settings.ngram_order!r} contradicts {name!r} (order "
          f"{self.order}); allowed: None, or DRAFTER='ngram' for another "
          "order.")
    if not settings.ngram_corpus:
      raise ValueError(
          f"NGRAM_CORPUS={settings.ngram_corpus!r}: the {name!r} drafter "
          "counts a corpus; allowed: a text file (one sentence per line, "
          "e.g. the training targets) or a .npz of token ids.")

  def build(self, settings, draft_model, table, vocab_size):
    threshold = settings.adaptive_threshold
    return NGramDrafter(table, 0.0 if threshold is None else threshold)

  def label(self, settings, draft_name):
    if self.order is None:
      return f"{self.ngram_order(settings)}-gram"
    return settings.drafter

  def record(self, settings):
    return {
        "ngram_order": self.ngram_order(settings),
        "ngram_corpus": settings.ngram_corpus
    }


@dataclasses.dataclass(frozen=True)
class PromptLookupSpec(DrafterSpec):
  """Copies from the encoder input (§3.6); stops when its match runs out."""

  def build(self, settings, draft_model, table, vocab_size):
    return PromptLookupDrafter(vocab=vocab_size,
                               max_ngram=settings.prompt_lookup_max)

  def record(self, settings):
    return {"prompt_lookup_max": settings.prompt_lookup_max}


@dataclasses.dataclass(frozen=True)
class HierarchicalSpec(DrafterSpec):
  """The draft model, itself sped up by INNER_DRAFTER (§5)."""
  uses_draft_model: bool = True

  def inner(self, settings) -> DrafterSpec:
    return INNER_DRAFTERS[settings.inner_drafter]

  def ngram_order(self, settings):
    return self.inner(settings).ngram_order(
        dataclasses.replace(settings, drafter=settings.inner_drafter))

  def check(self, settings):
    if settings.inner_drafter not in INNER_DRAFTERS:
      raise ValueError(f"INNER_DRAFTER={settings.inner_drafter!r}: allowed: "
                       f"{', '.join(map(repr, INNER_DRAFTERS))}.")
    self.inner(settings).check(
        dataclasses.replace(settings, drafter=settings.inner_drafter))

  def build(self, settings, draft_model, table, vocab_size):
    inner = dataclasses.replace(settings, drafter=settings.inner_drafter)
    return HierarchicalDrafter(
        draft_model,
        self.inner(settings).build(inner, None, table, vocab_size),
        inner_gamma=settings.inner_gamma)

  def label(self, settings, draft_name):
    inner = dataclasses.replace(settings, drafter=settings.inner_drafter)
    return f"{draft_name}+{self.inner(settings).label(inner, draft_name)}"

  def record(self, settings):
    inner = dataclasses.replace(settings, drafter=settings.inner_drafter)
    return {
        **self.inner(settings).record(inner), "inner_drafter":
            settings.inner_drafter,
        "inner_gamma": settings.inner_gamma
    }


@dataclasses.dataclass(frozen=True)
class FeatureSpec(DrafterSpec):
  """A feature-level (EAGLE-style) draft reading the target's hidden states
  (issue 34, `drafters.FeatureDrafter`). DRAFT_CHECKPOINT_PATH is a
  `checkpoints.feature_draft` (feature_config.json beside the weights),
  bound to the loaded target (`load_draft_model`); the speculative decoder
  runs `target.with_features()` (`decoding.speculative_target`). Priced as the
  loop runs it (one `propose` over γ), like every drafter."""
  uses_draft_model: bool = True
  reads_target_features: bool = True
  decode_modes: Tuple[str, ...] = ("token", "block", "tree")

  def check_draft_config(self, draft_config, target_config):
    # The gin draft/T5Config does not describe this draft: its own config
    # is checked against the target in `check_draft_checkpoint`.
    del draft_config, target_config

  def check_draft_checkpoint(self, checkpoint, target_config):
    if not checkpoint:
      raise ValueError(
          "DRAFTER='feature' with DRAFT_CHECKPOINT_PATH=None: a feature-level "
          "draft has no random-weight stand-in; allowed: the folder of a "
          "feature draft's checkpoint (feature_config.json beside it), e.g. "
          "'pretrained/multi30k/feature_1m' (trained by "
          "train/multi30k_feature_drafter.gin).")
    try:
      config = feature_draft.read_config(checkpoint)
    except (ValueError, TypeError) as e:
      raise ValueError(f"DRAFTER='feature' with DRAFT_CHECKPOINT_PATH: {e} "
                       "Allowed: a feature-level draft's checkpoint (written "
                       "by train/multi30k_feature_drafter.gin).") from None
    want = (target_config.emb_dim, target_config.vocab_size)
    if (config.feature_dim, config.vocab_size) != want:
      raise ValueError(
          f"DRAFTER='feature': DRAFT_CHECKPOINT_PATH {checkpoint} reads "
          f"features of width {config.feature_dim} over a vocabulary of "
          f"{config.vocab_size}, but the target has emb_dim "
          f"{target_config.emb_dim} and vocab_size "
          f"{target_config.vocab_size}; allowed: a feature draft trained "
          f"for this target (feature_dim = {want[0]}, vocab_size = "
          f"{want[1]}).")
    return feature_draft.config_fields(config)

  def build(self, settings, draft_model, table, vocab_size):
    return FeatureDrafter(draft_model)

  def label(self, settings, draft_name):
    return draft_name


# DRAFTER's values. Insertion order is the order error messages list them.
DRAFTERS: Dict[str, DrafterSpec] = {
    "model": ModelSpec(),
    "unigram": NGramSpec(order=1),
    "bigram": NGramSpec(order=2),
    "ngram": NGramSpec(),
    "prompt_lookup": PromptLookupSpec(),
    "hierarchical": HierarchicalSpec(),
    "shared_encoder": ModelSpec(shared_encoder=True),
    "feature": FeatureSpec(),
}
# INNER_DRAFTER's values (what speeds up the draft model in 'hierarchical').
INNER_DRAFTERS: Mapping[str, DrafterSpec] = {
    k: DRAFTERS[k] for k in ("prompt_lookup", "unigram", "bigram", "ngram")
}


def supporting(mode_name: str) -> Tuple[str, ...]:
  """The DRAFTER values whose spec drafts for the decode mode `mode_name`."""
  return tuple(
      k for k, spec in DRAFTERS.items() if mode_name in spec.decode_modes)


def register_drafter(name: str, spec: DrafterSpec) -> None:
  """Makes DRAFTER=name build with `spec` (an extension, or a test's fake)."""
  if not isinstance(spec, DrafterSpec):
    raise TypeError(f"spec must be a DrafterSpec, got {type(spec).__name__}")
  DRAFTERS[name] = spec


@dataclasses.dataclass(frozen=True)
class DrafterSettings:
  """The run's drafter (docs/usage/macros.md).

  Attributes:
    drafter: DRAFTER, a key of DRAFTERS.
    ngram_corpus: NGRAM_CORPUS, the corpus of 'unigram' / 'bigram' /
      'ngram' (also as INNER_DRAFTER): text or a .npz of ids.
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
  def spec(self) -> DrafterSpec:
    return DRAFTERS[self.drafter]

  @property
  def uses_draft_model(self) -> bool:
    return self.spec.uses_draft_model

  @property
  def is_model_step(self) -> bool:
    return self.spec.is_model_step

  @property
  def order(self) -> Optional[int]:
    """The n-gram order, or None without an n-gram drafter."""
    return self.spec.ngram_order(self)

  def check(self, mode: str = "walltime") -> None:
    """Every setting, before anything is loaded; raises ValueError naming
    the gin macro, the value and what is allowed."""
    if self.drafter not in DRAFTERS:
      raise ValueError(f"DRAFTER={self.drafter!r}: allowed: "
                       f"{', '.join(map(repr, DRAFTERS))}.")
    spec = self.spec
    if mode != "walltime" and not spec.alpha_mode:
      allowed = " or ".join(
          repr(k) for k, s in DRAFTERS.items() if s.alpha_mode)
      raise ValueError(
          f"DRAFTER={self.drafter!r} with MODE={mode!r}: MODE='alpha' "
          "measures the draft model's α (Corollary 3.6); allowed: "
          f"DRAFTER={allowed} (or MODE='walltime').")
    self._check_sizes()
    spec.check(self)
    self._check_threshold()

  def _check_sizes(self) -> None:
    """PROMPT_LOOKUP_MAX, INNER_GAMMA (>= 1; at most the decode length:
    `arguments`) and NGRAM_ORDER, capped where the cost grows steeply."""
    lookup, order = self.prompt_lookup_max, self.ngram_order
    if not values.is_int(lookup) or not 1 <= lookup <= MAX_PROMPT_LOOKUP:
      raise ValueError(
          f"PROMPT_LOOKUP_MAX={lookup!r}: allowed: an integer from 1 to "
          f"{MAX_PROMPT_LOOKUP} (the longest suffix looked up in the input; "
          "each length is compiled on its own, and compiling grows steeply "
          "with it).")
    if not values.is_int(self.inner_gamma) or self.inner_gamma < 1:
      raise ValueError(
          f"INNER_GAMMA={self.inner_gamma!r}: allowed: an "
          "integer >= 1 (at most TASK_FEATURE_LENGTHS['targets']).")
    if order is not None and (not values.is_int(order) or
                              not 1 <= order <= MAX_NGRAM_ORDER):
      raise ValueError(
          f"NGRAM_ORDER={order!r}: allowed: None ({DEFAULT_NGRAM_ORDER}) or an "
          f"integer from 1 to {MAX_NGRAM_ORDER} (the n-gram table holds every "
          "context of up to n-1 tokens of every NGRAM_CORPUS token: counting "
          "it grows as n²).")

  def _check_threshold(self) -> None:
    threshold = self.adaptive_threshold
    if threshold is None:
      return
    if not (values.is_real(threshold) and 0 < threshold < 1):
      raise ValueError(
          f"ADAPTIVE_THRESHOLD={threshold!r}: allowed: a number in (0, 1) "
          "(a row stops guessing after a guess less likely than it), or "
          "None (off).")
    if not self.spec.adaptive:
      allowed = ", ".join(repr(k) for k, s in DRAFTERS.items() if s.adaptive)
      raise ValueError(
          f"ADAPTIVE_THRESHOLD={threshold!r} with DRAFTER="
          f"{self.drafter!r}: allowed with DRAFTER {allowed} (prompt lookup "
          "stops by itself when its match runs out).")

  def check_draft_config(self, draft_config: Any, target_config: Any) -> None:
    """DRAFTER against the draft's T5Config; raises ValueError."""
    try:
      self.spec.check_draft_config(draft_config, target_config)
    except ValueError as e:
      raise ValueError(
          str(e).replace("DRAFTER=...", f"DRAFTER={self.drafter!r}")) from None

  def check_draft_checkpoint(self, checkpoint: Optional[str],
                             target_config: Any) -> Optional[Dict[str, Any]]:
    """DRAFTER's own draft checkpoint against the target (a feature draft);
    its config for the settings record, or None; raises ValueError."""
    return self.spec.check_draft_checkpoint(checkpoint, target_config)

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
    """The drafter, once the models and the n-gram table exist."""
    return self.spec.build(self, draft_model, table, vocab_size)

  def label(self, draft_name: str) -> str:
    """What the run's draft is called in metrics.json and the report."""
    return self.spec.label(self, draft_name)

  def record(self) -> Dict[str, Any]:
    """The settings that matter for this drafter (metrics.json)."""
    return {
        "drafter": self.drafter,
        **self.spec.record(self), "adaptive_threshold": self.adaptive_threshold
    }
