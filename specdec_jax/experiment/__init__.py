"""The pieces of `python -m specdec_jax.run` (`specdec_jax.run` is its
command line); docs/architecture.md says which module holds what.

Nothing is imported here: `report` reads `specdec_jax.metrics.run_metrics`
without loading JAX.
"""
