"""Quality metrics for generated text, following T5's evaluation metrics.

* :func:`bleu` mirrors ``t5.evaluation.metrics.bleu``: sacrebleu corpus BLEU
  with exponential smoothing, no lowercasing, no effective order and T5's
  ``"intl"`` tokenizer (pass ``tokenize="13a"`` for sacrebleu's own default).
* :func:`rouge` mirrors ``t5.evaluation.metrics.rouge``: rouge-score
  F-measures scaled to 0..100, rougeLsum computed on text whose sentences are
  separated by newlines (" . " is turned into " .\n" as in T5), aggregated
  with bootstrap resampling (mid estimate). Unlike current T5 we use Porter
  stemming by default (``use_stemmer=True``, the setting of the rouge-score /
  CNN/DM literature); pass ``use_stemmer=False`` for T5's exact numbers.

Heavy third-party modules are imported lazily inside the functions.
"""

from __future__ import annotations

from typing import Dict, Mapping, Sequence

DEFAULT_ROUGE_TYPES = ("rouge1", "rouge2", "rougeLsum")

TRANSLATION = "translation"
SUMMARIZATION = "summarization"
TASK_KINDS = (TRANSLATION, SUMMARIZATION)


def _check_lengths(predictions: Sequence[str],
                   references: Sequence[str]) -> None:
  if len(predictions) != len(references):
    raise ValueError(
        f"predictions and references must have the same length, got "
        f"{len(predictions)} predictions and {len(references)} references.")
  if isinstance(predictions, str) or isinstance(references, str):
    raise TypeError("predictions and references must be sequences of strings, "
                    "not single strings.")


def _flatten_references(references: Sequence) -> list:
  """seqio may hand references as 1-element lists; accept either form."""
  out = []
  for r in references:
    if isinstance(r, (list, tuple)):
      if len(r) != 1:
        raise ValueError(
            f"Only a single reference per example is supported, got {len(r)}.")
      r = r[0]
    out.append(r)
  return out


def bleu(predictions: Sequence[str], references: Sequence[str],
         tokenize: str = "intl") -> float:
  """Corpus BLEU (0..100) with the settings of ``t5.evaluation.metrics.bleu``."""
  references = _flatten_references(references)
  _check_lengths(predictions, references)
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
  """sacrebleu's paired bootstrap test of speculative vs baseline BLEU.

  At T > 0 the two outputs are different samples of one distribution:
  their BLEU differs by sampling noise, which this sizes (sacrebleu's
  `PairedTest`, `test_type='bs'`, its fixed seed: the same texts give the
  same p-value).

  Returns:
    {"metric": "bleu", "difference": speculative − baseline corpus BLEU,
    "p_value": the test's, "resamples": BOOTSTRAP_RESAMPLES}; identical
    outputs: difference 0, p_value 1, resamples 0 (sacrebleu would give
    1/(resamples + 1): it counts no tie as chance).
  """
  references = _flatten_references(references)
  _check_lengths(baseline, references)
  _check_lengths(speculative, references)
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


def _prepare_summary_rouge(summary: str) -> str:
  # Make sure the summary is not bytes and that sentences are newline
  # separated, which is what rougeLsum splits on (as in T5).
  summary = summary.replace(" . ", " .\n")
  return summary


def rouge(predictions: Sequence[str], references: Sequence[str],
          score_keys: Sequence[str] = DEFAULT_ROUGE_TYPES,
          use_stemmer: bool = True) -> Dict[str, float]:
  """ROUGE F-measures (x100), like ``t5.evaluation.metrics.rouge`` (+ stemming).

  Returns a dict with one entry per key in ``score_keys`` (by default
  rouge1, rouge2, rougeLsum), each the bootstrap-aggregated mid F-measure.
  """
  references = _flatten_references(references)
  _check_lengths(predictions, references)
  from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top
  from rouge_score import scoring  # pylint: disable=g-import-not-at-top
  score_keys = list(score_keys)
  if not predictions:
    return {k: 0.0 for k in score_keys}
  scorer = rouge_scorer.RougeScorer(rouge_types=score_keys,
                                    use_stemmer=use_stemmer)
  aggregator = scoring.BootstrapAggregator()
  for pred, ref in zip(predictions, references):
    aggregator.add_scores(
        scorer.score(target=_prepare_summary_rouge(ref),
                     prediction=_prepare_summary_rouge(pred)))
  result = aggregator.aggregate()
  return {k: float(result[k].mid.fmeasure * 100) for k in score_keys}


def quality_metrics(task_kind: str, predictions: Sequence[str],
                    references: Sequence[str]) -> Mapping[str, object]:
  """Returns the quality metric(s) appropriate for ``task_kind``.

  'translation' -> {'bleu': float}; 'summarization' -> {'rouge': dict}.
  """
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
