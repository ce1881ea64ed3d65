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
from typing import Any, Dict, List, Optional, Sequence

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
from specdec_jax import partitioning
from specdec_jax import sampling
from specdec_jax import tasks
from specdec_jax import timing
from specdec_jax import vocab as vocab_lib
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
}
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
  if "://" in output_dir:
    raise bad("output_dir",
              "a local directory (results are written with local file "
              "operations; copy them to a bucket afterwards, e.g. with "
              "`gsutil -m cp -r`)")


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
INPUT_BUCKET = 16  # Encoder input widths are multiples of this.


def _batches(array: np.ndarray, batch_size: int, bucket: int = INPUT_BUCKET):
  """Yields (batch [batch_size, S'], number of real rows); pads the last.

  The width S' is the batch's longest input rounded up to `bucket` (at most
  the array's width): the encoder then runs on ~16-32 positions for a
  caption rather than on TASK_FEATURE_LENGTHS['inputs'] = 64 padded ones,
  in both decoders alike, at the price of one compilation per width
  (`_input_widths` lists them so that they are compiled before timing).
  Trailing padding does not change any output: the encoder masks it.
  """
  for start in range(0, len(array), batch_size):
    chunk = array[start:start + batch_size]
    real = len(chunk)
    if real < batch_size:  # Same shape -> no recompilation.
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - real,
                                               axis=0)])
    yield chunk[:, :_bucketed_width(chunk, bucket)], real


