"""Tree verification against token verification: tokens per call and time.

For k = 1..4 draft branches of γ guesses per target call
(`decoding.tree_speculative_sample`) and for token verification
(`decoding.speculative_sample`, Algorithm 1) at the same γ, on a real pair
(by default the 38M target and its distilled 1M draft shipped in
`pretrained/multi30k`) and real sentences, at each temperature:

* tokens per target call (from the decoders' own counters);
* walltime of decoding the sentences one by one (batch 1), and the speedup
  over the target alone (`temperature_sample`);
* the tree call's cost in target steps: `steps` calls of `decode_tree` over
  N nodes (a root and N - 1 children; the cost depends on N, not on the
  shape) against `steps` one-token `decode_chunk` calls, for each N.

Medians of interleaved rounds (`timing.InterleavedTimer`, order rotated),
compilation excluded (an untimed warm-up call of every program). The host,
its CPU count and load average are recorded beside the numbers.

Memory stays bounded however many sentences: inputs are padded with 0
(masked by the encoder) to a multiple of `INPUT_BUCKET`, as `run` pads its
batches, so each decoder compiles once per bucket rather than once per
sentence length; and every compiled program is freed (`jax.clear_caches`)
after each temperature and after the call-cost curve. (Without both, 60
sentences compiled ~100 programs and LLVM ran out of memory.) The resident
set size after each part is printed and recorded (`rss_mib`).

  python -m tools.benchmarks.tree --sentences=20 \\
      --output=/tmp/specdec_jax/benchmark_tree.json
"""
import argparse
import functools
import json
import resource
import sys
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.metrics import timing
from tools.benchmarks import common

# Inputs are padded to a multiple of this (`experiment.runner.INPUT_BUCKET`).
INPUT_BUCKET = 16


