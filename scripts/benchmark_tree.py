#!/usr/bin/env python
r"""Tree verification against token verification: tokens per call and time.

The command of `specdec_jax.benchmarking.tree` (see its docstring for what
is measured):

  python scripts/benchmark_tree.py --sentences=20 \
      --output=/tmp/specdec_jax/benchmark_tree.json
"""
from specdec_jax.benchmarking import tree

if __name__ == "__main__":
  tree.run()
