"""The run's arguments: one frozen `RunArguments`, the gin configurable
`run` (`run.gamma = %GAMMA`), checked once, when it is built. Each field
names the gin macro that sets it (`MACROS`).

The checks need no model and no I/O: every value's type and range, the
drafter's settings (`drafter_registry`) and the decoders' own argument checks.
What needs the model configs (vocabulary sizes) or a file (NGRAM_CORPUS) is
checked by `plan.RunPlan.build`, still before anything is loaded.
"""
import dataclasses
import re
import types
import typing
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import gin

from specdec_jax.core import decoding
from specdec_jax.config import gin_reader
from specdec_jax.config import gin_utils
from specdec_jax.metrics import quality
from specdec_jax.core import sampling
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import drafter_registry
from specdec_jax.experiment import values

ConfigError = gin_utils.ConfigError
MODES = ("walltime", "alpha", "infer")
# GAMMA='auto': γ chosen by the run (`experiment.auto_gamma`); with
# ACCEPTANCE='tree', GAMMA and/or TREE_WIDTH 'auto': (γ, k) chosen by the
# run (`experiment.auto_tree`).
AUTO_GAMMA = "auto"
# TREE_WIDTH='auto' considers trees of at most this many nodes 1 + k·γ.
AUTO_TREE_MAX_NODES = 25
TASK_KINDS = quality.TASK_KINDS  # BLEU or ROUGE
# The longest decode a run accepts (TASK_FEATURE_LENGTHS['targets']). The
# models set no limit (relative-position buckets), but compiling and
# decoding grow with it, and a run prints nothing until the first batch
# is done: 100000 tokens looked like a hang for many minutes.
MAX_DECODE_LENGTH = 8192
# The largest SEED: JAX's PRNG keys keep a seed's low 32 bits (without
# jax_enable_x64), so 2**32 would repeat seed 0 and -1 seed 2**32 - 1, and
# a seed beyond int64 fails in `jax.random.PRNGKey` with a traceback.
MAX_SEED = 2**32 - 1
# The longest folder name most filesystems take (ext4, XFS, APFS: 255
# bytes). A sweep names a point's folder after its settings, 'TASK=<value>'
# among them (`sweep.point_name`): a longer TASK failed at the sweep's first
# point, after sweep.json was written.
NAME_MAX = 255
TASK_MAX_BYTES = NAME_MAX - len("TASK=")
# OUTPUT_DIR on gs:// names its bucket ('gs://' made a local folder 'gs:').
_GCS_DIR = re.compile(r"gs://[^/]+(/.*)?", re.DOTALL)

_DRAFTING = drafter_registry.DrafterSettings()  # its defaults
# The run arguments of `experiment.drafter_registry.DrafterSettings`.
DRAFTER_ARGS = tuple(
    f.name for f in dataclasses.fields(drafter_registry.DrafterSettings))


def _arg(macro: str, default: Any = dataclasses.MISSING, **kwargs) -> Any:
  """A run argument and the gin macro that sets it (gin/run.gin binds
  `run.<argument> = %MACRO`; error messages and docs/usage/macros.md name
  the macro, which is what the user typed)."""
  return dataclasses.field(default=default, metadata={"macro": macro}, **kwargs)


