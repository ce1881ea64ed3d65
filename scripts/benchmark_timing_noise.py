#!/usr/bin/env python
"""How steady are run's c and verification cost on a shared machine?

The command of `specdec_jax.benchmarking.timing_noise` (see its docstring
for what is measured):

  python scripts/benchmark_timing_noise.py --output=benchmarks/timing_noise_cpu.json
"""
from specdec_jax.benchmarking import timing_noise

if __name__ == "__main__":
  timing_noise.run()
