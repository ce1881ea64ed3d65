#!/usr/bin/env bash
# Trains the Multi30k target and drafts on this machine, then measures them:
# the commands behind the README's "Multi30k" results. Resumable: re-running
# continues interrupted training from its last checkpoint.
#
#   bash scripts/multi30k_pipeline.sh            # train + measure
#   SKIP_TRAIN=1 bash scripts/multi30k_pipeline.sh   # measure only
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/multi30k}
mkdir -p "$OUT/logs"

if [ -z "${SKIP_TRAIN:-}" ]; then
  for cfg in multi30k_target multi30k_draft_1m multi30k_draft_4m multi30k_draft_4m_distill; do
    python -m specdec_jax.train --gin_file=train/$cfg.gin 2>&1 | tee "$OUT/logs/train_$cfg.log"
  done
fi

# Speculative decoding on test_2016_flickr, greedy and at temperature 1.
for draft in 1m 4m 4m_distill; do
  for temp in 0.0 1.0; do
    python -m specdec_jax.run --gin_file=multi30k_$draft.gin \
      --gin.TEMPERATURE=$temp --gin.OUTPUT_DIR="'$OUT/results/${draft}_T$temp'" \
      2>&1 | tee "$OUT/logs/run_${draft}_T$temp.log"
    # alpha as in Corollary 3.6 (mean beta over target-sampled positions).
    python -m specdec_jax.run --gin_file=multi30k_$draft.gin --gin.MODE="'alpha'" \
      --gin.TEMPERATURE=$temp --gin.OUTPUT_DIR="'$OUT/results/${draft}_T$temp'" \
      2>&1 | tee "$OUT/logs/alpha_${draft}_T$temp.log"
  done
done
python -m specdec_jax.report "$OUT/results"
python scripts/multi30k_summary.py --out "$OUT" | tee "$OUT/summary.md"
