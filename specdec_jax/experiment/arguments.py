"""The run's arguments: one frozen `RunArguments`, the gin configurable
`run` (`run.gamma = %GAMMA`), checked once, when it is built, with no model
and no I/O. Each field names its macro (`MACROS`) but the two components
gin builds: the decode mode and the drafter, each holding its own settings.
"""
import dataclasses
import math
import re
import types
import typing
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import gin

from specdec_jax.config import flag_utils
from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils
from specdec_jax.metrics import quality
from specdec_jax.core import sampling
from specdec_jax.core.kernels import gpu_tiles
from specdec_jax.core.models import decode_paths
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import drafter_registry
from specdec_jax.experiment.drafter_registry import is_int
from specdec_jax.experiment.drafter_registry import is_number
from specdec_jax.experiment.drafter_registry import is_real

ConfigError = flag_utils.ConfigError
MODES = ("walltime", "alpha", "infer")
AUTO_GAMMA = decode_modes.AUTO  # GAMMA='auto': γ chosen by the run.
TASK_KINDS = quality.TASK_KINDS  # BLEU or ROUGE
# TASK_FEATURE_LENGTHS['targets'] at most: 100000 tokens looked like a hang.
MAX_DECODE_LENGTH = 8192
MAX_SEED = 2**32 - 1  # JAX's PRNG keys keep a seed's low 32 bits.
# A folder name's bytes (ext4, XFS, APFS): a sweep names a point's folder
# 'TASK=<value>' (`sweep.point_name`).
NAME_MAX = 255
TASK_MAX_BYTES = NAME_MAX - len("TASK=")
# OUTPUT_DIR on gs:// names its bucket ('gs://' made a local folder 'gs:').
_GCS_DIR = re.compile(r"gs://[^/]+(/.*)?", re.DOTALL)


def _arg(macro: str, default: Any = dataclasses.MISSING, **kwargs) -> Any:
  """A run argument and the gin macro that sets it (what messages name)."""
  return dataclasses.field(default=default, metadata={"macro": macro}, **kwargs)


