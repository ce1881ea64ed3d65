"""A run's plan, in three stages, each built once and complete.

1. `RunPlan.build(args)` checks everything that needs no model, in one
   place, before anything is loaded: the arguments (already checked when
   built), the model configs against each other and against DRAFTER, the
   vocabulary against both models' vocab_size, NGRAM_CORPUS (counted into
   the n-gram table), the memory the lengths need, the task kind. Its
   mesh is built once, on first use.
2. `plan.load(models)` -> `Loaded`: the plan with its models and its
   drafter (one, from the registry, `drafter_registry`): what the pilots
   of GAMMA / TREE_WIDTH / SPECULATION 'auto' decode with.
3. `loaded.decoding(...)` -> `DecodePlan`: every choice made (γ, k, the
   mode), the two decoders built and checked once
   (`decoding.speculative_decoder`: no host-side checks per batch). What
   the timed decode runs. No field of any stage waits to be filled later.

Each stage is the one before with more fields (`Loaded` is a `RunPlan`,
a `DecodePlan` a `Loaded`): the run's decode mode (`RunPlan.mode`,
decided once from the arguments, `decode_modes.mode_of`: the mode gin
built, or the target alone in its place), its arguments,
vocabulary and settings are read from whichever stage a function holds.

Everything a run takes from outside — the vocabulary, the models, the
decoders, the clocks and the pilots' sizes — comes through `Providers`, so
that tests and the multi-host test workers hand in fakes as an argument
rather than patching modules.
"""
import dataclasses
import functools
import os
from typing import Any, Callable, Dict, Optional, Tuple

from absl import logging
import gin
import jax
import numpy as np

from specdec_jax.checkpoints import feature_draft
from specdec_jax.checkpoints import sizes
from specdec_jax.config import gin_utils
from specdec_jax.core import decoding
from specdec_jax.core import models as models_lib
from specdec_jax.core.models import T5Config
from specdec_jax.data import vocab as vocab_lib
from specdec_jax.experiment import arguments
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import loading
from specdec_jax.experiment import output_dir as output_dir_lib
from specdec_jax.metrics import quality as quality_lib
from specdec_jax.metrics import step_costs
from specdec_jax.metrics import timing
from specdec_jax.multihost import partitioning

ConfigError = gin_utils.ConfigError
Decoder = decoding.Decoder


def make_decoders(plan: "RunPlan", target: Any, drafter: Any,
                  gamma: int) -> Tuple[Decoder, Decoder]:
  """(baseline, speculative) for the plan's settings, checked once: the
  mode's (`DecodeMode.decoders`; a tree's speculative decoder returns a
  `TreeOutput`, beams their top beam)."""
  return plan.mode.decoders(plan.args, target, drafter, gamma, plan.acceptance)


def load_feature_draft(checkpoint_path: str, target: Any) -> Any:
  """The feature-level draft of DRAFT_CHECKPOINT_PATH bound to `target`
  (`feature_draft.load_draft_model`: float32, digests verified)."""
  path = loading.checkpoint_dir(checkpoint_path)
  logging.info("Loading the feature-level draft from %s", path)
  return feature_draft.load_draft_model(path, target)


@dataclasses.dataclass(frozen=True)
class PilotSizes:
  """How far GAMMA / TREE_WIDTH / SPECULATION 'auto' look (`Providers`;
  tests hand in small ones: fewer programs to compile).

  Attributes:
    gamma_pilot: the γ a pilot decodes at when GAMMA='auto'.
    gamma_max: GAMMA='auto' considers γ = 1 .. gamma_max.
    tree_max_width: TREE_WIDTH='auto' considers k = 1 .. tree_max_width,
      SPECULATION='auto''s tree candidates k = 2 .. tree_max_width (k = 1
      is token verification).
  """
  gamma_pilot: int = 4
  gamma_max: int = 12
  tree_max_width: int = 4

  @property
  def gammas(self) -> Tuple[int, ...]:
    """The γ GAMMA='auto' considers."""
    return tuple(range(1, self.gamma_max + 1))

  @property
  def tree_widths(self) -> Tuple[int, ...]:
    """The k TREE_WIDTH='auto' considers."""
    return tuple(range(1, self.tree_max_width + 1))

  @property
  def auto_tree_widths(self) -> Tuple[int, ...]:
    """The k of SPECULATION='auto''s tree candidates."""
    return tuple(range(2, self.tree_max_width + 1))


