"""Closed-form analysis of speculative decoding (numpy only, no JAX).

Formulas from Leviathan, Kalman & Matias, "Fast Inference from Transformers
via Speculative Decoding" (ICML 2023), Section 3:

* Definition 3.2: the acceptance rate alpha = E[beta], where beta is the
  probability that a draft token is accepted at one position.
* Corollary 3.6: beta = sum_x min(p(x), q(x)) = 1 - D_LK(p, q).
* Equation (1): expected tokens produced per target-model call (one
  iteration of Algorithm 1), (1 - alpha^(gamma+1)) / (1 - alpha).
* Theorem 3.8: expected walltime improvement factor
  (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)), c = cost coefficient
  (draft step time / target step time, Definition 3.7).
* Theorem 3.11: expected factor of increase in arithmetic operations
  (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)).
* Figure 3: the optimal integer gamma as a function of alpha and c.
* Section 3.5: the best a per-iteration gamma could do, given the
  measured acceptances (`per_iteration_gamma_bound`).

All formula functions broadcast over numpy arrays; they return a Python
float when every argument is a scalar. Invalid arguments raise ValueError
naming the argument, the offending value and the allowed range.
"""
import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

ArrayLike = Union[float, int, Sequence[float], np.ndarray]

__all__ = [
    "expected_tokens_per_iteration",
    "expected_speedup",
    "optimal_gamma",
    "speedup_at_optimal_gamma",
    "expected_arithmetic_increase",
    "beta_from_distributions",
    "alpha_from_acceptance_counts",
    "alpha_standard_error_from_counts",
    "alpha_from_beta_samples",
    "cost_coefficient",
    "theory_vs_measured",
    "per_iteration_gamma_bound",
]

# ----------------------------------------------------------------------------
# Validation helpers.
# ----------------------------------------------------------------------------


def _as_float_array(name: str, value: Any) -> np.ndarray:
  try:
    arr = np.asarray(value, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name}={value!r} is not numeric: {e}") from None
  return arr


def _first_bad(arr: np.ndarray, bad: np.ndarray) -> float:
  return float(arr[bad].ravel()[0]) if arr.ndim else float(arr)


def _check_alpha(alpha: Any, name: str = "alpha") -> np.ndarray:
  a = _as_float_array(name, alpha)
  bad = ~((a >= 0.0) & (a <= 1.0))  # Also catches NaN.
  if np.any(bad):
    raise ValueError(
        f"{name}={_first_bad(a, bad)!r} is outside the allowed range [0, 1]")
  return a


def _check_gamma(gamma: Any, name: str = "gamma") -> np.ndarray:
  g = _as_float_array(name, gamma)
  bad = ~(g >= 1.0) | ~np.isfinite(g)
  if np.any(bad):
    raise ValueError(
        f"{name}={_first_bad(g, bad)!r} is outside the allowed range "
        "[1, inf) (number of draft tokens per iteration)")
  return g


def _check_nonneg(value: Any, name: str) -> np.ndarray:
  v = _as_float_array(name, value)
  bad = ~(v >= 0.0) | ~np.isfinite(v)
  if np.any(bad):
    raise ValueError(
        f"{name}={_first_bad(v, bad)!r} is outside the allowed range [0, inf)")
  return v


def _maybe_scalar(x: np.ndarray, *args: Any) -> Union[float, np.ndarray]:
  if all(np.ndim(a) == 0 for a in args):
    return float(x)
  return x


# ----------------------------------------------------------------------------
# Closed forms.
# ----------------------------------------------------------------------------


def expected_tokens_per_iteration(alpha: ArrayLike,
                                  gamma: ArrayLike) -> Union[float, np.ndarray]:
  """Expected number of tokens generated per target call, Equation (1).

  E[# generated tokens] = (1 - alpha^(gamma+1)) / (1 - alpha), the mean of a
  capped geometric variable (Section 3.3): each of the gamma draft tokens is
  accepted with probability alpha until the first rejection, and the target
  model always contributes one more token. The alpha -> 1 limit is gamma + 1.

  Args:
    alpha: acceptance rate(s) in [0, 1] (Definition 3.2).
    gamma: number(s) of draft tokens per iteration, >= 1.

  Returns:
    A float (scalar inputs) or an array broadcast over the inputs.
  """
  a = _check_alpha(alpha)
  g = _check_gamma(gamma)
  a, g = np.broadcast_arrays(a, g)
  one = a >= 1.0
  safe_a = np.where(one, 0.5, a)
  value = np.where(one, g + 1.0, (1.0 - safe_a**(g + 1.0)) / (1.0 - safe_a))
  return _maybe_scalar(value, alpha, gamma)