def _bucketed_width(chunk: np.ndarray, bucket: int) -> int:
  nonzero = np.nonzero(np.any(chunk != 0, axis=0))[0]
  longest = int(nonzero[-1]) + 1 if len(nonzero) else 1
  return min(chunk.shape[1], -(-longest // bucket) * bucket)


def _input_widths(array: np.ndarray, batch_size: int) -> List[np.ndarray]:
  """One batch of each distinct width `_batches` yields (for warm-up)."""
  firsts = {}
  for batch, _ in _batches(array, batch_size):
    firsts.setdefault(batch.shape[1], batch)
  return [firsts[w] for w in sorted(firsts)]


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
      mesh_shape=tuple(mesh_shape), overwrite=overwrite)
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
    try:
      _check_run_args(a["mode"], a["gamma"], a["temperature"], a["top_k"],
                      a["top_p"], a["batch_size"], a["num_examples"],
                      a["task_feature_lengths"], self.target_config,
                      self.draft_config)
    except ValueError as e:  # a bad setting, not a bug: no traceback
      raise ConfigError(str(e)) from None
    self._models = models
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
    record = {
        "run": {k: v for k, v in self.args.items() if k not in _NOT_SETTINGS},
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
    OVERWRITE=True; the same settings may be re-run freely.
    """
    a = self.args
    out = a["output_dir"]
    try:
      io_utils.probe_writable_dir(out)
    except ValueError as e:
      raise ConfigError(f"OUTPUT_DIR={out!r}: {e}") from None
    for name in (METRICS_FILE, ALPHA_FILE):
      path = os.path.join(out, name)
      if not os.path.exists(path):
        continue
      try:
        with open(path, encoding="utf-8") as f:
          old = json.load(f).get("settings")
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
  def models(self):
    """(mesh, target, draft), loaded once."""
    if self._models is None:
      a = self.args
      mesh = partitioning.make_mesh(*a["mesh_shape"])
      target = load_model(self.target_config, a["target_checkpoint_path"],
                          a["seed"], mesh, "target")
      draft = load_model(self.draft_config, a["draft_checkpoint_path"],
                         a["seed"] + 1, mesh, "draft")
      self._models = (mesh, target, draft)
    return self._models

  def examples(self):
    """The examples; fewer than NUM_EXAMPLES is logged and recorded."""
    a = self.args
    try:
      examples = tasks.load_examples(
          mixture_or_task_name=a["mixture_or_task_name"], split=a["split"],
          num_examples=a["num_examples"],
          source_file=_repo_relative(a["source_file"]),
          reference_file=_repo_relative(a["reference_file"]),
          input_prefix=a["input_prefix"])
    except ValueError as e:  # names the file and line, or the task
      raise ConfigError(str(e)) from None
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
    return examples

  def encode_inputs(self, vocab, examples) -> np.ndarray:
    """[N, S] input ids; inputs longer than S are truncated, counted, logged."""
    length = self.args["task_feature_lengths"]["inputs"]
    inputs, lengths = tasks.encode_batch(
        vocab, [e["input"] for e in examples], length, return_lengths=True)
    truncated = int(np.sum(lengths > length))
    self.data_info.update(inputs_length=length, inputs_truncated=truncated,
                          longest_input_tokens=int(lengths.max()))
    if truncated:
      logging.warning(
          "TASK_FEATURE_LENGTHS['inputs']=%d truncates %d of %d inputs (the "
          "longest has %d tokens with EOS); they are decoded from their "
          "first %d tokens. Raise it to decode whole inputs.", length,
          truncated, len(examples), int(lengths.max()), length - 1)
    return inputs

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
    self.prepare_output_dir(self.settings(vocab))
    examples = self.examples()
    inputs = self.encode_inputs(vocab, examples)
    logging.info("%d examples; mode=%s γ=%d T=%s", len(examples), a["mode"],
                 a["gamma"], a["temperature"])
    mesh, target, draft = self.models()
    if a["mode"] == "alpha":
      return self._run_alpha(vocab, examples, inputs, mesh, target, draft)
    return self._run_walltime(vocab, examples, inputs, mesh, target, draft)

  def _decoders(self, target, draft):
    a = self.args
    max_len = a["task_feature_lengths"]["targets"]
    method = sampling.make_method(a["temperature"], a["top_k"], a["top_p"])

    def baseline(batch, rng):
      return decoding.temperature_sample(target, batch, rng,
                                         max_decode_length=max_len,
                                         method=method)

    def speculative(batch, rng):
      return decoding.speculative_sample(target, draft, batch, rng,
                                         gamma=a["gamma"],
                                         max_decode_length=max_len,
                                         method=method)
    return baseline, speculative

  def _run_walltime(self, vocab, examples, inputs, mesh, target, draft):
    a = self.args
    baseline, speculative = self._decoders(target, draft)
    rng = jax.random.PRNGKey(a["seed"])
    data_sharding = partitioning.data_sharding(mesh, a["batch_size"])
    put = lambda x: jax.device_put(x, data_sharding)  # pylint: disable=unnecessary-lambda-assignment
    first = put(next(_batches(inputs, a["batch_size"]))[0])
    t0 = time.perf_counter()
    widths = _input_widths(inputs, a["batch_size"])
    for batch in widths:  # Compile every input width before timing.
      jax.block_until_ready(baseline(put(batch), rng))
      jax.block_until_ready(speculative(put(batch), rng))
    compile_s = time.perf_counter() - t0
    logging.info("Compiled and warmed up both decoders for input widths %s "
                 "in %.1fs", [b.shape[1] for b in widths], compile_s)

    base_tokens, spec_tokens, per_example = [], [], []
    time_base = time_spec = 0.0
    calls_base = calls_spec = 0
    histogram = np.zeros(a["gamma"] + 1, np.int64)
    beta_sum = beta_count = 0.0
    num_batches = -(-len(inputs) // a["batch_size"])
    for i, (batch, real) in enumerate(_batches(inputs, a["batch_size"])):
      batch = put(batch)
      brng = jax.random.fold_in(rng, i)
      out_b, dt_b = timing.timed(baseline, batch, brng)
      out_s, dt_s = timing.timed(speculative, batch, brng)
      time_base += dt_b
      time_spec += dt_s
      calls_base += int(np.sum(np.asarray(out_b.target_calls)[:real]))
      calls_spec += int(np.sum(np.asarray(out_s.target_calls)[:real]))
      histogram += np.asarray(out_s.accepted_histogram)[:real].sum(0)
      beta_sum += float(np.sum(np.asarray(out_s.beta_sum)[:real]))
      beta_count += float(np.sum(np.asarray(out_s.beta_count)[:real]))
      base_tokens.append(np.asarray(out_b.tokens)[:real])
      spec_tokens.append(np.asarray(out_s.tokens)[:real])
      per_example.extend(_traces(vocab, out_s, real))
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
    step = functools.partial(timing.decode_call_seconds,
                             encoder_input_tokens=np.asarray(first),
                             fill=fill, cache_len=cache_len)
    t_target = step(target, k=1)
    t_draft = step(draft, k=1)
    t_verify = step(target, k=a["gamma"] + 1)
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
    # Nothing measured in the rows: same settings and seed, same file. The
    # Figure-5 timeline is modeled by `report` from `accepted_counts` and
    # the step times above.
    rows = []
    for i, e in enumerate(examples):
      rows.append({"index": i, "input": e["input"],
                   "reference": e["reference"], "baseline": base_text[i],
                   "speculative": spec_text[i], **per_example[i]})
    io_utils.write_jsonl(os.path.join(a["output_dir"], PREDICTIONS_FILE),
                         rows)
    io_utils.write_json(os.path.join(a["output_dir"], METRICS_FILE), metrics)
    logging.info("speedup %.2fx (theory %.2fx), alpha %.3f, c %.3f; wrote %s",
                 metrics["speedup"], metrics["theoretical_speedup"], alpha, c,
                 a["output_dir"])
    return metrics

  def _run_alpha(self, vocab, examples, inputs, mesh, target, draft):
    """α as the mean of β over target-sampled positions (Corollary 3.6)."""
    a = self.args
    max_len = a["task_feature_lengths"]["targets"]
    rng = jax.random.PRNGKey(a["seed"])
    sample = dict(temperature=a["temperature"], top_k=a["top_k"],
                  top_p=a["top_p"])
    method = sampling.make_method(**sample)
    betas = []
    data_sharding = partitioning.data_sharding(mesh, a["batch_size"])
    for i, (batch, real) in enumerate(_batches(inputs, a["batch_size"])):
      batch = jax.device_put(batch, data_sharding)
      out = decoding.temperature_sample(target, batch,
                                        jax.random.fold_in(rng, i),
                                        max_decode_length=max_len,
                                        method=method)
      beta, valid = _beta_per_position(target, draft, batch, out.tokens,
                                       out.lengths, **sample)
      beta, valid = np.asarray(beta)[:real], np.asarray(valid)[:real]
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
    io_utils.write_json(os.path.join(a["output_dir"], ALPHA_FILE), result)
    logging.info("alpha = %.4f ± %.4f over %d positions", mean, stderr,
                 betas.size)
    return result


def _traces(vocab, out: decoding.SpeculativeOutput, real: int) -> List[dict]:
  """Per-row accepted counts and a Figure-1-style trace of each call."""
  rows = []
  calls = np.asarray(out.target_calls)
  drafts = np.asarray(out.trace_draft_tokens)
  accepted = np.asarray(out.trace_num_accepted)
  nexts = np.asarray(out.trace_next_token)
  piece = functools.partial(_token_text, vocab)
  for r in range(real):
    n = int(calls[r])
    rows.append({
        "accepted_counts": accepted[r, :n].tolist(),
        "trace": [{"draft_tokens": [piece(t) for t in drafts[r, i]],
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
  return not (args["target_checkpoint_path"] and
              args["draft_checkpoint_path"])


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


def summary_lines(metrics: Dict[str, Any], args: Dict[str, Any]) -> List[str]:
  """What happened, in plain words (the last lines `run` prints)."""
  temp = args["temperature"]
  head = (f"{metrics.get('task', 'run')}: target {args['target_name'] or '?'},"
          f" draft {args['draft_name'] or '?'}, "
          + (f"γ={args['gamma']}, " if args["mode"] == "walltime" else "")
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
    if metrics.get("greedy_outputs_identical") is None:
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
  console.setup()  # after the gin check: a typo fails in a second
  args = run_arguments()  # pylint: disable=no-value-for-parameter
  metrics = Experiment(**args).run()
  print("\n".join(summary_lines(metrics, args)))


def cli(argv: Optional[Sequence[str]] = None) -> int:
  """Entry point: a bad setting prints one line and exits 2, before any
  model is loaded; nothing is written."""
  gin_utils.define_gin_flags()
  try:
    gin_utils.run_main(main, argv)
  except ConfigError as e:
    print(f"run: error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(cli())
