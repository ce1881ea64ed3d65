r"""Speculative beam search vs beam search: walltime on the 38M Multi30k pair.

Times `decoding.beam_search.beam_search` (the target alone, T5X's beam
search) and `decoding.speculative_beam.speculative_beam_search` with the
shipped distilled 1M draft, for γ in --gammas and u in --widths (multiples
of k), on the first --num_sentences sentences of a Multi30k split, batch
--batch_size. Every configuration is compiled and run once on the first
batch before timing (compilation excluded); then --rounds rounds, each
timing every configuration over all sentences, in an order rotated from
round to round (interleaved, so slow drifts of the host hit all alike).
Reports per configuration the median round time, the speedup over the
baseline's median, target calls, steps per call (mean and histogram), the
cost of an iteration (draft beam search + target call + replay) in baseline
steps, and whether every sentence's beams equal the baseline's. Records the host's CPU
model, L3 cache and load average (before and after).

Example (the full measurement; run it on a quiet machine):
  python -m tools.benchmarks.beam --num_sentences 1000 \
      --output benchmarks/beam_38m.json
Smoke check:
  python -m tools.benchmarks.beam --num_sentences 3 --gammas 2 \
      --widths 1 --rounds 1
"""
import argparse
import os
import pathlib
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import jax
import numpy as np

from specdec_jax import checkpoints
from specdec_jax.core.decoding import beam_search
from specdec_jax.core.decoding import speculative_beam
from specdec_jax.core.models import T5Model
from specdec_jax.data import vocab as vocab_lib
from specdec_jax.metrics import exactness
from tools.benchmarks import common

PRETRAINED = common.PRETRAINED
DATA = common.REPO.parent / "shared" / "data" / "multi30k"


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--num_sentences", type=int, default=100)
  p.add_argument("--split", default="test_2016_flickr",
                 help="Multi30k split: reads <data_dir>/<split>.en")
  p.add_argument("--data_dir", default=str(DATA))
  p.add_argument("--batch_size", type=int, default=1)
  p.add_argument("--beam_size", type=int, default=4)
  p.add_argument("--alpha", type=float, default=0.6)
  p.add_argument("--max_decode_len", type=int, default=32)
  p.add_argument("--max_input_len", type=int, default=32,
                 help="inputs are cut/padded to this length (one compile)")
  p.add_argument("--gammas", default="2,3,4")
  p.add_argument("--widths", default="1,2",
                 help="draft beam widths u as multiples of beam_size k")
  p.add_argument("--num_rows", type=int, default=None,
                 help="candidate rows per target call (default 2u)")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--output", default=None, help="JSON file to write")
  args = p.parse_args(argv)
  for name in ("num_sentences", "batch_size", "beam_size", "max_decode_len",
               "max_input_len", "rounds"):
    if getattr(args, name) < 1:
      p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
  return args


def host_info() -> Dict[str, Any]:
  """The machine (`common.host`) and the JAX backend."""
  return dict(common.host(), backend=jax.default_backend(),
              devices=[str(d) for d in jax.devices()])


def load_model(name: str, gin_file: str) -> T5Model:
  if checkpoints.latest_checkpoint(str(PRETRAINED / name)) is None:
    raise SystemExit(f"no checkpoint in {PRETRAINED / name}")
  return common.load_for_decoding(str(PRETRAINED / name), gin_file)


def encode_batches(args: argparse.Namespace) -> List[np.ndarray]:
  """[batch_size, max_input_len] int32 batches (EOS appended, 0-padded; the
  last batch filled up with its last sentence)."""
  path = pathlib.Path(args.data_dir) / f"{args.split}.en"
  if not path.exists():
    raise SystemExit(f"{path} not found (--data_dir, --split)")
  lines = path.read_text(encoding="utf-8").splitlines()[:args.num_sentences]
  vocab = vocab_lib.load_vocabulary(str(PRETRAINED / "multi30k.model"),
                                    extra_ids=0)
  rows = np.zeros((len(lines), args.max_input_len), np.int32)
  for i, line in enumerate(lines):
    ids = (list(vocab.encode(line)) + [1])[:args.max_input_len]
    rows[i, :len(ids)] = ids
  batches = []
  for start in range(0, len(rows), args.batch_size):
    batch = rows[start:start + args.batch_size]
    fill = args.batch_size - len(batch)
    batches.append(np.concatenate([batch, np.repeat(batch[-1:], fill, 0)]))
  return batches


def configurations(args: argparse.Namespace) -> List[Dict[str, Any]]:
  k = args.beam_size
  configs: List[Dict[str, Any]] = [{"name": "beam", "gamma": None}]
  for gamma in (int(g) for g in args.gammas.split(",")):
    for multiple in (int(w) for w in args.widths.split(",")):
      width = multiple * k
      rows = args.num_rows if args.num_rows is not None else 2 * width
      configs.append({
          "name": f"spec_g{gamma}_u{width}_r{rows}",
          "gamma": gamma,
          "width": width,
          "num_rows": rows
      })
  return configs


