"""Greedy decoding latency: ours (baseline, speculative) vs T5X's decoder.

The issue "Performance" asks that our baseline decoder
(`specdec_jax.core.decoding.temperature_sample`, one target call per token) be no
slower per token than T5X's own greedy decoder on the same model, the
baseline of the paper. T5X is not on PyPI and the project does not vendor it,
so this script imports T5X from a checkout the user supplies:

  git clone https://github.com/google-research/t5x /tmp/t5x
  python -m tools.benchmarks.compare_with_t5x --t5x_path=/tmp/t5x \\
      --model small,tiny --max_decode_length 64 --batch_size 1 \\
      --output benchmarks/t5x_baseline_cpu.json

For each model size it
  1. builds our `Transformer` and T5X's `t5x/examples/t5/network.py`
     `Transformer` from the same hyperparameters (`network.T5Config`);
  2. initializes ONE set of random float32 params with
     `specdec_jax.core.models.init_params` and checks that it has exactly the tree
     (names and shapes) that T5X's own `init` produces, then feeds the same
     `{'params': ...}` to both;
  3. runs greedy decoding of the same random inputs with
     (a) T5X, the way `t5x/models.py` `EncoderDecoderModel.
         predict_batch_with_aux` does it: `module.encode`, the flax 'cache'
         collection from a `decode=True` apply on ones-shaped inputs of
         [B, max_decode_length], a `tokens_ids_to_logits` closure calling
         `module.apply({'params', 'cache'}, ..., decode=True,
         max_decode_length=..., mutable=['cache'], method=module.decode)`,
         then `t5x.decoding.temperature_sample(temperature=0, topk=1,
         num_decodes=1)`; all of it in one `jax.jit` with the params as an
         argument (T5X's partitioned predict fn; one device here);
     (b) ours: `specdec_jax.core.decoding.temperature_sample(T5Model, ...)`;
  4. checks that both produce the same greedy tokens, and that teacher-forced
     logits of the two networks agree;
  5. times both, excluding compilation (`timing.InterleavedTimer`, rotated):
     each round runs the two programs back to back (alternating which goes
     first) and `block_until_ready`s them; the report gives medians over
     rounds of each program's time and of the per-round ratio ours / T5X
     (robust to a loaded machine).

EOS: `--eos_id -1` (default) never fires, so both decoders make exactly
max_decode_length target calls and per-token latency is
wall time / max_decode_length (the encoder pass is included in both).

Shims. T5X's `t5x/__init__.py` imports its whole training stack (seqio,
airio, orbax, tensorstore, ...), which is not needed here and not installed.
`t5x_reference.import_t5x` therefore registers an
empty `t5x` package whose `__path__` is the checkout's `t5x/` folder, so
`import t5x.decoding` and `import t5x.examples.t5.network` load those
modules (which only need jax and flax) without running `t5x/__init__.py`.
No T5X file is edited or copied. With jax 0.10.2 / flax 0.12.8 and T5X at
commit cc342d41 no API shims were needed.

Real pair (`--pair=pretrained`, or any run gin file binding
TARGET_CHECKPOINT_PATH and DRAFT_CHECKPOINT_PATH). Issue 10 asks that
speculative decoding be >= 1.5x faster than T5X's own
`decoding.temperature_sample` on the same target. This mode loads the pair,
vocabulary and sentences exactly as `python -m specdec_jax.run
--gin_file=pretrained_multi30k.gin` does (`experiment.plan.RunPlan`: the T5X
checkpoints decoded in float32, the models `prepared_for_decoding` for the
CPU kernel, run's own decoders), hands T5X the same target weights in
T5X's layout (`T5Model.unpacked`, its tree checked against T5X's `init`),
and for each sentence at batch 1, greedy, EOS = 1, decodes with
  (a) T5X's `temperature_sample` on the target (as above, real EOS);
  (b) our baseline `decoding.temperature_sample` on the target;
  (c) our speculative decoder with the draft, for each γ of `--gammas`
      (default: the gin file's GAMMA).
All must give the same tokens for every sentence (else exit 1, untimed).
Each input is cut to its length rounded up to `run.INPUT_BUCKET`, as run
does, the same width for all programs; every width is compiled first.
Timing (`timing.InterleavedTimer`, the programs' order rotated per round):
each round decodes every sentence with every program; a program's round
time is its time over all sentences, one call per sentence, each waited
for (encoder included). Reported: medians over rounds and the median
per-round ratios T5X/baseline, T5X/speculative and baseline/speculative.
The pair mode is `tools.benchmarks.t5x_pair`.

  python -m tools.benchmarks.compare_with_t5x --t5x_path=/tmp/t5x \\
      --pair=pretrained --gammas=3,6 --repeats=5 \\
      --output=benchmarks/t5x_pretrained_cpu.json

Prompt prefill: newer T5X prefills the decoder cache with the prompt when
`module.decode` accepts `prefill` (the example network's does not at the
tested commit). Decoding here starts from an empty prompt, so prefill would
be a no-op; it is not replicated and the JSON records whether the checkout
would have used it.
"""
import argparse
import dataclasses
import os
import platform
import sys
from typing import Any, Dict, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import init_params
from specdec_jax.files import io_utils
from specdec_jax.metrics import timing
from tools.benchmarks import common
from tools.benchmarks import t5x_pair
from tools.benchmarks import t5x_reference
from tools.benchmarks.t5x_pair import parse_gammas
from tools.benchmarks.t5x_pair import resolve_pair