def expected_target_calls(alpha: float, gamma: int, length: int) -> float:
  """Expected target calls to emit `length` tokens (EOS included) when each
  guess is kept with probability alpha, independently.

  A call emits N tokens, P(N = n) = alpha^(n-1) (1 - alpha) for n <= gamma
  and P(N = gamma + 1) = alpha^gamma (Equation (1)'s capped geometric), but
  the sentence's last call emits only what is left: E[calls(r)] = 1 +
  sum_n P(N = n) E[calls(r - n)], E[calls(r <= 0)] = 0. Equation (1) is the
  limit of length / E[calls(length)] for long outputs.

  Raises:
    ValueError: alpha outside [0, 1], gamma < 1 or length < 0.
  """
  a = float(_check_alpha(alpha))
  g = int(_check_gamma(gamma))
  if not isinstance(length, (int, np.integer)) or length < 0:
    raise ValueError(f"length={length!r} is outside the allowed range: a "
                     "non-negative integer.")
  probs = np.array([a**(n - 1) * (1 - a) for n in range(1, g + 1)] + [a**g])
  calls = np.zeros(int(length) + 1)
  for r in range(1, int(length) + 1):
    rest = calls[np.maximum(r - np.arange(1, g + 2), 0)]
    calls[r] = 1.0 + probs @ rest
  return float(calls[-1])


def expected_tokens_per_call_with_ends(alpha: float, gamma: int,
                                       lengths: Sequence[int]) -> float:
  """Tokens per target call over outputs of these lengths (i.i.d.
  acceptance, each sentence's last call cut at its end): sum(lengths) /
  sum(E[calls(length)]) (`expected_target_calls`). Below Equation (1)'s
  value, the more so the shorter the outputs.

  Raises:
    ValueError: no lengths, or all of them 0; as `expected_target_calls`.
  """
  lengths = [int(x) for x in lengths]
  if not lengths or sum(lengths) == 0:
    raise ValueError(f"lengths must hold a positive total, got {lengths[:8]}.")
  calls = {n: expected_target_calls(alpha, gamma, n) for n in set(lengths)}
  return sum(lengths) / sum(calls[n] for n in lengths)


def expected_speedup(alpha: ArrayLike, gamma: ArrayLike,
                     cost_coefficient: ArrayLike,
                     call_cost: ArrayLike = 1.0) -> Union[float, np.ndarray]:
  """Expected walltime improvement factor, Theorem 3.8.

  (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)): Equation (1)'s tokens
  per iteration divided by the cost of one iteration (gamma draft steps of
  relative cost c plus one target call), in units of target steps.

  Args:
    alpha: acceptance rate(s) in [0, 1].
    gamma: draft tokens per iteration, >= 1.
    cost_coefficient: c >= 0, draft step time / target step time
      (Definition 3.7).
    call_cost: the (gamma+1)-token target call in target steps. The theorem
      assumes 1 (the call is as fast as a step, true where a step is
      memory-bound); pass a measured ratio (`timing`) to price a backend
      where it is not (the denominator becomes gamma c + call_cost).
  """
  c = _check_nonneg(cost_coefficient, "cost_coefficient")
  call = _as_float_array("call_cost", call_cost)
  if np.any(~(call > 0)):
    raise ValueError(f"call_cost={_first_bad(call, ~(call > 0))!r} is "
                     "outside the allowed range: a positive number.")
  tokens = np.asarray(expected_tokens_per_iteration(alpha, gamma))
  g = np.asarray(gamma, dtype=np.float64)
  value = tokens / (g * c + call)
  return _maybe_scalar(value, alpha, gamma, cost_coefficient, call_cost)


