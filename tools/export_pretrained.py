r"""Exports trained Multi30k models as the small pair shipped with the repository.

    python -m tools.export_pretrained \
        --model target=outputs/multi30k/target \
        --model draft_1m=outputs/multi30k/draft_1m \
        --spm outputs/multi30k/spm/multi30k.model --out pretrained/multi30k

Each model directory's latest checkpoint (written by `python -m
specdec_jax.train`) is read with the project's T5X loader, cast to
--dtype (bfloat16 by default: half the bytes, and the models are decoded in
float32 after loading, as `run` does), and written with
`checkpoints.save_params` in T5X's Orbax layout to <out>/<name>/checkpoint_<step>,
so the main job exercises the same loader as a T5X checkpoint. The
SentencePiece model is copied to <out>/. Each checkpoint gets a DIGESTS.json
(SHA-256 of every file, `checkpoints.digests`), which loading verifies. Existing outputs are refused (the
shipped pair is committed once; delete it by hand to re-export).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints
from specdec_jax.checkpoints import digests


def _parse_model(text: str):
  name, sep, path = text.partition("=")
  if not sep or not name or not path:
    raise argparse.ArgumentTypeError(
        f"--model must be NAME=MODEL_DIR, got {text!r}")
  return name, path


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", type=_parse_model, action="append",
                      required=True, help="NAME=MODEL_DIR (repeatable)")
  parser.add_argument("--spm", required=True,
                      help="SentencePiece model shared by the models")
  parser.add_argument("--out", required=True, help="output directory")
  parser.add_argument("--dtype", default="bfloat16",
                      choices=("bfloat16", "float16", "float32"))
  args = parser.parse_args(argv)

  # Every input is checked before anything is written.
  latest = {}
  for name, model_dir in args.model:
    ckpt = checkpoints.latest_checkpoint(model_dir)
    if ckpt is None:
      parser.error(f"--model {name}={model_dir}: no checkpoint_<step> in it")
    if os.path.exists(os.path.join(args.out, name)):
      parser.error(f"{os.path.join(args.out, name)} exists: the shipped pair "
                   "is exported once; remove it by hand to re-export")
    latest[name] = ckpt
  if not os.path.isfile(args.spm):
    parser.error(f"--spm {args.spm}: no such file")

  dtype = jnp.dtype(args.dtype)
  os.makedirs(args.out, exist_ok=True)
  for name, ckpt in latest.items():
    params = checkpoints.load_t5x_params(ckpt)
    params = jax.tree_util.tree_map(lambda x: np.asarray(x).astype(dtype),
                                    params)
    step = int(os.path.basename(os.path.normpath(ckpt)).split("_")[-1])
    written = checkpoints.save_params(params, os.path.join(args.out, name),
                                      step=step)
    config = os.path.join(ckpt, "model_config.json")
    if os.path.isfile(config):  # The trainer's record of the architecture.
      shutil.copy(config, os.path.join(written, "model_config.json"))
    # Verified on loading; the vocabulary too (a run refuses another one).
    digests.write_manifest(written, vocabulary_file=args.spm)
    size = sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, files in os.walk(written)
        for f in files)
    print(f"{name}: {ckpt} -> {written} ({size / 2**20:.1f} MiB, "
          f"{args.dtype})")
  spm_out = os.path.join(args.out, os.path.basename(args.spm))
  with tempfile.NamedTemporaryFile(dir=args.out, delete=False) as tmp:
    shutil.copyfileobj(open(args.spm, "rb"), tmp)
  os.replace(tmp.name, spm_out)
  print(f"vocabulary: {args.spm} -> {spm_out}")
  manifest = {name: os.path.relpath(ckpt) for name, ckpt in latest.items()}
  print(json.dumps({"exported_from": manifest}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
