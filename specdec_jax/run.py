r"""Runs the paper's walltime experiment: target alone vs speculative decoding.

  python -m specdec_jax.run --gin_file=ende_small.gin \
      --gin.TARGET_CHECKPOINT_PATH="'gs://.../checkpoint_N'" \
      --gin.OUTPUT_DIR="'/tmp/ende_small'"

Loads the target and the draft (T5X checkpoints, or random weights when no
path is given), encodes the examples of a seqio task or of local files, runs
the baseline (`decoding.temperature_sample`) and speculative decoding
(`decoding.speculative_sample`) on the same examples, and writes to
OUTPUT_DIR:

* `metrics.json`: γ, temperature, α (from acceptance counts, and as mean β),
  target calls, walltimes (compilation excluded: every decoder is compiled
  and run once on the first batch before timing; `block_until_ready`), the
  measured speedup, the cost coefficient c, Theorem 3.8's speedup for the
  measured α and c, and BLEU or ROUGE of both outputs.
* `predictions.jsonl`: per example: input, reference, both outputs, the
  accepted count of every target call and a trace of the draft's guesses.
  Nothing measured goes there (timings are in metrics.json), so two runs
  with the same settings and seed write the same file.

Everything a run can check without a model is checked before any model is
loaded or compiled: the gin macros and run arguments, the vocabulary against
both models' `vocab_size`, TASK_FEATURE_LENGTHS, and OUTPUT_DIR (created and
probed with a temporary file; a metrics.json / alpha.json there from a run
with other settings is not replaced unless OVERWRITE=True). The command
ends with a plain-words summary (`summary_lines`).

OUTPUT_DIR may be a gs:// folder. On several hosts (T5X's flags, or a Cloud
TPU VM: `multihost`), each process reads its slice of the examples, process
0 alone writes, and walltimes are the slowest process's.

With `mode='alpha'` it only measures α as in Corollary 3.6: sample from the
target, then average β = Σ_x min(p(x), q(x)) over the positions of those
samples (`alpha.json`); no walltimes, so it is cheap to run for many
(task, draft, temperature) settings.
"""
import dataclasses
import functools
import json
import math
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import flags
from absl import logging
import gin
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import analysis
from specdec_jax import checkpoints
from specdec_jax import console
from specdec_jax import decoding
from specdec_jax import gin_utils
from specdec_jax import io_utils
from specdec_jax import metrics as metrics_lib
from specdec_jax import multihost
from specdec_jax import partitioning
from specdec_jax import sampling
from specdec_jax import tasks
from specdec_jax import timing
from specdec_jax import vocab as vocab_lib
from specdec_jax.drafters import choice as drafter_choice
from specdec_jax.models import T5Config
from specdec_jax.models import T5Model
from specdec_jax.models import init_params
from specdec_jax.models import param_shapes

METRICS_FILE = "metrics.json"
PREDICTIONS_FILE = "predictions.jsonl"
ALPHA_FILE = "alpha.json"
MODES = ("walltime", "alpha")
ConfigError = gin_utils.ConfigError

# The gin macro (README, "Names you type") that sets each run argument:
# error messages name what the user typed.
MACROS = {
    "output_dir": "OUTPUT_DIR", "gamma": "GAMMA", "temperature": "TEMPERATURE",
    "top_k": "TOPK", "top_p": "TOPP", "batch_size": "BATCH_SIZE",
    "num_examples": "NUM_EXAMPLES", "seed": "SEED",
    "task_feature_lengths": "TASK_FEATURE_LENGTHS", "mode": "MODE",
    "overwrite": "OVERWRITE", "mesh_shape": "MESH_SHAPE",
    "drafter": "DRAFTER", "ngram_corpus": "NGRAM_CORPUS",
    "ngram_order": "NGRAM_ORDER", "prompt_lookup_max": "PROMPT_LOOKUP_MAX",
    "inner_drafter": "INNER_DRAFTER", "inner_gamma": "INNER_GAMMA",
    "lenience": "LENIENCE", "adaptive_threshold": "ADAPTIVE_THRESHOLD",
}
# The run arguments of `drafters.choice.DrafterSettings`.
_DRAFTER_ARGS = tuple(f.name for f in dataclasses.fields(
    drafter_choice.DrafterSettings))
# Arguments that do not make a run's results different (OVERWRITE rule).
_NOT_SETTINGS = ("output_dir", "overwrite", "mode")


# ---------------------------------------------------------------------------
# Configuration pieces (gin).
# ---------------------------------------------------------------------------
def model_config(scope: str) -> T5Config:
  """The T5Config bound under a gin scope ('target' or 'draft')."""
  with gin.config_scope(scope):
    return T5Config()  # pylint: disable=no-value-for-parameter


@gin.configurable
def vocabulary(spm_model_path: Optional[str] = vocab_lib.DEFAULT_SPM_PATH,
               extra_ids: int = vocab_lib.DEFAULT_EXTRA_IDS,
               byte_level: bool = False):
  """The shared vocabulary: a SentencePiece model, or bytes (no file).

  The SentencePiece model is read now (once per path and extra_ids), so a
  missing file or one that is not a SentencePiece model fails at startup
  with a ConfigError naming SPM_MODEL_PATH.
  """
  if byte_level:
    return _load_vocabulary(None, 0, True)
  spm_model_path = _repo_relative(spm_model_path)
  if not spm_model_path:
    raise ConfigError(f"SPM_MODEL_PATH={spm_model_path!r}: give the path of "
                      "a SentencePiece .model file (or bind "
                      "vocabulary.byte_level = True).")
  if "://" not in spm_model_path and not os.path.exists(spm_model_path):
    raise ConfigError(f"SPM_MODEL_PATH={spm_model_path!r} does not exist.")
  return _load_vocabulary(spm_model_path, extra_ids, False)


@functools.lru_cache(maxsize=None)
def _load_vocabulary(spm_model_path, extra_ids, byte_level):
  if byte_level:
    console.import_tensorflow_quietly()
    import seqio  # pylint: disable=g-import-not-at-top
    return seqio.ByteVocabulary()
  console.import_tensorflow_quietly()
  try:
    return vocab_lib.load_vocabulary(spm_model_path, extra_ids)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def describe_vocabulary(vocab) -> str:
  """How the user chose `vocab` (for messages)."""
  path = getattr(vocab, "sentencepiece_model_file", None)
  if path is None:
    return f"{type(vocab).__name__} (vocabulary.byte_level = True)"
  return (f"SPM_MODEL_PATH={path!r} with EXTRA_IDS="
          f"{getattr(vocab, 'extra_ids', '?')}")


def check_vocabulary_fits(vocab, target_config: T5Config,
                          draft_config: T5Config) -> None:
  """Every id of `vocab` must be a row of both models' embedding tables.

  An id >= vocab_size would be clamped by the embedding lookup (JAX does not
  raise on an out-of-bounds gather) and the outputs would be garbage.
  """
  size = int(vocab.vocab_size)
  for role, config in (("target", target_config), ("draft", draft_config)):
    if size > config.vocab_size:
      raise ConfigError(
          f"the vocabulary has {size} ids ({describe_vocabulary(vocab)}) but "
          f"{role}/T5Config.vocab_size = {config.vocab_size}: ids >= "
          f"{config.vocab_size} would be clamped by the {role}'s embedding "
          "lookup and decode to garbage. Allowed: a vocabulary of at most "
          f"{config.vocab_size} ids, or {role}/T5Config.vocab_size >= {size} "
          "(if the checkpoint was trained with that many).")


