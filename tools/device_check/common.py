"""What every phase of the device check shares: settings, models, records.

`Settings` holds the check's sizes; `FULL` (a GPU) and `SMALL` (the same
steps at tiny shapes, for a CPU) are the two presets. `t5_size` gives the
T5 v1.1 shapes of `gin/models/t5_1_1_*.gin` without reading gin (the GPU
image has no gin-config; `tests/benchmarks/test_device_check.py` holds the two
together). `device_params` builds random weights on the device in their
storage dtype, leaf by leaf, so that an XXL target (11B parameters, 22 GB in
bfloat16) is never materialised in float32 nor read from disk. `Recorder`
writes a phase's JSON after every step, so a phase killed at its time cap
leaves what it had measured.
"""
import dataclasses
import functools
import math
import sys
import time
import traceback
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core.kernels import gpu
from specdec_jax.core.kernels import gpu_tiles
from specdec_jax.core.models import T5Config
from specdec_jax.core.models import param_shapes
from specdec_jax.files import io_utils

# The new measurements of issue 56 (exactness on the backend's decode path,
# the paths side by side, the main job on each, the loop's own cost per
# iteration) before the paper's physics, which takes what is left of the
# budget: the physics was measured on an H200 already (2026-11-28), the
# loop's cost never.
PHASES = ("env", "exactness", "paths", "pretrained", "loop", "physics")
# A phase with less than this left is skipped (`cli`; default 15 s): the
# loop phase's split compiles 9 programs per path before it times one.
MIN_PHASE_S = {"loop": 30.0}
# The paths phase's groups (`paths`), in the order they run.
PATHS_GROUPS = ("steps", "profile", "barriers", "tiles", "option_sets",
                "kernels")
# The pretrained phase's groups after its identity, the target's tokens
# against 'xla' and the main job, in the order they run; each writes the
# record `main_job_<group>` (`pretrained_pair`).
PRETRAINED_GROUPS = ("profile", "by_gamma", "by_mixed_paths", "by_options",
                     "by_tiles", "by_path")

# T5 v1.1 shapes (T5X's t5_1_1/*.gin; the repository's gin/models copies).
_T5_1_1 = {
    "small": dict(emb_dim=512, num_heads=6, num_encoder_layers=8,
                  num_decoder_layers=8, mlp_dim=1024),
    "base": dict(emb_dim=768, num_heads=12, num_encoder_layers=12,
                 num_decoder_layers=12, mlp_dim=2048),
    "large": dict(emb_dim=1024, num_heads=16, num_encoder_layers=24,
                  num_decoder_layers=24, mlp_dim=2816),
    "xl": dict(emb_dim=2048, num_heads=32, num_encoder_layers=24,
               num_decoder_layers=24, mlp_dim=5120),
    "xxl": dict(emb_dim=4096, num_heads=64, num_encoder_layers=24,
                num_decoder_layers=24, mlp_dim=10240),
}
# `SMALL`'s stand-ins at shapes a CPU compiles in a second: a deeper
# target; the three drafts share one shape (one compiled program).
_TINY_DRAFT = dict(emb_dim=16, num_heads=2, num_encoder_layers=1,
                   num_decoder_layers=1, mlp_dim=32)
_TINY = {
    "xxl": dict(emb_dim=32, num_heads=2, num_encoder_layers=1,
                num_decoder_layers=2, mlp_dim=64),
    "small": _TINY_DRAFT,
    "base": _TINY_DRAFT,
    "large": _TINY_DRAFT,
}


def t5_size(name: str, dtype: Any = jnp.bfloat16,
            tiny: bool = False) -> T5Config:
  """The T5 v1.1 config `name` (small .. xxl), or its tiny stand-in."""
  table = _TINY if tiny else _T5_1_1
  if name not in table:
    raise ValueError(f"model size {name!r}: allowed: {', '.join(table)}.")
  return T5Config(vocab_size=128 if tiny else 32128, dtype=dtype,
                  head_dim=8 if tiny else 64,
                  mlp_activations=("gelu", "linear"), dropout_rate=0.0,
                  logits_via_embedding=False, **table[name])


