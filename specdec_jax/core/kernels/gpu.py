"""GPU decode kernels: a decoder layer in 6 kernels (Pallas, Triton backend).

On a GPU a batch-1 decoder step is launch-bound, not memory-bound: XLA
compiles every matrix-vector product as a multiply fusion writing a
weight-sized product plus a reduce fusion, ~26 kernels a T5 decoder layer
at ~2 µs each (the H200 run of 2026-11-28). These kernels compute a
layer's three sublayers in two kernels each:

* `self_attention`: RMS norm + q/k/v (one packed weight [H, 3, E, D]) +
  the chunk's keys/values written into the cache in place + attention over
  the cache (online softmax over blocks of slots), each block's bias
  built from T5's learned biases (`SelfBias`); one program per (row of
  the batch, head);
* `cross_attention`: RMS norm + q + attention over the encoder's cached
  keys/values, masked with the encoder's padding;
* `rms_dense`: RMS norm + the product with one or more weights, each
  through its activation, multiplied (the gated-GELU MLP's input side;
  with one linear weight, the final norm + logits);
* `dense_residual`: residual + x @ w (every output projection).

With `Tiles.split_heads` the attention kernels' projections are a kernel
of their own (`head_projections`) over many more programs: 8 a layer.
A kernel's programs cannot exchange a row without atomics (whose float
sums would depend on the programs' order) or a grid-wide barrier (Triton
has none), so each sublayer ends where the next one needs a whole row: 6
kernels a layer. `gpu_layers` runs a layer in fewer: a small one in one
program per row (`Tiles.layer_bytes`), the same over many programs
apart by barriers built of an integer atomic counter (`Tiles.programs`,
`_gpu_grid`), or one kernel a sublayer with the output projections as
partial sums (`Tiles.fold_bytes`).

Every row is computed by the same operations on the same shapes whatever
the number of rows in the call, and masked cache slots add exact zeros to
the online softmax, so a row of a K-token call is bit-identical to the
one-token call at that position (as the CPU kernel's rows are): greedy
speculative decoding and the greedy baseline agree exactly through these
kernels, not only within rounding. Arithmetic is float32 inside a kernel;
its outputs are rounded to the model's dtype where XLA's path rounds them.

The kernels' bodies share `_gpu_pieces`: the RMS-normed projections,
summed on CUDA cores or (`Tiles.dot`) one tensor-core dot per block on
rows in tiles of 16, and the attention over a cache.

Pallas' Triton lowering needs every array in a kernel to have a power-of-2
size: weights and activations are read in blocks that are powers of 2
dividing the dimension (`block`), cache and encoder slots in blocks whose
tail is masked; only `head_dim` itself must be a power of 2 (`supported`).
Off a GPU the same kernels run in Pallas' interpret mode (`interpret`):
slow, for tests; `lowering_for_gpu` lowers them for Triton on a CPU (a
test lowers a whole decoder for CUDA that way). The block sizes and
warps are `gpu_tiles`' (`tiles` overrides them for a measurement);
`pallas_call` and the block helpers are what `gpu_layers` builds its
kernels with.

`GPU_OPTION_SETS` are the XLA:GPU compiler options the device check
measures per program (`tools/device_check`); `GPU_LOOP_OPTIONS` is what
the decode loops get on a GPU (`decoding.programs.LoopProgram`): none
until a set is measured faster.
"""
import contextlib
import contextvars
import functools
from typing import (Any, Callable, ContextManager, Dict, Iterator, List,
                    Optional, Sequence, Tuple)

import jax
import jax.numpy as jnp

from specdec_jax.core import structs
from specdec_jax.core.kernels import _gpu_bodies as _bodies
from specdec_jax.core.kernels import _gpu_pieces as _pieces
from specdec_jax.core.kernels import gpu_tiles

Array = jax.Array
F32 = _pieces.F32
# The custom call a Pallas Triton kernel lowers to (what the device check
# and the tests count).
TRITON_CALL = "__gpu$xla.gpu.triton"