@gin.configurable("run")
@dataclasses.dataclass(frozen=True)
class RunArguments:
  """One run's arguments; each entry below is the meaning column of
  docs/usage/macros.md (`tools/generate_docs.py`).

  Attributes:
    output_dir: folder for metrics.json and predictions.jsonl (local or
      gs://); created and probed at startup.
    target_checkpoint_path: the target's T5X checkpoint dir
      (`.../checkpoint_N`, local or gs://); None = random weights (smoke
      tests only).
    draft_checkpoint_path: the draft's T5X checkpoint dir, as above
      (drafter 'feature': a feature-level draft's checkpoint, required).
    gamma: Algorithm 1's γ (an integer >= 1), or 'auto' (Theorem 3.8's best
      γ <= 12 for the α, c and call costs measured on the first examples,
      calibrated by their timed pilot; ACCEPTANCE='tree': the tree's best γ,
      see TREE_WIDTH).
    temperature: the sampling temperature (0 = greedy).
    top_k: keep the k most likely tokens (0 = off; not with DECODE='beam').
    top_p: keep the smallest set of tokens with this much mass (1 = off;
      not with DECODE='beam').
    batch_size: rows decoded together (the paper: 1).
    num_examples: how many examples of the split to decode.
    seed: PRNG seed for sampling and random weights, 0 to 2**32 - 1.
    mixture_or_task_name: a registered seqio task ('specdec_wmt_ende',
      'specdec_cnn_dailymail'); None with local files.
    split: the seqio task's split.
    task_feature_lengths: {'inputs': S, 'targets': max decode length}
      (longer inputs are cut and counted in metrics.json).
    source_file: local data instead of a seqio task: one input per line
      (`X.en`), or a two-column TSV (input, reference); alone and without
      a tab, inputs without references (nothing scored).
    reference_file: the references, line-aligned with source_file
      (`X.de`).
    input_prefix: prepended to local-file inputs (e.g. 'translate English
      to German: ').
    task_kind: 'translation' (BLEU) or 'summarization' (ROUGE); from the
      seqio task when None.
    task_name: the task's label in metrics.json and the report.
    target_name: the target's label in metrics.json (e.g. 'xxl').
    draft_name: the draft's label in metrics.json (e.g. 'small').
    mode: 'walltime' (both decoders, timed), 'alpha' (α only,
      Corollary 3.6: alpha.json, no walltimes) or 'infer' (the speculative
      decoder only, as T5X's infer.py: predictions.jsonl in T5X's form and
      infer.json; no baseline decode, no pricing).
    mesh_shape: the (data, model) device mesh, e.g. (1, 4) shards the
      models over 4 chips.
    overwrite: True lets a run replace the metrics.json / alpha.json of a
      run with other settings in output_dir (default: refuse, before
      loading anything).
    decode_mode: how both decoders decode: the mode ACCEPTANCE and DECODE
      name (`decode_modes.named`), or one an experiment file hands in
      (`run.decode_mode = @TreeMode()`), with its own settings.
    drafting: what guesses: the spec DRAFTER names
      (`drafter_registry.named`), or one handed in (`run.drafting =
      @NGramSpec()`), with its own settings.
    ngram_corpus: the n-gram drafters' corpus: text in the models'
      language, one sentence per line, or a .npz of token ids.
    compile_topology: compile only, for this Cloud TPU slice, without a
      TPU (e.g. 'v4-8'; needs libtpu): OUTPUT_DIR/compile.json; None = a
      normal run.
    price_call_cost: MODE='walltime': True prices c and the verification
      call after the decode (seconds; Theorem 3.8 at the measured call
      cost); False skips it: metrics.json says `call_cost_priced`: false,
      and c, the step and call seconds and the theory keys are null
      (GAMMA / TREE_WIDTH 'auto' still price in their pilot).
    speculation: 'on' (speculative decoding, the default), 'off' (the
      target alone: only the baseline decoder runs; speedup 1 by
      definition) or 'auto' (before the timed decode the run prices the
      target alone, token and block verification at each γ, trees (γ, k)
      where the drafter drafts them, or for DECODE='beam' speculative
      beams vs the plain beam search, on this machine, and runs the one
      of the best predicted walltime: metrics.json's `auto`, and a stdout
      line `auto: ...`).
    target_decode_path: how the target's decode calls compute
      (docs/usage/gpu.md, "Decode path"): 'xla' (XLA's ops on T5X's
      kernels), 'cpu_kernel' (the CPU matmul kernel: float32 on one CPU),
      'packed' (q/k/v and the MLP's input kernels packed) or 'fused' (the
      GPU kernels; Pallas' interpret mode off a GPU: slow); None = the
      backend's ('cpu_kernel' where it is built, 'packed' on one GPU, else
      'xla'). Checked at start-up against the model's T5Config; with
      MESH_SHAPE of several devices or COMPILE_TOPOLOGY only 'xla'.
      metrics.json's `decode_paths` records the path each model ran on.
    draft_decode_path: the same for the draft model (DRAFTER 'model',
      'hierarchical', and 'shared_encoder': its decoder); None with a
      drafter that decodes no T5 draft (n-grams, prompt lookup, 'feature').
    target_tiles: the block sizes and launch settings of the target's GPU
      kernels (docs/usage/gpu.md, "Tiles"): a preset of
      `gpu_tiles.TILE_PRESETS` (e.g. 'mma_split'), with
      TARGET_DECODE_PATH='fused' only; None = `gpu_tiles.Tiles()`. Exact
      under every preset (the target alone decodes on its tiles too);
      what the device check times differs.
    draft_tiles: the same for the draft model, with
      DRAFT_DECODE_PATH='fused' (e.g. 'tall_mma_persistent_prefetch': the
      draft's step one kernel over the GPU's multiprocessors).
  """
  output_dir: str = _arg("OUTPUT_DIR")
  target_checkpoint_path: Optional[str] = _arg("TARGET_CHECKPOINT_PATH", None)
  draft_checkpoint_path: Optional[str] = _arg("DRAFT_CHECKPOINT_PATH", None)
  gamma: Union[int, str] = _arg("GAMMA", 5)
  temperature: float = _arg("TEMPERATURE", 0.0)
  top_k: int = _arg("TOPK", 0)
  top_p: float = _arg("TOPP", 1.0)
  batch_size: int = _arg("BATCH_SIZE", 1)
  num_examples: int = _arg("NUM_EXAMPLES", 100)
  seed: int = _arg("SEED", 0)
  mixture_or_task_name: Optional[str] = _arg("MIXTURE_OR_TASK_NAME", None)
  split: str = _arg("SPLIT", "validation")
  task_feature_lengths: Dict[str, int] = _arg(
      "TASK_FEATURE_LENGTHS", default_factory=lambda: {
          "inputs": 512,
          "targets": 128
      })
  source_file: Optional[str] = _arg("SOURCE_FILE", None)
  reference_file: Optional[str] = _arg("REFERENCE_FILE", None)
  input_prefix: str = _arg("INPUT_PREFIX", "")
  task_kind: Optional[str] = _arg("TASK_KIND", None)
  task_name: str = _arg("TASK", "")
  target_name: str = _arg("TARGET_NAME", "")
  draft_name: str = _arg("DRAFT_NAME", "")
  mode: str = _arg("MODE", "walltime")
  mesh_shape: Tuple[int, ...] = _arg("MESH_SHAPE", (1, 1))
  overwrite: bool = _arg("OVERWRITE", False)
  decode_mode: decode_modes.DecodeMode = dataclasses.field(
      default_factory=decode_modes.named)
  drafting: drafter_registry.DrafterSpec = dataclasses.field(
      default_factory=drafter_registry.named)
  ngram_corpus: Optional[str] = _arg("NGRAM_CORPUS", None)
  compile_topology: Optional[str] = _arg("COMPILE_TOPOLOGY", None)
  price_call_cost: bool = _arg("PRICE_CALL_COST", True)
  speculation: str = _arg("SPECULATION", "on")
  target_decode_path: Optional[str] = _arg("TARGET_DECODE_PATH", None)
  draft_decode_path: Optional[str] = _arg("DRAFT_DECODE_PATH", None)
  target_tiles: Optional[str] = _arg("TARGET_TILES", None)
  draft_tiles: Optional[str] = _arg("DRAFT_TILES", None)

  def __post_init__(self):
    # As gin gives them: a list for MESH_SHAPE = [1, 4]; one dict that
    # every run reading the macro shares.
    if isinstance(self.mesh_shape, list):
      object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
    if isinstance(self.task_feature_lengths, dict):
      object.__setattr__(self, "task_feature_lengths",
                         dict(self.task_feature_lengths))
    check_types(self)
    check_settings(self)
    for name, kind, example in (("decode_mode", decode_modes.DecodeMode,
                                 "TreeMode"),
                                ("drafting", drafter_registry.DrafterSpec,
                                 "NGramSpec")):
      if not isinstance(getattr(self, name), kind):
        raise ConfigError(f"run.{name}={getattr(self, name)!r}: allowed: a "
                          f"{kind.__name__}, e.g. @{example}().")
    for component in (self.decode_mode, *self.drafting.components()):
      check_types(component)
    _check_files(self)
    try:
      if isinstance(self.gamma, str) and self.gamma != AUTO_GAMMA:
        raise ValueError(f"GAMMA={self.gamma!r}: allowed: an integer >= 1, "
                         f"or '{AUTO_GAMMA}' (Theorem 3.8's best γ for the α "
                         "and c measured on the first examples).")
      _check_speculation(self)
      _check_decode_paths(self)
      _check_tiles(self)
      self.decode_mode.check(self)
      self.drafting.check(self)
      _check_decoding_args(self)
    except ValueError as e:  # a bad setting, not a bug: no traceback
      raise ConfigError(str(e)) from None

  @property
  def auto_gamma(self) -> bool:
    """GAMMA='auto': γ is chosen by the run."""
    return self.gamma == AUTO_GAMMA

  @property
  def max_decode_length(self) -> int:
    return self.task_feature_lengths["targets"]

  @property
  def label(self) -> str:
    """The task's label in metrics.json and the summary."""
    return self.task_name or self.mixture_or_task_name or "local"

  def method(self) -> sampling.SamplingMethod:
    """The sampling method (greedy at temperature 0)."""
    return sampling.make_method(self.temperature, self.top_k, self.top_p)

  def chosen_decode_paths(self) -> Dict[str, str]:
    """{macro: path} of TARGET_DECODE_PATH / DRAFT_DECODE_PATH where set
    (None: the backend's)."""
    paths = (("TARGET_DECODE_PATH", self.target_decode_path),
             ("DRAFT_DECODE_PATH", self.draft_decode_path))
    return {macro: path for macro, path in paths if path is not None}

  def chosen_tiles(self) -> Dict[str, str]:
    """{macro: preset} of TARGET_TILES / DRAFT_TILES where set."""
    tiles = (("TARGET_TILES", self.target_tiles), ("DRAFT_TILES",
                                                   self.draft_tiles))
    return {macro: name for macro, name in tiles if name is not None}

  @property
  def random_weights(self) -> bool:
    """A checkpoint the run needs is unset: random weights."""
    return not (self.target_checkpoint_path and
                (self.draft_checkpoint_path or
                 not self.drafting.uses_draft_model))


