#!/usr/bin/env python
"""Decode benchmark CLI: baseline vs speculative decoding walltime.

A thin wrapper over `specdec_jax.benchmarking` (see its docstring for what is
measured and how; `--help` lists the absl flags). Acceptance is SYNTHETIC
(each draft token accepted with probability alpha): the numbers are timings,
not quality results.

Example (CPU, a few minutes):
  python scripts/benchmark_decode.py --target small --draft xsmall \
      --max_decode_length 64 --output benchmarks/cpu_small.json

Sizes: tiny, mini, xsmall (gin/models/bench_<size>.gin), small, base, large,
xl, xxl (gin/models/t5_1_1_<size>.gin), or a gin file binding T5Config
(e.g. gin/models/multi30k_target.gin, gin/local_tiny.gin).
"""
import sys

from specdec_jax import benchmarking

if __name__ == "__main__":
  sys.exit(benchmarking.main(sys.argv[1:]))
