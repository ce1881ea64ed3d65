"""Metrics and analysis: what a run measures and what the paper predicts.

* `analysis`: the paper's closed forms (Theorem 3.8, optimal γ), numpy only.
* `timing`: how a decoder call is timed (c and the K-curve), the one way
  every call price below is measured.
* `step_costs`: a run's calls priced on this machine (c and
  the verification call in target steps; the tree call for k branches).
* `overheads`: where walltime goes beyond Theorem 3.8 (efficiency split,
  fixed and marginal costs).
* `run_metrics`: metrics.json's one schema, written by `run`, read by
  `report`.
* `quality`: BLEU and ROUGE as T5 computes them.
* `exactness`: greedy identity and the two-sample distribution test with
  its power check (certify, the device check, the benchmarks).
"""