def load_model(config: T5Config, checkpoint_path: Optional[str], seed: int,
               mesh, what: str) -> T5Model:
  """Loads a T5X checkpoint (or random weights) sharded over `mesh`."""
  shapes = param_shapes(config)["params"]
  shardings = partitioning.param_shardings(mesh, shapes)
  if checkpoint_path:
    # A model dir (as `train` writes) stands for its latest checkpoint.
    latest = checkpoints.latest_checkpoint(_repo_relative(checkpoint_path))
    if latest and not os.path.basename(
        os.path.normpath(checkpoint_path)).startswith("checkpoint_"):
      checkpoint_path = latest
    checkpoint_path = _repo_relative(checkpoint_path)
    logging.info("Loading %s from %s", what, checkpoint_path)
    params = checkpoints.load_t5x_params(checkpoint_path, expected=shapes,
                                         dtype=config.dtype,
                                         shardings=shardings)
  else:
    logging.warning("No %s checkpoint: random weights (seed %d).", what, seed)
    init = jax.jit(lambda rng: init_params(config, rng)["params"],
                   out_shardings=shardings)
    params = jax.tree_util.tree_map(lambda x: x.astype(config.dtype),
                                    init(jax.random.PRNGKey(seed)))
  # Decoder weights packed once for the CPU kernel (a no-op on accelerators
  # and meshes): verification calls cost about what one-token calls cost.
  return T5Model(config, {"params": params}).prepared_for_decoding()


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_settings(args: Dict[str, Any]) -> None:
  """The run arguments `decoding` does not check (no I/O, no model).

  Raises:
    ConfigError: naming the gin macro, the value and what is allowed.
  """
  def bad(name, allowed):
    return ConfigError(f"{MACROS.get(name, name)}={args[name]!r} "
                       f"(run.{name}): allowed: {allowed}.")

  # inf (`1e999`) or nan would run and then be written as `Infinity` / `NaN`,
  # which is not JSON.
  if not (_is_number(args["temperature"]) and math.isfinite(
      args["temperature"]) and args["temperature"] >= 0):
    raise bad("temperature", "a finite number >= 0 (0 = greedy)")
  if not (_is_number(args["top_p"]) and math.isfinite(args["top_p"]) and
          0 < args["top_p"] <= 1):
    raise bad("top_p", "a finite number in (0, 1] (1 = off)")
  if not (isinstance(args["top_k"], int) and not isinstance(
      args["top_k"], bool) and args["top_k"] >= 0):
    raise bad("top_k", "an integer >= 0 (0 = off)")
  if not (isinstance(args["seed"], int) and not isinstance(args["seed"],
                                                            bool)):
    raise bad("seed", "an integer")
  if not isinstance(args["overwrite"], bool):
    raise bad("overwrite", "True or False")
  lengths = args["task_feature_lengths"]
  if not isinstance(lengths, dict):
    raise bad("task_feature_lengths",
              "{'inputs': S, 'targets': max decode length}")
  inputs = lengths.get("inputs", 2)  # the keys: `_check_run_args`
  if isinstance(inputs, bool) or not isinstance(inputs, int) or inputs < 2:
    raise ConfigError(
        f"TASK_FEATURE_LENGTHS['inputs']={inputs!r}: allowed: an integer >= 2 "
        "(input tokens per example, EOS included; longer inputs are "
        "truncated and counted in metrics.json).")
  output_dir = args["output_dir"]
  if not isinstance(output_dir, str) or not output_dir:
    raise bad("output_dir", "a directory path")
  if "://" in output_dir and not output_dir.startswith("gs://"):
    raise bad("output_dir", "a local directory or gs://bucket/folder")


