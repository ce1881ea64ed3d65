"""BLEU and ROUGE as T5 computes them (`t5.evaluation.metrics`): sacrebleu
corpus BLEU with T5's settings (tokenizer "intl"), and rouge-score
F-measures (x100, rougeLsum on sentences split at " . ", bootstrap mid
estimate) with Porter stemming by default (`use_stemmer=False`: T5's exact
numbers). Heavy third-party modules are imported inside the functions.
"""
from __future__ import annotations

from typing import Dict, Mapping, Sequence

DEFAULT_ROUGE_TYPES = ("rouge1", "rouge2", "rougeLsum")

TRANSLATION = "translation"
SUMMARIZATION = "summarization"
TASK_KINDS = (TRANSLATION, SUMMARIZATION)


def _references(references: Sequence, *predictions: Sequence[str]) -> list:
  """`references` as texts (seqio may hand 1-element lists), checked to
  pair with each `predictions`."""
  out = []
  for r in references:
    if isinstance(r, (list, tuple)):
      if len(r) != 1:
        raise ValueError(
            f"Only a single reference per example is supported, got {len(r)}.")
      r = r[0]
    out.append(r)
  for preds in predictions:
    if len(preds) != len(out):
      raise ValueError(
          f"predictions and references must have the same length, got "
          f"{len(preds)} predictions and {len(out)} references.")
    if isinstance(preds, str) or isinstance(references, str):
      raise TypeError("predictions and references must be sequences of "
                      "strings, not single strings.")
  return out


def bleu(predictions: Sequence[str], references: Sequence[str],
         tokenize: str = "intl") -> float:
  """Corpus BLEU (0..100) with the settings of ``t5.evaluation.metrics.bleu``."""
  references = _references(references, predictions)
  return float(
      _bleu_metric(tokenize).corpus_score(list(predictions),
                                          [list(references)]).score)


def _bleu_metric(tokenize: str = "intl"):
  """sacrebleu's BLEU with `bleu`'s settings (T5's)."""
  from sacrebleu.metrics import BLEU  # pylint: disable=g-import-not-at-top
  return BLEU(smooth_method="exp", smooth_value=0.0, force=False,
              lowercase=False, tokenize=tokenize, effective_order=False)


BOOTSTRAP_RESAMPLES = 1000  # sacrebleu's default for a paired bootstrap


def paired_bootstrap_bleu(baseline: Sequence[str], speculative: Sequence[str],
                          references: Sequence[str]) -> Dict[str, object]:
  """sacrebleu's paired bootstrap test (fixed seed) of the BLEU difference
  of two samples at T > 0: {"metric": "bleu", "difference": speculative −
  baseline, "p_value", "resamples"} (identical outputs: 0, 1, 0)."""
  references = _references(references, baseline, speculative)
  if list(baseline) == list(speculative):  # sacrebleu's p would be 1/(n+1)
    return {"metric": "bleu", "difference": 0.0, "p_value": 1.0, "resamples": 0}
  import logging  # pylint: disable=g-import-not-at-top
  from sacrebleu import significance  # pylint: disable=g-import-not-at-top
  quiet = logging.getLogger("sacrebleu")  # its per-test INFO lines
  level = quiet.level
  quiet.setLevel(logging.WARNING)
  try:
    test = significance.PairedTest([("baseline", list(baseline)),
                                    ("speculative", list(speculative))],
                                   {"BLEU": _bleu_metric()}, [list(references)],
                                   test_type="bs",
                                   n_samples=BOOTSTRAP_RESAMPLES)
    _, scores = test()
  finally:
    quiet.setLevel(level)
  base, spec = scores["BLEU"]
  return {
      "metric": "bleu",
      "difference": float(spec.score - base.score),
      "p_value": float(spec.p_value),
      "resamples": BOOTSTRAP_RESAMPLES,
  }


def rouge(predictions: Sequence[str], references: Sequence[str],
          score_keys: Sequence[str] = DEFAULT_ROUGE_TYPES,
          use_stemmer: bool = True) -> Dict[str, float]:
  """{key: bootstrap mid F-measure x100} for each of `score_keys`, as
  ``t5.evaluation.metrics.rouge`` (with stemming by default)."""
  references = _references(references, predictions)
  from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top
  from rouge_score import scoring  # pylint: disable=g-import-not-at-top
  score_keys = list(score_keys)
  if not predictions:
    return {k: 0.0 for k in score_keys}
  scorer = rouge_scorer.RougeScorer(rouge_types=score_keys,
                                    use_stemmer=use_stemmer)
  aggregator = scoring.BootstrapAggregator()
  for pred, ref in zip(predictions, references):
    # rougeLsum splits sentences at newlines (as in T5).
    aggregator.add_scores(
        scorer.score(target=ref.replace(" . ", " .\n"),
                     prediction=pred.replace(" . ", " .\n")))
  result = aggregator.aggregate()
  return {k: float(result[k].mid.fmeasure * 100) for k in score_keys}


def quality_metrics(task_kind: str, predictions: Sequence[str],
                    references: Sequence[str]) -> Mapping[str, object]:
  """'translation' -> {'bleu': float}; 'summarization' -> {'rouge': dict}."""
  if task_kind == TRANSLATION:
    return {"bleu": bleu(predictions, references)}
  if task_kind == SUMMARIZATION:
    return {"rouge": rouge(predictions, references)}
  raise ValueError(
      f"Unknown task_kind {task_kind!r}; expected one of {TASK_KINDS}.")


# seqio-style metric functions: take (targets, predictions) and return a dict.
def seqio_bleu(targets, predictions):
  return {"bleu": bleu(predictions, targets)}


def seqio_rouge(targets, predictions):
  return rouge(predictions, targets)
