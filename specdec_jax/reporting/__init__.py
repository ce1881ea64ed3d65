"""The pieces of `python -m specdec_jax.report` (which reads the results
folder): `tables`, `figures` and `trace` (Figures 1 and 5). DECODE='beam'
runs are tabulated by `python -m tools.beam_table`.
"""
