"""What the benchmarks share: their models, their sentences, the host.

* Models: a size name (`MODEL_SIZES`) or a gin file binding T5Config
  (`resolve_model_config`, read without gin's global configuration), and a
  trained checkpoint loaded for decoding outside `run` (`load_for_decoding`:
  no RunPlan, no vocabulary checks).
* A trained pair and real sentences on the command line (`add_pair_flags`,
  `check_pair_flags`, `sentences`: `loop_overhead`, `tree`).
* `median_seconds`: medians of interleaved rounds, compilation excluded.
* `host`: the machine beside the numbers.
"""
import argparse
import os
import platform
import statistics
import subprocess
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax.numpy as jnp
import numpy as np

from specdec_jax.config import flag_utils
from specdec_jax import checkpoints
from specdec_jax.config import gin_reader
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import param_shapes
from specdec_jax.core.models.config import T5Config
from specdec_jax.files import io_utils
from specdec_jax.metrics import timing

REPO = io_utils.REPO_DIR
PRETRAINED = REPO / "pretrained" / "multi30k"
CAPTIONS = REPO / "configs" / "data" / "captions_en_de.tsv"

# Size names of --target/--draft -> model gin files (under gin/): the T5 v1.1
# sizes (T5X's t5_1_1/*.gin hyperparameters) plus small test/CPU configs.
T5_1_1_SIZES = ("small", "base", "large", "xl", "xxl")
MODEL_SIZES: Dict[str, str] = {
    "tiny": "models/bench_tiny.gin",  # Tests only.
    "mini": "models/bench_mini.gin",  # Tests only.
    "xsmall": "models/bench_xsmall.gin",  # A draft for small (CPU).
    **{
        size: f"models/t5_1_1_{size}.gin" for size in T5_1_1_SIZES
    },
}

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class BenchmarkFlagError(flag_utils.ConfigError):
  """A bad flag value; the message names the flag, the value and what is
  allowed."""


def flag_error(flag: str, value: Any, allowed: str) -> BenchmarkFlagError:
  return BenchmarkFlagError(
      f"--{flag}: invalid value {value!r} (allowed: {allowed}).")


# ---------------------------------------------------------------------------
# Models.
# ---------------------------------------------------------------------------
def resolve_model_config(spec: str,
                         flag: str) -> Tuple[T5Config, str, List[str]]:
  """A size name or a gin file path -> (config, label, warnings).

  The file is read by `gin_reader.read_t5_config_for_role` under the `flag`
  scope ('target' or 'draft'), without gin's global configuration.
  """
  if spec in MODEL_SIZES:
    path = io_utils.GIN_DIR / MODEL_SIZES[spec]
  elif not (spec.endswith(".gin") or os.sep in spec):
    raise flag_error(
        flag, spec, "one of " + ", ".join(MODEL_SIZES) +
        ", or the path of a gin file binding T5Config")
  elif not os.path.isfile(spec):
    raise flag_error(flag, spec,
                     "an existing gin file or one of " + ", ".join(MODEL_SIZES))
  else:
    path = spec
  try:
    config, scope = gin_reader.read_t5_config_for_role(path, role=flag)
  except ValueError as e:
    raise flag_error(flag, spec, f"a gin file binding T5Config; {e}") from None
  warnings = []
  if scope != flag:
    warnings.append(f"--{flag}: {spec}: T5Config is bound under the "
                    f"{scope}/ scope only; using it")
  return config, spec, warnings


def load_for_decoding(path: str, gin_file: str) -> T5Model:
  """The model `gin_file` binds (a T5Config), with the latest checkpoint in
  `path` (or `path` itself), in the config's dtype, prepared for decoding
  (`T5Model.prepared_for_decoding`)."""
  config = gin_reader.read_t5_config(gin_file)
  ckpt = checkpoints.latest_checkpoint(path) or path
  params = checkpoints.load_t5x_params(ckpt,
                                       expected=param_shapes(config)["params"],
                                       dtype=config.dtype)
  return T5Model(config, {"params": params}).prepared_for_decoding()