# XLA:GPU options (DebugOptions fields this jaxlib accepts as per-program
# compiler options: tests/core/test_gpu_decode.py compiles each on the
# CPU, which parses the same fields). `xla_gpu_enable_dot_strength_reduction`,
# the pass behind the multiply + reduce fusions, is no longer an option
# (a reserved field name since jaxlib 0.10): these are what can still move
# the batch-1 products and the launches.
GPU_OPTION_SETS: Dict[str, Dict[str, Any]] = {
    "default": {},
    # Command buffers (CUDA graphs) for the Pallas kernels and the loops'
    # control flow too (XLA's default set leaves some out).
    "command_buffer_all": {
        "xla_gpu_enable_command_buffer": ",".join(
            ("FUSION", "CUBLAS", "CUBLASLT", "CUSTOM_CALL", "WHILE",
             "CONDITIONAL"))
    },
    "graph_min_size_1": {
        "xla_gpu_graph_min_graph_size": 1
    },
    # Dots to cuBLAS rather than Triton GEMM fusions (the logits' product).
    "no_triton_gemm": {
        "xla_gpu_enable_triton_gemm": False
    },
    # Every dot a GEMM call, however small (no loop fusion of small dots).
    "gemm_rewrite_all": {
        "xla_gpu_gemm_rewrite_size_threshold": 0
    },
    "no_dot_merger": {
        "xla_gpu_dot_merger_threshold_mb": 0
    },
}
GPU_LOOP_OPTIONS: Dict[str, Any] = dict(GPU_OPTION_SETS["default"])

_INTERPRET: contextvars.ContextVar[Optional[bool]] = contextvars.ContextVar(
    "specdec_jax_gpu_interpret", default=None)


def interpret() -> bool:
  """Whether kernels traced now run in Pallas' interpret mode: off a GPU,
  unless `lowering_for_gpu` says otherwise."""
  forced = _INTERPRET.get()
  return jax.default_backend() != "gpu" if forced is None else forced


# The GPU a program lowered here without one is for (the device check's).
LOWERING_GPU_KIND = "NVIDIA H200"


@contextlib.contextmanager
def lowering_for_gpu(device_kind: str = LOWERING_GPU_KIND) -> Iterator[None]:
  """Within it, kernels trace for Triton even on a CPU (to lower a program
  for CUDA here: `jax.jit(f).trace(...)` then
  `.lower(lowering_platforms=('cuda',))`), for a GPU of `device_kind`
  where none is here."""
  token = _INTERPRET.set(False)
  try:
    with _abstract_gpu(device_kind):
      yield
  finally:
    _INTERPRET.reset(token)


def _abstract_gpu(device_kind: str) -> ContextManager[Any]:
  """Off a GPU, an abstract mesh with no axes (it shards nothing) whose
  device is a GPU of `device_kind`: JAX >= 0.11's Triton lowering reads
  the GPU from it (older JAX assumed compute capability 9.0)."""
  if jax.default_backend() == "gpu":
    return contextlib.nullcontext()
  device = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=None,
                                       platform="gpu")
  return jax.sharding.use_abstract_mesh(
      jax.sharding.AbstractMesh((), (), abstract_device=device))


def block(n: int, cap: int) -> int:
  """The largest power of 2 that divides n and is at most cap."""
  size = 1
  while size * 2 <= cap and n % (size * 2) == 0:
    size *= 2
  return size


def one_kernel_layer(weight_bytes: int) -> bool:
  """Whether a decoder layer of `weight_bytes` runs as one kernel
  (`Tiles.layer_bytes`)."""
  return 0 < weight_bytes <= gpu_tiles.current_tiles().layer_bytes


def layer_runs(weight_bytes: Sequence[int]) -> List[range]:
  """A decoder's layers (their weights' bytes, in order) as runs of
  consecutive layers: the longest runs whose weights together fit
  `Tiles.layer_bytes`, each one kernel (`gpu_layers.decoder_layers`),
  and every other layer a run of its own."""
  runs: List[range] = []
  total = 0
  for i, size in enumerate(weight_bytes):
    if runs and one_kernel_layer(total + size):
      runs[-1] = range(runs[-1].start, i + 1)
      total += size
    else:
      runs.append(range(i, i + 1))
      total = size
  return runs


def one_kernel_run(run_bytes: int) -> bool:
  """Whether a run of decoder layers (`layer_runs`) whose weights take
  `run_bytes` runs as one kernel (`gpu_layers.decoder_layers`): it fits
  `Tiles.layer_bytes`, or `Tiles.programs` spreads a layer of any size
  over the GPU."""
  return one_kernel_layer(run_bytes) or (run_bytes > 0 and
                                         gpu_tiles.current_tiles().programs > 0)


def folded_layer(weight_bytes: int) -> bool:
  """Whether a decoder layer of `weight_bytes` runs as three kernels
  (`Tiles.fold_bytes`; a layer of one kernel is not folded)."""
  return (not one_kernel_run(weight_bytes) and
          0 < weight_bytes <= gpu_tiles.current_tiles().fold_bytes)


