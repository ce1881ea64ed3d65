"""Every choice a run makes before its timed decode (`choose`), by one
pilot decode per mode of the run's first batches (`run_pilots`):
SPECULATION='auto' (`choose_mode`), GAMMA / TREE_WIDTH 'auto'
(`choose_shape`) and 'off'; a chosen pilot's decoders decode the run.
"""
import dataclasses
import hashlib
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import logging
import jax
import numpy as np

from specdec_jax import multihost
from specdec_jax.experiment import auto
from specdec_jax.experiment import batches as batches_lib
from specdec_jax.experiment import decode_modes
from specdec_jax.experiment import online as online_lib
from specdec_jax.experiment import price_cache
from specdec_jax.experiment.plan import DecodePlan
from specdec_jax.experiment.plan import Loaded
from specdec_jax.metrics import timing
from specdec_jax.terminal import console

Candidate = auto.Candidate
# Untimed calls of a timed pilot's decoders first: the first calls after a
# compile run slower (issue 58: 41.6 ms an example against 27.6 ms).
WARMUP_CALLS = 2


def choose(loaded: Loaded, feed: multihost.Feeder) -> DecodePlan:
  """The plan the run decodes with, every choice made."""
  args = loaded.args
  if args.speculation == decode_modes.SPECULATION_AUTO:
    return choose_mode(loaded, feed)
  if loaded.mode.target_alone:  # SPECULATION='off': nothing to choose
    return Plans(loaded)(Candidate(loaded.mode))
  if args.auto_gamma or args.decode_mode.auto_width:
    return choose_shape(loaded, feed)
  return loaded.decoding()


def candidate_args(args: Any, candidate: Candidate) -> Any:
  """The run arguments that decode `candidate` (a tree with the run's tree
  settings)."""
  mode = candidate.mode
  if mode.target_alone:
    search = args.decode_mode
    if search.auto_width:
      search = dataclasses.replace(search, width=1)
    return dataclasses.replace(args, decode_mode=search,
                               speculation=decode_modes.SPECULATION_OFF,
                               gamma=1 if args.auto_gamma else int(args.gamma))
  if mode.beam:
    return dataclasses.replace(args, gamma=candidate.gamma)
  if mode.branches:
    mode = dataclasses.replace(decode_modes.tree_of(args.decode_mode),
                               width=candidate.tree_width or 1)
  return dataclasses.replace(args, decode_mode=mode, gamma=candidate.gamma)


class Plans:
  """candidate -> its `DecodePlan` (built, not compiled), built once: a
  pilot's decoders are the run's when it is chosen."""

  def __init__(self, loaded: Loaded):
    self.loaded = loaded
    self.built: Dict[Candidate, DecodePlan] = {}

  def __call__(self, candidate: Candidate) -> DecodePlan:
    if candidate not in self.built:
      self.built[candidate] = self.loaded.decoding(
          candidate_args(self.loaded.args, candidate))
    return self.built[candidate]


# Bumped when a pilot's record gains what predictions read (2: chains'
# batch_factor_by_gamma; 3: trees' too): an older cached record is then a
# miss.
PILOT_RECORD = 3