# The one table run.gin's bindings, macros.md and the typo checks follow.
MACROS: Mapping[str, str] = types.MappingProxyType({
    f.name: f.metadata["macro"]
    for f in dataclasses.fields(RunArguments)
    if "macro" in f.metadata
})
ARGUMENTS = tuple(f.name for f in dataclasses.fields(RunArguments))
# The configurables gin/run.gin binds macros to, and the docstring section
# that says what each argument means (docs/usage/macros.md).
_COMPONENTS = (decode_modes.TokenMode, decode_modes.TreeMode,
               decode_modes.BeamMode, drafter_registry.ModelSpec,
               drafter_registry.NGramSpec, drafter_registry.PromptLookupSpec,
               drafter_registry.HierarchicalSpec)
DOCUMENTED: Mapping[str, Tuple[Any, str]] = types.MappingProxyType({
    "run": (RunArguments, "Attributes"),
    "decode_mode": (decode_modes.named, "Args"),
    "drafter": (drafter_registry.named, "Args"),
    **{
        cls.__name__: (cls, "Attributes") for cls in _COMPONENTS
    },
})


def check_settings(args: RunArguments) -> None:
  """The run arguments' values that neither their types (`check_types`) nor
  `decoding` check; ConfigError naming the macro."""

  def bad(name, allowed):
    return ConfigError(f"{MACROS.get(name, name)}={getattr(args, name)!r} "
                       f"(run.{name}): allowed: {allowed}.")

  t, p = args.temperature, args.top_p
  if not (is_real(t) and t >= 0):
    raise bad("temperature", "a finite number >= 0 (0 = greedy)")
  if not (is_real(p) and 0 < p <= 1):
    raise bad("top_p", "a finite number in (0, 1] (1 = off)")
  if not (is_int(args.top_k) and args.top_k >= 0):
    raise bad("top_k", "an integer >= 0 (0 = off)")
  if not is_int(args.seed) or not 0 <= args.seed <= MAX_SEED:
    raise bad(
        "seed", f"an integer from 0 to {MAX_SEED} (JAX's PRNG keys "
        "keep 32 bits)")
  inputs = args.task_feature_lengths.get("inputs", 2)  # keys: checked later
  if not is_int(inputs) or inputs < 2:
    raise ConfigError(
        f"TASK_FEATURE_LENGTHS['inputs']={inputs!r}: allowed: an integer >= 2 "
        "(input tokens per example, EOS included).")
  task = args.task_name
  if isinstance(task, str) and len(task.encode("utf-8")) > TASK_MAX_BYTES:
    raise ConfigError(
        f"TASK={task[:40]!r}... ({len(task.encode('utf-8'))} bytes, "
        f"run.task_name): allowed: at most {TASK_MAX_BYTES} bytes (a sweep "
        "names a point's folder 'TASK=<value>').")
  output_dir = args.output_dir
  if not isinstance(output_dir, str) or not output_dir:
    raise bad("output_dir", "a directory path")
  if (("://" in output_dir or output_dir.startswith("gs:")) and
      not _GCS_DIR.fullmatch(output_dir)):
    raise bad(
        "output_dir", "a local directory or gs://bucket/folder (a "
        "gs:// path begins with its bucket's name)")


