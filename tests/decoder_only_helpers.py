"""A tiny decoder-only language model behind the `Target` protocol.

`DecoderOnlyLM` has no encoder: its input is a prompt, read into a
KV-cache-like state by `start` (prefill), and generation continues the
prompt. Its next-token logits depend on the whole sequence so far, prompt
included:

  h_t = sum_{i <= t} decay^(t - i) * emb[x_i],  logits_t = tanh(h_t) @ out

(the logits of the token after absolute position t). The state keeps
emb[x_i] per absolute position, like an attention cache: slots past the
held length are stale and masked, and `truncate` rolls back by index. So a
loop that feeds a wrong token, a wrong position or forgets to roll back
gets other logits. `next_probs` is the same model in float64 NumPy on a
token tuple, for exact references.

Prompts are [B, S] int32, right-padded with 0 (a prompt token is >= 1);
row b's prompt is its n_b > 0 leading non-zero tokens. The loop's buffer
position 0 holds the last prompt token (`start_token`), the state holds
the n_b - 1 before it: loop length L is absolute position n_b - 1 + L.
"""
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import structs
from specdec_jax.core.models.attention import tree_visibility

from decoding_helpers import check_fits

Array = jax.Array


@structs.dataclass
class DecoderOnlyState:
  """The decode state of `DecoderOnlyLM` (B rows, C = S + max_len slots).

  Attributes:
    keys: [B, C, D] float32 emb[x_i] at absolute position i (stale past
      `held`).
    held: [B] int32 absolute positions held.
    offset: [B] int32 absolute position of the loop's position 0 (n_b - 1).
    max_len: loop positions available (static).
  """
  keys: Array
  held: Array
  offset: Array
  max_len: int = structs.field(pytree_node=False)


def prompt_lengths(inputs: Array) -> Array:
  """[B] int32 number of leading non-zero tokens of prompts [B, S]."""
  return jnp.sum(jnp.cumprod(inputs != 0, axis=1), axis=1).astype(jnp.int32)


@structs.dataclass
class DecoderOnlyLM:
  """Implements `protocols.Target` for a decoder-only model (module doc).

  Attributes:
    emb: [V, D] float32 token embeddings.
    out: [D, V] float32 output projection.
    decay: [] float32 in (0, 1): weight of older positions.
  """
  emb: Array
  out: Array
  decay: Array

  @classmethod
  def random(cls, seed: int, vocab: int, dim: int = 8, scale: float = 3.0,
             decay: float = 0.6) -> "DecoderOnlyLM":
    rs = np.random.RandomState(seed)
    return cls(emb=jnp.asarray(rs.randn(vocab, dim), jnp.float32),
               out=jnp.asarray(scale * rs.randn(dim, vocab),
                               jnp.float32), decay=jnp.float32(decay))

  @property
  def vocab_size(self) -> int:
    return self.emb.shape[0]

  def start_token(self, inputs: Array) -> Array:
    n = prompt_lengths(inputs)
    return jnp.take_along_axis(inputs, (n - 1)[:, None], axis=1)[:, 0]

  def start(self, inputs: Array, max_len: int) -> DecoderOnlyState:
    batch, length = inputs.shape
    n = prompt_lengths(inputs)
    keys = jnp.zeros((batch, length + max_len, self.emb.shape[1]), jnp.float32)
    # Prefill: every prompt token but the last (the loop feeds that one).
    keys = keys.at[:, :length].set(self.emb[inputs])
    return DecoderOnlyState(keys=keys, held=n - 1, offset=n - 1,
                            max_len=max_len)

  def length(self, state: DecoderOnlyState) -> Array:
    return state.held - state.offset

  def decode_chunk(self, tokens: Array, state: DecoderOnlyState):
    k = tokens.shape[1]
    check_fits(jnp.all(self.length(state) + k <= state.max_len),
               "decoder-only target: chunk past max_len")
    keys = jax.vmap(
        lambda row, new, at: jax.lax.dynamic_update_slice(row, new, (at, 0)))(
            state.keys, self.emb[tokens], state.held)
    query = state.held[:, None] + jnp.arange(k)[None, :]  # [B, K]
    slot = jnp.arange(keys.shape[1])[None, None, :]  # [1, 1, C]
    age = (query[..., None] - slot).astype(jnp.float32)
    weight = jnp.where(slot <= query[..., None], self.decay**age, 0.0)
    hidden = jnp.einsum("bkc,bcd->bkd", weight, keys)
    logits = jnp.tanh(hidden) @ self.out
    return logits, state.replace(keys=keys, held=state.held + k)

  def truncate(self, state: DecoderOnlyState,
               length: Array) -> DecoderOnlyState:
    return state.replace(held=jnp.minimum(state.held, state.offset + length))

  def decode_tree(self, tokens: Array, parents: Array, state: DecoderOnlyState):
    """`protocols.TreeTarget`: node i (tokens [B, N], parents [B or 1, N])
    follows the held prefix and its ancestors only, at absolute position
    held + depth_i; its embedding goes to slot held + i, held unchanged."""
    batch, n = tokens.shape
    check_fits(jnp.all(self.length(state) + n <= state.max_len),
               "decoder-only target: tree past max_len")
    parents = jnp.broadcast_to(jnp.asarray(parents, jnp.int32), (batch, n))
    visible, depth = tree_visibility(parents)
    keys = jax.vmap(
        lambda row, new, at: jax.lax.dynamic_update_slice(row, new, (at, 0)))(
            state.keys, self.emb[tokens], state.held)
    slot = jnp.arange(keys.shape[1])[None, None, :]  # [1, 1, C]
    query = (state.held[:, None] + depth)[..., None]  # [B, N, 1]
    prefix = jnp.where(slot < state.held[:, None, None],
                       self.decay**(query - slot).astype(jnp.float32), 0.0)
    # Tree slots: decay by depth difference, ancestors (and self) only.
    node_age = (depth[:, :, None] - depth[:, None, :]).astype(jnp.float32)
    tree = jnp.where(visible, self.decay**node_age, 0.0)  # [B, N, N]
    tree_weight = jax.vmap(
        lambda row, new, at: jax.lax.dynamic_update_slice(row, new, (0, at)))(
            jnp.zeros_like(prefix), tree, state.held)
    hidden = jnp.einsum("bkc,bcd->bkd", prefix + tree_weight, keys)
    return jnp.tanh(hidden) @ self.out, state.replace(keys=keys)

  def commit_path(self, state: DecoderOnlyState, path: Array,
                  path_length: Array) -> DecoderOnlyState:
    """Moves nodes path[b, :path_length[b]] to the held prefix's end."""
    slots = state.held[:, None] + path
    picked = jnp.take_along_axis(state.keys, slots[..., None], axis=1)
    keys = jax.vmap(
        lambda row, new, at: jax.lax.dynamic_update_slice(row, new, (at, 0)))(
            state.keys, picked, state.held)
    return state.replace(keys=keys, held=state.held + path_length)


def next_logits(model: DecoderOnlyLM, sequence) -> np.ndarray:
  """[V] float64 logits after the token tuple `sequence` (prompt + so far)."""
  emb = np.asarray(model.emb, np.float64)
  decay = float(model.decay)
  ages = np.arange(len(sequence))[::-1]
  hidden = (decay**ages)[:, None] * emb[list(sequence)]
  return np.tanh(hidden.sum(axis=0)) @ np.asarray(model.out, np.float64)
