"""A run's plan in three stages, each built once and complete
(docs/architecture.md): `RunPlan.build(args)` checks everything that needs
no model; `plan.load(models)` -> `Loaded` adds the models and the drafter
(what the 'auto' pilots decode with); `loaded.decoding(...)` ->
`DecodePlan` makes every choice and builds the two decoders, checked once.
Each stage is the one before with more fields. `settings_record` is what
makes a run's results what they are (the OVERWRITE rule compares it).
Everything a run takes from outside comes through `Providers`, so tests
hand in fakes as an argument.
"""
import dataclasses
import functools
import json
import os
import re
from typing import Any, Callable, Dict, Optional, Tuple

from absl import logging
import gin
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.config import flag_utils
from specdec_jax.checkpoints import feature_draft
from specdec_jax.checkpoints import sizes
from specdec_jax.config import gin_reader
from specdec_jax.core import decoding
from specdec_jax.core import kernels
from specdec_jax.core import models as models_lib
from specdec_jax.core.decoding import loops
from specdec_jax.core.models import T5Config
from specdec_jax.data import vocab as vocab_lib
from specdec_jax.experiment import arguments
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import drafter_registry
from specdec_jax.experiment import loading
from specdec_jax.metrics import quality as quality_lib
from specdec_jax.metrics import step_costs
from specdec_jax.metrics import timing
from specdec_jax.multihost import partitioning

ConfigError = flag_utils.ConfigError
Decoder = decoding.Decoder


def make_decoders(plan: "RunPlan", target: Any, drafter: Any,
                  gamma: int) -> Tuple[Decoder, Decoder]:
  """(baseline, speculative) for the plan's settings: the mode's."""
  return plan.mode.decoders(plan.args, target, drafter, gamma, plan.acceptance)


def load_feature_draft(checkpoint_path: str, target: Any) -> Any:
  """The feature-level draft of DRAFT_CHECKPOINT_PATH bound to `target`."""
  path = loading.checkpoint_dir(checkpoint_path)
  logging.info("Loading the feature-level draft from %s", path)
  return feature_draft.load_draft_model(path, target)


@dataclasses.dataclass(frozen=True)
class PilotSizes:
  """How far GAMMA / TREE_WIDTH / SPECULATION 'auto' look: a pilot at
  γ = gamma_pilot, γ = 1 .. gamma_max, k = 1 .. tree_max_width (tests hand
  in small ones: fewer programs to compile)."""
  gamma_pilot: int = 4
  gamma_max: int = 12
  tree_max_width: int = 4

  @property
  def gammas(self) -> Tuple[int, ...]:
    return tuple(range(1, self.gamma_max + 1))

  @property
  def tree_widths(self) -> Tuple[int, ...]:
    return tuple(range(1, self.tree_max_width + 1))

  @property
  def auto_tree_widths(self) -> Tuple[int, ...]:
    """SPECULATION='auto''s trees (k = 1 is token verification)."""
    return tuple(range(2, self.tree_max_width + 1))


PILOT_SIZES = PilotSizes()  # the defaults


