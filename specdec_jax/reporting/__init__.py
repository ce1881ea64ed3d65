"""The pieces of `python -m specdec_jax.report` (`specdec_jax.report` ties
them): `loading` (a results folder, checked), `tables` (Table 2 and Table 4),
`figures` (speedup vs γ, α per draft), `trace` (Figure 1), `timeline`
(Figure 5) and `examples` (which decoded example to draw).
"""
