"""SPECULATION='auto' and 'off' in a run: the plan to decode with, chosen
before the timed decode (`walltime.choose_shape` calls `choose_mode`).

`choose_mode` lists the candidates (`auto_mode.candidates`), decodes a
pilot per mode (one tree pilot at the widest k serves every k) on the
run's first examples, each batch at one input width, as many
as the 95% interval of its α needs (`auto_mode.pilot_done`; cached per
settings, weights and inputs: `pilots_for`), prices the calls the
candidates make on this machine (`step_costs.price_calls`,
`step_costs.price_tree_shapes`; cached per machine, pair and input width:
`price_cache`), predicts every candidate (`auto_mode.predict`), chooses
(`auto_mode.choose`) and returns the plan at the choice (a pilot's own
decoders when the choice is its setting: `Plans`) with its record
(`DecodePlan.auto`: metrics.json's `auto`) and its online correction
(`DecodePlan.online`: `auto_switch.OnlineChoice`, which may choose again
between batches). Nothing here changes what a mode decodes: the first
choice is made before the first timed batch, a later one between batches
from past batches only, and every candidate is exact.
"""
import dataclasses
import hashlib
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import logging
import jax
import numpy as np

from specdec_jax import multihost
from specdec_jax.experiment import auto_gamma
from specdec_jax.experiment import auto_mode
from specdec_jax.experiment import auto_switch
from specdec_jax.experiment import auto_tree
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import price_cache
from specdec_jax.experiment.plan import DecodePlan
from specdec_jax.experiment.plan import Loaded
from specdec_jax.experiment.plan import PilotSizes
from specdec_jax.metrics import step_costs
from specdec_jax.metrics import timing
from specdec_jax.terminal import console

Candidate = auto_mode.Candidate


def _integer(value: Any, default: int) -> int:
  return default if isinstance(value, str) else int(value)


def candidate_args(args: Any, candidate: Candidate) -> Any:
  """The run arguments that decode `candidate` (checked again: a
  `RunArguments`)."""
  mode = candidate.mode
  if mode.target_alone:
    return dataclasses.replace(args, speculation=decode_modes.SPECULATION_OFF,
                               gamma=_integer(args.gamma, 1),
                               tree_width=_integer(args.tree_width, 1))
  if mode.beam:
    return dataclasses.replace(args, gamma=candidate.gamma)
  return dataclasses.replace(args, acceptance=mode.name, gamma=candidate.gamma,
                             tree_width=candidate.tree_width or 1)


def plan_at(loaded: Loaded, candidate: Candidate) -> DecodePlan:
  """`candidate`'s arguments, acceptance rule and decoders (built, not
  compiled) on the loaded models."""
  return loaded.decoding(candidate_args(loaded.args, candidate))


def target_alone_plan(plan: Loaded) -> DecodePlan:
  """SPECULATION='off': the plan with the target alone in the speculative
  decoder's place (GAMMA / TREE_WIDTH 'auto': nothing to choose)."""
  return plan_at(plan, Candidate(decode_modes.mode_of(plan.args)))


class _PilotTally:
  """What a pilot counts over its batches: per example the guesses kept,
  the acceptance trials and the output length; the kept histogram; for
  trees, the calls by their first round."""

  def __init__(self, gamma: int):
    self.n = np.arange(gamma + 1)
    self.per_call = np.minimum(self.n + 1, gamma)
    self.kept: List[float] = []
    self.trials: List[float] = []
    self.lengths: List[int] = []
    self.histogram = np.zeros(gamma + 1, np.int64)
    self.rounds: Optional[np.ndarray] = None  # trees: [k + 1]

  def add(self, out: Any, keep: np.ndarray) -> None:
    """One batch's output (on the host), its rows `keep`."""
    rows = np.asarray(out.accepted_histogram)[keep]  # [rows, γ + 1]
    self.kept += (rows @ self.n).tolist()
    self.trials += (rows @ self.per_call).tolist()
    self.lengths += np.asarray(out.lengths)[keep].tolist()
    self.histogram += rows.sum(0)
    if hasattr(out, "first_round_histogram"):
      counted = np.asarray(out.first_round_histogram)[keep].sum(0)
      self.rounds = counted if self.rounds is None else self.rounds + counted

  def interval(self) -> Tuple[float, float]:
    return auto_mode.alpha_interval(self.kept, self.trials)

  def record(self, tree: bool) -> Dict[str, Any]:
    """α, its interval, the output lengths; a tree's a_1 (by width) and a."""
    out: Dict[str, Any] = {
        "acceptance_trials": int(sum(self.trials)),
        "alpha": float(sum(self.kept) / max(sum(self.trials), 1.0)),
        "alpha_interval": [float(x) for x in self.interval()],
        "mean_output_tokens":
            (float(np.mean(self.lengths)) if self.lengths else 0.0),
        "output_lengths": [int(x) for x in self.lengths],
    }
    if tree:
      out["first_depth"], out["deeper"] = auto_tree.depth_acceptance(
          self.histogram)
      if self.rounds is not None and self.rounds.sum():
        out["first_depth_by_width"] = auto_tree.first_depth_by_width(
            self.rounds)
    return out


