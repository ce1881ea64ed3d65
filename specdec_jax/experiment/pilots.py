"""Every choice a run makes before its timed decode (`choose`): one pilot
for all of them.

* GAMMA / TREE_WIDTH 'auto' (`choose_shape`): 'auto' limited to the run's
  own mode: its shapes (γ, and a tree's k) predicted and the best decoded
  (metrics.json's `gamma_auto`);
* SPECULATION='auto' (`choose_mode`): every mode the drafter drafts for,
  and the target alone, predicted; the best decoded, corrected between
  batches (`online.OnlineChoice`, injected into the plan; metrics.json's
  `auto`);
* SPECULATION='off': the target alone in the speculative decoder's place.

Both 'auto' choices measure the same way: a pilot decode per mode of the
run's first batches (`run_pilots`: one tree pilot at the widest k serves
every k), at one input width, until the 95% interval of its α is narrow
enough (`auto.pilot_done`); the pilots that calibrate the cost model are
timed against the target alone after a warm-up, interleaved (each pilot
in turn on each batch, and the two decoders' order alternating), so that
the first, slower batches favour neither; the calls priced on this
machine (`price_cache.prices_for`). Pilots and prices are cached
(`price_cache`). Both predict and choose by `auto`'s rules. When the
choice is a pilot's own setting, the pilot's decoders, compiled by its
decode, decode the run (`Plans`).

Nothing here changes what a mode decodes: every choice is made before the
first timed batch, and every candidate is exact.
"""
import dataclasses
import hashlib
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

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
# Untimed calls of each timed pilot's two decoders before its first timed
# one (the first compiles): a decoder's first calls after a compile run
# slower (issue 58: the pilot's target alone ran 41.6 ms an example, 27.6
# ms in the run), which biased the pilot's speedup.
WARMUP_CALLS = 2


def choose(loaded: Loaded, feed: multihost.Feeder) -> DecodePlan:
  """The plan the run decodes with: every choice made (SPECULATION 'auto'
  or 'off', GAMMA / TREE_WIDTH 'auto'), or the run's own settings."""
  args = loaded.args
  if args.speculation == decode_modes.SPECULATION_AUTO:
    return choose_mode(loaded, feed)
  if loaded.mode.target_alone:  # SPECULATION='off': nothing to choose
    return Plans(loaded)(Candidate(loaded.mode))
  if args.auto_gamma or args.decode_mode.auto_width:
    return choose_shape(loaded, feed)
  return loaded.decoding()


def _integer(value: Any, default: int) -> int:
  return default if isinstance(value, str) else int(value)


def candidate_args(args: Any, candidate: Candidate) -> Any:
  """The run arguments that decode `candidate` (checked again: a
  `RunArguments`): its mode (a tree with the run's tree settings) at its
  γ and k."""
  mode = candidate.mode
  if mode.target_alone:
    search = args.decode_mode
    if search.auto_width:
      search = dataclasses.replace(search, width=1)
    return dataclasses.replace(args, decode_mode=search,
                               speculation=decode_modes.SPECULATION_OFF,
                               gamma=_integer(args.gamma, 1))
  if mode.beam:
    return dataclasses.replace(args, gamma=candidate.gamma)
  if mode.branches:
    mode = dataclasses.replace(decode_modes.tree_of(args.decode_mode),
                               width=candidate.tree_width or 1)
  return dataclasses.replace(args, decode_mode=mode, gamma=candidate.gamma)


class Plans:
  """candidate -> its `DecodePlan` (its arguments, mode and decoders,
  built, not compiled), built once: a pilot's decoders, compiled by its
  decode, are the run's when the choice is the pilot's own setting."""

  def __init__(self, loaded: Loaded):
    self.loaded = loaded
    self.built: Dict[Candidate, DecodePlan] = {}

  def __call__(self, candidate: Candidate) -> DecodePlan:
    if candidate not in self.built:
      self.built[candidate] = self.loaded.decoding(
          candidate_args(self.loaded.args, candidate))
    return self.built[candidate]


# -- the pilots ----------------------------------------------------------------
def run_pilots(pilots: Mapping[str, DecodePlan], timed: Mapping[str, bool],
               feed: multihost.Feeder, cap: int) -> Dict[str, Dict[str, Any]]:
  """Pilot decodes of the run's first batches, each with its plan's
  speculative decoder, until `auto.pilot_done`.

  One input width: the run's most common among the batches the pilots may
  read (narrower ones padded to it, wider ones skipped), so that a pilot
  compiles its loop once and a timed pilot times the run's usual shape.
  The pilots take turns on each batch (the first pilot of a batch is the
  next one's last). A timed pilot (`timed[key]`: its speedup calibrates
  the cost model, or is a beam's prediction) runs both decoders
  WARMUP_CALLS times untimed first, then times both on each batch, in an
  order that alternates from batch to batch.

  Returns:
    {key: {'gamma', 'tree_width', 'examples', 'batches', 'batches_read'
    (up to the last one decoded, wider ones skipped), 'input_width',
    'acceptance_trials', 'alpha', 'alpha_interval', 'mean_output_tokens',
    'output_lengths'; trees: 'first_depth', 'deeper'
    (`auto.depth_acceptance`), 'first_depth_by_width' ([k]: a_1 of
    k' = 1..k branches); timed: 'baseline_s', 'speculative_s',
    'speedup'}}.
  """
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
      key: _pilot_record(
          pilots[key], tallies[key], width, read[key],
          baseline_s[key] if timed[key] else None) for key in pilots
  }


