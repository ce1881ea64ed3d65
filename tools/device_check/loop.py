"""The speculative loop's own cost per iteration (issue 56, item 4).

The main job ran at 0.6 of Theorem 3.8 on an H200 (1.30x against 2.18x at
its measured c): this phase measures where the rest goes, on the shipped
pair (`pair_runs`' 38M target, distilled 1M draft and captions;
`--small`: tiny random float32 stand-ins of the physics phase's shapes),
γ = 3, batch 1, greedy, on the check's decode path and on 'xla', in one
process:

* `split.<path>`: `loop_overhead`'s iteration split (the draft's propose,
  the verification call, the bookkeeping at a fixed length, what the while
  loop adds), from each caption decoded to two forced lengths and the
  parts timed alone; both paths' programs in one set of interleaved rounds
  (compilation excluded, medians); with `not_in_model_calls_s` (an
  iteration's seconds less γ draft steps and the verification call) and
  `marginal_over_theorem`: the marginal speedup ÷ Theorem 3.8 at the
  measured tokens per iteration, c and call cost (= the baseline's loop
  overhead ÷ the speculative loop's: what the loops alone cost);
* `kernels.<path>`: the kernels one iteration of the compiled speculative
  loop launches (`iteration_hlo.iteration_kernels`): by part, the loop's
  condition, and those of no model call.

The main job's own ratio (`pretrained.main_job`'s speedup ÷ its Theorem
3.8) is added by the parent under `loop.main_job` (`cli`), as it comes
from the `pretrained` phase.
"""
from typing import Any, Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core.decoding import loops
from specdec_jax.core.models import T5Model
from tools.benchmarks import common as bench_common
from tools.benchmarks import iteration_hlo
from tools.benchmarks import loop_overhead
from tools.device_check import common
from tools.device_check import pair_runs

GAMMA = pair_runs.GAMMA
Pairs = Dict[str, Tuple[T5Model, T5Model]]


def _pairs(s: common.Settings) -> Tuple[Pairs, List[np.ndarray]]:
  """({path: (target, draft)} on the check's path and 'xla', the inputs
  [1, S] each): the shipped pair and captions, or tiny stand-ins."""
  if s.mode == "small":
    models = []
    for seed, size in enumerate((s.target, s.drafts[0])):
      config = common.t5_size(size, dtype=jnp.float32, tiny=True)
      models.append(
          T5Model(config, common.device_params(config, seed, jnp.float32)))
    ids = np.random.default_rng(0).integers(
        2, models[0].vocab_size, (s.loop_sentences, s.physics_input_length))
    target, draft = (m.prepared_for_decoding(s.decode_path) for m in models)
  else:
    target, _ = pair_runs.load_model(pair_runs.TARGET_DIR, s.decode_path)
    draft, _ = pair_runs.load_model(pair_runs.DRAFT_DIR, s.decode_path)
    ids = pair_runs.encode_captions(s.loop_sentences, s.input_length)
  pairs = {
      path: (target.prepared_for_decoding(path),
             draft.prepared_for_decoding(path)
            ) for path in dict.fromkeys((target.decode_path, "xla"))
  }
  return pairs, [np.asarray(ids[i:i + 1], np.int32) for i in range(len(ids))]


def against_theorem(split: Dict[str, Any]) -> Dict[str, float]:
  """`loop_overhead.breakdown`'s record against Theorem 3.8 at its own
  tokens per iteration, c and call cost: tokens / (γ c + call cost)."""
  model_s = split["speculative_model_per_iteration_s"]
  iteration_s = split["speculative_per_iteration_s"]
  theorem = split["tokens_per_iteration"] / (
      split["gamma"] * split["cost_coefficient_c"] +
      split["verification_cost_ratio"])
  return {
      "theorem_3_8_at_measured": theorem,
      "marginal_over_theorem": split["marginal_speedup"] / theorem,
      "not_in_model_calls_s": iteration_s - model_s,
      "not_in_model_calls_share": (iteration_s - model_s) / iteration_s,
  }


def split(s: common.Settings, pairs: Pairs,
          inputs: List[np.ndarray]) -> Dict[str, Any]:
  """{path: the iteration split}: every path's programs in one set of
  interleaved rounds."""
  short, long = s.loop_lengths
  fns, iterations = {}, {}
  for path, (target, draft) in pairs.items():
    common.log(f"loop: compiling the split's programs on {path}")
    made, iterations[path] = loop_overhead.programs(target, draft, inputs,
                                                    gamma=GAMMA, short=short,
                                                    long=long, fixed=False)
    fns.update({(path, key): fn for key, fn in made.items()})
  common.log(f"loop: {len(fns)} programs, {s.loop_rounds} rounds")
  med, _ = bench_common.median_seconds(fns, s.loop_rounds)
  out = {}
  for path in pairs:
    result = loop_overhead.breakdown(
        {
            key: v for (p, key), v in med.items() if p == path
        }, iterations[path], gamma=GAMMA, short=short, long=long, fixed=False)
    out[path] = {**result, **against_theorem(result)}
  return out


def kernels(s: common.Settings, pairs: Pairs,
            inputs: List[np.ndarray]) -> Dict[str, Any]:
  """{path: kernels per iteration} of the speculative loop as
  `speculative_sample` compiles it (this backend's options)."""
  out = {}
  for path, (target, draft) in pairs.items():
    compiled = loops.SPECULATIVE_PROGRAM.jitted().lower(
        target, decoding.ModelDrafter(draft), jnp.asarray(inputs[0]),
        jax.random.PRNGKey(0), np.int32(-1), gamma=GAMMA,
        max_decode_length=s.loop_lengths[1], method=sampling.Greedy(),
        acceptance=decoding.ExactAcceptance(), statistics=True).compile()
    out[path] = iteration_hlo.iteration_kernels(compiled.as_text())
  return out


def run(s: common.Settings, record: common.Recorder,
        deadline: common.Deadline) -> bool:
  """The phase; True if the split and the kernels were measured."""
  pairs, inputs = _pairs(s)
  record.set(
      "settings", {
          "paths": list(pairs),
          "gamma": GAMMA,
          "batch": 1,
          "sentences": len(inputs),
          "lengths": list(s.loop_lengths),
          "rounds": s.loop_rounds,
          "stand_in_shapes": s.mode == "small",
          "backend": jax.default_backend(),
      })
  complete = True
  for name, step, need_s in (("split", split, 20.0), ("kernels", kernels, 5.0)):
    if not deadline.allows(need_s):
      common.log(f"loop: {name} skipped, {deadline.left():.0f} s left")
      record.set(name, {"skipped": "time cap"})
      complete = False
      continue
    result = common.guarded(lambda f=step: f(s, pairs, inputs))
    record.set(name, result)
    complete = complete and "error" not in result
  return complete
