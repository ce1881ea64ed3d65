"""The pieces of `python -m specdec_jax.report` (`specdec_jax.report` ties
them): `loading` (a results folder, checked), `tables` (Table 2 and Table 4),
`figures` (speedup vs γ, α per draft, tokens per call vs tree width) and
`trace` (Figures 1 and 5 for one example).

DECODE='beam' runs, which the report leaves out, are tabulated by a tool:
`python -m tools.beam_table` (run from the repository's root).
"""
