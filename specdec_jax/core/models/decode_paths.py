"""How a model's decode calls compute, chosen by backend, and their weights.

A decode call (`T5Model.decode_chunk` / `decode_tree`: the target's K-token
call, the draft's step and the baseline's step alike) takes one of four
paths (`T5Model.decode_path`, set by `T5Model.prepared_for_decoding`):

* 'xla': XLA's ops on T5X's kernels (TPUs; a CPU without the kernel;
  several devices, whose partitioner shards T5X's kernels by their names
  and would not shard packed ones; any model not prepared);
* 'cpu_kernel': the CPU matmul kernel's packed panels
  (`specdec_jax.core.kernels`; the CPU's default where it is built);
* 'packed': XLA's ops with q/k/v packed into one kernel and wi_0/wi_1 into
  one, the attention biases computed once per call rather than fused into
  every layer (one GPU's default);
* 'fused': the GPU kernels (`kernels.gpu`): 6 kernels a decoder layer (3
  under `Tiles.fold_bytes`; small layers together in 1 under
  `Tiles.layer_bytes`) and one for the final
  norm and logits. Opt-in
  (`prepared_for_decoding(path='fused')`, the device check's `--path`)
  until a GPU run has shown Triton compiles them and they are exact there:
  until then a user's run never depends on kernels no GPU has compiled.

Each path is one `DecodePath` in `PATHS` (the registry: a new path is one
object there), which holds all that differs between them: why it cannot
run here (`unavailable`), whether it is the backend's default, its weights
(`pack`), its decoder layer's self-attention projections and MLP, whether
the per-call biases are computed once and whether the decoder runs the
fused layer. The models carry a path's name (static: each path is its own
compiled program) and ask its object (`get`); nothing else compares names.

`default_path` is the backend's choice; `check` refuses a path that cannot
run here. `pack` makes a path's weights, a tree of its own beside the
model's T5X-layout `params` (never inside: checkpoints and converters read
`params`): the CPU kernel's panels, or decoder layer i's entries under
decoder/layers_i of `layers.PACKED_COLLECTION`, in the model's dtype.
`packed_qkv`, `packed_mlp` and `fused_layers` are the paths' decoder layers,
computed from them (`network.DecoderLayer` calls them);
`self_bias` is what the 'fused' path's kernels build their attention bias
from.
"""
import dataclasses
import functools
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from specdec_jax.core import kernels
from specdec_jax.core.kernels import gpu
from specdec_jax.core.kernels import gpu_layers
from specdec_jax.core.models.config import T5Config
from specdec_jax.core.models.layers import bucket_table
from specdec_jax.core.models.layers import PACKED_COLLECTION

XLA, CPU_KERNEL, PACKED, FUSED = "xla", "cpu_kernel", "packed", "fused"


@dataclasses.dataclass(frozen=True)
class DecodePath:
  """One way decode calls compute: 'xla' as it is, the others below.

  Attributes:
    name: what `T5Model.decode_path` and the modules carry.
    biases_once: the per-call attention biases are computed once, behind
      an optimization barrier, rather than fused into every layer.
    fused: the decoder runs `Decoder._decode_new_fused` (`fused_layer`).
    flat_chunk_cost: a K-token call costs about a 1-token call where the
      path runs (one GPU, memory-bound): a draft catches up with one
      2-token call instead of a branch on whether a row lags, whose index
      a GPU reads back to the host every iteration (`ModelDrafter`).
    unroll_draft_steps: a draft's γ-1 later steps are unrolled rather than
      a loop, whose test a GPU reads back to the host every step
      (`ModelDrafter`).
  """
  name: str
  biases_once: bool = False
  fused: bool = False
  flat_chunk_cost: bool = False
  unroll_draft_steps: bool = False

  def unavailable(self, config: T5Config) -> Optional[str]:
    """None if a model of `config` can take this path here, else why not."""
    del config
    return None

  def is_default(self, config: T5Config) -> bool:
    """Whether this backend decodes a model of `config` on this path (one
    path at most; none: 'xla')."""
    del config
    return False

  def pack(self, params: Dict[str, Any],
           config: T5Config) -> Optional[Dict[str, Any]]:
    """The path's weights of T5X-layout `params` (None: it reads them)."""
    del params, config
    return None

  def self_qkv(self, layer: Any, y: jax.Array):
    """A decoder layer's queries, keys and values [B, K, H, D] of y."""
    query = layer.self_attention.query(y)
    keys, values = layer.self_attention.project_kv(y)
    return query, keys, values

  def mlp(self, layer: Any, y: jax.Array, deterministic: bool) -> jax.Array:
    """A decoder layer's MLP of y."""
    return layer.mlp(y, deterministic)


