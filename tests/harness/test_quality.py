"""Tests for specdec_jax.metrics.quality (offline, fast)."""

import pytest

from specdec_jax.metrics import quality as metrics

REFS = [
    "the quick brown fox jumps over the lazy dog .",
    "a stitch in time saves nine , they said .",
    "speculative decoding makes large models faster without changing outputs .",
]


def test_bleu_identical_is_100():
  assert metrics.bleu(REFS, REFS) == pytest.approx(100.0)


def test_bleu_disjoint_is_zero():
  preds = ["zebra yak xylophone walrus vulture umbrella"] * len(REFS)
  assert metrics.bleu(preds, REFS) == pytest.approx(0.0, abs=1e-6)


def test_bleu_partial_between():
  preds = ["the quick brown fox jumps over a sleepy cat ."] + REFS[1:]
  score = metrics.bleu(preds, REFS)
  assert 0.0 < score < 100.0


def test_bleu_accepts_single_element_reference_lists():
  assert metrics.bleu(REFS, [[r] for r in REFS]) == pytest.approx(100.0)


def test_rouge_identical_is_100():
  scores = metrics.rouge(REFS, REFS)
  assert set(scores) == {"rouge1", "rouge2", "rougeLsum"}
  for v in scores.values():
    assert v == pytest.approx(100.0)


def test_rouge_disjoint_is_zero():
  scores = metrics.rouge(["zebra yak xylophone"] * 3, REFS)
  for v in scores.values():
    assert v == pytest.approx(0.0)


def test_rouge_uses_stemming():
  scores = metrics.rouge(["the cats were running"], ["the cat was run"])
  no_stem = metrics.rouge(["the cats were running"], ["the cat was run"],
                          use_stemmer=False)
  assert scores["rouge1"] > no_stem["rouge1"]


def test_rouge_lsum_splits_sentences_on_newlines():
  ref = "the cat sat on the mat .\nthe dog ate my homework ."
  pred = "the dog ate my homework .\nthe cat sat on the mat ."
  scores = metrics.rouge([pred], [ref])
  # Sentence-level LCS union: both sentences matched -> 100, unlike rougeL.
  assert scores["rougeLsum"] == pytest.approx(100.0)
  # " . " is turned into a sentence break, as in T5.
  flat = metrics.rouge([pred.replace("\n", " ")], [ref.replace("\n", " ")])
  assert flat["rougeLsum"] == pytest.approx(100.0)


@pytest.mark.parametrize("fn", [metrics.bleu, metrics.rouge])
def test_length_mismatch_raises(fn):
  with pytest.raises(ValueError, match=r"2 predictions and 3 references"):
    fn(REFS[:2], REFS)


def test_quality_metrics_dispatch():
  t = metrics.quality_metrics("translation", REFS, REFS)
  assert set(t) == {"bleu"} and t["bleu"] == pytest.approx(100.0)
  s = metrics.quality_metrics("summarization", REFS, REFS)
  assert set(s) == {"rouge"} and s["rouge"]["rouge1"] == pytest.approx(100.0)
  with pytest.raises(ValueError, match="task_kind"):
    metrics.quality_metrics("qa", REFS, REFS)
  with pytest.raises(ValueError, match="3 predictions and 1 references"):
    metrics.quality_metrics("translation", REFS, REFS[:1])


def test_seqio_style_metric_fns():
  assert metrics.seqio_bleu(REFS, REFS)["bleu"] == pytest.approx(100.0)
  assert metrics.seqio_rouge(REFS, REFS)["rouge2"] == pytest.approx(100.0)


def test_paired_bootstrap_sizes_a_bleu_difference():
  """Issue 58: at T > 0 a BLEU difference between two samples is tested
  (sacrebleu's paired bootstrap, its fixed seed), not shown bare."""
  refs = REFS * 10
  good = list(refs)
  worse = [r if i % 5 else "the fox ." for i, r in enumerate(refs)]
  bad = ["zebra yak ."] * len(refs)
  noise = metrics.paired_bootstrap_bleu(good, worse, refs)
  assert noise["metric"] == "bleu" and noise["resamples"] == 1000
  assert noise["difference"] == pytest.approx(
      metrics.bleu(worse, refs) - metrics.bleu(good, refs))
  assert 0 < noise["p_value"] <= 1
  assert metrics.paired_bootstrap_bleu(good, worse, refs) == noise  # seeded
  assert metrics.paired_bootstrap_bleu(good, bad, refs)["p_value"] < 0.01
  # Identical outputs: nothing to test (sacrebleu would say p = 1/1001).
  same = metrics.paired_bootstrap_bleu(good, good, refs)
  assert same["difference"] == 0 and same["p_value"] == 1
