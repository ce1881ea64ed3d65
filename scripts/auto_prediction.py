#!/usr/bin/env python
"""SPECULATION='auto''s predicted speedup beside the measured one.

The command of `specdec_jax.benchmarking.auto_prediction` (see its
docstring):

  python scripts/auto_prediction.py --config "pretrained_multi30k.gin" ...
"""
import sys

from specdec_jax.benchmarking import auto_prediction

if __name__ == "__main__":
  sys.exit(auto_prediction.main())
