"""The main job at other γ and as trees (issue 56): how many guesses a
target call should check on this device, in a chain or a tree.

The main job's γ = 3 (gin/pretrained_multi30k.gin) was chosen on a CPU,
where the 38M target's call grows 0.1-0.4 steps with each token. On the
H200 c was 0.115 and the 4-token call 1.09 target steps on 'xla'
(2026-11-29, -30): at α 0.9 Theorem 3.8 then grows up to γ 7, and with
the captions' ~10 tokens (a call cut short at EOS) a model of the loop puts
γ 4-5 about 7% above γ 3. Trees of k branches (`tree_decoder`) kept 11-16%
more tokens a call at T = 0 on a CPU, where their call cost 2.3-2.9 steps;
on the H200 an XXL-shaped tree call cost 1.01-1.05 steps, and a draft step
of k rows costs about one of a row. A GPU run sets them as `--gin.GAMMA`,
`--gin.ACCEPTANCE="'tree'"` and `--gin.TREE_WIDTH`.

One set of interleaved rounds, every caption at batch 1: the target alone
once, the speculative decoder at each γ of `Settings.main_job_gammas` (the
main job's among them, the reference) and the tree decoder at each (k, γ)
of `main_job_trees`, on the pair that `main_job_gamma_paths` names (the
target's path, the draft's), compiled several at once first
(`compiles.concurrently`). Per run: the speedup (median over rounds of
target alone ÷ speculative), α and tokens per call, and the greedy identity
of the last round against the target alone's tokens; per γ also the
(γ+1)-token call in target steps (priced as the main job prices its call,
`timing.call_seconds`, every K in one set of rounds) and Theorem 3.8 at the
measured α and c without and with that cost.
"""
import functools
from typing import Any, Callable, Dict, Sequence

import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.metrics import analysis
from specdec_jax.metrics import exactness
from specdec_jax.metrics import timing
from tools.device_check import common
from tools.device_check import compiles
from tools.device_check import pair_runs
from tools.device_check import stats

BASELINE = "baseline"


def gamma_name(gamma: int) -> str:
  """The record's name of the speculative decoder at γ."""
  return f"gamma_{gamma}"


def tree_name(width: int, gamma: int) -> str:
  """The record's name of the tree decoder of `width` branches of γ."""
  return f"tree_{width}x{gamma}"


def _tree(target, draft, max_len: int, width: int, gamma: int) -> Callable:
  return decoding.tree_decoder(target, draft, gamma=gamma, tree_width=width,
                               max_decode_length=max_len,
                               method=sampling.Greedy(),
                               eos_id=pair_runs.EOS_ID)