@dataclasses.dataclass(frozen=True)
class Providers:
  """What a run takes from outside (tests hand in fakes). `auto_prices`:
  (loaded, feed, candidates, fill, context plan) -> (`auto.Prices`,
  metrics.json's `auto.prices`); None: measured, or the price cache's."""
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
  """One run's settings, checked (`build`); nothing loaded. GAMMA /
  TREE_WIDTH may still be 'auto'; `mode` is decided once, here
  (`decode_modes.mode_of`); `acceptance`: its rule (None: Algorithm 1, or a
  tree's own); `settings`: `settings_record`'s."""
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
    """Every check that needs no model (reads the vocabulary and
    NGRAM_CORPUS); raises ConfigError naming the macro."""
    providers = providers or Providers()
    mode = decode_modes.mode_of(args)
    target_config = loading.model_config("target")
    draft_config = loading.model_config("draft")
    drafting = args.drafting
    try:
      corpus = loading.resolve(args.ngram_corpus)
      if drafting.ngram_order() is not None and not os.path.lexists(corpus):
        raise ValueError(f"NGRAM_CORPUS={args.ngram_corpus!r}: no such file "
                         "(allowed: a text file or a .npz of token ids).")
      decoding.check_vocab_sizes(target_config.vocab_size,
                                 draft_config.vocab_size)
      drafting.check_draft_config(draft_config, target_config)
      loading.check_decode_paths(args, target_config, draft_config)
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
    settings = settings_record(args, mode, target_config, draft_config, vocab)
    if own_draft_config is not None:  # a feature draft: its own config
      settings["draft"] = own_draft_config
    return cls(args=args, target_config=target_config,
               draft_config=draft_config, vocab=vocab, ngram_table=table,
               mode=mode, acceptance=mode.acceptance_rule(args), task_kind=kind,
               settings=settings, providers=providers)

  def load_models(self, reuse: Optional[Models] = None) -> Models:
    """The mesh and models; those of `reuse` (an earlier plan's, same gin
    model bindings: `sweep`) are kept, a missing draft is loaded."""
    a, load = self.args, self.providers.load_model
    if reuse is None:
      reuse = Models(
          self.mesh,
          loading.with_tiles(
              load(self.target_config, a.target_checkpoint_path, a.seed,
                   self.mesh, "target", a.target_decode_path), a.target_tiles))
    else:  # another point's paths, maybe (`sweep`)
      reuse = dataclasses.replace(
          reuse, **loading.on_decode_paths(reuse.target, reuse.draft, a))
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
      draft = loading.with_tiles(
          load(self.draft_config, a.draft_checkpoint_path, a.seed + 1,
               reuse.mesh, "draft", a.draft_decode_path), a.draft_tiles)
      # DRAFTER='shared_encoder': the draft decoder reads the target's
      # encoder.
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
    """This plan (of its own stage) at other arguments (`args`, or these
    `changes`), their mode (`mode`, when the caller knows it) and its
    acceptance rule."""
    args = dataclasses.replace(args or self.args, **changes)
    mode = mode or decode_modes.mode_of(args)
    return dataclasses.replace(self, args=args, mode=mode,
                               acceptance=mode.acceptance_rule(args))

  def load(self, models: Models) -> "Loaded":
    """This plan with `models` and its drafter (built once)."""
    drafter = self.args.drafting.build(models.draft, self.ngram_table,
                                       self.target_config.vocab_size)
    return _stage(Loaded, self, RunPlan, models=models, drafter=drafter)

  def quality(self, base_text, spec_text, references) -> Dict[str, Any]:
    """{'bleu' or 'rouge': {'baseline': ..., 'speculative': ...}}; {}
    when an example has no reference (a file of inputs alone)."""
    if any(r is None for r in references):
      return {}
    base = quality_lib.quality_metrics(self.task_kind, base_text, references)
    spec = quality_lib.quality_metrics(self.task_kind, spec_text, references)
    key = next(iter(base))
    return {key: {"baseline": base[key], "speculative": spec[key]}}

  @property
  def rng(self) -> jax.Array:
    return jax.random.PRNGKey(self.args.seed)


def _stage(cls, plan: RunPlan, base, **more: Any):
  """The next stage `cls`: `plan`'s fields of `base`, and `more`."""
  return cls(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(base)},
             **more)


@dataclasses.dataclass(frozen=True)
class Loaded(RunPlan):
  """A `RunPlan` with its `Models` and drafter (`DrafterSpec.build`)."""
  models: Models
  drafter: Any

  @property
  def mesh(self) -> Any:
    return self.models.mesh

  def decoding(self, args: Optional[arguments.RunArguments] = None,
               mode: Optional[decode_modes.DecodeMode] = None,
               **changes: Any) -> "DecodePlan":
    """The decoders at the plan's settings, or at `args` / `changes`
    (`RunPlan.at`), built and checked now."""
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
  """A `Loaded` plan at the chosen γ, k and mode, with its two decoders,
  (inputs [B, S], rng) -> output; `gamma_auto`: metrics.json's (None: γ
  and k were given); `online`: SPECULATION='auto''s `online.OnlineChoice`
  between batches (None: nothing chose)."""
  baseline: Decoder
  speculative: Decoder
  gamma_auto: Optional[Dict[str, Any]] = None
  online: Any = None


