"""Test doubles and references for the decode loops.

* `ScriptedTarget`: a target whose logits at decoder position t of row b are
  scripted: position_logits[b, t] + bigram[token fed at t]. In strict mode
  (expected_fed >= 0) a token fed at a position where the script expects
  another one gets POISON logits (argmax = vocab - 1): a loop that feeds,
  or reads the logits of, a wrong position emits vocab - 1.
* `overflow_checks()` / `check_fits`: the stubs' assertion that a chunk
  fits their state, traced only inside the block (as `T5Model`'s inside
  `traced_overflow_checks()`), for tests that run a loop under checkify.
* `ScriptedDrafter`: guesses from a script, guess_logits[b, t] for buffer
  position t, independent of the context: deterministic (argmax, no q) or
  sampled with the loop's method (returns q).
* `reference_standardize`: sort-based temperature / top-k / top-p in
  float64, the textbook definitions, independent of `sampling`.
* `sequence_distribution`: the exact distribution of the first tokens of a
  scripted target, by enumeration; `model_sequence_distribution`: the same
  for a T5 model, from one forward pass over every prefix.
"""
import contextlib
import contextvars
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify
from scipy import stats

from specdec_jax.core import drafters
from specdec_jax.core import structs
from specdec_jax.core.models import Transformer

POISON_LOGIT = 100.0

# Off unless a test asks: a traced `checkify.debug_check` bakes a
# process-wide error code (how many checks were traced before it) into the
# program, so a stub program traced with one differed from run to run with
# what its worker had traced before, and the persistent compilation cache
# never served it again (every scripted loop was compiled in every run).
_OVERFLOW_CHECKS = contextvars.ContextVar("tests_stub_overflow_checks",
                                          default=False)


@contextlib.contextmanager
def overflow_checks():
  """Within it, the stubs trace their overflow assertion (`check_fits`): an
  error under `jax.experimental.checkify.checkify`. Trace a fresh function
  inside the block (jit caches programs traced before it)."""
  token = _OVERFLOW_CHECKS.set(True)
  try:
    yield
  finally:
    _OVERFLOW_CHECKS.reset(token)


def check_fits(pred, message: str) -> None:
  """A stub's `checkify.debug_check(pred, message)`, inside
  `overflow_checks()` only."""
  if _OVERFLOW_CHECKS.get():
    checkify.debug_check(pred, message)


@structs.dataclass
class StubState:
  """A target state: only the per-row length L (positions 0..L-1 held)."""
  length: jax.Array
  max_len: int = structs.field(pytree_node=False)


@structs.dataclass
class ScriptedTarget:
  """Implements `decoding.Target` with scripted logits (see the module doc).

  Attributes:
    position_logits: [B or 1, T, V] logits by decoder position.
    bigram: [V, V] added by the token fed at the position.
    expected_fed: [B or 1, T] int32 tokens the script expects to be fed at
      each position (-1: any).
  """
  position_logits: jax.Array
  bigram: jax.Array
  expected_fed: jax.Array

  @property
  def vocab_size(self) -> int:
    return self.position_logits.shape[-1]

  def start_token(self, encoder_input_tokens):
    return jnp.zeros((encoder_input_tokens.shape[0],), jnp.int32)

  def length(self, state):
    return state.length

  def start(self, encoder_input_tokens, max_len):
    return StubState(jnp.zeros((encoder_input_tokens.shape[0],), jnp.int32),
                     max_len)

  def decode_chunk(self, tokens, state):
    batch, k = tokens.shape
    # The loop must never write past the end of the state (checked under
    # checkify, as T5Model.decode_chunk does).
    check_fits(jnp.all(state.length + k <= state.max_len),
               "stub target: chunk past max_len")
    table = self.position_logits
    last = table.shape[1] - 1
    pos = jnp.minimum(state.length[:, None] + jnp.arange(k)[None, :], last)
    table = jnp.broadcast_to(table, (batch,) + table.shape[1:])
    logits = jnp.take_along_axis(table, pos[..., None], axis=1)
    logits = logits + self.bigram[tokens]
    expected = jnp.take_along_axis(
        jnp.broadcast_to(self.expected_fed, (batch, last + 1)), pos, axis=1)
    wrong = (expected >= 0) & (tokens != expected)
    poison = POISON_LOGIT * jax.nn.one_hot(self.vocab_size - 1, self.vocab_size)
    logits = jnp.where(wrong[..., None], poison, logits)
    return logits.astype(jnp.float32), state.replace(length=state.length + k)

  def truncate(self, state, length):
    return state.replace(length=jnp.minimum(state.length, length))