PILOT_SIZES = PilotSizes()  # the defaults


@dataclasses.dataclass(frozen=True)
class Providers:
  """What a run takes from outside (tests hand in fakes).

  Attributes:
    vocabulary: () -> the vocabulary (gin's `vocabulary.*` bindings).
    load_model: (config, checkpoint_path, seed, mesh, what) -> a model.
    decoders: (plan, target, drafter, gamma) -> (baseline, speculative).
    load_feature_draft: (checkpoint_path, target) -> a feature-level draft
      (DRAFTER='feature').
    clock: (decoder, inputs, rng) -> (its output, ready; seconds): how the
      timed decode times each call (`timing.timed`).
    pricing: how the calls are priced: c, the verification call, the
      'auto' pilots' prices (`step_costs.Pricing`: `timing.call_seconds`
      at `step_costs.STEPS` calls, `step_costs.REPEATS` rounds).
    pilot_sizes: the γ and k the 'auto' pilots consider (`PilotSizes`).
    auto_prices: the 'auto' choices' call prices, (loaded, feed,
      candidates, fill, context plan) -> (`auto.Prices`, metrics.json's
      `auto.prices`); None: measured on this machine or read from the price
      cache (`price_cache.prices_for`).
  """
  vocabulary: Callable[[], Any] = loading.vocabulary
  load_model: Callable[..., Any] = loading.load_model
  decoders: Callable[..., Tuple[Decoder, Decoder]] = make_decoders
  load_feature_draft: Callable[[str, Any], Any] = load_feature_draft
  clock: Callable[..., Tuple[Any, float]] = timing.timed
  pricing: step_costs.Pricing = step_costs.PRICING
  pilot_sizes: PilotSizes = PILOT_SIZES
  auto_prices: Optional[Callable[..., Tuple[Any, Dict[str, Any]]]] = None


@dataclasses.dataclass(frozen=True)
class Models:
  """The loaded models; `draft` is None when the drafter needs none."""
  mesh: Any
  target: Any
  draft: Any = None


