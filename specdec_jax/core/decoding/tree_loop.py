"""Speculative decoding with tree verification: k draft branches per call.

Each iteration the draft proposes k branches of γ guesses per row
(`drafters.TreeModelDrafter.propose_tree`; a feature-level draft's top-k
branches: `drafters.feature_tree`, handed the target's hidden states as
the token loop hands them to `propose`), the target scores the whole
chain tree, 1 + k·γ nodes, in one call (`protocols.TreeTarget.decode_tree`),
`TreeAcceptance` keeps a path of n guesses and draws the next token, and
both models keep that path by index (`commit_path` then `truncate` for the
target, `rollback_tree` for the draft). Exact at every temperature: the
output is distributed as the target's (`decoding.tree_acceptance`); with
k = 1 it is Algorithm 1. Bookkeeping (buffer, lengths, EOS, frozen rows) is
`decoding.loops`'.
"""
from typing import Any, Optional, cast

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.core import carried_while
from specdec_jax.core import kernels
from specdec_jax.core import sampling
from specdec_jax.core import structs
from specdec_jax.core.decoding import checks
from specdec_jax.core.decoding.loops import _finish
from specdec_jax.core.decoding.loops import _running
from specdec_jax.core.decoding.loops import _start_buffer
from specdec_jax.core.decoding.loops import emit_verdict
from specdec_jax.core.decoding.loops import EOS_ID
from specdec_jax.core.decoding.loops import iteration_inputs
from specdec_jax.core.decoding.outputs import CallStatistics
from specdec_jax.core.decoding.programs import LoopProgram
from specdec_jax.core.decoding.programs import token_batch
from specdec_jax.core.decoding.tree_acceptance import chain_parents
from specdec_jax.core.decoding.tree_acceptance import first_round
from specdec_jax.core.decoding.tree_acceptance import path_nodes
from specdec_jax.core.decoding.tree_acceptance import TreeAcceptance
from specdec_jax.core.decoding.tree_acceptance import TreeVerdict
from specdec_jax.core.drafters.tree import as_tree_drafter
from specdec_jax.core.drafters.tree import TreeModelDrafter
from specdec_jax.core.protocols import AcceptanceRule
from specdec_jax.core.protocols import supports_tree
from specdec_jax.core.protocols import target_encoder_output

Array = jax.Array


@structs.dataclass
class TreeOutput(CallStatistics):
  """Result of `tree_speculative_sample`.

  Attributes:
    tokens: [B, max_decode_length] int32, as `DecodeOutput.tokens`.
    lengths: [B] int32 generated tokens per row.
    target_calls: [B] int32 tree calls while the row was active.
    accepted_histogram: [B, γ+1] int32; entry n counts the row's iterations
      that kept n guesses (before EOS / max_decode_length cut them).
    trace_num_accepted: [B, max_decode_length] int32; entry i is the
      guesses the row's (i+1)-th tree call kept (as the histogram counts
      them); -1 after the row's last call (`target_calls`).
    first_round_histogram: [B, k+1] int32; entry j < k counts the row's
      calls whose first depth kept branch j's guess (`first_round`: a tree
      of k' < k branches would have kept a guess on the calls of entries
      j < k'), entry k the calls that kept none.
  """
  tokens: Array
  lengths: Array
  target_calls: Array
  accepted_histogram: Array
  trace_num_accepted: Array
  first_round_histogram: Array


@structs.dataclass
class TreeState:
  """Loop state (B rows): as `loops.SpeculativeState`, with counters.

  Attributes:
    iteration: [] int32; target_state (holds positions 0..ℓ-1);
    draft_state (`ModelDrafterState`); buffer [B, T] int32; length [B] ℓ;
    done [B] bool; target_calls [B] int32; accepted_histogram [B, γ+1];
    trace_num_accepted [B, max_decode_length] int32 (-1: no call yet);
    first_round_histogram [B, k+1] int32.
  """
  iteration: Array
  target_state: Any
  draft_state: Any
  buffer: Array
  length: Array
  done: Array
  target_calls: Array
  accepted_histogram: Array
  trace_num_accepted: Array
  first_round_histogram: Array