class _CpuKernel(DecodePath):
  """The layers' own modules, which multiply with the CPU kernel's panels."""

  def unavailable(self, config: T5Config) -> Optional[str]:
    if kernels.packing_enabled(config.dtype):
      return None
    return ("needs float32 weights on one CPU device with the CPU kernel "
            "built (`python -m specdec_jax.core.kernels`); here "
            f"dtype={jnp.dtype(config.dtype)}, backend "
            f"{jax.default_backend()}, {jax.device_count()} device(s)")

  def is_default(self, config: T5Config) -> bool:
    return kernels.packing_enabled(config.dtype)

  def pack(self, params, config):
    del config
    return _cpu_panels(params)


class _Packed(DecodePath):
  """`packed_qkv` and `packed_mlp` on `_packed_weights`."""

  def is_default(self, config: T5Config) -> bool:
    del config
    return jax.default_backend() == "gpu" and jax.device_count() == 1

  def pack(self, params, config):
    return _pack_decoder(params, _packed_weights, config)

  def self_qkv(self, layer, y):
    return packed_qkv(layer, y)

  def mlp(self, layer, y, deterministic):
    del deterministic  # No dropout: a prepared model decodes, not trains.
    return packed_mlp(layer, y)


class _Fused(DecodePath):
  """`fused_layer` on `_fused_weights`; opt-in (the module docstring)."""

  def unavailable(self, config: T5Config) -> Optional[str]:
    return gpu.supported(config.head_dim)

  def pack(self, params, config):
    return _pack_decoder(params, _fused_weights, config)


PATHS: Dict[str, DecodePath] = {
    p.name: p for p in (DecodePath(XLA), _CpuKernel(CPU_KERNEL),
                        _Packed(PACKED, biases_once=True, flat_chunk_cost=True,
                                unroll_draft_steps=True),
                        _Fused(FUSED, fused=True, flat_chunk_cost=True,
                               unroll_draft_steps=True))
}
DECODE_PATHS = tuple(PATHS)


def get(name: str, what: str = "decode_path") -> DecodePath:
  """The path named `name` (`what`: the argument that named it)."""
  if name not in PATHS:
    raise ValueError(f"{what}={name!r}: allowed: {', '.join(PATHS)} (None: "
                     "the backend's).")
  return PATHS[name]


def default(config: T5Config) -> DecodePath:
  """The path a model of `config` takes on this backend (the module
  docstring): the first in `PATHS` that `is_default` (the CPU kernel where
  it packs, 'packed' on one GPU), else 'xla'."""
  return next((p for p in PATHS.values() if p.is_default(config)), PATHS[XLA])


def default_path(config: T5Config) -> str:
  """`default`'s name."""
  return default(config).name


def check(path: Optional[str], config: T5Config) -> str:
  """`path`, or the default for None, if it can run here.

  Raises:
    ValueError: an unknown path, or one whose `unavailable` says why not
      ('cpu_kernel' where the CPU kernel does not pack: not float32 on one
      CPU device with the kernel built; 'fused' for a model whose head
      width the kernels do not take).
  """
  if path is None:
    return default_path(config)
  why = get(path, "prepared_for_decoding: path").unavailable(config)
  if why:
    here = [p.name for p in PATHS.values() if p.unavailable(config) is None]
    raise ValueError(f"prepared_for_decoding: path={path!r}: {why}; allowed "
                     f"here: {', '.join(here)}.")
  return path


def pack(params: Dict[str, Any], path: str,
         config: T5Config) -> Optional[Dict[str, Any]]:
  """The weights of T5X-layout `params` (without the {'params': ...}
  wrapper) that the path named `path` decodes with, in one program: None
  for 'xla'; for 'cpu_kernel' every encoder and decoder kernel's panels;
  for 'packed' and 'fused', per decoder layer self_qkv ('packed':
  [E, 3 * H * D]; 'fused': [H, 3, E, D]), mlp_wi ([E, n * mlp];
  [n, E, mlp]) and, for 'fused', cross_q [H, 1, E, D] and the output
  kernels in the model's dtype where stored in another."""
  return get(path, "pack: path").pack(params, config)