def by_gamma(s: common.Settings, target, draft, inputs: np.ndarray,
             deadline: common.Deadline) -> Dict[str, Any]:
  """{'paths': '<target's path>+<draft's path>', 'rounds', 'baseline_s',
  'runs': {`gamma_name` or `tree_name`: record}, 'fastest': the name of the
  highest speedup among the runs identical on every caption (None: none),
  'compile_s'}; {} without `main_job_gammas` and `main_job_trees`;
  {'skipped': why} when it does not fit `deadline`.

  Args:
    s: the settings (`main_job_gammas`, `main_job_trees`,
      `main_job_gamma_paths`, rounds).
    target, draft: the pair, prepared for decoding (re-prepared here for
      `main_job_gamma_paths`).
    inputs: [N, input_length] int32 captions, decoded one a batch.
    deadline: the phase's.
  """
  gammas = sorted(set(s.main_job_gammas))
  trees = sorted(set(s.main_job_trees))
  if not gammas and not trees:
    return {}
  if not deadline.allows(30.0):
    return {"skipped": "time cap"}
  target_path, draft_path = s.main_job_gamma_paths
  target = target.prepared_for_decoding(target_path)
  draft = draft.prepared_for_decoding(draft_path)
  batches = pair_runs.batched(inputs, 1)
  max_len = s.max_decode_length
  decoders = {BASELINE: pair_runs.baseline(target, max_len)}
  decoders.update({
      gamma_name(g): pair_runs.speculative(target, draft, max_len, g)
      for g in gammas
  })
  decoders.update({
      tree_name(k, g): _tree(target, draft, max_len, k, g) for k, g in trees
  })
  common.log(f"pretrained: main job at γ {gammas} and trees (k, γ) {trees}, "
             f"target on {target_path}, draft on {draft_path}")
  done, _ = compiles.concurrently(
      {
          name: functools.partial(pair_runs.decode_all, decode, batches[:1])
          for name, decode in decoders.items()
      }, lambda slowest: deadline.allows(20.0 + slowest),
      count=compiles.workers())
  failed = {n: d.error for n, d in done.items() if d.error}
  if failed:
    return {
        "ok": False,
        "error": "; ".join(f"{n}: {e}" for n, e in failed.items())
    }
  if len(done) < len(decoders) or not deadline.allows(20.0):
    return {"skipped": "time cap"}
  times, outs = pair_runs.interleaved(decoders, batches, s.rounds, deadline)
  runs = {
      name: {
          "speculative_s": times[name],
          "speedup": stats.median_ratio(times[BASELINE], times[name]),
          "identity": _identity(outs[BASELINE], outs[name]),
          **pair_runs.statistics(outs[name]),
      } for name in decoders if name != BASELINE
  }
  for k, g in trees:
    runs[tree_name(k, g)].update(tree_width=k, gamma=g, nodes=1 + k * g)
  if gammas:
    _add_theorem(s, target, draft, batches, runs, gammas)
  identical = [n for n, r in runs.items() if _identical(r)]
  return {
      "paths": f"{target_path}+{draft_path}",
      "rounds": len(times[BASELINE]),
      "baseline_s": times[BASELINE],
      "runs": runs,
      "fastest": max(identical, key=lambda n: runs[n]["speedup"], default=None),
      "compile_s": {
          n: d.seconds for n, d in done.items()
      },
  }


def _identity(base: Sequence[Any], spec: Sequence[Any]) -> Dict[str, Any]:
  """Each caption's speculative tokens against the target alone's."""
  tally = exactness.GreedyIdentity()
  for a, b in zip(base, spec):
    tally.add(a.tokens, b.tokens)
  return tally.record()


def _identical(record: Dict[str, Any]) -> bool:
  """Whether a run's tokens were the target alone's on every caption."""
  return record["identity"]["identical"] == record["identity"]["examples"]


def _add_theorem(s: common.Settings, target, draft,
                 batches: Sequence[np.ndarray], runs: Dict[str, Dict[str, Any]],
                 gammas: Sequence[int]) -> None:
  """Adds to each γ's run γ, c, its (γ+1)-token call's cost in target steps
  and Theorem 3.8 without and with it: every call priced in one set of
  rounds."""
  tokens = max(runs[gamma_name(g)]["tokens_generated"] for g in gammas)
  fill, cache_len = pair_runs.priced_calls(s, tokens / len(batches),
                                           max(gammas))
  seconds = timing.call_seconds(
      {
          "target": (target, 1),
          "draft": (draft, 1),
          **{
              f"verify_{g + 1}": (target, g + 1) for g in gammas
          }
      }, batches[0], fill=fill, cache_len=cache_len, steps=4 * s.inner_steps,
      repeats=s.repeats + 2)
  c = seconds["draft"] / seconds["target"]
  for g in gammas:
    run = runs[gamma_name(g)]
    alpha = min(max(run["alpha"], 0.0), 1.0)
    call_cost = seconds[f"verify_{g + 1}"] / seconds["target"]
    run.update(
        gamma=g, c=c, verification_call_cost=call_cost,
        theorem_3_8=float(analysis.expected_speedup(alpha, g, c)),
        theorem_3_8_with_call_cost=float(
            analysis.expected_speedup(alpha, g, c, call_cost=call_cost)))
