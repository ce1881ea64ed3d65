r"""α and c of a feature-level draft (issue 34) for the shipped 38M target.

    python -m tools.benchmarks.feature_drafter_eval \
        --draft pretrained/multi30k/feature_1m/checkpoint_4000 \
        --num_examples 300 --gamma 3 --out outputs/multi30k/feature_eval.json

α: the speculative loop's α̂ (kept guesses / acceptance trials) over the
first --num_examples validation sentences, at T = 0 and T = 1, with every
T = 0 output checked token for token against the target alone (greedy
identity). Unlike teacher-forced β (MODE='alpha'), this counts the later
guesses, on which the draft reads its own predicted features.

c: the median walltime of one draft step (one position) over one target
step (`decode_chunk` of one token), batch 1, jitted, at decoder position
~10; also the catch-up chunk (γ+1 positions) and, for comparison, the
shipped 1M shared-encoder draft's step. Run on a quiet machine for c.

Cheaper heads (--head_variants, e.g. 2000,1000,4000r32): the trained draft
with its head restricted to the K most frequent target tokens of the
training data (`restrict_head`) and/or factorised to rank r by SVD
(`low_rank_head`), no retraining; for each, α through the loop as above,
the step's measured time and c, and c by bytes (the parameters a step
reads over the target decoder step's: the memory-bound host's c).
"""
import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm

from specdec_jax import checkpoints
from specdec_jax.core import decoding
from specdec_jax.core import drafters
from specdec_jax.config import gin_reader
from specdec_jax.data import tasks
from specdec_jax.core.models import SharedEncoderModel
from specdec_jax.core.models import T5Model
from specdec_jax.core.models.t5 import param_shapes
from specdec_jax.training import checkpointing
from specdec_jax.checkpoints import feature_draft as feature_checkpoint
from specdec_jax.metrics import exactness
from specdec_jax.training.feature_trainer import frequent_tokens
from tools.benchmarks.decode_measure import decoder_param_bytes

TARGET = "pretrained/multi30k/target_38m/checkpoint_1360"
TARGET_GIN = "models/multi30k_target_38m.gin"
SHARED_1M = "pretrained/multi30k/shared_encoder_1m/checkpoint_1800"
DATA = "../shared/data/multi30k"


def load_t5(ckpt: str, config) -> T5Model:
  params = checkpoints.load_t5x_params(ckpt, expected=param_shapes(config),
                                       dtype=jnp.float32)
  return T5Model(config, {"params": params}).prepared_for_decoding()


def alpha(target, drafter, inputs, gamma, batch, eos):
  """{T: α̂, trials, greedy identity} over inputs [N, S]."""
  out = {}
  for temperature in (0.0, 1.0):
    kept = trials = 0
    identity = exactness.GreedyIdentity()
    for i in range(0, len(inputs), batch):
      chunk = inputs[i:i + batch]
      spec = decoding.speculative_sample(target, drafter, chunk,
                                         jax.random.PRNGKey(i), gamma=gamma,
                                         max_decode_length=64,
                                         temperature=temperature, eos_id=eos)
      s = spec.statistics()
      kept += s["alpha_hat"] * s["acceptance_trials"]
      trials += s["acceptance_trials"]
      if temperature == 0.0:
        base = decoding.temperature_sample(target, chunk, jax.random.PRNGKey(0),
                                           max_decode_length=64,
                                           temperature=0.0, eos_id=eos)
        identity.add(base.tokens, spec.tokens)
    out[f"T{temperature:g}"] = {"alpha_hat": kept / trials, "trials": trials}
    if temperature == 0.0:
      same = identity.record()
      out["T0"]["greedy_identical_on_every_sentence"] = (
          same["identical"] == same["examples"])
  return out