RANDOM_DESCRIPTION = (
    "Greedy decoding latency of specdec_jax.core.decoding.temperature_sample "
    "vs T5X's decoding.temperature_sample (called as "
    "EncoderDecoderModel.predict_batch_with_aux does, in one jax.jit) "
    "on the same random params and inputs. Times include the encoder "
    "pass; ms_per_token = median decode time / max_decode_length; "
    "ratio = median over rounds of (ours / T5X) from interleaved runs.")
PAIR_DESCRIPTION = (
    "Greedy decoding of a trained pair's sentences at batch 1 (EOS "
    "stops decoding) by T5X's decoding.temperature_sample on the target "
    "(as EncoderDecoderModel.predict_batch_with_aux calls it, in one "
    "jax.jit), by our baseline and by our speculative decoder (run's "
    "loader and decoders), token-identical on all sentences. Each round "
    "decodes every sentence with every program (order rotated per round); "
    "a program's round time is its time over all sentences, one call per "
    "sentence, each waited for, encoder included, compilation excluded. "
    "Ratios: medians over rounds of per-round ratios (> 1: the "
    "denominator is faster).")


# ---------------------------------------------------------------------------
# Random weights (--model): our baseline vs T5X.
# ---------------------------------------------------------------------------
def run_model(spec: str, args, t5x: t5x_reference.T5X, log) -> Dict[str, Any]:
  """One model size with random weights: T5X's and our greedy decodes of the
  same inputs, checked against each other, then timed in rounds."""
  config, label, warnings = common.resolve_model_config(spec, "model")
  for w in warnings:
    log(f"warning: {w}")
  config = config.replace(dtype=common.DTYPES[args.dtype], dropout_rate=0.0)
  max_len = args.max_decode_length
  t5x_module, t5x_predict = t5x_reference.make_t5x_predict(
      t5x, config, max_decode_length=max_len, eos_id=args.eos_id)
  params = init_params(config, jax.random.PRNGKey(args.seed))["params"]
  num_leaves = t5x_reference.check_same_tree(t5x_module, params,
                                             args.input_length, max_len)
  target = T5Model(config=config, params={"params": params})
  rs = np.random.RandomState(args.seed)
  # Tokens 2..vocab-1: no padding (0) and no EOS (1) in the inputs.
  inputs = jnp.asarray(
      rs.randint(2, config.vocab_size,
                 size=(args.batch_size, args.input_length)), jnp.int32)
  rng = jax.random.PRNGKey(args.seed + 1)
  programs = {
      "ours": lambda _: decoding.
              temperature_sample(target, inputs, rng, max_decode_length=max_len,
                                 temperature=0.0, eos_id=args.eos_id).tokens,
      "t5x": lambda _: t5x_predict(params, inputs, rng),
  }
  compile_s, outputs = {}, {}
  for name, fn in programs.items():
    out, compile_s[name] = timing.timed(fn, -1)
    outputs[name] = np.asarray(out)
    log(f"[{label}] {name}: first call (compile + run) {compile_s[name]:.1f}s")

  # Correctness: same greedy tokens, and the same teacher-forced logits.
  agreement = t5x_reference.token_agreement(outputs["ours"], outputs["t5x"])
  logits = t5x_reference.teacher_forced_logits_diff(config, t5x_module, params,
                                                    inputs, outputs["t5x"])
  log(f"[{label}] tokens equal: {agreement['tokens_equal']} "
      f"({agreement['tokens_equal_count']}/{agreement['tokens_total']}); "
      f"teacher-forced logits max |diff| {logits[0]:.2e} (max |logit| "
      f"{logits[1]:.2e})")

  # A warm-up, then interleaved timed rounds (alternating which goes first).
  times, _ = timing.InterleavedTimer(args.repeats, log, rotate=True)(programs)
  ratios = (times["ours"] / times["t5x"]).tolist()
  record = model_record(args, config, label, num_leaves, agreement, logits,
                        compile_s, times, ratios)
  ms = record["ms_per_token"]
  log(f"[{label}] ms/token: ours {ms['ours']:.3f}, T5X {ms['t5x']:.3f}; "
      f"median per-round ratio ours/T5X "
      f"{record['ratio_ours_over_t5x_median']:.3f} (rounds: "
      f"{', '.join(f'{x:.2f}' for x in ratios)})")
  return record


