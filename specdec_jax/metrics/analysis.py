"""The paper's closed forms (Leviathan et al., ICML 2023, Section 3), numpy
only: Equation (1), Theorem 3.8 (optimal γ: Figure 3), Theorem 3.11,
Corollary 3.6's β, α and c from measurements, §3.5's per-iteration-γ bound.

Formula functions broadcast over numpy arrays and return a Python float
when every argument is a scalar; invalid arguments raise ValueError naming
the argument, the value and the allowed range.
"""
import math
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

ArrayLike = Union[float, int, Sequence[float], np.ndarray]

# -- Validation helpers ------------------------------------------------------


def _as_float_array(name: str, value: Any) -> np.ndarray:
  try:
    arr = np.asarray(value, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name}={value!r} is not numeric: {e}") from None
  return arr


def _in_range(name: str, value: Any, ok: Callable[[np.ndarray], np.ndarray],
              allowed: str) -> np.ndarray:
  """`value` as a float array; ValueError naming its first value outside
  `allowed` (where `ok` is false: NaN always is)."""
  arr = _as_float_array(name, value)
  bad = ~ok(arr)
  if np.any(bad):
    first = float(arr[bad].ravel()[0]) if arr.ndim else float(arr)
    raise ValueError(f"{name}={first!r} is outside the allowed range "
                     f"{allowed}")
  return arr


def _check_alpha(alpha: Any) -> np.ndarray:
  return _in_range("alpha", alpha, lambda a: (a >= 0.0) & (a <= 1.0), "[0, 1]")


def _check_gamma(gamma: Any, name: str = "gamma") -> np.ndarray:
  return _in_range(name, gamma, lambda g: (g >= 1.0) & np.isfinite(g),
                   "[1, inf) (number of draft tokens per iteration)")


def _check_nonneg(value: Any, name: str) -> np.ndarray:
  return _in_range(name, value, lambda v: (v >= 0.0) & np.isfinite(v),
                   "[0, inf)")


def _maybe_scalar(x: np.ndarray, *args: Any) -> Union[float, np.ndarray]:
  if all(np.ndim(a) == 0 for a in args):
    return float(x)
  return x


# -- Closed forms ------------------------------------------------------------


def expected_tokens_per_iteration(alpha: ArrayLike,
                                  gamma: ArrayLike) -> Union[float, np.ndarray]:
  """Equation (1): tokens per target call, (1 - α^(γ+1)) / (1 - α) (γ + 1
  at α = 1), for acceptance rate(s) alpha in [0, 1] and gamma >= 1."""
  a = _check_alpha(alpha)
  g = _check_gamma(gamma)
  a, g = np.broadcast_arrays(a, g)
  one = a >= 1.0
  safe_a = np.where(one, 0.5, a)
  value = np.where(one, g + 1.0, (1.0 - safe_a**(g + 1.0)) / (1.0 - safe_a))
  return _maybe_scalar(value, alpha, gamma)


def call_token_probs(alpha: float, gamma: int) -> np.ndarray:
  """[γ + 1]: P(a call emits n = 1 .. γ + 1 tokens), guesses kept with
  probability alpha independently: Equation (1)'s capped geometric."""
  a = float(_check_alpha(alpha))
  g = int(_check_gamma(gamma))
  return np.array([a**(n - 1) * (1 - a) for n in range(1, g + 1)] + [a**g])


def expected_target_calls(alpha: float, gamma: int, length: int) -> float:
  """Expected target calls to emit `length` tokens (EOS included), guesses
  kept with probability alpha independently, the last call cut at the end:
  E[calls(r)] = 1 + Σ_n P(N = n) E[calls(r - n)], N Equation (1)'s capped
  geometric. ValueError: alpha, gamma or length out of range."""
  return calls_to_emit(call_token_probs(alpha, gamma), length)


def calls_to_emit(token_probs: Sequence[float], length: int) -> float:
  """Expected target calls to emit `length` tokens when a call emits n
  tokens with probability token_probs[n - 1] (n = 1 .. its size; a call
  always emits one), the last call cut at the end. ValueError: the
  probabilities or length out of range."""
  probs = _in_range("token_probs", token_probs, lambda p: (p >= 0) & (p <= 1),
                    "[0, 1] (one probability per tokens emitted, 1 ..)")
  if probs.ndim != 1 or not probs.size or abs(probs.sum() - 1.0) > 1e-9:
    raise ValueError(f"token_probs={list(np.ravel(probs))[:8]!r}: allowed: "
                     "a [n] vector of P(a call emits 1 .. n tokens) "
                     "summing to 1.")
  if not isinstance(length, (int, np.integer)) or length < 0:
    raise ValueError(f"length={length!r} is outside the allowed range: a "
                     "non-negative integer.")
  calls = np.zeros(int(length) + 1)
  for r in range(1, int(length) + 1):
    rest = calls[np.maximum(r - np.arange(1, probs.size + 1), 0)]
    calls[r] = 1.0 + probs @ rest
  return float(calls[-1])


def expected_tokens_per_call_with_ends(alpha: float, gamma: int,
                                       lengths: Sequence[int]) -> float:
  """sum(lengths) / Σ `expected_target_calls`: tokens per call with each
  output's last call cut at its end. ValueError: no positive total."""
  return tokens_per_call_with_ends(call_token_probs(alpha, gamma), lengths)


def tokens_per_call_with_ends(token_probs: Sequence[float],
                              lengths: Sequence[int]) -> float:
  """sum(lengths) / Σ `calls_to_emit`: tokens per call of calls emitting n
  tokens with probability token_probs[n - 1], each output's last call cut
  at its end. ValueError: no positive total."""
  lengths = [int(x) for x in lengths]
  if not lengths or sum(lengths) == 0:
    raise ValueError(f"lengths must hold a positive total, got {lengths[:8]}.")
  calls = {n: calls_to_emit(token_probs, n) for n in set(lengths)}
  return sum(lengths) / sum(calls[n] for n in lengths)


