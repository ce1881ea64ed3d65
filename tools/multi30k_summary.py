"""Summarizes the Multi30k pipeline as the README's results table.

  python -m tools.multi30k_summary [--out outputs/multi30k]

Reads the models trained by `scripts/multi30k_pipeline.sh` (model dirs under
OUT) and the runs it made (OUT/results/<draft>_T<temperature>/metrics.json
and alpha.json), greedy-decodes test_2016_flickr with each model alone for
its BLEU, and prints a Markdown table; also writes OUT/summary.json
(atomically).
"""
import argparse
import json
import os
import sys

import jax
import numpy as np

from specdec_jax import checkpoints
from specdec_jax.core import decoding
from specdec_jax.config import gin_reader
from specdec_jax.files import io_utils
from specdec_jax.metrics import quality as metrics
from specdec_jax.data import tasks
from specdec_jax.data import vocab as vocab_lib
from specdec_jax.core.models import T5Model

REPO = io_utils.GIN_DIR.parent
MODELS = {  # name -> (model dir, model gin file)
    "target": ("target", "models/multi30k_target.gin"),
    "1m": ("draft_1m", "models/multi30k_draft_1m.gin"),
    "4m": ("draft_4m", "models/multi30k_draft_4m.gin"),
    "4m_distill": ("draft_4m_distill", "models/multi30k_draft_4m.gin"),
}


def model_bleu(out_dir, name, sources, references, vocab, max_len=64):
  """Greedy BLEU of one model alone on the given sources."""
  model_dir, gin_file = MODELS[name]
  ckpt = checkpoints.latest_checkpoint(os.path.join(out_dir, model_dir))
  if ckpt is None or not os.path.exists(
      os.path.join(out_dir, model_dir, "train_metrics.json")):
    return None  # not trained, or training not finished
  config = gin_reader.read_t5_config(gin_file)
  params = checkpoints.load_t5x_params(ckpt)
  model = T5Model(config, {"params": params})
  inputs = tasks.encode_batch(vocab, sources, max_len)
  predictions = []
  for lo in range(0, len(inputs), 100):
    chunk = inputs[lo:lo + 100]
    n = len(chunk)
    if n < 100:
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], 100 - n, 0)])
    out = decoding.temperature_sample(model, chunk, jax.random.PRNGKey(0),
                                      max_decode_length=max_len)
    predictions += tasks.decode_tokens(vocab, np.asarray(out.tokens)[:n])
  return {
      "bleu": metrics.bleu(predictions, references),
      "num_params": config.num_params,
      "checkpoint": ckpt
  }


def _load(path):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=str(REPO / "outputs" / "multi30k"))
  parser.add_argument("--data",
                      default=str(REPO.parent / "shared" / "data" / "multi30k"))
  args = parser.parse_args(argv)
  pairs = tasks.read_parallel_text(
      os.path.join(args.data, "test_2016_flickr.en"),
      os.path.join(args.data, "test_2016_flickr.de"))
  sources, references = [p[0] for p in pairs], [p[1] for p in pairs]
  vocab = vocab_lib.get_vocabulary(
      os.path.join(args.out, "spm", "multi30k.model"), extra_ids=0)
  models = {
      name: model_bleu(args.out, name, sources, references, vocab)
      for name in MODELS
  }
  runs = {}
  for name in ("1m", "4m", "4m_distill"):
    for temp in ("0.0", "1.0"):
      folder = os.path.join(args.out, "results", f"{name}_T{temp}")
      runs[f"{name}_T{temp}"] = {
          "metrics": _load(os.path.join(folder, "metrics.json")),
          "alpha": _load(os.path.join(folder, "alpha.json"))
      }
  summary = {"models": models, "runs": runs, "backend": jax.default_backend()}
  io_utils.write_json(os.path.join(args.out, "summary.json"), summary)

  lines = [
      "| draft (params) | draft BLEU | T | α (counts) | α (Cor. 3.6) "
      "| tokens / target call | c | speedup | Thm 3.8 | "
      "BLEU base / spec | greedy identical |",
      "|---|---|---|---|---|---|---|---|---|---|---|"
  ]
  for name in ("1m", "4m", "4m_distill"):
    model = models.get(name)
    for temp in ("0.0", "1.0"):
      m = runs[f"{name}_T{temp}"]["metrics"]
      a = runs[f"{name}_T{temp}"]["alpha"]
      if not m or not model:
        continue
      alpha_s = (f"{a['alpha_beta']:.3f} ± {a['alpha_beta_stderr']:.3f}"
                 if a else "–")
      lines.append(
          f"| {name} ({model['num_params'] / 1e6:.2f}M) | {model['bleu']:.1f} "
          f"| {float(temp):g} | {m['alpha']:.3f} | {alpha_s} "
          f"| {m['tokens_per_target_call']:.2f} | {m['cost_coefficient_c']:.3f}"
          f" | {m['speedup']:.2f}× | {m['theoretical_speedup']:.2f}× "
          f"| {m['bleu']['baseline']:.1f} / {m['bleu']['speculative']:.1f} "
          f"| {'yes' if m['greedy_outputs_identical'] else 'n/a (sampled)' if float(temp) > 0 else 'NO'} |"
      )
  if models.get("target"):
    lines.insert(
        0, f"Target: {models['target']['num_params'] / 1e6:.2f}M "
        f"parameters, greedy BLEU {models['target']['bleu']:.1f} "
        "on test_2016_flickr.\n")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
