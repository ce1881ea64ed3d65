"""The drafter protocol: what the speculative loop needs from M_q."""
import abc
from typing import Any, Optional, Tuple

import jax

from specdec_jax import sampling

Array = jax.Array

# A guess slot the drafter leaves empty. A row's NO_GUESS slots are always a
# suffix of its γ slots: the row stopped guessing (adaptive γ) or had nothing
# to propose (prompt lookup without a match). The loop keeps at most the
# row's real guesses and draws the token after them from p itself.
NO_GUESS = -1


class Drafter(abc.ABC):
  """Guesses γ tokens per iteration, with the distributions q they came from.

  Implementations must be pytrees (e.g. `flax.struct.dataclass`, arrays as
  leaves and Python values as `pytree_node=False` fields) so that they pass
  through `jax.jit` as arguments; `decoding.check_speculative_args` rejects
  anything else before compiling. Their `state` is any pytree (a KV cache,
  an n-gram table, nothing at all).

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
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """The draft's vocabulary size (must equal the target's)."""

  @abc.abstractmethod
  def init(self, encoder_input_tokens: Array, max_len: int) -> Any:
    """The state for inputs [B, S] int32; buffer positions < max_len."""

  @abc.abstractmethod
  def propose(self, state: Any, buffer: Array, length: Array, rng: Array, *,
              gamma: int, method: sampling.SamplingMethod
              ) -> Tuple[Any, Array, Optional[Array]]:
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
