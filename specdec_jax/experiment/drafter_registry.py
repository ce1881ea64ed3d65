"""Which drafter a run uses: a spec from a registry, owning its settings.

DRAFTER names a frozen spec (`named`, gin's `drafter`) holding its own
settings as fields naming their macros (`NGramSpec.order = %NGRAM_ORDER`).
A spec checks its settings, counts its n-gram table, builds the drafter,
labels it and records its settings; a new drafter is one `register_drafter`
call. The n-gram drafters count NGRAM_CORPUS (`read_corpus`). `is_int`,
`is_number`, `is_real` are the type tests of every setting check: a bool
is no number, a real is finite (inf would be written to JSON as Infinity).
"""
import dataclasses
import io
import math
import numbers
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

import gin
import numpy as np

from specdec_jax.config import flag_utils
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
from specdec_jax.files import io_utils

DEFAULT_NGRAM_ORDER = 3  # DRAFTER='ngram' without NGRAM_ORDER.
# Counting the table grows as n² (n = 16: about 20 s and 1.3 GB for
# Multi30k's 29,000 sentences).
MAX_NGRAM_ORDER = 16
# Each suffix length is compiled on its own (on a CPU: 16 in 5 s, 128 in
# 500 s).
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
  """What one DRAFTER value (`name`) means; subclasses override what
  differs. `is_model_step`: a guess is one draft-model decoder step (priced
  as one in c; otherwise one `propose` over γ); `reads_target_features`: a
  feature-level draft, whose DRAFT_CHECKPOINT_PATH carries its own config.
  """
  name: str = "model"
  uses_draft_model = False
  is_model_step = False
  alpha_mode = False
  reads_target_features = False
  decode_modes = ("token", "block")
  adaptive_threshold = None

  choice = property(lambda self: ("DRAFTER", self.name))

  @property
  def decodes_draft_model(self) -> bool:
    """Whether it drafts with the gin draft/T5Config's T5 model, whose
    decode path DRAFT_DECODE_PATH chooses (a feature draft is no T5)."""
    return self.uses_draft_model and not self.reads_target_features

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
    """Its own settings and what it needs of the run's; ValueError."""
    if args.mode == "alpha" and not self.alpha_mode:
      allowed = " or ".join(
          repr(k) for k, s in DRAFTERS.items() if s.alpha_mode)
      raise ValueError(f"DRAFTER={self.name!r} with MODE='alpha': allowed: "
                       f"DRAFTER={allowed} (the draft model's α), or "
                       "MODE='walltime' or 'infer'.")
    threshold, mode = self.adaptive_threshold, args.decode_mode
    if threshold is not None and not (is_real(threshold) and 0 < threshold < 1):
      raise ValueError(f"ADAPTIVE_THRESHOLD={threshold!r}: allowed: a number "
                       "in (0, 1), or None (off).")
    if threshold is not None and not mode.one_path:
      raise ValueError(
          f"{gin_utils.choice_words([mode.choice])} with ADAPTIVE_THRESHOLD="
          f"{threshold!r}: {mode.description} drafts γ guesses on every "
          "path; allowed: ADAPTIVE_THRESHOLD=None with it.")

  def check_draft_config(self, draft_config: Any, target_config: Any) -> None:
    """The draft's T5Config against what this drafter needs."""
    del target_config
    if self.uses_draft_model and not draft_config.has_encoder:
      raise ValueError(f"DRAFTER={self.name!r}: the draft has no encoder of "
                       "its own; allowed: DRAFTER='shared_encoder'.")

  def check_draft_checkpoint(self, checkpoint: Optional[str],
                             target_config: Any) -> Optional[Dict[str, Any]]:
    """The config a draft checkpoint (DRAFT_CHECKPOINT_PATH's step folder)
    carries, checked against the target's; None: the gin draft/T5Config's."""
    del checkpoint, target_config
    return None

  def ngram_table(self, vocab: Any, vocab_size: int,
                  corpus_path: str) -> Optional[NGramTable]:
    """The n-gram table of NGRAM_CORPUS (resolved), counted now, or None
    without an n-gram drafter; ValueError naming NGRAM_CORPUS."""
    order = self.ngram_order()
    if order is None:
      return None
    sentences = read_corpus(corpus_path, vocab, vocab_size)
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
    """metrics.json's `drafter_settings`."""
    order = self.ngram_order()
    counted = {} if order is None else dict(ngram_order=order,
                                            ngram_corpus=ngram_corpus)
    return dict(drafter=self.name, **counted, **self.own_record(),
                adaptive_threshold=self.adaptive_threshold)

  def flat(self) -> Dict[str, Any]:
    """DRAFTER and every built-in drafter setting, by its macro in lower
    case: its own values, the others' defaults (the settings record)."""
    out = {**FLAT_DEFAULTS, "drafter": self.name}
    for spec in self.components():
      out.update(gin_utils.settings(spec))
    return out


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ModelSpec(DrafterSpec):
  """The draft model's decoder steps ('model'); `shared_encoder`: a draft
  decoder without an encoder reading the target's encoder output.

  Attributes:
    adaptive_threshold: adaptive γ: a row stops guessing after a guess
      less likely than this, in (0, 1); None = off (DRAFTER 'model',
      'shared_encoder' and the n-gram drafters).
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
          "DRAFTER='shared_encoder': the draft has an encoder of its own; "
          "allowed: a draft decoder with num_encoder_layers = 0 and "
          f"encoder_width = the target's emb_dim ({target_config.emb_dim}), "
          "e.g. gin/models/draft/multi30k_shared_encoder_1m.gin.")
    if not self.shared_encoder:
      super().check_draft_config(draft_config, target_config)
    elif draft_config.encoder_width != target_config.emb_dim:
      raise ValueError(
          f"DRAFTER='shared_encoder': draft/T5Config.encoder_width = "
          f"{draft_config.encoder_width} but the target's emb_dim is "
          f"{target_config.emb_dim}; allowed: encoder_width = "
          f"{target_config.emb_dim}.")

  def build(self, draft_model, table, vocab_size):
    # Without a threshold `speculative_decoder` wraps it as always.
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
  """
  name: str = "ngram"
  order: Optional[int] = setting("NGRAM_ORDER", None)
  adaptive_threshold: Optional[float] = setting("ADAPTIVE_THRESHOLD", None)
  fixed_order: Optional[int] = None

  def ngram_order(self):
    return self.fixed_order or self.order or DEFAULT_NGRAM_ORDER

  def check(self, args):
    super().check(args)
    order = self.order
    if order is not None and not (is_int(order) and
                                  1 <= order <= MAX_NGRAM_ORDER):
      raise ValueError(
          f"NGRAM_ORDER={order!r}: allowed: None ({DEFAULT_NGRAM_ORDER}) or "
          f"an integer from 1 to {MAX_NGRAM_ORDER} (counting NGRAM_CORPUS "
          "grows as n²).")
    if self.order is not None and self.fixed_order is not None and (
        self.order != self.fixed_order):
      raise ValueError(f"NGRAM_ORDER={self.order!r} contradicts {self.name!r}"
                       "; allowed: None, or DRAFTER='ngram'.")
    if not args.ngram_corpus:
      raise ValueError(
          f"NGRAM_CORPUS={args.ngram_corpus!r}: the {self.name!r} drafter "
          "counts a corpus; allowed: a text file (one sentence per line) or "
          "a .npz of token ids.")

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
          f"{MAX_PROMPT_LOOKUP} (each length is compiled on its own).")

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
    # The inner drafter guesses without a threshold.
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
      raise ValueError(f"INNER_GAMMA={self.inner_gamma!r}: allowed: an "
                       "integer >= 1.")
    # As GAMMA: 100000 compiled into a 720 GB allocation.
    if is_int(targets) and self.inner_gamma > targets:
      raise ValueError(
          f"INNER_GAMMA={self.inner_gamma} is more than "
          f"TASK_FEATURE_LENGTHS['targets']={targets}. Allowed: 1 to "
          f"{targets}.")
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
  """A feature-level (EAGLE-style) draft of the target's hidden states:
  DRAFT_CHECKPOINT_PATH is a `checkpoints.feature_draft`."""
  name: str = "feature"
  uses_draft_model = True
  reads_target_features = True
  decode_modes = ("token", "block", "tree")

  def check_draft_config(self, draft_config, target_config):
    # Its own config is checked in `check_draft_checkpoint`.
    del draft_config, target_config

  def check_draft_checkpoint(self, checkpoint, target_config):
    if not checkpoint:
      raise ValueError(
          "DRAFTER='feature' with DRAFT_CHECKPOINT_PATH=None: allowed: the "
          "folder of a feature draft's checkpoint, e.g. "
          "'pretrained/multi30k/feature_1m'.")
    try:
      config = feature_draft.read_config(checkpoint)
    except (ValueError, TypeError) as e:
      raise ValueError(f"DRAFTER='feature' with DRAFT_CHECKPOINT_PATH: {e} "
                       "Allowed: a feature-level draft's checkpoint.") from None
    want = (target_config.emb_dim, target_config.vocab_size)
    if (config.feature_dim, config.vocab_size) != want:
      raise ValueError(
          f"DRAFTER='feature': DRAFT_CHECKPOINT_PATH {checkpoint} reads "
          f"features of width {config.feature_dim} over a vocabulary of "
          f"{config.vocab_size}, but the target has emb_dim {want[0]} and "
          f"vocab_size {want[1]}; allowed: a feature draft trained for this "
          f"target (feature_dim = {want[0]}, vocab_size = {want[1]}).")
    return feature_draft.config_fields(config)

  def build(self, draft_model, table, vocab_size):
    return FeatureDrafter(draft_model)

  def label(self, draft_name):
    return draft_name