def _bound_value(name: str, default: Any) -> Any:
  """What gin passes to `name` ('vocabulary.extra_ids'), or `default`."""
  configurable, _, parameter = name.rpartition(".")
  try:
    bindings = gin.get_bindings(configurable)
  except ValueError:  # no such configurable registered
    return default
  return bindings.get(parameter, default)


def check_vocabulary_macros() -> None:
  """SPM_MODEL_PATH or EXTRA_IDS away from their defaults with a byte-level
  vocabulary, which would ignore them; ConfigError naming the macro."""
  if _bound_value("vocabulary.byte_level", False) is not True:
    return
  path = _bound_value("vocabulary.spm_model_path", None)
  if path not in (None, vocab_lib.DEFAULT_SPM_PATH):
    raise ConfigError(
        f"SPM_MODEL_PATH={path!r} with vocabulary.byte_level = True: a "
        "byte-level vocabulary reads no SentencePiece model; allowed: "
        "vocabulary.byte_level = False, or SPM_MODEL_PATH at its default.")
  extra_ids = _bound_value("vocabulary.extra_ids", 0)
  if extra_ids not in (0, vocab_lib.DEFAULT_EXTRA_IDS):
    raise ConfigError(
        f"EXTRA_IDS={extra_ids!r} with vocabulary.byte_level = True: a "
        "byte-level vocabulary has no sentinel ids; allowed: "
        "vocabulary.byte_level = False, or EXTRA_IDS=0 or its default.")


def _check_memory(args, mode, target_config, draft_config) -> None:
  """Refuses lengths no machine here could decode (`check_fits`): the
  loops the run decodes with: the speculative one unless SPECULATION='off'
  or MODE='alpha' (target samples, then teacher forcing), the target-alone
  one unless MODE='infer' with SPECULATION='on'; a beam run's speculative
  loop only (its other terms are not measured)."""
  configs = {"target": target_config}
  # A feature draft is not the gin draft/T5Config.
  if args.drafting.decodes_draft_model:
    configs["draft"] = draft_config
  gamma = 1 if args.auto_gamma else int(args.gamma)  # 'auto': at least 1
  alone = (args.mode != "infer" or
           args.speculation != decode_modes.SPECULATION_ON)
  speculative = mode.beam or not (mode.target_alone or args.mode == "alpha")
  try:
    check_fits(configs, mode.cache_rows(args),
               args.task_feature_lengths["inputs"], args.max_decode_length,
               sizes.available_bytes() * jax.device_count(),
               verified=0 if mode.beam else gamma + 1, speculative=speculative,
               target_alone=alone and not mode.beam)
  except MemoryRefused as e:
    if not mode.beam:
      raise
    raise ConfigError(
        f"{e} (DECODE='beam': the BATCH_SIZE above is BATCH_SIZE="
        f"{args.batch_size} times BEAM_ROWS + BEAM_SIZE = "
        f"{args.decode_mode.num_rows(args.gamma)} + {args.decode_mode.size} "
        "cache rows per example.)") from None


def _task_kind(args) -> str:
  """TASK_KIND, or the seqio task's kind, or translation for local files."""
  if args.task_kind:
    return args.task_kind
  if args.mixture_or_task_name:
    from specdec_jax.data import tasks  # pylint: disable=g-import-not-at-top
    return tasks.get_task_kind(args.mixture_or_task_name)
  return quality_lib.TRANSLATION


# A lower bound on a decode's memory, checked at start-up: what each phase
# of its compiled programs must hold at once per batch of B rows
# (parameters and XLA's other temporaries come on top), so a run refused
# could never fit. The encoder's parts are dead before the loop's are all
# live, so each phase is counted on its own. Measured on XLA:CPU
# (`memory_analysis` of the compiled loops,
# tests/harness/test_memory_estimate.py): the verification call's attention
# over the cache holds three [B, H, γ+1, T] arrays at once (the cache
# part's logits, all logits and their exponentials, the weights); other
# backends are not measured: one.
CPU_SCORE_ARRAYS = 3
ENCODER_PARTS = ("encoder attention logits", "encoder output")
LOOP_PARTS = ("decoder cache", "cross-attention keys and values")