@dataclasses.dataclass(frozen=True)
class Settings:
  """The check's sizes (see `FULL` and `SMALL`).

  Attributes:
    mode: 'full' or 'small'.
    total_s: the whole check's wall-clock budget (all phases).
    caps_s: phase -> its time cap in seconds (physics: what is left).
    vocab, layers, chi_steps, chi_samples: the exactness phase's tiny
      models' vocabulary and encoder/decoder layers, the generated tokens
      compared, samples per decoder.
    temperature, wrong_factor: the sampling temperature of the chi-square
      test, and the factor of the deliberately wrong target's (power check).
    significance: a chi-square test fails below this p-value.
    gamma, tree_width, beam_size: the modes' draft length, tree branches,
      beams.
    greedy_rows, greedy_length: the greedy identity's batch and length.
    examples, max_decode_length, input_length, rounds: the shipped pair's
      captions, generated and input tokens, timed rounds.
    tiny_physics: the physics phase's stand-in shapes (`t5_size`).
    target, drafts: the physics phase's model sizes.
    chunk_sizes, tree_widths, tree_gamma, beam_gamma, beam_rows: the calls
      priced (K tokens; k branches of γ; the speculative-beam call over
      `beam_rows` rows of γ+1 tokens against beam search's `beam_size`
      rows of 1).
    physics_input_length, fill, cache_len, inner_steps, repeats: how a
      call is timed (`timing.call_loop`).
    decode_path: the decode path every phase decodes on (`T5Model.
      prepared_for_decoding`; None: the backend's; `checked_path`: 'fused'
      on one GPU).
    paths: the decode paths the `paths` phase and the main job compare.
    main_job_batches: the main job's batch sizes, each on every path.
    loop_sentences, loop_lengths, loop_rounds: the loop phase's split
      (`loop_overhead.programs`): sentences, the two forced lengths,
      interleaved rounds.
    paths_groups: the groups of `PATHS_GROUPS` the paths phase measures.
    pretrained_groups: the groups of `PRETRAINED_GROUPS` the pretrained
      phase measures after its main job.
    barrier_passes, barrier_programs: the `barriers` group's barriers a
      kernel and its numbers of programs.
    option_sets, tile_presets: the XLA:GPU option sets
      (`kernels.gpu.GPU_OPTION_SETS`) and the fused kernels' tiles
      (`kernels.gpu_tiles.TILE_PRESETS`) the `paths` phase times;
      tile_call_presets: those whose target's `max(chunk_sizes)`-token
      call it times too (tensor cores or not); main_job_tiles: those the
      pretrained phase's identity and main job run under too ('fused'; a
      preset, or 'target's+draft's').
    main_job_mixed_paths: (target's path, draft's path) pairs the
      pretrained phase's identity and main job run on too (batch 1).
    main_job_option_sets: the XLA:GPU option sets the pretrained phase's
      main job (batch 1) compiles its loops under too, interleaved with
      the library's own (`GPU_LOOP_OPTIONS`).
    main_job_gammas, main_job_trees, main_job_drafts,
      main_job_gamma_paths: the γ, the trees (k branches, γ) and the
      shipped drafts (folders of `pretrained/multi30k/`) the pretrained
      phase's main job (batch 1) runs at and with too, in one set of
      interleaved rounds, on the pair (target's path, draft's path)
      (`gamma_sweep`).
  """
  mode: str
  total_s: float
  caps_s: Mapping[str, float]
  vocab: int = 8
  layers: int = 2
  chi_steps: int = 3
  chi_samples: int = 16384
  temperature: float = 1.0
  wrong_factor: float = 0.9
  significance: float = 1e-3
  gamma: int = 3
  tree_width: int = 2
  beam_size: int = 4
  greedy_rows: int = 16
  greedy_length: int = 16
  examples: int = 60
  max_decode_length: int = 48
  input_length: int = 64
  rounds: int = 5
  tiny_physics: bool = False
  target: str = "xxl"
  drafts: Tuple[str, ...] = ("small", "base", "large")
  chunk_sizes: Tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
  tree_widths: Tuple[int, ...] = (2, 3, 4)
  tree_gamma: int = 3
  beam_gamma: int = 3
  beam_rows: int = 8
  physics_input_length: int = 64
  fill: int = 32
  cache_len: int = 128
  inner_steps: int = 8
  repeats: int = 5
  decode_path: Optional[str] = None
  paths: Tuple[str, ...] = ("xla", "packed", "fused")
  main_job_batches: Tuple[int, ...] = (1, 8)
  loop_sentences: int = 4
  loop_lengths: Tuple[int, int] = (8, 40)
  loop_rounds: int = 5
  # Not the option sets: on an H200 no set moved a step by 5% on any path
  # (2026-11-28 and 2026-11-29); `--paths_groups` still names them.
  paths_groups: Tuple[str, ...] = ("steps", "profile", "barriers", "tiles",
                                   "kernels")
  pretrained_groups: Tuple[str, ...] = PRETRAINED_GROUPS
  # The `barriers` group's kernels: stages apart by barriers, over each
  # number of programs ('_persistent' presets: 128).
  barrier_passes: int = 64
  barrier_programs: Tuple[int, ...] = (8, 128)
  option_sets: Tuple[str, ...] = tuple(gpu.GPU_OPTION_SETS)
  # Tensor cores with pipelined loads and the attention projections over
  # many programs (_split: the check's, then more bytes in flight a
  # program, deep_ and tall_), then without the split (mma, tall_mma),
  # CUDA cores' chains of dependent loads (default, tall_wide) and a small
  # model's layers in three kernels, not six (_fold: the T5-small draft's;
  # not XXL's): docs/design/performance.md. In this order: the group
  # compiles them while its deadline allows (the first is the reference).
  # The '_persistent' presets next: the only ones whose launches are few
  # enough for issue 56's 0.10 ms (`Tiles.programs`; '_prefetch': the
  # weights' loads in flight while a program waits, `Tiles.prefetch`;
  # '_fold': 6 stages a layer, not 8, `Tiles.fold_outputs`).
  tile_presets: Tuple[str, ...] = ("mma_split", "mma_split_attention",
                                   "mma_persistent", "tall_mma_persistent",
                                   "tall_mma_persistent_prefetch",
                                   "tall_mma_persistent_prefetch_fold",
                                   "deep_mma_split", "tall_mma_split", "mma",
                                   "tall_mma", "default", "tall_wide",
                                   "mma_fold", "tall_mma_fold")
  tile_call_presets: Tuple[str, ...] = ("mma_split", "mma_split_attention",
                                        "mma_persistent",
                                        "tall_mma_persistent_prefetch",
                                        "tall_mma_persistent_prefetch_fold",
                                        "deep_mma_split", "tall_mma_split",
                                        "mma", "default", "mma_fold")
  # Deeper blocks (capped for the pair's float32 weights: `Tiles.
  # for_weights`), and the shipped draft's two 184 KB layers as one kernel
  # (`Tiles.layer_bytes`; their 6 a layer cost launches, not bytes): the
  # pretrained phase's identity and main job under them too, beside the
  # check's tiles'. Not 'mma' (1.49x on the H200, 2026-11-29, as
  # 'mma_split' on -30), nor 'mma_layer_fold' (the target's 12 MB layers
  # in three kernels too: 1.15x, 2026-11-29). In order: the '_persistent'
  # presets (the draft's step one layers kernel over 128 programs, the
  # target's 8: `Tiles.programs`); the target's 4-token call with its
  # attentions' rows together ('mma_split_attention': the call cost 1.30
  # steps on 'fused', 1.09 on 'xla'); the target on those tiles or the
  # check's and the draft persistent (`tiles_pair`; '_fold': 6 barriers a
  # layer); then deeper blocks and a layer a kernel.
  main_job_tiles: Tuple[str, ...] = (
      "mma_persistent", "tall_mma_persistent_prefetch", "mma_split_attention",
      "mma_split+tall_mma_persistent_prefetch",
      "mma_split_attention+tall_mma_persistent_prefetch_fold", "tall_mma_split",
      "mma_layer")
  # (target's path, draft's path): on the H200 the shipped target's step
  # was fastest on 'xla' (0.411 ms; 'fused' 0.440-0.478) and its draft's
  # on 'fused' (0.051-0.063 ms; 'xla' 0.076) (2026-11-29, 2026-11-30).
  main_job_mixed_paths: Tuple[Tuple[str, str],
                              ...] = (("packed", "fused"), ("xla", "fused"))
  # The decode loops' while in a CUDA graph (WHILE, CONDITIONAL): its test
  # then stays on the GPU, not read back by the host every iteration (the
  # step loops of `paths` showed no change at 0.5 ms a step; an iteration
  # of the fused path's ~50 kernels is about 0.1 ms).
  main_job_option_sets: Tuple[str, ...] = ("command_buffer_all",)
  # The main job's γ 3 was the CPU's choice; on the H200 (c 0.115, the
  # 4-token call 1.09 steps on 'xla') Theorem 3.8 grows up to γ 7, and an
  # XXL-shaped tree call cost 1.01-1.05 steps (`gamma_sweep`). On the
  # first mixed pair: the one its steps favour.
  main_job_gammas: Tuple[int, ...] = (3, 4, 5, 7)
  main_job_trees: Tuple[Tuple[int, int], ...] = ((2, 3), (2, 4))
  # A 1M draft's GPU step is bound by launches, not bytes: the highest α
  # wins, and a shared-encoder draft skips an encoder (1.5 MiB: the
  # device call still fits 64 MiB, `travel.NEEDED`).
  main_job_drafts: Tuple[str, ...] = ("shared_encoder_1m",)
  main_job_gamma_paths: Tuple[str, str] = ("packed", "fused")


