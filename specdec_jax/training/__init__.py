"""Training T5 targets and drafts (`python -m specdec_jax.train`), laid out
as flax's ``examples/wmt``: `trainer.train_and_evaluate` is the run, over
`config` (settings, optimizer), `data`, `loss`, `checkpointing` (and the
teacher) and `feature_trainer` (a feature-level draft).
"""
