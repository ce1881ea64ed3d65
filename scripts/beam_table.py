#!/usr/bin/env python
"""A Table-2-style page of a results folder's DECODE='beam' runs.

The command of `specdec_jax.reporting.beam_table` (see its docstring):

  python scripts/beam_table.py /tmp/beam_multi30k [--output beam.md]
"""
import sys

from specdec_jax.reporting import beam_table

if __name__ == "__main__":
  sys.exit(beam_table.main())