def _type_allows(annotation: Any, value: Any) -> bool:
  """Whether `value` is of a field's declared type (bool is no int, an int
  is a float)."""
  origin = typing.get_origin(annotation)
  if origin is Union:
    return any(_type_allows(a, value) for a in typing.get_args(annotation))
  if annotation is type(None):
    return value is None
  if annotation is float:
    return is_number(value)
  if annotation is int:
    return is_int(value)
  if origin is tuple:
    return isinstance(value, tuple) and all(
        _type_allows(typing.get_args(annotation)[0], v) for v in value)
  return isinstance(value, origin or annotation)


_TYPE_WORDS = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "True or False",
    type(None): "None",
    dict: "a dict",
    tuple: "a tuple of integers"
}


def _type_words(annotation: Any) -> str:
  """A field's declared type in words: 'None or a string'."""
  args = typing.get_args(annotation)
  if typing.get_origin(annotation) is Union:
    return " or ".join(
        _type_words(a) for a in sorted(args, key=lambda a: a is not type(None)))
  return _TYPE_WORDS.get(
      typing.get_origin(annotation) or annotation, str(annotation))


# Checked later, in their own words ('an integer >= 1, or 'auto'').
_OWN_TYPE_WORDS = ("GAMMA", "TREE_WIDTH", "SPECULATION")