@jax.jit
def _cpu_panels(params):
  """The CPU kernel's panels of every 2-D kernel of the encoder and decoder.

  Args:
    params: the T5X-layout tree (without the {'params': ...} wrapper).

  Returns:
    A tree with only the stacks' `kernel` entries, each [in, out] replaced
    by its panels (`kernels.pack`): the `PACKED_COLLECTION` variables that
    `layers.DenseGeneral` multiplies with. One program for all of them.
  """

  def packed(tree):
    out = {}
    for name, leaf in tree.items():
      if isinstance(leaf, dict):
        sub = packed(leaf)
        if sub:
          out[name] = sub
      elif name == "kernel" and leaf.ndim == 2:
        out[name] = kernels.pack(leaf)
    return out

  return packed({
      stack: params[stack] for stack in ("encoder", "decoder") if stack in params
  })


def _heads(kernel: jax.Array, config: T5Config) -> jax.Array:
  """[E, H * D] -> [H, E, D]."""
  emb = kernel.shape[0]
  return kernel.reshape(emb, config.num_heads,
                        config.head_dim).transpose(1, 0, 2)


def _mlp_inputs(mlp: Dict[str, Any], config: T5Config):
  """The MLP's input kernels [E, mlp], in T5X's names' order."""
  if len(config.mlp_activations) == 1:
    return [mlp["wi"]["kernel"]]
  return [mlp[f"wi_{i}"]["kernel"] for i in range(len(config.mlp_activations))]


def _packed_weights(layer: Dict[str, Any],
                    config: T5Config) -> Dict[str, jax.Array]:
  """'packed': a decoder layer's q/k/v and MLP input kernels, each set
  concatenated into one."""
  own = layer["self_attention"]
  qkv = [own[n]["kernel"] for n in ("query", "key", "value")]
  return {
      "self_qkv": jnp.concatenate(qkv, axis=1).astype(config.dtype),
      "mlp_wi": jnp.concatenate(_mlp_inputs(layer["mlp"], config),
                                axis=1).astype(config.dtype)
  }


def _fused_weights(layer: Dict[str, Any],
                   config: T5Config) -> Dict[str, jax.Array]:
  """'fused': a decoder layer's kernels in the GPU kernels' layouts."""
  dtype = config.dtype
  own, cross, mlp = (layer["self_attention"],
                     layer["encoder_decoder_attention"], layer["mlp"])
  qkv = [own[n]["kernel"] for n in ("query", "key", "value")]
  out = {
      "self_qkv": jnp.stack([_heads(k, config) for k in qkv],
                            axis=1).astype(dtype),  # [H, 3, E, D]
      "cross_q": _heads(cross["query"]["kernel"], config)
                 [:, None].astype(dtype),  # [H, 1, E, D]
      "mlp_wi": jnp.stack(_mlp_inputs(mlp, config), axis=0).astype(dtype),
  }
  # The output kernels keep T5X's layout: copied only to change the dtype,
  # so that a kernel reads the bytes the model computes with.
  for name, kernel in (("self_out", own["out"]["kernel"]),
                       ("cross_out", cross["out"]["kernel"]),
                       ("mlp_wo", mlp["wo"]["kernel"])):
    if kernel.dtype != jnp.dtype(dtype):
      out[name] = kernel.astype(dtype)
  return out


@functools.partial(jax.jit, static_argnames=("layer_weights", "config"))
def _pack_decoder(params: Dict[str, Any], layer_weights: Callable[..., Any],
                  config: T5Config) -> Dict[str, Any]:
  """Every decoder layer's `layer_weights`, under decoder/layers_i."""
  decoder = params["decoder"]
  return {
      "decoder": {
          f"layers_{i}": layer_weights(decoder[f"layers_{i}"], config)
          for i in range(config.num_decoder_layers)
      }
  }


# ---------------------------------------------------------------------------
# The paths' decoder layers (called by `network.DecoderLayer`, bound: the
# layer's T5X parameters and its packed weights are its variables).
# ---------------------------------------------------------------------------
def _dot(x: jax.Array, kernel: jax.Array, dtype) -> jax.Array:
  """x [..., in] @ kernel [in, out] in dtype (as `layers.DenseGeneral`)."""
  return lax.dot_general(jnp.asarray(x, dtype), jnp.asarray(kernel, dtype),
                         (((x.ndim - 1,), (0,)), ((), ())))