class MemoryRefused(ConfigError):
  """`check_fits`' refusal; `detail`: what is needed and what this machine
  has, `rows`: the most rows the estimate lets fit (0: not even one)."""

  def __init__(self, message: str, detail: str, rows: int):
    super().__init__(message)
    self.detail, self.rows = detail, rows


def estimate(config: T5Config, batch: int, inputs: int,
             targets: int) -> Dict[str, int]:
  """Bytes of each part one model holds: the encoder's self-attention
  logits (one layer), the decoder's cache, the cross-attention keys and
  values, the encoder output."""
  item = np.dtype(config.dtype).itemsize
  kv = (config.num_decoder_layers * 2 * batch * config.num_heads *
        config.head_dim * item)  # keys and values of one position
  return {
      "encoder attention logits": batch * config.num_heads * inputs**2 * 4,
      "decoder cache": kv * targets,
      "cross-attention keys and values": kv * inputs,
      "encoder output": batch * inputs * config.emb_dim * item,
  }


def cache_copies(backend: str) -> int:
  """Caches the target-alone loop holds at once on `backend`: 2 on XLA:CPU
  under XLA's default copy insertion (`loops.BASELINE_PROGRAM`'s options):
  each call reads the cache it then writes, and XLA copies it; 1 under
  region analysis (`kernels.CPU_IN_PLACE_COMPILER_OPTIONS`) or elsewhere
  (not measured)."""
  if backend != "cpu":
    return 1
  options = loops.BASELINE_PROGRAM.options("cpu")
  in_place = kernels.CPU_IN_PLACE_COMPILER_OPTIONS.items() <= options.items()
  return 1 if in_place else 2


def program_estimates(
    configs: Dict[str, T5Config], batch: int, inputs: int, targets: int, *,
    verified: int = 0, speculative: bool = True, target_alone: bool = False,
    backend: Optional[str] = None) -> Dict[str, Dict[str, int]]:
  """{phase: {part: bytes}} of the decode's programs at `batch` rows
  (`configs`: the target first, then the draft, if any; `estimate`'s
  parts):

  * 'encoder': the largest encoder's attention logits and output;
  * 'speculative loop' (if `speculative`): every model's cache and
    cross-attention keys and values, and the target's attention over its
    cache when a call verifies `verified` positions (γ+1; 0: not counted):
    [B, H, γ+1, T] logits, `CPU_SCORE_ARRAYS` of them at once on XLA:CPU;
  * 'target-alone loop' (if `target_alone`: a run's baseline, certify's
    draws): the target's cache and cross-attention keys and values, and
    its cache again where XLA copies it (`cache_copies`).
  """
  backend = backend or jax.default_backend()
  role, target = next(iter(configs.items()))
  models = configs if speculative else {role: target}
  each = {
      name: estimate(config, batch, inputs, targets)
      for name, config in models.items()
  }
  encoders = [{
      f"{name} {part}": parts[part] for part in ENCODER_PARTS
  } for name, parts in each.items()]
  phases = {"encoder": max(encoders, key=lambda p: sum(p.values()))}
  if speculative:
    loop = {
        f"{name} {part}": parts[part] for name, parts in each.items()
        for part in LOOP_PARTS
    }
    if verified:
      item = 4 if target.float32_attention_logits else np.dtype(
          target.dtype).itemsize
      loop[f"{role} verification attention"] = (
          (CPU_SCORE_ARRAYS if backend == "cpu" else 1) * batch *
          target.num_heads * verified * targets * item)
    phases["speculative loop"] = loop
  if target_alone:
    loop = {f"{role} {part}": each[role][part] for part in LOOP_PARTS}
    copies = cache_copies(backend)
    if copies > 1:
      loop[f"{role} decoder cache (XLA's copy)"] = ((copies - 1) *
                                                    each[role]["decoder cache"])
    phases["target-alone loop"] = loop
  return phases


