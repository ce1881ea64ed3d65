#!/usr/bin/env python
r"""Greedy decoding latency: ours (baseline, speculative) vs T5X's decoder.

The command of `specdec_jax.benchmarking.t5x_comparison` (see its docstring;
`--help` lists the flags):

  python scripts/compare_with_t5x.py --t5x_path=/tmp/t5x --pair=pretrained \
      --gammas=3,6 --repeats=5 --output=benchmarks/t5x_pretrained_cpu.json
"""
import sys

from specdec_jax.benchmarking import t5x_comparison

if __name__ == "__main__":
  sys.exit(t5x_comparison.main())
