"""SPECULATION='auto': the candidates, their predicted speedups and the
choice, as pure functions of the measured call costs (`Prices`) and the
pilots' acceptance (`auto_run` measures both, before the timed decode).

A candidate is a registry mode (`decode_modes`) with its settings: the
target alone (`decode_modes.target_alone`), token and block verification
at γ, tree verification at (γ, k) where the drafter drafts trees, and with
DECODE='beam' speculative beams at γ against the target's own beam search.
Each is predicted by its mode's own cost model, the one the summary uses
(`DecodeMode.measured_theory`): Theorem 3.8 with the measured cost of a
(γ+1)-token call and the drafter's measured step cost c; a tree's
E(γ, k) = 1 + a_1 (1 + a + ... + a^(γ-1)) tokens over γ·c_k + C(1 + k·γ)
(`auto_tree`); speculative beams (not priced by any theory here) by the
walltime ratio of both beam searches measured on the pilot's examples. The
target alone is 1 by definition, and wins unless a speculative candidate
is predicted at least `AUTO_MIN_GAIN` times faster.

α comes from a pilot decode sized by its own 95% interval
(`alpha_interval`, `pilot_done`): it stops when the interval is narrower
than `AUTO_ALPHA_TOLERANCE`, or at `pilot_cap` examples.
"""
import dataclasses
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from specdec_jax.metrics import analysis
from specdec_jax.experiment import auto_gamma
from specdec_jax.experiment import auto_tree
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment.plan import PILOT_SIZES
from specdec_jax.experiment.plan import PilotSizes

