r"""Exports a trained feature-level draft as shipped (issue 34).

    python -m tools.export_feature_drafter \
        --model_dir outputs/multi30k/feature_1m \
        --spm pretrained/multi30k/multi30k.model \
        --out pretrained/multi30k/feature_1m

The latest checkpoint of --model_dir (`python -m specdec_jax.train` with
train/multi30k_feature_drafter.gin) is read with `feature_checkpoint.load`,
its parameters cast to --dtype (bfloat16 by default, as the other shipped
drafts; `head_tokens` stays int32) and written in T5X's Orbax layout
(`feature_checkpoint.save`: checkpoint_<step>/ with feature_config.json)
with a DIGESTS.json that loading verifies, recording the SentencePiece
model (--spm) the draft's target was trained with, as the other shipped
checkpoints do (a run refuses another vocabulary). An existing output is
refused.

A cheaper head of the same draft, no retraining: --head_size K keeps the K
most frequent of its head tokens in --train_targets (the training targets,
e.g. ../shared/data/multi30k/train.de; `restrict_head`), --head_rank R
factorises the head to rank R by SVD (`low_rank_head`); with --dtype
float32 the result can seed a run that trains it further
(`train.feature_init_from`).
"""
import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm

from specdec_jax import checkpoints
from specdec_jax.checkpoints import digests
from specdec_jax.checkpoints import feature_draft as feature_checkpoint
from specdec_jax.core.models.feature_drafter import low_rank_head
from specdec_jax.core.models.feature_drafter import restrict_head
from specdec_jax.training.feature_trainer import frequent_tokens


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument(
      "--spm", required=True,
      help="the SentencePiece model the target was trained "
      "with (recorded in DIGESTS.json)")
  parser.add_argument("--dtype", default="bfloat16",
                      choices=("bfloat16", "float16", "float32"))
  parser.add_argument("--head_size", type=int, default=None,
                      help="keep the K most frequent head tokens")
  parser.add_argument(
      "--train_targets", default=None,
      help="the training targets (one per line) that order "
      "the head tokens for --head_size")
  parser.add_argument("--head_rank", type=int, default=None,
                      help="factorise the head to this rank (SVD)")
  args = parser.parse_args(argv)
  if args.head_size is not None and args.train_targets is None:
    parser.error("--head_size needs --train_targets (they order the tokens)")
  if args.train_targets is not None and not os.path.isfile(args.train_targets):
    parser.error(f"--train_targets {args.train_targets}: no such file")
  ckpt = checkpoints.latest_checkpoint(args.model_dir)
  if ckpt is None:
    parser.error(f"--model_dir {args.model_dir}: no checkpoint_<step> in it")
  if os.path.exists(args.out):
    parser.error(f"--out {args.out} exists: remove it by hand to re-export")
  if not os.path.isfile(args.spm):
    parser.error(f"--spm {args.spm}: no such file")
  config, params, head_tokens = feature_checkpoint.load(ckpt)
  if args.head_size is not None:
    if not 1 <= args.head_size <= config.head_size:
      parser.error(f"--head_size {args.head_size}: the head has "
                   f"{config.head_size} tokens")
    sp = spm.SentencePieceProcessor(model_file=args.spm)
    order = frequent_tokens(sp, args.train_targets, config.vocab_size)
    if not np.array_equal(order(config.head_size), head_tokens):
      parser.error(f"--train_targets {args.train_targets}: its most frequent "
                   f"tokens are not {ckpt}'s head: not its training targets")
    config, params, head_tokens = restrict_head(config, params, head_tokens,
                                                order(args.head_size))
  if args.head_rank is not None:
    try:
      config, params = low_rank_head(config, params, args.head_rank)
    except ValueError as e:
      parser.error(f"--head_rank {args.head_rank}: {e}")
  dtype = jnp.dtype(args.dtype)
  params = jax.tree_util.tree_map(lambda x: np.asarray(x).astype(dtype), params)
  step = checkpoints.checkpoint_step(ckpt)
  written = feature_checkpoint.save(args.out, step, params, head_tokens, config)
  digests.write_manifest(written, vocabulary_file=args.spm)
  size = sum(
      os.path.getsize(os.path.join(d, f))
      for d, _, files in os.walk(written)
      for f in files)
  print(f"{ckpt} -> {written} ({size / 2**20:.1f} MiB, {args.dtype})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