def median_seconds(fn, *args, reps=300):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def step_costs(target, draft, shared, inputs, gamma):
  """Median seconds of one target, draft and shared-encoder-draft step."""
  row = inputs[:1]
  t_cache = target.start(row, 80)
  prefix = jnp.asarray([[0, 5, 6, 7, 8, 9, 10, 11, 12, 13]], jnp.int32)
  _, t_cache = target.decode_chunk(prefix, t_cache)
  token = jnp.asarray([[14]], jnp.int32)
  t_step = jax.jit(lambda m, t, c: m.decode_chunk(t, c)[0])
  d_step = jax.jit(lambda m, f, t, c: m.decode_chunk(f, t, c)[:2])
  enc = target.encoder_output(t_cache)
  d_cache = draft.start_from_encoder_output(enc, 80)
  feats = jnp.zeros((1, 10, draft.config.feature_dim), jnp.float32)
  _, _, d_cache = draft.decode_chunk(feats, prefix, d_cache)
  chunk = jnp.zeros((1, gamma + 1), jnp.int32)
  out = {
      "target_step_s": median_seconds(t_step, target, token, t_cache),
      "draft_step_s": median_seconds(d_step, draft, feats[:, :1], token,
                                     d_cache),
      "draft_catch_up_chunk_s": median_seconds(
          d_step, draft, jnp.zeros((1, gamma + 1, draft.config.feature_dim)),
          chunk, d_cache),
  }
  if shared is not None:
    s_cache = shared.start_from_encoder_output(enc, 80)
    _, s_cache = shared.decode_chunk(prefix, s_cache)
    out["shared_encoder_1m_step_s"] = median_seconds(t_step, shared, token,
                                                     s_cache)
  return out


def head_size_costs(target, draft, inputs, sizes):
  """Median seconds of one draft step with other head sizes K (random
  weights of the same shapes: cost only), batch 1, position ~10."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from specdec_jax.core.models.feature_drafter import FeatureDraftModel  # pylint: disable=g-import-not-at-top
  from specdec_jax.core.models.feature_drafter import init_feature_params  # pylint: disable=g-import-not-at-top
  enc = target.encoder_output(target.start(inputs[:1], 80))
  prefix = jnp.asarray([[0, 5, 6, 7, 8, 9, 10, 11, 12, 13]], jnp.int32)
  token = jnp.asarray([[14]], jnp.int32)
  d_step = jax.jit(lambda m, f, t, c: m.decode_chunk(f, t, c)[:2])
  out = {}
  for size in sizes:
    config = dataclasses.replace(draft.config, head_size=size)
    model = FeatureDraftModel.for_target(
        config, init_feature_params(config, jax.random.PRNGKey(0)),
        np.arange(size), target)
    feats = jnp.zeros((1, 10, config.feature_dim), jnp.float32)
    _, _, cache = model.decode_chunk(feats, prefix,
                                     model.start_from_encoder_output(enc, 80))
    out[f"K{size}"] = median_seconds(d_step, model, feats[:, :1], token, cache)
  return out


def parse_variant(text: str, head_size: int):
  """'2000' -> (2000, None); '4000r32' -> (4000, 32)."""
  size, _, rank = text.partition("r")
  size, rank = int(size), (int(rank) if rank else None)
  if not 1 <= size <= head_size:
    raise ValueError(f"--head_variants: {text!r} keeps {size} tokens; the "
                     f"trained head has {head_size}.")
  return size, rank


def _frequency_order(sp, draft, args):
  """K -> the K most frequent of the draft's head tokens in train.de."""
  heads = frequent_tokens(sp, os.path.join(DATA, "train.de"), draft.vocab_size)
  if not np.array_equal(heads(draft.config.head_size), draft.head_tokens):
    raise SystemExit(f"{args.draft}: its head tokens are not train.de's "
                     "most frequent: cannot order them by frequency.")
  return heads