# -- the pilots ----------------------------------------------------------------
def run_pilots(pilots: Mapping[str, DecodePlan], timed: Mapping[str, bool],
               feed: multihost.Feeder, cap: int, *,
               gammas: Sequence[int] = ()) -> Dict[str, Dict[str, Any]]:
  """{key: its record}: pilot decodes of the run's first batches until
  `auto.pilot_done`, at their most common input width (one compile),
  taking turns on each batch; a timed pilot (`timed[key]`) warms both
  decoders up, then times both, their order alternating by batch. A
  record: 'gamma', 'tree_width', counts, 'alpha' and its interval, output
  lengths (trees: 'first_depth', 'deeper', 'first_depth_by_width';
  chains and trees: 'batch_factor_by_gamma', {γ: `replay.batch_factors`}
  of the pilot γ and `gammas`; timed: 'baseline_s', 'speculative_s',
  'speedup')."""
  first = next(iter(pilots.values()))
  width = feed.common_width(-(-cap // first.args.batch_size))
  tallies = {key: batches_lib.Tally() for key in pilots}
  baseline_s = {key: 0.0 for key in pilots}
  read = dict.fromkeys(pilots, 0)
  active = list(pilots)
  for batch in batches_lib.batches(feed, first.rng, width):
    turn = batch.index % len(active)
    for key in active[turn:] + active[:turn]:
      plan, tally = pilots[key], tallies[key]
      if timed[key]:
        out, base_s, spec_s = _timed_pair(plan, batch, tally.batches)
        baseline_s[key] += base_s
      else:
        out, spec_s = batch.decode(plan.speculative)
      tally.add(out, batch.keep, plan.mode, spec_s)
      read[key] = batch.index + 1
    active = [
        key for key in active if
        not auto.pilot_done(tallies[key].examples, tallies[key].interval(), cap)
    ]
    if not active:
      break
  return {
      key: _pilot_record(pilots[key], tallies[key], width, read[key],
                         baseline_s[key] if timed[key] else None,
                         gammas) for key in pilots
  }


def _timed_pair(plan: DecodePlan, batch: batches_lib.Batch,
                done: int) -> Tuple[Any, float, float]:
  """(speculative output, baseline s, speculative s) of `batch`, warmed up
  on the first (`done` = 0); the baseline first on even `done`."""
  decoders = [plan.baseline, plan.speculative]
  if not done:
    for _ in range(WARMUP_CALLS):
      for decoder in decoders:
        jax.block_until_ready(decoder(batch.inputs, batch.rng))
  order = decoders if done % 2 == 0 else decoders[::-1]
  timed = {id(d): batch.decode(d, timing.timed) for d in order}
  out, spec_s = timed[id(plan.speculative)]
  return out, timed[id(plan.baseline)][1], spec_s


def _pilot_record(plan: DecodePlan, tally: batches_lib.Tally, width: int,
                  read: int, baseline_s: Optional[float],
                  gammas: Sequence[int]) -> Dict[str, Any]:
  tree = plan.mode.branches
  lengths = tally.lengths
  record: Dict[str, Any] = {
      "gamma": int(plan.args.gamma),
      "tree_width": int(plan.mode.width) if tree else None,
      "examples": tally.examples,
      "batches": tally.batches,
      "batches_read": read,
      "input_width": width,
      "acceptance_trials": int(tally.call_trials),
      "alpha": float(tally.call_alpha),
      "alpha_interval": [float(x) for x in tally.interval()],
      "mean_output_tokens": float(np.mean(lengths)) if lengths else 0.0,
      "output_lengths": [int(x) for x in lengths],
  }
  # An adaptive drafter's short call is not a rejection: no replay.
  if plan.mode.replays and plan.args.drafting.adaptive_threshold is None:
    gamma = int(plan.args.gamma)
    # What rows waiting for a batch's slowest cost each γ: more at a
    # larger γ (the shipped pair at batch 8: 1.00 at γ 1, 0.72 at γ 7;
    # trees of 2 branches 0.85 at γ 3, 0.74 at γ 7).
    record["batch_factor_by_gamma"] = tally.batch_factor_by_gamma(
        gamma, gammas, plan.args.batch_size)
  if tree:
    record["first_depth"], record["deeper"] = auto.depth_acceptance(
        tally.histogram)
    if tally.rounds is not None and tally.rounds.sum():
      record["first_depth_by_width"] = auto.first_depth_by_width(tally.rounds)
  if baseline_s is not None:
    spec_s = float(sum(tally.seconds))
    record.update(baseline_s=baseline_s, speculative_s=spec_s,
                  speedup=float(baseline_s / max(spec_s, 1e-12)))
  return record


def pilot_fields(loaded: Loaded, pilots: Mapping[str, Candidate],
                 timed: Mapping[str, bool], cap: int) -> Dict[str, Any]:
  """The pilot cache's key: what the pilots' α depends on (settings,
  weights, shapes, size rule; the machine when a pilot is timed)."""
  return {
      "settings": loaded.settings,
      "weights": price_cache.weights_digest(
          (loaded.models.target, loaded.drafter)),
      "pilots": {
          key: [c.mode.name, c.gamma, c.tree_width, timed[key]]
          for key, c in pilots.items()
      },
      "cap": cap,
      "tolerance": auto.AUTO_ALPHA_TOLERANCE,
      "min_examples": auto.AUTO_PILOT_MIN_EXAMPLES,
      "warmup": WARMUP_CALLS,
      "record": PILOT_RECORD,
      "machine":
          (price_cache.machine_fields() if any(timed.values()) else None),
  }


def inputs_digest(feed: multihost.Feeder, batches: int) -> str:
  """A digest of the first `batches` batches' rows."""
  digest = hashlib.sha256()
  for b in range(min(int(batches), feed.num_batches)):
    digest.update(np.ascontiguousarray(feed.host_rows(b)).tobytes())
    digest.update(np.asarray(feed.kept_rows(b), np.int64).tobytes())
  return digest.hexdigest()[:24]


def pilots_for(loaded: Loaded, feed: multihost.Feeder,
               pilots: Mapping[str,
                               Candidate], timed: Mapping[str,
                                                          bool], plans: Plans,
               what: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
  """({pilot_key: `run_pilots`' record}, metrics.json's `pilot_cache`),
  from the cache when the same fields read the same inputs, else decoded
  (`what`: the choice served, for the progress line) and cached."""
  cap = auto.pilot_cap(feed.num_examples)
  fields = (pilot_fields(loaded, pilots, timed, cap)
            if price_cache.enabled() else None)
  file = fields and price_cache.path(fields, price_cache.PILOTS)
  entry = fields and price_cache.load(
      fields, price_cache.PILOTS,
      lambda e: price_cache.check_pilots(e, fields["pilots"]))
  if not pilots:  # no speculative mode drafts for this run
    return {}, {"cached": False, "file": None, "decoded": []}
  if entry and entry["inputs"] == inputs_digest(feed, entry["batches"]):
    return dict(entry["records"]), {"cached": True, "file": file, "decoded": []}
  shapes = ", ".join(f"{c.label}{' (timed)' if timed[key] else ''}"
                     for key, c in pilots.items())
  plans_by_key = {key: plans(c) for key, c in pilots.items()}
  with console.phase(f"{what}: pilot decode of {shapes} on the first "
                     "examples, until each α is known to "
                     f"±{auto.AUTO_ALPHA_TOLERANCE / 2:g} or {cap} examples"):
    records = run_pilots(plans_by_key, timed, feed, cap,
                         gammas=loaded.providers.pilot_sizes.gammas)
  logging.info(
      "%s: the pilot%s decoded %s", what, "s" if len(records) > 1 else "",
      "; ".join(f"{key}: {r['examples']} examples ({r['batches']} batches)"
                for key, r in records.items()))
  if fields:
    batches = max(r["batches_read"] for r in records.values())
    price_cache.store(
        fields, {
            "records": records,
            "batches": batches,
            "inputs": inputs_digest(feed, batches)
        }, price_cache.PILOTS)
  return records, {"cached": False, "file": file, "decoded": list(records)}


def _priced(loaded: Loaded, feed: multihost.Feeder,
            candidates: Sequence[Candidate], pilots: Mapping[str, Any],
            plans: Plans, pilot: Candidate):
  """(`auto.Prices`, metrics.json's `prices`), the cache filled to the
  pilots' mean output length; (None, None) when nothing is priced."""
  if not any(c.mode.priced and not c.mode.target_alone for c in candidates):
    return None, None
  fill = max(1, int(next(iter(pilots.values()))["mean_output_tokens"]))
  price = loaded.providers.auto_prices or price_cache.prices_for
  return price(loaded, feed, candidates, fill, plans(pilot))


# -- SPECULATION='auto' --------------------------------------------------------
def _candidates(loaded: Loaded) -> List[Candidate]:
  """SPECULATION='auto''s candidates at `Providers.pilot_sizes`."""
  args, sizes = loaded.args, loaded.providers.pilot_sizes
  spec = args.drafting
  # A feature draft's trees are not priced by `step_costs.price_tree_shapes`.
  supported = tuple(
      n for n in spec.decode_modes
      if not (spec.reads_target_features and n == decode_modes.TREE.name))
  gammas = ([auto.pilot_gamma(args.gamma, sizes)]
            if loaded.mode.beam else auto.gammas_considered(args.gamma, sizes))
  return auto.candidates(loaded.mode, supported, gammas,
                         args.method().is_greedy,
                         loaded.target_config.vocab_size,
                         tree_widths=sizes.auto_tree_widths)


def _pilot_candidates(
    candidates: Sequence[Candidate],
    gamma: int) -> Tuple[Dict[str, Candidate], Dict[str, bool]]:
  """({pilot_key: its candidate}: each speculative mode at the pilot γ (at
  most its largest), trees at their widest k; {pilot_key: timed}: unpriced
  modes (beams) and each priced family's first pilot, its calibration)."""
  out: Dict[str, Candidate] = {}
  for c in candidates:
    if c.mode.target_alone or c.pilot_key in out:
      continue
    same = [d for d in candidates if d.pilot_key == c.pilot_key]
    width = max((d.tree_width or 0) for d in same) or None
    largest = max(d.gamma for d in same if d.tree_width == width)
    out[c.pilot_key] = dataclasses.replace(c, gamma=min(gamma, largest),
                                           tree_width=width)
  firsts: Dict[Optional[str], str] = {}
  return out, {
      key: not c.mode.priced or firsts.setdefault(c.family, key) == key
      for key, c in out.items()
  }


def calibrations(candidates: Sequence[Candidate], pilots: Mapping[str, Any],
                 prices: Optional[auto.Prices]) -> Dict[str, Dict[str, Any]]:
  """{family: its timed pilot's measured and modelled speedup, κ and the
  overhead per call that calibrates it} of each timed priced family."""
  out: Dict[str, Dict[str, Any]] = {}
  for c in candidates:
    record = pilots.get(c.pilot_key)
    if (prices is None or not c.mode.priced or c.family in out or
        record is None or "speedup" not in record):
      continue
    at_pilot = dataclasses.replace(c, gamma=int(record["gamma"]),
                                   tree_width=record.get("tree_width"))
    row = auto.predict(at_pilot, prices, pilots)
    model, measured = row["predicted_speedup"], float(record["speedup"])
    kappa = auto.kappa(measured, model)
    out[c.family] = {
        "pilot": c.pilot_key,
        "gamma": int(record["gamma"]),
        "tree_width": record.get("tree_width"),
        "measured_speedup": measured,
        "model_speedup": float(model),
        "kappa": kappa,
        "overhead_steps": auto.overhead_steps(kappa * model, row),
    }
  return out


def overheads_of(
    calibrated: Mapping[str, Mapping[str, Any]]) -> Dict[str, float]:
  """{family: its overhead per call in steps} of `calibrations`' entries
  (`auto.predict_all`'s `overheads`)."""
  return {f: float(c["overhead_steps"]) for f, c in calibrated.items()}


def first_process_choice(
    name: str, record: Dict[str, Any], candidates: Sequence[Candidate],
    matches: Callable[[Candidate, Mapping[str, Any]], bool]
) -> Tuple[Dict[str, Any], int]:
  """(process 0's `record`, the index of the candidate it chose, by
  `matches`): every process decodes what process 0 chose, since each
  times its own pilots and prices and the processes' programs must be one
  (`name`: the exchange's)."""
  first = multihost.allgather(name, record)[0]
  return first, next(i for i, c in enumerate(candidates) if matches(c, first))


def choose_mode(loaded: Loaded, feed: multihost.Feeder) -> DecodePlan:
  """SPECULATION='auto': the plan of the best prediction, with its online
  correction (`DecodePlan.online`); logs the `auto:` line."""
  t0 = time.perf_counter()
  args, sizes = loaded.args, loaded.providers.pilot_sizes
  candidates = _candidates(loaded)
  plans = Plans(loaded)
  pilot_candidates, timed = _pilot_candidates(
      candidates, auto.pilot_gamma(args.gamma, sizes))
  pilots, pilot_cache = pilots_for(loaded, feed, pilot_candidates, timed, plans,
                                   "SPECULATION='auto'")
  pilot_s = time.perf_counter() - t0
  prices, price_record = _priced(loaded, feed, candidates, pilots, plans,
                                 next(iter(pilot_candidates.values()), None))
  calibrated = calibrations(candidates, pilots, prices)
  overheads = overheads_of(calibrated)
  rows = auto.predict_all(candidates, prices, pilots, overheads)
  chosen = auto.choose(rows)
  beam_examples = next(
      (p["examples"] for p in pilots.values() if "speedup" in p), None)
  record = {
      "choice": rows[chosen],
      "reason": auto.reason(
          rows, chosen, pilot_examples=beam_examples,
          fixed_gamma=None if args.auto_gamma else int(args.gamma)),
      "candidates": rows,
      "pilots": pilots,
      "pilot_cache": pilot_cache,
      "prices": price_record,
      "calibration": calibrated.get("chains"),
      "tree_calibration": calibrated.get("trees"),
      "min_gain": auto.AUTO_MIN_GAIN,
      "alpha_tolerance": auto.AUTO_ALPHA_TOLERANCE,
      "pilot_cap_examples": auto.pilot_cap(feed.num_examples),
      "pilot_s": pilot_s,
      "choice_s": time.perf_counter() - t0,
  }
  record, chosen = first_process_choice(
      "speculation_auto", record, candidates,
      lambda c, r: c.label == r["choice"]["label"])
  logging.info("%s", record["reason"])
  record["decoders_reused"] = candidates[chosen] in plans.built
  decode_plan = plans(candidates[chosen])
  online = online_lib.OnlineChoice(
      candidates, rows, chosen, pilots, prices, overheads, record, plans,
      decode_plan, target_step_s=(price_record or {}).get("target_step_s"))
  return dataclasses.replace(decode_plan, online=online)


# -- GAMMA / TREE_WIDTH 'auto' ---------------------------------------------------
def choose_shape(loaded: Loaded, feed: multihost.Feeder) -> DecodePlan:
  """GAMMA / TREE_WIDTH 'auto': the run's mode at its best predicted γ
  (and k), with metrics.json's `gamma_auto`."""
  args, sizes, mode = loaded.args, loaded.providers.pilot_sizes, loaded.mode
  widths = [None]
  if mode.branches:
    widths = (list(sizes.tree_widths) if mode.auto_width else [int(mode.width)])
  candidates = auto.mode_candidates(mode,
                                    auto.gammas_considered(args.gamma,
                                                           sizes), widths,
                                    args.method().is_greedy,
                                    loaded.target_config.vocab_size)
  if mode.branches:  # the k of some tree small enough (greedy: <= vocab)
    widths = sorted({c.tree_width for c in candidates})
  pilot = Candidate(mode, auto.pilot_gamma(args.gamma, sizes), widths[-1])
  plans = Plans(loaded)
  what = ("GAMMA/TREE_WIDTH='auto'" if mode.branches else "GAMMA='auto'")
  # Timed, as SPECULATION='auto''s family pilot: its calibration (the
  # loop's work beside the model calls) is in every prediction.
  pilots, _ = pilots_for(loaded, feed, {pilot.pilot_key: pilot},
                         {pilot.pilot_key: True}, plans, what)
  prices, _ = _priced(loaded, feed, candidates, pilots, plans, pilot)
  calibrated = calibrations(candidates, pilots, prices)
  rows = auto.predict_all(candidates, prices, pilots, overheads_of(calibrated))
  chosen = auto.best(rows)
  record = shape_record(candidates, rows, chosen, pilots[pilot.pilot_key],
                        prices, widths if mode.branches else None, calibrated)
  record, chosen = first_process_choice(
      "gamma_auto", record, candidates, lambda c, r: (c.gamma, c.tree_width) ==
      (r["chosen_gamma"], r.get("chosen_tree_width")))
  logging.info("%s: %s -> %s (%s)", what, record["predicted_speedup"],
               candidates[chosen].label, record["chosen_predicted_speedup"])
  return dataclasses.replace(plans(candidates[chosen]), gamma_auto=record)


def shape_record(
    candidates: Sequence[Candidate], rows: Sequence[Mapping[str,
                                                            Any]], chosen: int,
    pilot: Mapping[str,
                   Any], prices: auto.Prices, widths: Optional[Sequence[int]],
    calibrated: Optional[Mapping[str, Mapping[str,
                                              Any]]] = None) -> Dict[str, Any]:
  """metrics.json's `gamma_auto` (`widths`: a tree's k considered; None:
  chains, with `pilot_confidence`; `calibrated`: `calibrations`' of the
  timed pilot, in `rows`)."""
  calibrated = calibrated or {}
  gammas = sorted({c.gamma for c in candidates})
  choice = candidates[chosen]
  record: Dict[str, Any] = {"pilot_gamma": int(pilot["gamma"])}
  if widths is not None:
    record["pilot_tree_widths"] = list(widths)
  record.update(
      pilot_batches=int(pilot["batches"]),
      alpha=float(pilot["deeper"] if widths else pilot["alpha"]),
      cost_coefficient_c=float(prices.cost_coefficient_by_width[widths[0]]
                               if widths else prices.cost_coefficient))
  if widths is None:
    record["call_cost_by_gamma"] = [
        prices.call_cost(g + 1) for g in range(1, gammas[-1] + 1)
    ]
  else:
    record.update(
        acceptance_by_tree_width={
            str(k): {
                "first_depth": auto.first_depth(pilot, k),
                "deeper_depths": float(pilot["deeper"])
            } for k in widths
        }, cost_coefficient_by_tree_width={
            str(k): float(prices.cost_coefficient_by_width[k]) for k in widths
        }, tree_call_cost_by_nodes=[
            prices.tree_call_cost(n)
            for n in range(1, auto.AUTO_TREE_MAX_NODES + 1)
        ])
  factors = {c.gamma: r["batch_factor"] for c, r in zip(candidates, rows)}
  record["batch_factor_by_gamma"] = [
      factors.get(g, 1.0) for g in range(1, gammas[-1] + 1)
  ]
  record["predicted_speedup"] = {
      (f"gamma={c.gamma},k={c.tree_width}" if widths else f"gamma={c.gamma}"):
          r["predicted_speedup"]
      for c, r in sorted(zip(candidates, rows), key=lambda cr:
                         (cr[0].gamma, cr[0].tree_width or 0))
  }
  record.update(
      max_gamma=gammas[-1], chosen_gamma=int(choice.gamma),
      chosen_predicted_speedup=float(rows[chosen]["predicted_speedup"]),
      chosen_model_speedup=float(rows[chosen].get(
          "model_speedup", rows[chosen]["predicted_speedup"])),
      calibration=(dict(calibrated[choice.family])
                   if choice.family in calibrated else None))
  if widths is None:
    record.update(
        pilot_confidence(candidates, pilot, prices, overheads_of(calibrated)))
  else:
    record.update(max_nodes=auto.AUTO_TREE_MAX_NODES,
                  chosen_tree_width=int(choice.tree_width),
                  predicted_tokens_per_call=rows[chosen]["tokens_per_call"])
  return record


def pilot_confidence(
    candidates: Sequence[Candidate], pilot: Mapping[str,
                                                    Any], prices: auto.Prices,
    overheads: Optional[Mapping[str, float]] = None) -> Dict[str, Any]:
  """How firm GAMMA='auto''s choice is: the γ chosen at either end of α's
  95% interval (each family's `overheads` added, as in the choice), and a
  `caveat` (logged) below AUTO_PILOT_MIN_EXAMPLES."""
  low, high = pilot["alpha_interval"]
  gammas = []
  for alpha in (low, high):
    rows = auto.predict_all(candidates, prices,
                            {candidates[0].pilot_key: dict(pilot, alpha=alpha)},
                            overheads)
    gammas.append(int(candidates[auto.best(rows)].gamma))
  examples, trials = int(pilot["examples"]), int(pilot["acceptance_trials"])
  need = auto.AUTO_PILOT_MIN_EXAMPLES
  caveat = None
  if examples < need:
    caveat = (
        f"GAMMA='auto': the pilot decoded {examples} "
        f"example{'s' if examples != 1 else ''}, fewer than the {need} it "
        f"needs: alpha {pilot['alpha']:.2f} from {trials} acceptance trials "
        f"(95% interval {low:.2f} to {high:.2f}: γ from {gammas[0]} to "
        f"{gammas[1]}) is a rough estimate; for a firm choice use "
        f"NUM_EXAMPLES >= {need} (and that many lines of data), or an "
        "integer GAMMA.")
    logging.warning("%s", caveat)
  return {
      "pilot_examples": examples,
      "acceptance_trials": trials,
      "alpha_interval": [float(low), float(high)],
      "gamma_interval": gammas,
      "caveat": caveat
  }