@structs.dataclass
class ScriptedDrafter(drafters.Drafter):
  """Guesses guess_logits[b, t] for buffer position t, whatever the context.

  Deterministic (argmax, draft_probs None) unless `sample`, which draws
  each guess with the loop's method and returns its q.
  """
  guess_logits: jax.Array  # [B or 1, T, V]
  sample: bool = structs.field(pytree_node=False, default=False)

  @property
  def vocab_size(self) -> int:
    return self.guess_logits.shape[-1]

  def init(self, encoder_input_tokens, max_len, encoder_output=None):
    return ()

  def propose(self, state, buffer, length, rng, *, gamma, method):
    batch = buffer.shape[0]
    table = self.guess_logits
    last = table.shape[1] - 1
    pos = jnp.minimum(length[:, None] + 1 + jnp.arange(gamma)[None, :], last)
    table = jnp.broadcast_to(table, (batch,) + table.shape[1:])
    logits = jnp.take_along_axis(table, pos[..., None], axis=1)
    if not self.sample:
      return state, jnp.argmax(logits, axis=-1).astype(jnp.int32), None
    tokens, probs = method.draw(rng, logits)
    return state, tokens, probs

  def rollback(self, state, length):
    return state


def one_hot_script(rows, vocab, length, scale=10.0):
  """[B, length, V] logits whose argmax at position t is rows[b][t]."""
  out = np.zeros((len(rows), length, vocab), np.float32)
  for b, row in enumerate(rows):
    for t, tok in enumerate(row[:length]):
      out[b, t, tok] = scale
  return out


def greedy_pair(paths, guesses, vocab, length=16):
  """A strict scripted target whose greedy output is `paths` and a
  deterministic drafter guessing `guesses`.

  paths[b] = [y_1, y_2, ...] the target's tokens; guesses[b] = [g_1, ...]
  the guess for generated token t (buffer position t). Both are padded to
  `length` with token 2.
  """

  def pad(row, n):
    return list(row) + [2] * (n - len(row))

  ys = [[0] + pad(p, length) for p in paths]  # ys[b][t]: buffer position t.
  # Position t's logits predict the token at t + 1.
  target = ScriptedTarget(
      position_logits=jnp.asarray(
          one_hot_script([y[1:] for y in ys], vocab, length)), bigram=jnp.zeros(
              (vocab, vocab), jnp.float32),
      expected_fed=jnp.asarray([y[:length] for y in ys], jnp.int32))
  draft = ScriptedDrafter(
      jnp.asarray(
          one_hot_script([[0] + pad(g, length) for g in guesses], vocab,
                         length + 1)))
  return target, draft


# ---------------------------------------------------------------------------
# References.
# ---------------------------------------------------------------------------
def reference_standardize(logits, temperature, top_k, top_p):
  """Sort-based top-k/top-p in float64 (the textbook definitions)."""
  x = np.asarray(logits, np.float64)
  if temperature == 0:
    return np.eye(x.shape[-1])[np.argmax(x, axis=-1)]
  x = x / temperature
  if 0 < top_k < x.shape[-1]:
    kth = np.sort(x, axis=-1)[..., -top_k, None]
    x = np.where(x >= kth, x, -np.inf)
  probs = np.exp(x - x.max(axis=-1, keepdims=True))
  probs /= probs.sum(axis=-1, keepdims=True)
  if top_p < 1.0:
    ordered = -np.sort(-probs, axis=-1)
    before = np.cumsum(ordered, axis=-1) - ordered
    threshold = np.min(np.where(before < top_p, ordered, np.inf), axis=-1,
                       keepdims=True)
    probs = np.where(probs >= threshold, probs, 0.0)
    probs /= probs.sum(axis=-1, keepdims=True)
  return probs


