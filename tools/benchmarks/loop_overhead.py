"""Where a decode's time goes: model calls vs the loops around them.

Theorem 3.8 prices the baseline at one target step per token and an
iteration of Algorithm 1 at γ draft steps plus one (γ+1)-token target call.
This benchmark measures how close the real loops come, on a real pair and
real sentences (by default the pair shipped in `pretrained/multi30k` and the
captions of `configs/data/captions_en_de.tsv`):

* per token (baseline) and per iteration (speculative), as marginal costs:
  each sentence is decoded to two forced lengths (EOS disabled), so fixed
  per-call costs cancel in the difference;
* fixed cost per example: the decode at the short length minus its tokens
  (or iterations) at the marginal cost: encoders, cache set-up, dispatch;
* the parts, timed by `specdec_jax.metrics.timing` in the same process: a target
  step t1, a draft step d1 (c = d1 / t1) and a verification call tv;
* an iteration split (`iteration_split_s`): the draft's `propose` as the
  loop runs it, the verification call, the bookkeeping left over in one
  iteration at a fixed length, and what the while loop adds to it;
* a split of the fixed cost (`fixed_split_s`): dispatching a program that
  takes the models (pytree flattening, launch, result to the host), each
  model's `start` (encoder, cross-attention keys/values, cache set-up), and
  the rest of each decoder's intercept; and, without extrapolating, each
  decoder run to one token (one step, or one iteration) less those parts.

Overhead ratios above 1 are loop work that is not the model (the issue-10
target: within 1.15). Medians of interleaved rounds; compilation excluded
(one untimed call of every program first).

  python -m tools.benchmarks.loop_overhead --gamma=3 \\
      --output=/tmp/specdec_jax/loop_overhead.json
"""
import argparse
import json
import sys
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.metrics import timing
from tools.benchmarks import common


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  """The command's flags, checked (a bad one: one line, exit 2)."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  common.add_pair_flags(p, target="target",
                        target_gin="models/multi30k_target.gin",
                        draft="draft_1m", sentences=6, gamma=3, rounds=9)
  p.add_argument("--lengths", default="8,40",
                 help="the two forced output lengths (short, long)")
  args = p.parse_args(argv)
  common.check_pair_flags(p, args)
  try:
    args.lengths = [int(x) for x in args.lengths.split(",")]
  except ValueError:
    args.lengths = []
  if len(args.lengths) != 2 or not 1 <= args.lengths[0] < args.lengths[1]:
    p.error("--lengths must be two integers 1 <= short < long.")
  return args


def _parts(target, draft, inputs, *, gamma, long, steps):
  """name -> program of `steps` calls: a target step (t1), a verification
  call (tv), a draft step (d1), the draft's propose of γ guesses and one
  whole iteration, at a fixed length long // 2 (no while loop); what is
  neither model call in the iteration is bookkeeping (acceptance, buffer
  and cache writes, rollbacks)."""
  rng, greedy = jax.random.PRNGKey(0), sampling.Greedy()
  cache_len = long + gamma + 1
  fill = jnp.full((1,), long // 2, jnp.int32)
  caches = {
      name: timing.start(m, inputs, max_len=cache_len)
      for name, m in (("target", target), ("draft", draft))
  }
  drafter = decoding.ModelDrafter(draft)
  prefix = jnp.zeros((1, long + gamma + 2), jnp.int32)
  state = timing.speculative_state_at(target, drafter, inputs, caches["target"],
                                      caches["draft"], prefix, gamma=gamma,
                                      max_decode_length=long, fill=long // 2)
  never = jnp.asarray(-1, jnp.int32)
  return {
      "propose": lambda: timing.
                 propose_loop(drafter, state.draft_state, state.buffer, fill,
                              rng, gamma=gamma, method=greedy, steps=steps),
      "iteration": lambda: timing.iteration_loop(
          target, drafter, decoding.ExactAcceptance(), state, fill, rng, never,
          gamma=gamma, max_decode_length=long, method=greedy, steps=steps),
      "t1": lambda: timing.call_loop(target, caches["target"], fill, k=1, steps=
                                     steps),
      "tv": lambda: timing.call_loop(target, caches["target"], fill, k=gamma +
                                     1, steps=steps),
      "d1": lambda: timing.call_loop(draft, caches["draft"], fill, k=1, steps=
                                     steps)
  }


@jax.jit
def _dispatch(target, draft, inputs, rng):
  """A program that takes what a decode takes and does nothing: its time
  is the per-call cost of handing a pair of models to a program."""
  del target, draft, rng
  return inputs[:, 0]


def _starts(target, draft, inputs, *, gamma, short):
  """name -> program: a no-op dispatch, and each model's `start` at the
  short length's cache size, as the decoders start."""
  rng = jax.random.PRNGKey(0)
  cache_len = short + gamma + 1
  greedy = sampling.Greedy()
  return {
      "base_one_token": lambda: decoding.temperature_sample(
          target, inputs, rng, max_decode_length=1, method=greedy, eos_id=-1),
      "spec_one_token": lambda: decoding.speculative_sample(
          target, draft, inputs, rng, gamma=gamma, max_decode_length=1, method=
          greedy, eos_id=-1),
      "dispatch": lambda: _dispatch(target, draft, inputs, rng),
      "target_start": lambda: timing.start(target, inputs, max_len=cache_len),
      "draft_start": lambda: timing.start(draft, inputs, max_len=cache_len),
  }


