"""The four plug points of the decode loops, in one place.

1. `Target`: the target model M_p (`models.T5Model` implements it; the
   tests drive the loops with stubs, among them a decoder-only model).
2. `Drafter`: what proposes the γ guesses of each iteration
   (`specdec_jax.core.drafters` holds the implementations).
3. `SamplingMethod`: how a token is drawn from logits (`sampling.Greedy`,
   `sampling.Sampling`).
4. `AcceptanceRule`: how many guesses to keep, and the next token
   (`acceptance.ExactAcceptance`, Algorithm 1).

This module imports nothing from specdec_jax: every other core module may
depend on it, and it on none of them. Targets, drafters and acceptance
rules are passed to `jax.jit` as arguments, so they must be pytrees;
`check_pytree` says so clearly before anything is traced.
"""
import abc
import numbers
from typing import (Any, NamedTuple, Optional, Protocol, Tuple,
                    runtime_checkable)

import jax
import numpy as np

Array = jax.Array


# ---------------------------------------------------------------------------
# Sampling method.
# ---------------------------------------------------------------------------
class SamplingMethod(abc.ABC):
  """How a token is drawn from a model's logits.

  Implementations are frozen dataclasses validated in `__post_init__`, so
  nothing is re-checked while tracing, and pytrees (registered here for
  every subclass), so the decode loops take them as `jax.jit` arguments.
  A subclass that defines `tree_flatten` / `tree_unflatten` (as
  `sampling.Sampling` does) makes its values leaves: a sweep over
  temperatures compiles once. Any other subclass is all static (no
  leaves; the object itself, hashable, is the tree's static part): one
  compilation per distinct method, as for a static argument.
  """

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    if "tree_flatten" in cls.__dict__:
      jax.tree_util.register_pytree_node(cls, cls.tree_flatten,
                                         cls.tree_unflatten)
    else:
      jax.tree_util.register_pytree_node(cls, _static_flatten,
                                         _static_unflatten)

  @property
  @abc.abstractmethod
  def is_greedy(self) -> bool:
    """True when every distribution is one-hot at the argmax.

    The loops then work on argmax tokens only: no [B, γ, V] probabilities
    are built, and Algorithm 1 reduces to `greedy_accept`.
    """

  @abc.abstractmethod
  def standardize(self, logits: Array) -> Array:
    """Logits [..., V] -> the probabilities [..., V] float32 sampled from."""

  @abc.abstractmethod
  def draw(self, rng: Array, logits: Array) -> Tuple[Array, Optional[Array]]:
    """One token per row from logits [..., V].

    Returns:
      (tokens [...] int32, probs [..., V] float32 they were drawn from, or
      None when the method is greedy: the distribution is then the one-hot
      of the token and is never materialized).
    """

  def sample(self, rng: Array, logits: Array) -> Array:
    """Tokens [...] int32 drawn from logits [..., V]."""
    return self.draw(rng, logits)[0]


def _static_flatten(method: SamplingMethod):
  return (), method


def _static_unflatten(method: SamplingMethod, leaves) -> SamplingMethod:
  del leaves  # None: the method is all static.
  return method