@dataclasses.dataclass(frozen=True)
class RunPlan:
  """One run's settings, checked (`build`); nothing loaded.

  Attributes:
    args: the run's arguments (GAMMA / TREE_WIDTH may still be 'auto').
    target_config, draft_config: the two models' T5Configs.
    vocab: the shared vocabulary.
    ngram_table: the n-gram drafter's table, or None.
    mode: the decode mode (`decode_modes.mode_of`: decided once, here).
    acceptance: the mode's acceptance rule; None = Algorithm 1
      (ACCEPTANCE='tree': None, `tree_decoder`'s own `TreeAcceptance`).
    task_kind: 'translation' (BLEU) or 'summarization' (ROUGE).
    settings: what makes the results what they are (the OVERWRITE rule).
    providers: where the vocabulary, models and decoders come from.
  """
  args: arguments.RunArguments
  target_config: Any
  draft_config: Any
  vocab: Any
  ngram_table: Any
  mode: decode_modes.DecodeMode
  acceptance: Optional[decoding.AcceptanceRule]
  task_kind: str
  settings: Dict[str, Any]
  providers: Providers

  @classmethod
  def build(cls, args: arguments.RunArguments,
            providers: Optional[Providers] = None) -> "RunPlan":
    """Every check that needs no model; raises ConfigError naming the macro.

    Reads the vocabulary and NGRAM_CORPUS (small files), loads no model.
    """
    providers = providers or Providers()
    mode = decode_modes.mode_of(args)
    target_config = loading.model_config("target")
    draft_config = loading.model_config("draft")
    drafting = args.drafting
    try:
      corpus = loading.resolve(args.ngram_corpus)
      if drafting.ngram_order() is not None and not os.path.lexists(corpus):
        raise ValueError(f"NGRAM_CORPUS={args.ngram_corpus!r}: no "
                         "such file (a text file with one sentence per "
                         "line, or a .npz of token ids).")
      decoding.check_vocab_sizes(target_config.vocab_size,
                                 draft_config.vocab_size)
      drafting.check_draft_config(draft_config, target_config)
      own_draft_config = drafting.check_draft_checkpoint(
          args.draft_checkpoint_path and
          loading.checkpoint_dir(args.draft_checkpoint_path), target_config)
      mode.check_vocab(args, target_config.vocab_size)
    except ValueError as e:  # a bad setting, not a bug: no traceback
      raise ConfigError(str(e)) from None
    check_vocabulary_macros()
    vocab = providers.vocabulary()
    loading.check_vocabulary_fits(vocab, target_config, draft_config)
    loading.check_vocabulary_for_run(vocab, args)  # TOPK, DIGESTS.json
    _check_memory(args, mode, target_config, draft_config)
    try:
      table = drafting.ngram_table(vocab, target_config.vocab_size, corpus)
      kind = _task_kind(args)
    except ValueError as e:
      raise ConfigError(str(e)) from None
    settings = output_dir_lib.settings_record(args, mode, target_config,
                                              draft_config, vocab)
    if own_draft_config is not None:  # a feature draft: its own config
      settings["draft"] = own_draft_config
    return cls(args=args, target_config=target_config,
               draft_config=draft_config, vocab=vocab, ngram_table=table,
               mode=mode, acceptance=mode.acceptance_rule(args), task_kind=kind,
               settings=settings, providers=providers)

  # -- loading --------------------------------------------------------------
  def load_models(self, reuse: Optional[Models] = None) -> Models:
    """The mesh and models; those of `reuse` (an earlier plan's, same gin
    model bindings: `sweep`) are kept, a missing draft is loaded."""
    a, load = self.args, self.providers.load_model
    if reuse is None:
      reuse = Models(
          self.mesh,
          load(self.target_config, a.target_checkpoint_path, a.seed, self.mesh,
               "target"))
    if self.mode.target_alone:  # SPECULATION='off': no draft
      return reuse
    feature = a.drafting.reads_target_features
    if reuse.draft is not None and feature != isinstance(
        reuse.draft, models_lib.FeatureDraftModel):  # a sweep's other kind
      reuse = dataclasses.replace(reuse, draft=None)
    if reuse.draft is None and feature:
      return dataclasses.replace(
          reuse,
          draft=self.providers.load_feature_draft(a.draft_checkpoint_path,
                                                  reuse.target))
    if reuse.draft is None and a.drafting.uses_draft_model:
      draft = load(self.draft_config, a.draft_checkpoint_path, a.seed + 1,
                   reuse.mesh, "draft")
      # DRAFTER='shared_encoder': the draft decoder reads the target's
      # encoder (started from the target's encoder output in the loop).
      draft = models_lib.SharedEncoderModel.draft_for(reuse.target, draft)
      reuse = dataclasses.replace(reuse, draft=draft)
    return reuse

  @functools.cached_property
  def mesh(self) -> Any:
    """The (data, model) mesh: built once, before any model is loaded."""
    try:
      return partitioning.make_mesh(*self.args.mesh_shape)
    except ValueError as e:
      raise ConfigError(f"MESH_SHAPE={self.args.mesh_shape!r}: {e}") from None

  def at(self, args: Optional[arguments.RunArguments] = None,
         mode: Optional[decode_modes.DecodeMode] = None,
         **changes: Any) -> "RunPlan":
    """This plan (of its own stage) with other arguments (`args`, or these
    `changes`: a pilot's or a candidate's γ, k or mode), their mode (`mode`
    when the caller knows it: an 'auto' candidate's) and its acceptance
    rule."""
    args = dataclasses.replace(args or self.args, **changes)
    mode = mode or decode_modes.mode_of(args)
    return dataclasses.replace(self, args=args, mode=mode,
                               acceptance=mode.acceptance_rule(args))

  def load(self, models: Models) -> "Loaded":
    """This plan with `models` and its drafter (built once)."""
    drafter = self.args.drafting.build(models.draft, self.ngram_table,
                                       self.target_config.vocab_size)
    return _stage(Loaded, self, RunPlan, models=models, drafter=drafter)

  # -- results ----------------------------------------------------------------
  def quality(self, base_text, spec_text, references) -> Dict[str, Any]:
    """{'bleu' or 'rouge': {'baseline': ..., 'speculative': ...}}."""
    base = quality_lib.quality_metrics(self.task_kind, base_text, references)
    spec = quality_lib.quality_metrics(self.task_kind, spec_text, references)
    key = next(iter(base))
    return {key: {"baseline": base[key], "speculative": spec[key]}}

  @property
  def rng(self) -> jax.Array:
    return jax.random.PRNGKey(self.args.seed)