def _fixed_split(med, base_fixed, spec_fixed, t1, model_iter):
  """The fixed cost per example, part by part (first sentence's width):
  what any call pays to hand over the models, the models' starts, and the
  rest of each intercept (neither a model call nor dispatch); and each
  decoder run to one token (one step, or one iteration) less its parts."""
  return {
      "dispatch": med["dispatch"],
      "target_start": med["target_start"],
      "draft_start": med["draft_start"],
      "baseline_rest": base_fixed - med["dispatch"] - med["target_start"],
      "speculative_rest": (spec_fixed - med["dispatch"] - med["target_start"] -
                           med["draft_start"]),
      "baseline_one_token": med["base_one_token"],
      "baseline_one_token_rest":
          (med["base_one_token"] - med["dispatch"] - med["target_start"] - t1),
      "speculative_one_token": med["spec_one_token"],
      "speculative_one_token_rest":
          (med["spec_one_token"] - med["dispatch"] - med["target_start"] -
           med["draft_start"] - model_iter),
  }


def programs(target, draft, inputs, *, gamma, short, long, fixed=True):
  """({name: program}, {(sentence, length): iterations}): each sentence
  decoded by both decoders to both forced lengths (EOS off; the
  speculative ones run once here for their iteration counts), an
  iteration's parts (`_parts`), and with `fixed` the fixed cost's
  (`_starts`)."""
  rng = jax.random.PRNGKey(0)
  greedy = sampling.Greedy()
  fns, iterations = {}, {}
  for i, x in enumerate(inputs):
    for length in (short, long):
      fns[("base", i,
           length)] = (lambda x=x, n=length: decoding.temperature_sample(
               target, x, rng, max_decode_length=n, method=greedy, eos_id=-1))
      fns[("spec", i,
           length)] = (lambda x=x, n=length: decoding.speculative_sample(
               target, draft, x, rng, gamma=gamma, max_decode_length=n, method=
               greedy, eos_id=-1))
      out = jax.block_until_ready(fns[("spec", i, length)]())
      iterations[(i, length)] = int(np.asarray(out.target_calls)[0])
  fns.update(
      _parts(target, draft, jnp.asarray(inputs[0]), gamma=gamma, long=long,
             steps=_STEPS))
  if fixed:
    fns.update(
        _starts(target, draft, jnp.asarray(inputs[0]), gamma=gamma,
                short=short))
  return fns, iterations


_STEPS = 16  # Calls per timed part (`_parts`).


