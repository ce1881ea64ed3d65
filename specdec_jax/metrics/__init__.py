"""What a run measures and what the paper predicts: the closed forms
(`analysis`), how a call is timed (`timing`) and a run's calls priced
(`step_costs`), `overheads`, metrics.json's schema (`run_metrics`), BLEU and
ROUGE (`quality`) and the one exactness check (`exactness`).
"""