INNER_DRAFTERS: Mapping[str, DrafterSpec] = {
    "prompt_lookup": PromptLookupSpec(),
    "unigram": NGramSpec(name="unigram", fixed_order=1),
    "bigram": NGramSpec(name="bigram", fixed_order=2),
    "ngram": NGramSpec(),
}
# DRAFTER's values, in the order error messages list them.
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

  Raises ConfigError naming DRAFTER, its value and the registered values.
  """
  if not isinstance(name, str) or name not in DRAFTERS:
    raise flag_utils.ConfigError(f"DRAFTER={name!r}: allowed: "
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


# -- NGRAM_CORPUS: a text file (one sentence per line, tokenized with the
# run's vocabulary, EOS appended; mostly unknown pieces is refused: another
# language or script), or a `.npz` of token ids (`write_token_corpus`).
MAX_UNKNOWN_SHARE = 0.05
UNK_ID = 2  # T5's unknown piece.
EOS_ID = 1


def write_token_corpus(path: str, sentences: Sequence[Sequence[int]],
                       vocab_size: int) -> None:
  """Writes token-id sentences as a `.npz` corpus (atomically)."""
  ids = [np.asarray(s, np.int32).ravel() for s in sentences]
  buffer = io.BytesIO()
  np.savez(buffer, ids=np.concatenate(ids) if ids else np.zeros(0, np.int32),
           lengths=np.array([len(s) for s in ids],
                            np.int64), vocab_size=np.int64(vocab_size))
  io_utils.atomic_write(path, buffer.getvalue())


def read_corpus(path: str, vocab: Any, vocab_size: int,
                what: str = "NGRAM_CORPUS") -> List[np.ndarray]:
  """Token-id sentences [n_i] int32 from `path`, a text file read with
  `vocab` or a .npz of ids of a `vocab_size` vocabulary; ValueError naming
  `what` (the macro), the path and what is wrong."""
  allowed = "a text file with one sentence per line, or a .npz of token ids"
  try:
    data = io_utils.read_bytes(path) if path else None
  except (FileNotFoundError, NotADirectoryError):
    data = None
  except io_utils.RefusedFile as e:
    raise ValueError(f"{what}={path!r}: {e.strerror}. Allowed: "
                     f"{allowed}.") from None
  if data is None:
    raise ValueError(f"{what}={path!r}: no such file ({allowed}).")
  if path.endswith(".npz"):
    return _read_ids(data, path, vocab_size, what)
  try:
    # Lines as a text file reads them (universal newlines).
    lines = [line.strip() for line in io.StringIO(data.decode("utf-8"), None)]
  except UnicodeDecodeError as e:
    raise ValueError(f"{what}={path!r} is not UTF-8 text ({e}).") from None
  sentences = [
      np.asarray(list(vocab.encode(line)) + [EOS_ID], np.int32)
      for line in lines
      if line
  ]
  if not sentences:
    raise ValueError(f"{what}={path!r} has no sentences.")
  tokens = np.concatenate(sentences)
  unknown = float(np.mean(tokens == UNK_ID))
  if unknown > MAX_UNKNOWN_SHARE:
    raise ValueError(
        f"{what}={path!r}: {unknown:.0%} of its tokens are unknown to the "
        f"vocabulary (at most {MAX_UNKNOWN_SHARE:.0%} allowed): it is in "
        "another language or vocabulary than the models'.")
  return sentences


def _read_ids(raw: bytes, path: str, vocab_size: int,
              what: str) -> List[np.ndarray]:
  try:
    with np.load(io.BytesIO(raw)) as data:
      ids, lengths = data["ids"], data["lengths"]
      corpus_vocab = int(data["vocab_size"])
  except (OSError, ValueError, KeyError) as e:
    raise ValueError(f"{what}={path!r}: not a token corpus (.npz with ids, "
                     f"lengths, vocab_size): {e}") from None
  if corpus_vocab != vocab_size:
    raise ValueError(
        f"{what}={path!r} holds ids of a vocabulary of {corpus_vocab} ids, "
        f"but the models' has {vocab_size}: it was tokenized with another "
        "vocabulary.")
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    raise ValueError(f"{what}={path!r}: ids outside [0, {vocab_size}).")
  if int(np.sum(lengths)) != ids.size or np.any(lengths < 0):
    raise ValueError(f"{what}={path!r}: lengths do not add up to the ids.")
  if not ids.size:
    raise ValueError(f"{what}={path!r} has no tokens.")
  return [s.astype(np.int32) for s in np.split(ids, np.cumsum(lengths)[:-1])]