# ---------------------------------------------------------------------------
# Target.
# ---------------------------------------------------------------------------
@runtime_checkable
class Target(Protocol):
  """The target model M_p as the loops use it.

  Positions are those of the loop's token buffer: position 0 holds the
  start token (`start_token`), position t the t-th generated token. The
  state holds positions 0..L-1 for some per-row L (`length`).

  The inputs are what the model conditions on, [B, S] int32 with 0 as
  padding: an encoder-decoder model (T5) encodes them and starts its
  decoder from a fixed start token; a decoder-only model reads its prompt
  into the state (prefill) and the loop continues from the prompt's last
  token. Either way the loop sees L = 0 after `start`.

  Optional: `encoder_output(state)`, what `start` encoded (T5Model: an
  `EncoderOutput` of [B, S, d] encodings and the [B, S] input mask). The
  speculative loop hands it to `Drafter.init` (`target_encoder_output`), so
  a draft decoder can cross-attend to the target's encoding instead of
  encoding the inputs itself (a shared-encoder draft). Not part of the
  structural check: a target without it (a decoder-only model) gives None.

  Optional: `features(state)`, the decoder's top hidden states (after the
  final layer norm, before the output projection) at the positions the
  state holds: [B, max_len, F], entry [b, t] valid for t < L[b] (T5Model,
  from `with_features()`). The speculative loop hands them to a drafter
  that reads them (`Drafter.reads_target_features`: a feature-level,
  EAGLE-style draft). Not part of the structural check either.

  Optional: `flat_chunk_cost`, True when a K-token `decode_chunk` costs
  about a 1-token one (T5Model on a GPU's decode path): a model drafter
  then catches up without a branch (`flat_chunk_cost` below); and
  `unroll_draft_steps`, True where a loop's test costs a host round trip
  (the same paths): a model drafter then unrolls its steps
  (`unroll_draft_steps` below).
  """

  @property
  def vocab_size(self) -> int:
    """Size V of the output distribution."""

  def start_token(self, inputs: Array) -> Array:
    """[B] int32 token at buffer position 0 for inputs [B, S] (T5: the
    decoder start token 0; decoder-only: each row's last prompt token)."""

  def start(self, inputs: Array, max_len: int) -> Any:
    """Prefills from inputs [B, S] int32 (0 = padding): a state with L = 0
    in every row and room for positions 0..max_len-1."""

  def length(self, state: Any) -> Array:
    """[B] int32 L: the positions the state holds, per row."""

  def decode_chunk(self, tokens: Array, state: Any) -> Tuple[Array, Any]:
    """Feeds tokens [B, K] int32 at positions L..L+K-1 of each row.

    Returns (logits [B, K, V] float32, state with L advanced by K): logits
    [b, k] is the distribution of the token at position L[b]+k+1. Writing
    past max_len must be an error, never a silent clamp.
    """

  def truncate(self, state: Any, length: Array) -> Any:
    """Forgets positions >= length [B] int32 (L = min(L, length))."""


@runtime_checkable
class TreeTarget(Target, Protocol):
  """Optional: a `Target` that scores a token tree in one call.

  Used by tree verification (`decoding.tree_speculative_sample`): the k
  draft branches share the last known token as their root, and one call
  gives the target's distribution after every node. Implemented by
  `models.T5Model` and the decoder-only example in the tests.
  """

  def decode_tree(self, tokens: Array, parents: Array,
                  state: Any) -> Tuple[Array, Any]:
    """Scores tree nodes tokens [B, N] int32 after the held positions.

    parents: [B, N] (or [N]) int32, the parent of node i among the N nodes,
    or -1 for a node right after the held prefix; parents[i] < i. Node i
    stands at position L + depth_i (depth: its number of ancestors) and
    sees the held positions and its ancestors only.

    Returns (logits [B, N, V] float32, state): logits[b, i] is the
    distribution of the token after node i's root-to-node path, the same
    as `decode_chunk` of that path would give; the state still holds L
    positions, with the nodes kept aside for `commit_path` (it needs room
    for L + N positions, as a chunk of N would).
    """

  def commit_path(self, state: Any, path: Array, path_length: Array) -> Any:
    """Keeps one root-to-node path of the last `decode_tree`, by index.

    path: [B, P] int32 node indices (path[b, j] at depth j; entries past
    path_length ignored); path_length: [B] int32 in [0, P]. The state then
    holds L + path_length positions, exactly as if those nodes' tokens had
    been fed with `decode_chunk`; the other nodes are dropped.
    """


def supports_tree(target: Any) -> bool:
  """Whether `target` has `TreeTarget`'s two extra methods."""
  return all(
      callable(getattr(target, m, None))
      for m in ("decode_tree", "commit_path"))