# ---------------------------------------------------------------------------
# A trained pair and real sentences (loop_overhead, tree).
# ---------------------------------------------------------------------------
def add_pair_flags(parser: argparse.ArgumentParser, *, target: str,
                   target_gin: str, draft: str, sentences: int, gamma: int,
                   rounds: int) -> None:
  """The pair (checkpoint folders under pretrained/multi30k and their gin
  files), its vocabulary, the sentences, γ, the rounds and --output."""
  add = parser.add_argument
  add("--target", default=str(PRETRAINED / target),
      help="target checkpoint (dir)")
  add("--target_gin", default=target_gin, help="target model gin file")
  add("--draft", default=str(PRETRAINED / draft), help="draft checkpoint (dir)")
  add("--draft_gin", default="models/multi30k_draft_1m.gin",
      help="draft model gin file")
  add("--spm_model", default=str(PRETRAINED / "multi30k.model"),
      help="SentencePiece model of both")
  add("--source_file", default=str(CAPTIONS),
      help="sentences: one per line (text before a tab is the input)")
  add("--sentences", type=int, default=sentences,
      help="sentences decoded (>= 1)")
  add("--gamma", type=int, default=gamma, help="draft guesses per iteration γ")
  add("--rounds", type=int, default=rounds, help="interleaved timing rounds")
  add("--output", default=None, help="write the results as JSON")


def check_pair_flags(
    parser: argparse.ArgumentParser, args: argparse.Namespace,
    positive: Tuple[str, ...] = ()) -> None:
  """`parser.error` (one line, exit 2) on a count < 1 or a missing file."""
  for name in ("sentences", "gamma", "rounds") + positive:
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
  for name in ("target", "draft", "spm_model", "source_file"):
    if not os.path.exists(getattr(args, name)):
      parser.error(f"--{name}: {getattr(args, name)} does not exist.")


def pad_to_bucket(ids: List[int], bucket: int) -> np.ndarray:
  """[1, S'] int32: a sentence's token ids (EOS included) padded with 0 to
  S' = the next multiple of `bucket` (the encoder masks 0s), as `run` pads
  its batches, so that sentences of different lengths share one compiled
  program."""
  width = -(-len(ids) // bucket) * bucket
  return np.asarray([list(ids) + [0] * (width - len(ids))], np.int32)


def sentences(args: argparse.Namespace, bucket: int = 1) -> List[np.ndarray]:
  """[--sentences] arrays [1, S] of encoded sentences (EOS appended),
  padded by `pad_to_bucket`. (`vocab` imports gin: imported here, so
  that the device check, on an image without gin, can import the
  benchmarks' measuring functions.)"""
  from specdec_jax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  vocab = vocab_lib.load_vocabulary(args.spm_model, extra_ids=0,
                                    what="--spm_model")
  with open(args.source_file, encoding="utf-8") as f:
    lines = [l.split("\t")[0].strip() for l in f if l.strip()]
  return [
      pad_to_bucket(vocab.encode(l) + [1], bucket)
      for l in lines[:args.sentences]
  ]


# ---------------------------------------------------------------------------
# Timing and the host.
# ---------------------------------------------------------------------------
def median_seconds(fns: Dict[Any, Callable[[], Any]],
                   rounds: int) -> Tuple[Dict[Any, float], Dict[Any, Any]]:
  """({name: median seconds}, {name: last output}) over interleaved rounds
  (`timing.InterleavedTimer`: compiled by its warm-up, the order rotated
  per round)."""
  timer = timing.InterleavedTimer(rounds, log=lambda _: None, rotate=True)
  times, outs = timer({
      name: (lambda r, fn=fn: fn()) for name, fn in fns.items()
  }, keep=list(fns))
  return ({
      name: float(statistics.median(t)) for name, t in times.items()
  }, {
      name: out[-1] for name, out in outs.items()
  })


def write_result(output: Optional[str], result: Any) -> None:
  """`result` as JSON in `output` (atomically: `io_utils.write_json`) and a
  line saying so; nothing without an `output`."""
  if output:
    io_utils.write_json(output, result)
    print(f"wrote {output}")


def host() -> Dict[str, Any]:
  """The machine: its name, CPUs, load average, and where lscpu runs its
  processor's kind (vendor, family, model, stepping: a model name alone,
  "AMD EPYC", names a Zen 3 and a Zen 4 alike), whether it has AVX-512 and
  its L3 cache."""
  info: Dict[str, Any] = {
      "host": platform.node(),
      "cpu_count": os.cpu_count(),
      "load_average": list(os.getloadavg()),
  }
  try:
    lines = subprocess.run(["lscpu"], capture_output=True, text=True,
                           check=True, timeout=30).stdout.splitlines()
  except (OSError, subprocess.SubprocessError):
    return info
  for line in lines:
    key, _, value = line.partition(":")
    if key.strip() in _LSCPU_KEYS:
      info[key.strip()] = value.strip()
    elif key.strip() == "Flags":
      info["AVX-512"] = "avx512f" in value.split()
  return info


_LSCPU_KEYS = ("Vendor ID", "CPU family", "Model", "Model name", "Stepping",
               "L3 cache")
