"""The repository's tools: what a user of the library does not need.

Not installed with the package (pyproject's `packages.find` takes
`specdec_jax` only): run each from the repository's root as
`python -m tools.NAME` (`--help` lists its flags).

* `benchmarks/`: the benchmarks behind docs/results (decode, T5X, loop
  overhead, trees, beams, timing noise, HLO, soak, compile time, revisions,
  'auto' predictions, call-cost plots, the feature draft, TPU compiles).
* `device_check/`: the check on a lent GPU (`scripts/device_check.sh`).
* `generate_docs`, `generate_model_gin`: the generated docs pages and
  scoped model gin files.
* `beam_table`, `multi30k_summary`, `export_pretrained`,
  `export_feature_drafter`: a results folder's beam runs, the Multi30k
  pipeline's summary, the shipped checkpoints' export.

Tools import `specdec_jax`; `specdec_jax` never imports them
(tests/project/test_architecture.py).
"""