def model_record(args, config, label, num_leaves, agreement, logits, compile_s,
                 times, ratios) -> Dict[str, Any]:
  """One model's entry of the results file's `runs`."""
  median = {k: float(np.median(v)) for k, v in times.items()}
  ms_per_token = {
      k: 1e3 * v / args.max_decode_length for k, v in median.items()
  }
  return {
      "model": label,
      "config": {
          k: (jnp.dtype(v).name
              if k == "dtype" else list(v) if isinstance(v, tuple) else v
             ) for k, v in dataclasses.asdict(config).items()
      },
      "num_params": config.num_params,
      "param_leaves": num_leaves,
      "params_tree_matches_t5x_init": True,
      "batch_size": args.batch_size,
      "input_length": args.input_length,
      "max_decode_length": args.max_decode_length,
      "generated_tokens_per_row": args.max_decode_length,
      "eos_id": args.eos_id,
      **agreement,
      "teacher_forced_logits_max_abs_diff": logits[0],
      "teacher_forced_logits_max_abs": logits[1],
      "compile_plus_first_run_s": compile_s,
      "repeats": args.repeats,
      "seconds_per_decode": {
          k: v.tolist() for k, v in times.items()
      },
      "median_seconds_per_decode": median,
      "ms_per_token": ms_per_token,
      "ratio_ours_over_t5x_per_round": ratios,
      "ratio_ours_over_t5x_median": float(np.median(ratios)),
      "ratio_of_medians": ms_per_token["ours"] / ms_per_token["t5x"],
  }


# ---------------------------------------------------------------------------
# Flags and the command.
# ---------------------------------------------------------------------------
# Flags of the random-weights mode, and their defaults there.
_RANDOM_DEFAULTS = {
    "model": "small",
    "dtype": "float32",
    "input_length": 64,
    "batch_size": 1,
    "eos_id": -1,
    "seed": 0
}


def parse_args(argv: Optional[Sequence[str]] = None):
  """Flags, checked before T5X is imported or anything is loaded or
  compiled."""
  p = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--t5x_path", default=None,
                 help="root of a google-research/t5x checkout (required)")
  p.add_argument(
      "--t5x_commit", default=None,
      help="T5X commit to record when --t5x_path is not a git "
      "work tree (default: `git rev-parse HEAD` there)")
  p.add_argument(
      "--pair", default=None, help="time a trained pair: 'pretrained' (= "
      "pretrained_multi30k.gin) or a run gin file binding "
      "TARGET_CHECKPOINT_PATH and DRAFT_CHECKPOINT_PATH; "
      "default: random weights (--model)")
  p.add_argument(
      "--gammas", default=None,
      help="with --pair: comma-separated γs for speculative "
      "decoding (default: the gin file's GAMMA)")
  p.add_argument(
      "--num_examples", type=int, default=None,
      help="with --pair: sentences to decode (default: the gin "
      "file's NUM_EXAMPLES)")
  p.add_argument(
      "--model", default=None,
      help="random weights: comma-separated sizes (tiny, mini, "
      "xsmall, small, base, ...) or gin files binding "
      "T5Config (default small)")
  p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                 help="random weights (default float32)")
  p.add_argument(
      "--max_decode_length", type=int, default=None,
      help="generated tokens per row (default 64; with --pair, "
      "the gin file's TASK_FEATURE_LENGTHS['targets'])")
  p.add_argument("--input_length", type=int, default=None,
                 help="random weights (default 64)")
  p.add_argument("--batch_size", type=int, default=None,
                 help="random weights (default 1)")
  p.add_argument("--repeats", type=int, default=7,
                 help="timed rounds (interleaved)")
  p.add_argument(
      "--eos_id", type=int, default=None,
      help="random weights: -1 (default) never fires, every row "
      "decodes max_decode_length tokens (--pair: EOS = 1)")
  p.add_argument("--seed", type=int, default=None,
                 help="random weights (default 0)")
  p.add_argument("--output", default=None, help="JSON results file")
  return _checked(p, p.parse_args(argv))


