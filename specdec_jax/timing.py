"""How a decoder call is timed: the one definition behind c and the K-curve.

Theorem 3.8 prices an iteration of Algorithm 1 as γ draft steps plus one
target call, in units of one target step. `decode_call_seconds` times any of
these the same way, in the conditions of the decoding loop:

* the model is called on a cache of `cache_len` slots (the loop's: attention
  reads every slot, so a short cache would flatter a step), filled to
  `fill` positions, with chunks of `k` tokens per row;
* `steps` calls run inside one compiled `lax.fori_loop`, each rewinding the
  cache to `fill` (a rollback by index, as the loop does), so per-call
  dispatch is the loop's, not Python's;
* compilation is excluded (one untimed call first); the result is the median
  over `repeats` of wall time / steps, each ending with `block_until_ready`.

The cost coefficient c = draft step / target step (both k = 1), and the
verification ratio = target call at k = γ+1 / target step: Theorem 3.8
assumes 1; on a CPU it is measured (`analysis.speedup_with_call_cost`).
"""
import functools
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@functools.partial(jax.jit, static_argnames=("max_len",))
def start(model, encoder_input_tokens, *, max_len):
  """`model.start` jitted (max_len static): the cache a timed call runs on."""
  return model.start(encoder_input_tokens, max_len)


@functools.partial(jax.jit, static_argnames=("k", "steps"))
def call_loop(model, cache, fill, *, k: int, steps: int):
  """`steps` k-token calls at positions fill..fill+k-1; returns a checksum.

  The program every per-call time in the project runs (`run`'s c and
  verification cost, the decode benchmark's K-curve and c).

  Args:
    model: has `decode_chunk(tokens [B, k], cache)`.
    cache: a cache from `model.start`, at least fill + k slots.
    fill: [B] int32 cache length each call starts from.
  """
  batch = fill.shape[0]

  def body(i, carry):
    cache, acc = carry
    # Token ids vary with i so no call can be hoisted out of the loop.
    tokens = jnp.full((batch, k), 3, jnp.int32) + (i % 2)
    logits, cache = model.decode_chunk(tokens, cache.replace(length=fill))
    return cache, acc + logits[:, -1, 0]

  _, acc = jax.lax.fori_loop(0, steps, body,
                             (cache, jnp.zeros((batch,), jnp.float32)))
  return acc


def timed(fn, *args) -> Any:
  """(fn(*args) ready, seconds): wall time including `block_until_ready`."""
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return out, time.perf_counter() - start


def decode_call_seconds(model, encoder_input_tokens: np.ndarray, *, k: int,
                        fill: int, cache_len: int, steps: int = 16,
                        repeats: int = 5) -> float:
  """Median seconds of one k-token decoder call (compilation excluded).

  Args:
    model: a `T5Model` (or anything with `start` and `decode_chunk`).
    encoder_input_tokens: [B, S] int32 inputs the cache is built from.
    k: tokens per row per call (1 = a decode step; γ+1 = a verification).
    fill: cache positions already written before each call.
    cache_len: cache slots, as in the decoding loop being priced.
    steps, repeats: calls per timed program, timed programs (median).
  """
  if not 0 <= fill <= cache_len - k:
    raise ValueError(f"fill={fill} and k={k} must fit in cache_len="
                     f"{cache_len} slots (0 <= fill <= cache_len - k).")
  cache = start(model, jnp.asarray(encoder_input_tokens, jnp.int32),
                 max_len=cache_len)
  fill_rows = jnp.full((cache.length.shape[0],), fill, jnp.int32)
  jax.block_until_ready(call_loop(model, cache, fill_rows, k=k,
                                   steps=steps))  # Compile.
  times = [timed(functools.partial(call_loop, k=k, steps=steps), model,
                 cache, fill_rows)[1] for _ in range(repeats)]
  return statistics.median(times) / steps