FULL = Settings(
    mode="full",
    total_s=450.0,
    caps_s={
        "env": 60.0,
        "exactness": 180.0,
        "paths": 200.0,
        "pretrained": 180.0,
        # On the H200 compiling the split's programs on 'fused' alone took
        # more than 83 s (2026-11-29).
        "loop": 200.0,
        "physics": 300.0
    })
# Caps with room for a loaded 2-core machine compiling everything afresh
# (the fused kernels run in Pallas' interpret mode on a CPU: slow): about
# four times each phase's time on a quiet one (259 s in all, 2026-11-30).
# Twice was not enough: beside one other test process the paths phase
# took 229 s of its 240 (2026-12-01); under the suite's two workers the
# CI's run failed a check (most likely a step skipped at its cap).
# The main job at batch 1 only: a batch of 2 ran the same code at
# another shape (the kernels at several rows: tests/core/test_gpu_decode.py)
# and cost 'fused' half its phase in interpret mode.
SMALL = dataclasses.replace(
    FULL, mode="small", total_s=1500.0, layers=1, chi_samples=8192, caps_s={
        "env": 60.0,
        "exactness": 360.0,
        "paths": 480.0,
        "pretrained": 400.0,
        "loop": 240.0,
        "physics": 140.0
    }, greedy_rows=4, greedy_length=8, examples=3, max_decode_length=12,
    rounds=2, tiny_physics=True, chunk_sizes=(1, 2, 4), tree_widths=(2,),
    physics_input_length=8, fill=4, cache_len=24, inner_steps=2, repeats=2,
    main_job_batches=(1,), loop_sentences=1, loop_lengths=(2, 10),
    loop_rounds=2, paths_groups=PATHS_GROUPS,
    option_sets=("default", "command_buffer_all"), barrier_passes=4,
    barrier_programs=(2, 4), tile_presets=("default", "mma", "mma_split",
                                           "mma_persistent"),
    tile_call_presets=("default", "mma", "mma_split", "mma_persistent"),
    main_job_tiles=("mma_layer_fold", "mma_split+mma_persistent"),
    main_job_mixed_paths=(("packed", "fused"),), main_job_gammas=(3,),
    main_job_trees=((2, 3),))


