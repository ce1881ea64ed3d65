"""The benchmark's settings: `BenchmarkConfig`, checked by `validate`.

Every setting arrives as text (a flag) or as a value (a Python caller) and is
checked here once, before any model is built or compiled: a bad one raises
`BenchmarkFlagError` naming the flag, the value and what is allowed.
"""
import dataclasses
import math
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp

from specdec_jax import checkpoints
from specdec_jax.config import flag_utils
from specdec_jax.config import gin_reader
from specdec_jax.config import paths
from specdec_jax.core.models import T5Model
from specdec_jax.core.models import param_shapes
from specdec_jax.core.models.config import T5Config

# Size names of --target/--draft -> model gin files (under gin/): the T5 v1.1
# sizes (T5X's t5_1_1/*.gin hyperparameters) plus small test/CPU configs.
MODEL_SIZES: Dict[str, str] = {
    "tiny": "models/bench_tiny.gin",  # Tests only.
    "mini": "models/bench_mini.gin",  # Tests only.
    "xsmall": "models/bench_xsmall.gin",  # A draft for small (CPU).
    **{
        size: f"models/t5_1_1_{size}.gin" for size in ("small", "base", "large", "xl", "xxl")
    },
}

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class BenchmarkFlagError(flag_utils.ConfigError):
  """A bad flag value; the message names the flag, the value and what is allowed."""


def flag_error(flag: str, value: Any, allowed: str) -> BenchmarkFlagError:
  return BenchmarkFlagError(
      f"--{flag}: invalid value {value!r} (allowed: {allowed}).")


@dataclasses.dataclass
class BenchmarkConfig:
  """Validated benchmark settings (see `cli` for their meaning).

  Built by `validate`, whose keyword defaults are the benchmark's defaults
  (the flags' too): this class has none.
  """
  target: str
  draft: str
  target_config: T5Config
  draft_config: T5Config
  alphas: Tuple[float, ...]
  gammas: Tuple[int, ...]
  chunk_sizes: Tuple[int, ...]  # Always includes 1.
  batch_size: int
  input_length: int
  max_decode_length: int
  fill_length: int
  repeats: int
  inner_steps: int
  temperature: float
  dtype: str
  device_bandwidth_gbps: Optional[float]
  output: Optional[str]
  seed: int
  check_greedy_identity: bool
  warnings: Tuple[str, ...]


def default_dtype() -> str:
  """bfloat16 on accelerators, float32 on CPU."""
  return "float32" if jax.default_backend() == "cpu" else "bfloat16"


# ---------------------------------------------------------------------------
# Models: a size name or a gin file.
# ---------------------------------------------------------------------------
def resolve_model_config(spec: str,
                         flag: str) -> Tuple[T5Config, str, List[str]]:
  """A size name or a gin file path -> (config, label, warnings).

  The file is read by `gin_reader.read_t5_config_for_role` under the `flag`
  scope ('target' or 'draft'), without gin's global configuration.
  """
  if spec in MODEL_SIZES:
    path = paths.GIN_DIR / MODEL_SIZES[spec]
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


# ---------------------------------------------------------------------------
# Values.
# ---------------------------------------------------------------------------
def _parse_list(flag: str, value: Any, kind: Callable[[str], Any], allowed: str,
                check: Callable[[Any], bool]) -> Tuple:
  """A comma-separated list (or a list) -> tuple, deduplicated in order."""
  text = (",".join(
      str(v) for v in value) if isinstance(value,
                                           (list, tuple)) else str(value))
  items = [s.strip() for s in text.split(",")]
  if any(not s for s in items):
    raise flag_error(flag, text, allowed)
  values = []
  for s in items:
    try:
      v = kind(s)
    except ValueError:
      raise flag_error(flag, s, allowed) from None
    if not check(v):
      raise flag_error(flag, s, allowed)
    values.append(v)
  return tuple(dict.fromkeys(values))


def _parse_int(flag: str, text: Any, minimum: int,
               allowed: Optional[str] = None) -> int:
  allowed = allowed or f"an integer >= {minimum}"
  try:
    v = int(str(text).strip())
  except ValueError:
    raise flag_error(flag, text, allowed) from None
  if v < minimum:
    raise flag_error(flag, text, allowed)
  return v


def _parse_float(flag: str, text: Any, minimum: float, strict: bool,
                 unit: str = "") -> float:
  """A finite number >= minimum (> minimum if `strict`)."""
  allowed = f"a finite number {'>' if strict else '>='} {minimum:g}{unit}"
  try:
    v = float(text)
  except (TypeError, ValueError):
    raise flag_error(flag, text, allowed) from None
  if math.isinf(v) or not (v > minimum if strict else v >= minimum):
    raise flag_error(flag, text, allowed)
  return v


