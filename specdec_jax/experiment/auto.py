"""The 'auto' choices' rules, as pure functions of the measured call costs
(`Prices`) and the pilots' acceptance: `predict` by each mode's own cost
model, `predict_all` calibrated per family, `choose` (docs/design/
beyond_the_paper.md derives a tree's E(γ, k)).
"""
import dataclasses
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from specdec_jax.experiment import decode_modes
from specdec_jax.experiment.plan import PILOT_SIZES
from specdec_jax.experiment.plan import PilotSizes
from specdec_jax.metrics import analysis
from specdec_jax.metrics import overheads

DecodeMode = decode_modes.DecodeMode
# The gain a candidate (or a switch) must be predicted to beat: the
# prediction's own error (issue 45: 10-30%).
AUTO_MIN_GAIN = 1.05
# A pilot stops when its α's 95% interval is narrower than this, after MIN
# examples, at the latest after SHARE of the run's clipped to [MIN, MAX]
# (issue 58: at 5% the pilot's α was 16% high).
AUTO_ALPHA_TOLERANCE = 0.1
AUTO_PILOT_MIN_EXAMPLES = 8
AUTO_PILOT_MAX_EXAMPLES = 64
AUTO_PILOT_SHARE = 0.25
# GAMMA='auto' prices the call at these K = γ + 1, interpolated between.
AUTO_GAMMA_CALL_KS = (1, 2, 4, 7, PILOT_SIZES.gamma_max + 1)
# Trees of at most this many nodes 1 + k·γ; the tree call priced at these N.
AUTO_TREE_MAX_NODES = decode_modes.AUTO_TREE_MAX_NODES
AUTO_TREE_CALL_NODES = (1, 2, 4, 7, 13, 19, AUTO_TREE_MAX_NODES)
# A choice is tested after this many batches of its own, switched at most
# this often.
AUTO_SWITCH_MIN_BATCHES = 4
AUTO_SWITCH_MAX_SWITCHES = 2
# κ is clipped to these bounds (a pilot's timing, not a law of nature).
KAPPA_BOUNDS = (0.25, 4.0)


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One setting 'auto' may run: a registry mode, γ (None: the target
  alone) and a tree's k (None otherwise)."""
  mode: DecodeMode
  gamma: Optional[int] = None
  tree_width: Optional[int] = None

  @property
  def pilot_key(self) -> str:
    """The pilot its prediction reads: one per mode (the widest tree's
    serves every k)."""
    return self.mode.name

  @property
  def family(self) -> Optional[str]:
    """Whose calibration corrects it: 'trees', 'chains' (token and block:
    one loop), 'beams'; None for the target alone."""
    if self.mode.target_alone:
      return None
    if self.mode.beam:
      return "beams"
    return "trees" if self.mode.branches else "chains"

  @property
  def label(self) -> str:
    """'token γ=3', 'tree γ=4 k=2', 'speculative beams γ=3', 'the target
    alone'."""
    if self.mode.target_alone:
      return ("the target's own beam search"
              if self.mode.beam else "the target alone")
    if self.mode.beam:
      return f"speculative beams γ={self.gamma}"
    if self.tree_width is not None:
      return f"{self.mode.name} γ={self.gamma} k={self.tree_width}"
    return f"{self.mode.name} γ={self.gamma}"


def pilot_gamma(gamma: Any, sizes: PilotSizes = PILOT_SIZES) -> int:
  """The γ pilots decode at: GAMMA, or for 'auto' `sizes.gamma_pilot`."""
  return sizes.gamma_pilot if isinstance(gamma, str) else int(gamma)


def gammas_considered(gamma: Any, sizes: PilotSizes = PILOT_SIZES) -> List[int]:
  """GAMMA='auto': γ = 1 .. `sizes.gamma_max`; an integer GAMMA: itself."""
  return list(sizes.gammas) if isinstance(gamma, str) else [int(gamma)]


