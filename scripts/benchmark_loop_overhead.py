#!/usr/bin/env python
r"""Where a decode's time goes: model calls vs the loops around them.

The command of `specdec_jax.benchmarking.loop_overhead` (see its docstring
for what is measured):

  python scripts/benchmark_loop_overhead.py --gamma=3 \
      --output=/tmp/specdec_jax/loop_overhead.json
"""
from specdec_jax.benchmarking import loop_overhead

if __name__ == "__main__":
  loop_overhead.run()