def optimal_gamma(alpha: float, cost_coefficient: float, max_gamma: int = 64,
                  call_costs: Optional[ArrayLike] = None) -> int:
  """Integer gamma in [1, max_gamma] maximizing Theorem 3.8 (Figure 3).

  Ties are broken towards the smaller gamma (fewer wasted draft steps).
  Note that by Corollary 3.9 the speedup at the optimum exceeds 1 only when
  alpha > c; the maximizing gamma is returned regardless.

  Args:
    alpha: acceptance rate in [0, 1] (scalar).
    cost_coefficient: c >= 0 (scalar).
    max_gamma: largest gamma considered, >= 1.
    call_costs: None (the theorem: a verification call costs one step), or
      [max_gamma] measured costs of the (gamma+1)-token call in target
      steps, entry gamma-1 for gamma (see `expected_speedup`).
  """
  if np.ndim(alpha) or np.ndim(cost_coefficient):
    raise ValueError("optimal_gamma takes scalar alpha and cost_coefficient; "
                     f"got shapes {np.shape(alpha)} and "
                     f"{np.shape(cost_coefficient)}")
  _check_gamma(max_gamma, "max_gamma")
  gammas = np.arange(1, int(max_gamma) + 1, dtype=np.float64)
  call = 1.0 if call_costs is None else np.asarray(call_costs, np.float64)
  if np.shape(call) not in ((), gammas.shape):
    raise ValueError(f"call_costs has shape {np.shape(call)}; allowed: "
                     f"None or one cost per gamma, shape ({len(gammas)},).")
  speedups = expected_speedup(alpha, gammas, cost_coefficient, call)
  return int(gammas[int(np.argmax(speedups))])


def speedup_at_optimal_gamma(alpha: float, cost_coefficient: float,
                             max_gamma: int = 64) -> float:
  """Theorem 3.8's speedup at `optimal_gamma(alpha, c, max_gamma)`."""
  g = optimal_gamma(alpha, cost_coefficient, max_gamma)
  return float(expected_speedup(alpha, g, cost_coefficient))


def expected_arithmetic_increase(
    alpha: ArrayLike, gamma: ArrayLike,
    cost_coefficient_hat: ArrayLike) -> Union[float, np.ndarray]:
  """Expected factor of increase in arithmetic operations, Theorem 3.11.

  (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)), where c_hat
  is the ratio of arithmetic operations per token of the draft to the target
  model. The alpha -> 1 limit is (gamma c_hat + gamma + 1) / (gamma + 1).
  """
  c_hat = _check_nonneg(cost_coefficient_hat, "cost_coefficient_hat")
  tokens = np.asarray(expected_tokens_per_iteration(alpha, gamma))
  g = np.asarray(gamma, dtype=np.float64)
  value = (g * c_hat + g + 1.0) / tokens
  return _maybe_scalar(value, alpha, gamma, cost_coefficient_hat)


# ----------------------------------------------------------------------------
# Estimating alpha and c from measurements.
# ----------------------------------------------------------------------------


def beta_from_distributions(p: ArrayLike,
                            q: ArrayLike) -> Union[float, np.ndarray]:
  """beta = sum_x min(p(x), q(x)) over the last axis, Corollary 3.6.

  Args:
    p: target distribution(s), shape [..., vocab].
    q: draft distribution(s), same shape.
  """
  p = _as_float_array("p", p)
  q = _as_float_array("q", q)
  if p.shape != q.shape:
    raise ValueError(f"p and q must have the same shape; got {p.shape} and "
                     f"{q.shape}")
  value = np.minimum(p, q).sum(axis=-1)
  return float(value) if value.ndim == 0 else value