def _stage(cls, plan: RunPlan, base, **more: Any):
  """A `cls` (the next stage) holding `plan`'s fields of `base` and
  `more`."""
  return cls(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(base)},
             **more)


@dataclasses.dataclass(frozen=True)
class Loaded(RunPlan):
  """A `RunPlan` with its models and drafter: what the pilots decode with.

  Attributes:
    models: its loaded `Models` (their mesh is the plan's).
    drafter: what guesses (`DrafterSpec.build`).
  """
  models: Models
  drafter: Any

  @property
  def mesh(self) -> Any:
    return self.models.mesh

  def decoding(self, args: Optional[arguments.RunArguments] = None,
               mode: Optional[decode_modes.DecodeMode] = None,
               **changes: Any) -> "DecodePlan":
    """The decoders at the plan's settings, or at `args` / `changes` (a
    pilot's or the chosen γ, k or mode: `RunPlan.at`): built and checked
    now."""
    plan = self.at(args, mode, **changes) if (args or changes) else self
    a = plan.args
    if a.auto_gamma or a.decode_mode.auto_width:
      raise ValueError("GAMMA and TREE_WIDTH 'auto' are chosen before the "
                       "decoders are built (`pilots.choose`).")
    baseline, speculative = plan.providers.decoders(plan, self.models.target,
                                                    self.drafter, int(a.gamma))
    return _stage(DecodePlan, plan, Loaded, baseline=baseline,
                  speculative=speculative)


@dataclasses.dataclass(frozen=True)
class DecodePlan(Loaded):
  """Everything the timed decode needs, decided: a `Loaded` plan at the
  chosen γ, k and mode, with its two decoders.

  Attributes:
    baseline, speculative: the two decoders, (inputs [B, S], rng) -> output.
    gamma_auto: GAMMA / TREE_WIDTH 'auto''s pilot and choice
      (metrics.json's `gamma_auto`); None when they were given.
    online: SPECULATION='auto''s choice while the run decodes
      (`online.OnlineChoice`, injected by `pilots.choose`): the plan of
      each next batch (`after_batch`) and what the run ended with
      (`outcome`: metrics.json's `auto`); None for a run that chose
      nothing.
  """
  baseline: Decoder
  speculative: Decoder
  gamma_auto: Optional[Dict[str, Any]] = None
  online: Any = None


def _bound_value(name: str, default: Any) -> Any:
  """What gin passes to `name` ('vocabulary.extra_ids'; a macro such as
  %EXTRA_IDS evaluated), or `default` when nothing is bound."""
  configurable, _, parameter = name.rpartition(".")
  try:
    bindings = gin.get_bindings(configurable)
  except ValueError:  # no such configurable registered
    return default
  return bindings.get(parameter, default)


def check_vocabulary_macros() -> None:
  """A byte-level vocabulary (`vocabulary.byte_level = True`) reads no
  SentencePiece model and appends no sentinel ids: SPM_MODEL_PATH or
  EXTRA_IDS set to anything but gin/run.gin's default (or None / 0) would
  be ignored without a word; ConfigError naming the macro."""
  if _bound_value("vocabulary.byte_level", False) is not True:
    return
  path = _bound_value("vocabulary.spm_model_path", None)
  if path not in (None, vocab_lib.DEFAULT_SPM_PATH):
    raise ConfigError(
        f"SPM_MODEL_PATH={path!r} with vocabulary.byte_level = True: a "
        "byte-level vocabulary reads no SentencePiece model, so it would be "
        "ignored; allowed: vocabulary.byte_level = False to use it, or "
        "SPM_MODEL_PATH left at its default.")
  extra_ids = _bound_value("vocabulary.extra_ids", 0)
  if extra_ids not in (0, vocab_lib.DEFAULT_EXTRA_IDS):
    raise ConfigError(
        f"EXTRA_IDS={extra_ids!r} with vocabulary.byte_level = True: a "
        "byte-level vocabulary has no sentinel ids, so it would be ignored; "
        "allowed: vocabulary.byte_level = False to use it, or EXTRA_IDS=0 "
        f"(or its default, {vocab_lib.DEFAULT_EXTRA_IDS}).")