def target_encoder_output(target: Any, state: Any) -> Any:
  """`target.encoder_output(state)`, or None for a target without one."""
  method = getattr(target, "encoder_output", None)
  return None if method is None else method(state)


def target_features(target: Any, state: Any) -> Any:
  """`target.features(state)` ([B, max_len, F]), or None without one."""
  method = getattr(target, "features", None)
  return None if method is None else method(state)


def flat_chunk_cost(model: Any) -> bool:
  """`model.flat_chunk_cost`, or False for a model without it."""
  return bool(getattr(model, "flat_chunk_cost", False))


def unroll_draft_steps(model: Any) -> bool:
  """`model.unroll_draft_steps`, or False for a model without it."""
  return bool(getattr(model, "unroll_draft_steps", False))


def argmax_in_call(model: Any) -> bool:
  """`model.argmax_in_call` (then it has `decode_argmax`), or False for a
  model without it."""
  return bool(getattr(model, "argmax_in_call", False))


def _is_array_leaf(leaf: Any) -> bool:
  return isinstance(leaf, (jax.Array, np.ndarray, np.generic, numbers.Number))


def check_pytree(name: str, obj: Any) -> None:
  """Raises ValueError unless `obj` can be a `jax.jit` argument.

  A plain Python object is a single opaque leaf for JAX: jit would fail
  deep inside with a TypeError about an invalid JAX type. Leaves must be
  arrays (or numbers); Python configuration belongs in static fields.
  """
  leaves, treedef = jax.tree_util.tree_flatten(obj)
  # Runs on every decode call: one flatten when all is well, paths only to
  # name a bad leaf.
  if all(map(_is_array_leaf, leaves)):
    return
  if jax.tree_util.treedef_is_leaf(treedef) and leaves and leaves[0] is obj:
    raise ValueError(
        f"{name} must be a JAX pytree (it is passed to jax.jit), got a plain "
        f"{type(obj).__name__} object. Declare the class with "
        "@specdec_jax.core.structs.dataclass (arrays as fields, Python "
        "settings as structs.field(pytree_node=False)) or register it with "
        "jax.tree_util.register_pytree_node_class.")
  for path, leaf in jax.tree_util.tree_flatten_with_path(obj)[0]:
    if not _is_array_leaf(leaf):
      raise ValueError(
          f"{name}{jax.tree_util.keystr(path)} is a {type(leaf).__name__}, "
          "not an array: a pytree's leaves must be arrays (mark Python "
          "settings as structs.field(pytree_node=False)).")


# ---------------------------------------------------------------------------
# Drafter.
# ---------------------------------------------------------------------------
# A guess slot the drafter leaves empty. A row's NO_GUESS slots are always a
# suffix of its γ slots: the row stopped guessing (adaptive γ) or had nothing
# to propose (prompt lookup without a match). The loop keeps at most the
# row's real guesses and draws the token after them from p itself.
NO_GUESS = -1


