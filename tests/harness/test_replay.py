"""`replay`: a chain's calls at another γ from one γ's accepted counts,
by hand and against the speculative loop itself (a scripted greedy pair
whose draft guesses right exactly where we say)."""
import subprocess
import sys

import jax
import numpy as np
import pytest

from decoding_helpers import greedy_pair
from specdec_jax.core import decoding
from specdec_jax.core import sampling
from specdec_jax.metrics import overheads
from specdec_jax.metrics import replay

R, W, U = replay.RIGHT, replay.WRONG, replay.UNSEEN
V, EOS, MAX_LEN = 8, 1, 12


def test_matches_and_calls_by_hand():
  # γ 3: all 3 kept (the target's token unseen), 1 kept then a rejection,
  # all 3 kept and the target's token (EOS) ends the row: 10 tokens.
  m = replay.matches([3, 1, 3], gamma=3, length=10)
  np.testing.assert_array_equal(m, [R, R, R, U, R, W, R, R, R, U])
  assert replay.calls_at(m, 3) == 3  # its own γ: its own calls
  assert replay.calls_at(m, 1) == 5  # a guess and the target's, 5 times
  # γ 2: 0-1 kept, 3-4 (unseen counted right), 6-7, then 9 ends it.
  assert replay.calls_at(m, 2) == 4
  assert replay.calls_at(m, 7) == 2  # 0-4 kept, 5 rejected; 6-9 end it
  # The last call ended the row inside its guesses (EOS kept): cut there.
  np.testing.assert_array_equal(replay.matches([3, 2], gamma=3, length=6),
                                [R, R, R, U, R, R])
  with pytest.raises(ValueError, match="fewer than the row's length 9"):
    replay.matches([3, 1], gamma=3, length=9)
  with pytest.raises(ValueError, match="gamma=0"):
    replay.calls_at(m, 0)


def test_expected_max_and_batch_factors_by_hand():
  # Pairs of [1, 2, 3]: maxima 2, 3, 3.
  assert replay.expected_max([3, 1, 2], 2) == pytest.approx(8 / 3)
  # Fewer rows: all of them.
  assert replay.expected_max([3, 1, 2], 5) == pytest.approx(3.0)
  # 1000 of 2000 rows (no float holds C(2000, 1000)): the one long row is
  # in the batch half the time.
  assert replay.expected_max([1] * 1999 + [5], 1000) == pytest.approx(3.0)
  assert replay.expected_max([3, 1, 2], 1) == pytest.approx(2.0)
  with pytest.raises(ValueError, match="batch_size=0"):
    replay.expected_max([3], 0)
  # Two rows in one batch: 4 tokens (every guess right) and 4 (every one
  # wrong), replayed from γ 1. At γ 3 the first needs 1 call, the second
  # 4: (5 calls / 4 iterations) / (8 tokens / 4 iterations).
  counts, lengths = [[1, 1], [0, 0, 0, 0]], [4, 4]
  factors = replay.batch_factors(counts, lengths, 1, [1, 3], batch_size=2)
  assert factors[3] == pytest.approx((5 / 4) / (8 / 4))
  assert factors[1] == pytest.approx(overheads.batch_factor(8, 6, 4, 4))
  # One row a batch: nothing waits.
  assert replay.batch_factors(counts, lengths, 1, [3],
                              batch_size=1) == pytest.approx({3: 1.0})
  with pytest.raises(ValueError, match="lengths has 1 rows"):
    replay.batch_factors(counts, [4], 1, [3], batch_size=2)
  assert replay.batch_factors([[]], [0], 1, [3], batch_size=2) == {}


def _scripted(seed: int, rows: int = 8):
  """Target paths (some end in EOS) and guesses right with chance 0.7."""
  rng = np.random.default_rng(seed)
  paths, guesses = [], []
  for _ in range(rows):
    path = list(rng.integers(2, V - 1, MAX_LEN))
    end = int(rng.integers(2, MAX_LEN + 3))
    if end < MAX_LEN:
      path = path[:end] + [EOS]
    paths.append(path)
    guesses.append(
        [t if rng.random() < 0.7 else (2 if t != 2 else 3) for t in path])
  return paths, guesses