def settings_for(
    mode: str, decode_path: Optional[str] = None,
    paths_groups: Optional[Tuple[str, ...]] = None,
    tile_presets: Optional[Tuple[str, ...]] = None,
    pretrained_groups: Optional[Tuple[str, ...]] = None) -> Settings:
  """The mode's preset, decoding on `decode_path` (None: `checked_path`),
  its paths phase measuring `paths_groups` and timing the steps and the
  target's K-token calls under `tile_presets`, its pretrained phase
  measuring `pretrained_groups` (None: the preset's)."""
  if mode not in ("full", "small"):
    raise ValueError(f"mode {mode!r}: allowed: full, small.")
  preset = FULL if mode == "full" else SMALL
  for name in preset.main_job_tiles:
    tiles_pair(name)  # A bad name fails here, before any phase runs.
  return dataclasses.replace(
      preset, decode_path=decode_path or checked_path(),
      paths_groups=paths_groups or preset.paths_groups,
      tile_presets=tile_presets or preset.tile_presets,
      tile_call_presets=tile_presets or preset.tile_call_presets,
      pretrained_groups=pretrained_groups or preset.pretrained_groups)


# The GPU kernels' tile preset the check decodes with when --tiles names
# none: the candidate, which a user's 'fused' takes only once a check has
# shown it exact and faster (`kernels.gpu_tiles.Tiles()` is the CUDA cores':
# --tiles=default). 'mma' (tensor cores, pipelined loads) ran exact on the
# H200 but slower than XLA's path (2026-11-29); the grids' model fitted to
# it (`tools.benchmarks.kernel_grid`) prices this one 0.45 ms a T5-small
# step against 'mma''s 0.58, and the shipped float32 target 0.69 against
# 1.01. 'tall_mma_split' it prices faster still (its 512-1024 deep
# blocks, sized for bfloat16, are capped for float32 weights:
# `Tiles.for_weights`); the next run times both (`--tile_presets`).
CHECKED_TILES = "mma_split"


