"""A trained pair against T5X (`compare_with_t5x --pair`).

Loads the pair, vocabulary and sentences exactly as `python -m
specdec_jax.run` does for a run gin file (`experiment.plan.RunPlan`: checkpoints in
float32, models `prepared_for_decoding`, run's own decoders), hands T5X the
same target weights in its layout (`T5Model.unpacked`, its tree checked
against T5X's `init`), and decodes every sentence at batch 1, greedy, EOS =
1, with T5X's `temperature_sample`, our baseline and our speculative decoder
(each γ). All must give the same tokens for every sentence, else nothing is
timed. Timing: `timing.InterleavedTimer`, the programs' order rotated per
round; a program's round time is its time to decode every sentence (one
call per sentence, each waited for; encoder included, compilation
excluded).
"""
import dataclasses
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.config import gin_utils
from specdec_jax.multihost import partitioning
from specdec_jax.experiment import arguments
from specdec_jax.experiment import runner
from specdec_jax.experiment.plan import RunPlan
from specdec_jax.metrics import exactness
from specdec_jax.metrics import timing
from tools.benchmarks import t5x_reference
from specdec_jax.files.io_utils import GIN_DIR

# --pair aliases: the README's main job.
PAIRS = {
    "pretrained": "pretrained_multi30k.gin",
    "pretrained_11m": "pretrained_multi30k_11m.gin"
}
BASELINE = "baseline"
T5X = "t5x"
SPECULATIVE = "speculative_gamma"  # + γ


def resolve_pair(pair: str) -> str:
  """The run gin file `--pair` names: an alias of PAIRS, or a path, or a
  bare name in the current folder or the repository's gin/ folder."""
  name = os.path.expanduser(PAIRS.get(pair, pair))
  for folder in (os.getcwd(), str(GIN_DIR)):
    path = os.path.join(folder, name)  # `name` itself when absolute
    if name and os.path.isfile(path):
      return os.path.abspath(path)
  raise ValueError(
      f"--pair={pair!r}: no such run gin file (looked in {os.getcwd()} and "
      f"{GIN_DIR}). Allowed: {', '.join(sorted(PAIRS))} (= "
      f"{', '.join(PAIRS[k] for k in sorted(PAIRS))}), or a run gin file "
      "that binds TARGET_CHECKPOINT_PATH and DRAFT_CHECKPOINT_PATH.")


def parse_gammas(text: str) -> Tuple[int, ...]:
  """'3,6' -> (3, 6): distinct integers >= 1."""
  try:
    gammas = tuple(int(x) for x in text.split(","))
  except ValueError:
    gammas = ()
  if not gammas or min(gammas) < 1 or len(set(gammas)) != len(gammas):
    raise ValueError(
        f"--gammas={text!r}: expected distinct comma-separated integers >= 1 "
        "(γ, draft guesses per target call), e.g. --gammas=3,6.")
  return gammas


def pair_experiment(gin_file: str, args):
  """(the pair's checked `RunPlan`, the γs): the gin file's settings, at
  T = 0 and batch 1, with --num_examples / --max_decode_length if given.

  Nothing is loaded yet; a gin file without both checkpoints, with
  GAMMA='auto' and no --gammas, or with LENIENCE < 1 is an error here.
  """
  where = f"--pair={args.pair!r} ({gin_file})"
  try:
    gin_utils.parse_gin([gin_file], [], finalize=False)
    settings = arguments.run_arguments()
  except (ValueError, LookupError) as e:  # incl. flag_utils.ConfigError
    raise SystemExit(f"error: {where}: {e}") from None
  missing = [
      arguments.MACROS[key]
      for key in ("target_checkpoint_path", "draft_checkpoint_path")
      if not getattr(settings, key)
  ]
  if missing:
    raise SystemExit(f"error: {where} binds no {' or '.join(missing)}: a "
                     "trained pair is needed (random weights: leave out "
                     "--pair).")
  if settings.decode_mode.lenience != 1:
    raise SystemExit(f"error: {where} sets LENIENCE="
                     f"{settings.decode_mode.lenience}: "
                     "not exact, so not comparable token for token; allowed: "
                     "1.")
  gammas = args.gammas or (settings.gamma,)
  if not all(isinstance(g, int) for g in gammas):
    raise SystemExit(f"error: {where} sets GAMMA={settings.gamma!r}: "
                     "give the γs to time with --gammas (e.g. --gammas=3,6).")
  overrides = {
      "temperature": 0.0,
      "top_k": 0,
      "top_p": 1.0,
      "batch_size": 1,
      "gamma": gammas[0]
  }
  if args.num_examples:
    overrides["num_examples"] = args.num_examples
  if args.max_decode_length:
    overrides["task_feature_lengths"] = dict(settings.task_feature_lengths,
                                             targets=args.max_decode_length)
  try:
    plan = RunPlan.build(arguments.run_arguments(overrides=overrides))
  except ValueError as e:
    raise SystemExit(f"error: {where}: {e}") from None
  return plan, gammas