DecodeMode = decode_modes.DecodeMode
# A speculative candidate must be predicted this much faster than the
# target alone to be chosen (the prediction's own error: issue 45 measured
# Theorem 3.8 at the measured call cost 10-30% above the walltime).
AUTO_MIN_GAIN = 1.05
# Tree candidates: k = 2 .. `PilotSizes.tree_max_width` branches (k = 1 is token
# verification run by the tree loop), trees of at most AUTO_TREE_MAX_NODES
# (a run's: `PilotSizes.auto_tree_widths`).
AUTO_TREE_WIDTHS = PILOT_SIZES.auto_tree_widths
# A pilot stops when the 95% interval of its α is narrower than this ...
AUTO_ALPHA_TOLERANCE = 0.1
# ... after at least this many examples, and at the latest after
# AUTO_PILOT_SHARE of the run's examples, clipped to [MIN, MAX].
AUTO_PILOT_MIN_EXAMPLES = 4
AUTO_PILOT_MAX_EXAMPLES = 64
AUTO_PILOT_SHARE = 0.05
_Z95 = 1.96


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One setting `auto` may run.

  Attributes:
    mode: its registry mode (`decode_modes.target_alone(...)`: the target
      alone).
    gamma: γ (None: the target alone).
    tree_width: k for a tree (None otherwise).
  """
  mode: DecodeMode
  gamma: Optional[int] = None
  tree_width: Optional[int] = None

  @property
  def pilot_key(self) -> str:
    """The pilot whose acceptance this candidate's prediction reads: one
    per mode ('token', 'tree'); one tree pilot, with the widest k, serves
    every k (`first_depth`)."""
    return self.mode.name

  @property
  def label(self) -> str:
    """In words: 'token γ=3', 'tree γ=4 k=2', 'speculative beams γ=3',
    'the target alone' ('the target's own beam search')."""
    if self.mode.target_alone:
      return ("the target's own beam search"
              if self.mode.beam else "the target alone")
    if self.mode.beam:
      return f"speculative beams γ={self.gamma}"
    if self.tree_width is not None:
      return f"{self.mode.name} γ={self.gamma} k={self.tree_width}"
    return f"{self.mode.name} γ={self.gamma}"


def pilot_gamma(gamma: Any, sizes: PilotSizes = PILOT_SIZES) -> int:
  """The γ pilots decode at: GAMMA itself, or for GAMMA='auto' the
  pilot γ of `sizes` (`Providers.pilot_sizes`)."""
  return sizes.gamma_pilot if isinstance(gamma, str) else int(gamma)


def gammas_considered(gamma: Any, sizes: PilotSizes = PILOT_SIZES) -> List[int]:
  """GAMMA='auto': γ = 1 .. `sizes.gamma_max`; an integer GAMMA: itself."""
  if isinstance(gamma, str):
    return list(sizes.gammas)
  return [int(gamma)]


def candidates(search: DecodeMode, supported: Sequence[str],
               gammas: Sequence[int], greedy: bool, vocab_size: int,
               tree_widths: Optional[Sequence[int]] = None) -> List[Candidate]:
  """Every setting `auto` considers, the target alone first.

  Args:
    search: the mode DECODE names (`decode_modes.search_mode_of`): beams
      or sampling.
    supported: the mode names the drafter drafts for
      (`DrafterSpec.decode_modes`).
    gammas: the γ to consider (`gammas_considered`).
    greedy: T = 0 (block verification is then token verification: left
      out; greedy trees need k <= vocab_size).
    vocab_size: the models' vocabulary size.
    tree_widths: the k of tree candidates (None: AUTO_TREE_WIDTHS).
  """
  tree_widths = AUTO_TREE_WIDTHS if tree_widths is None else tree_widths
  out = [Candidate(decode_modes.target_alone(search))]
  if search.beam:
    if decode_modes.BEAM.name in supported:
      out += [Candidate(decode_modes.BEAM, int(g)) for g in gammas]
    return out
  modes = [decode_modes.TOKEN] + ([] if greedy else [decode_modes.BLOCK])
  for mode in modes:
    if mode.name in supported:
      out += [Candidate(mode, int(g)) for g in gammas]
  if decode_modes.TREE.name in supported:
    for k in tree_widths:
      if greedy and k > vocab_size:
        continue
      out += [
          Candidate(decode_modes.TREE, int(g), int(k))
          for g in gammas
          if 1 + k * g <= auto_tree.AUTO_TREE_MAX_NODES
      ]
  return out


@dataclasses.dataclass(frozen=True)
class Prices:
  """The calls' measured costs, in target steps (one-token calls).

  Attributes:
    call_cost_by_k: {K: the target's K-token call / a step} (K = 1: 1),
      interpolated linearly in between (`call_cost`).
    cost_coefficient: c, one guess as the loop makes it / a step.
    tree_call_cost_by_nodes: {N: the tree call over N nodes / a step}
      ({} without tree candidates).
    cost_coefficient_by_width: {k: one depth of the k-branch draft / a
      step} ({} without tree candidates).
  """
  call_cost_by_k: Mapping[int, float]
  cost_coefficient: float
  tree_call_cost_by_nodes: Mapping[int, float] = dataclasses.field(
      default_factory=dict)
  cost_coefficient_by_width: Mapping[int, float] = dataclasses.field(
      default_factory=dict)

  def call_cost(self, k: int) -> float:
    """The K-token call in steps (interpolated between the priced K)."""
    ks = sorted(self.call_cost_by_k)
    return float(np.interp(k, ks, [self.call_cost_by_k[x] for x in ks]))

  def tree_call_cost(self, nodes: int) -> float:
    """The N-node tree call in steps, non-decreasing in N
    (`auto_tree.tree_call_costs`' running maximum)."""
    ns = sorted(self.tree_call_cost_by_nodes)
    ratios = np.maximum.accumulate(
        [self.tree_call_cost_by_nodes[n] for n in ns])
    return float(np.interp(nodes, ns, ratios))


def predict(candidate: Candidate, prices: Optional[Prices],
            pilots: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
  """One row of the table: the candidate's predicted speedup over the
  target alone and what it was computed from.

  Args:
    candidate: the setting.
    prices: the measured call costs (None: nothing priced, beams).
    pilots: {pilot_key: {'alpha', and for trees 'first_depth' (a_1),
      'first_depth_by_width' (a_1 of k = 1, 2, ...: `first_depth`) and
      'deeper' (a); for beams 'speedup', their measured ratio}}.

  Returns:
    {'mode', 'gamma', 'tree_width', 'label', 'predicted_speedup', 'alpha',
    'first_depth_alpha', 'cost_coefficient_c', 'call_cost' (the
    verification call in steps), 'tokens_per_call'}.
  """
  mode, gamma, width = candidate.mode, candidate.gamma, candidate.tree_width
  row: Dict[str, Any] = {
      "mode": mode.name,
      "gamma": gamma,
      "tree_width": width,
      "label": candidate.label,
      "predicted_speedup": 1.0,
      "alpha": None,
      "first_depth_alpha": None,
      "cost_coefficient_c": None,
      "call_cost": 1.0,
      "tokens_per_call": 1.0
  }
  if mode.target_alone:
    return row
  pilot = pilots[candidate.pilot_key]
  alpha = min(max(float(pilot["alpha"]), 0.0), 1.0)
  row["alpha"] = alpha
  if not mode.priced:  # speculative beams: the pilot's walltime ratio
    row.update(predicted_speedup=float(pilot["speedup"]), call_cost=None,
               tokens_per_call=None)
    return row
  assert prices is not None and gamma is not None
  if mode.branches:
    assert width is not None
    first, deeper = first_depth(pilot, width), float(pilot["deeper"])
    c = float(prices.cost_coefficient_by_width[width])
    call = prices.tree_call_cost(1 + width * gamma)
    tokens = auto_tree.expected_tree_tokens(first, deeper, gamma)
    row.update(alpha=deeper, first_depth_alpha=first)
    alpha = deeper
  else:
    c, call = float(prices.cost_coefficient), prices.call_cost(gamma + 1)
    lengths = pilot.get("output_lengths")
    # Each output's last call is cut at its end: short outputs buy fewer
    # tokens per call than Equation (1) says, the more so the larger γ.
    tokens = float(
        analysis.expected_tokens_per_call_with_ends(alpha, gamma, lengths)
        if lengths and sum(lengths) else analysis.
        expected_tokens_per_iteration(alpha, gamma))
  # Theorem 3.8 at the measured call cost; for a chain, with Equation (1)'s
  # tokens per call cut at the pilot's output ends when it has them.
  speedup = (mode.measured_theory(alpha, gamma, c, call, tokens)
             if mode.branches else tokens / (gamma * c + call))
  row.update(cost_coefficient_c=c, call_cost=call, tokens_per_call=tokens,
             predicted_speedup=float(speedup))
  return row


def first_depth(pilot: Mapping[str, Any], width: int) -> float:
  """a_1 of a tree of k = `width` branches from a tree pilot's record: its
  'first_depth_by_width' entry k - 1 (a pilot with k' >= k branches keeps
  a guess on a call with k branches exactly when its first round is below
  k: `tree_acceptance.first_round`), else its own 'first_depth'.

  The pilot's deeper a serves every k. With distinct first guesses (the
  default) one branch carries the kept prefix at any k; with i.i.d. ones
  a wider tree may carry a repeated guess on several branches, so a
  narrower tree's a can be lower than the pilot's.
  """
  by_width = pilot.get("first_depth_by_width") or ()
  if 1 <= width <= len(by_width):
    return float(by_width[width - 1])
  return float(pilot["first_depth"])


def calibrated(
    rows: Sequence[Dict[str, Any]], measured: float, predicted: float,
    bounds: Tuple[float, float] = (0.25, 4.0),
    trees: Optional[bool] = None) -> Tuple[List[Dict[str, Any]], float]:
  """The priced speculative rows scaled by κ = measured / predicted, the
  cost model's error on this machine as a timed pilot saw it (the loop's
  own work beside the priced calls: acceptance, rollback, the outer loop);
  κ is clipped to `bounds`. `trees`: scale only the tree rows (True), only
  the chain rows (False: a tree pilot calibrates the trees, whose loop
  does other work), or every priced row (None). Returns (rows, κ)."""
  kappa = measured / predicted if predicted > 0 else 1.0
  kappa = float(min(max(kappa, bounds[0]), bounds[1]))
  out = []
  for row in rows:
    row = dict(row)
    if trees is not None and (row.get("tree_width") is not None) != trees:
      out.append(row)
      continue
    if row.get("call_cost") is not None and row.get("alpha") is not None:
      row.update(model_speedup=row["predicted_speedup"],
                 predicted_speedup=row["predicted_speedup"] * kappa)
    out.append(row)
  return out, kappa


def choose(rows: Sequence[Mapping[str, Any]],
           min_gain: float = AUTO_MIN_GAIN) -> int:
  """The index of the chosen row of `predict`'s rows (row 0: the target
  alone): the best predicted speedup, ties to the earlier row (fewer
  guesses, simpler mode); the target alone unless the best is at least
  `min_gain`."""
  if not rows:
    raise ValueError("rows is empty: the target alone is always a candidate")
  best = max(range(len(rows)), key=lambda i: (rows[i]["predicted_speedup"], -i))
  if best and rows[best]["predicted_speedup"] < min_gain:
    return 0
  return best


def alpha_interval(kept: Sequence[float],
                   trials: Sequence[float]) -> Tuple[float, float]:
  """The 95% interval of α = Σ kept / Σ trials over examples.

  The wider of Wilson's interval (trials independent) and the ratio
  estimator's normal interval with examples as clusters (a sentence's
  trials are not independent: an easy one keeps most guesses); (0, 1)
  with fewer than 2 examples or no trials.

  Args:
    kept: [examples] guesses kept per example.
    trials: [examples] acceptance trials per example.
  """
  k, n = np.asarray(kept, np.float64), np.asarray(trials, np.float64)
  total = float(n.sum())
  if k.size < 2 or total <= 0:
    return 0.0, 1.0
  low, high = auto_gamma.alpha_interval(int(round(k.sum())), int(round(total)))
  alpha = float(k.sum()) / total
  spread = float(np.sum((k - alpha * n)**2)) / (k.size - 1)
  half = _Z95 * math.sqrt(spread / k.size) / (total / k.size)
  return max(0.0, min(low, alpha - half)), min(1.0, max(high, alpha + half))


def pilot_cap(num_examples: int) -> int:
  """The most examples one pilot decodes: AUTO_PILOT_SHARE of the run's,
  clipped to [AUTO_PILOT_MIN_EXAMPLES, AUTO_PILOT_MAX_EXAMPLES]."""
  share = math.ceil(AUTO_PILOT_SHARE * max(int(num_examples), 0))
  return min(AUTO_PILOT_MAX_EXAMPLES, max(AUTO_PILOT_MIN_EXAMPLES, share))


def pilot_done(examples: int, interval: Tuple[float, float], cap: int,
               tolerance: float = AUTO_ALPHA_TOLERANCE) -> bool:
  """Whether a pilot may stop: `cap` examples, or at least
  AUTO_PILOT_MIN_EXAMPLES with a 95% interval narrower than `tolerance`."""
  if examples >= cap:
    return True
  return (examples >= AUTO_PILOT_MIN_EXAMPLES and
          interval[1] - interval[0] <= tolerance)


def reason(rows: Sequence[Mapping[str, Any]], chosen: int,
           min_gain: float = AUTO_MIN_GAIN,
           pilot_examples: Optional[int] = None) -> str:
  """The stdout line: 'auto: chose token γ=3, predicted 1.31× (...)', or
  'auto: speculation off — ...; the target alone is fastest (...)'.

  Args:
    rows: `predict`'s rows, the target alone first.
    chosen: `choose`'s index.
    min_gain: what a speculative row had to reach.
    pilot_examples: the examples a beam pilot timed (its words).
  """
  row = rows[chosen]
  if chosen:
    return (f"auto: chose {row['label']}, predicted "
            f"{row['predicted_speedup']:.2f}× ({_inputs_words(row)})")
  alone = rows[0]["label"]
  if len(rows) == 1:
    return (f"auto: speculation off — no speculative mode drafts for this "
            f"run; {alone} is fastest")
  best = max(rows[1:], key=lambda r: r["predicted_speedup"])
  spoken = f"{best['predicted_speedup']:.2f}×"
  if best["call_cost"] is None:  # beams: measured, not predicted
    examples = f"{pilot_examples} " if pilot_examples else ""
    why = (f"{best['label']} ran {spoken} {alone} on the pilot's "
           f"{examples}examples")
  else:
    why = f"on this machine {_inputs_words(best)}"
  return (f"auto: speculation off — {why}; {alone} is fastest (best "
          f"speculative: {best['label']}, predicted {spoken}, below the "
          f"{min_gain:.2f}× it must reach)")


def _inputs_words(row: Mapping[str, Any]) -> str:
  """'a 4-token call costs 1.21 steps and α is 0.62, c 0.011'."""
  if row["call_cost"] is None:
    return f"measured on the pilot; draft steps kept {row['alpha']:.2f}"
  if row["tree_width"] is not None:
    size = f"a {1 + row['tree_width'] * row['gamma']}-node tree call"
    alpha = (f"a_1 is {row['first_depth_alpha']:.2f}, a "
             f"{row['alpha']:.2f}")
  else:
    size = f"a {row['gamma'] + 1}-token call"
    alpha = f"α is {row['alpha']:.2f}"
  return (f"{size} costs {row['call_cost']:.2f} steps and {alpha}, c "
          f"{row['cost_coefficient_c']:.3f}")


def metrics_keys(args: Any, record: Optional[Mapping[str,
                                                     Any]]) -> Dict[str, Any]:
  """metrics.json's (and infer.json's) `speculation` and `auto` keys, the
  ones that are set: 'off' when the target alone decoded, 'auto' when
  'auto' chose a speculative mode; the choice's record."""
  out: Dict[str, Any] = {}
  if args.speculation != decode_modes.SPECULATION_ON:
    out["speculation"] = args.speculation
  if record is not None:
    out["auto"] = dict(record)
  return out


def summary_lines(metrics: Mapping[str, Any]) -> List[str]:
  """The `auto:` lines of a run whose metrics hold a choice (else none):
  the first choice, then each switch (`auto_switch`)."""
  record = metrics.get("auto")
  if not record:
    return []
  words = record["reason"]
  cached = [
      what for what, part in (("call prices", record.get("prices")),
                              ("pilots", record.get("pilot_cache")))
      if part and part.get("cached")
  ]
  if cached:
    words += f"; {' and '.join(cached)} from the cache"
  return [words] + [s["reason"] for s in record.get("switches") or []]
