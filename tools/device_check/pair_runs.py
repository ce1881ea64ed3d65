"""The shipped main pair as the device check decodes it: its checkpoints,
captions and greedy decoders, the main job's interleaved rounds and what
they measure (`pretrained_pair`, the phase; `gamma_sweep`; `loop`).

What `python -m specdec_jax.run --gin_file=pretrained_multi30k.gin` runs
(the README's main job), without gin, seqio or the run harness (the GPU
image has none of them): the 38M Multi30k target and its distilled 1M
draft from `pretrained/multi30k/` (T5X's Orbax layout, read by
`checkpoints.load_t5x_params`; each model's shapes from the
`model_config.json` its export wrote, which the tests hold to the gin
files), the captions of `configs/data/captions_en_de.tsv` encoded with the
pair's SentencePiece model (ids, then EOS, cut to 64 tokens: as
`tasks.encode_batch`), one caption per batch (run.gin's BATCH_SIZE), γ = 3,
greedy, 48 tokens at most.
"""
import functools
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from specdec_jax import checkpoints
from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.core.models import T5Model
from specdec_jax.files import io_utils
from specdec_jax.metrics import analysis
from specdec_jax.metrics import exactness
from specdec_jax.metrics import overheads
from specdec_jax.metrics import timing
from tools.device_check import common

# gin/pretrained_multi30k.gin's values (tests/tools/test_device_check.py).
PAIR_DIR = io_utils.REPO_DIR / "pretrained" / "multi30k"
TARGET_DIR = PAIR_DIR / "target_38m"
DRAFT_DIR = PAIR_DIR / "draft_1m_distill_38m"
SPM_MODEL = PAIR_DIR / "multi30k.model"
SOURCE_FILE = io_utils.REPO_DIR / "configs" / "data" / "captions_en_de.tsv"
GAMMA = 3
EOS_ID = 1


def load_model(directory: os.PathLike,
               path: Optional[str] = None) -> Tuple[T5Model, str]:
  """(the model in `directory`'s latest checkpoint, prepared for decoding
  on `path` (None: the backend's); the checkpoint's path)."""
  ckpt = checkpoints.latest_checkpoint(str(directory)) or str(directory)
  return (checkpoints.load_model(ckpt,
                                 prepared=False).prepared_for_decoding(path),
          ckpt)


def encode_captions(count: int, input_length: int) -> np.ndarray:
  """[count, input_length] int32: the first `count` captions' ids + EOS."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  processor = spm.SentencePieceProcessor()
  processor.LoadFromSerializedProto(SPM_MODEL.read_bytes())
  with open(SOURCE_FILE, encoding="utf-8") as f:
    sources = [line.split("\t")[0] for line in f if line.strip()]
  out = np.zeros((count, input_length), np.int32)
  for i, text in enumerate(sources[:count]):
    ids = list(processor.EncodeAsIds(text))[:input_length - 1] + [EOS_ID]
    out[i, :len(ids)] = ids
  return out


def baseline(target, max_len: int):
  """The target alone's greedy decoder, as the main job runs it."""
  return decoding.baseline_decoder(target, max_decode_length=max_len,
                                   method=sampling.Greedy(), eos_id=EOS_ID)


def speculative(target, draft, max_len: int, gamma: int = GAMMA):
  """The speculative greedy decoder, as the main job runs it (at γ)."""
  return decoding.speculative_decoder(target, draft, gamma=gamma,
                                      max_decode_length=max_len,
                                      method=sampling.Greedy(), eos_id=EOS_ID)


def decode_all(decode, batches: Sequence[np.ndarray]) -> List[Any]:
  rng = jax.random.PRNGKey(0)
  return jax.block_until_ready([decode(b, rng) for b in batches])


def identity(base: Sequence[Any], spec: Sequence[Any]) -> Dict[str, Any]:
  """Each caption's tokens in `spec` (decode outputs) against `base`'s
  (`exactness.GreedyIdentity`'s record)."""
  tally = exactness.GreedyIdentity()
  for a, b in zip(base, spec):
    tally.add(a.tokens, b.tokens)
  return tally.record()


def statistics(outputs: Sequence[Any]) -> Dict[str, float]:
  """α̂ and tokens per call over all captions' speculative outputs."""
  runs = [o.statistics() for o in outputs]
  kept = sum(
      sum(k * n for k, n in enumerate(r["accepted_histogram"])) for r in runs)
  trials = sum(r["acceptance_trials"] for r in runs)
  tokens = sum(r["tokens_generated"] for r in runs)
  calls = sum(r["target_calls"] for r in runs)
  return {
      "alpha": kept / max(trials, 1),
      "tokens_per_target_call": tokens / max(calls, 1),
      "tokens_generated": tokens,
  }


