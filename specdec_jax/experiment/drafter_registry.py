"""Which drafter a run uses: a spec from a registry, owning its settings.

Each DRAFTER value names a frozen spec (`DrafterSpec`) that holds the
drafter's own settings, each a field naming the macro gin/run.gin binds it
to (`NGramSpec.order = %NGRAM_ORDER`, `gin_utils.setting`). `named` (gin's
`drafter`, bound to DRAFTER) builds the spec DRAFTER names
with its settings as gin binds them; an experiment file may hand one in
instead (`run.drafting = @NGramSpec()`). A spec checks its settings, counts
its n-gram table, builds the drafter, labels it in metrics.json and records
its settings. A new drafter is one `register_drafter` call (tests register
fakes the same way). NGRAM_CORPUS is a run argument: experiment files name
it once for all their points (gin/multi30k_1m.gin), the n-gram specs count
it.

It also holds what a setting's value is (`is_int`, `is_number`, `is_real`),
the type tests every run-argument check uses: a bool is not a number here
(True would pass as 1), and a real must be finite (inf and nan would run,
then be written to JSON as Infinity/NaN).
"""
import dataclasses
import math
import numbers
from typing import Any, Dict, FrozenSet, Mapping, Optional, Tuple

import gin

from specdec_jax.checkpoints import feature_draft
from specdec_jax.config import gin_utils
from specdec_jax.config.gin_utils import setting
from specdec_jax.core.drafters.feature import FeatureDrafter
from specdec_jax.core.drafters.hierarchical import HierarchicalDrafter
from specdec_jax.core.drafters.model import ModelDrafter
from specdec_jax.core.drafters.ngram import NGramDrafter
from specdec_jax.core.drafters.ngram import NGramTable
from specdec_jax.core.drafters.ngram import build_ngram_table
from specdec_jax.core.drafters.prompt_lookup import PromptLookupDrafter
from specdec_jax.experiment import ngram_corpus as corpus_lib

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


