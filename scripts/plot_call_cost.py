#!/usr/bin/env python
r"""The two regimes side by side: a K-token target call's cost in one-token steps.

The command of `specdec_jax.reporting.call_cost` (see its docstring):

  python scripts/plot_call_cost.py \
      --bench 11M=benchmarks/call_cost_11m_cpu.json \
      --bench 38M=benchmarks/call_cost_38m_cpu.json \
      --out benchmarks/call_cost_cpu
"""
import sys

from specdec_jax.reporting import call_cost

if __name__ == "__main__":
  sys.exit(call_cost.main())