# The one gin configurable of a run, named `run` (gin/run.gin: `run.gamma =
# %GAMMA`): gin fills the fields a call leaves out from the bindings.
@gin.configurable("run")
@dataclasses.dataclass(frozen=True)
class RunArguments:
  """One run's arguments (all gin-configurable; docs/usage/macros.md).

  Each field names its gin macro (`_arg`, `MACROS`). Each entry below is
  the meaning column of docs/usage/macros.md (`scripts/generate_docs.py`).

  Attributes:
    output_dir: folder for metrics.json and predictions.jsonl (local or
      gs://); created and probed at startup.
    target_checkpoint_path: the target's T5X checkpoint dir
      (`.../checkpoint_N`, local or gs://); None = random weights (smoke
      tests only).
    draft_checkpoint_path: the draft's T5X checkpoint dir, as above
      (drafter 'feature': a feature-level draft's checkpoint, required).
    gamma: Algorithm 1's γ (an integer >= 1), or 'auto' (Theorem 3.8's best
      γ <= 12 for the α, c and call costs measured on the first examples;
      ACCEPTANCE='tree': the tree's best γ, see TREE_WIDTH).
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
      (`X.en`), or a two-column TSV (input, reference).
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
    drafter: what guesses: 'model' (the draft T5 model),
      'shared_encoder' (a draft decoder without an encoder, reading the
      target's encoder output: draft/T5Config.num_encoder_layers = 0),
      'unigram', 'bigram', 'ngram' (counts of ngram_corpus),
      'prompt_lookup' (copies from the input), 'hierarchical' (the draft
      model, itself sped up by inner_drafter) or 'feature' (a
      feature-level, EAGLE-style draft reading the target's hidden states;
      draft_checkpoint_path is its checkpoint, with feature_config.json).
    ngram_corpus: the n-gram drafters' corpus: text in the models'
      language, one sentence per line, or a .npz of token ids.
    ngram_order: the n of drafter 'ngram' (None: 3), at most 16.
    prompt_lookup_max: the longest suffix prompt lookup matches, 1 to 16.
    inner_drafter: 'hierarchical': what speeds up the draft model
      ('prompt_lookup' or an n-gram drafter).
    inner_gamma: 'hierarchical': inner_drafter's guesses per draft call,
      at most TASK_FEATURE_LENGTHS['targets'].
    lenience: Appendix A.5's l in (0, 1]; 1 = exact (the default); l < 1
      is NOT the target's distribution.
    adaptive_threshold: adaptive γ: a row stops guessing after a guess
      less likely than this, in (0, 1); None = off.
    acceptance: how the target verifies the guesses, all exact: 'token'
      (Algorithm 1, the default), 'block' (block verification, Sun et
      al. 2025: never fewer kept guesses in expectation; the same as
      'token' at temperature 0) or 'tree' (tree verification: tree_width
      draft branches of γ guesses, scored in one target call of
      1 + tree_width·γ tokens; needs DRAFTER 'model', 'shared_encoder' or
      'feature').
    tree_width: ACCEPTANCE='tree': k, the draft branches per target call
      (an integer >= 1; k = 1 is Algorithm 1 run by the tree loop), or
      'auto' (the k <= 4, and with GAMMA='auto' the γ, of the best
      predicted speedup for the acceptance and call costs measured on the
      first examples).
    tree_without_replacement: ACCEPTANCE='tree' at T > 0: the k first
      guesses are drawn without replacement (distinct; recursive rejection
      sampling at depth 1) rather than independently; both exact.
    compile_topology: compile only, for this Cloud TPU slice, without a
      TPU (e.g. 'v4-8'; needs libtpu): OUTPUT_DIR/compile.json; None = a
      normal run.
    decode: what both decoders search for: 'sample' (the default: sampling
      or greedy decoding, TEMPERATURE) or 'beam' (beam search, as T5X's:
      the baseline is the target's own beam search, the speculative run
      the draft's beams verified by the target, identical beams; the top
      beam is the prediction; docs/design/beyond_the_paper.md).
    beam_size: DECODE='beam': k, the beams kept (T5X's num_decodes), an
      integer >= 1 and at most half the vocabulary.
    beam_alpha: DECODE='beam': the brevity penalty's exponent α,
      ((5 + length) / 6) ** α, a number >= 0 (T5X's 0.6; 0 = none).
    beam_width: DECODE='beam': u, the draft's beam width, an integer >=
      BEAM_SIZE; None = BEAM_SIZE.
    beam_rows: DECODE='beam': the candidate sequences the target scores per
      call (each a live beam and γ draft tokens), an integer from
      BEAM_SIZE to GAMMA·u + BEAM_SIZE; None = 2u (at most GAMMA·u +
      BEAM_SIZE).
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
  # The drafter's defaults live in `DrafterSettings`.
  drafter: str = _arg("DRAFTER", _DRAFTING.drafter)
  ngram_corpus: Optional[str] = _arg("NGRAM_CORPUS", _DRAFTING.ngram_corpus)
  ngram_order: Optional[int] = _arg("NGRAM_ORDER", _DRAFTING.ngram_order)
  prompt_lookup_max: int = _arg("PROMPT_LOOKUP_MAX",
                                _DRAFTING.prompt_lookup_max)
  inner_drafter: str = _arg("INNER_DRAFTER", _DRAFTING.inner_drafter)
  inner_gamma: int = _arg("INNER_GAMMA", _DRAFTING.inner_gamma)
  lenience: float = _arg("LENIENCE", 1.0)
  adaptive_threshold: Optional[float] = _arg("ADAPTIVE_THRESHOLD",
                                             _DRAFTING.adaptive_threshold)
  acceptance: str = _arg("ACCEPTANCE", "token")
  tree_width: Union[int, str] = _arg("TREE_WIDTH", 1)
  tree_without_replacement: bool = _arg("TREE_WITHOUT_REPLACEMENT", True)
  compile_topology: Optional[str] = _arg("COMPILE_TOPOLOGY", None)
  decode: str = _arg("DECODE", "sample")
  beam_size: int = _arg("BEAM_SIZE", 4)
  beam_alpha: float = _arg("BEAM_ALPHA", 0.6)
  beam_width: Optional[int] = _arg("BEAM_WIDTH", None)
  beam_rows: Optional[int] = _arg("BEAM_ROWS", None)
  price_call_cost: bool = _arg("PRICE_CALL_COST", True)
  speculation: str = _arg("SPECULATION", "on")

  def __post_init__(self):
    # As gin gives them: a list for MESH_SHAPE = [1, 4]; one dict that
    # every run reading the macro shares.
    if isinstance(self.mesh_shape, list):
      object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
    if isinstance(self.task_feature_lengths, dict):
      object.__setattr__(self, "task_feature_lengths",
                         dict(self.task_feature_lengths))
    check_settings(self)
    check_types(self)
    try:
      check_gamma(self.gamma)
      check_lenience(self.lenience)
      decode_modes.check(self)  # DECODE, ACCEPTANCE and what they need
      _check_tree(self)
      self.drafting.check(self.mode)
      _check_decoding_args(self)
    except ValueError as e:  # a bad setting, not a bug: no traceback
      raise ConfigError(str(e)) from None

  # -- derived ----------------------------------------------------------------
  @property
  def drafting(self) -> drafter_registry.DrafterSettings:
    """The drafter's settings (DRAFTER, NGRAM_*, ...)."""
    return drafter_registry.DrafterSettings(
        **{k: getattr(self, k) for k in DRAFTER_ARGS})

  @property
  def auto_gamma(self) -> bool:
    """GAMMA='auto': γ is chosen by the run."""
    return self.gamma == AUTO_GAMMA

  @property
  def auto_tree_width(self) -> bool:
    """TREE_WIDTH='auto': k is chosen by the run (`experiment.auto_tree`)."""
    return self.tree_width == AUTO_GAMMA

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

  @property
  def random_weights(self) -> bool:
    """A checkpoint the run needs is unset: random weights."""
    return not (self.target_checkpoint_path and
                (self.draft_checkpoint_path or
                 not self.drafting.uses_draft_model))


