"""What XLA runs per iteration: the decode loops' compiled ops, part by part.

Compiles the baseline and speculative loops of the shipped pair (the
README's main job: 38M target, distilled 1M draft, γ 3, T 0) on this host's
CPU, twice: with XLA's default options and with the project's CPU options
(`kernels.CPU_BASELINE_COMPILER_OPTIONS`, `CPU_SPECULATIVE_COMPILER_OPTIONS`),
and counts, in each while loop's body of the optimized HLO, the ops by kind
and by the part of the iteration they come from (the source op names JAX
records: the model calls, the draft's propose, acceptance, the emit, the
statistics), and the copies with their bytes. No timing: the op counts are
the compiler's, the same on any host with this jaxlib.

  python scripts/iteration_hlo.py --output=/tmp/specdec_jax/iteration_hlo.json
"""
import json
import os
import sys

from absl import app
from absl import flags
import jax
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from specdec_jax.benchmarking import config  # pylint: disable=g-import-not-at-top
from specdec_jax.benchmarking import hlo_ops
from specdec_jax.core import decoding
from specdec_jax.core import kernels
from specdec_jax.core import sampling
from specdec_jax.core.decoding import loops
from specdec_jax.files import io_utils

PRETRAINED = os.path.join(REPO, "pretrained", "multi30k")
_GAMMA = flags.DEFINE_integer("gamma", 3, "Draft guesses per iteration γ.")
_LENGTH = flags.DEFINE_integer("max_decode_length", 48, "Decode length.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the counts as JSON.")


def main(argv):
  del argv
  target = config.load_for_decoding(os.path.join(PRETRAINED, "target_38m"),
                                    "models/multi30k_target_38m.gin")
  draft = decoding.ModelDrafter(
      config.load_for_decoding(os.path.join(PRETRAINED, "draft_1m_distill_38m"),
                               "models/multi30k_draft_1m.gin"))
  inputs = np.ones((1, 64), np.int32)
  rng, eos, greedy = jax.random.PRNGKey(0), np.int32(1), sampling.Greedy()
  length = _LENGTH.value
  programs = {
      "baseline": (loops.temperature_loop, (target, inputs, rng, eos),
                   dict(max_decode_length=length,
                        method=greedy), kernels.CPU_BASELINE_COMPILER_OPTIONS),
      "speculative": (loops.speculative_loop, (target, draft, inputs, rng, eos),
                      dict(gamma=_GAMMA.value, max_decode_length=length,
                           method=greedy, statistics=True,
                           acceptance=decoding.ExactAcceptance()),
                      kernels.CPU_SPECULATIVE_COMPILER_OPTIONS),
  }
  result = {"jax": jax.__version__, "gamma": _GAMMA.value}
  for name, (fn, args, kwargs, options) in programs.items():
    static = [k for k in kwargs if k != "acceptance"]
    lowered = jax.jit(fn, static_argnames=static).lower(*args, **kwargs)
    for label, opts in (("xla_defaults", {}), ("project_options", options)):
      bodies = hlo_ops.loop_bodies(
          lowered.compile(compiler_options=opts).as_text())
      result[f"{name}/{label}"] = {"compiler_options": opts, **bodies}
      outer = bodies["loop_0"]
      print(f"{name}, {label}: {outer['ops']} ops per iteration "
            f"({outer['copies']} copies, {outer['copy_bytes'] / 1e6:.2f} MB); "
            f"by part {outer['by_part']}")
  if _OUTPUT.value:
    io_utils.write_json(_OUTPUT.value, result)
    print(f"wrote {_OUTPUT.value}")
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
