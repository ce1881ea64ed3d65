"""What a decode call costs the host before the device works: the models
handed over as pytrees, or bound once (`LoopProgram.bound`).

A decoder (`decoding.baseline_decoder`, `speculative_decoder`) calls its
jitted loop once per batch. Until 2026-11-30 each call handed JAX the
models as pytrees (their nodes flattened by Python callbacks at every call)
and the batch through `jnp.asarray`; now the decoder flattens its models and
settings once and hands over one list of arrays and the host batch. At
batch 1 on a GPU the device waits while the host does this, once per
caption (the main job's "rest": ~0.85 ms a caption on an H200,
docs/results/2026-11-30-issue56-h200-profile.md).

Per loop (baseline, speculative: the shipped pair, γ 3, greedy, inputs
padded to 64 as the main job's) and per way of calling it, interleaved
rounds of every sentence decoded one call at a time: the median time until
the call returns (`handover`: the host's part; on a GPU the loop's while
returns only at its end, so there this is the whole call) and until its
outputs are ready (`call`); and a program that takes what the speculative
loop takes and does nothing, both ways (`nothing`, by `handover`: the
host's part alone, which the device check measures too). Compilation excluded (one untimed
call each).

  python -m tools.benchmarks.dispatch --output=/tmp/specdec_jax/dispatch.json
"""
import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core.decoding import loops
from specdec_jax.core.decoding import programs
from tools.benchmarks import common