# Each run argument's gin macro, from the fields above: the one table that
# run.gin's bindings, docs/usage/macros.md and the typo checks are held to.
MACROS: Mapping[str, Optional[str]] = types.MappingProxyType(
    {f.name: f.metadata.get("macro") for f in dataclasses.fields(RunArguments)})


def unknown_arguments_message(names: Sequence[str]) -> str:
  """'Unknown run arguments [...]; did you mean ...? known: ...'."""
  close = list(
      dict.fromkeys(c for name in names
                    for c in gin_reader.closest_names(name, list(MACROS))))
  hint = f"did you mean {' or '.join(close)}? " if close else ""
  return (f"Unknown run arguments {sorted(names)}; {hint}known: "
          f"{sorted(MACROS)}.")


def check_settings(args: RunArguments) -> None:
  """The run arguments `decoding` does not check (no I/O, no model).

  Raises:
    ConfigError: naming the gin macro, the value and what is allowed.
  """

  def bad(name, allowed):
    return ConfigError(f"{MACROS.get(name, name)}={getattr(args, name)!r} "
                       f"(run.{name}): allowed: {allowed}.")

  # inf (`1e999`) or nan would run and then be written as `Infinity` / `NaN`,
  # which is not JSON.
  t, p = args.temperature, args.top_p
  if not (values.is_real(t) and t >= 0):
    raise bad("temperature", "a finite number >= 0 (0 = greedy)")
  if not (values.is_real(p) and 0 < p <= 1):
    raise bad("top_p", "a finite number in (0, 1] (1 = off)")
  if not (values.is_int(args.top_k) and args.top_k >= 0):
    raise bad("top_k", "an integer >= 0 (0 = off)")
  if not values.is_int(args.seed) or not 0 <= args.seed <= MAX_SEED:
    raise bad(
        "seed", f"an integer from 0 to {MAX_SEED} (JAX's PRNG keys "
        "keep 32 bits: another seed would repeat one of these)")
  if not isinstance(args.overwrite, bool):
    raise bad("overwrite", "True or False")
  if not isinstance(args.mesh_shape, tuple):
    raise bad("mesh_shape", "(data, model), e.g. (1, 4) shards the models "
              "over 4 chips")
  lengths = args.task_feature_lengths
  if not isinstance(lengths, dict):
    raise bad("task_feature_lengths",
              "{'inputs': S, 'targets': max decode length}")
  inputs = lengths.get("inputs", 2)  # the keys: `_check_decoding_args`
  if not values.is_int(inputs) or inputs < 2:
    raise ConfigError(
        f"TASK_FEATURE_LENGTHS['inputs']={inputs!r}: allowed: an integer >= 2 "
        "(input tokens per example, EOS included; longer inputs are "
        "truncated and counted in metrics.json).")
  task = args.task_name
  if isinstance(task, str) and len(task.encode("utf-8")) > TASK_MAX_BYTES:
    raise ConfigError(
        f"TASK={task[:40]!r}... ({len(task.encode('utf-8'))} bytes, "
        f"run.task_name): allowed: at most {TASK_MAX_BYTES} bytes (a sweep "
        f"names a point's folder 'TASK=<value>', and a folder name has at "
        f"most {NAME_MAX} bytes).")
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
  is a float; a Dict / Tuple's own checks look at its items)."""
  origin = typing.get_origin(annotation)
  if origin is Union:
    return any(_type_allows(a, value) for a in typing.get_args(annotation))
  if annotation is type(None):
    return value is None
  if annotation is float:
    return values.is_number(value)
  if annotation is int:
    return values.is_int(value)
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


