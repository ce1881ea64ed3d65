#!/usr/bin/env python
r"""Speculative beam search vs beam search: walltime on the 38M Multi30k pair.

The command of `specdec_jax.benchmarking.beam` (see its docstring; `--help`
lists the flags). Smoke check:

  python scripts/benchmark_beam.py --num_sentences 3 --gammas 2 \
      --widths 1 --rounds 1
"""
import sys

from specdec_jax.benchmarking import beam

if __name__ == "__main__":
  sys.exit(beam.main())