def _numbers(p: argparse.ArgumentParser, flag: str, text: str, kind,
             minimum) -> list:
  """A comma-separated list of numbers >= minimum, or `p.error`."""
  try:
    values = [kind(x) for x in text.split(",")]
  except ValueError:
    values = []
  if not values or min(values) < minimum:
    p.error(f"--{flag} must be comma-separated numbers >= {minimum}, got "
            f"{text!r}.")
  return values


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  """The command's flags, checked (a bad one: one line, exit 2)."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  common.add_pair_flags(p, target="target_38m",
                        target_gin="models/multi30k_target_38m.gin",
                        draft="draft_1m_distill_38m", sentences=20, gamma=4,
                        rounds=5)
  p.add_argument("--widths", default="1,2,3,4",
                 help="tree widths k (branches per call)")
  p.add_argument("--temperatures", default="0,1",
                 help="sampling temperatures (0: greedy)")
  p.add_argument("--nodes", default="1,4,8,12,16,20,24",
                 help="tree sizes N for the call-cost curve")
  p.add_argument("--steps", type=int, default=20,
                 help="calls per timed call-cost loop")
  p.add_argument("--max_decode_length", type=int, default=64,
                 help="maximum generated tokens per sentence")
  p.add_argument(
      "--without_replacement", default=True,
      action=argparse.BooleanOptionalAction,
      help="draw the k first guesses without replacement (else "
      "i.i.d.)")
  args = p.parse_args(argv)
  common.check_pair_flags(p, args, positive=("steps", "max_decode_length"))
  args.widths = _numbers(p, "widths", args.widths, int, 1)
  args.nodes = _numbers(p, "nodes", args.nodes, int, 1)
  args.temperatures = _numbers(p, "temperatures", args.temperatures, float, 0)
  return args


def rss_mib():
  """(current, peak) resident set size of this process in MiB (current from
  /proc/self/status where there is one, else None)."""
  current = None
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          current = int(line.split()[1]) / 1024
  except OSError:
    pass
  return current, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def free_programs(what, log):
  """Frees every compiled program (`jax.clear_caches`: the jit caches of
  all decoders and loops; the persistent cache on disk is kept) after
  `what`, and records the resident set size in `log` ({what: MiB})."""
  jax.clear_caches()
  current, peak = rss_mib()
  log[what] = {"rss_mib": current, "peak_rss_mib": peak}
  print(f"after {what}: compiled programs freed; RSS {current} MiB "
        f"(peak {peak:.0f} MiB)")


def _decoders(target, draft, inputs, *, gamma, widths, method, max_len,
              without_replacement):
  """name -> fn() decoding every sentence; returns (tokens, target calls)."""
  rng = jax.random.PRNGKey(0)

  def run(decode):
    tokens = calls = 0
    for x in inputs:
      out = decode(x)
      jax.block_until_ready(out.tokens)
      tokens += int(np.sum(out.lengths))
      calls += int(np.sum(out.target_calls))
    return tokens, calls

  fns = {
      "target_alone": lambda: run(lambda x: decoding.temperature_sample(
          target, x, rng, max_decode_length=max_len, method=method)),
      "token": lambda: run(lambda x: decoding.speculative_sample(
          target, draft, x, rng, gamma=gamma, max_decode_length=max_len, method=
          method)),
  }
  for k in widths:
    fns[f"tree_k{k}"] = functools.partial(
        run,
        functools.partial(decoding.tree_speculative_sample, target, draft,
                          rng=rng, gamma=gamma, tree_width=k,
                          max_decode_length=max_len, method=method,
                          without_replacement=without_replacement))
  return fns


def measure_decoding(target, draft, inputs, *, gamma, widths, temperature,
                     rounds, max_decode_length, without_replacement):
  """Per decoder: seconds, tokens per call, speedup over the target alone."""
  method = sampling.make_method(temperature)
  seconds, outs = common.median_seconds(
      _decoders(target, draft, inputs, gamma=gamma, widths=widths,
                method=method, max_len=max_decode_length,
                without_replacement=without_replacement), rounds)
  rows = {}
  for name, (tokens, calls) in outs.items():
    rows[name] = {
        "seconds": seconds[name],
        "tokens": tokens,
        "target_calls": calls,
        "tokens_per_target_call": tokens / max(calls, 1),
        "speedup": seconds["target_alone"] / seconds[name],
    }
  token = rows["token"]["tokens_per_target_call"]
  for name in rows:
    if name.startswith("tree_"):
      rows[name]["tokens_per_call_vs_token"] = (
          rows[name]["tokens_per_target_call"] / token)
  return rows


@functools.partial(jax.jit, static_argnames=("nodes", "steps"))
def _tree_call_loop(model, cache, fill, *, nodes: int, steps: int):
  """`steps` decode_tree calls over N nodes after fill; a checksum."""
  batch = fill.shape[0]
  parents = jnp.asarray([-1] + [0] * (nodes - 1), jnp.int32)

  def body(i, carry):
    cache, acc = carry
    tokens = jnp.full((batch, nodes), 3, jnp.int32) + (i % 2)
    logits, cache = model.decode_tree(tokens, parents,
                                      cache.replace(length=fill))
    return cache, acc + logits[:, -1, 0]

  _, acc = jax.lax.fori_loop(0, steps, body,
                             (cache, jnp.zeros((batch,), jnp.float32)))
  return acc


def measure_call_cost(target, inputs, *, nodes, steps, rounds,
                      max_decode_length):
  """{N: tree call seconds / one-token call seconds} at a mid-sentence fill."""
  max_len = max_decode_length + max(nodes) + 1
  cache = timing.start(target, inputs[0], max_len=max_len)
  fill = jnp.full((1,), 16, jnp.int32)
  fns = {
      "step": lambda: jax.block_until_ready(
          timing.call_loop(target, cache, fill, k=1, steps=steps))
  }
  for n in nodes:
    fns[f"tree_{n}"] = functools.partial(
        lambda n: jax.block_until_ready(
            _tree_call_loop(target, cache, fill, nodes=n, steps=steps)), n)
  seconds, _ = common.median_seconds(fns, rounds)
  return {
      "target_step_s": seconds["step"] / steps,
      "tree_call_steps": {
          n: seconds[f"tree_{n}"] / seconds["step"] for n in nodes
      },
  }


def _host():
  return dict(common.host(), device=jax.devices()[0].device_kind)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The command: measure, print, write --output."""
  f = parse_args(argv)
  widths, nodes, temperatures = f.widths, f.nodes, f.temperatures
  target = common.load_for_decoding(f.target, f.target_gin)
  draft = common.load_for_decoding(f.draft, f.draft_gin)
  inputs = common.sentences(f, INPUT_BUCKET)
  result = {
      "host_before": _host(),
      "gamma": f.gamma,
      "without_replacement": f.without_replacement,
      "sentences": len(inputs),
      "input_widths": sorted({x.shape[1] for x in inputs}),
      "decoding": {},
      "memory": {}
  }
  for temperature in temperatures:
    rows = measure_decoding(target, draft, inputs, gamma=f.gamma, widths=widths,
                            temperature=temperature, rounds=f.rounds,
                            max_decode_length=f.max_decode_length,
                            without_replacement=f.without_replacement)
    result["decoding"][str(temperature)] = rows
    for name, row in rows.items():
      print(f"T={temperature} {name}: {row['tokens_per_target_call']:.3f} "
            f"tokens/call, {row['seconds']:.3f} s, speedup "
            f"{row['speedup']:.3f}x")
    free_programs(f"T={temperature}", result["memory"])
  result["call_cost"] = measure_call_cost(target, inputs, nodes=nodes,
                                          steps=f.steps, rounds=f.rounds,
                                          max_decode_length=f.max_decode_length)
  free_programs("call_cost", result["memory"])
  for n, steps in result["call_cost"]["tree_call_steps"].items():
    print(f"tree call over N={n} nodes: {steps:.2f} target steps")
  result["host_after"] = _host()
  common.write_result(f.output, result)
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