def mode_candidates(mode: DecodeMode, gammas: Sequence[int],
                    tree_widths: Sequence[int], greedy: bool,
                    vocab_size: int) -> List[Candidate]:
  """`mode` at each γ (a tree: each k, at most AUTO_TREE_MAX_NODES nodes;
  greedy: k <= vocab_size, its branches start with distinct tokens)."""
  if not mode.branches:
    return [Candidate(mode, int(g)) for g in gammas]
  return [
      Candidate(mode, int(g), int(k)) for k in tree_widths
      if not (greedy and k > vocab_size) for g in gammas
      if 1 + k * g <= AUTO_TREE_MAX_NODES
  ]


def candidates(search: DecodeMode, supported: Sequence[str],
               gammas: Sequence[int], greedy: bool, vocab_size: int,
               tree_widths: Optional[Sequence[int]] = None) -> List[Candidate]:
  """Every setting SPECULATION='auto' considers, the target alone first:
  each mode of `supported` (names) that DECODE's `search` allows (greedy:
  no block, it is token verification then) at `gammas` and `tree_widths`
  (None: PILOT_SIZES')."""
  widths = (PILOT_SIZES.auto_tree_widths
            if tree_widths is None else tree_widths)
  out = [Candidate(decode_modes.target_alone(search))]
  if search.beam:
    modes = [decode_modes.BEAM]
  else:
    modes = [decode_modes.TOKEN] + ([] if greedy else [decode_modes.BLOCK])
    modes.append(decode_modes.TREE)
  for mode in modes:
    if mode.name in supported:
      out += mode_candidates(mode, gammas, widths, greedy, vocab_size)
  return out


@dataclasses.dataclass(frozen=True)
class Prices:
  """Measured costs in target steps: {K: a K-token call}, c, {N: an N-node
  tree call}, {k: one depth of a k-branch draft} (trees': {} without)."""
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
    """The N-node tree call in steps, interpolated, non-decreasing in N (a
    dip is timing noise: a bigger call does all a smaller one does)."""
    ns = sorted(self.tree_call_cost_by_nodes)
    ratios = np.maximum.accumulate(
        [self.tree_call_cost_by_nodes[n] for n in ns])
    return float(np.interp(nodes, ns, ratios))