def tree_iteration(target: Any, drafter: TreeModelDrafter,
                   acceptance: AcceptanceRule, s: TreeState, rng: Array,
                   eos_id: Array, *, gamma: int, width: int,
                   max_decode_length: int,
                   method: sampling.SamplingMethod) -> TreeState:
  """One draft-tree / one-target-call / accept iteration for every row."""
  batch = s.buffer.shape[0]
  rows = jnp.arange(batch)
  draft_rng, accept_rng, features = iteration_inputs(target, drafter,
                                                     s.target_state,
                                                     s.iteration, rng)
  draft_state, draft_tokens, draft_probs = drafter.propose_tree(
      s.draft_state, s.buffer, s.length, draft_rng, gamma=gamma, width=width,
      method=method, **features)
  nodes = jnp.concatenate([
      s.buffer[rows, s.length][:, None],
      draft_tokens.reshape(batch, width * gamma)
  ], axis=1)
  logits, tree_state = target.decode_tree(
      nodes, jnp.asarray(chain_parents(width, gamma)), s.target_state)
  verdict = cast(
      TreeVerdict,
      acceptance(accept_rng, logits, draft_tokens, draft_probs, method))
  num_accepted, next_token = verdict.num_accepted, verdict.next_token

  active = jnp.logical_not(s.done)
  buffer, new_length, done = emit_verdict(s.buffer, s.length, s.done,
                                          draft_tokens[rows, verdict.branch],
                                          num_accepted, next_token, eos_id,
                                          max_decode_length)
  # Keep the root and the accepted path's n nodes, then cut at EOS / max.
  path = jnp.asarray(path_nodes(width, gamma))[verdict.branch]
  target_state = target.truncate(
      target.commit_path(tree_state, path, num_accepted + 1), new_length)
  kept = jnp.minimum(num_accepted, new_length - s.length)
  histogram = s.accepted_histogram + (
      active[:, None] & (jnp.arange(gamma + 1)[None, :] == kept[:, None]))
  # A row makes at most max_decode_length calls (each emits a token); a
  # frozen row's write rewrites its last entry unchanged.
  slot = jnp.minimum(s.target_calls, s.trace_num_accepted.shape[1] - 1)
  trace = s.trace_num_accepted.at[rows, slot].set(
      jnp.where(active, kept, s.trace_num_accepted[rows, slot]))
  rounds = s.first_round_histogram + (active[:, None] & (jnp.arange(width + 1)[
      None, :] == first_round(draft_tokens, verdict)[:, None]))
  return TreeState(
      iteration=s.iteration + 1, target_state=target_state,
      draft_state=drafter.rollback_tree(draft_state, new_length,
                                        verdict.branch), buffer=buffer,
      length=new_length, done=done,
      target_calls=s.target_calls + active.astype(jnp.int32),
      accepted_histogram=histogram, trace_num_accepted=trace,
      first_round_histogram=rounds)


def tree_loop(target: Any, drafter: TreeModelDrafter,
              encoder_input_tokens: Array, rng: Array, eos_id: Array, *,
              gamma: int, width: int, max_decode_length: int,
              method: sampling.SamplingMethod,
              acceptance: Optional[AcceptanceRule] = None) -> TreeOutput:
  """The traceable tree loop: no argument checks, not jitted (acceptance:
  default: `TreeAcceptance` matching the drafter's branches)."""
  if acceptance is None:
    acceptance = TreeAcceptance(
        first_without_replacement=drafter.first_without_replacement)
  batch = encoder_input_tokens.shape[0]
  # A tree call writes 1 + k·γ slots after ℓ <= max_decode_length.
  target_state = target.start(encoder_input_tokens,
                              max_decode_length + 1 + width * gamma)
  draft_len = max_decode_length + gamma + 1  # As the single-path loop's.
  state = TreeState(
      iteration=jnp.array(0, jnp.int32), target_state=target_state,
      draft_state=drafter.init(encoder_input_tokens, draft_len,
                               target_encoder_output(target, target_state)),
      buffer=_start_buffer(target, encoder_input_tokens, draft_len + 1),
      length=jnp.zeros((batch,), jnp.int32), done=jnp.zeros(
          (batch,), bool), target_calls=jnp.zeros(
              (batch,), jnp.int32), accepted_histogram=jnp.zeros(
                  (batch, gamma + 1), jnp.int32), trace_num_accepted=jnp.full(
                      (batch, max_decode_length), -1,
                      jnp.int32), first_round_histogram=jnp.zeros(
                          (batch, width + 1), jnp.int32))

  def body(s):
    return tree_iteration(target, drafter, acceptance, s, rng, eos_id,
                          gamma=gamma, width=width,
                          max_decode_length=max_decode_length, method=method)

  state = carried_while.while_loop(_running, body, state)
  return TreeOutput(
      tokens=_finish(state.buffer, state.length, max_decode_length),
      lengths=state.length, target_calls=state.target_calls,
      accepted_histogram=state.accepted_histogram,
      trace_num_accepted=state.trace_num_accepted,
      first_round_histogram=state.first_round_histogram)


TREE_PROGRAM = LoopProgram(tree_loop, ("gamma", "width", "max_decode_length"),
                           kernels.CPU_SPECULATIVE_COMPILER_OPTIONS)