def run_pilot(pilot: DecodePlan, feed: multihost.Feeder, cap: int,
              timed: bool) -> Dict[str, Any]:
  """A pilot decode of the run's first batches with `pilot`'s speculative
  decoder, until `auto_mode.pilot_done`.

  Args:
    pilot: the plan at the candidate's mode and the pilot's γ (and k).
    feed: the run's batches.
    cap: the most examples (`auto_mode.pilot_cap`).
    timed: also time both decoders on each batch (speculative beams: their
      walltime ratio is the prediction), after one untimed call of each
      (compilation).

  Returns:
    {'gamma', 'tree_width', 'examples', 'batches', 'acceptance_trials',
    'alpha', 'alpha_interval', 'mean_output_tokens', 'output_lengths',
    'input_width' (the run's most common: every batch decoded at it, one
    compile), 'batches_read' (the batches up to the last one decoded,
    wider ones skipped); trees: 'first_depth', 'deeper'
    (`auto_tree.depth_acceptance`), 'first_depth_by_width' ([k]: a_1 of
    k' = 1..k branches, `auto_mode.first_depth`); timed: 'speedup',
    'baseline_s', 'speculative_s'}.
  """
  tally = _PilotTally(int(pilot.args.gamma))
  seconds = np.zeros(2)
  examples = batches = read = 0
  # One input width: one compile, not one per width (3-5 s each for the
  # 38M's loops on a 2-core host). The run's most common width, so that a
  # timed pilot times its usual shape: narrower batches are padded to it,
  # wider ones skipped.
  width = feed.common_width(-(-cap // pilot.args.batch_size))
  for b in range(feed.num_batches):
    if feed.batch_width(b) > width:
      continue
    batch, keep = feed.batch(b, width), feed.kept_rows(b)
    rng = jax.random.fold_in(pilot.rng, b)
    if timed and not batches:
      # Compiled first: the timed calls are decodes only.
      for decoder in (pilot.baseline, pilot.speculative):
        jax.block_until_ready(decoder(batch, rng))
    if timed:
      seconds[0] += timing.timed(pilot.baseline, batch, rng)[1]
    out, seconds_s = timing.timed(pilot.speculative, batch, rng)
    seconds[1] += seconds_s
    tally.add(multihost.to_host(out), keep)
    examples, batches, read = examples + len(keep), batches + 1, b + 1
    if auto_mode.pilot_done(examples, tally.interval(), cap):
      break
  tree = decode_modes.mode_of(pilot.args).branches
  record: Dict[str, Any] = {
      "gamma": int(pilot.args.gamma),
      "tree_width": int(pilot.args.tree_width) if tree else None,
      "examples": examples,
      "batches": batches,
      "batches_read": read,
      "input_width": width,
      **tally.record(bool(tree)),
  }
  if timed:
    record.update(baseline_s=float(seconds[0]), speculative_s=float(seconds[1]),
                  speedup=float(seconds[0] / max(seconds[1], 1e-12)))
  return record


class Plans:
  """candidate -> its `DecodePlan` (`plan_at`), built once: a pilot's
  decoders, compiled by its decode, are the run's when the choice is the
  pilot's own setting (no second build or compile)."""

  def __init__(self, loaded: Loaded):
    self.loaded = loaded
    self.built: Dict[Candidate, DecodePlan] = {}

  def __call__(self, candidate: Candidate) -> DecodePlan:
    if candidate not in self.built:
      self.built[candidate] = plan_at(self.loaded, candidate)
    return self.built[candidate]


def _pilot_candidates(candidates: Sequence[Candidate],
                      gamma: int) -> Dict[str, Candidate]:
  """{pilot_key: the candidate its pilot decodes}: each speculative mode at
  the pilot γ, or the largest γ its candidates allow; trees at their
  widest k (one pilot measures every narrower tree's a_1)."""
  out: Dict[str, Candidate] = {}
  for c in candidates:
    if c.mode.target_alone or c.pilot_key in out:
      continue
    same = [d for d in candidates if d.pilot_key == c.pilot_key]
    width = max((d.tree_width or 0) for d in same) or None
    largest = max(d.gamma for d in same if d.tree_width == width)
    out[c.pilot_key] = dataclasses.replace(c, gamma=min(gamma, largest),
                                           tree_width=width)
  return out


def _timed_pilots(pilots: Mapping[str, Candidate]) -> Dict[str, bool]:
  """{pilot_key: is it timed}: unpriced modes (beams: their walltime ratio
  is the prediction), the first chain pilot and the tree pilot
  (`calibration`: κ of the chains and of the trees)."""
  timed, calibrated = {}, set()
  for key, candidate in pilots.items():
    family = bool(candidate.mode.branches)
    timed[key] = not candidate.mode.priced or family not in calibrated
    if candidate.mode.priced:
      calibrated.add(family)
  return timed


def pilot_fields(plan: Loaded, pilots: Mapping[str, Candidate],
                 timed: Mapping[str, bool], cap: int) -> Dict[str, Any]:
  """The pilot cache's key fields (`price_cache.PILOTS`): what the pilots'
  α depends on — the run's settings (task, examples, seed, sampling,
  drafter, the models' configs), the weights themselves, each pilot's
  mode, γ, k, and the pilot's size rule; the machine too when a pilot is
  timed (its walltime ratio is this machine's). The pilot's inputs are
  checked on reading (`pilots_for`)."""
  return {
      "settings": plan.settings,
      "weights": price_cache.weights_digest((plan.models.target, plan.drafter)),
      "pilots": {
          key: [c.mode.name, c.gamma, c.tree_width, timed[key]]
          for key, c in pilots.items()
      },
      "cap": cap,
      "tolerance": auto_mode.AUTO_ALPHA_TOLERANCE,
      "min_examples": auto_mode.AUTO_PILOT_MIN_EXAMPLES,
      "machine":
          (price_cache.machine_fields() if any(timed.values()) else None),
  }


def inputs_digest(feed: multihost.Feeder, batches: int) -> str:
  """A digest of the first `batches` batches' rows (what a pilot read)."""
  digest = hashlib.sha256()
  for b in range(min(int(batches), feed.num_batches)):
    digest.update(np.ascontiguousarray(feed.host_rows(b)).tobytes())
    digest.update(np.asarray(feed.kept_rows(b), np.int64).tobytes())
  return digest.hexdigest()[:24]


def pilots_for(plan: Loaded, feed: multihost.Feeder, pilots: Mapping[str,
                                                                     Candidate],
               plans: Plans) -> Tuple[Dict[str, Any], Dict[str, Any]]:
  """({pilot_key: `run_pilot`'s record}, metrics.json's `auto.pilot_cache`:
  'cached', 'file', 'decoded' (the pilots decoded now; [] when cached)).

  The records come from the pilot cache when a run with the same fields
  (`pilot_fields`) decoded them from the same inputs; else each pilot is
  decoded (`plans`: its decoders kept for the run) and the records cached.
  """
  cap = auto_mode.pilot_cap(feed.num_examples)
  timed = _timed_pilots(pilots)
  # Off (or several processes, whose weights no one process holds): no
  # digest, no file.
  fields = (pilot_fields(plan, pilots, timed, cap)
            if pilots and price_cache.enabled() else None)
  file = fields and price_cache.path(fields, price_cache.PILOTS)
  # Every cached value checked like an input (a bad one: measured again).
  entry = fields and price_cache.load(
      fields, price_cache.PILOTS,
      lambda e: price_cache.check_pilots(e, fields["pilots"]))
  if entry and entry["inputs"] == inputs_digest(feed, entry["batches"]):
    return dict(entry["records"]), {"cached": True, "file": file, "decoded": []}
  records: Dict[str, Any] = {}
  for key, candidate in pilots.items():
    with console.phase(f"SPECULATION='auto': pilot decode of {key} "
                       f"(γ={candidate.gamma}), until its α is known to "
                       f"±{auto_mode.AUTO_ALPHA_TOLERANCE / 2:g} or "
                       f"{cap} examples"):
      records[key] = run_pilot(plans(candidate), feed, cap, timed=timed[key])
  if fields:
    batches = max(r["batches_read"] for r in records.values())
    price_cache.store(
        fields, {
            "records": records,
            "batches": batches,
            "inputs": inputs_digest(feed, batches)
        }, price_cache.PILOTS)
  return records, {"cached": False, "file": file, "decoded": list(records)}


def calibration(candidates: Sequence[Candidate], pilots: Dict[str, Any],
                prices: auto_mode.Prices,
                trees: bool = False) -> Optional[Dict[str, Any]]:
  """The timed chain (`trees`: tree) pilot's measured speedup beside the
  model's at its own setting (κ for `auto_mode.calibrated`), or None
  without one."""
  for c in candidates:
    record = pilots.get(c.pilot_key) if c.mode.priced else None
    if (record is not None and "speedup" in record and
        bool(c.mode.branches) == trees):
      at_pilot = dataclasses.replace(c, gamma=int(record["gamma"]),
                                     tree_width=record.get("tree_width"))
      model = auto_mode.predict(at_pilot, prices, pilots)["predicted_speedup"]
      return {
          "pilot": c.pilot_key,
          "gamma": int(record["gamma"]),
          "tree_width": record.get("tree_width"),
          "measured_speedup": float(record["speedup"]),
          "model_speedup": float(model)
      }
  return None


def price_fields(plan: Loaded, feed: multihost.Feeder, ks: Sequence[int],
                 tree: Optional[Dict[str, Any]]) -> Dict[str, Any]:
  """The price cache's key fields (`price_cache`): machine, pair, input
  width and what is priced."""
  args = plan.args
  return {
      "machine": price_cache.machine_fields(),
      "pair": {
          "target": plan.settings.get("target"),
          "draft": plan.settings.get("draft"),
          "target_checkpoint_path": args.target_checkpoint_path,
          "draft_checkpoint_path": args.draft_checkpoint_path,
          "drafter": args.drafter,
          "drafter_settings": args.drafting.record(),
      },
      "input_width": feed.batch_width(0),
      "batch_size": args.batch_size,
      "max_decode_length": args.max_decode_length,
      "method": [args.temperature, args.top_k, args.top_p],
      "tree_without_replacement": args.tree_without_replacement,
      "call_ks": list(ks),
      "tree": tree,
  }


def target_price_fields(plan: Loaded, fields: Mapping[str,
                                                      Any]) -> Dict[str, Any]:
  """The key of the target's call prices alone (`price_fields` less the
  draft and the sampling method, which the target's calls do not read):
  a run with another draft or temperature on the same target and machine
  prices only its drafter. The verifier is the target keeping its hidden
  states when the drafter reads them (another program)."""
  tree = fields["tree"]
  return {
      "machine": fields["machine"],
      "target": fields["pair"]["target"],
      "target_checkpoint_path": fields["pair"]["target_checkpoint_path"],
      "verifier_keeps_features": bool(
          plan.args.drafting.spec.reads_target_features),
      "input_width": fields["input_width"],
      "batch_size": fields["batch_size"],
      "max_decode_length": fields["max_decode_length"],
      "call_ks": fields["call_ks"],
      "tree_nodes": tree and tree["nodes"],
  }


def _priced_shapes(args: Any, candidates: Sequence[Candidate],
                   sizes: PilotSizes):
  """(the K of the target calls to price, the trees' {'gamma', 'widths',
  'nodes'} or None)."""
  one_path = [
      c for c in candidates
      if c.mode.priced and not c.mode.branches and not c.mode.target_alone
  ]
  ks: Tuple[int, ...] = ()
  if one_path:
    ks = (auto_gamma.AUTO_GAMMA_CALL_KS if args.auto_gamma else
          (1, int(args.gamma) + 1))
  trees = [c for c in candidates if c.mode.branches]
  if not trees:
    return ks or (1, 2), None
  nodes = sorted({1} | {1 + c.tree_width * c.gamma for c in trees}
                 if not args.auto_gamma else auto_tree.AUTO_TREE_CALL_NODES)
  return ks or (1, 2), {
      "gamma": auto_mode.pilot_gamma(args.gamma, sizes),
      "widths": sorted({c.tree_width for c in trees}),
      "nodes": [int(n) for n in nodes],
  }


# The entries of the prices that are the target's alone (`target_price_fields`).
_TARGET_PRICES = ("target_step_s", "call_cost_by_k", "tree_call_cost_by_nodes")


def measure_prices(
    plan: Loaded, feed: multihost.Feeder, ks: Sequence[int],
    tree: Optional[Dict[str, Any]], fill: int, context_plan: DecodePlan,
    target: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
  """The calls' costs in target steps, timed now (`price_cache`'s entry:
  string keys).

  Args:
    target: the target's call prices from the cache (`target_price_fields`:
      'target_step_s', 'call_cost_by_k', 'tree_call_cost_by_nodes'), or
      None: timed now as well. Given, only a step is timed beside the
      drafter (c is a ratio to a step of the same rounds).
  """
  args, batch = plan.args, feed.batch(0)
  model, drafter = plan.models.target, plan.drafter
  context = context_plan.baseline(batch, plan.rng).tokens
  pricing = plan.plan.providers.pricing
  by_k, guess = step_costs.price_calls(args, drafter, model, batch,
                                       (1,) if target else tuple(ks), fill,
                                       context, pricing,
                                       draft_gamma=max(ks) - 1)
  entry: Dict[str, Any] = {
      "target_step_s": by_k[1],
      "call_cost_by_k": {
          str(k): by_k[k] / by_k[1] for k in sorted(by_k)
      },
      "cost_coefficient_c": guess / by_k[1],
  }
  if tree is not None:
    seconds = step_costs.price_tree_shapes(
        args, drafter, model, batch, fill, context, gamma=tree["gamma"],
        widths=tree["widths"], nodes=[1] if target else tree["nodes"],
        pricing=pricing)
    step = seconds["step"]
    entry["tree_call_cost_by_nodes"] = {
        str(n): s / step for n, s in sorted(seconds["tree"].items())
    }
    entry["cost_coefficient_by_tree_width"] = {
        str(k): s / step for k, s in sorted(seconds["draft_depth"].items())
    }
  if target:
    entry.update({k: target[k] for k in _TARGET_PRICES if k in target})
  return entry


def prices_for(
    plan: Loaded, feed: multihost.Feeder, candidates: Sequence[Candidate],
    fill: int,
    context_plan: DecodePlan) -> Tuple[auto_mode.Prices, Dict[str, Any]]:
  """The candidates' prices, from the cache or measured (then cached),
  and metrics.json's `auto.prices` (`cached`, `target_cached`: the
  target's calls from an entry of another draft or method, `file`,
  `seconds`)."""
  ks, tree = _priced_shapes(plan.args, candidates,
                            plan.plan.providers.pilot_sizes)
  fields = price_fields(plan, feed, ks, tree)
  target_fields = target_price_fields(plan, fields)
  t0 = time.perf_counter()
  entry = price_cache.load(
      fields, check=lambda e: price_cache.check_prices(e, ks, tree))
  cached = entry is not None
  target = None if cached else price_cache.load(
      target_fields,
      check=lambda e: price_cache.check_prices(e, ks, tree, target_only=True))
  if entry is None:
    if target:
      what = (f"the drafter{' and its trees' if tree else ''} beside a "
              "target step (the target's calls from the cache)")
    else:
      what = (f"the target's calls of K = {', '.join(map(str, ks))} tokens, "
              f"the drafter{', the tree calls' if tree else ''}")
    with console.phase(f"SPECULATION='auto': pricing {what} on this machine "
                       "(cached for the next run)"):
      entry = measure_prices(plan, feed, ks, tree, fill, context_plan, target)
    price_cache.store(fields, entry)
    if target is None:
      price_cache.store(target_fields,
                        {k: entry[k] for k in _TARGET_PRICES if k in entry})
  prices = auto_mode.Prices(
      call_cost_by_k={
          int(k): v for k, v in entry["call_cost_by_k"].items()
      }, cost_coefficient=entry["cost_coefficient_c"], tree_call_cost_by_nodes={
          int(n): v
          for n, v in entry.get("tree_call_cost_by_nodes", {}).items()
      }, cost_coefficient_by_width={
          int(k): v
          for k, v in entry.get("cost_coefficient_by_tree_width", {}).items()
      })
  return prices, {
      "cached": cached,
      "target_cached": cached or target is not None,
      "file": price_cache.path(fields) if price_cache.enabled() else None,
      "seconds": time.perf_counter() - t0,
      "input_width": fields["input_width"],
      **entry
  }


def _candidates(plan: Loaded) -> List[Candidate]:
  """The run's candidates (`auto_mode.candidates`), at the γ and k of
  `Providers.pilot_sizes`."""
  args, sizes = plan.args, plan.plan.providers.pilot_sizes
  spec = args.drafting.spec
  # A feature draft's trees are not priced by `step_costs.price_tree_shapes`.
  supported = tuple(
      n for n in spec.decode_modes
      if not (spec.reads_target_features and n == decode_modes.TREE.name))
  search = decode_modes.search_mode_of(args)
  gammas = ([auto_mode.pilot_gamma(args.gamma, sizes)]
            if search.beam else auto_mode.gammas_considered(args.gamma, sizes))
  return auto_mode.candidates(search, supported, gammas,
                              args.method().is_greedy,
                              plan.target_config.vocab_size,
                              tree_widths=sizes.auto_tree_widths)


def choose_mode(plan: Loaded, feed: multihost.Feeder) -> DecodePlan:
  """SPECULATION='auto': the plan at the candidate of the best predicted
  walltime, with its record (`DecodePlan.auto`); logs the `auto:` line."""
  t0 = time.perf_counter()
  candidates = _candidates(plan)
  plans = Plans(plan)
  pilot_candidates = _pilot_candidates(
      candidates,
      auto_mode.pilot_gamma(plan.args.gamma, plan.plan.providers.pilot_sizes))
  pilots, pilot_cache = pilots_for(plan, feed, pilot_candidates, plans)
  pilot_s = time.perf_counter() - t0
  prices, price_record = None, None
  if any(c.mode.priced and not c.mode.target_alone for c in candidates):
    fill = max(1, int(next(iter(pilots.values()))["mean_output_tokens"]))
    price = plan.plan.providers.auto_prices or prices_for
    # The first pilot's baseline gives the pricing its context.
    prices, price_record = price(plan, feed, candidates, fill,
                                 plans(next(iter(pilot_candidates.values()))))
  rows = [auto_mode.predict(c, prices, pilots) for c in candidates]
  calibrated = prices and calibration(candidates, pilots, prices)
  tree_calibrated = prices and calibration(candidates, pilots, prices,
                                           trees=True)
  if calibrated:  # the chains; the trees too when no tree pilot was timed
    rows, calibrated["kappa"] = auto_mode.calibrated(
        rows, calibrated["measured_speedup"], calibrated["model_speedup"],
        trees=False if tree_calibrated else None)
  if tree_calibrated:
    rows, tree_calibrated["kappa"] = auto_mode.calibrated(
        rows, tree_calibrated["measured_speedup"],
        tree_calibrated["model_speedup"], trees=True)
  chosen = auto_mode.choose(rows)
  beam_examples = next(
      (p["examples"] for p in pilots.values() if "speedup" in p), None)
  record = {
      "choice": rows[chosen],
      "reason": auto_mode.reason(rows, chosen, pilot_examples=beam_examples),
      "candidates": rows,
      "pilots": pilots,
      "pilot_cache": pilot_cache,
      "prices": price_record,
      "calibration": calibrated or None,
      "tree_calibration": tree_calibrated or None,
      "min_gain": auto_mode.AUTO_MIN_GAIN,
      "alpha_tolerance": auto_mode.AUTO_ALPHA_TOLERANCE,
      "pilot_cap_examples": auto_mode.pilot_cap(feed.num_examples),
      "pilot_s": pilot_s,
      "choice_s": time.perf_counter() - t0,
  }
  # Every process decodes what process 0 chose (timings differ by host).
  record = multihost.allgather("speculation_auto", record)[0]
  logging.info("%s", record["reason"])
  chosen = next(i for i, r in enumerate(rows)
                if (r["label"] == record["choice"]["label"]))
  # A pilot's own setting: its decoders, built and compiled before the
  # choice, decode the run.
  record["decoders_reused"] = candidates[chosen] in plans.built
  decode_plan = plans(candidates[chosen])
  online = auto_switch.OnlineChoice(
      candidates, rows, chosen, pilots, prices, plans, decode_plan,
      target_step_s=(price_record or {}).get("target_step_s"))
  return dataclasses.replace(decode_plan, auto=record, online=online)