def expected_speedup(alpha: ArrayLike, gamma: ArrayLike,
                     cost_coefficient: ArrayLike,
                     call_cost: ArrayLike = 1.0) -> Union[float, np.ndarray]:
  """Theorem 3.8: (1 - α^(γ+1)) / ((1 - α)(γc + call_cost)), c >= 0; the
  (γ+1)-token call costs call_cost > 0 target steps (the theorem: 1)."""
  c = _check_nonneg(cost_coefficient, "cost_coefficient")
  call = _in_range("call_cost", call_cost, lambda x: x > 0,
                   "(0, inf): a positive number")
  tokens = np.asarray(expected_tokens_per_iteration(alpha, gamma))
  g = np.asarray(gamma, dtype=np.float64)
  value = tokens / (g * c + call)
  return _maybe_scalar(value, alpha, gamma, cost_coefficient, call_cost)


def optimal_gamma(alpha: float, cost_coefficient: float, max_gamma: int = 64,
                  call_costs: Optional[ArrayLike] = None) -> int:
  """The integer γ <= max_gamma maximizing Theorem 3.8 (ties: the smaller);
  call_costs: None (1) or [max_gamma] measured costs, entry γ-1 for γ."""
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
  """Theorem 3.11: (1 - α)(γĉ + γ + 1) / (1 - α^(γ+1)), ĉ the draft's
  arithmetic operations per token over the target's."""
  c_hat = _check_nonneg(cost_coefficient_hat, "cost_coefficient_hat")
  tokens = np.asarray(expected_tokens_per_iteration(alpha, gamma))
  g = np.asarray(gamma, dtype=np.float64)
  value = (g * c_hat + g + 1.0) / tokens
  return _maybe_scalar(value, alpha, gamma, cost_coefficient_hat)


# -- Estimating alpha and c from measurements --------------------------------


def beta_from_distributions(p: ArrayLike,
                            q: ArrayLike) -> Union[float, np.ndarray]:
  """Corollary 3.6: β = Σ_x min(p(x), q(x)) over the last axis of the
  target's p and the draft's q, both [..., vocab]."""
  p = _as_float_array("p", p)
  q = _as_float_array("q", q)
  if p.shape != q.shape:
    raise ValueError(f"p and q must have the same shape; got {p.shape} and "
                     f"{q.shape}")
  value = np.minimum(p, q).sum(axis=-1)
  return float(value) if value.ndim == 0 else value


def _successes_trials(histogram: ArrayLike, gamma: int) -> Tuple[float, float]:
  """(Σ k h[k], Σ min(k + 1, γ) h[k]) of a checked histogram h."""
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
  h = _check_nonneg(h, "histogram")
  k = np.arange(h.size, dtype=np.float64)
  successes = float(np.sum(k * h))
  trials = float(np.sum(np.minimum(k + 1.0, float(gamma)) * h))
  return successes, trials


def alpha_from_acceptance_counts(histogram: ArrayLike, gamma: int) -> float:
  """Maximum-likelihood α from h[k], the target calls that accepted k of
  gamma guesses (Bernoulli trials to the first rejection): Σ k h[k] /
  Σ min(k + 1, γ) h[k], nan for no trials."""
  successes, trials = _successes_trials(histogram, gamma)
  if trials == 0:
    return math.nan
  return successes / trials


def alpha_standard_error_from_counts(histogram: ArrayLike, gamma: int) -> float:
  """sqrt(α̂ (1 - α̂) / trials), `alpha_from_acceptance_counts`' standard
  error (the stopping rule keeps the Bernoulli likelihood); nan: no trials."""
  successes, trials = _successes_trials(histogram, gamma)
  if trials == 0:
    return math.nan
  a = successes / trials
  return math.sqrt(a * (1.0 - a) / trials)


def alpha_from_beta_samples(betas: ArrayLike) -> Tuple[float, float]:
  """α = E[β] from per-position β samples (`beta_from_distributions`):
  (mean, its standard error); nan for what too few samples leave open."""
  tol = 1e-6  # Float round-off in sum_x min(p, q).
  b = _in_range("betas", betas, lambda b: (b >= -tol) & (b <= 1.0 + tol),
                "[0, 1]").ravel()
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
  t = _in_range("target_step_s", target_step_s, lambda t:
                (t > 0.0) & np.isfinite(t), "(0, inf)")
  return _maybe_scalar(d / t, draft_step_s, target_step_s)


# -- Theory vs measurement (Table 4 style) -----------------------------------


def theory_vs_measured(
    points: Iterable[Mapping[str, Any]]) -> List[Dict[str, Any]]:
  """Table 4: copies of `points` (`gamma`, `alpha`, `cost_coefficient_c`,
  `speedup`, maybe `tokens_per_target_call`) with `theoretical_speedup`,
  `expected_tokens_per_call`, their measured ratios `speedup_ratio` and
  `tokens_per_call_ratio` (with tokens per call)."""
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


# -- Per-iteration gamma (Section 3.5) ---------------------------------------


def per_iteration_gamma_bound(kept: ArrayLike, guessed: ArrayLike, gamma: int,
                              cost_coefficient: float,
                              tokens: int) -> Dict[str, float]:
  """§3.5's bound: `tokens` over the iterations' cost in target steps (1
  a call, c a guess) with γ guesses a call (`fixed`), the guessed[i] made
  (`achieved`) or just the kept[i] kept (`oracle`); nan for no iterations."""
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