def check_tree_args(target: Any, drafter: Any, *, gamma: Any, tree_width: Any,
                    max_decode_length: Any, method, temperature, top_k, top_p,
                    acceptance, without_replacement: Any) -> tuple:
  """`check_speculative_args` plus the tree's own: returns (tree drafter,
  method, acceptance rule); raises ValueError naming the bad argument."""
  if (isinstance(tree_width, bool) or not isinstance(tree_width, int) or
      tree_width < 1):
    raise ValueError(
        f"tree_width must be an integer >= 1 (k branches), got {tree_width!r}.")
  if not isinstance(without_replacement, bool):
    raise ValueError("without_replacement must be True or False, got "
                     f"{without_replacement!r}.")
  rule = TreeAcceptance(first_without_replacement=without_replacement
                       ) if acceptance is None else acceptance
  if (isinstance(rule, TreeAcceptance) and
      rule.first_without_replacement != without_replacement):
    raise ValueError(
        "acceptance.first_without_replacement "
        f"({rule.first_without_replacement}) must equal without_replacement "
        f"({without_replacement}): the rule must know how the branches were "
        "drawn, else it is not exact.")
  drafter = as_tree_drafter(drafter, without_replacement)
  method = checks.check_speculative_args(target, drafter, gamma=gamma,
                                         max_decode_length=max_decode_length,
                                         method=method, temperature=temperature,
                                         top_k=top_k, top_p=top_p,
                                         acceptance=acceptance)
  if not supports_tree(target):
    raise ValueError(
        "target must implement protocols.TreeTarget (decode_tree and "
        f"commit_path) for tree verification; {type(target).__name__} does "
        "not.")
  if method.is_greedy and tree_width > target.vocab_size:
    raise ValueError(
        f"tree_width ({tree_width}) must be <= vocab_size "
        f"({target.vocab_size}): greedy branches start with distinct tokens.")
  return drafter, method, rule


def tree_decoder(target: Any, drafter: Any, *, gamma: int, tree_width: int,
                 max_decode_length: int, method: sampling.SamplingMethod,
                 acceptance: Optional[AcceptanceRule] = None,
                 without_replacement: bool = True, eos_id: int = EOS_ID):
  """`tree_speculative_sample` with its settings checked now, not per call
  (as `decoding.speculative_decoder`): returns decode(encoder_input_tokens
  [B, S] int32, rng) -> `TreeOutput`; the batch is not checked."""
  drafter, method, rule = check_tree_args(
      target, drafter, gamma=gamma, tree_width=tree_width,
      max_decode_length=max_decode_length, method=method, temperature=None,
      top_k=None, top_p=None, acceptance=acceptance,
      without_replacement=without_replacement)
  checks.check_eos_id(eos_id)
  program = TREE_PROGRAM.bound(target, drafter, eos_id=np.int32(eos_id),
                               acceptance=rule, gamma=int(gamma),
                               width=int(tree_width),
                               max_decode_length=int(max_decode_length),
                               method=method)

  def decode(encoder_input_tokens: Array, rng: Array) -> TreeOutput:
    return program(token_batch(encoder_input_tokens), rng)

  return decode


def tree_speculative_sample(target: Any, drafter: Any,
                            encoder_input_tokens: Array, rng: Array, *,
                            gamma: int, tree_width: int, max_decode_length: int,
                            temperature: Optional[float] = None,
                            top_k: Optional[int] = None,
                            top_p: Optional[float] = None,
                            method: Optional[sampling.SamplingMethod] = None,
                            acceptance: Optional[AcceptanceRule] = None,
                            without_replacement: bool = True,
                            eos_id: int = EOS_ID) -> TreeOutput:
  """Speculative decoding with k = tree_width draft branches per target call.

  Exactly the target's output distribution (greedy: token-identical to
  `temperature_sample`). Args as `speculative_sample`, plus:
    tree_width: k >= 1 branches of γ guesses per row (static); k = 1 is
      Algorithm 1.
    target: must implement `protocols.TreeTarget` (`models.T5Model` does).
    drafter: a `ModelDrafter` (no adaptive γ) or a small model, or a
      `FeatureDrafter` (its top-k branches; the target must keep its
      features: `T5Model.with_features()`).
    without_replacement: at T > 0 the k first guesses are drawn without
      replacement from q_1 (distinct; recursive rejection sampling at depth
      1) rather than i.i.d.; both exact.
    acceptance: default `TreeAcceptance(first_without_replacement=
      without_replacement)`; a `TreeAcceptance` must agree with it.

  Returns:
    `TreeOutput`.

  Raises:
    ValueError naming the bad argument, before anything is compiled.
  """
  drafter, method, rule = check_tree_args(
      target, drafter, gamma=gamma, tree_width=tree_width,
      max_decode_length=max_decode_length, method=method,
      temperature=temperature, top_k=top_k, top_p=top_p, acceptance=acceptance,
      without_replacement=without_replacement)
  checks.check_encoder_inputs(encoder_input_tokens, target.vocab_size)
  checks.check_rng(rng)
  checks.check_eos_id(eos_id)
  return TREE_PROGRAM(target, drafter,
                      jnp.asarray(encoder_input_tokens, jnp.int32), rng,
                      np.int32(eos_id), gamma=int(gamma), width=int(tree_width),
                      max_decode_length=int(max_decode_length), method=method,
                      acceptance=rule)
