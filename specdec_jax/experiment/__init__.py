"""The pieces of `python -m specdec_jax.run` (`specdec_jax.run` is its
command line).

* `arguments`: the run's arguments as gin binds them (`RunArguments`),
  checked once when built.
* `plan`: the run in three stages, each built once: `RunPlan` (configs,
  vocabulary, the decode mode and its acceptance rule: every setting
  checked before anything is loaded), `Loaded` (its models and drafter:
  what pilots use) and `DecodePlan` (every choice made, the two
  decoders); `Providers`, what it takes from outside.
* `runner`: `execute(plan)`: OUTPUT_DIR, the examples, the models, the
  choices, a mode; MODE='alpha' (α as Corollary 3.6's mean β,
  `alpha.json`).
* `batches`: the one loop over the batches and the one tally of what was
  decoded (every mode and pilot).
* `walltime`: MODE='walltime', the one decode path (compile, decode, text,
  rows, step costs, metrics.json); `infer`: MODE='infer'.
* `loading`: model configs, the vocabulary and loading the models.
* `decode_modes`, `drafter_registry`: ACCEPTANCE / DECODE's and DRAFTER's
  values, each an object that checks, builds, labels and records itself
  (`register`, `register_drafter`).
* `pilots`: every choice before the timed decode (GAMMA, TREE_WIDTH and
  SPECULATION 'auto', one pilot for all), by `auto`'s rules, with
  `price_cache`'s call prices; `online`: SPECULATION='auto' between
  batches.
* `output_dir`: what a run's results record as its settings, and the
  OVERWRITE rule, one run per OUTPUT_DIR (its lock); `predictions`:
  predictions.jsonl as it goes, and its per-example records (traces).
* `ngram_corpus`: reading (and writing) the corpus an n-gram drafter counts.
* `summary`: the plain-words lines the command ends with.
* `compile_report`, `compile_check`, `hlo_reads`, `tpu_topologies`:
  COMPILE_TOPOLOGY's ahead-of-time TPU compilation.

Nothing is imported here: `report` reads `specdec_jax.metrics.run_metrics` without
loading JAX.
"""