# Checked later with their own words: GAMMA is 'an integer >= 1, or
# 'auto'' (`check_gamma`, `_check_gamma_and_length`), not "an integer or
# a string".
_OWN_TYPE_WORDS = ("gamma", "tree_width", "speculation")


def check_types(args: RunArguments) -> None:
  """Every run argument against the type its field declares (`INPUT_PREFIX
  = 5`, `TARGET_NAME = [1, 2]` would fail late, with a traceback, or be
  written to metrics.json as they are).

  Raises:
    ConfigError: naming the macro, the value and the type allowed.
  """
  hints = typing.get_type_hints(RunArguments)
  for field in dataclasses.fields(RunArguments):
    if field.name in _OWN_TYPE_WORDS:
      continue
    value = getattr(args, field.name)
    if not _type_allows(hints[field.name], value):
      raise ConfigError(
          f"{MACROS[field.name]}={value!r} (run.{field.name}): allowed: "
          f"{_type_words(hints[field.name])} (got {type(value).__name__}).")
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
  """MODE, and what the decoders check (γ, max_decode_length, sampling),
  BATCH_SIZE, NUM_EXAMPLES and TASK_FEATURE_LENGTHS' keys; ValueError."""
  if args.mode not in MODES:
    raise ValueError(f"MODE={args.mode!r}: allowed: one of {MODES}.")
  if set(args.task_feature_lengths) != {"inputs", "targets"}:
    raise ValueError("TASK_FEATURE_LENGTHS must have exactly the keys "
                     "'inputs' and 'targets', got "
                     f"{args.task_feature_lengths!r}.")
  _check_gamma_and_length(args)
  decoding.check_settings(
      gamma=None if args.auto_gamma else args.gamma,
      max_decode_length=args.task_feature_lengths.get("targets", 0))
  args.method()  # Validates temperature, top_k and top_p together.
  for name, value in (("BATCH_SIZE", args.batch_size), ("NUM_EXAMPLES",
                                                        args.num_examples)):
    if not values.is_int(value) or value < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")


def _check_gamma_and_length(args: RunArguments) -> None:
  """GAMMA and TASK_FEATURE_LENGTHS['targets'] by the names the user typed
  (`decoding.check_settings` would say "gamma", "max_decode_length"), and
  γ no larger than the decode length: a call cannot keep more guesses than
  there are tokens to decode, and γ = 1000 for 32 tokens costs 1000 draft
  steps per call."""
  targets = args.task_feature_lengths.get("targets", 1)
  if not values.is_int(targets) or not 1 <= targets <= MAX_DECODE_LENGTH:
    raise ValueError(
        f"TASK_FEATURE_LENGTHS['targets']={targets!r}: allowed: an integer "
        f"from 1 to {MAX_DECODE_LENGTH} (the most tokens decoded per "
        "example, EOS included; compiling and decoding take time in "
        "proportion, and nothing is printed until the first batch is "
        "done).")
  _check_inner_gamma(args, targets)
  if args.auto_gamma:
    return
  if not values.is_int(args.gamma) or args.gamma < 1:
    raise ValueError(f"GAMMA={args.gamma!r}: allowed: an integer >= 1, or "
                     f"'{AUTO_GAMMA}'.")
  if args.gamma > targets:
    raise ValueError(
        f"GAMMA={args.gamma} is more than TASK_FEATURE_LENGTHS['targets']="
        f"{targets}: no target call can keep more guesses than there are "
        f"tokens to decode. Allowed: 1 to {targets}, or "
        f"'{AUTO_GAMMA}'.")