def input_widths(inputs: np.ndarray, bucket: int) -> np.ndarray:
  """[N] widths: each row's tokens (EOS included) rounded up to `bucket`,
  at most S, as `multihost.Feeder` cuts a batch of one."""
  lengths = np.sum(inputs != 0, axis=1)
  return np.minimum(inputs.shape[1], -(-lengths // bucket) * bucket)


@dataclasses.dataclass
class Pair:
  """The loaded pair, its programs and its sentences (`load_pair`).

  Attributes:
    exp: the pair's `RunPlan` (loaded); gin_file: its gin file; gammas: the γs.
    num_examples: sentences; inputs: [N, S] their tokens.
    max_decode_length: generated tokens at most per sentence.
    t5x_module, t5x_params: T5X's network and the target's weights in its
      layout; param_leaves: their number (the tree is T5X's init's).
    programs: name -> (row [1, w], rng) -> output: T5X, our baseline and
      speculative decoding per γ (`SPECULATIVE` + γ).
    rows, keys: per sentence, its input cut to `widths` and its rng.
  """
  exp: Any
  gin_file: str
  gammas: Tuple[int, ...]
  num_examples: int
  inputs: np.ndarray
  max_decode_length: int
  t5x_module: Any
  t5x_params: Any
  param_leaves: int
  programs: Dict[str, Callable[[jax.Array, jax.Array], Any]]
  rows: List[jax.Array]
  keys: List[jax.Array]
  widths: np.ndarray


def load_pair(args, t5x: t5x_reference.T5X, log) -> Pair:
  """The pair `--pair` names, loaded as `run` loads it, and its programs."""
  gin_file = resolve_pair(args.pair)
  exp, gammas = pair_experiment(gin_file, args)
  a = exp.args
  examples, inputs, full_lengths = runner.encoded_examples(exp)
  runner.check_examples(a, examples)
  runner.check_truncation(a, full_lengths)
  max_len = a.max_decode_length
  t5x_module, t5x_predict = t5x_reference.make_t5x_predict(
      t5x, exp.target_config, max_decode_length=max_len, eos_id=decoding.EOS_ID)
  loaded = exp.load(exp.load_models())  # run's loader: float32, packed
  mesh, target = loaded.models.mesh, loaded.models.target
  # T5X reads the same weights in its own layout (packing is a layout).
  t5x_params = target.params["params"]
  leaves = t5x_reference.check_same_tree(t5x_module, t5x_params,
                                         inputs.shape[1], max_len)
  log(f"[pair] {len(examples)} sentences from {source_of(a)}; target "
      f"{a.target_checkpoint_path} ({exp.target_config.num_params:,} "
      f"params, tree = T5X's init, {leaves} leaves), draft "
      f"{a.draft_checkpoint_path}; max_decode_length {max_len}, γ "
      f"{list(gammas)}")
  # Run's own decoders (the plan's: what `run` times).
  programs = {
      T5X: lambda x, key: t5x_predict(t5x_params, x, key),
      BASELINE: loaded.decoding().baseline
  }
  for g in gammas:
    programs[f"{SPECULATIVE}{g}"] = loaded.decoding(gamma=g).speculative
  widths = input_widths(inputs, runner.INPUT_BUCKET)
  sharding = partitioning.data_sharding(mesh, 1)
  rng = jax.random.PRNGKey(a.seed)
  return Pair(
      exp, gin_file, gammas, len(examples), inputs, max_len, t5x_module,
      t5x_params, leaves, programs, rows=[
          jax.device_put(inputs[i:i + 1, :w], sharding)
          for i, w in enumerate(widths)
      ], keys=[jax.random.fold_in(rng, i) for i in range(len(widths))],
      widths=widths)


def source_of(a) -> str:
  return a.source_file or a.mixture_or_task_name


def compile_widths(pair: Pair, log) -> Dict[str, float]:
  """Compiles every program for every input width (the first sentence of
  each); their seconds, compilation and first run, by program."""
  firsts = first_of_each_width(pair.widths)
  compile_s = dict.fromkeys(pair.programs, 0.0)
  for i in firsts.values():
    for name, program in pair.programs.items():
      compile_s[name] += timing.timed(program, pair.rows[i], pair.keys[i])[1]
  log(f"[pair] compiled for input widths {sorted(firsts)}: " +
      ", ".join(f"{n} {s:.1f}s" for n, s in compile_s.items()))
  return compile_s


def first_of_each_width(widths: np.ndarray) -> Dict[int, int]:
  """Input width -> its first sentence, by increasing width."""
  firsts: Dict[int, int] = {}
  for i, w in enumerate(widths):
    firsts.setdefault(int(w), i)
  return dict(sorted(firsts.items()))


def decode_all(pair: Pair) -> Dict[str, List[Any]]:
  """Every program's output on every sentence (on the host)."""
  return {
      name: [
          jax.device_get(program(x, key))
          for x, key in zip(pair.rows, pair.keys)
      ] for name, program in pair.programs.items()
  }


def identity(
    outputs: Dict[str, List[Any]]) -> Tuple[Dict[str, Any], Optional[str]]:
  """Each program's greedy tokens vs our baseline's, sentence by sentence.

  Returns:
    (the results file's identity keys, the error message when some
    program's tokens differ, else None).
  """
  tokens = {
      name: np.concatenate([getattr(o, "tokens", o) for o in outs])
      for name, outs in outputs.items()
  }
  base = tokens[BASELINE]
  checked = {
      n: exactness.greedy_identity(base, t)
      for n, t in tokens.items()
      if n != BASELINE
  }
  identical = {n: c["identical"] for n, c in checked.items()}
  mismatches = {
      n: [(m["index"], m["position"]) for m in c["mismatches"]]
      for n, c in checked.items()
      if c["mismatches"]
  }
  error = None if not mismatches else (
      "error: greedy tokens differ from our baseline's: " +
      "; ".join(f"{n}: {len(m)} sentences, first (sentence, position) {m[:5]}"
                for n, m in mismatches.items()) + ". Not timed.")
  return {
      "tokens_generated": int(np.sum(base != 0)),
      "identical_to_baseline": identical,
      "all_identical": all(k == len(base) for k in identical.values()),
      "mismatches_sentence_and_first_position": {
          n: m[:20] for n, m in mismatches.items()
      },
  }, error


def speculative_statistics(
    outputs: Sequence[decoding.SpeculativeOutput]) -> Dict[str, Any]:
  """target calls, tokens, tokens per call, α̂ and the kept-guess histogram
  over all sentences: `SpeculativeOutput.statistics` of their rows."""
  rows = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *outputs)
  stats = rows.statistics()
  return {
      "target_calls": stats["target_calls"],
      "tokens_generated": stats["tokens_generated"],
      "tokens_per_target_call": stats["tokens_per_target_call"],
      "alpha": stats["alpha_hat"],
      "accepted_histogram": stats["accepted_histogram"]
  }


def time_rounds(pair: Pair, repeats: int, log,
                clock=timing.timed) -> Dict[str, Any]:
  """`repeats` interleaved rounds (`timing.InterleavedTimer`, rotated):
  seconds per round, medians, ms per token and per-round ratios. `clock`
  times one call, (fn, round) -> (its output, seconds) (tests hand in a
  fake)."""

  def program(name):

    def decode_every_sentence(_):
      for x, key in zip(pair.rows, pair.keys):
        jax.block_until_ready(pair.programs[name](x, key))

    return decode_every_sentence

  timer = timing.InterleavedTimer(repeats, log, rotate=True, clock=clock)
  round_s, _ = timer({name: program(name) for name in pair.programs})
  per_round = {f"{T5X}_over_{BASELINE}": round_s[T5X] / round_s[BASELINE]}
  for g in pair.gammas:
    spec = f"{SPECULATIVE}{g}"
    per_round[f"{T5X}_over_{spec}"] = round_s[T5X] / round_s[spec]
    per_round[f"{BASELINE}_over_{spec}"] = round_s[BASELINE] / round_s[spec]
  return {"round_s": round_s, "per_round": per_round}


def pair_record(pair: Pair, compile_s: Dict[str, float],
                checked: Dict[str, Any], logits: Tuple[float, float],
                speculative: Dict[int, Dict[str, Any]]) -> Dict[str, Any]:
  """The results file's `pair` record, before timing."""
  a, exp = pair.exp.args, pair.exp
  firsts = first_of_each_width(pair.widths)
  return {
      "gin_file": os.path.relpath(pair.gin_file),
      "target_checkpoint_path": a.target_checkpoint_path,
      "draft_checkpoint_path": a.draft_checkpoint_path,
      "target_model": a.target_name,
      "draft_model": a.draft_name,
      "target_num_params": exp.target_config.num_params,
      "draft_num_params": exp.draft_config.num_params,
      "dtype": str(np.dtype(exp.target_config.dtype)),
      "param_leaves": pair.param_leaves,
      "params_tree_matches_t5x_init": True,
      "source": source_of(a),
      "num_examples": pair.num_examples,
      "batch_size": 1,
      "temperature": 0.0,
      "eos_id": decoding.EOS_ID,
      "max_decode_length": pair.max_decode_length,
      "inputs_length": int(pair.inputs.shape[1]),
      "input_bucket": runner.INPUT_BUCKET,
      "examples_per_input_width": {
          w: int(np.sum(pair.widths == w)) for w in firsts
      },
      "gammas": list(pair.gammas),
      "programs": list(pair.programs),
      **checked,
      "teacher_forced_logits_max_abs_diff_sentence0": logits[0],
      "teacher_forced_logits_max_abs_sentence0": logits[1],
      "speculative": {
          str(g): s for g, s in speculative.items()
      },
      "compile_plus_first_run_s": compile_s,
  }


def run_pair(args, t5x: t5x_reference.T5X, log) -> Dict[str, Any]:
  """Greedy decodes of every sentence by T5X, our baseline and speculative
  decoding (each γ): identity check, then interleaved timing rounds."""
  pair = load_pair(args, t5x, log)
  compile_s = compile_widths(pair, log)
  outputs = decode_all(pair)
  checked, error = identity(outputs)
  logits = t5x_reference.teacher_forced_logits_diff(pair.exp.target_config,
                                                    pair.t5x_module,
                                                    pair.t5x_params,
                                                    pair.rows[0],
                                                    outputs[T5X][0])
  n = pair.num_examples
  log(f"[pair] identical to our baseline on {n} sentences: " +
      ", ".join(f"{name} {k}/{n}"
                for name, k in checked["identical_to_baseline"].items()) +
      f"; teacher-forced logits (sentence 0, unpacked weights) ours vs T5X "
      f"max |diff| {logits[0]:.2e} (max |logit| {logits[1]:.2e})")
  result = pair_record(pair, compile_s, checked, logits, {
      g: speculative_statistics(outputs[f"{SPECULATIVE}{g}"])
      for g in pair.gammas
  })
  if error:
    print(error, file=sys.stderr, flush=True)
    return result
  timed = time_rounds(pair, args.repeats, log)
  round_s, per_round = timed["round_s"], timed["per_round"]

  def median(x):
    return float(np.median(x))

  result.update({
      "repeats": args.repeats,
      "seconds_per_round": {
          k: v.tolist() for k, v in round_s.items()
      },
      "median_seconds_per_round": {
          k: median(v) for k, v in round_s.items()
      },
      "ms_per_token": {
          k: 1e3 * median(v) / result["tokens_generated"]
          for k, v in round_s.items()
      },
      "ratio_per_round": {
          k: v.tolist() for k, v in per_round.items()
      },
      "ratio_median": {
          k: median(v) for k, v in per_round.items()
      },
  })
  return result


def pair_table(result: Dict[str, Any]) -> List[str]:
  """The console table of a timed pair result."""
  med = result["median_seconds_per_round"]
  ratio = result["ratio_median"]
  n = result["num_examples"]
  lines = [
      f"{'program':<22}{'median s / ' + str(n) + ' sentences':>26}"
      f"{'ms/token':>10}{'T5X / it':>10}{'baseline / it':>15}"
  ]
  for name in result["programs"]:
    label = {
        T5X: "T5X temperature_sample",
        BASELINE: "ours, baseline"
    }.get(name, name.replace(SPECULATIVE, "speculative γ="))
    vs_t5x = 1.0 if name == T5X else ratio[f"{T5X}_over_{name}"]
    vs_base = ("" if not name.startswith(SPECULATIVE) else
               f"{ratio[f'{BASELINE}_over_{name}']:.2f}x")
    lines.append(f"{label:<22}{med[name]:>26.3f}"
                 f"{result['ms_per_token'][name]:>10.3f}{vs_t5x:>9.2f}x"
                 f"{vs_base:>15}")
  ident = ", ".join(
      f"{k} {v}/{n}" for k, v in result["identical_to_baseline"].items())
  lines.append(f"greedy tokens identical to our baseline: {ident}; ratios: "
               f"medians over {result['repeats']} rounds of per-round "
               "ratios (> 1: faster than T5X / than our baseline)")
  return lines