def predict(candidate: Candidate, prices: Optional[Prices],
            pilots: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
  """The candidate's row: its modelled speedup, uncalibrated, and inputs
  ('alpha', 'first_depth_alpha', 'cost_coefficient_c', 'call_cost' in
  steps, 'tokens_per_call', 'batch_factor': rows waiting for a batch's
  slowest, multiplied in), from `prices` (None: beams) and `pilots`
  ({pilot_key: {'alpha'; trees: 'first_depth', 'deeper',
  'first_depth_by_width'; chains, trees: 'batch_factor_by_gamma'; beams:
  'speedup'; 'output_lengths'}})."""
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
      "tokens_per_call": 1.0,
      "batch_factor": 1.0
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
    first, alpha = first_depth(pilot, width), float(pilot["deeper"])
    c = float(prices.cost_coefficient_by_width[width])
    call = prices.tree_call_cost(1 + width * gamma)
    probs = tree_token_probs(first, alpha, gamma)
    row.update(alpha=alpha, first_depth_alpha=first)
  else:
    c, call = float(prices.cost_coefficient), prices.call_cost(gamma + 1)
    probs = analysis.call_token_probs(alpha, gamma)
  lengths = pilot.get("output_lengths")
  # Each output's last call is cut at its end (Equation (1) is not).
  tokens = float(
      analysis.tokens_per_call_with_ends(probs, lengths)
      if lengths and sum(lengths) else probs @ np.arange(1, probs.size + 1))
  # Rows waiting for a batch's slowest, replayed at this γ (1 at batch 1).
  row["batch_factor"] = float((pilot.get("batch_factor_by_gamma") or
                               {}).get(str(gamma), 1.0))
  row.update(
      cost_coefficient_c=c, call_cost=call, tokens_per_call=tokens,
      predicted_speedup=float(
          (mode.measured_theory(alpha, gamma, c, call, tokens) if mode.branches
           else tokens / (gamma * c + call)) * row["batch_factor"]))
  return row


def kappa(measured: float, modelled: float) -> float:
  """κ = measured / modelled speedup, clipped to KAPPA_BOUNDS."""
  value = measured / modelled if modelled > 0 else 1.0
  return float(min(max(value, KAPPA_BOUNDS[0]), KAPPA_BOUNDS[1]))


def _steps_per_call(row: Mapping[str, Any]) -> float:
  """The cost model's target steps per call of a priced row: γ·c + C."""
  return row["gamma"] * row["cost_coefficient_c"] + row["call_cost"]


def overhead_steps(measured: float, row: Mapping[str, Any]) -> float:
  """A family's calibration: the loop's unpriced work per call in target
  steps, o = s (model / measured - 1), s = γ·c + C. Added to each call
  (`calibrated`), not multiplied: a ratio biased narrower trees (issue 58).
  A chain's or tree's model holds its batch factor, so rows waiting for a
  batch's slowest are not read as the loop's work (they grow with γ).
  At least 0: a measurement above the model is the calls' prices' error
  or noise, not negative work, and taken off a smaller call's steps it
  inflated its prediction (a 17-node tree pilot at batch 8: -1.5 steps,
  a 4-node tree predicted 6.4× for its 1.1×).
  """
  model = row.get("model_speedup", row["predicted_speedup"])
  return max(0.0, _steps_per_call(row) * (model / max(measured, 1e-12) - 1.0))


def calibrated(row: Mapping[str, Any], overhead: float) -> float:
  """A priced row's speedup with `overhead` steps added to each call, at
  most KAPPA_BOUNDS[1] times the model's."""
  model = row.get("model_speedup", row["predicted_speedup"])
  steps = _steps_per_call(row)
  ratio = steps / (steps + overhead) if steps + overhead > 0 else math.inf
  return float(model * min(ratio, KAPPA_BOUNDS[1]))


def predict_all(
    candidates_: Sequence[Candidate], prices: Optional[Prices],
    pilots: Mapping[str, Mapping[str, Any]],
    overheads: Optional[Mapping[str, float]] = None) -> List[Dict[str, Any]]:
  """`predict`'s rows, each priced family's calibrated by its own overhead
  ({family: steps}); the model's speedup kept in 'model_speedup'."""
  rows = []
  for c in candidates_:
    row = predict(c, prices, pilots)
    overhead = (overheads or {}).get(c.family)
    if overhead is not None and row["call_cost"] is not None:
      row.update(model_speedup=row["predicted_speedup"],
                 predicted_speedup=calibrated(row, overhead))
    rows.append(row)
  return rows


def best(rows: Sequence[Mapping[str, Any]]) -> int:
  """The index of the best predicted speedup, ties to the earlier row."""
  if not rows:
    raise ValueError("rows is empty: no candidate to choose from")
  return max(range(len(rows)), key=lambda i: (rows[i]["predicted_speedup"], -i))


def choose(rows: Sequence[Mapping[str, Any]],
           min_gain: float = AUTO_MIN_GAIN) -> int:
  """The `best` row, or row 0 (the target alone) below `min_gain`."""
  chosen = best(rows)
  if chosen and rows[chosen]["predicted_speedup"] < min_gain:
    return 0
  return chosen


def pilot_cap(num_examples: int) -> int:
  """The most examples one pilot decodes (AUTO_PILOT_SHARE, clipped)."""
  share = math.ceil(AUTO_PILOT_SHARE * max(int(num_examples), 0))
  return min(AUTO_PILOT_MAX_EXAMPLES, max(AUTO_PILOT_MIN_EXAMPLES, share))


def pilot_done(examples: int, interval: Tuple[float, float], cap: int,
               tolerance: float = AUTO_ALPHA_TOLERANCE) -> bool:
  """`cap` examples, or the minimum with an interval within `tolerance`."""
  if examples >= cap:
    return True
  return (examples >= AUTO_PILOT_MIN_EXAMPLES and
          interval[1] - interval[0] <= tolerance)


# -- trees ---------------------------------------------------------------------
def depth_acceptance(histogram: Sequence[int]) -> Tuple[float, float]:
  """(a_1, a) from a tree's histogram [γ + 1]: a_1 = calls keeping >= 1 /
  calls; a = guesses kept at depth >= 2 / tests there (a = a_1 if none)."""
  counts = np.asarray(histogram, np.float64)
  if counts.ndim != 1 or counts.size < 2 or np.any(counts < 0):
    raise ValueError(f"histogram={list(histogram)!r}: allowed: [γ + 1] "
                     "counts >= 0 of the iterations that kept n = 0..γ "
                     "guesses, γ >= 1.")
  gamma = counts.size - 1
  calls = counts.sum()
  if calls == 0:
    raise ValueError("histogram has no iterations: the pilot decoded nothing")
  first = float(counts[1:].sum() / calls)
  n = np.arange(1, gamma + 1)
  deeper_kept = float((n - 1) @ counts[1:])
  deeper_tests = float(np.minimum(n, gamma - 1) @ counts[1:])
  return first, (deeper_kept / deeper_tests if deeper_tests else first)


def first_depth_by_width(rounds: Sequence[int]) -> List[float]:
  """[k] a_1 of k' = 1..k branches from the calls by first round [k + 1]
  (`TreeOutput.first_round_histogram`): the share whose round is < k'."""
  counts = np.asarray(rounds, np.float64)
  return [float(x) for x in np.cumsum(counts[:-1]) / max(counts.sum(), 1.0)]


def expected_tree_tokens(first: float, deeper: float, gamma: int) -> float:
  """E(γ, k) = 1 + a_1 · (1 + a + ... + a^(γ-1)), tokens per iteration."""
  return 1.0 + first * float(np.sum(deeper**np.arange(gamma)))


def tree_token_probs(first: float, deeper: float, gamma: int) -> np.ndarray:
  """[γ + 1]: P(a tree call emits n = 1 .. γ + 1 tokens): a path kept to
  depth 1 with probability a_1 (`first`), each deeper guess with a; its
  mean is `expected_tree_tokens`."""
  kept = np.concatenate([[1.0], first * deeper**np.arange(gamma)])  # P(m >= j)
  return kept - np.append(kept[1:], 0.0)


def first_depth(pilot: Mapping[str, Any], width: int) -> float:
  """a_1 at k = `width` from a tree pilot's record ('first_depth_by_width',
  else 'first_depth'); its deeper a serves every k."""
  by_width = pilot.get("first_depth_by_width") or ()
  if 1 <= width <= len(by_width):
    return float(by_width[width - 1])
  return float(pilot["first_depth"])


# -- words ---------------------------------------------------------------------
def reason(rows: Sequence[Mapping[str, Any]], chosen: int,
           min_gain: float = AUTO_MIN_GAIN,
           pilot_examples: Optional[int] = None,
           fixed_gamma: Optional[int] = None) -> str:
  """The stdout line of `choose`'s choice: 'auto: chose token γ=3, ...' or
  'auto: speculation off — ...' (`fixed_gamma`: an integer GAMMA)."""
  row = rows[chosen]
  fixed = ("" if fixed_gamma is None else
           f"; γ={fixed_gamma} is GAMMA's, not chosen (GAMMA='auto' "
           "chooses it)")
  if chosen:
    others = [r for i, r in enumerate(rows) if i != chosen]
    second = max(others, key=lambda r: r["predicted_speedup"])
    return (f"auto: chose {row['label']}, predicted "
            f"{row['predicted_speedup']:.2f}× ({_inputs_words(row)}); "
            f"runner-up: {second['label']}, predicted "
            f"{second['predicted_speedup']:.2f}×{fixed}")
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
  return (f"auto: speculation off — {why}; {alone} is fastest (runner-up: "
          f"{best['label']}, predicted {spoken}, below the {min_gain:.2f}× "
          f"it must reach){fixed}")


def _inputs_words(row: Mapping[str, Any]) -> str:
  if row["call_cost"] is None:
    return f"measured on the pilot; draft steps kept {row['alpha']:.2f}"
  if row["tree_width"] is not None:
    size = f"a {1 + row['tree_width'] * row['gamma']}-node tree call"
    alpha = (f"a_1 is {row['first_depth_alpha']:.2f}, a "
             f"{row['alpha']:.2f}")
  else:
    size = f"a {row['gamma'] + 1}-token call"
    alpha = f"α is {row['alpha']:.2f}"
  waits = row.get("batch_factor")
  rows = (f", rows waiting {waits:.2f}"
          if overheads.batch_waits_show(waits) else "")
  return (f"{size} costs {row['call_cost']:.2f} steps and {alpha}, c "
          f"{row['cost_coefficient_c']:.3f}{rows}")