def _check_run_args(mode, gamma, temperature, top_k, top_p, batch_size,
                    num_examples, feature_lengths, target_cfg, draft_cfg):
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
  decoding.check_settings(
      gamma=gamma, max_decode_length=feature_lengths.get("targets", 0))
  sampling.make_method(temperature, top_k, top_p)  # Validates all three.
  decoding.check_vocab_sizes(target_cfg.vocab_size, draft_cfg.vocab_size)
  for name, value in (("BATCH_SIZE", batch_size),
                      ("NUM_EXAMPLES", num_examples)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
  if set(feature_lengths) != {"inputs", "targets"}:
    raise ValueError("TASK_FEATURE_LENGTHS must have exactly the keys "
                     f"'inputs' and 'targets', got {feature_lengths!r}.")


def _settings_diff(old: Any, new: Any, prefix: str = "",
                   limit: int = 6) -> str:
  """'run.gamma: 7 -> 4, ...': where two settings records differ."""
  diffs = []

  def walk(a, b, where):
    if isinstance(a, dict) and isinstance(b, dict):
      for key in sorted(set(a) | set(b)):
        walk(a.get(key), b.get(key), f"{where}.{key}" if where else key)
    elif a != b:
      diffs.append(f"{where}: {a!r} -> {b!r}")

  walk(old, new, prefix)
  more = f" (and {len(diffs) - limit} more)" if len(diffs) > limit else ""
  return ", ".join(diffs[:limit]) + more


def _repo_relative(path: Optional[str]) -> Optional[str]:
  """A relative data path from a gin file: cwd first, then the repository."""
  if not path or os.path.isabs(path) or os.path.exists(path):
    return path
  candidate = gin_utils.GIN_DIR.parent / path
  return str(candidate) if candidate.exists() else path


# ---------------------------------------------------------------------------
# Timing helpers.
# ---------------------------------------------------------------------------
# Encoder input widths are multiples of this: a batch's inputs are cut to its
# longest row rounded up to it (`multihost.Feeder`), so the encoder runs on
# ~16-32 positions for a caption rather than on TASK_FEATURE_LENGTHS['inputs']
# = 64 padded ones, in both decoders alike, at the price of one compilation
# per width (all compiled before timing). Trailing padding does not change
# any output: the encoder masks it.
INPUT_BUCKET = 16


# ---------------------------------------------------------------------------
# α from distributions (Corollary 3.6).
# ---------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("temperature", "top_k", "top_p"))
def _beta_per_position(target: T5Model, draft: T5Model, inputs, outputs,
                       lengths, temperature, top_k, top_p):
  """β_t = Σ_x min(p_t(x), q_t(x)) along target-generated outputs [B, T].

  Both models read the same teacher-forced prefixes (the target's samples),
  so β_t is Definition 3.1's β at position t of a target sequence.

  Returns (beta [B, T], valid [B, T]) with valid = positions < lengths [B].
  """
  decoder_inputs = jnp.pad(outputs[:, :-1], ((0, 0), (1, 0)))
  valid = jnp.arange(outputs.shape[1])[None, :] < lengths[:, None]
  ones = jnp.ones_like(outputs)
  logits_p = target.module.apply(target.params, inputs, decoder_inputs, ones)
  logits_q = draft.module.apply(draft.params, inputs, decoder_inputs, ones)
  p = sampling.standardize(logits_p, temperature, top_k, top_p)
  q = sampling.standardize(logits_q, temperature, top_k, top_p)
  return sampling.acceptance_beta(p, q), valid


# ---------------------------------------------------------------------------
# The run.
# ---------------------------------------------------------------------------
@gin.configurable("run", denylist=["overrides"])
def run_arguments(output_dir: str = gin.REQUIRED,
                  target_checkpoint_path: Optional[str] = None,
                  draft_checkpoint_path: Optional[str] = None,
                  gamma: int = 5,
                  temperature: float = 0.0,
                  top_k: int = 0,
                  top_p: float = 1.0,
                  batch_size: int = 1,
                  num_examples: int = 100,
                  seed: int = 0,
                  mixture_or_task_name: Optional[str] = None,
                  split: str = "validation",
                  task_feature_lengths: Optional[Dict[str, int]] = None,
                  source_file: Optional[str] = None,
                  reference_file: Optional[str] = None,
                  input_prefix: str = "",
                  task_kind: Optional[str] = None,
                  task_name: str = "",
                  target_name: str = "",
                  draft_name: str = "",
                  mode: str = "walltime",
                  mesh_shape: Sequence[int] = (1, 1),
                  overwrite: bool = False,
                  drafter: str = "model",
                  ngram_corpus: Optional[str] = None,
                  ngram_order: Optional[int] = None,
                  prompt_lookup_max: int = 3,
                  inner_drafter: str = "prompt_lookup",
                  inner_gamma: int = 4,
                  lenience: float = 1.0,
                  adaptive_threshold: Optional[float] = None,
                  overrides: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
  """The run's arguments as gin binds them (`run.gamma = ...`).

  Args (all gin-configurable; the README lists the macros that set them):
    output_dir: where metrics.json and predictions.jsonl go.
    target_checkpoint_path / draft_checkpoint_path: T5X checkpoint dirs
      (local or gs://); None means random weights (smoke tests only).
    gamma, temperature, top_k, top_p: Algorithm 1's settings.
    batch_size: rows decoded together (the paper: 1).
    num_examples: how many examples of the split to decode.
    seed: PRNG seed for sampling and random weights.
    mixture_or_task_name / split: a registered seqio task; or
    source_file / reference_file: local parallel text (or a TSV).
    task_feature_lengths: {'inputs': S, 'targets': max_decode_length}.
    input_prefix: prepended to local-file inputs.
    task_kind: 'translation' (BLEU) or 'summarization' (ROUGE); from the
      seqio task when None.
    task_name, target_name, draft_name: labels copied to metrics.json for
      the report (e.g. 'ende', 'xxl', 'small').
    mode: 'walltime' (both decoders, timed) or 'alpha' (α only).
    mesh_shape: (data, model) device mesh.
    overwrite: replace the metrics.json / alpha.json of a run with other
      settings in output_dir (default: refuse, before loading anything).
    drafter, ngram_corpus, ngram_order, prompt_lookup_max, inner_drafter,
      inner_gamma, adaptive_threshold: what guesses (`drafters.choice`:
      'model' is the draft model; gamma may then be 'auto').
    lenience: Appendix A.5's l in (0, 1]; 1 = exact (the default).
    overrides: values replacing the above (tests, the sweep command).

  Returns:
    The arguments of `Experiment`, as a dict.
  """
  args = dict(
      output_dir=output_dir, target_checkpoint_path=target_checkpoint_path,
      draft_checkpoint_path=draft_checkpoint_path, gamma=gamma,
      temperature=temperature, top_k=top_k, top_p=top_p,
      batch_size=batch_size, num_examples=num_examples, seed=seed,
      mixture_or_task_name=mixture_or_task_name, split=split,
      task_feature_lengths=dict(task_feature_lengths or
                                {"inputs": 512, "targets": 128}),
      source_file=source_file, reference_file=reference_file,
      input_prefix=input_prefix, task_kind=task_kind, task_name=task_name,
      target_name=target_name, draft_name=draft_name, mode=mode,
      mesh_shape=tuple(mesh_shape), overwrite=overwrite, drafter=drafter,
      ngram_corpus=ngram_corpus, ngram_order=ngram_order,
      prompt_lookup_max=prompt_lookup_max, inner_drafter=inner_drafter,
      inner_gamma=inner_gamma, lenience=lenience,
      adaptive_threshold=adaptive_threshold)
  unknown = set(overrides or {}) - set(args)
  if unknown:
    raise ConfigError(f"Unknown run arguments {sorted(unknown)}; known: "
                      f"{sorted(args)}.")
  args.update(overrides or {})
  return args


def run(overrides: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
  """Runs the experiment gin describes; returns its metrics dict."""
  return Experiment(**run_arguments(overrides=overrides)).run()  # pylint: disable=missing-kwoa


class Experiment:
  """One (target, draft, settings) run; models can be reused across runs."""

  def __init__(self, *, models=None, **args):
    self.args = args
    a = self.args
    self.target_config = model_config("target")
    self.draft_config = model_config("draft")
    check_settings(a)
    self.drafting = drafter_choice.DrafterSettings(
        **{k: a[k] for k in _DRAFTER_ARGS})
    self.ngram = None  # The n-gram table, counted by `run` before loading.
    try:
      drafter_choice.check_gamma(a["gamma"])
      drafter_choice.check_lenience(a["lenience"])
      self.drafting.check(a["mode"])
      corpus = _repo_relative(self.drafting.ngram_corpus)
      if self.drafting.order is not None and not os.path.isfile(corpus):
        raise ValueError(f"NGRAM_CORPUS={self.drafting.ngram_corpus!r}: no "
                         "such file (a text file with one sentence per "
                         "line, or a .npz of token ids).")
      _check_run_args(a["mode"], None if a["gamma"] == drafter_choice.AUTO_GAMMA
                      else a["gamma"], a["temperature"], a["top_k"],
                      a["top_p"], a["batch_size"], a["num_examples"],
                      a["task_feature_lengths"], self.target_config,
                      self.draft_config)
    except ValueError as e:  # a bad setting, not a bug: no traceback
      raise ConfigError(str(e)) from None
    self._models = models
    self._mesh = None
    self.data_info: Dict[str, Any] = {}

  # -- startup checks (no model) ---------------------------------------------
  def vocabulary(self):
    """The vocabulary, checked against both models' vocab_size."""
    vocab = vocabulary()
    check_vocabulary_fits(vocab, self.target_config, self.draft_config)
    return vocab

  def settings(self, vocab) -> Dict[str, Any]:
    """What makes this run's results what they are (the OVERWRITE rule):
    the run arguments but OUTPUT_DIR / OVERWRITE / MODE, both model
    configs and the vocabulary; JSON-normalized."""
    run_args = {k: v for k, v in self.args.items() if k not in _NOT_SETTINGS}
    if (self.drafting == drafter_choice.DrafterSettings(
        ngram_corpus=self.drafting.ngram_corpus) and self.args["lenience"] == 1):
      # The paper's setting: recorded as before these options existed, so
      # earlier results still count as the same run.
      for k in _DRAFTER_ARGS + ("lenience",):
        run_args.pop(k)
    record = {
        "run": run_args,
        "target": dataclasses.asdict(self.target_config),
        "draft": dataclasses.asdict(self.draft_config),
        "vocabulary": {"kind": type(vocab).__name__,
                       "size": int(vocab.vocab_size),
                       "file": getattr(vocab, "sentencepiece_model_file",
                                       None)},
    }
    return json.loads(json.dumps(record, sort_keys=True, default=str))

  def prepare_output_dir(self, settings: Dict[str, Any]) -> None:
    """Creates and probes OUTPUT_DIR; refuses another run's results there.

    A metrics.json or alpha.json in OUTPUT_DIR whose recorded settings differ
    from this run's (or that records none) is only replaced with
    OVERWRITE=True; the same settings may be re-run freely. On several hosts
    process 0 (the writer) checks, and the others follow its verdict.
    """
    multihost.run_on_first("output_dir",
                           lambda: self._prepare_output_dir(settings))

  def _prepare_output_dir(self, settings: Dict[str, Any]) -> None:
    a = self.args
    out = a["output_dir"]
    try:
      io_utils.probe_writable_dir(out)
    except ValueError as e:
      raise ConfigError(f"OUTPUT_DIR={out!r}: {e}") from None
    for name in (METRICS_FILE, ALPHA_FILE):
      path = os.path.join(out, name)
      if not io_utils.isfile(path):
        continue
      try:
        old = json.loads(io_utils.read_text(path)).get("settings")
      except (OSError, ValueError, AttributeError):
        old = None
      if old == settings or a["overwrite"]:
        if old != settings:
          logging.warning("OVERWRITE=True: replacing %s (a run with other "
                          "settings).", path)
        continue
      what = ("records no settings (written by another program or an older "
              "version)" if old is None else
              "is from a run with other settings: " + _settings_diff(
                  old, settings))
      raise ConfigError(
          f"OUTPUT_DIR={out!r} holds {name}, which {what}. Refusing to "
          "overwrite it: choose another OUTPUT_DIR, or pass "
          "--gin.OVERWRITE=True to replace it.")

  # -- loading --------------------------------------------------------------
  def mesh(self):
    """The (data, model) mesh over every process's devices (no model)."""
    if self._models is not None:
      return self._models[0]
    if self._mesh is None:
      try:
        self._mesh = partitioning.make_mesh(*self.args["mesh_shape"])
      except ValueError as e:
        raise ConfigError(f"MESH_SHAPE={self.args['mesh_shape']!r}: {e}"
                          ) from None
    return self._mesh

  def models(self):
    """(mesh, target, draft), loaded once; draft is None while no run has
    needed it (DRAFTER 'model' and 'hierarchical' do)."""
    a = self.args
    if self._models is None:
      mesh = self.mesh()
      target = load_model(self.target_config, a["target_checkpoint_path"],
                          a["seed"], mesh, "target")
      self._models = (mesh, target, None)
    mesh, target, draft = self._models
    if draft is None and self.drafting.uses_draft_model:
      draft = load_model(self.draft_config, a["draft_checkpoint_path"],
                         a["seed"] + 1, mesh, "draft")
      self._models = (mesh, target, draft)
    return self._models

  def examples(self, layout: Optional[multihost.DataLayout] = None):
    """This process's slice of the examples (`layout`; all of them on one
    host)."""
    a = self.args
    sliced = layout is not None and layout.num_shards > 1
    try:
      return tasks.load_examples(
          mixture_or_task_name=a["mixture_or_task_name"], split=a["split"],
          num_examples=a["num_examples"],
          source_file=_repo_relative(a["source_file"]),
          reference_file=_repo_relative(a["reference_file"]),
          input_prefix=a["input_prefix"],
          shard_info=layout.shard_info if sliced else None)
    except ValueError as e:  # names the file and line, or the task
      raise ConfigError(str(e)) from None

  def check_examples(self, examples) -> None:
    """All examples (every process's): none, or fewer than NUM_EXAMPLES,
    is an error, or logged and recorded."""
    a = self.args
    source = (f"task {a['mixture_or_task_name']!r} split {a['split']!r}"
              if a["mixture_or_task_name"] else
              f"SOURCE_FILE={a['source_file']!r}")
    if not examples:
      raise ConfigError(f"No examples to decode in {source}.")
    self.data_info["num_examples_requested"] = a["num_examples"]
    if len(examples) < a["num_examples"]:
      logging.warning("NUM_EXAMPLES=%d but %s has only %d examples: decoding "
                      "%d (metrics.json records both numbers).",
                      a["num_examples"], source, len(examples), len(examples))

  def encode_inputs(self, vocab, examples) -> Tuple[np.ndarray, np.ndarray]:
    """([N, S] input ids, [N] lengths with EOS before truncation)."""
    length = self.args["task_feature_lengths"]["inputs"]
    return tasks.encode_batch(vocab, [e["input"] for e in examples], length,
                              return_lengths=True)

  def check_truncation(self, lengths: np.ndarray) -> None:
    """Inputs longer than S (all examples' `lengths`): counted, logged."""
    length = self.args["task_feature_lengths"]["inputs"]
    truncated = int(np.sum(lengths > length))
    self.data_info.update(inputs_length=length, inputs_truncated=truncated,
                          longest_input_tokens=int(lengths.max()))
    if truncated:
      logging.warning(
          "TASK_FEATURE_LENGTHS['inputs']=%d truncates %d of %d inputs (the "
          "longest has %d tokens with EOS); they are decoded from their "
          "first %d tokens. Raise it to decode whole inputs.", length,
          truncated, len(lengths), int(lengths.max()), length - 1)

  def task_kind(self) -> str:
    a = self.args
    if a["task_kind"]:
      return a["task_kind"]
    if a["mixture_or_task_name"]:
      return tasks.get_task_kind(a["mixture_or_task_name"])
    return metrics_lib.TRANSLATION

  # -- running --------------------------------------------------------------
  def run(self) -> Dict[str, Any]:
    a = self.args
    # Everything that can fail without a model fails here, before loading.
    vocab = self.vocabulary()
    self.ngram = self.ngram_table(vocab)
    self.prepare_output_dir(self.settings(vocab))
    # Each process reads its slice of the examples; texts and token counts
    # are exchanged, so every process knows all of them (`multihost`).
    sharding = partitioning.data_sharding(self.mesh(), a["batch_size"])
    try:
      layout = multihost.data_layout(sharding, a["batch_size"])
    except ValueError as e:
      raise ConfigError(f"MESH_SHAPE={a['mesh_shape']!r}: {e}") from None
    local = self.examples(layout)
    inputs, full_lengths = self.encode_inputs(vocab, local)
    shared = multihost.share_examples(layout, local, inputs, full_lengths)
    examples = shared.examples
    self.check_examples(examples)
    self.check_truncation(shared.full_lengths)
    feed = multihost.Feeder(layout, inputs, shared, sharding, INPUT_BUCKET)
    logging.info("%d examples; mode=%s γ=%s T=%s", len(examples), a["mode"],
                 a["gamma"], a["temperature"])
    mesh, target, draft = self.models()
    # No process enters the decoders' collectives long before the others.
    multihost.barrier("models_loaded")
    if a["mode"] == "alpha":
      return self._run_alpha(vocab, examples, feed, mesh, target, draft)
    return self._run_walltime(vocab, examples, feed, mesh, target, draft)

  # -- drafting (DRAFTER, LENIENCE, ADAPTIVE_THRESHOLD, GAMMA='auto') --------
  def ngram_table(self, vocab):
    """The n-gram drafter's table (None without one), counted before any
    model is loaded: a bad NGRAM_CORPUS fails here."""
    try:
      return self.drafting.ngram_table(
          vocab, self.target_config.vocab_size,
          _repo_relative(self.drafting.ngram_corpus))
    except ValueError as e:
      raise ConfigError(str(e)) from None

  def drafter(self, draft):
    """What guesses: the draft model itself, or a `drafters` drafter."""
    return self.drafting.build(draft, self.ngram,
                               self.target_config.vocab_size)

  def acceptance(self) -> Optional[decoding.AcceptanceRule]:
    """None (Algorithm 1) unless LENIENCE < 1."""
    lenience = self.args["lenience"]
    return None if lenience == 1 else decoding.LenientAcceptance(
        np.float32(lenience))

  def _choose_gamma(self, feed, target, draft) -> Dict[str, Any]:
    """GAMMA='auto': α and c on the first batches, then Theorem 3.8."""
    a = self.args
    pilot = drafter_choice.AUTO_GAMMA_PILOT
    _, speculative = self._decoders(target, draft, pilot)
    rng = jax.random.PRNGKey(a["seed"])
    batches = min(feed.num_batches, max(
        1, drafter_choice.AUTO_GAMMA_EXAMPLES // a["batch_size"]))
    kept = trials = tokens = rows = 0
    for b in range(batches):
      stats = multihost.to_host(speculative(feed.batch(b), rng)).statistics()
      kept += int(np.arange(pilot + 1) @ np.asarray(
          stats["accepted_histogram"]))
      trials += stats["acceptance_trials"]
      tokens += stats["tokens_generated"]
      rows += a["batch_size"]
    alpha = kept / max(trials, 1)
    fill = max(1, tokens // rows)
    c = self._cost_coefficient(target, draft, feed.batch(0), pilot, fill)
    costs = self._call_costs(target, feed.batch(0), fill)
    chosen = drafter_choice.choose_gamma(alpha, c, costs)
    logging.info("GAMMA='auto': alpha %.3f, c %.3f and verification calls "
                 "of %s steps on %d batches (γ=%d) -> γ=%d (Theorem 3.8)",
                 alpha, c, np.round(costs, 2).tolist(), batches, pilot,
                 chosen)
    return {"pilot_gamma": pilot, "pilot_batches": batches,
            "alpha": alpha, "cost_coefficient_c": c,
            "call_cost_by_gamma": [float(x) for x in costs],
            "max_gamma": drafter_choice.AUTO_GAMMA_MAX,
            "chosen_gamma": chosen}

  def _call_costs(self, target, batch, fill: int) -> np.ndarray:
    """GAMMA='auto': the target's (γ+1)-token call in target steps for
    γ = 1..AUTO_GAMMA_MAX, timed as `_run_walltime` times a step."""
    cache_len = (self.args["task_feature_lengths"]["targets"]
                 + drafter_choice.AUTO_GAMMA_MAX + 1)
    inputs = np.asarray(multihost.to_host(batch))
    fill = min(fill, cache_len - drafter_choice.AUTO_GAMMA_MAX - 1)
    return drafter_choice.call_costs({
        k: timing.decode_call_seconds(target, inputs, k=k, fill=fill,
                                      cache_len=cache_len)
        for k in drafter_choice.AUTO_GAMMA_CALL_KS})

  def _cost_coefficient(self, target, draft, batch, gamma: int,
                        fill: int) -> float:
    """c: one draft step (or, for other drafters, one guess) over one
    target step, timed as `_run_walltime` does."""
    cache_len = self.args["task_feature_lengths"]["targets"] + gamma + 1
    inputs = np.asarray(multihost.to_host(batch))
    step = functools.partial(timing.decode_call_seconds,
                             encoder_input_tokens=inputs, fill=fill,
                             cache_len=cache_len)
    return self._draft_seconds(target, draft, batch, gamma, fill) / step(
        target, k=1)

  def _draft_seconds(self, target, draft, batch, gamma: int,
                     fill: int) -> float:
    """One draft step (DRAFTER='model'), or one guess of the drafter: its
    `propose` on the target's own output for `batch`, divided by γ."""
    a = self.args
    cache_len = a["task_feature_lengths"]["targets"] + gamma + 1
    inputs = np.asarray(multihost.to_host(batch))
    if self.drafting.drafter == "model":
      return timing.decode_call_seconds(draft, inputs, k=1, fill=fill,
                                        cache_len=cache_len)
    method = sampling.make_method(a["temperature"], a["top_k"], a["top_p"])
    context = np.asarray(multihost.to_host(decoding.temperature_sample(
        target, batch, jax.random.PRNGKey(a["seed"]),
        max_decode_length=a["task_feature_lengths"]["targets"],
        method=method).tokens))
    buffer = np.pad(context, ((0, 0), (1, gamma + 2)))
    return drafter_choice.propose_seconds(
        self.drafter(draft), inputs, buffer,
        np.full((len(inputs),), max(fill, 1), np.int32), gamma=gamma,
        method=method, max_len=cache_len) / gamma

  def _drafting_metrics(self, a, per_example, tokens: int, c: float,
                        gamma_auto) -> Dict[str, Any]:
    """metrics.json's drafter, lenience, adaptive-γ and GAMMA='auto' keys."""
    kept = [t["num_accepted"] for e in per_example for t in e["trace"]]
    guessed = [len(t["draft_tokens"]) for e in per_example
               for t in e["trace"]]
    bound = analysis.per_iteration_gamma_bound(kept, guessed, a["gamma"], c,
                                               tokens)
    # The report tells drafts apart by this label: variants get their own.
    label = self.drafting.label(a["draft_name"])
    if a["adaptive_threshold"] is not None:
      label += f" adaptive {a['adaptive_threshold']:g}"
    if gamma_auto:
      label += " auto-γ"
    if a["lenience"] != 1:
      label += f" l={a['lenience']:g}"
    return {
        "drafter": self.drafting.drafter,
        "draft_model": label,
        "drafter_settings": self.drafting.record(),
        "lenience": a["lenience"],
        "exact": a["lenience"] == 1,
        "adaptive_threshold": a["adaptive_threshold"],
        "gamma_auto": gamma_auto,
        "guesses_per_target_call": float(np.mean(guessed)) if guessed else 0.0,
        # §3.5: Theorem 3.8's cost model (target call 1, guess c) applied to
        # this run's iterations: every call drafting γ, drafting what it
        # did, and drafting exactly what was kept (the per-call oracle).
        "per_iteration_gamma": {"fixed_gamma_speedup": bound["fixed"],
                                "achieved_speedup": bound["achieved"],
                                "oracle_speedup": bound["oracle"]},
    }

  def _decoders(self, target, draft, gamma: Optional[int] = None):
    a = self.args
    gamma = a["gamma"] if gamma is None else gamma
    max_len = a["task_feature_lengths"]["targets"]
    method = sampling.make_method(a["temperature"], a["top_k"], a["top_p"])
    drafter, acceptance = self.drafter(draft), self.acceptance()

    def baseline(batch, rng):
      return decoding.temperature_sample(target, batch, rng,
                                         max_decode_length=max_len,
                                         method=method)

    def speculative(batch, rng):
      return decoding.speculative_sample(target, drafter, batch, rng,
                                         gamma=gamma,
                                         max_decode_length=max_len,
                                         method=method, acceptance=acceptance)
    return baseline, speculative

  def _run_walltime(self, vocab, examples, feed, mesh, target, draft):
    a = self.args
    gamma_auto = None
    if a["gamma"] == drafter_choice.AUTO_GAMMA:
      gamma_auto = self._choose_gamma(feed, target, draft)
      a = dict(a, gamma=gamma_auto["chosen_gamma"])
    baseline, speculative = self._decoders(target, draft, a["gamma"])
    rng = jax.random.PRNGKey(a["seed"])
    first = feed.batch(0)
    t0 = time.perf_counter()
    widths = feed.first_of_each_width()
    for b in widths:  # Compile every input width before timing.
      batch = feed.batch(b)
      jax.block_until_ready(baseline(batch, rng))
      jax.block_until_ready(speculative(batch, rng))
    compile_s = time.perf_counter() - t0
    logging.info("Compiled and warmed up both decoders for input widths %s "
                 "in %.1fs", [feed.batch_width(b) for b in widths], compile_s)

    base_tokens, spec_tokens, per_example = [], [], []
    time_base = time_spec = 0.0
    calls_base = calls_spec = 0
    histogram = np.zeros(a["gamma"] + 1, np.int64)
    beta_sum = beta_count = 0.0
    num_batches = feed.num_batches
    for i, (batch, keep) in enumerate(feed.batches()):
      brng = jax.random.fold_in(rng, i)
      out_b, dt_b = timing.timed(baseline, batch, brng)
      out_s, dt_s = timing.timed(speculative, batch, brng)
      out_b, out_s = multihost.to_host((out_b, out_s))  # every row
      time_base += dt_b
      time_spec += dt_s
      calls_base += int(np.sum(np.asarray(out_b.target_calls)[keep]))
      calls_spec += int(np.sum(np.asarray(out_s.target_calls)[keep]))
      histogram += np.asarray(out_s.accepted_histogram)[keep].sum(0)
      beta_sum += float(np.sum(np.asarray(out_s.beta_sum)[keep]))
      beta_count += float(np.sum(np.asarray(out_s.beta_count)[keep]))
      base_tokens.append(np.asarray(out_b.tokens)[keep])
      spec_tokens.append(np.asarray(out_s.tokens)[keep])
      per_example.extend(_traces(vocab, out_s, keep))
      logging.info(
          "batch %d/%d: baseline %.3fs, speculative %.3fs (running speedup "
          "%.2fx)", i + 1, num_batches, dt_b, dt_s,
          time_base / max(time_spec, 1e-9))

    base_tokens = np.concatenate(base_tokens)
    spec_tokens = np.concatenate(spec_tokens)
    base_text = tasks.decode_tokens(vocab, base_tokens)
    spec_text = tasks.decode_tokens(vocab, spec_tokens)
    references = [e["reference"] for e in examples]
    kind = self.task_kind()
    quality_base = metrics_lib.quality_metrics(kind, base_text, references)
    quality_spec = metrics_lib.quality_metrics(kind, spec_text, references)

    # Cost coefficient c: one draft step / one target step (Definition
    # 3.7), and the verification call's cost in target steps, all timed the
    # one way `timing` defines: same batch, the speculative loop's cache
    # size, filled to the mean output length.
    tokens_generated = int(np.sum(spec_tokens != 0))
    # The speculative loop's cache: max_decode_length + γ + 1 slots.
    cache_len = a["task_feature_lengths"]["targets"] + a["gamma"] + 1
    fill = min(max(1, int(tokens_generated / len(examples))),
               cache_len - a["gamma"] - 1)
    step = functools.partial(
        timing.decode_call_seconds,
        encoder_input_tokens=np.asarray(multihost.to_host(first)), fill=fill,
        cache_len=cache_len)
    t_target = step(target, k=1)
    t_draft = (step(draft, k=1) if self.drafting.drafter == "model" else
               self._draft_seconds(target, draft, first, a["gamma"], fill))
    t_verify = step(target, k=a["gamma"] + 1)
    # The user waits for the slowest process.
    (time_base, time_spec, compile_s, t_target, t_draft,
     t_verify) = multihost.slowest(time_base, time_spec, compile_s, t_target,
                                   t_draft, t_verify)
    c = t_draft / t_target
    # Kept guesses / acceptance trials (beta_count counts the trials whose
    # context reached the output, so guesses cut by EOS are not counted).
    alpha = float(np.arange(a["gamma"] + 1) @ histogram) / max(beta_count,
                                                               1.0)
    alpha_beta = beta_sum / max(beta_count, 1.0)
    metric_key = next(iter(quality_base))
    greedy = a["temperature"] == 0
    settings = self.settings(vocab)
    metrics = {
        "task": a["task_name"] or a["mixture_or_task_name"] or "local",
        "target_model": a["target_name"],
        "draft_model": a["draft_name"],
        "gamma": a["gamma"],
        "temperature": a["temperature"],
        "top_k": a["top_k"],
        "top_p": a["top_p"],
        "batch_size": a["batch_size"],
        "alpha": float(alpha),
        "alpha_beta": float(alpha_beta),
        "alpha_stderr": float(analysis.alpha_standard_error_from_counts(
            histogram, a["gamma"])),
        "accepted_histogram": histogram.tolist(),
        "num_examples": len(examples),
        "tokens_generated": tokens_generated,
        "tokens_generated_baseline": int(np.sum(base_tokens != 0)),
        "target_calls_baseline": calls_base,
        "target_calls_speculative": calls_spec,
        "tokens_per_target_call": tokens_generated / max(calls_spec, 1),
        "walltime_baseline_s": time_base,
        "walltime_speculative_s": time_spec,
        "speedup": time_base / time_spec,
        "compile_time_s": compile_s,
        "target_step_s": t_target,
        "draft_step_s": t_draft,
        "cost_coefficient_c": c,
        "theoretical_speedup": float(analysis.expected_speedup(
            min(alpha, 1.0), a["gamma"], c)),
        # The (γ+1)-token target call in target steps (Theorem 3.8 assumes
        # 1), and the theorem with that measured cost in its place.
        "verification_call_s": t_verify,
        "verification_cost_ratio": t_verify / t_target,
        "theoretical_speedup_measured_call_cost": float(
            analysis.expected_speedup(min(alpha, 1.0), a["gamma"], c,
                                      call_cost=t_verify / t_target)),
        # Token-for-token identity is the test of exactness at T = 0 only:
        # sampled outputs (T > 0) are compared by distribution (null here).
        "greedy_outputs_identical": (
            bool(np.array_equal(base_tokens, spec_tokens))
            if greedy else None),
        "greedy_identical_examples": (
            int(np.sum(np.all(base_tokens == spec_tokens, axis=1)))
            if greedy else None),
        metric_key: {"baseline": quality_base[metric_key],
                     "speculative": quality_spec[metric_key]},
        "random_weights": _random_weights(a),
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "num_devices": jax.device_count(),
        "synthetic": False,
        **self.data_info,
        "settings": settings,
    }
    metrics.update(self._drafting_metrics(a, per_example, tokens_generated,
                                          c, gamma_auto))
    # Nothing measured in the rows: same settings and seed, same file. The
    # Figure-5 timeline is modeled by `report` from `accepted_counts` and
    # the step times above.
    rows = []
    for i, e in enumerate(examples):
      rows.append({"index": i, "input": e["input"],
                   "reference": e["reference"], "baseline": base_text[i],
                   "speculative": spec_text[i], **per_example[i]})

    def write():  # metrics.json last: a sweep takes it as "done"
      io_utils.write_jsonl(os.path.join(a["output_dir"], PREDICTIONS_FILE),
                           rows)
      io_utils.write_json(os.path.join(a["output_dir"], METRICS_FILE),
                          metrics)
    multihost.run_on_first("write", write)  # the others wait for it
    logging.info("speedup %.2fx (theory %.2fx), alpha %.3f, c %.3f; wrote %s",
                 metrics["speedup"], metrics["theoretical_speedup"], alpha, c,
                 a["output_dir"])
    return metrics

  def _run_alpha(self, vocab, examples, feed, mesh, target, draft):
    """α as the mean of β over target-sampled positions (Corollary 3.6)."""
    a = self.args
    max_len = a["task_feature_lengths"]["targets"]
    rng = jax.random.PRNGKey(a["seed"])
    sample = dict(temperature=a["temperature"], top_k=a["top_k"],
                  top_p=a["top_p"])
    method = sampling.make_method(**sample)
    betas = []
    for i, (batch, keep) in enumerate(feed.batches()):
      out = decoding.temperature_sample(target, batch,
                                        jax.random.fold_in(rng, i),
                                        max_decode_length=max_len,
                                        method=method)
      beta, valid = _beta_per_position(target, draft, batch, out.tokens,
                                       out.lengths, **sample)
      beta, valid = multihost.to_host((beta, valid))  # every row
      beta, valid = np.asarray(beta)[keep], np.asarray(valid)[keep]
      betas.append(beta[valid])
    betas = np.concatenate(betas)
    mean, stderr = analysis.alpha_from_beta_samples(betas)
    result = {
        "task": a["task_name"] or a["mixture_or_task_name"] or "local",
        "target_model": a["target_name"], "draft_model": a["draft_name"],
        "temperature": a["temperature"], "top_k": a["top_k"],
        "top_p": a["top_p"], "num_examples": len(examples),
        "num_positions": int(betas.size), "alpha_beta": mean,
        "alpha_beta_stderr": stderr,
        "random_weights": _random_weights(a),
        **self.data_info,
        "settings": self.settings(vocab),
    }
    multihost.run_on_first("write", lambda: io_utils.write_json(
        os.path.join(a["output_dir"], ALPHA_FILE), result))
    logging.info("alpha = %.4f ± %.4f over %d positions", mean, stderr,
                 betas.size)
    return result


def _traces(vocab, out: decoding.SpeculativeOutput, keep: Sequence[int]
            ) -> List[dict]:
  """Accepted counts and a Figure-1-style trace of each call, for the rows
  `keep`."""
  rows = []
  calls = np.asarray(out.target_calls)
  drafts = np.asarray(out.trace_draft_tokens)
  accepted = np.asarray(out.trace_num_accepted)
  nexts = np.asarray(out.trace_next_token)
  piece = functools.partial(_token_text, vocab)
  for r in keep:
    n = int(calls[r])
    rows.append({
        "accepted_counts": accepted[r, :n].tolist(),
        "trace": [{"draft_tokens": [piece(t) for t in drafts[r, i]
                                    if t != decoding.NO_GUESS],
                   "num_accepted": int(accepted[r, i]),
                   # None: the output ended inside the accepted guesses.
                   "target_token": (None if nexts[r, i] == decoding.NO_TOKEN
                                    else piece(nexts[r, i]))}
                  for i in range(n)],
    })
  return rows


_SPECIAL_PIECES = {vocab_lib.PAD_ID: "<pad>", vocab_lib.EOS_ID: "</s>",
                   vocab_lib.UNK_ID: "<unk>"}


def _token_text(vocab, token) -> str:
  """One token as text, keeping SentencePiece's word-initial space
  (`vocab.decode([t])` drops it, which glues a rendered trace together).

  A token that decodes to nothing on its own (T5's special ids, a byte of a
  multi-byte character in the byte vocabulary) is written as SentencePiece
  writes such pieces (`</s>`, `<0xC3>`), never as an empty string.
  """
  token = int(token)
  tokenizer = getattr(vocab, "tokenizer", None)
  if tokenizer is not None and 0 <= token < tokenizer.get_piece_size():
    return tokenizer.id_to_piece(token).replace("\u2581", " ")
  if token in _SPECIAL_PIECES:
    return _SPECIAL_PIECES[token]
  if tokenizer is None and type(vocab).__name__ == "ByteVocabulary":
    byte = token - len(_SPECIAL_PIECES)  # seqio: 3 special ids, then bytes
    if 0 <= byte < 256:
      return chr(byte) if 0x20 <= byte < 0x7f else f"<0x{byte:02X}>"
  text = vocab.decode([token]) if token >= 0 else ""
  return text if text else f"<id {token}>"


def _random_weights(args) -> bool:
  uses_draft = args.get("drafter", "model") in ("model", "hierarchical")
  return not (args["target_checkpoint_path"] and
              (args["draft_checkpoint_path"] or not uses_draft))


def _speed_words(speedup: float, theory: float) -> str:
  if speedup >= 1:
    return (f"{speedup:.2f}x faster than the target alone (theory "
            f"{theory:.2f}x)")
  return (f"{1 / speedup:.2f}x slower than the target alone ({speedup:.2f}x; "
          f"theory {theory:.2f}x)")


def _quality_words(metrics: Dict[str, Any]) -> Optional[str]:
  if "bleu" in metrics:
    q = metrics["bleu"]
    return (f"BLEU {q['baseline']:.2f} (target alone) vs "
            f"{q['speculative']:.2f} (speculative)")
  if "rouge" in metrics:
    base, spec = metrics["rouge"]["baseline"], metrics["rouge"]["speculative"]
    return "ROUGE " + ", ".join(
        f"{k} {base[k]:.2f}/{spec[k]:.2f}" for k in base) + (
            " (target alone / speculative)")
  return None


def _gamma_words(metrics: Dict[str, Any], args: Dict[str, Any]) -> str:
  if args["gamma"] == drafter_choice.AUTO_GAMMA:
    return f"auto→{metrics.get('gamma', '?')}"
  return str(args["gamma"])


def _lenience_words(metrics: Dict[str, Any], temp: float) -> str:
  l = metrics["lenience"]
  words = (f"; LENIENCE={l:g} < 1: outputs are NOT the target's "
           f"distribution (a token's probability is at most p(x)/l = "
           f"{1 / l:.2g} p(x); README, 'Lenience')")
  if temp == 0:
    words += (f"; greedy outputs identical to the target's on "
              f"{metrics.get('greedy_identical_examples', '?')}/"
              f"{metrics['num_examples']} examples (lenience keeps guesses "
              "that are not the target's argmax)")
  return words


def _drafting_lines(metrics: Dict[str, Any]) -> List[str]:
  """Adaptive γ and GAMMA='auto', in plain words."""
  lines = []
  auto = metrics.get("gamma_auto")
  if auto:
    lines.append(
        f"GAMMA='auto': γ={auto['chosen_gamma']}, Theorem 3.8's best (at "
        f"most {auto['max_gamma']}) for alpha {auto['alpha']:.2f} and c "
        f"{auto['cost_coefficient_c']:.3f} measured on the first "
        f"{auto['pilot_batches']} batches with γ={auto['pilot_gamma']}")
  bound = metrics.get("per_iteration_gamma")
  if metrics.get("adaptive_threshold") is not None and bound:
    lines.append(
        f"adaptive γ (ADAPTIVE_THRESHOLD={metrics['adaptive_threshold']:g}): "
        f"{metrics['guesses_per_target_call']:.2f} guesses per target call "
        f"(at most {metrics['gamma']}); Theorem 3.8's model of these calls: "
        f"{bound['achieved_speedup']:.2f}x, vs {bound['fixed_gamma_speedup']:.2f}x"
        f" drafting γ every call, and {bound['oracle_speedup']:.2f}x for "
        "§3.5's oracle (drafting exactly what is kept)")
  return lines


def summary_lines(metrics: Dict[str, Any], args: Dict[str, Any]) -> List[str]:
  """What happened, in plain words (the last lines `run` prints)."""
  temp = args["temperature"]
  head = (f"{metrics.get('task', 'run')}: target {args['target_name'] or '?'},"
          f" draft {metrics.get('draft_model') or args['draft_name'] or '?'}, "
          + (f"γ={_gamma_words(metrics, args)}, " if args["mode"] == "walltime"
             else "")
          + f"T={temp:g}{' (greedy)' if temp == 0 else ''}, "
          f"{metrics['num_examples']} examples")
  lines = [head]
  out = args["output_dir"]
  if args["mode"] == "alpha":
    lines.append(
        f"alpha {metrics['alpha_beta']:.3f} ± "
        f"{metrics['alpha_beta_stderr']:.3f} (share of draft tokens the "
        "target would accept: Corollary 3.6's mean of Σ min(p, q) over "
        f"{metrics['num_positions']} positions of target samples)")
    files = [os.path.join(out, ALPHA_FILE)]
  else:
    sentence = (
        "speculative decoding: " + _speed_words(
            metrics["speedup"], metrics["theoretical_speedup"]) +
        f"; alpha {metrics['alpha']:.2f} (share of draft tokens accepted), "
        f"{metrics['tokens_per_target_call']:.2f} tokens per target call")
    if metrics.get("exact") is False:
      sentence += _lenience_words(metrics, temp)
    elif metrics.get("greedy_outputs_identical") is None:
      sentence += (
          f"; outputs are samples (T={temp:g}), so they are not compared "
          "token by token with the target's: speculative decoding samples "
          "the target's distribution exactly (chi-square tests in "
          "tests/test_decoding.py), and alpha from acceptance counts "
          f"({metrics['alpha']:.2f}) and from Σ min(p, q) "
          f"({metrics['alpha_beta']:.2f}) estimate the same α")
    else:
      n = metrics["num_examples"]
      same = metrics.get("greedy_identical_examples", n if metrics[
          "greedy_outputs_identical"] else "?")
      sentence += (f"; greedy outputs identical to the target's on "
                   f"{same}/{n} examples")
      if not metrics["greedy_outputs_identical"]:
        sentence += (" (NOT all: at T=0 they must be; see README, 'How it "
                     "stays exact')")
    lines.append(sentence)
    lines.extend(_drafting_lines(metrics))
    quality = _quality_words(metrics)
    if quality:
      lines.append(f"quality: {quality}")
    files = [os.path.join(out, METRICS_FILE),
             os.path.join(out, PREDICTIONS_FILE)]
  if metrics.get("random_weights"):
    lines.append(
        "random weights (TARGET_CHECKPOINT_PATH / DRAFT_CHECKPOINT_PATH not "
        "both set): alpha, speedup and quality are meaningless here; this "
        "run checks the workflow and exactness only.")
  requested = metrics.get("num_examples_requested")
  if requested and requested > metrics["num_examples"]:
    lines.append(f"note: NUM_EXAMPLES={requested}, but the data has only "
                 f"{metrics['num_examples']} examples.")
  if metrics.get("inputs_truncated"):
    lines.append(
        f"note: {metrics['inputs_truncated']} of {metrics['num_examples']} "
        "inputs were truncated to TASK_FEATURE_LENGTHS['inputs']="
        f"{metrics['inputs_length']} (longest: "
        f"{metrics['longest_input_tokens']} tokens).")
  lines.append("results: " + ", ".join(files) +
               " (README: 'What the outputs mean')")
  return lines


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {argv[1:]}")
  try:
    gin_utils.parse_from_flags(check_macros=True)
  except ValueError as e:  # gin's own message names the binding
    raise ConfigError(str(e)) from None
  try:  # several hosts: T5X's flags, or a Cloud TPU VM (`multihost`)
    multihost.initialize_from_flags()
  except ValueError as e:
    raise ConfigError(str(e)) from None
  with multihost.failures_end_every_process("run", (ConfigError,)):
    console.setup()  # after the gin check: a typo fails in a second
    args = run_arguments()  # pylint: disable=no-value-for-parameter
    metrics = Experiment(**args).run()
    if multihost.is_first():
      print("\n".join(summary_lines(metrics, args)))


def cli(argv: Optional[Sequence[str]] = None) -> int:
  """Entry point: a bad setting prints one line and exits 2, before any
  model is loaded; nothing is written."""
  gin_utils.define_gin_flags()
  multihost.define_flags()
  try:
    gin_utils.run_main(main, argv)
  except ConfigError as e:
    print(f"run: error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(cli())