def check_types(component: Any) -> None:
  """Every setting of `component` (the run's arguments, or a component's)
  against the type its field declares; ConfigError naming the macro, the
  binding, the value and the type allowed."""
  hints = typing.get_type_hints(type(component))
  where = "run" if isinstance(component,
                              RunArguments) else type(component).__name__
  for field in dataclasses.fields(component):
    macro = field.metadata.get("macro")
    if macro is None or macro in _OWN_TYPE_WORDS:
      continue
    value = getattr(component, field.name)
    if not _type_allows(hints[field.name], value):
      raise ConfigError(
          f"{macro}={value!r} ({where}.{field.name}): allowed: "
          f"{_type_words(hints[field.name])} (got {type(value).__name__}).")


def _check_files(args: RunArguments) -> None:
  """TASK_KIND among the kinds; SOURCE_FILE, REFERENCE_FILE local."""
  if args.task_kind is not None and args.task_kind not in TASK_KINDS:
    raise ConfigError(f"TASK_KIND={args.task_kind!r}: allowed: None (from "
                      "the seqio task) or one of "
                      f"{', '.join(repr(k) for k in TASK_KINDS)}.")
  for name in ("source_file", "reference_file"):
    path = getattr(args, name)
    if path and "://" in path:
      raise ConfigError(f"{MACROS[name]}={path!r}: only local files are read "
                        "(copy it here first, e.g. with gsutil cp).")


def _check_decoding_args(args: RunArguments) -> None:
  """MODE, TASK_FEATURE_LENGTHS, GAMMA, the sampling settings together,
  BATCH_SIZE and NUM_EXAMPLES; ValueError."""
  if args.mode not in MODES:
    raise ValueError(f"MODE={args.mode!r}: allowed: one of {MODES}.")
  if set(args.task_feature_lengths) != {"inputs", "targets"}:
    raise ValueError("TASK_FEATURE_LENGTHS must have exactly the keys "
                     "'inputs' and 'targets', got "
                     f"{args.task_feature_lengths!r}.")
  _check_gamma_and_length(args)
  args.method()  # Validates temperature, top_k and top_p together.
  for name, value in (("BATCH_SIZE", args.batch_size), ("NUM_EXAMPLES",
                                                        args.num_examples)):
    if not is_int(value) or value < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")


def _check_gamma_and_length(args: RunArguments) -> None:
  """GAMMA and TASK_FEATURE_LENGTHS['targets'] by the names the user typed,
  and γ no larger than the decode length."""
  targets = args.task_feature_lengths.get("targets", 1)
  if not is_int(targets) or not 1 <= targets <= MAX_DECODE_LENGTH:
    raise ValueError(
        f"TASK_FEATURE_LENGTHS['targets']={targets!r}: allowed: an integer "
        f"from 1 to {MAX_DECODE_LENGTH} (the most tokens decoded per "
        "example, EOS included).")
  if args.auto_gamma:
    return
  if not is_int(args.gamma) or args.gamma < 1:
    raise ValueError(f"GAMMA={args.gamma!r}: allowed: an integer >= 1, or "
                     f"'{AUTO_GAMMA}'.")
  if args.gamma > targets:
    raise ValueError(
        f"GAMMA={args.gamma} is more than TASK_FEATURE_LENGTHS['targets']="
        f"{targets}, the tokens to decode. Allowed: 1 to {targets}, or "
        f"'{AUTO_GAMMA}'.")


def _check_speculation(args: RunArguments) -> None:
  """SPECULATION among its values, and what 'off' / 'auto' cannot run
  with; ValueError."""
  value = args.speculation
  if not isinstance(value, str) or value not in decode_modes.SPECULATIONS:
    raise ValueError(
        f"SPECULATION={value!r}: allowed: 'on' (speculative decoding, the "
        "default), 'off' (the target alone) or 'auto' (the fastest here).")
  if value == decode_modes.SPECULATION_ON:
    return
  if args.mode == "alpha":
    raise ValueError(f"SPECULATION={value!r} with MODE='alpha': allowed: "
                     "SPECULATION='on' (α is measured with the draft).")
  if args.compile_topology is not None:
    raise ValueError(f"SPECULATION={value!r} with COMPILE_TOPOLOGY="
                     f"{args.compile_topology!r}: allowed: SPECULATION='on'.")
  lenience = args.decode_mode.lenience
  threshold = args.drafting.adaptive_threshold
  if value == decode_modes.SPECULATION_AUTO and (lenience != 1 or
                                                 threshold is not None):
    raise ValueError(
        f"SPECULATION='auto' with LENIENCE={lenience!r}, ADAPTIVE_THRESHOLD="
        f"{threshold!r}: 'auto' chooses among exact modes of fixed γ; "
        "allowed: LENIENCE=1 and ADAPTIVE_THRESHOLD=None with 'auto', or "
        "SPECULATION='on'.")