class Drafter(abc.ABC):
  """Guesses γ tokens per iteration, with the distributions q they came from.

  Implementations must be pytrees (`specdec_jax.core.structs.dataclass`:
  arrays as leaves, Python values as `pytree_node=False` fields) so that
  they pass through `jax.jit` as arguments;
  `decoding.check_speculative_args` rejects anything else before
  compiling. Their `state` is any pytree (a KV cache, an n-gram table,
  nothing at all).

  Positions are those of the loop's token buffer: buffer[:, 0] is the
  decoder start token and buffer[:, t] the t-th generated token, so after
  ℓ = length[b] generated tokens row b's known sequence is
  buffer[b, :ℓ+1].
  """

  @property
  def may_stop_early(self) -> bool:
    """True when `propose` may return NO_GUESS slots (a suffix per row).

    Static: the loop then feeds a placeholder for them, caps each row's n
    at its number of real guesses, and makes a one-token target call when
    no row has a guess. False (the default): every slot is a guess.
    """
    return False

  @property
  def reads_target_features(self) -> bool:
    """True when `propose` takes `target_features=`: the target's top
    hidden states [B, max_len, F] at the positions its state holds
    (`Target.features`, valid below the target's length, which is the
    loop's `length` when `propose` is called). Static; False (the default):
    `propose` is called without them."""
    return False

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """The draft's vocabulary size (must equal the target's)."""

  @abc.abstractmethod
  def init(self, encoder_input_tokens: Array, max_len: int,
           encoder_output: Any = None) -> Any:
    """The state for inputs [B, S] int32; buffer positions < max_len.

    `encoder_output` is the target's (`Target.encoder_output` after its
    `start`: for T5 an `EncoderOutput`), or None when the target has none or
    the drafter runs on its own. A drafter that reads it (a shared-encoder
    draft model) encodes nothing itself; every other drafter ignores it.
    """

  @abc.abstractmethod
  def propose(self, state: Any, buffer: Array, length: Array, rng: Array, *,
              gamma: int,
              method: SamplingMethod) -> Tuple[Any, Array, Optional[Array]]:
    """Guesses the γ tokens after buffer[:, :length+1].

    Args:
      state: the drafter's state.
      buffer: [B, T] int32 tokens; row b's known sequence is
        buffer[b, :length[b] + 1] (entries past it are stale).
      length: [B] int32 tokens generated so far per row.
      rng: PRNG key for this call.
      gamma: number of guesses γ (static).
      method: the sampling method (static), the same one the target uses.

    Returns:
      (state, draft_tokens [B, γ] int32, draft_probs): draft_probs is
      [B, γ, V] float32, the distributions q_1..q_γ the guesses were drawn
      from, or None when each guess is deterministic given the sequence
      (q_i is then the one-hot of x_i; an n-gram or copy drafter need never
      build [B, γ, V] arrays). A drafter sampling with a greedy method may
      also return None. Algorithm 1 stays exact either way. When
      `may_stop_early`, draft_tokens may end in NO_GUESS slots (their q
      rows are ignored).
    """

  @abc.abstractmethod
  def rollback(self, state: Any, length: Array) -> Any:
    """Forgets everything past `length` [B] int32 generated tokens.

    Called after every iteration with the rows' new lengths (the tokens the
    target kept); buffer[:, :length+1] then holds the true sequence.
    """


# ---------------------------------------------------------------------------
# Acceptance rule.
# ---------------------------------------------------------------------------
class Verdict(NamedTuple):
  """What an acceptance rule decided for one iteration (B rows).

  Attributes:
    num_accepted: [B] int32, the paper's n in [0, γ]: guesses kept before
      the first rejection.
    next_token: [B] int32, the token emitted after them (the residual draw
      after a rejection, or the bonus token from p_{γ+1}).
    target_probs: [B, γ+1, V] float32 p_1..p_{γ+1} the guesses were tested
      against, or None when the method is greedy.
    target_tokens: [B, γ+1] int32 argmax of the target's logits when the
      method is greedy (p_i is its one-hot), else None.
  """
  num_accepted: Array
  next_token: Array
  target_probs: Optional[Array]
  target_tokens: Optional[Array]


class AcceptanceRule(abc.ABC):
  """Turns the target's logits at the γ+1 positions into a `Verdict`."""

  @abc.abstractmethod
  def __call__(self, rng: Array, target_logits: Array, draft_tokens: Array,
               draft_probs: Optional[Array], method: SamplingMethod) -> Verdict:
    """Decides one iteration.

    Args:
      rng: PRNG key for this iteration's acceptance.
      target_logits: [B, γ+1, V] the target's logits at the positions of
        the last known token and of x_1..x_γ (they give p_1..p_{γ+1}).
      draft_tokens: [B, γ] int32 guesses x_1..x_γ, possibly ending in
        NO_GUESS slots (never accepted).
      draft_probs: [B, γ, V] float32 q_1..q_γ (zeros at NO_GUESS slots), or
        None (one-hot q_i at x_i).
      method: the sampling method (static).
    """
