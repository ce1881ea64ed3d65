"""The main job at other γ, as trees and with another draft (issue 56):
how many guesses a target call should check on this device, in a chain or
a tree, and from which draft.

The main job's γ = 3 (gin/pretrained_multi30k.gin) was chosen on a CPU,
where the 38M target's call grows 0.1-0.4 steps with each token. On the
H200 c was 0.115 and the 4-token call 1.09 target steps on 'xla'
(2026-11-29, -30): at α 0.9 Theorem 3.8 then grows up to γ 7, and with
the captions' ~10 tokens (a call cut short at EOS) a model of the loop puts
γ 4-5 about 7% above γ 3. Trees of k branches (`tree_decoder`) kept 11-16%
more tokens a call at T = 0 on a CPU, where their call cost 2.3-2.9 steps;
on the H200 an XXL-shaped tree call cost 1.01-1.05 steps, and a draft step
of k rows costs about one of a row. On a GPU a 1M draft's step is bound by its launches, not its
bytes, so the draft of the highest α wins: the shipped shared-encoder 1M
(`SharedEncoderModel`, α 0.70 against the distilled 1M's 0.68 on 1000
sentences) also skips a draft encoder (26 of the speculative program's 83
start kernels on 'fused', compiled for an H200). A GPU run sets them as
`--gin.GAMMA`, `--gin.ACCEPTANCE="'tree'"` and `--gin.TREE_WIDTH`,
`--gin.DRAFTER="'shared_encoder'"` with its checkpoint
(gin/multi30k_38m_shared_1m.gin).

One set of interleaved rounds, every caption at batch 1: the target alone
once, the speculative decoder at each γ of `Settings.main_job_gammas` (the
main job's among them, the reference) and the tree decoder at each (k, γ)
of `main_job_trees`, and the speculative decoder at the main job's γ with
each draft of `main_job_drafts` (folders of `pretrained/multi30k/`; one not
there is listed under `missing`), on the pair that `main_job_gamma_paths`
names (the target's path, the draft's), compiled several at once first
(`compiles.concurrently`). Per run: the speedup (median over rounds of
target alone ÷ speculative), α and tokens per call, and the greedy identity
of the last round against the target alone's tokens; per γ also the
(γ+1)-token call in target steps (priced as the main job prices its call,
`timing.call_seconds`, every K in one set of rounds) and Theorem 3.8 at the
measured α and c without and with that cost.
"""
import functools
from typing import Any, Callable, Dict, Sequence, Tuple

import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core.models import shared_encoder
from tools.device_check import common
from tools.device_check import compiles
from tools.device_check import pair_runs
from tools.device_check import stats
from tools.device_check import summary

BASELINE = "baseline"


def gamma_name(gamma: int) -> str:
  """The record's name of the speculative decoder at γ."""
  return f"gamma_{gamma}"


def tree_name(width: int, gamma: int) -> str:
  """The record's name of the tree decoder of `width` branches of γ."""
  return f"tree_{width}x{gamma}"


def draft_name(name: str) -> str:
  """The record's name of the speculative decoder with draft `name`."""
  return f"draft_{name}"


def _with_draft(target, name: str, max_len: int, path: str) -> Callable:
  """The speculative decoder at the main job's γ with the shipped draft in
  `pretrained/multi30k/<name>` (a shared-encoder draft paired with
  `target`, whose encoder it reads)."""
  draft, _ = pair_runs.load_model(pair_runs.PAIR_DIR / name, path)
  return pair_runs.speculative(
      target, shared_encoder.SharedEncoderModel.draft_for(target, draft),
      max_len)


def _tree(target, draft, max_len: int, width: int, gamma: int) -> Callable:
  return decoding.tree_decoder(target, draft, gamma=gamma, tree_width=width,
                               max_decode_length=max_len,
                               method=sampling.Greedy(),
                               eos_id=pair_runs.EOS_ID)