def check_fits(configs: Dict[str, T5Config], batch: int, inputs: int,
               targets: int, available: int, **programs: Any) -> None:
  """Refuses lengths whose largest phase (`program_estimates`, given
  `programs`: verified, speculative, target_alone, backend) exceeds
  `available` bytes; `MemoryRefused` naming TASK_FEATURE_LENGTHS,
  BATCH_SIZE, the phase, its largest parts, both byte counts and the most
  rows that could fit."""
  estimates = program_estimates(configs, batch, inputs, targets, **programs)
  name, parts = max(estimates.items(), key=lambda kv: sum(kv[1].values()))
  total = sum(parts.values())
  if total <= available:
    return
  rows = available * batch // total  # every part grows with the rows
  top = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
  detail = (f"needs at least {sizes.gib(total)} in the {name} (" +
            ", ".join(f"{part} {sizes.gib(n)}" for part, n in top) +
            f") but this machine has {sizes.gib(available)}")
  smaller = (f", or BATCH_SIZE at most {rows}"
             if rows else " (not even BATCH_SIZE=1 fits these)")
  raise MemoryRefused(
      f"TASK_FEATURE_LENGTHS={{'inputs': {inputs}, 'targets': {targets}}} "
      f"with BATCH_SIZE={batch} {detail}. Allowed: lengths whose examples "
      f"fit (captions: 64/64; news: 512/128){smaller}.", detail, rows)


# Arguments that do not make a run's results different (the components
# record themselves).
NOT_SETTINGS = ("output_dir", "overwrite", "mode", "compile_topology",
                "price_call_cost", "decode_mode", "drafting")


def settings_record(args: arguments.RunArguments, mode: decode_modes.DecodeMode,
                    target_config: T5Config, draft_config: T5Config,
                    vocab) -> Dict[str, Any]:
  """The run's `settings` (`mode`: the run's), JSON-normalized: `run` holds
  the run arguments and the components' settings under the flat names they
  had as run arguments, each only where it makes a run differ from the runs
  before it existed."""
  run_args = {
      f.name: getattr(args, f.name)
      for f in dataclasses.fields(args)
      if f.name not in NOT_SETTINGS
  }
  if args.mode == "infer":  # its predictions.jsonl rows are T5X's form
    run_args["mode"] = args.mode
  # The paper's setting is recorded as before these options existed.
  beyond = {**args.drafting.flat(), "lenience": mode.lenience}
  if beyond != {**drafter_registry.FLAT_DEFAULTS, "lenience": 1.0}:
    run_args.update(beyond)
  else:
    run_args.pop("ngram_corpus")
  run_args.update(mode.record())
  if args.speculation == decode_modes.SPECULATION_ON:  # as before it existed
    run_args.pop("speculation")
  for name in ("target_decode_path", "draft_decode_path", "target_tiles",
               "draft_tiles"):
    if run_args[name] is None:  # the backend's, as before they existed
      run_args.pop(name)
  record = {
      "run": run_args,
      "target": gin_reader.t5_config_fields(target_config),
      "draft": gin_reader.t5_config_fields(draft_config),
      "vocabulary": {
          # `vocab.SentencePieceFile` is recorded as seqio's: same results.
          "kind": getattr(vocab, "seqio_kind",
                          type(vocab).__name__),
          "size": int(vocab.vocab_size),
          "file": getattr(vocab, "sentencepiece_model_file", None)
      },
  }
  return json.loads(json.dumps(record, sort_keys=True, default=str))


def comparable(settings: Any) -> Any:
  """A settings record as today's version writes it, for comparison
  (earlier ones wrote a dtype as "<class 'numpy.float32'>", a vocabulary
  file as a relative path)."""
  if not isinstance(settings, dict):
    return settings
  out = json.loads(json.dumps(settings))
  for role in ("target", "draft"):
    config = out.get(role)
    dtype = config.get("dtype") if isinstance(config, dict) else None
    match = re.fullmatch(r"<class '(?:[\w.]+\.)?(\w+)'>", str(dtype))
    if match:
      try:
        config["dtype"] = jnp.dtype(match.group(1)).name
      except TypeError:
        pass
  vocab = out.get("vocabulary")
  if isinstance(vocab, dict) and isinstance(vocab.get("file"), str):
    vocab["file"] = loading.resolve(vocab["file"])
  return out