def sequence_distribution(next_probs, vocab, steps, eos):
  """{first `steps` tokens (0-padded after EOS): probability}.

  next_probs(prefix tuple) -> [V] float64 distribution of the next token.
  """
  out = {}

  def walk(prefix, mass):
    if len(prefix) == steps or (prefix and prefix[-1] == eos):
      out[prefix + (0,) * (steps - len(prefix))] = mass
      return
    probs = next_probs(prefix)
    for tok in range(vocab):
      if probs[tok] > 0:
        walk(prefix + (tok,), mass * probs[tok])

  walk((), 1.0)
  return out


def model_sequence_distribution(model, inputs, method_args, vocab, steps, eos):
  """{first `steps` tokens (0-padded after EOS): probability} of a T5 model.

  Every prefix of fewer than `steps` tokens is scored in one forward pass
  (teacher forcing, the model's own code but no decode loop) and its next
  token's distribution taken from `reference_standardize(logits,
  *method_args)`: the textbook definitions, not the code under test.

  Args:
    model: a `T5Model` (its `config` and `params`).
    inputs: [1, L] int32 encoder input.
    method_args: (temperature, top_k, top_p).
    vocab, steps, eos: the enumeration's vocabulary size, length and EOS.
  """
  prefixes = [()]
  for length in range(1, steps):
    prefixes += list(itertools.product(range(vocab), repeat=length))
  dec = np.zeros((len(prefixes), steps), np.int32)
  for i, prefix in enumerate(prefixes):
    dec[i, 1:len(prefix) + 1] = prefix
  enc = np.repeat(inputs, len(prefixes), axis=0)
  logits = jax.jit(Transformer(model.config).apply)(model.params, enc, dec,
                                                    np.ones_like(dec))
  lengths = np.array([len(p) for p in prefixes])
  last = np.asarray(logits)[np.arange(len(prefixes)), lengths]
  table = dict(zip(prefixes, reference_standardize(last, *method_args)))
  return sequence_distribution(lambda p: table[p], vocab, steps, eos)


def scripted_next_probs(target: ScriptedTarget, method_args):
  """next_probs for `sequence_distribution` of a (row-0) scripted target."""
  table = np.asarray(target.position_logits)[0]
  bigram = np.asarray(target.bigram)

  def next_probs(prefix):
    fed = ((0,) + prefix)[-1]  # Position len(prefix) is fed the last token.
    return reference_standardize(table[len(prefix)] + bigram[fed], *method_args)

  return next_probs


def chisquare_pvalue(observed, probs):
  """Goodness of fit of counts to probabilities, sparse cells pooled."""
  expected = probs / probs.sum() * observed.sum()
  order = np.argsort(expected)
  small = order[np.cumsum(expected[order]) < 20]
  big = np.setdiff1d(np.arange(len(expected)), small)
  obs, exp = observed[big], expected[big]
  if small.size:
    obs = np.append(obs, observed[small].sum())
    exp = np.append(exp, expected[small].sum())
  return stats.chisquare(obs, exp)[1]


def count_sequences(tokens, exact, impossible_ok=False):
  """Observed counts of each key of `exact`; fails on impossible rows
  (impossible_ok: leaves them out)."""
  keys = sorted(exact)
  index = {k: i for i, k in enumerate(keys)}
  observed = np.zeros(len(keys))
  for row in map(tuple, np.asarray(tokens).tolist()):
    if row not in index and impossible_ok:
      continue
    assert row in index, f"sequence {row} has probability 0 under the target"
    observed[index[row]] += 1
  return observed, np.array([exact[k] for k in keys])