EOS_ID = 1
MAX_DECODE_LENGTH = 48


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  """The command's flags, checked (a bad one: one line, exit 2)."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  common.add_pair_flags(p, target="target_38m",
                        target_gin="models/multi30k_target_38m.gin",
                        draft="draft_1m_distill_38m", sentences=8, gamma=3,
                        rounds=15)
  args = p.parse_args(argv)
  common.check_pair_flags(p, args)
  return args


def callers(target, draft, *, gamma: int) -> Dict[str, Dict[str, Callable]]:
  """{loop: {'pytrees', 'bound'}: decode(batch, rng)}: each loop called as
  the decoders called it before `LoopProgram.bound` (the models as
  pytrees, the batch through `jnp.asarray`), and the decoder."""
  greedy, eos = sampling.Greedy(), np.int32(EOS_ID)
  drafter, rule = decoding.ModelDrafter(draft), decoding.ExactAcceptance()
  base = loops.BASELINE_PROGRAM.jitted(target=target)
  spec = loops.SPECULATIVE_PROGRAM.jitted(target=target)
  return {
      "baseline": {
          "pytrees": lambda x, rng: base(target, jnp.asarray(
              x, jnp.int32), rng, eos, max_decode_length=MAX_DECODE_LENGTH,
                                         method=greedy),
          "bound": decoding.baseline_decoder(
              target, max_decode_length=MAX_DECODE_LENGTH, method=greedy,
              eos_id=EOS_ID),
      },
      "speculative": {
          "pytrees": lambda x, rng:
                     spec(target, drafter, jnp.asarray(x, jnp.int32), rng, eos,
                          gamma=gamma, max_decode_length=MAX_DECODE_LENGTH,
                          method=greedy, acceptance=rule, statistics=True),
          "bound": decoding.speculative_decoder(
              target, drafter, gamma=gamma, max_decode_length=MAX_DECODE_LENGTH,
              method=greedy, eos_id=EOS_ID),
      },
  }


def _nothing(target, drafter, encoder_input_tokens, rng, eos_id, **settings):
  """What the speculative loop takes, nothing done: the batch's first
  column (one tiny kernel)."""
  del target, drafter, rng, eos_id, settings
  return encoder_input_tokens[:, 0]


# The speculative loop's arguments and static settings, no loop.
NOTHING = programs.LoopProgram(_nothing,
                               ("gamma", "max_decode_length", "statistics"))


def handover(target, draft, batch: np.ndarray, *, gamma: int = 3,
             calls: int = 200) -> Dict[str, Any]:
  """The host's part of a decode call alone: µs per call of `NOTHING`
  handed the pair as pytrees through `jnp.asarray` (as decoders called
  their loops before `LoopProgram.bound`) and bound, interleaved in
  blocks of 10 calls (`common.median_seconds`), medians; no decode's
  device work (the device check's pretrained phase: no program of its
  own to compile)."""
  greedy, eos = sampling.Greedy(), np.int32(EOS_ID)
  drafter, rule = decoding.ModelDrafter(draft), decoding.ExactAcceptance()
  settings = dict(gamma=gamma, max_decode_length=MAX_DECODE_LENGTH,
                  statistics=True)
  jitted = NOTHING.jitted(target=target)
  bound = NOTHING.bound(target, drafter, eos_id=eos, method=greedy,
                        acceptance=rule, **settings)
  rng = jax.random.PRNGKey(0)
  ways = {
      "pytrees": lambda: jitted(target, drafter, jnp.asarray(
          batch, jnp.int32), rng, eos, method=greedy, acceptance=rule, **
                                settings),
      "bound": lambda: bound(programs.token_batch(batch), rng),
  }

  def ten_calls(fn: Callable[[], Any]) -> Callable[[], None]:

    def run() -> None:
      for _ in range(10):
        jax.block_until_ready(fn())

    return run

  blocks = max(1, calls // 10)
  med, _ = common.median_seconds({
      way: ten_calls(fn) for way, fn in ways.items()
  }, blocks)
  us = {way: 1e6 * seconds / 10 for way, seconds in med.items()}  # a call
  return {
      "pytrees_us": us["pytrees"],
      "bound_us": us["bound"],
      "saved_us": us["pytrees"] - us["bound"],
      "calls": 10 * blocks,
  }


def _timed(decode: Callable, batch: np.ndarray, rng: jax.Array) -> List[float]:
  """[seconds until the call returned, until its outputs were ready]."""
  start = time.perf_counter()
  out = decode(batch, rng)
  returned = time.perf_counter()
  jax.block_until_ready(out)
  return [returned - start, time.perf_counter() - start]


def measure(fns: Dict[str, Dict[str, Callable]], batches: List[np.ndarray],
            rounds: int) -> Dict[str, Any]:
  """Per loop and way: median handover and call seconds over every
  (round, sentence), the ways' order rotated each round; and the pytrees'
  median over the bound's."""
  rng = jax.random.PRNGKey(0)
  samples: Dict[str, Dict[str, List[List[float]]]] = {
      loop: {
          way: [] for way in ways
      } for loop, ways in fns.items()
  }
  for ways in fns.values():
    for decode in ways.values():  # Compiles (one input shape).
      jax.block_until_ready(decode(batches[0], rng))
  for r in range(rounds):
    for loop, ways in fns.items():
      names = list(ways)
      for way in names[r % len(names):] + names[:r % len(names)]:
        for batch in batches:
          samples[loop][way].append(_timed(ways[way], batch, rng))
  out: Dict[str, Any] = {}
  for loop, ways in samples.items():
    med = {
        way: {
            "handover_s": statistics.median(s[0] for s in rows),
            "call_s": statistics.median(s[1] for s in rows),
            "samples": len(rows),
        } for way, rows in ways.items()
    }
    out[loop] = {
        **med,
        "handover_saved_s":
            (med["pytrees"]["handover_s"] - med["bound"]["handover_s"]),
        "call_ratio": med["pytrees"]["call_s"] / med["bound"]["call_s"],
    }
  return out


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The command: measure, print, write --output."""
  f = parse_args(argv)
  target = common.load_for_decoding(f.target, f.target_gin)
  draft = common.load_for_decoding(f.draft, f.draft_gin)
  batches = common.sentences(f, bucket=64)
  result = {
      "backend": jax.default_backend(),
      "decode_paths": [target.decode_path, draft.decode_path],
      "leaves": len(jax.tree_util.tree_leaves((target, draft))),
      "gamma": f.gamma,
      "sentences": len(batches),
      "rounds": f.rounds,
      "host": common.host(),
      **measure(callers(target, draft, gamma=f.gamma), batches, f.rounds),
      "nothing": handover(target, draft, batches[0], gamma=f.gamma),
  }
  for loop in ("baseline", "speculative"):
    r = result[loop]
    print(f"{loop}: handover {1e6 * r['pytrees']['handover_s']:.0f} us as "
          f"pytrees, {1e6 * r['bound']['handover_s']:.0f} us bound (saved "
          f"{1e6 * r['handover_saved_s']:.0f} us); call "
          f"{1e3 * r['pytrees']['call_s']:.2f} / "
          f"{1e3 * r['bound']['call_s']:.2f} ms ({r['call_ratio']:.3f}x)")
  r = result["nothing"]
  print(f"a program that does nothing: {r['pytrees_us']:.0f} us a call as "
        f"pytrees, {r['bound_us']:.0f} us bound")
  print(f"load average {result['host']['load_average']}")
  common.write_result(f.output, result)
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
