"""The main job at other γ (issue 56): how many guesses a target call
should check on this device.

The main job's γ = 3 (gin/pretrained_multi30k.gin) was chosen on a CPU,
where the 38M target's call grows 0.1-0.4 steps with each token. On the
H200 c was 0.115 and the 4-token call 1.09 target steps on 'xla'
(2026-11-29, -30): at α 0.9 Theorem 3.8 then grows up to γ 7, and with
the captions' ~10 tokens (a call cut short at EOS) a model of the loop puts
γ 4-5 about 7% above γ 3. A GPU run sets it as `--gin.GAMMA=<γ>`.

One set of interleaved rounds, every caption at batch 1: the target alone
once, the speculative decoder at each γ of `Settings.main_job_gammas`
(the main job's among them, the reference), on the pair that
`Settings.main_job_gamma_paths` names (the target's path, the draft's),
compiled several at once first (`compiles.concurrently`). Per γ: the
speedup (median over rounds of target alone ÷ speculative), α and tokens
per call, the (γ+1)-token call in target steps (priced as the main job
prices its call, `timing.call_seconds`, every K in one set of rounds),
Theorem 3.8 at the measured α and c without and with that cost, and the
greedy identity of the last round against the target alone's tokens.
"""
import functools
from typing import Any, Dict, Sequence

import numpy as np

from specdec_jax.metrics import analysis
from specdec_jax.metrics import exactness
from specdec_jax.metrics import timing
from tools.device_check import common
from tools.device_check import compiles
from tools.device_check import pair_runs
from tools.device_check import stats

BASELINE = "baseline"


def _name(gamma: int) -> str:
  return f"gamma_{gamma}"


def by_gamma(s: common.Settings, target, draft, inputs: np.ndarray,
             deadline: common.Deadline) -> Dict[str, Any]:
  """{'paths': '<target's path>+<draft's path>', 'gammas': {γ: record},
  'fastest': the γ of the highest speedup among those identical on every
  caption (None: none)}; {} without `main_job_gammas`; {'skipped': why}
  when it does not fit `deadline`.

  Args:
    s: the settings (`main_job_gammas`, `main_job_gamma_paths`, rounds).
    target, draft: the pair, prepared for decoding (re-prepared here for
      `main_job_gamma_paths`).
    inputs: [N, input_length] int32 captions, decoded one a batch.
    deadline: the phase's.
  """
  gammas = sorted(set(s.main_job_gammas))
  if not gammas:
    return {}
  if not deadline.allows(30.0):
    return {"skipped": "time cap"}
  target_path, draft_path = s.main_job_gamma_paths
  target = target.prepared_for_decoding(target_path)
  draft = draft.prepared_for_decoding(draft_path)
  batches = pair_runs.batched(inputs, 1)
  decoders = {BASELINE: pair_runs.baseline(target, s.max_decode_length)}
  decoders.update({
      _name(g): pair_runs.speculative(target, draft, s.max_decode_length, g)
      for g in gammas
  })
  common.log(f"pretrained: main job at γ {', '.join(map(str, gammas))}, "
             f"target on {target_path}, draft on {draft_path}")
  done, _ = compiles.concurrently(
      {
          name: functools.partial(pair_runs.decode_all, decode, batches[:1])
          for name, decode in decoders.items()
      }, lambda slowest: deadline.allows(20.0 + slowest),
      count=compiles.workers())
  failed = {n: d.error for n, d in done.items() if d.error}
  if len(done) < len(decoders) or failed or not deadline.allows(20.0):
    return {
        "skipped": "time cap"
    } if not failed else {
        "ok": False,
        "error": "; ".join(f"{n}: {e}" for n, e in failed.items())
    }
  times, outs = pair_runs.interleaved(decoders, batches, s.rounds, deadline)
  records = _records(s, target, draft, batches, times, outs, gammas)
  identical = [g for g in gammas if _identical(records[str(g)])]
  return {
      "paths": f"{target_path}+{draft_path}",
      "rounds": len(times[BASELINE]),
      "baseline_s": times[BASELINE],
      "gammas": records,
      "fastest": max(identical, key=lambda g: records[str(g)]["speedup"],
                     default=None),
      "compile_s": {
          n: d.seconds for n, d in done.items()
      },
  }


def _identical(record: Dict[str, Any]) -> bool:
  """Whether a γ's speculative tokens were the target alone's on every
  caption."""
  return record["identity"]["identical"] == record["identity"]["examples"]


def _records(s: common.Settings, target, draft, batches: Sequence[np.ndarray],
             times: Dict[str, Any], outs: Dict[str, Any],
             gammas: Sequence[int]) -> Dict[str, Dict[str, Any]]:
  """{str(γ): its speculative seconds, speedup, identity, statistics, call
  cost and Theorem 3.8}."""
  measured = {g: pair_runs.statistics(outs[_name(g)]) for g in gammas}
  tokens = max(m["tokens_generated"] for m in measured.values())
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
  out = {}
  for g in gammas:
    tally = exactness.GreedyIdentity()
    for a, b in zip(outs[BASELINE], outs[_name(g)]):
      tally.add(a.tokens, b.tokens)
    alpha = min(max(measured[g]["alpha"], 0.0), 1.0)
    call_cost = seconds[f"verify_{g + 1}"] / seconds["target"]
    out[str(g)] = {
        "speculative_s": times[_name(g)],
        "speedup": stats.median_ratio(times[BASELINE], times[_name(g)]),
        "identity": tally.record(),
        **measured[g],
        "c": c,
        "verification_call_cost": call_cost,
        "theorem_3_8": float(analysis.expected_speedup(alpha, g, c)),
        "theorem_3_8_with_call_cost": float(
            analysis.expected_speedup(alpha, g, c, call_cost=call_cost)),
    }
  return out