def _checked(p: argparse.ArgumentParser, args: argparse.Namespace):
  """`args` with the random-weights defaults; `p.error` on a bad mix."""
  for name in ("max_decode_length", "input_length", "batch_size", "repeats",
               "num_examples"):
    value = getattr(args, name)
    if value is not None and value < 1:
      p.error(f"--{name}={value}: must be >= 1")
  if args.pair is None:
    for name in ("gammas", "num_examples"):
      if getattr(args, name) is not None:
        p.error(f"--{name}={getattr(args, name)}: only used with --pair "
                "(a trained pair)")
    for name, default in _RANDOM_DEFAULTS.items():
      if getattr(args, name) is None:
        setattr(args, name, default)
    if args.max_decode_length is None:
      args.max_decode_length = 64
    return args
  given = [
      f"--{n}={getattr(args, n)}" for n in _RANDOM_DEFAULTS
      if getattr(args, n) is not None
  ]
  if given:
    p.error(f"{', '.join(given)}: only used with random weights, not with "
            f"--pair={args.pair} (its gin file sets the models, inputs and "
            "EOS)")
  try:
    resolve_pair(args.pair)
    if args.gammas is not None:
      args.gammas = parse_gammas(args.gammas)
  except ValueError as e:
    p.error(str(e))
  return args


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parse_args(argv)
  root = t5x_reference.check_t5x_path(args.t5x_path)
  if args.output:
    try:  # fail now, not after the timing
      io_utils.probe_writable_dir(os.path.dirname(os.path.abspath(args.output)))
    except ValueError as e:
      raise SystemExit(f"error: --output={args.output!r}: {e}") from None
  t5x = t5x_reference.import_t5x(root)

  def log(msg):
    print(msg, flush=True)

  commit = t5x.commit(args.t5x_commit)
  log(f"T5X from {root} (commit {commit}); jax {jax.__version__}, flax "
      f"{flax.__version__}, backend {jax.default_backend()}")
  load_before = os.getloadavg()[0]
  if args.pair:
    pair = t5x_pair.run_pair(args, t5x, log)
    outcome = {"pair": pair}
    ok, description = pair["all_identical"], PAIR_DESCRIPTION
  else:
    runs = [
        run_model(spec.strip(), args, t5x, log)
        for spec in args.model.split(",")
        if spec.strip()
    ]
    outcome = {"dtype": args.dtype, "runs": runs}
    ok, description = all(r["tokens_equal"] for r in runs), RANDOM_DESCRIPTION
  device = jax.devices()[0]
  result = {
      "description": description,
      "t5x_commit": commit,
      "t5x_version": t5x.version(),
      "t5x_shims": list(t5x.shims),
      "t5x_would_prefill_prompt": t5x.would_prefill(),
      "command":
          " ".join(["python", "-m", "tools.benchmarks.compare_with_t5x"] +
                   list(sys.argv[1:] if argv is None else argv)),
      "backend": jax.default_backend(),
      "device_kind": str(getattr(device, "device_kind", "")),
      "jax_version": jax.__version__,
      "flax_version": flax.__version__,
      "python_version": platform.python_version(),
      "cpu_count": os.cpu_count(),
      "host_load_average_1min": [load_before, os.getloadavg()[0]],
      **outcome,
  }
  if args.pair and ok:
    log("\n".join(t5x_pair.pair_table(outcome["pair"])))
  if args.output:
    io_utils.write_json(args.output, result)
    log(f"wrote {args.output}")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
