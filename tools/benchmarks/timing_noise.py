"""How steady are run's c and verification cost on a shared machine?

`run` prices Theorem 3.8 with c (draft step / target step) and the
verification cost (the target's (γ+1)-token call / target step), timed by
`specdec_jax.metrics.timing.call_seconds`. This benchmark repeats that measurement
`--trials` times two ways, alternating, in one process:

* back to back (how `run` timed them before): each kind of call on its own,
  16 calls per program, median of 5 programs, one kind after the other;
* interleaved (`timing.call_seconds` as `run` uses it now): 64 calls per
  program, 9 rounds of every kind in turn, medians of per-round ratios.

and prints each estimate's median, range and interquartile range. With
`--background_load` (default) a second process alternates busy and idle
spells of 0.05–0.8 s (fixed seed), a stand-in for the other users of a
shared machine. Random weights with the Multi30k pair's shapes (timing does
not depend on the values); compilation excluded.

  python -m tools.benchmarks.timing_noise \\
      --output=benchmarks/timing_noise_cpu.json
"""
import argparse
import os
import subprocess
import sys
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax.core.models import T5Model
from specdec_jax.metrics import timing
from tools.benchmarks import common

_DECODE_LENGTH = 64  # the cache holds this many tokens, plus γ+1.
_BURSTY = """
import random, time
random.seed(0)
while True:
  end = time.time() + random.uniform(0.05, 0.6)
  while time.time() < end:
    pass
  time.sleep(random.uniform(0.05, 0.8))
"""


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  """The command's flags, checked (a bad one: one line, exit 2)."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument(
      "--target", default="gin/models/multi30k_target.gin",
      help="target model: a size (as tools.benchmarks.decode) or a "
      "gin file")
  p.add_argument("--draft", default="gin/models/multi30k_draft_1m.gin",
                 help="draft model: a size or a gin file")
  p.add_argument("--gamma", type=int, default=3,
                 help="verification call: K = γ+1")
  p.add_argument("--trials", type=int, default=15,
                 help="repeats of each estimate")
  p.add_argument(
      "--fill", type=int, default=14,
      help="cache positions written before each call (a caption's "
      "mean length)")
  p.add_argument("--background_load", default=True,
                 action=argparse.BooleanOptionalAction,
                 help="run a bursty busy-loop process meanwhile")
  p.add_argument("--output", default=None, help="write the results as JSON")
  args = p.parse_args(argv)
  for name in ("gamma", "trials"):
    if getattr(args, name) < 1:
      p.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
  if not 0 <= args.fill <= _DECODE_LENGTH:
    p.error(f"--fill must be in [0, {_DECODE_LENGTH}], got {args.fill}.")
  try:
    args.configs = [
        common.resolve_model_config(args.target, "target")[0],
        common.resolve_model_config(args.draft, "draft")[0]
    ]
  except common.BenchmarkFlagError as e:
    p.error(str(e))
  return args


def _model(config, seed: int) -> T5Model:
  params = checkpoints.random_params(config, jax.random.PRNGKey(seed),
                                     dtype=jnp.float32)
  return T5Model(config, {"params": params}).prepared_for_decoding()


def _estimates(seconds):
  """(verification cost, c) from {'step', 'draft', 'verify': seconds}."""
  return (seconds["verify"] / seconds["step"],
          seconds["draft"] / seconds["step"])


def _summary(values):
  v = np.asarray(values)
  q1, q3 = np.percentile(v, [25, 75])
  return {
      "median": float(np.median(v)),
      "min": float(v.min()),
      "max": float(v.max()),
      "iqr": float(q3 - q1),
      "values": v.tolist()
  }


def measure(target, draft, *, gamma, fill, trials):
  """{'back_to_back', 'interleaved'} -> their estimates' summaries."""
  inputs = np.random.default_rng(0).integers(2, target.config.vocab_size,
                                             (1, 20)).astype(np.int32)
  calls = {
      "step": (target, 1),
      "draft": (draft, 1),
      "verify": (target, gamma + 1)
  }
  cache_len = _DECODE_LENGTH + gamma + 1
  kw = dict(fill=fill, cache_len=cache_len)

  def back_to_back():
    return _estimates({
        name: timing.call_seconds({name: call}, inputs, steps=16, repeats=5,
                                  **kw)[name] for name, call in calls.items()
    })

  def interleaved():
    return _estimates(timing.call_seconds(calls, inputs, **kw))

  ways = {"back_to_back": back_to_back, "interleaved": interleaved}
  found = {name: ([], [], []) for name in ways}
  for trial in range(trials):
    for name, way in ways.items():
      t0 = time.perf_counter()
      ratio, c = way()
      for out, x in zip(found[name], (ratio, c, time.perf_counter() - t0)):
        out.append(x)
      print(
          f"trial {trial + 1}/{trials} {name}: verification cost "
          f"{ratio:.2f} steps, c {c:.3f}", flush=True)
  return {
      name: {
          "verification_cost_ratio": _summary(r),
          "cost_coefficient_c": _summary(c),
          "seconds_per_estimate": float(np.median(s))
      } for name, (r, c, s) in found.items()
  }


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The command: measure, print, write --output."""
  f = parse_args(argv)
  target, draft = _model(f.configs[0], 0), _model(f.configs[1], 1)
  load = (subprocess.Popen([sys.executable, "-c", _BURSTY])
          if f.background_load else None)
  try:
    result = measure(target, draft, gamma=f.gamma, fill=f.fill, trials=f.trials)
  finally:
    if load is not None:
      load.kill()
  result.update(gamma=f.gamma, fill=f.fill, trials=f.trials,
                background_load=f.background_load, jax_version=jax.__version__,
                load_average=list(os.getloadavg()), target=f.target,
                draft=f.draft)
  for way in ("back_to_back", "interleaved"):
    for key in ("verification_cost_ratio", "cost_coefficient_c"):
      s = result[way][key]
      print(f"{way:13s} {key:24s} median {s['median']:.3f}  range "
            f"{s['min']:.3f}–{s['max']:.3f}  IQR {s['iqr']:.3f}")
  common.write_result(f.output, result)
  return 0


if __name__ == "__main__":
  sys.exit(main())