def _parse_fill(fill_length: Any, max_decode_length: int) -> int:
  if fill_length is None:
    return max_decode_length // 2
  allowed = (f"an integer in [0, max_decode_length - 1 = "
             f"{max_decode_length - 1}]")
  fill = _parse_int("fill_length", fill_length, 0, allowed)
  if fill >= max_decode_length:
    raise flag_error("fill_length", fill_length, allowed)
  return fill


def _check_output(output: Optional[str]) -> Optional[str]:
  if output and not os.path.isdir(os.path.dirname(os.path.abspath(output))):
    raise flag_error("output", output, "a file path in an existing directory")
  return output or None


def _model_pair(target: str, draft: str,
                dtype: str) -> Tuple[T5Config, str, T5Config, str, List[str]]:
  """Both models' configs in `dtype`; the draft must share the vocabulary."""
  target_config, target_label, w1 = resolve_model_config(target, "target")
  draft_config, draft_label, w2 = resolve_model_config(draft, "draft")
  if draft_config.vocab_size != target_config.vocab_size:
    raise BenchmarkFlagError(
        f"--draft: {draft!r} has vocab_size {draft_config.vocab_size} but "
        f"--target {target!r} has {target_config.vocab_size} (allowed: a "
        "draft with the target's vocabulary).")
  return (target_config.replace(dtype=DTYPES[dtype]), target_label,
          draft_config.replace(dtype=DTYPES[dtype]), draft_label, w1 + w2)


def validate(*, target="small", draft="xsmall", alphas="0.5,0.75,0.9",
             gammas="1,3,5,7", chunk_sizes="1,2,4,8,16", batch_size=1,
             input_length=64, max_decode_length=64, fill_length=None, repeats=5,
             inner_steps=8, temperature=0.0, dtype=None,
             device_bandwidth_gbps=None, seed=0, output="benchmark.json",
             check_greedy_identity=False) -> BenchmarkConfig:
  """Checks every setting (strings or values) and returns a BenchmarkConfig.

  Its keyword defaults are the benchmark's (`cli` shows them as the flags'
  defaults). `fill_length` None: max_decode_length // 2; `dtype` None:
  `default_dtype()`.

  Raises:
    BenchmarkFlagError naming the flag, the bad value and what is allowed.
  """
  ints = "comma-separated integers >= 1"
  alphas = _parse_list("alphas", alphas, float,
                       "comma-separated numbers in [0, 1]",
                       lambda a: 0.0 <= a <= 1.0)
  gammas = _parse_list("gammas", gammas, int, ints, lambda g: g >= 1)
  ks = _parse_list("chunk_sizes", chunk_sizes, int, ints, lambda k: k >= 1)
  max_decode_length = _parse_int("max_decode_length", max_decode_length, 1)
  dtype = default_dtype() if dtype is None else dtype
  if dtype not in DTYPES:
    raise flag_error("dtype", dtype, ", ".join(DTYPES))
  if device_bandwidth_gbps is not None:
    device_bandwidth_gbps = _parse_float("device_bandwidth_gbps",
                                         device_bandwidth_gbps, 0.0,
                                         strict=True, unit=" (GB/s)")
  settings = dict(
      alphas=alphas, gammas=gammas, chunk_sizes=tuple(sorted(set(ks) | {1})),
      batch_size=_parse_int("batch_size", batch_size, 1),
      input_length=_parse_int("input_length", input_length,
                              1), max_decode_length=max_decode_length,
      fill_length=_parse_fill(fill_length, max_decode_length),
      repeats=_parse_int("repeats", repeats,
                         1), inner_steps=_parse_int("inner_steps", inner_steps,
                                                    1),
      seed=_parse_int("seed", seed,
                      0), temperature=_parse_float("temperature", temperature,
                                                   0.0,
                                                   strict=False), dtype=dtype,
      device_bandwidth_gbps=device_bandwidth_gbps, output=_check_output(output),
      check_greedy_identity=bool(check_greedy_identity))
  (target_config, target_label, draft_config, draft_label,
   warnings) = _model_pair(target, draft, dtype)
  return BenchmarkConfig(target=target_label, draft=draft_label,
                         target_config=target_config, draft_config=draft_config,
                         warnings=tuple(warnings), **settings)


# -- pretrained ----------------------------------------------------------------
# A trained checkpoint loaded for decoding, as the benchmarks use it.
#
# `benchmarking.loop_overhead`, `tree`, `beam` and `scripts/iteration_hlo.py`
# read checkpoints such as those in `pretrained/` outside `run` (no RunPlan,
# no vocabulary checks).
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
