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

  python scripts/benchmark_tree.py --sentences=20 \\
      --output=/tmp/specdec_jax/benchmark_tree.json

(`python -m specdec_jax.benchmarking.tree` is the same command.)
"""
import functools
import json
import os
import platform
import resource
import statistics
import types

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.benchmarking import config
from specdec_jax.config import flag_utils
from specdec_jax.config.paths import REPO_DIR
from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.data import vocab as vocab_lib
from specdec_jax.files import io_utils
from specdec_jax.metrics import timing

REPO = str(REPO_DIR)
PRETRAINED = os.path.join(REPO, "pretrained", "multi30k")
# Inputs are padded to a multiple of this (`experiment.runner.INPUT_BUCKET`).
INPUT_BUCKET = 16


def define_flags() -> types.SimpleNamespace:
  """The command's flags, on absl's global FLAGS (when it runs:
  `flag_utils.run_absl_command`)."""
  return types.SimpleNamespace(
      target=flags.DEFINE_string("target", os.path.join(PRETRAINED,
                                                        "target_38m"),
                                 "Target checkpoint (dir)."),
      target_gin=flags.DEFINE_string("target_gin",
                                     "models/multi30k_target_38m.gin",
                                     "Target model gin file."),
      draft=flags.DEFINE_string(
          "draft", os.path.join(PRETRAINED, "draft_1m_distill_38m"),
          "Draft checkpoint (dir)."),
      draft_gin=flags.DEFINE_string("draft_gin", "models/multi30k_draft_1m.gin",
                                    "Draft model gin file."),
      spm_model=flags.DEFINE_string("spm_model",
                                    os.path.join(PRETRAINED, "multi30k.model"),
                                    "SentencePiece model of both."),
      source_file=flags.DEFINE_string(
          "source_file",
          os.path.join(REPO, "configs", "data", "captions_en_de.tsv"),
          "Sentences: one per line (text before a tab is the input)."),
      sentences=flags.DEFINE_integer("sentences", 20,
                                     "Sentences decoded (>= 1)."),
      gamma=flags.DEFINE_integer("gamma", 4, "Draft guesses per branch γ."),
      widths=flags.DEFINE_list("widths", ["1", "2", "3", "4"],
                               "Tree widths k (branches per call)."),
      temperatures=flags.DEFINE_list("temperatures", ["0", "1"],
                                     "Sampling temperatures (0: greedy)."),
      nodes=flags.DEFINE_list("nodes", ["1", "4", "8", "12", "16", "20", "24"],
                              "Tree sizes N for the call-cost curve."),
      steps=flags.DEFINE_integer("steps", 20,
                                 "Calls per timed call-cost loop."),
      max_decode_length=flags.DEFINE_integer(
          "max_decode_length", 64, "Maximum generated tokens per sentence."),
      without_replacement=flags.DEFINE_bool(
          "without_replacement", True,
          "Draw the k first guesses without replacement (else i.i.d.)."),
      rounds=flags.DEFINE_integer("rounds", 5, "Interleaved timing rounds."),
      output=flags.DEFINE_string("output", None, "Write the results as JSON."),
  )


def _check_flags(f):
  """The parsed lists; app.UsageError naming a bad flag."""
  try:
    widths = [int(x) for x in f.widths]
    nodes = [int(x) for x in f.nodes]
    temperatures = [float(x) for x in f.temperatures]
  except ValueError as e:
    raise app.UsageError(f"--widths/--nodes/--temperatures: {e}") from e
  if not widths or min(widths) < 1:
    raise app.UsageError(f"--widths must be integers >= 1, got {widths}.")
  if not nodes or min(nodes) < 1:
    raise app.UsageError(f"--nodes must be integers >= 1, got {nodes}.")
  if not temperatures or min(temperatures) < 0:
    raise app.UsageError(
        f"--temperatures must be numbers >= 0, got {temperatures}.")
  for name in ("sentences", "gamma", "steps", "rounds", "max_decode_length"):
    if getattr(f, name) < 1:
      raise app.UsageError(f"--{name} must be >= 1, got {getattr(f, name)}.")
  for name in ("target", "draft", "spm_model", "source_file"):
    if not os.path.exists(getattr(f, name)):
      raise app.UsageError(f"--{name}: {getattr(f, name)} does not exist.")
  return widths, nodes, temperatures


def pad_to_bucket(ids, bucket=INPUT_BUCKET):
  """[1, S'] int32: `ids` (a sentence's token ids, EOS included) padded with
  0 to S' = the next multiple of `bucket` (the encoder masks 0s), so that
  sentences of different lengths share one compiled program."""
  width = -(-len(ids) // bucket) * bucket
  return np.asarray([list(ids) + [0] * (width - len(ids))], np.int32)


def _inputs(f):
  """[--sentences] arrays [1, S'] of encoded sentences (EOS appended, padded
  by `pad_to_bucket`)."""
  vocab = vocab_lib.load_vocabulary(f.spm_model, extra_ids=0,
                                    what="--spm_model")
  with open(f.source_file, encoding="utf-8") as lines_file:
    lines = [l.split("\t")[0].strip() for l in lines_file if l.strip()]
  return [pad_to_bucket(vocab.encode(l) + [1]) for l in lines[:f.sentences]]


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


def _medians(fns, rounds):
  """{name: median seconds} and {name: last output} over interleaved
  rounds (compiled by the warm-up)."""
  timer = timing.InterleavedTimer(rounds, log=lambda _: None, rotate=True)
  times, outs = timer({
      name: (lambda r, fn=fn: fn()) for name, fn in fns.items()
  }, keep=list(fns))
  return ({
      name: float(statistics.median(t)) for name, t in times.items()
  }, {
      name: out[-1] for name, out in outs.items()
  })


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
  seconds, outs = _medians(
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
  seconds, _ = _medians(fns, rounds)
  return {
      "target_step_s": seconds["step"] / steps,
      "tree_call_steps": {
          n: seconds[f"tree_{n}"] / seconds["step"] for n in nodes
      },
  }


def _host():
  try:
    load = os.getloadavg()
  except (AttributeError, OSError):
    load = None
  return {
      "host": platform.node(),
      "cpu_count": os.cpu_count(),
      "load_average": load,
      "device": jax.devices()[0].device_kind,
  }


def main(argv, f: types.SimpleNamespace):
  """The command; `f`: the values of `define_flags`' flags by name."""
  del argv
  widths, nodes, temperatures = _check_flags(f)
  target = config.load_for_decoding(f.target, f.target_gin)
  draft = config.load_for_decoding(f.draft, f.draft_gin)
  inputs = _inputs(f)
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
  if f.output:
    io_utils.write_json(f.output, result)
    print(f"wrote {f.output}")
  print(json.dumps(result))


def run() -> None:
  """The command line (`python -m specdec_jax.benchmarking.tree`)."""
  flag_utils.run_absl_command(main, define_flags())


if __name__ == "__main__":
  run()