def pow2_at_least(n: int) -> int:
  size = 1
  while size < n:
    size *= 2
  return size


def supported(head_dim: int) -> Optional[str]:
  """None if the kernels take a model of this head width, else why not."""
  if head_dim & (head_dim - 1):
    return (f"head_dim={head_dim} is not a power of 2 (a head's keys are one "
            "block in the Triton kernels)")
  return None


def pallas_call(kernel: Callable, out_specs: Any, in_specs: Sequence[Any],
                grid: Tuple[int, ...], name: str,
                aliases: Optional[dict] = None) -> Callable:
  """A pallas_call of `kernel`: out_specs and in_specs are (shape,
  dtype-or-None, block, index map) tuples (block: `BlockSpec`'s, None for
  a squeezed axis). Each program gets its rows' and head's block, so that
  interpret mode copies blocks, not whole arrays, per program."""
  pl, plgpu = _pieces.pallas()
  t = gpu_tiles.current_tiles()
  outs = [
      jax.ShapeDtypeStruct(shape, dtype) for shape, dtype, _, _ in out_specs
  ]
  return pl.pallas_call(
      kernel, out_shape=tuple(outs), grid=grid,
      in_specs=[pl.BlockSpec(block, index) for block, index in in_specs],
      out_specs=tuple(
          pl.BlockSpec(block, index) for _, _, block, index in out_specs),
      input_output_aliases=aliases or {}, interpret=interpret(),
      compiler_params=plgpu.CompilerParams(num_warps=t.num_warps,
                                           num_stages=t.num_stages), name=name)


def whole_block(shape: Sequence[int]) -> Tuple[Tuple[int, ...], Callable]:
  """A block spec giving every program the whole array."""
  zeros = (0,) * len(shape)
  return tuple(shape), lambda *_: zeros