def _check_histogram(histogram: ArrayLike, gamma: int) -> np.ndarray:
  g = _check_gamma(gamma)
  if g.ndim or g != int(g):
    raise ValueError(f"gamma={gamma!r} must be a single integer >= 1")
  h = _as_float_array("histogram", histogram)
  if h.ndim != 1:
    raise ValueError(f"histogram must be 1-D; got shape {h.shape}")
  if h.size > int(g) + 1:
    raise ValueError(
        f"histogram has {h.size} bins but only k in {{0..gamma={int(g)}}} "
        f"accepted tokens are possible (at most {int(g) + 1} bins)")
  bad = ~(h >= 0) | ~np.isfinite(h)
  if np.any(bad):
    raise ValueError(f"histogram count {_first_bad(h, bad)!r} is outside the "
                     "allowed range [0, inf)")
  return h


def _successes_trials(histogram: ArrayLike, gamma: int) -> Tuple[float, float]:
  h = _check_histogram(histogram, gamma)
  k = np.arange(h.size, dtype=np.float64)
  successes = float(np.sum(k * h))
  trials = float(np.sum(np.minimum(k + 1.0, float(gamma)) * h))
  return successes, trials


def alpha_from_acceptance_counts(histogram: ArrayLike, gamma: int) -> float:
  """Maximum-likelihood alpha from the accepted-token histogram.

  Under the i.i.d. assumption of Section 3.3 (Definition 3.2), each iteration
  is a run of Bernoulli(alpha) trials that stops at the first rejection or
  after gamma acceptances. With h[k] = number of target calls in which k in
  {0..gamma} draft tokens were accepted:

    successes = sum_k k h[k],   trials = sum_k min(k + 1, gamma) h[k],

  and alpha_hat = successes / trials (nan if there were no trials). This is
  the estimator whose plug-in into Equation (1) matches the measured number
  of tokens per target call.

  Args:
    histogram: counts h[0..gamma] (a shorter histogram is zero-padded).
    gamma: draft tokens per iteration used in the run.
  """
  successes, trials = _successes_trials(histogram, gamma)
  if trials == 0:
    return math.nan
  return successes / trials


def alpha_standard_error_from_counts(histogram: ArrayLike, gamma: int) -> float:
  """Standard error of `alpha_from_acceptance_counts`.

  The Bernoulli log-likelihood is the same under the sequential stopping rule,
  so the observed Fisher information at the MLE is trials / (a (1 - a)), and
  the standard error is sqrt(a (1 - a) / trials) (nan if no trials).
  """
  successes, trials = _successes_trials(histogram, gamma)
  if trials == 0:
    return math.nan
  a = successes / trials
  return math.sqrt(a * (1.0 - a) / trials)


def alpha_from_beta_samples(betas: ArrayLike) -> Tuple[float, float]:
  """alpha = E[beta] from per-position beta samples (Corollary 3.6).

  Each beta = sum_x min(p(x), q(x)) is computed from the target and draft
  distributions at one decoded position (`beta_from_distributions`).

  Returns:
    (mean, standard error of the mean); (nan, nan) for no samples and
    standard error nan for a single sample.
  """
  b = _as_float_array("betas", betas).ravel()
  tol = 1e-6  # Float round-off in sum_x min(p, q).
  bad = ~((b >= -tol) & (b <= 1.0 + tol))
  if np.any(bad):
    raise ValueError(f"betas contains {_first_bad(b, bad)!r}, outside the "
                     "allowed range [0, 1]")
  b = np.clip(b, 0.0, 1.0)
  if b.size == 0:
    return math.nan, math.nan
  mean = float(b.mean())
  if b.size < 2:
    return mean, math.nan
  return mean, float(b.std(ddof=1) / math.sqrt(b.size))


def cost_coefficient(draft_step_s: ArrayLike,
                     target_step_s: ArrayLike) -> Union[float, np.ndarray]:
  """c = draft step walltime / target step walltime (Definition 3.7)."""
  d = _check_nonneg(draft_step_s, "draft_step_s")
  t = _as_float_array("target_step_s", target_step_s)
  bad = ~(t > 0.0) | ~np.isfinite(t)
  if np.any(bad):
    raise ValueError(f"target_step_s={_first_bad(t, bad)!r} is outside the "
                     "allowed range (0, inf)")
  return _maybe_scalar(d / t, draft_step_s, target_step_s)


# ----------------------------------------------------------------------------
# Theory vs measurement (Table 4 style).
# ----------------------------------------------------------------------------