def by_gamma(s: common.Settings, target, draft, inputs: np.ndarray,
             deadline: common.Deadline) -> Dict[str, Any]:
  """{'paths': '<target's path>+<draft's path>', 'rounds', 'baseline_s',
  'runs': {`gamma_name`, `tree_name` or `draft_name`: record}, 'fastest':
  the name of the highest speedup among the runs identical on every caption
  (None: none), 'compile_s', 'missing': the drafts not here}; {} with no
  run to make; {'skipped': why} when it does not fit `deadline`.

  Args:
    s: the settings (`main_job_gammas`, `main_job_trees`,
      `main_job_drafts`, `main_job_gamma_paths`, rounds).
    target, draft: the pair, prepared for decoding (re-prepared here for
      `main_job_gamma_paths`).
    inputs: [N, input_length] int32 captions, decoded one a batch.
    deadline: the phase's.
  """
  gammas = sorted(set(s.main_job_gammas))
  trees = sorted(set(s.main_job_trees))
  drafts = [n for n in s.main_job_drafts if (pair_runs.PAIR_DIR / n).is_dir()]
  if not gammas and not trees and not drafts:
    return {}
  if not deadline.allows(30.0):
    return {"skipped": "time cap"}
  target_path, draft_path = s.main_job_gamma_paths
  target = target.prepared_for_decoding(target_path)
  draft = draft.prepared_for_decoding(draft_path)
  batches = pair_runs.batched(inputs, 1)
  decoders = _decoders(target, draft, s.max_decode_length, gammas, trees,
                       drafts, draft_path)
  common.log(f"pretrained: main job at γ {gammas}, as trees (k, γ) {trees} "
             f"and with drafts {drafts}, target on {target_path}, draft on "
             f"{draft_path}")
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
          "identity": pair_runs.identity(outs[BASELINE], outs[name]),
          **pair_runs.statistics(outs[name]),
      } for name in decoders if name != BASELINE
  }
  for k, g in trees:
    runs[tree_name(k, g)].update(tree_width=k, gamma=g, nodes=1 + k * g)
  for n in drafts:
    runs[draft_name(n)].update(draft=n, gamma=pair_runs.GAMMA)
  if gammas:
    _add_theorem(s, target, draft, batches, runs, gammas)
  identical = [
      n for n, r in runs.items() if summary.identical_on_every_caption(r)
  ]
  return {
      "paths": f"{target_path}+{draft_path}",
      "rounds": len(times[BASELINE]),
      "baseline_s": times[BASELINE],
      "runs": runs,
      "fastest": max(identical, key=lambda n: runs[n]["speedup"], default=None),
      "compile_s": {
          n: d.seconds for n, d in done.items()
      },
      "missing": [n for n in s.main_job_drafts if n not in drafts],
  }


def _decoders(target, draft, max_len: int, gammas: Sequence[int],
              trees: Sequence[Tuple[int, int]], drafts: Sequence[str],
              draft_path: str) -> Dict[str, Callable]:
  """{name: decoder}: the target alone, then each γ, tree and draft."""
  decoders = {BASELINE: pair_runs.baseline(target, max_len)}
  decoders.update({
      gamma_name(g): pair_runs.speculative(target, draft, max_len, g)
      for g in gammas
  })
  decoders.update({
      tree_name(k, g): _tree(target, draft, max_len, k, g) for k, g in trees
  })
  decoders.update({
      draft_name(n): _with_draft(target, n, max_len, draft_path) for n in drafts
  })
  return decoders


def _add_theorem(s: common.Settings, target, draft,
                 batches: Sequence[np.ndarray], runs: Dict[str, Dict[str, Any]],
                 gammas: Sequence[int]) -> None:
  """Adds to each γ's run γ, c, its (γ+1)-token call's cost in target steps
  and Theorem 3.8 without and with it: every call priced in one set of
  rounds."""
  tokens = max(runs[gamma_name(g)]["tokens_generated"] for g in gammas)
  seconds = pair_runs.call_seconds(s, target, draft, batches, tokens, gammas)
  for g in gammas:
    run = runs[gamma_name(g)]
    run.update(pair_runs.theorem_3_8(run["alpha"], g, seconds))
