#!/usr/bin/env python
r"""Soak test: does a long sweep's memory stay flat?

The command of `specdec_jax.benchmarking.soak` (see its docstring; `--help`
lists the flags):

  nice -n 15 python scripts/soak_sweep.py --output=/tmp/soak.json
"""
import sys

from specdec_jax.benchmarking import soak

if __name__ == "__main__":
  sys.exit(soak.main())
