"""The pieces of `python -m specdec_jax.report` (`specdec_jax.report` ties
them): `loading` (a results folder, checked), `tables` (Table 2 and Table 4),
`figures` (speedup vs γ, α per draft, tokens per call vs tree width) and
`trace` (Figures 1 and 5 for one example).

Commands of their own (`python -m specdec_jax.reporting.X`, or the thin
script in scripts/): `beam_table` (`scripts/beam_table.py`: DECODE='beam'
runs, which the report leaves out) and `call_cost` (`scripts/plot_call_cost.py`:
a K-token call's cost from benchmark JSON files).
"""
