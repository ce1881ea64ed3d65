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

With `mode='alpha'` it only measures α as in Corollary 3.6: sample from the
target, then average β = Σ_x min(p(x), q(x)) over the positions of those
samples (`alpha.json`); no walltimes, so it is cheap to run for many
(task, draft, temperature) settings.
"""
import functools
import json
import os
import statistics
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
from specdec_jax import decoding
from specdec_jax import gin_utils
from specdec_jax import io_utils
from specdec_jax import metrics as metrics_lib
from specdec_jax import partitioning
from specdec_jax import sampling
from specdec_jax import tasks
from specdec_jax import vocab as vocab_lib
from specdec_jax.models import T5Config
from specdec_jax.models import T5Model
from specdec_jax.models import init_params
from specdec_jax.models import param_shapes

METRICS_FILE = "metrics.json"
PREDICTIONS_FILE = "predictions.jsonl"
ALPHA_FILE = "alpha.json"
MODES = ("walltime", "alpha")


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
  """The shared vocabulary: a SentencePiece model, or bytes (no file)."""
  import seqio  # pylint: disable=g-import-not-at-top
  if byte_level:
    return seqio.ByteVocabulary()
  spm_model_path = _repo_relative(spm_model_path)
  if spm_model_path and not spm_model_path.startswith("gs://") and (
      not os.path.exists(spm_model_path)):
    raise ValueError(f"SPM_MODEL_PATH={spm_model_path!r} does not exist.")
  vocab = vocab_lib.get_vocabulary(spm_model_path, extra_ids)
  return vocab


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
  return T5Model(config, {"params": params})


def _check_run_args(mode, gamma, temperature, top_k, top_p, batch_size,
                    num_examples, feature_lengths, target_cfg, draft_cfg):
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
  decoding.check_speculative_args(
      _VocabOnly(target_cfg.vocab_size),
      decoding.T5Drafter(_VocabOnly(draft_cfg.vocab_size)), gamma=gamma,
      max_decode_length=feature_lengths.get("targets", 0),
      temperature=temperature, top_k=top_k, top_p=top_p)
  for name, value in (("BATCH_SIZE", batch_size),
                      ("NUM_EXAMPLES", num_examples)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
  if set(feature_lengths) != {"inputs", "targets"}:
    raise ValueError("TASK_FEATURE_LENGTHS must have exactly the keys "
                     f"'inputs' and 'targets', got {feature_lengths!r}.")


def _repo_relative(path: Optional[str]) -> Optional[str]:
  """A relative data path from a gin file: cwd first, then the repository."""
  if not path or os.path.isabs(path) or os.path.exists(path):
    return path
  candidate = gin_utils.GIN_DIR.parent / path
  return str(candidate) if candidate.exists() else path


class _VocabOnly:
  """Stands in for a model where only `vocab_size` is checked."""

  def __init__(self, vocab_size):
    self.vocab_size = vocab_size


# ---------------------------------------------------------------------------
# Timing helpers.
# ---------------------------------------------------------------------------
def _batches(array: np.ndarray, batch_size: int):
  """Yields (batch [batch_size, S], number of real rows); pads the last."""
  for start in range(0, len(array), batch_size):
    chunk = array[start:start + batch_size]
    real = len(chunk)
    if real < batch_size:  # Same shape -> no recompilation.
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - real,
                                               axis=0)])
    yield chunk, real


def _timed(fn, *args):
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return out, time.perf_counter() - start


@functools.partial(jax.jit, static_argnames=("steps",))
def _one_token_steps(model: T5Model, cache, steps: int):
  """`steps` one-token target/draft calls in one program (per-step cost)."""
  fill = cache.length

  def body(i, carry):
    cache, acc = carry
    logits, cache = model.decode_chunk(
        jnp.full((fill.shape[0], 1), 3, jnp.int32),
        cache.replace(length=fill + (i % 2)))
    return cache, acc + logits[:, 0, 0]

  _, acc = jax.lax.fori_loop(0, steps, body,
                             (cache, jnp.zeros(fill.shape, jnp.float32)))
  return acc


def measure_step_seconds(model: T5Model, inputs: np.ndarray, fill: int,
                         steps: int = 16, repeats: int = 5) -> float:
  """Median seconds of one single-token decoder call (compile excluded)."""
  cache = jax.jit(model.start, static_argnums=1)(inputs, fill + 2)
  cache = cache.replace(length=jnp.full((inputs.shape[0],), fill, jnp.int32))
  jax.block_until_ready(_one_token_steps(model, cache, steps))  # compile
  times = [_timed(_one_token_steps, model, cache, steps)[1]
           for _ in range(repeats)]
  return statistics.median(times) / steps


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
      mesh_shape=tuple(mesh_shape))
  unknown = set(overrides or {}) - set(args)
  if unknown:
    raise ValueError(f"Unknown run arguments {sorted(unknown)}.")
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
    _check_run_args(a["mode"], a["gamma"], a["temperature"], a["top_k"],
                    a["top_p"], a["batch_size"], a["num_examples"],
                    a["task_feature_lengths"], self.target_config,
                    self.draft_config)
    self._models = models

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
    a = self.args
    examples = tasks.load_examples(
        mixture_or_task_name=a["mixture_or_task_name"], split=a["split"],
        num_examples=a["num_examples"],
        source_file=_repo_relative(a["source_file"]),
        reference_file=_repo_relative(a["reference_file"]),
        input_prefix=a["input_prefix"])
    if not examples:
      raise ValueError("No examples to decode (check the task / files).")
    return examples

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
    vocab = vocabulary()
    examples = self.examples()
    logging.info("%d examples; mode=%s γ=%d T=%s", len(examples), a["mode"],
                 a["gamma"], a["temperature"])
    mesh, target, draft = self.models()
    inputs = tasks.encode_batch(vocab, [e["input"] for e in examples],
                                a["task_feature_lengths"]["inputs"])
    if a["mode"] == "alpha":
      return self._run_alpha(vocab, examples, inputs, mesh, target, draft)
    return self._run_walltime(vocab, examples, inputs, mesh, target, draft)

  def _decoders(self, target, draft):
    a = self.args
    max_len = a["task_feature_lengths"]["targets"]
    sample = dict(temperature=a["temperature"], top_k=a["top_k"],
                  top_p=a["top_p"])

    def baseline(batch, rng):
      return decoding.temperature_sample(target, batch, rng,
                                         max_decode_length=max_len, **sample)

    def speculative(batch, rng):
      return decoding.speculative_sample(target, draft, batch, rng,
                                         gamma=a["gamma"],
                                         max_decode_length=max_len, **sample)
    return baseline, speculative

  def _run_walltime(self, vocab, examples, inputs, mesh, target, draft):
    a = self.args
    baseline, speculative = self._decoders(target, draft)
    rng = jax.random.PRNGKey(a["seed"])
    data_sharding = partitioning.data_sharding(mesh, a["batch_size"])
    put = lambda x: jax.device_put(x, data_sharding)  # pylint: disable=unnecessary-lambda-assignment
    first = put(next(_batches(inputs, a["batch_size"]))[0])
    t0 = time.perf_counter()
    jax.block_until_ready(baseline(first, rng))
    jax.block_until_ready(speculative(first, rng))
    compile_s = time.perf_counter() - t0
    logging.info("Compiled and warmed up both decoders in %.1fs", compile_s)

    base_tokens, spec_tokens, per_example = [], [], []
    time_base = time_spec = 0.0
    calls_base = calls_spec = 0
    histogram = np.zeros(a["gamma"] + 1, np.int64)
    beta_sum = beta_count = 0.0
    num_batches = -(-len(inputs) // a["batch_size"])
    for i, (batch, real) in enumerate(_batches(inputs, a["batch_size"])):
      batch = put(batch)
      brng = jax.random.fold_in(rng, i)
      out_b, dt_b = _timed(baseline, batch, brng)
      out_s, dt_s = _timed(speculative, batch, brng)
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

    # Cost coefficient c: one draft step / one target step, same batch and
    # a cache filled to the mean output length (Definition 3.7).
    tokens_generated = int(np.sum(spec_tokens != 0))
    fill = max(1, int(tokens_generated / len(examples)))
    t_target = measure_step_seconds(target, np.asarray(first), fill)
    t_draft = measure_step_seconds(draft, np.asarray(first), fill)
    c = t_draft / t_target
    alpha = analysis.alpha_from_acceptance_counts(histogram, a["gamma"])
    alpha_beta = beta_sum / max(beta_count, 1.0)
    metric_key = next(iter(quality_base))
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
        "greedy_outputs_identical": bool(np.array_equal(base_tokens,
                                                        spec_tokens)),
        metric_key: {"baseline": quality_base[metric_key],
                     "speculative": quality_spec[metric_key]},
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "num_devices": jax.device_count(),
        "synthetic": False,
    }
    rows = []
    for i, e in enumerate(examples):
      rows.append({"index": i, "input": e["input"],
                   "reference": e["reference"], "baseline": base_text[i],
                   "speculative": spec_text[i], **per_example[i],
                   "timeline": _timeline(per_example[i]["accepted_counts"],
                                         a["gamma"], t_draft, t_target)})
    io_utils.write_jsonl(os.path.join(a["output_dir"], PREDICTIONS_FILE),
                         rows)
    io_utils.write_json(os.path.join(a["output_dir"], METRICS_FILE), metrics)
    logging.info("speedup %.2fx (theory %.2fx), alpha %.3f, c %.3f; wrote %s",
                 metrics["speedup"], metrics["theoretical_speedup"], alpha, c,
                 a["output_dir"])
    return metrics

  def _run_alpha(self, vocab, examples, inputs, mesh, target, draft):
    """α as the mean of β over target-sampled positions (Corollary 3.6)."""
    del vocab
    a = self.args
    max_len = a["task_feature_lengths"]["targets"]
    rng = jax.random.PRNGKey(a["seed"])
    sample = dict(temperature=a["temperature"], top_k=a["top_k"],
                  top_p=a["top_p"])
    betas = []
    data_sharding = partitioning.data_sharding(mesh, a["batch_size"])
    for i, (batch, real) in enumerate(_batches(inputs, a["batch_size"])):
      batch = jax.device_put(batch, data_sharding)
      out = decoding.temperature_sample(target, batch,
                                        jax.random.fold_in(rng, i),
                                        max_decode_length=max_len, **sample)
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
                   "target_token": piece(nexts[r, i])} for i in range(n)],
    })
  return rows


def _token_text(vocab, token) -> str:
  """One token as text, keeping SentencePiece's word-initial space
  (`vocab.decode([t])` drops it, which glues a rendered trace together)."""
  token = int(token)
  tokenizer = getattr(vocab, "tokenizer", None)
  if tokenizer is not None and 0 <= token < tokenizer.get_piece_size():
    return tokenizer.id_to_piece(token).replace("\u2581", " ")
  return vocab.decode([token])


def _timeline(accepted_counts, gamma, t_draft, t_target) -> List[dict]:
  """A Figure-5-style call timeline, modeled from measured step costs.

  The decode loop is one compiled program, so calls are not timed one by
  one: each iteration is drawn as γ draft steps of `t_draft` then one target
  call of `t_target` (the paper's cost model, Theorem 3.8).
  """
  events, t = [], 0.0
  for _ in accepted_counts:
    for _ in range(gamma):
      events.append({"kind": "draft", "start_s": t, "end_s": t + t_draft})
      t += t_draft
    events.append({"kind": "target", "start_s": t, "end_s": t + t_target})
    t += t_target
  return events


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"Unexpected arguments: {argv[1:]}")
  gin_utils.parse_from_flags()
  metrics = run()
  print(json.dumps({k: v for k, v in metrics.items()
                    if not isinstance(v, (list, dict))}, indent=2))


if __name__ == "__main__":
  gin_utils.define_gin_flags()
  gin_utils.run_main(main)