def tiles_pair(name: str) -> Tuple[gpu_tiles.Tiles, gpu_tiles.Tiles]:
  """(the target's tiles, the draft's) of a `main_job_tiles` entry: a
  preset of `gpu_tiles.TILE_PRESETS` for both, or 'target's+draft's'.

  Raises:
    ValueError: a name that is no preset.
  """
  names = name.split("+")
  if len(names) > 2 or any(n not in gpu_tiles.TILE_PRESETS for n in names):
    raise ValueError(
        f"main_job_tiles: {name!r}; allowed: a preset or 'target's+draft's', "
        f"each one of {', '.join(gpu_tiles.TILE_PRESETS)}.")
  return (gpu_tiles.TILE_PRESETS[names[0]], gpu_tiles.TILE_PRESETS[names[-1]])


def checked_path() -> Optional[str]:
  """The path the check decodes on when --path names none: 'fused' on one
  GPU (the kernels a user's run takes only once a check has shown them
  compiled and exact there: `decode_paths.default_path` gives 'packed'),
  elsewhere the backend's (None)."""
  if jax.default_backend() == "gpu" and jax.device_count() == 1:
    return "fused"
  return None


# ---------------------------------------------------------------------------
# Random weights on the device.
# ---------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("shape", "dtype", "std"))
def _normal(key, *, shape, dtype, std):
  # Drawn in float32 (a bfloat16 draw can round onto erf_inv's pole).
  return (jax.random.normal(key, shape, jnp.float32) * std).astype(dtype)


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def _ones(*, shape, dtype):
  return jnp.ones(shape, dtype)


def leaf_std(name: str, shape: Tuple[int, ...]) -> float:
  """T5X-like scales: a kernel [in, out] N(0, 1/in); embeddings N(0, 1)."""
  if name == "kernel":
    return 1.0 / math.sqrt(shape[0])
  if name == "rel_embedding":
    return 0.1
  return 1.0