def _decode(pair, gamma):
  target, drafter = pair
  batch = target.expected_fed.shape[0]
  out = decoding.speculative_sample(target, drafter,
                                    np.ones((batch, 2), np.int32),
                                    jax.random.PRNGKey(0), gamma=gamma,
                                    max_decode_length=MAX_LEN,
                                    method=sampling.Greedy(), eos_id=EOS)
  calls = np.asarray(out.target_calls)
  trace = np.asarray(out.trace_num_accepted)
  return ([trace[r, :calls[r]].tolist() for r in range(batch)],
          np.asarray(out.lengths).tolist(), calls.tolist())


def test_the_replay_gives_the_loops_own_calls_at_every_gamma():
  paths, guesses = _scripted(seed=0)
  pair = greedy_pair(paths, guesses, V, length=MAX_LEN + 1)
  decoded = {g: _decode(pair, g) for g in (1, 2, 3, 5)}
  counts, lengths, calls = decoded[3]
  truth = [
      np.asarray([R if g == t else W
                  for g, t in zip(gs, p)][:n], np.int8)
      for gs, p, n in zip(guesses, paths, lengths)
  ]
  unseen = 0
  for row, n, true in zip(counts, lengths, truth):
    m = replay.matches(row, 3, n)
    seen = m != U
    unseen += int(n - seen.sum())
    np.testing.assert_array_equal(m[seen], true[seen])
  assert unseen  # some tokens are the target's after all 3 kept
  for g, (_, g_lengths, g_calls) in decoded.items():
    assert g_lengths == lengths  # T = 0: the same outputs at every γ
    # Every position known: the loop's calls at each γ, row by row.
    assert [replay.calls_at(t, g) for t in truth] == g_calls
  # From γ 3's counts alone: exact at γ 1 and 3 (their blocks never end
  # on an unseen token), and so are the batch factors.
  rows = [replay.matches(c, 3, n) for c, n in zip(counts, lengths)]
  assert [replay.calls_at(m, 1) for m in rows] == decoded[1][2]
  factors = replay.batch_factors(counts, lengths, 3, [1, 3], batch_size=4)
  for g in (1, 3):
    g_calls = decoded[g][2]
    assert factors[g] == pytest.approx(
        np.mean(g_calls) / replay.expected_max(g_calls, 4) /
        (np.mean(lengths) / replay.expected_max(lengths, 4)))
  assert factors[3] < 1.0  # rows of 4 wait for their slowest


def test_a_pilots_factors_are_made_at_most_1_and_non_increasing_in_gamma():
  """16 rows of the main job replayed 1.06, 0.97, 1.02, 1.12 at γ 1-4 and
  `auto` chose γ 4 for its 1.12: clipped to 1 and fitted non-increasing,
  γ 2-4 share their mean (0.97 + 1 + 1) / 3."""
  fitted = replay.monotone({4: 1.12, 1: 1.06, 2: 0.97, 3: 1.02, 5: 0.9})
  assert list(fitted) == [1, 2, 3, 4, 5]
  assert fitted == pytest.approx({1: 1.0, 2: 0.99, 3: 0.99, 4: 0.99, 5: 0.9})
  falling = {1: 1.0, 3: 0.88, 7: 0.72}  # the main job's 60 rows: kept
  assert replay.monotone(falling) == pytest.approx(falling)


def test_the_fit_is_scipys_isotonic_regression_without_its_import():
  """`monotone` pools adjacent violators by hand: scipy.optimize's import
  made the main job's speculative loop slower (its docstring). The same
  fit as scipy's on 500 random factor sets (seed 0), and `run`'s process
  imports no scipy (a fresh one: this one has)."""
  optimize = pytest.importorskip("scipy.optimize")
  rng = np.random.default_rng(0)
  for _ in range(500):
    values = rng.uniform(0.5, 1.2, rng.integers(1, 13))
    fitted = replay.monotone(dict(enumerate(values)))
    expected = optimize.isotonic_regression(np.minimum(values, 1.0),
                                            increasing=False).x
    assert list(fitted.values()) == pytest.approx(list(expected))
  code = ("import sys, specdec_jax.run\n"
          "print(sorted(m for m in sys.modules if m.startswith('scipy')))")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, timeout=300, check=True)
  assert proc.stdout.strip() == "[]", proc.stdout[:500]