def _check_inner_gamma(args: RunArguments, targets: int) -> None:
  """DRAFTER='hierarchical': INNER_GAMMA no larger than the decode length,
  as GAMMA (the draft model scores INNER_GAMMA + 1 tokens per call: 100000
  compiled into a 720 GB allocation)."""
  inner = args.inner_gamma
  if (isinstance(args.drafting.spec, drafter_registry.HierarchicalSpec) and
      inner > targets):
    raise ValueError(
        f"INNER_GAMMA={inner} is more than TASK_FEATURE_LENGTHS['targets']="
        f"{targets}: an inner call cannot keep more guesses than there are "
        f"tokens to decode. Allowed: 1 to {targets}.")


def check_lenience(lenience: Any) -> None:
  """LENIENCE in (0, 1] (1 = exact); raises ValueError."""
  if not (values.is_real(lenience) and 0 < lenience <= 1):
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


def _check_tree(args: "RunArguments") -> None:
  """TREE_WIDTH and TREE_WITHOUT_REPLACEMENT (ValueError): left at their
  defaults but with tree verification; (γ, k) chosen within the trees
  `auto_tree` considers (`decode_modes.TREE` checks the rest)."""
  width = args.tree_width
  if width != AUTO_GAMMA and (not values.is_int(width) or width < 1):
    raise ValueError(f"TREE_WIDTH={width!r}: allowed: an integer >= 1 (the "
                     "draft branches per target call of ACCEPTANCE='tree'), "
                     f"or '{AUTO_GAMMA}' with ACCEPTANCE='tree'.")
  if not decode_modes.mode_of(args).branches:
    if width != 1:
      raise ValueError(
          f"TREE_WIDTH={width!r} with ACCEPTANCE={args.acceptance!r}: only "
          "tree verification drafts branches; allowed: TREE_WIDTH=1, or "
          "ACCEPTANCE='tree'.")
    if args.tree_without_replacement is not True:
      raise ValueError(
          "TREE_WITHOUT_REPLACEMENT="
          f"{args.tree_without_replacement!r} with ACCEPTANCE="
          f"{args.acceptance!r}: only tree verification draws branches; "
          "allowed: TREE_WITHOUT_REPLACEMENT=True (the default), or "
          "ACCEPTANCE='tree'.")
    return
  if (args.auto_tree_width and not args.auto_gamma and
      values.is_int(args.gamma) and 1 + args.gamma > AUTO_TREE_MAX_NODES):
    raise ValueError(
        f"TREE_WIDTH='{AUTO_GAMMA}' with GAMMA={args.gamma}: the choice "
        f"considers trees of at most {AUTO_TREE_MAX_NODES} nodes (1 + k·γ); "
        f"allowed: GAMMA <= {AUTO_TREE_MAX_NODES - 1}, or GAMMA="
        f"'{AUTO_GAMMA}', or an integer TREE_WIDTH.")
  if args.auto_tree_width and args.compile_topology is not None:
    raise ValueError(
        f"TREE_WIDTH='{AUTO_GAMMA}' with COMPILE_TOPOLOGY="
        f"{args.compile_topology!r}: the programs are compiled for one tree; "
        "allowed: an integer TREE_WIDTH >= 1.")


def run_arguments(
    overrides: Optional[Mapping[str, Any]] = None) -> RunArguments:
  """The run's arguments as gin binds them (`run.gamma = ...`), checked:
  `RunArguments()` with `overrides` (tests, the sweep command) replacing
  some.

  Raises:
    ConfigError: an unknown override, or a bad value (`RunArguments`).
  """
  unknown = set(overrides or {}) - set(MACROS)
  if unknown:
    raise ConfigError(unknown_arguments_message(sorted(unknown)))
  return RunArguments(**(overrides or {}))  # pylint: disable=missing-kwoa