def is_int(value: Any) -> bool:
  """An integer, not a bool."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
  """An int or a float, not a bool (finite or not)."""
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
  """A finite int or float, not a bool."""
  return is_number(value) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class DrafterSpec:
  """What one DRAFTER value means; subclasses override what differs. Its
  settings are its fields that name a macro.

  Attributes:
    name: its DRAFTER value.

  Class attributes (what the drafter is):
    uses_draft_model: the run loads the draft checkpoint.
    is_model_step: a guess is one draft-model decoder step (priced as one
      in c); otherwise one `propose` is timed and divided by γ.
    alpha_mode: MODE='alpha' (β of the draft's q) applies.
    reads_target_features: the draft reads the target's hidden states (a
      feature-level draft): DRAFT_CHECKPOINT_PATH is its own checkpoint
      (`check_draft_checkpoint`), not a T5 model of the gin draft/T5Config.
    decode_modes: the decode modes (`decode_modes` names) it drafts for:
      every drafter guesses one path; a tree needs k branches of a draft
      model, speculative beams a draft model's own beam search.
    adaptive_threshold: None: no adaptive γ (the specs that have it hold
      ADAPTIVE_THRESHOLD).
  """
  name: str = "model"
  uses_draft_model = False
  is_model_step = False
  alpha_mode = False
  reads_target_features = False
  decode_modes = ("token", "block")
  adaptive_threshold = None

  choice = property(lambda self: ("DRAFTER", self.name))  # how it is chosen

  def reads(self) -> FrozenSet[str]:
    """The macros of its settings."""
    return frozenset(k.upper() for k in gin_utils.settings(self))

  def components(self) -> Tuple["DrafterSpec", ...]:
    """The specs it is made of (itself, and a hierarchical's inner)."""
    return (self,)

  def ngram_order(self) -> Optional[int]:
    """The n of the n-gram drafter this uses, or None."""
    return None

  def check(self, args: Any) -> None:
    """Its own settings and what it needs of the run's (`args`), before
    anything is loaded; raises ValueError naming the macro."""
    if args.mode == "alpha" and not self.alpha_mode:
      allowed = " or ".join(
          repr(k) for k, s in DRAFTERS.items() if s.alpha_mode)
      raise ValueError(f"DRAFTER={self.name!r} with MODE='alpha': MODE='alpha' "
                       "measures the draft model's α (Corollary 3.6); allowed: "
                       f"DRAFTER={allowed} (or MODE='walltime' or 'infer').")
    threshold, mode = self.adaptive_threshold, args.decode_mode
    if threshold is not None and not (is_real(threshold) and 0 < threshold < 1):
      raise ValueError(
          f"ADAPTIVE_THRESHOLD={threshold!r}: allowed: a number in (0, 1) "
          "(a row stops guessing after a guess less likely than it), or "
          "None (off).")
    if threshold is not None and not mode.one_path:
      raise ValueError(
          f"{gin_utils.choice_words([mode.choice])} with ADAPTIVE_THRESHOLD="
          f"{threshold!r}: {mode.description} drafts γ guesses on each of "
          "its paths every call (adaptive γ stops one path early); allowed: "
          "ADAPTIVE_THRESHOLD=None with it.")

  def check_draft_config(self, draft_config: Any, target_config: Any) -> None:
    """The draft's T5Config against what this drafter needs."""
    del target_config
    if self.uses_draft_model and not draft_config.has_encoder:
      raise ValueError(
          f"DRAFTER={self.name!r}: the draft has no encoder of its own "
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

  def ngram_table(self, vocab: Any, vocab_size: int,
                  corpus_path: str) -> Optional[NGramTable]:
    """The n-gram table (None without an n-gram drafter), counted now.

    Args:
      vocab: the run's vocabulary (tokenizes a text corpus).
      vocab_size: the models' vocabulary size.
      corpus_path: NGRAM_CORPUS resolved to a path.

    Raises:
      ValueError naming NGRAM_CORPUS: missing, empty, another vocabulary.
    """
    order = self.ngram_order()
    if order is None:
      return None
    sentences = corpus_lib.read_corpus(corpus_path, vocab, vocab_size)
    try:
      return build_ngram_table(sentences, vocab_size, order)
    except ValueError as e:
      raise ValueError(f"NGRAM_CORPUS={corpus_path!r}: {e}") from None

  def build(self, draft_model: Any, table: Optional[NGramTable],
            vocab_size: int) -> Any:
    """The drafter, once the models and the n-gram table exist."""
    raise NotImplementedError

  def label(self, draft_name: str) -> str:
    """What the run's draft is called in metrics.json and the report."""
    del draft_name
    return self.name

  def own_record(self) -> Dict[str, Any]:
    """The settings that matter for this drafter (`record`)."""
    return {}

  def record(self, ngram_corpus: Optional[str]) -> Dict[str, Any]:
    """metrics.json's `drafter_settings` (an n-gram drafter's with the
    run's NGRAM_CORPUS, which it counts)."""
    order = self.ngram_order()
    counted = {} if order is None else {
        "ngram_order": order,
        "ngram_corpus": ngram_corpus
    }
    return {
        "drafter": self.name,
        **counted,
        **self.own_record(), "adaptive_threshold": self.adaptive_threshold
    }

  def flat(self) -> Dict[str, Any]:
    """DRAFTER and every built-in drafter setting, by its macro in lower
    case (the run arguments they were: the settings record): its own
    values, the others' defaults."""
    out = {**FLAT_DEFAULTS, "drafter": self.name}
    for spec in self.components():
      out.update(gin_utils.settings(spec))
    return out


def _check_order(order: Any) -> None:
  if order is not None and (not is_int(order) or
                            not 1 <= order <= MAX_NGRAM_ORDER):
    raise ValueError(
        f"NGRAM_ORDER={order!r}: allowed: None ({DEFAULT_NGRAM_ORDER}) or an "
        f"integer from 1 to {MAX_NGRAM_ORDER} (the n-gram table holds every "
        "context of up to n-1 tokens of every NGRAM_CORPUS token: counting "
        "it grows as n²).")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ModelSpec(DrafterSpec):
  """The draft model's decoder steps ('model'); with `shared_encoder`, a
  draft decoder without an encoder reading the target's encoder output
  (`models.SharedEncoderModel`).

  Attributes:
    adaptive_threshold: adaptive γ: a row stops guessing after a guess
      less likely than this, in (0, 1); None = off (DRAFTER 'model',
      'shared_encoder' and the n-gram drafters).
    shared_encoder: DRAFTER 'shared_encoder'.
  """
  adaptive_threshold: Optional[float] = setting("ADAPTIVE_THRESHOLD", None)
  shared_encoder: bool = False
  uses_draft_model = True
  is_model_step = True
  alpha_mode = True
  decode_modes = ("token", "block", "tree", "beam")

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

  def build(self, draft_model, table, vocab_size):
    # Without a threshold the draft model itself: `speculative_decoder`
    # wraps it in a ModelDrafter as always.
    threshold = self.adaptive_threshold
    return (draft_model if threshold is None else ModelDrafter(
        draft_model, confidence_threshold=threshold))

  def label(self, draft_name):
    return draft_name


@gin.configurable
@dataclasses.dataclass(frozen=True)
class NGramSpec(DrafterSpec):
  """Counts of NGRAM_CORPUS (§3.6): 'unigram' and 'bigram' (their order
  fixed by the name) and 'ngram'.

  Attributes:
    order: the n of drafter 'ngram' (None: 3), at most 16.
    adaptive_threshold: as `ModelSpec`'s.
    fixed_order: the order the name says ('unigram' 1, 'bigram' 2), or
      None.
  """
  name: str = "ngram"
  order: Optional[int] = setting("NGRAM_ORDER", None)
  adaptive_threshold: Optional[float] = setting("ADAPTIVE_THRESHOLD", None)
  fixed_order: Optional[int] = None

  def ngram_order(self):
    return self.fixed_order or self.order or DEFAULT_NGRAM_ORDER

  def check(self, args):
    super().check(args)
    _check_order(self.order)
    if self.order is not None and self.fixed_order is not None and (
        self.order != self.fixed_order):
      raise ValueError(
          f"NGRAM_ORDER={self.order!r} contradicts {self.name!r} (order "
          f"{self.fixed_order}); allowed: None, or DRAFTER='ngram' for "
          "another order.")
    if not args.ngram_corpus:
      raise ValueError(
          f"NGRAM_CORPUS={args.ngram_corpus!r}: the {self.name!r} drafter "
          "counts a corpus; allowed: a text file (one sentence per line, "
          "e.g. the training targets) or a .npz of token ids.")

  def build(self, draft_model, table, vocab_size):
    threshold = self.adaptive_threshold
    return NGramDrafter(table, 0.0 if threshold is None else threshold)

  def label(self, draft_name):
    if self.fixed_order is None:
      return f"{self.ngram_order()}-gram"
    return self.name


@gin.configurable
@dataclasses.dataclass(frozen=True)
class PromptLookupSpec(DrafterSpec):
  """Copies from the encoder input (§3.6); stops when its match runs out.

  Attributes:
    max_ngram: the longest suffix prompt lookup matches, 1 to 16.
  """
  name: str = "prompt_lookup"
  max_ngram: int = setting("PROMPT_LOOKUP_MAX", 3)

  def check(self, args):
    super().check(args)
    lookup = self.max_ngram
    if not is_int(lookup) or not 1 <= lookup <= MAX_PROMPT_LOOKUP:
      raise ValueError(
          f"PROMPT_LOOKUP_MAX={lookup!r}: allowed: an integer from 1 to "
          f"{MAX_PROMPT_LOOKUP} (the longest suffix looked up in the input; "
          "each length is compiled on its own, and compiling grows steeply "
          "with it).")

  def build(self, draft_model, table, vocab_size):
    return PromptLookupDrafter(vocab=vocab_size, max_ngram=self.max_ngram)

  def own_record(self):
    return {"prompt_lookup_max": self.max_ngram}


@gin.configurable
@dataclasses.dataclass(frozen=True)
class HierarchicalSpec(DrafterSpec):
  """The draft model, itself sped up by an inner drafter (§5).

  Attributes:
    inner: what speeds up the draft model ('prompt_lookup' or an n-gram
      drafter, with its own settings).
    inner_gamma: INNER_DRAFTER's guesses per draft call, at most
      TASK_FEATURE_LENGTHS['targets'].
    inner_spec: inner's spec (its settings as gin binds them), or None
      for an unknown name (`check` names it).
  """
  name: str = "hierarchical"
  inner: str = setting("INNER_DRAFTER", "prompt_lookup")
  inner_gamma: int = setting("INNER_GAMMA", 4)
  inner_spec: Optional[DrafterSpec] = dataclasses.field(default=None,
                                                        init=False)
  uses_draft_model = True

  def __post_init__(self):
    if isinstance(self.inner, str) and self.inner in INNER_DRAFTERS:
      object.__setattr__(self, "inner_spec",
                         gin_utils.configured(INNER_DRAFTERS[self.inner]))

  def reads(self):
    # The inner drafter guesses without a threshold: the draft model's
    # call ends its inner loop.
    inner = self.inner_spec.reads() if self.inner_spec else frozenset()
    return super().reads() | (inner - {"ADAPTIVE_THRESHOLD"})

  def components(self):
    return (self,) + ((self.inner_spec,) if self.inner_spec else ())

  def ngram_order(self):
    return self.inner_spec.ngram_order()

  def check(self, args):
    super().check(args)
    if self.inner_spec is None:
      raise ValueError(f"INNER_DRAFTER={self.inner!r}: allowed: "
                       f"{', '.join(map(repr, INNER_DRAFTERS))}.")
    targets = args.task_feature_lengths.get("targets")
    if not is_int(self.inner_gamma) or self.inner_gamma < 1:
      raise ValueError(
          f"INNER_GAMMA={self.inner_gamma!r}: allowed: an "
          "integer >= 1 (at most TASK_FEATURE_LENGTHS['targets']).")
    # As GAMMA: the draft model scores INNER_GAMMA + 1 tokens per call
    # (100000 compiled into a 720 GB allocation).
    if is_int(targets) and self.inner_gamma > targets:
      raise ValueError(
          f"INNER_GAMMA={self.inner_gamma} is more than "
          f"TASK_FEATURE_LENGTHS['targets']={targets}: an inner call cannot "
          "keep more guesses than there are tokens to decode. Allowed: 1 "
          f"to {targets}.")
    self.inner_spec.check(args)

  def build(self, draft_model, table, vocab_size):
    return HierarchicalDrafter(draft_model,
                               self.inner_spec.build(None, table, vocab_size),
                               inner_gamma=self.inner_gamma)

  def label(self, draft_name):
    return f"{draft_name}+{self.inner_spec.label(draft_name)}"

  def own_record(self):
    return {
        **self.inner_spec.own_record(), "inner_drafter": self.inner,
        "inner_gamma": self.inner_gamma
    }


@gin.configurable
@dataclasses.dataclass(frozen=True)
class FeatureSpec(DrafterSpec):
  """A feature-level (EAGLE-style) draft reading the target's hidden states
  (issue 34, `drafters.FeatureDrafter`). DRAFT_CHECKPOINT_PATH is a
  `checkpoints.feature_draft` (feature_config.json beside the weights),
  bound to the loaded target (`load_draft_model`); the speculative decoder
  runs `target.with_features()` (`decoding.speculative_target`). Priced as the
  loop runs it (one `propose` over γ), like every drafter."""
  name: str = "feature"
  uses_draft_model = True
  reads_target_features = True
  decode_modes = ("token", "block", "tree")

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

  def build(self, draft_model, table, vocab_size):
    return FeatureDrafter(draft_model)

  def label(self, draft_name):
    return draft_name


# INNER_DRAFTER's values (what speeds up the draft model in 'hierarchical').
INNER_DRAFTERS: Mapping[str, DrafterSpec] = {
    "prompt_lookup": PromptLookupSpec(),
    "unigram": NGramSpec(name="unigram", fixed_order=1),
    "bigram": NGramSpec(name="bigram", fixed_order=2),
    "ngram": NGramSpec(),
}
# DRAFTER's values, each a spec with its settings' defaults (`named`
# configures it). Insertion order is the order error messages list them.
DRAFTERS: Dict[str, DrafterSpec] = {
    "model": ModelSpec(),
    **{
        k: INNER_DRAFTERS[k] for k in ("unigram", "bigram", "ngram")
    },
    "prompt_lookup": INNER_DRAFTERS["prompt_lookup"],
    "hierarchical": HierarchicalSpec(),
    "shared_encoder": ModelSpec(name="shared_encoder", shared_encoder=True),
    "feature": FeatureSpec(),
}
# The paper's drafter: the draft model, every built-in drafter's setting at
# its default (`DrafterSpec.flat`).
_BUILT_IN = (ModelSpec, NGramSpec, PromptLookupSpec, HierarchicalSpec)
FLAT_DEFAULTS: Dict[str, Any] = {
    "drafter": "model",
    **{
        k: v for c in _BUILT_IN for k, v in gin_utils.settings(c).items()
    }
}


@gin.configurable("drafter")
def named(name: str = "model") -> DrafterSpec:
  """The spec DRAFTER names, with its settings as gin binds them.

  Args:
    name: what guesses: 'model' (the draft T5 model), 'shared_encoder'
      (a draft decoder without an encoder, reading the target's encoder
      output: draft/T5Config.num_encoder_layers = 0), 'unigram', 'bigram',
      'ngram' (counts of ngram_corpus), 'prompt_lookup' (copies from the
      input), 'hierarchical' (the draft model, itself sped up by
      INNER_DRAFTER) or 'feature' (a feature-level, EAGLE-style draft
      reading the target's hidden states: draft_checkpoint_path is its
      checkpoint, with feature_config.json).

  Raises:
    ConfigError: naming DRAFTER, its value and the registered values.
  """
  if not isinstance(name, str) or name not in DRAFTERS:
    raise gin_utils.ConfigError(f"DRAFTER={name!r}: allowed: "
                                f"{', '.join(map(repr, DRAFTERS))}.")
  return gin_utils.configured(DRAFTERS[name])


def supporting(mode_name: str) -> Tuple[str, ...]:
  """The DRAFTER values whose spec drafts for the decode mode `mode_name`."""
  return tuple(
      k for k, spec in DRAFTERS.items() if mode_name in spec.decode_modes)


def register_drafter(name: str, spec: DrafterSpec) -> None:
  """Makes DRAFTER=name build with `spec` (an extension, or a test's fake)."""
  if not isinstance(spec, DrafterSpec):
    raise TypeError(f"spec must be a DrafterSpec, got {type(spec).__name__}")
  DRAFTERS[name] = dataclasses.replace(spec, name=name)
