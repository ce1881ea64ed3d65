"""The pieces of `python -m specdec_jax.run` (`specdec_jax.run` is its
command line).

* `arguments`: the run's arguments as gin binds them (`RunArguments`),
  checked once when built.
* `plan`: the run in three stages, each built once: `RunPlan` (configs,
  vocabulary, acceptance rule: every setting checked before anything is
  loaded), `Loaded` (its models and drafter: what pilots use) and
  `DecodePlan` (every choice made, the two decoders); `Providers`, what
  it takes from outside.
* `runner`: `execute(plan)`: OUTPUT_DIR, the examples, the models, a mode;
  MODE='alpha' (α as Corollary 3.6's mean β, `alpha.json`).
* `walltime`: MODE='walltime', the one decode path (compile, decode, text,
  rows, step costs, metrics.json).
* `loading`: model configs, the vocabulary and loading the models.
* `drafter_registry`: DRAFTER's values, each a spec that checks, builds,
  labels and records itself (`register_drafter`).
* `auto_gamma`: GAMMA='auto' (Theorem 3.8 on the first examples);
  `step_costs`: a target call's and a draft step's seconds (c).
* `output_dir`: what a run's results record as its settings, and the
  OVERWRITE rule, one run per OUTPUT_DIR (its lock); `predictions`:
  predictions.jsonl as it goes, and its per-example records (traces).
* `ngram_corpus`: reading (and writing) the corpus an n-gram drafter counts.
* `summary`: the plain-words lines the command ends with.
* `compile_report`, `compile_check`, `hlo_reads`, `tpu_topologies`:
  COMPILE_TOPOLOGY's ahead-of-time TPU compilation.
* `values`: what a setting's value is (integer, finite real).

Nothing is imported here: `report` reads `specdec_jax.metrics.run_metrics` without
loading JAX.
"""