def _check_memory(args, mode, target_config, draft_config) -> None:
  """Refuses lengths no machine here could decode (`memory`)."""
  configs = {"target": target_config}
  # A feature draft is not the gin draft/T5Config (its cache is a fraction
  # of the target's).
  if (args.drafting.uses_draft_model and
      not args.drafting.reads_target_features):
    configs["draft"] = draft_config
  try:
    check_fits(configs, mode.cache_rows(args),
               args.task_feature_lengths["inputs"], args.max_decode_length,
               sizes.available_bytes() * jax.device_count())
  except ConfigError as e:
    if not mode.beam:
      raise
    raise ConfigError(
        f"{e} (DECODE='beam': the BATCH_SIZE above is BATCH_SIZE="
        f"{args.batch_size} times BEAM_ROWS + BEAM_SIZE = "
        f"{args.decode_mode.num_rows(args.gamma)} + {args.decode_mode.size} "
        "cache rows per "
        "example; allowed: smaller BEAM_ROWS, BEAM_SIZE or BATCH_SIZE.)"
    ) from None


def _task_kind(args) -> str:
  """TASK_KIND, or the seqio task's kind, or translation for local files."""
  if args.task_kind:
    return args.task_kind
  if args.mixture_or_task_name:
    from specdec_jax.data import tasks  # pylint: disable=g-import-not-at-top
    return tasks.get_task_kind(args.mixture_or_task_name)
  return quality_lib.TRANSLATION


# -- memory --------------------------------------------------------------------
# Will the decode fit? A lower bound on its memory, checked at startup.
#
# TASK_FEATURE_LENGTHS = {'inputs': S, 'targets': T} of 1e6 would not fail
# until the first compiled call runs out of memory, minutes later (or swap
# for an hour on a CPU host). `estimate` adds up what any decode of one
# model must hold at once, per batch of B rows (float32 = 4 bytes, or the
# config's dtype):
#
# * encoder self-attention logits: B x heads x S x S (one layer at a time);
# * the decoder's self-attention cache: layers x 2 (keys, values) x B x T x
#   heads x head_dim;
# * the cross-attention keys and values: layers x 2 x B x S x heads x
#   head_dim;
# * the encoder's output: B x S x emb.
#
# Parameters, the logits and XLA's temporaries come on top, so the estimate
# is a floor: a run refused by it could never fit, and one passed by it may
# still not.
def estimate(config: T5Config, batch: int, inputs: int,
             targets: int) -> Dict[str, int]:
  """Bytes of each part (module docstring) for one model."""
  item = np.dtype(config.dtype).itemsize
  kv = config.num_heads * config.head_dim
  return {
      "encoder attention logits": batch * config.num_heads * inputs * inputs *
                                  4,
      "decoder cache": config.num_decoder_layers * 2 * batch * targets * kv *
                       item,
      "cross-attention keys and values": config.num_decoder_layers * 2 * batch *
                                         inputs * kv * item,
      "encoder output": batch * inputs * config.emb_dim * item,
  }


def check_fits(configs: Dict[str, T5Config], batch: int, inputs: int,
               targets: int, available: int) -> None:
  """Refuses lengths whose estimated bytes exceed `available`.

  Raises:
    ConfigError: naming TASK_FEATURE_LENGTHS, BATCH_SIZE, the largest parts
      and both byte counts.
  """
  parts = {}
  for role, config in configs.items():
    for part, n in estimate(config, batch, inputs, targets).items():
      parts[f"{role} {part}"] = n
  total = sum(parts.values())
  if total <= available:
    return
  top = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
  raise ConfigError(
      f"TASK_FEATURE_LENGTHS={{'inputs': {inputs}, 'targets': {targets}}} "
      f"with BATCH_SIZE={batch} needs at least {sizes.gib(total)} (" +
      ", ".join(f"{name} {sizes.gib(n)}" for name, n in top) +
      f") but this machine has {sizes.gib(available)}. Allowed: lengths whose "
      "examples fit (captions: 64/64; news: 512/128), or a smaller "
      "BATCH_SIZE.")