def batch_factor(base: Sequence[Any], spec: Sequence[Any]) -> float:
  """`overheads.batch_factor` of one round of each decoder's outputs (a
  batch each, every row a caption): what waiting for a batch's slowest row
  costs the speedup, 1 at batch 1."""

  def calls_and_iterations(outputs):
    calls = [np.asarray(o.target_calls) for o in outputs]
    return sum(int(c.sum()) for c in calls), sum(int(c.max()) for c in calls)

  calls_base, iterations_base = calls_and_iterations(base)
  calls_spec, iterations_spec = calls_and_iterations(spec)
  return overheads.batch_factor(calls_base, calls_spec, iterations_base,
                                iterations_spec)


def free_loop(job: Dict[str, Any]) -> Dict[str, float]:
  """A main job's record's (`pretrained_pair.main_job`) `free_loop_speedup`:
  Theorem 3.8 at the measured call cost times what no loop changes, its
  tokens a call over Equation (1)'s (the captions' sentence ends and the
  draft's acceptance) and `batch_factor`: what the job would reach if its
  loop cost nothing beyond its model calls; and `loop_share`, the speedup
  over it (metrics.json's `efficiency_split` `time`)."""
  alpha = min(max(job["alpha"], 0.0), 1.0)
  iid = float(analysis.expected_tokens_per_iteration(alpha, job["gamma"]))
  bound = (job["theorem_3_8_with_call_cost"] * job["tokens_per_target_call"] /
           iid * job["batch_factor"])
  return {"free_loop_speedup": bound, "loop_share": job["speedup"] / bound}


def priced_calls(s: common.Settings, tokens_per_caption: float,
                 gamma: int = GAMMA) -> Tuple[int, int]:
  """(fill, cache_len) of the model calls `main_job` prices and
  `_target_calls` profiles: a cache filled to the captions' mean output
  length (at least 1, short of the decode's last slot), with the
  speculative loop's slots at γ."""
  return (min(max(1, int(tokens_per_caption)),
              s.max_decode_length - 1), s.max_decode_length + gamma + 1)


def call_seconds(s: common.Settings, target, draft,
                 batches: Sequence[np.ndarray], tokens_generated: int,
                 gammas: Sequence[int]) -> Dict[str, float]:
  """Seconds of a target step ('target'), a draft step ('draft') and each
  γ's (γ+1)-token call ('verify_<γ+1>'), priced in one set of rounds
  (`timing.call_seconds`) at the main job's fill (`priced_calls`, the
  largest γ's slots) after `tokens_generated` tokens over `batches`."""
  fill, cache_len = priced_calls(s, tokens_generated / len(batches),
                                 max(gammas))
  return timing.call_seconds(
      {
          "target": (target, 1),
          "draft": (draft, 1),
          **{
              f"verify_{g + 1}": (target, g + 1) for g in gammas
          }
      }, batches[0], fill=fill, cache_len=cache_len, steps=4 * s.inner_steps,
      repeats=s.repeats + 2)


def theorem_3_8(alpha: float, gamma: int,
                seconds: Dict[str, float]) -> Dict[str, float]:
  """γ, c, the (γ+1)-token call's cost in target steps and Theorem 3.8
  without and with it, at `alpha` (clipped to [0, 1]) and `call_seconds`'
  `seconds`."""
  alpha = min(max(alpha, 0.0), 1.0)
  c = seconds["draft"] / seconds["target"]
  call_cost = seconds[f"verify_{gamma + 1}"] / seconds["target"]
  return {
      "gamma": gamma,
      "c": c,
      "verification_call_cost": call_cost,
      "theorem_3_8": float(analysis.expected_speedup(alpha, gamma, c)),
      "theorem_3_8_with_call_cost": float(
          analysis.expected_speedup(alpha, gamma, c, call_cost=call_cost)),
  }


def interleaved(
    decoders: Dict[str, Any], batches: Sequence[np.ndarray], rounds: int,
    deadline: common.Deadline
) -> Tuple[Dict[str, List[float]], Dict[str, List[Any]]]:
  """Every caption decoded by each decoder once per round, the decoders'
  order rotated each round, compilation excluded (one untimed caption
  each first): ({name: seconds per round}, {name: the last round's
  outputs}). Stops early when another round would not fit `deadline`
  (`timing.InterleavedTimer`)."""
  timer = timing.InterleavedTimer(rounds, log=lambda _: None, rotate=True)
  times, outs = timer(
      {
          name: functools.partial(decode_round, decode, batches)
          for name, decode in decoders.items()
      }, keep=list(decoders), allows=deadline.allows)
  return ({
      name: [float(x) for x in t] for name, t in times.items()
  }, {
      name: o[-1] for name, o in outs.items()
  })


def decode_round(decode, batches: Sequence[np.ndarray], r: int) -> List[Any]:
  """Round r's outputs: every caption; the warm-up's (r -1), the first
  (it compiles the one input shape)."""
  return decode_all(decode, batches[:1] if r < 0 else batches)


def batched(inputs: np.ndarray, size: int) -> List[np.ndarray]:
  """Consecutive batches of `size` captions (a last partial batch left
  out: one shape, one compiled program)."""
  return [inputs[i:i + size] for i in range(0, len(inputs) - size + 1, size)]