def breakdown(med, iterations, *, gamma, short, long, fixed=True):
  """The breakdown from `programs`' medians `med` (seconds) and
  `iterations`, averaged over the sentences; with `fixed`, the fixed
  cost's split too (its programs timed)."""
  t1, tv, d1 = (med[k] / _STEPS for k in ("t1", "tv", "d1"))
  propose, iteration = med["propose"] / _STEPS, med["iteration"] / _STEPS
  n = len(iterations) // 2
  tokens = long - short
  base_token = sum(med[("base", i, long)] - med[("base", i, short)]
                   for i in range(n)) / (n * tokens)
  spec_iters = sum(
      iterations[(i, long)] - iterations[(i, short)] for i in range(n))
  if spec_iters <= 0:
    raise ValueError(
        f"lengths {short} and {long} take the same number of speculative "
        f"iterations at gamma={gamma}: no marginal cost; use a longer "
        "--lengths range.")
  spec_iter = sum(med[("spec", i, long)] - med[("spec", i, short)]
                  for i in range(n)) / spec_iters
  base_fixed = sum(med[("base", i, short)] for i in range(n)) / n \
      - short * base_token
  spec_fixed = sum(med[("spec", i, short)] - iterations[(i, short)] * spec_iter
                   for i in range(n)) / n
  model_iter = gamma * d1 + tv
  result = {
      "gamma": gamma,
      "sentences": n,
      "lengths": [short, long],
      "target_step_s": t1,
      "draft_step_s": d1,
      "cost_coefficient_c": d1 / t1,
      "verification_call_s": tv,
      "verification_cost_ratio": tv / t1,
      "baseline_per_token_s": base_token,
      "baseline_loop_overhead": base_token / t1,
      "baseline_fixed_per_example_s": base_fixed,
      "speculative_per_iteration_s": spec_iter,
      "speculative_model_per_iteration_s": model_iter,
      "speculative_loop_overhead": spec_iter / model_iter,
      "speculative_fixed_per_example_s": spec_fixed,
      # One iteration's time, part by part (fixed length, no while loop):
      # the draft's γ guesses as the loop makes them, the verification
      # call, the rest (acceptance, buffer and cache writes, rollbacks),
      # and what the while loop adds on top (its condition, the state it
      # carries).
      "iteration_split_s": {
          "draft_propose": propose,
          "draft_model_steps": gamma * d1,
          "verification_call": tv,
          "bookkeeping": iteration - propose - tv,
          "iteration_fixed_length": iteration,
          "while_loop": spec_iter - iteration,
      },
      "tokens_per_iteration": n * tokens / spec_iters,
      "marginal_speedup": base_token * n * tokens / (spec_iters * spec_iter),
      "backend": jax.default_backend(),
  }
  if fixed:
    result["fixed_split_s"] = _fixed_split(med, base_fixed, spec_fixed, t1,
                                           model_iter)
  return result


def measure(target, draft, inputs, *, gamma, short, long, rounds):
  """The breakdown (seconds and ratios) averaged over `inputs`."""
  fns, iterations = programs(target, draft, inputs, gamma=gamma, short=short,
                             long=long)
  med, _ = common.median_seconds(fns, rounds)
  return breakdown(med, iterations, gamma=gamma, short=short, long=long)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The command: measure, print the breakdown, write --output."""
  f = parse_args(argv)
  short, long = f.lengths
  target = common.load_for_decoding(f.target, f.target_gin)
  draft = common.load_for_decoding(f.draft, f.draft_gin)
  result = measure(target, draft, common.sentences(f), gamma=f.gamma,
                   short=short, long=long, rounds=f.rounds)
  ms = lambda s: f"{1e3 * s:.3f} ms"  # pylint: disable=unnecessary-lambda-assignment
  print(f"parts: target step {ms(result['target_step_s'])}, draft step "
        f"{ms(result['draft_step_s'])} (c = "
        f"{result['cost_coefficient_c']:.3f}), verification (K = γ+1 = "
        f"{result['gamma'] + 1}) {ms(result['verification_call_s'])} = "
        f"{result['verification_cost_ratio']:.2f} steps")
  print(f"baseline: {ms(result['baseline_per_token_s'])} per token = "
        f"{result['baseline_loop_overhead']:.2f} x target step; fixed "
        f"{ms(result['baseline_fixed_per_example_s'])} per example")
  print(f"speculative: {ms(result['speculative_per_iteration_s'])} per "
        f"iteration = {result['speculative_loop_overhead']:.2f} x (γ draft "
        f"steps + verification); fixed "
        f"{ms(result['speculative_fixed_per_example_s'])} per example; "
        f"{result['tokens_per_iteration']:.2f} tokens per iteration")
  split = result["iteration_split_s"]
  print("an iteration, part by part: " +
        ", ".join(f"{k} {ms(v)}" for k, v in split.items()))
  print("the fixed cost, part by part: " +
        ", ".join(f"{k} {ms(v)}" for k, v in result["fixed_split_s"].items()))
  print(f"marginal speedup (per token, fixed costs aside): "
        f"{result['marginal_speedup']:.2f}x")
  common.write_result(f.output, result)
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