# ---------------------------------------------------------------------------
# The kernels.
# ---------------------------------------------------------------------------
def head_projections(x: Array, scale: Array, w: Array, *,
                     eps: float = 1e-6) -> Array:
  """RMSnorm(x) @ w[h, p] for every head h and part p (`Tiles.
  split_heads`): x [B, K, E], w [H, P, E, D] -> [B, K, H, P, D] in x's
  dtype, one program per (row of the batch, head and part, block of
  columns). The attention kernels' `project` computes the same."""
  batch, rows, emb = x.shape
  heads, parts, _, head_dim = w.shape
  t = gpu_tiles.current_tiles()
  cols = block(head_dim, t.columns)
  kernel = functools.partial(_bodies.head_projection_kernel,
                             eb=block(emb, t.emb_block), eps=eps, dot=t.dot)
  call = pallas_call(
      kernel, out_specs=[((batch, rows, heads, parts, head_dim), x.dtype,
                          (None, rows, None, None, cols), lambda b, hp, c:
                          (b, 0, hp // parts, hp % parts, c))], in_specs=[
                              ((None, rows, emb), lambda b, hp, c: (b, 0, 0)),
                              whole_block(scale.shape),
                              ((None, 1, emb, cols), lambda b, hp, c:
                               (hp // parts, hp % parts, 0, c))
                          ], grid=(batch, heads * parts, head_dim // cols),
      name="decode_head_projection")
  return call(x, scale, w)[0]


@structs.dataclass
class SelfBias:
  """A chunk's self-attention bias, as the attention kernels build it for
  each block of cache slots they read, from T5's learned bias per bucket
  and its static bucket table (rather than read as a [B, H, K, L] array:
  XLA's kernels making one would cost launches on every call).

  Slot j < start (the cache) is seen by chunk token m at position
  q = start + offsets[m] with embedding[h, buckets[j - q + L - 1]]; the
  chunk's own slot start + c with embedding[h, buckets[offsets[c] -
  offsets[m] + L - 1]] where visible[m, c]; every other slot -1e10; each
  value rounded to `dtype`: XLA's path's bias, value for value.

  Attributes:
    embedding: [H, buckets] the decoder's relative-position biases (T5's
      rel_embedding, in its parameters' dtype).
    buckets: [2L - 1] int32: the bucket of a key r = key - query positions
      away at r + L - 1 (`layers.bucket_table`; L: the cache's slots).
    offsets: [B or 1, K] int32, each chunk token's position minus start;
      None: a chain, 0..K-1.
    visible: [B or 1, K, K] bool (or int), where chunk token m sees c;
      None: a chain's, c <= m.
    dtype: the model's, which the biases are rounded to.
  """
  embedding: Array
  buckets: Array
  offsets: Optional[Array] = None
  visible: Optional[Array] = None
  dtype: Any = structs.field(pytree_node=False, default=jnp.float32)

  @property
  def form(self) -> _bodies.BiasForm:
    """What the kernels' bodies read it as."""
    return _bodies.BiasForm(chain=self.offsets is None, dtype=self.dtype)


def self_bias_inputs(bias: SelfBias, per_head: bool):
  """(arrays, block specs) of a self-attention kernel's `SelfBias`, for a
  grid over (row of the batch, head) or (`per_head` False) rows alone:
  then each program reads every head's biases."""
  num_buckets = bias.embedding.shape[1]
  specs: List[Any]
  if per_head:
    specs = [((None, num_buckets), lambda b, h: (h, 0))]
  else:
    specs = [whole_block(bias.embedding.shape)]
  specs.append(whole_block(bias.buckets.shape))
  # The biases as they are: a bfloat16 model's are widened in the kernel
  # (converted here, an XLA kernel on every call).
  arrays: List[Any] = [bias.embedding, bias.buckets.astype(jnp.int32)]
  if bias.offsets is not None:
    one = bias.offsets.shape[0] == 1
    k = bias.offsets.shape[-1]

    def row(b):
      return 0 if one else b

    specs += [((None, k), lambda b, *_: (row(b), 0)),
              ((None, k, k), lambda b, *_: (row(b), 0, 0))]
    arrays += [
        bias.offsets.astype(jnp.int32),
        jnp.asarray(bias.visible, jnp.int32)
    ]
  return arrays, specs


def _head_inputs(x: Array, scale: Array, w: Array, eps: float):
  """(arrays, block specs) an attention kernel reads its head's
  projections from: x, the norm's scale and the head's weights, or with
  `Tiles.split_heads` their `head_projections` [B, K, H, P, D]."""
  batch, rows, emb = x.shape
  _, parts, _, head_dim = w.shape
  if gpu_tiles.current_tiles().split_heads:
    return [head_projections(x, scale, w, eps=eps)], [
        ((None, rows, None, parts, head_dim), lambda b, h: (b, 0, h, 0, 0))
    ]
  return [x, scale, w], [((None, rows, emb), lambda b, h: (b, 0, 0)),
                         whole_block(scale.shape),
                         ((None, parts, emb, head_dim), lambda b, h:
                          (h, 0, 0, 0))]


def self_attention(x: Array, scale: Array, wqkv: Array, keys: Array,
                   values: Array, start: Array, bias: SelfBias, *,
                   eps: float = 1e-6) -> Tuple[Array, Array, Array]:
  """A decoder chunk's self-attention up to (not including) the output
  projection, its keys/values written into the cache in place.

  Args:
    x: [B, K, E] the layer's input (the residual stream).
    scale: [E] the pre-attention RMS norm's scale.
    wqkv: [H, 3, E, D] query, key and value kernels, per head.
    keys, values: [B, H, D, L] the layer's cache (on a GPU donated: written in
      place at slots start..start+K-1).
    start: [B] int32 the rows' cache lengths before the chunk.
    bias: the relative positions and masks of every slot for each chunk
      token, the chunk's own slots included (`SelfBias`).

  Returns:
    (context [B, K, H, D] in x's dtype, keys, values).
  """
  batch, rows, emb = x.shape
  heads, _, _, head_dim = wqkv.shape
  length = keys.shape[-1]
  t = gpu_tiles.current_tiles()
  kernel = functools.partial(_bodies.self_attention_kernel, bias=bias.form,
                             rows=rows, eb=block(emb, t.emb_block),
                             lb=min(t.slots, pow2_at_least(length)), eps=eps,
                             on_gpu=not interpret(), dot=t.dot,
                             split=t.split_heads, attention_dot=t.dot and
                             t.attention_dot)
  heads_in, heads_specs = _head_inputs(x, scale, wqkv, eps)
  bias_in, bias_specs = self_bias_inputs(bias, per_head=True)
  cached = 1 + len(heads_in) + len(bias_in)  # keys' and values' places
  cache = ((None, None, head_dim, length), lambda b, h: (b, h, 0, 0))
  call = pallas_call(
      kernel, out_specs=[((batch, rows, heads, head_dim), x.dtype,
                          (None, rows, None, head_dim), lambda b, h:
                          (b, 0, h, 0)), (keys.shape, keys.dtype) + cache,
                         (values.shape, values.dtype) + cache],
      in_specs=[((1,), lambda b, h: (b,)), *heads_specs, *bias_specs, cache,
                cache], grid=(batch, heads), name="decode_self_attention",
      aliases=None if interpret() else {
          cached: 1,
          cached + 1: 2
      })
  return call(start.astype(jnp.int32), *heads_in, *bias_in, keys, values)


def cross_attention(x: Array, scale: Array, wq: Array, keys: Array,
                    values: Array, encoder_valid: Array, *,
                    eps: float = 1e-6) -> Array:
  """Encoder-decoder attention up to the output projection.

  Args:
    x: [B, K, E]; scale: [E] the pre-cross-attention norm's scale.
    wq: [H, 1, E, D] the query kernel, per head.
    keys, values: [B, H, D, S] the encoder's keys/values (the cache's).
    encoder_valid: [B, S] bool, False at encoder padding (masked in the
      kernel: no XLA kernel makes a bias of it per call).

  Returns:
    [B, K, H, D] in x's dtype.
  """
  batch, rows, emb = x.shape
  heads, _, _, head_dim = wq.shape
  length = keys.shape[-1]
  t = gpu_tiles.current_tiles()
  kernel = functools.partial(_bodies.cross_attention_kernel, rows=rows,
                             eb=block(emb, t.emb_block),
                             lb=min(t.slots, pow2_at_least(length)), eps=eps,
                             dot=t.dot, split=t.split_heads,
                             attention_dot=t.dot and t.attention_dot)
  heads_in, heads_specs = _head_inputs(x, scale, wq, eps)
  encoded = ((None, None, head_dim, length), lambda b, h: (b, h, 0, 0))
  call = pallas_call(
      kernel, out_specs=[((batch, rows, heads, head_dim), x.dtype,
                          (None, rows, None, head_dim), lambda b, h:
                          (b, 0, h, 0))], in_specs=[
                              *heads_specs, encoded, encoded,
                              ((None, length), lambda b, h: (b, 0))
                          ], grid=(batch, heads), name="decode_cross_attention")
  return call(*heads_in, keys, values, encoder_valid.astype(bool))[0]


def rms_dense(x: Array, scale: Array, w: Array, activations: Sequence[str],
              out_dtype: Any = None, *, eps: float = 1e-6) -> Array:
  """prod_p act_p(RMSnorm(x) @ w[p]): [M, E] -> [M, N].

  The MLP's input side (w: its wi_0, wi_1 stacked [2, E, mlp], activations
  ('gelu', 'linear')) or, with one linear weight [1, E, V], the final norm
  and the logits (`out_dtype` float32). Products are rounded to `out_dtype`
  (default x's), as XLA's path rounds them.
  """
  rows, emb = x.shape
  parts, _, width = w.shape
  if len(activations) != parts:
    raise ValueError(f"rms_dense: {parts} weights but activations "
                     f"{tuple(activations)}.")
  t = gpu_tiles.current_tiles().for_weights(w.dtype)
  rb, nb = min(t.row_block, rows), block(width, t.columns)
  kernel = functools.partial(_bodies.rms_dense_kernel, rows_total=rows,
                             activations=tuple(activations),
                             eb=block(emb,
                                      t.dense_emb_block), eps=eps, dot=t.dot)
  call = pallas_call(
      kernel, out_specs=[((rows, width), out_dtype or
                          x.dtype, (rb, nb), lambda i, j: (i, j))],
      in_specs=[((rb, emb), lambda i, j: (i, 0)),
                whole_block(scale.shape),
                ((parts, emb, nb), lambda i, j: (0, 0, j))],
      grid=(-(-rows // rb), width // nb), name="decode_rms_dense")
  return call(x, scale, w)[0]


def dense_residual(x: Array, w: Array, residual: Array) -> Array:
  """residual + x @ w: x [M, N] (N: heads x head_dim, or the MLP's width),
  w [N, E], residual [M, E] -> [M, E] in residual's dtype."""
  rows, width = x.shape
  emb = w.shape[1]
  t = gpu_tiles.current_tiles().for_weights(w.dtype)
  rb, nb = min(t.row_block, rows), block(emb, t.columns)
  kernel = functools.partial(_bodies.dense_residual_kernel, rows_total=rows,
                             kb=block(width, t.in_block), dot=t.dot)
  call = pallas_call(
      kernel, out_specs=[(residual.shape, residual.dtype, (rb, nb), lambda i, j:
                          (i, j))],
      in_specs=[((rb, width), lambda i, j: (i, 0)),
                ((width, nb), lambda i, j: (0, j)),
                ((rb, nb), lambda i, j: (i, j))],
      grid=(-(-rows // rb), emb // nb), name="decode_dense_residual")
  return call(x, w, residual)[0]