def decode(config: Dict[str, Any], target, draft, batch, args):
  """One batch with one configuration; blocks until done."""
  if config["gamma"] is None:
    out = beam_search.beam_search(target, batch, beam_size=args.beam_size,
                                  max_decode_len=args.max_decode_len,
                                  alpha=args.alpha)
  else:
    out = speculative_beam.speculative_beam_search(
        target, draft, batch, beam_size=args.beam_size,
        max_decode_len=args.max_decode_len, gamma=config["gamma"],
        width=config["width"], num_rows=config["num_rows"], alpha=args.alpha)
  return jax.block_until_ready(out)


def run_round(config, target, draft, batches, args):
  """Seconds over all batches, the statistics, and the beams per batch."""
  steps = calls = 0
  histogram = np.zeros(max(int(g) for g in args.gammas.split(",")) + 2, int)
  tokens = []
  start = time.perf_counter()
  for batch in batches:
    out = decode(config, target, draft, batch, args)
    tokens.append(np.asarray(out.tokens))
    if config["gamma"] is None:
      steps += int(out.steps)
      calls += int(out.steps)  # One target call per step.
    else:
      calls += int(out.calls)
      counts = np.asarray(out.steps_per_call)
      histogram[:len(counts)] += counts
      # Steps of the baseline's loop: it steps all elements until all stop.
      steps += int(np.max(out.steps))
  seconds = time.perf_counter() - start
  return seconds, dict(steps=steps, calls=calls,
                       histogram=histogram.tolist()), tokens


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parse_args(argv)
  target = load_model("target_38m", "models/multi30k_target_38m.gin")
  draft = load_model("draft_1m_distill_38m", "models/multi30k_draft_1m.gin")
  batches = encode_batches(args)
  configs = configurations(args)
  load_before = list(os.getloadavg())
  for config in configs:  # Compile and warm up (not timed).
    start = time.perf_counter()
    decode(config, target, draft, batches[0], args)
    config["compile_and_first_run_s"] = time.perf_counter() - start
  times: Dict[str, List[float]] = {c["name"]: [] for c in configs}
  stats: Dict[str, Dict[str, Any]] = {}
  for r in range(args.rounds):
    shift = r % len(configs)
    for config in configs[shift:] + configs[:shift]:
      seconds, stat, tokens = run_round(config, target, draft, batches, args)
      times[config["name"]].append(seconds)
      stats[config["name"]] = dict(stat, tokens=tokens)
  results = summarize(configs, times, stats, args)
  record = dict(host=host_info(), load_average_before=load_before,
                load_average_after=list(os.getloadavg()), settings=vars(args),
                results=results)
  print_table(results)
  common.write_result(args.output, record)
  return 0


def summarize(configs, times, stats, args) -> List[Dict[str, Any]]:
  """One record per configuration; beams compared with the baseline's."""
  base = float(np.median(times["beam"]))
  base_step_s = base / max(stats["beam"]["steps"], 1)
  reference = stats["beam"]["tokens"]
  rows = []
  num = args.num_sentences
  for config in configs:
    name = config["name"]
    stat = stats[name]
    identical = exactness.greedy_identity(
        np.concatenate(reference)[:num],
        np.concatenate(stat["tokens"])[:num])["identical"]
    median = float(np.median(times[name]))
    rows.append(
        dict(
            name=name, gamma=config["gamma"], width=config.get("width"),
            num_rows=config.get("num_rows"), round_s=times[name],
            median_s=median, speedup=base / median, steps=stat["steps"],
            target_calls=stat["calls"],
            steps_per_call=mean_steps_per_call(stat),
            steps_per_call_histogram=stat["histogram"],
            iteration_cost_in_steps=median / max(stat["calls"], 1) /
            base_step_s, identical_sentences=identical, num_sentences=num,
            compile_and_first_run_s=config["compile_and_first_run_s"]))
  return rows


def mean_steps_per_call(stat: Dict[str, Any]) -> float:
  """Steps per target call of a batch element still searching (1 for the
  baseline)."""
  counts = np.asarray(stat["histogram"])
  if not counts.sum():
    return 1.0
  return float((counts * np.arange(len(counts))).sum() / counts.sum())


def print_table(results: List[Dict[str, Any]]) -> None:
  print(f"{'config':<22}{'median s':>10}{'speedup':>9}{'calls':>8}"
        f"{'steps/call':>12}{'call cost':>11}{'identical':>11}")
  for r in results:
    print(f"{r['name']:<22}{r['median_s']:>10.3f}{r['speedup']:>9.2f}"
          f"{r['target_calls']:>8}{r['steps_per_call']:>12.2f}"
          f"{r['iteration_cost_in_steps']:>11.2f}"
          f"{r['identical_sentences']:>6}/{r['num_sentences']}")


if __name__ == "__main__":
  sys.exit(main())