def device_params(config: T5Config, seed: int, dtype: Any) -> Dict[str, Any]:
  """Random parameters in T5X's layout, made on the default device.

  Leaf by leaf in `dtype` (one small program per distinct shape), so the
  peak memory is the parameters themselves: a T5-XXL in bfloat16 is 22 GB.
  Layer-norm scales are ones.

  Returns:
    {'params': tree}, as `T5Model` takes it.
  """
  shapes = param_shapes(config)["params"]
  flat = {
      tuple(k.key for k in path): leaf for path, leaf in
      jax.tree_util.tree_flatten_with_path(shapes)[0]
  }
  key = jax.random.PRNGKey(seed)
  out: Dict[str, Any] = {}
  for i, (path, leaf) in enumerate(sorted(flat.items())):
    shape = tuple(leaf.shape)
    if path[-1] == "scale":
      value = _ones(shape=shape, dtype=dtype)
    else:
      value = _normal(jax.random.fold_in(key, i), shape=shape, dtype=dtype,
                      std=leaf_std(path[-1], shape))
    node = out
    for name in path[:-1]:
      node = node.setdefault(name, {})
    node[path[-1]] = value
  return {"params": out}


def param_bytes(tree: Any) -> int:
  return int(
      sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree)))


# ---------------------------------------------------------------------------
# Records and progress.
# ---------------------------------------------------------------------------
def log(message: str) -> None:
  """One progress line on stderr (the log the run brings back)."""
  print(f"[device_check] {message}", file=sys.stderr, flush=True)


def as_json(value: Any) -> Any:
  """NumPy and JAX scalars/arrays -> Python numbers and lists."""
  if isinstance(value, dict):
    return {str(k): as_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [as_json(v) for v in value]
  if isinstance(value, (np.ndarray, jax.Array)):
    return as_json(np.asarray(value).tolist())
  if isinstance(value, np.bool_):
    return bool(value)
  if isinstance(value, np.integer):
    return int(value)
  if isinstance(value, np.floating):
    return float(value)
  return value


class Recorder:
  """A phase's result, written to `path` (atomically) at every `set`."""

  def __init__(self, path: Optional[str]):
    self.path = path
    self.data: Dict[str, Any] = {}
    self.start = time.perf_counter()

  def set(self, key: str, value: Any) -> None:
    self.data[key] = as_json(value)
    self.data["seconds"] = time.perf_counter() - self.start
    if self.path:
      io_utils.write_json(self.path, self.data)


class SettingsError(ValueError):
  """A setting this backend cannot honour (one line: what, why, the fix)."""


def guarded(step: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
  """step(), or {'ok': False, 'error': its exception in one line}: one
  failing step (a mode, a group of calls) leaves the others to run."""
  try:
    return step()
  except Exception as e:  # pylint: disable=broad-except
    first = str(e).splitlines()[0] if str(e) else ""
    log(f"error: {type(e).__name__}: {first}")
    traceback.print_exc()
    return {"ok": False, "error": f"{type(e).__name__}: {first}"}


def at_highest_if_needed(check: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
  """A greedy identity `check()` (`exactness.greedy_identity`'s record) at
  the default matmul precision and, if some examples differ, again at
  'highest' (a GPU may multiply float32 in TF32): {'default_precision',
  'highest_precision' (when run), 'all_identical' (at the last)}."""
  result = {"default_precision": check()}
  last = result["default_precision"]
  if last["identical"] != last["examples"]:
    with jax.default_matmul_precision("highest"):
      result["highest_precision"] = last = check()
  result["all_identical"] = last["identical"] == last["examples"]
  return result


class Deadline:
  """A phase's time cap, checked between its steps (the parent kills a
  phase that overruns it inside a step)."""

  def __init__(self, seconds: float):
    self.end = time.perf_counter() + seconds

  def left(self) -> float:
    return self.end - time.perf_counter()

  def allows(self, seconds: float) -> bool:
    """Whether a step expected to take `seconds` fits in what is left."""
    return self.left() > seconds