def head_variants(target, plain, draft, variants, heads, inputs, gamma, batch,
                  skip_alpha, skip_cost):
  """{variant: params, c by bytes, and unless skipped α and measured c}."""
  from specdec_jax.core.models.feature_drafter import FeatureDraftModel  # pylint: disable=g-import-not-at-top
  from specdec_jax.core.models.feature_drafter import low_rank_head  # pylint: disable=g-import-not-at-top
  from specdec_jax.core.models.feature_drafter import restrict_head  # pylint: disable=g-import-not-at-top
  target_bytes = decoder_param_bytes(plain.unpacked().params)
  out = {}
  for text in variants:
    size, rank = parse_variant(text, draft.config.head_size)
    config, params, head = restrict_head(draft.config, draft.params,
                                         draft.head_tokens, heads(size))
    if rank is not None:
      config, params = low_rank_head(config, params, rank)
    model = FeatureDraftModel.for_target(config, params, head, target)
    row = {
        "head_size": size,
        "head_rank": rank,
        "step_params": config.step_params,
        "c_bytes": 4 * config.step_params / target_bytes,
    }
    if not skip_alpha:
      row["alpha"] = alpha(target, drafters.FeatureDrafter(model), inputs,
                           gamma, batch, eos=1)
    if not skip_cost:
      costs = step_costs(target, model, None, inputs, gamma)
      row["draft_step_s"] = costs["draft_step_s"]
      row["c"] = costs["draft_step_s"] / costs["target_step_s"]
    out[text] = row
    print(text, json.dumps(row), flush=True)
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--draft", required=True, help="checkpoint_<step> dir")
  parser.add_argument("--num_examples", type=int, default=300)
  parser.add_argument("--gamma", type=int, default=3)
  parser.add_argument("--batch", type=int, default=50)
  parser.add_argument("--skip_alpha", action="store_true")
  parser.add_argument("--skip_cost", action="store_true")
  parser.add_argument("--compare_shared_encoder", action="store_true",
                      help="also α of the shipped 1M shared-encoder draft")
  parser.add_argument("--head_sizes", default="",
                      help="comma-separated head sizes K to price as well")
  parser.add_argument(
      "--head_variants", default="",
      help="comma-separated cheaper heads of the trained "
      "draft: K (its K most frequent tokens) or KrR (and "
      "rank R), e.g. 2000,1000,4000r32")
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  if args.num_examples < 1 or args.gamma < 1 or args.batch < 1:
    parser.error("--num_examples, --gamma and --batch must be >= 1")
  config = gin_reader.read_t5_config(TARGET_GIN,
                                     search_paths=gin_reader.search_paths())
  with checkpointing.quiet_absl():
    plain = load_t5(TARGET, config)
    target = plain.with_features()
    draft = feature_checkpoint.load_draft_model(args.draft, target)
    shared_cfg = checkpointing.read_model_config(
        os.path.join(SHARED_1M, checkpointing.MODEL_CONFIG_FILE))
    shared = SharedEncoderModel.pair(plain, load_t5(SHARED_1M, shared_cfg))
  sp = spm.SentencePieceProcessor(
      model_file="pretrained/multi30k/multi30k.model")
  with open(os.path.join(DATA, "val.en")) as f:
    sources = f.read().splitlines()[:args.num_examples]
  inputs = tasks.encode_batch(sp, sources, 64)
  inputs = inputs[:, :int((inputs > 0).sum(1).max())]
  variants = [v for v in args.head_variants.split(",") if v]
  for v in variants:
    try:
      parse_variant(v, draft.config.head_size)
    except ValueError as e:
      parser.error(str(e))
  result = {
      "draft": args.draft,
      "gamma": args.gamma,
      "num_examples": len(sources),
      "draft_params": draft.config.num_params,
      "draft_step_params": draft.config.step_params
  }
  if not args.skip_alpha:
    result["alpha"] = alpha(target, drafters.FeatureDrafter(draft), inputs,
                            args.gamma, args.batch, eos=1)
    print(json.dumps(result["alpha"]), flush=True)
  if args.compare_shared_encoder:
    result["alpha_shared_encoder_1m"] = alpha(plain,
                                              drafters.ModelDrafter(shared),
                                              inputs, args.gamma, args.batch,
                                              eos=1)
    print(json.dumps(result["alpha_shared_encoder_1m"]), flush=True)
  if not args.skip_cost:
    costs = step_costs(target, draft, shared, inputs, args.gamma)
    costs["c_draft"] = costs["draft_step_s"] / costs["target_step_s"]
    costs["c_shared_encoder_1m"] = (costs["shared_encoder_1m_step_s"] /
                                    costs["target_step_s"])
    if args.head_sizes:
      costs["draft_step_s_by_head_size"] = head_size_costs(
          target, draft, inputs, [int(k) for k in args.head_sizes.split(",")])
    result["cost"] = costs
  if variants:
    result["head_variants"] = head_variants(target, plain, draft, variants,
                                            _frequency_order(sp, draft, args),
                                            inputs, args.gamma, args.batch,
                                            args.skip_alpha, args.skip_cost)
  print(json.dumps(result, indent=1))
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