def _check_tiles(args: RunArguments) -> None:
  """TARGET_TILES / DRAFT_TILES: a preset's name, and only for a model
  whose decode path is set to 'fused' (the GPU kernels they are the tiles
  of); ValueError."""
  for macro, name in args.chosen_tiles().items():
    if name not in gpu_tiles.TILE_PRESETS:
      raise ValueError(f"{macro}={name!r}: allowed: None (the kernels' own) "
                       f"or {', '.join(gpu_tiles.TILE_PRESETS)}.")
    path_macro = macro.replace("TILES", "DECODE_PATH")
    path = args.chosen_decode_paths().get(path_macro)
    if path != decode_paths.FUSED:
      raise ValueError(
          f"{macro}={name!r} with {path_macro}={path!r}: tiles are the "
          f"'{decode_paths.FUSED}' path's GPU kernels'; allowed: "
          f"{macro}=None, or {path_macro}='{decode_paths.FUSED}'.")


def _check_decode_paths(args: RunArguments) -> None:
  """TARGET_DECODE_PATH / DRAFT_DECODE_PATH: a path's name
  (`decode_paths.get`), a draft's only with a T5 draft model, and 'xla'
  alone where the models are sharded or compiled for a TPU; ValueError.
  What a model's T5Config allows is checked with the configs
  (`loading.check_decode_paths`)."""
  drafting = args.drafting
  mesh = args.mesh_shape
  devices = math.prod(mesh) if all(is_int(n) and n >= 1 for n in mesh) else 1
  for macro, path in args.chosen_decode_paths().items():
    decode_paths.get(path, macro)  # an unknown name
    if macro == "DRAFT_DECODE_PATH" and not drafting.decodes_draft_model:
      allowed = ", ".join(
          repr(k)
          for k, spec in drafter_registry.DRAFTERS.items()
          if spec.decodes_draft_model)
      raise ValueError(
          f"DRAFT_DECODE_PATH={path!r} with DRAFTER={drafting.name!r}: that "
          "drafter decodes no T5 draft model; allowed: DRAFT_DECODE_PATH="
          f"None, or DRAFTER={allowed}.")
    if path == decode_paths.XLA:
      continue
    if args.compile_topology is not None:
      raise ValueError(
          f"{macro}={path!r} with COMPILE_TOPOLOGY={args.compile_topology!r}"
          ": compile.json compiles the TPU's path, 'xla'; allowed: None or "
          "'xla'.")
    if devices > 1:
      raise ValueError(
          f"{macro}={path!r} with MESH_SHAPE={mesh!r}: {path!r} decodes on "
          f"one device (the partitioner shards T5X's kernels, not its packed "
          f"ones); allowed with a mesh of {devices} devices: None or 'xla'.")


def run_arguments(
    overrides: Optional[Mapping[str, Any]] = None) -> RunArguments:
  """The run's arguments as gin binds them, `overrides` (tests, the sweep
  command) replacing some; ConfigError for an unknown override, a bad value
  or a setting of a component the run did not choose."""
  unknown = sorted(set(overrides or {}) - set(ARGUMENTS))
  if unknown:
    close = list(
        dict.fromkeys(c for name in unknown
                      for c in gin_reader.closest_names(name, list(ARGUMENTS))))
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ConfigError(f"Unknown run arguments {unknown}; {hint}known: "
                      f"{sorted(ARGUMENTS)}.")
  args = RunArguments(**(overrides or {}))  # pylint: disable=missing-kwoa
  read = args.decode_mode.reads() | args.drafting.reads()
  gin_utils.check_unread_settings(
      (*decode_modes.SAMPLING.values(), decode_modes.BEAM), read,
      args.decode_mode.choice)
  gin_utils.check_unread_settings(tuple(drafter_registry.DRAFTERS.values()),
                                  read, args.drafting.choice)
  return args
