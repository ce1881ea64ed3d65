"""The pieces of `python -m specdec_jax.run` (`specdec_jax.run` ties them).

* `arguments`: the run's arguments as gin binds them (`RunArguments`),
  checked once when built.
* `setup`: model configs, the vocabulary and loading the models.
* `output_dir`: what a run's results record as its settings, and the
  OVERWRITE rule.
* `walltime`: both decoders timed over the examples, and the cost
  coefficient c (MODE='walltime', `metrics.json`).
* `drafting`: GAMMA='auto', pricing a drafter's guess, the drafting keys of
  metrics.json.
* `drafter_choice`: which drafter a run uses (the DRAFTER macro and its
  settings), GAMMA='auto' (Theorem 3.8) and `propose_seconds`.
* `ngram_corpus`: reading (and writing) the corpus an n-gram drafter counts.
* `alpha`: α as Corollary 3.6's mean β (MODE='alpha', `alpha.json`).
* `traces`: the per-example records of `predictions.jsonl`.
* `summary`: the plain-words lines the command ends with.

Nothing is imported here: `report` reads `specdec_jax.run_metrics` without
loading JAX.
"""