def _weight(layer: Any, name: str, dense: Dict[str, Any]) -> jax.Array:
  """The layer's packed weight `name` if `pack` made one (a kernel stored
  in another dtype than the model computes in), else the T5X kernel of the
  dense layer whose params are `dense`."""
  if layer.has_variable(PACKED_COLLECTION, name):
    return layer.get_variable(PACKED_COLLECTION, name)
  return dense["kernel"]


def packed_qkv(layer: Any, y: jax.Array):
  """'packed': queries, keys, values [B, K, H, D] from one product with the
  packed [E, 3 * H * D] kernel."""
  cfg = layer.config
  qkv = _dot(y, layer.get_variable(PACKED_COLLECTION, "self_qkv"), cfg.dtype)
  qkv = qkv.reshape(*y.shape[:-1], 3, cfg.num_heads, cfg.head_dim)
  return qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]


def packed_mlp(layer: Any, y: jax.Array) -> jax.Array:
  """'packed': the gated MLP with its input kernels packed [E, n * mlp]."""
  cfg = layer.config
  h = _dot(y, layer.get_variable(PACKED_COLLECTION, "mlp_wi"), cfg.dtype)
  h = h.reshape(*y.shape[:-1], len(cfg.mlp_activations), cfg.mlp_dim)
  parts = [
      h[..., i, :] if act == "linear" else getattr(nn, act)(h[..., i, :])
      for i, act in enumerate(cfg.mlp_activations)
  ]
  hidden = parts[0]
  for part in parts[1:]:
    hidden = hidden * part
  wo = _weight(layer, "mlp_wo", layer.mlp.variables["params"]["wo"])
  return _dot(hidden, wo, cfg.dtype)


def fused_layers(layers: Sequence[Any], x, keys, values, start, bias,
                 cross_keys, cross_values, encoder_valid, counters=None):
  """'fused': the decoder layers' chunk in GPU kernels: runs of small
  layers in one kernel (`gpu.layer_runs`, `gpu_layers.decoder_layers`),
  every other layer in `fused_layer`'s.

  Args:
    layers: the bound `network.DecoderLayer`s.
    x: [B, K, emb] or the first layer's `gpu_layers.Embedded` (gathered in
      the first kernel if that folds or runs layers).
    keys, values: each layer's [B, H, D, max_len] (written in place).
    start, bias, encoder_valid: as `fused_layer`'s; cross_keys,
      cross_values: each layer's.
    counters: the barriers' [B] int32 (`DecodeCache.barriers`); None:
      zeros of the call's own.

  Returns:
    (outputs [B, K, emb] and their partial sums, as `fused_layer`'s;
    each layer's keys, values; the counters after the call, None without
    `Tiles.programs`).
  """
  weights = [fused_weights(layer) for layer in layers]
  sizes = [_weight_bytes(ws) for ws in weights]
  partials = None
  new_keys, new_values = [], []
  runs = gpu.layer_runs(sizes)
  # The barriers' (`Tiles.programs`): one array for every run.
  if counters is None:
    counters = gpu_layers.barrier_counters(x.shape[0])
  for run in runs:
    if gpu.one_kernel_run(sum(sizes[i] for i in run)):
      x, run_keys, run_values, counters = gpu_layers.decoder_layers(
          gpu_layers.summed(x, partials), [keys[i] for i in run],
          [values[i] for i in run], start, bias, [cross_keys[i] for i in run],
          [cross_values[i] for i in run], encoder_valid,
          [weights[i] for i in run], layers[run.start].config.mlp_activations,
          counters=counters)
      partials = None
    else:
      i, = run
      x, partials, layer_keys, layer_values = layers[i].decode_chunk_fused(
          weights[i], x, partials, keys[i], values[i], start, bias,
          cross_keys[i], cross_values[i], encoder_valid)
      run_keys, run_values = [layer_keys], [layer_values]
    new_keys += run_keys
    new_values += run_values
  return x, partials, new_keys, new_values, counters