def theory_vs_measured(
    points: Iterable[Mapping[str, Any]]) -> List[Dict[str, Any]]:
  """Compares measured speedups with Theorem 3.8 and Equation (1).

  Args:
    points: dicts with `gamma`, `alpha`, `cost_coefficient_c`, `speedup`
      (measured walltime improvement) and optionally `tokens_per_target_call`
      (measured tokens per speculative target call).

  Returns:
    New dicts (the inputs are not modified) with the input keys plus
    `theoretical_speedup` (Theorem 3.8), `expected_tokens_per_call`
    (Equation (1)) and `speedup_ratio` = measured / theoretical; when
    `tokens_per_target_call` is given, also `tokens_per_call_ratio` =
    measured / expected.
  """
  out = []
  for i, point in enumerate(points):
    missing = [
        k for k in ("gamma", "alpha", "cost_coefficient_c", "speedup")
        if k not in point
    ]
    if missing:
      raise ValueError(f"point {i} is missing keys {missing}")
    row = dict(point)
    gamma = point["gamma"]
    alpha = point["alpha"]
    c = point["cost_coefficient_c"]
    row["theoretical_speedup"] = float(expected_speedup(alpha, gamma, c))
    row["expected_tokens_per_call"] = float(
        expected_tokens_per_iteration(alpha, gamma))
    row["speedup_ratio"] = float(point["speedup"]) / row["theoretical_speedup"]
    if point.get("tokens_per_target_call") is not None:
      row["tokens_per_call_ratio"] = (float(point["tokens_per_target_call"]) /
                                      row["expected_tokens_per_call"])
    out.append(row)
  return out


# ----------------------------------------------------------------------------
# Per-iteration gamma (Section 3.5).
# ----------------------------------------------------------------------------


def per_iteration_gamma_bound(kept: ArrayLike, guessed: ArrayLike, gamma: int,
                              cost_coefficient: float,
                              tokens: int) -> Dict[str, float]:
  """Speedups of one run's iterations under Theorem 3.8's cost model.

  An iteration costs one target call (1) plus c per draft guess, in target
  steps; the target alone makes one token per step. From the measured
  iterations i (target calls), with k_i guesses kept and g_i guesses made:

  * `fixed`: every iteration drafts gamma guesses,
    tokens / sum(1 + c gamma);
  * `achieved`: each drafts the g_i it did (adaptive gamma: g_i <= gamma),
    tokens / sum(1 + c g_i);
  * `oracle`: each drafts exactly the k_i guesses that were kept, the best
    a per-iteration gamma could do with these acceptances (§3.5):
    tokens / sum(1 + c k_i). (When all gamma were kept the oracle might
    have drafted more; it is capped at gamma like the run.)

  Args:
    kept: [iterations] guesses kept per target call.
    guessed: [iterations] guesses made per target call (<= gamma).
    gamma: the maximum guesses per call.
    cost_coefficient: c >= 0 (Definition 3.7).
    tokens: tokens generated by these iterations.

  Returns:
    {"fixed", "achieved", "oracle"} speedups (nan for no iterations).
  """
  k = _as_float_array("kept", kept).ravel()
  g = _as_float_array("guessed", guessed).ravel()
  c = float(_check_nonneg(cost_coefficient, "cost_coefficient"))
  gamma = float(_check_gamma(gamma))
  if k.shape != g.shape:
    raise ValueError(f"kept and guessed must have the same length; got "
                     f"{k.size} and {g.size}")
  bad = ~((k >= 0) & (k <= g) & (g <= gamma))
  if np.any(bad):
    i = int(np.argmax(bad))
    raise ValueError(f"iteration {i}: kept={k[i]:g}, guessed={g[i]:g} must "
                     f"satisfy 0 <= kept <= guessed <= gamma={gamma:g}")
  if k.size == 0:
    return {"fixed": math.nan, "achieved": math.nan, "oracle": math.nan}
  calls = float(k.size)
  return {
      "fixed": tokens / (calls * (1.0 + c * gamma)),
      "achieved": tokens / (calls + c * g.sum()),
      "oracle": tokens / (calls + c * k.sum())
  }