def _timed_pair(plan: DecodePlan, batch: batches_lib.Batch,
                done: int) -> Tuple[Any, float, float]:
  """(the speculative output, the baseline's seconds, the speculative
  decoder's) of `batch`, after the warm-up on a pilot's first batch
  (`done` = 0); the baseline first on even `done`, second on odd."""
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
                  read: int, baseline_s: Optional[float]) -> Dict[str, Any]:
  """One pilot's record (`run_pilots`)."""
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
  """The pilot cache's key fields (`price_cache.PILOTS`): what the pilots'
  α depends on — the run's settings (task, examples, seed, sampling,
  drafter, the models' configs), the weights themselves, each pilot's
  mode, γ, k, and the pilot's size rule; the machine too when a pilot is
  timed (its walltime ratio is this machine's). The pilot's inputs are
  checked on reading (`pilots_for`)."""
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


def pilots_for(loaded: Loaded, feed: multihost.Feeder,
               pilots: Mapping[str,
                               Candidate], timed: Mapping[str,
                                                          bool], plans: Plans,
               what: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
  """({pilot_key: `run_pilots`' record}, metrics.json's `pilot_cache`:
  'cached', 'file', 'decoded' (the pilots decoded now; [] when cached)).

  The records come from the pilot cache when a run with the same fields
  (`pilot_fields`) decoded them from the same inputs; else the pilots are
  decoded (`plans`: their decoders kept for the run; `what`: the choice
  they serve, for the progress line) and the records cached.
  """
  cap = auto.pilot_cap(feed.num_examples)
  # Off (or several processes, whose weights no one process holds): no
  # digest, no file.
  fields = (pilot_fields(loaded, pilots, timed, cap)
            if price_cache.enabled() else None)
  file = fields and price_cache.path(fields, price_cache.PILOTS)
  # Every cached value checked like an input (a bad one: measured again).
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
    records = run_pilots(plans_by_key, timed, feed, cap)
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
  """(`auto.Prices`, metrics.json's `prices`) of `candidates`' calls
  (`Providers.auto_prices`, else `price_cache.prices_for`), the cache
  filled to the pilots' mean output length and the drafter reading
  `pilot`'s baseline output; (None, None) when nothing is priced
  (beams)."""
  if not any(c.mode.priced and not c.mode.target_alone for c in candidates):
    return None, None
  fill = max(1, int(next(iter(pilots.values()))["mean_output_tokens"]))
  price = loaded.providers.auto_prices or price_cache.prices_for
  return price(loaded, feed, candidates, fill, plans(pilot))


# -- SPECULATION='auto' --------------------------------------------------------
def _candidates(loaded: Loaded) -> List[Candidate]:
  """SPECULATION='auto''s candidates (`auto.candidates`), at the γ and k
  of `Providers.pilot_sizes`."""
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
  is the prediction) and the first pilot of each priced family (its
  calibration)."""
  timed, calibrated = {}, set()
  for key, candidate in pilots.items():
    timed[key] = (not candidate.mode.priced or
                  candidate.family not in calibrated)
    calibrated.add(candidate.family)
  return timed


def calibrations(candidates: Sequence[Candidate], pilots: Mapping[str, Any],
                 prices: Optional[auto.Prices]) -> Dict[str, Dict[str, Any]]:
  """{family: its timed pilot's measured speedup beside the model's at the
  pilot's own setting, κ, their ratio (`auto.kappa`), and the overhead
  per call that calibrates the family (`auto.overhead_steps`)} for each
  priced family with a timed pilot."""
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
    # A pilot's timing is held within KAPPA_BOUNDS of the model.
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


def choose_mode(loaded: Loaded, feed: multihost.Feeder) -> DecodePlan:
  """SPECULATION='auto': the plan at the candidate of the best predicted
  walltime, with its online correction (`DecodePlan.online`, whose
  `outcome` is metrics.json's `auto`); logs the `auto:` line."""
  t0 = time.perf_counter()
  args, sizes = loaded.args, loaded.providers.pilot_sizes
  candidates = _candidates(loaded)
  plans = Plans(loaded)
  pilot_candidates = _pilot_candidates(candidates,
                                       auto.pilot_gamma(args.gamma, sizes))
  pilots, pilot_cache = pilots_for(loaded, feed, pilot_candidates,
                                   _timed_pilots(pilot_candidates), plans,
                                   "SPECULATION='auto'")
  pilot_s = time.perf_counter() - t0
  # The first pilot's baseline gives the pricing its context.
  prices, price_record = _priced(loaded, feed, candidates, pilots, plans,
                                 next(iter(pilot_candidates.values()), None))
  calibrated = calibrations(candidates, pilots, prices)
  overheads = {f: c["overhead_steps"] for f, c in calibrated.items()}
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
  # Every process decodes what process 0 chose (timings differ by host).
  record = multihost.allgather("speculation_auto", record)[0]
  logging.info("%s", record["reason"])
  chosen = next(i for i, r in enumerate(rows)
                if (r["label"] == record["choice"]["label"]))
  # A pilot's own setting: its decoders, built and compiled before the
  # choice, decode the run.
  record["decoders_reused"] = candidates[chosen] in plans.built
  decode_plan = plans(candidates[chosen])
  online = online_lib.OnlineChoice(
      candidates, rows, chosen, pilots, prices, overheads, record, plans,
      decode_plan, target_step_s=(price_record or {}).get("target_step_s"))
  return dataclasses.replace(decode_plan, online=online)


# -- GAMMA / TREE_WIDTH 'auto' ---------------------------------------------------
def choose_shape(loaded: Loaded, feed: multihost.Feeder) -> DecodePlan:
  """GAMMA and/or (ACCEPTANCE='tree') TREE_WIDTH 'auto': 'auto' limited to
  the run's mode, its γ (and k) of the best predicted speedup; the plan
  there, with metrics.json's `gamma_auto` (`shape_record`)."""
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
  pilots, _ = pilots_for(loaded, feed, {pilot.pilot_key: pilot},
                         {pilot.pilot_key: False}, plans, what)
  prices, _ = _priced(loaded, feed, candidates, pilots, plans, pilot)
  rows = auto.predict_all(candidates, prices, pilots)
  chosen = auto.best(rows)
  record = shape_record(candidates, rows, chosen, pilots[pilot.pilot_key],
                        prices, widths if mode.branches else None)
  logging.info("%s: %s -> %s (%s)", what, record["predicted_speedup"],
               candidates[chosen].label, rows[chosen]["predicted_speedup"])
  return dataclasses.replace(plans(candidates[chosen]), gamma_auto=record)


def shape_record(candidates: Sequence[Candidate], rows: Sequence[Mapping[str,
                                                                         Any]],
                 chosen: int, pilot: Mapping[str, Any], prices: auto.Prices,
                 widths: Optional[Sequence[int]]) -> Dict[str, Any]:
  """metrics.json's `gamma_auto`: the pilot (γ, batches, α), the priced
  costs, every shape's predicted speedup, the choice; a tree's (a_1, a)
  and c by k (`widths`: the k considered; None: chains) and the model's
  tokens per call at the choice; a chain's `pilot_confidence`."""
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
        prices.call_cost(g + 1) for g in range(1,
                                               max(gammas) + 1)
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
  record["predicted_speedup"] = {
      (f"gamma={c.gamma},k={c.tree_width}" if widths else f"gamma={c.gamma}"):
          r["predicted_speedup"]
      for c, r in sorted(zip(candidates, rows), key=lambda cr:
                         (cr[0].gamma, cr[0].tree_width or 0))
  }
  record.update(max_gamma=max(gammas), chosen_gamma=int(choice.gamma))
  if widths is None:
    record.update(pilot_confidence(candidates, pilot, prices))
  else:
    record.update(max_nodes=auto.AUTO_TREE_MAX_NODES,
                  chosen_tree_width=int(choice.tree_width),
                  predicted_tokens_per_call=rows[chosen]["tokens_per_call"])
  return record


def pilot_confidence(candidates: Sequence[Candidate], pilot: Mapping[str, Any],
                     prices: auto.Prices) -> Dict[str, Any]:
  """How firm GAMMA='auto''s choice is: `pilot_examples`,
  `acceptance_trials`, `alpha_interval` (95%), `gamma_interval` (the γ
  chosen at either end of it) and `caveat`: a line when the pilot decoded
  fewer than AUTO_PILOT_MIN_EXAMPLES examples (the data had no more;
  logged as a warning), else None."""
  low, high = pilot["alpha_interval"]
  gammas = []
  for alpha in (low, high):
    rows = auto.predict_all(candidates, prices,
                            {candidates[0].pilot_key: dict(pilot, alpha=alpha)})
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