def fused_weights(layer: Any) -> Tuple[jax.Array, ...]:
  """A bound `network.DecoderLayer`'s weights as the GPU kernels read them:
  (self-attention norm scale [E], wqkv [H, 3, E, D], its output [H*D, E],
  cross-attention norm scale [E], wq [H, 1, E, D], its output [H*D, E],
  MLP norm scale [E], wi [P, E, M], wo [M, E])."""

  def scale(norm):
    return norm.variables["params"]["scale"]

  def out(name, attention):
    return _weight(layer, name, attention.out.variables["params"])

  return (scale(layer.pre_self_attention_layer_norm),
          layer.get_variable(PACKED_COLLECTION,
                             "self_qkv"), out("self_out", layer.self_attention),
          scale(layer.pre_cross_attention_layer_norm),
          layer.get_variable(PACKED_COLLECTION, "cross_q"),
          out("cross_out",
              layer.encoder_decoder_attention), scale(layer.pre_mlp_layer_norm),
          layer.get_variable(PACKED_COLLECTION, "mlp_wi"),
          _weight(layer, "mlp_wo", layer.mlp.variables["params"]["wo"]))


def _weight_bytes(weights: Sequence[jax.Array]) -> int:
  return sum(w.size * w.dtype.itemsize for w in weights)


def fused_layer(layer: Any, weights: Sequence[jax.Array], x, partials, keys,
                values, start, bias, cross_keys, cross_values, encoder_valid):
  """'fused': a decoder layer's chunk in 6 GPU kernels (`kernels.gpu`), or
  in three where its weights fit `Tiles.fold_bytes` (a layer that runs
  in one: `fused_layers`).

  Args:
    layer: the bound `network.DecoderLayer`; weights: its `fused_weights`.
    x, partials: the residual stream: x [B, K, emb] (the first layer's:
      `gpu_layers.Embedded`, gathered in its first kernel if it folds) plus,
      after a folded layer, its partial sums [P, B, K, emb] float32
      (`gpu_layers.summed`; None: x alone).
    keys, values: [B, H, D, max_len] (written in place).
    start: [B] the rows' cache lengths before the chunk.
    bias: every slot's bias for each chunk token, its own slots included
      (`gpu.SelfBias`).
    cross_keys, cross_values: [B, H, D, S]; encoder_valid: [B, S] bool.

  Returns:
    (outputs [B, K, emb] and their partial sums, as x and partials; keys,
    values).
  """
  batch, k, emb = x.shape
  rows = batch * k
  (self_scale, wqkv, self_out, cross_scale, wq, cross_out, mlp_scale, wi,
   wo) = weights
  activations = layer.config.mlp_activations
  if gpu.folded_layer(_weight_bytes(weights)):
    x, partials, keys, values = gpu_layers.folded_self_attention(
        x, partials, self_scale, wqkv, self_out, keys, values, start, bias)
    x, partials = gpu_layers.folded_cross_attention(x, partials, cross_scale,
                                                    wq, cross_out, cross_keys,
                                                    cross_values, encoder_valid)
    x, partials = gpu_layers.folded_mlp(x, partials, mlp_scale, wi, wo,
                                        activations)
    return x, partials, keys, values
  x = gpu_layers.rows(gpu_layers.summed(x, partials))  # six kernels read rows
  ctx, keys, values = gpu.self_attention(x, self_scale, wqkv, keys, values,
                                         start, bias)
  y = gpu.dense_residual(ctx.reshape(rows, -1), self_out, x.reshape(rows, emb))
  ctx = gpu.cross_attention(y.reshape(batch, k, emb), cross_scale, wq,
                            cross_keys, cross_values, encoder_valid)
  y = gpu.dense_residual(ctx.reshape(rows, -1), cross_out, y)
  hidden = gpu.rms_dense(y, mlp_scale, wi, activations)
  y = gpu.dense_residual(hidden, wo, y)
  return y.reshape(batch, k, emb), None, keys, values


def self_bias(relpos_bias: Any, max_len: int, offsets: Optional[jax.Array],
              visible: Optional[jax.Array]) -> gpu.SelfBias:
  """The 'fused' path's self-attention bias for a chunk (`gpu.SelfBias`):
  the decoder's learned relative-position biases (`relpos_bias`: its bound
  `layers.RelativePositionBiases`) and their static bucket table over a
  cache of max_len slots; offsets [B or 1, K] and visible [B or 1, K, K]
  as `network.Decoder._decode_new`'s, None for a chain (0..K-1, causal).
  Arrays the kernels read as they are: no XLA kernel per call."""
  return gpu.SelfBias(
      relpos_bias.variables["params"]["rel_embedding"],
      jnp.asarray(bucket_table(max_len, relpos_bias.bidirectional)), offsets,
      visible, relpos_bias.dtype)
