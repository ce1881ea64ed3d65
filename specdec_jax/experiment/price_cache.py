"""The 'auto' choices' call prices (`prices_for`) and pilots, cached per
machine, settings and shapes (one JSON file per key, checked on reading
like an input: a bad entry is a miss, said in one warning, and rewritten);
SPECDEC_JAX_PRICE_CACHE=0 turns it off.
"""
import functools
import hashlib
import json
import math
import os
import platform
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from absl import logging
import jax
import numpy as np

from specdec_jax.core import environment
from specdec_jax.core import kernels
from specdec_jax.experiment import auto
from specdec_jax.experiment import decode_modes
from specdec_jax.files import io_utils
from specdec_jax.metrics import step_costs
from specdec_jax.terminal import console

ENV_OFF = environment.PRICE_CACHE
# Bumped when what a price means changes: older entries are then misses.
VERSION = 2
PRICES, PILOTS = "auto-prices", "auto-pilots"
_PAYLOAD = {PRICES: "prices", PILOTS: "pilots"}
_SAMPLED = 4096  # values per array `weights_digest` reads
MAX_ENTRY_BYTES = 4 << 20


def folder(kind: str = PRICES) -> str:
  return os.path.join(environment.cache_dir(), kind)


def enabled() -> bool:
  """Off with SPECDEC_JAX_PRICE_CACHE=0, and on several processes (one
  pricing while another reads its cache would hang a collective)."""
  return environment.flag(ENV_OFF, True) and jax.process_count() == 1


# /proc/cpuinfo's lines that tell one processor kind from another: "AMD
# EPYC" names a Zen 3 (AVX2) and a Zen 4 (AVX-512) alike.
_CPU_IDENTITY_KEYS = ("vendor_id", "cpu family", "model", "model name",
                      "stepping")


def cpu_identity(cpuinfo: str) -> str:
  """The first processor's identifying lines of /proc/cpuinfo's text
  `cpuinfo`, as 'key: value' joined by '; ' ('' if it has none)."""
  found: Dict[str, str] = {}
  for line in cpuinfo.splitlines():
    if not line.strip():
      if found:
        break  # the first processor's block ends
      continue
    key, sep, value = line.partition(":")
    if sep and key.strip() in _CPU_IDENTITY_KEYS:
      found.setdefault(key.strip(), value.strip())
  return "; ".join(f"{k}: {found[k]}" for k in _CPU_IDENTITY_KEYS if k in found)


@functools.lru_cache(maxsize=None)
def _cpu_model() -> str:
  """`cpu_identity` of /proc/cpuinfo (platform.processor() elsewhere)."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      identity = cpu_identity(f.read())
    if identity:
      return identity
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _usable_cpus() -> int:
  """The CPUs this process may run on (its affinity: a container's or
  taskset's limit), which set XLA:CPU's threads."""
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    return os.cpu_count() or 1


def _cpu_kernel() -> Any:
  """On the CPU backend, the instruction set the CPU kernel runs
  (`kernels.instruction_set`: SPECDEC_JAX_KERNEL_ISA's cap applied), False
  when it is off or unavailable; None on other backends."""
  if jax.default_backend() != "cpu":
    return None
  if not kernels.switched_on() or not kernels.available():
    return False
  return kernels.instruction_set()


def machine_fields() -> Dict[str, Any]:
  """What makes this machine's prices its own: the processor's kind (not
  only its model name), the CPUs usable, the backend and devices, JAX, and
  the instruction set the CPU kernel runs."""
  device = jax.devices()[0]
  return {
      "host": platform.node(),
      "cpu": _cpu_model(),
      "cpus": _usable_cpus(),
      "backend": jax.default_backend(),
      "device_kind": device.device_kind,
      "devices": jax.device_count(),
      "jax": jax.__version__,
      "cpu_kernel": _cpu_kernel(),
  }


def _normalized(fields: Mapping[str, Any]) -> Any:
  """`fields` with VERSION, as JSON reads them back."""
  return json.loads(
      json.dumps({
          "version": VERSION,
          **fields
      }, sort_keys=True, default=str))


def path(fields: Mapping[str, Any], kind: str = PRICES) -> str:
  text = json.dumps(_normalized(fields), sort_keys=True)
  name = hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]
  return os.path.join(folder(kind), name + ".json")


def weights_digest(tree: Any) -> str:
  """A digest of the arrays in `tree`: shapes, dtypes and _SAMPLED values
  strided over each (other weights differ in almost every value)."""
  digest = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(tree):
    array = np.asarray(leaf)
    digest.update(f"{array.shape}:{array.dtype};".encode("utf-8"))
    flat = array.reshape(-1)
    step = max(1, flat.size // _SAMPLED)
    digest.update(np.ascontiguousarray(flat[::step]).tobytes())
  return digest.hexdigest()[:24]


def load(
    fields: Mapping[str, Any], kind: str = PRICES,
    check: Optional[Callable[[Dict[str, Any]], None]] = None
) -> Optional[Dict[str, Any]]:
  """The `kind` entry stored for `fields`, or None (a miss, the cache off,
  or `check` raised `BadEntry`: then said in one warning)."""
  if not enabled():
    return None
  file = path(fields, kind)
  try:
    entry = json.loads(io_utils.read_text(file, max_bytes=MAX_ENTRY_BYTES))
  except OSError as e:
    if not isinstance(e, FileNotFoundError):
      logging.warning("SPECULATION='auto': %s; measured again.", e)
    return None
  except ValueError as e:
    logging.warning(
        "SPECULATION='auto': %s is not a cache entry (%s); "
        "measured again.", file, e)
    return None
  same = isinstance(entry, dict) and entry.get("fields") == _normalized(fields)
  value = entry.get(_PAYLOAD[kind]) if same else None
  if not isinstance(value, dict):
    return None
  try:
    if check is not None:
      check(value)
  except BadEntry as e:
    logging.warning(
        "SPECULATION='auto': the cached %s in %s are invalid (%s); measured "
        "again and rewritten.", _PAYLOAD[kind], file, e)
    return None
  return value


class BadEntry(ValueError):
  """A cached value out of its type or range: the entry is a miss."""


_MISSING = object()
# A timed pilot's speedup is at most this times γ + 1 (tokens per call).
_SPEEDUP_ROOM = 10.0


def _number(value: Any, name: str, low: float = 0.0, high: float = math.inf,
            low_open: bool = True, kind: Any = (int, float)) -> float:
  """`value`, a finite number of `kind` in its range; else BadEntry."""
  if value is _MISSING:
    raise BadEntry(f"{name} is missing")
  if not (isinstance(value, kind) and not isinstance(value, bool) and
          math.isfinite(value) and
          (value > low if low_open else value >= low) and value <= high):
    above = f"{'>' if low_open else '>='} {low:g}"
    below = f" and <= {high:g}" if math.isfinite(high) else ""
    what = "an integer" if kind is int else "a finite number"
    raise BadEntry(f"{name}={value!r}: allowed: {what} {above}{below}")
  return float(value)


def _integer(value: Any, name: str, low: int = 0) -> None:
  _number(value, name, low, low_open=False, kind=int)


def _costs(entry: Mapping[str, Any], key: str, wanted: Any) -> None:
  """entry[key]: {'n': finite > 0} with every n of `wanted`."""
  table = entry.get(key, _MISSING)
  if table is _MISSING and not wanted:
    return
  if not isinstance(table, dict):
    raise BadEntry(f"{key} is missing" if table is
                   _MISSING else f"{key}={table!r}: allowed: {{size: cost}}")
  for n in wanted or ():
    if str(n) not in table:
      raise BadEntry(f"{key} has no cost of {n}")
  for n, cost in table.items():
    if not (n.isdigit() and int(n) >= 1):
      raise BadEntry(f"{key} key {n!r}: allowed: an integer >= 1")
    _number(cost, f"{key}[{n!r}]")


def check_prices(entry: Mapping[str, Any], ks: Any, tree: Any = None,
                 target_only: bool = False) -> None:
  """Raises BadEntry unless `entry` holds `measure_prices`' prices of `ks`
  (and `tree`'s nodes and widths; `target_only`: the target's calls)."""
  _number(entry.get("target_step_s", _MISSING), "target_step_s")
  _costs(entry, "call_cost_by_k", ks or (1,))
  if abs(entry["call_cost_by_k"].get("1", 1.0) - 1.0) > 1e-9:
    raise BadEntry(f"call_cost_by_k['1']={entry['call_cost_by_k']['1']!r}: "
                   "allowed: 1 (a one-token call is the unit)")
  _costs(entry, "tree_call_cost_by_nodes", tree and tree["nodes"])
  if not target_only:
    if ks:
      _number(entry.get("cost_coefficient_c", _MISSING), "cost_coefficient_c")
    _costs(entry, "cost_coefficient_by_tree_width", tree and tree["widths"])


def check_pilots(entry: Mapping[str, Any], pilots: Mapping[str, Any]) -> None:
  """Raises BadEntry unless `entry` holds `pilots.run_pilots`' record of
  each of `pilots` ({key: [mode, γ, k, timed]}), in range."""
  records = entry.get("records", _MISSING)
  if not isinstance(records, dict):
    raise BadEntry("records: allowed: {pilot: record}")
  _integer(entry.get("batches", _MISSING), "batches", 1)
  if not isinstance(entry.get("inputs"), str):
    raise BadEntry(f"inputs={entry.get('inputs')!r}: allowed: a digest")
  for key, (_, gamma, width, timed) in pilots.items():
    record = records.get(key, _MISSING)
    if not isinstance(record, dict):
      raise BadEntry(f"records[{key!r}] is missing")
    _check_record(record, f"records[{key!r}].", gamma, width, timed)


def _check_record(record: Mapping[str, Any], where: str, gamma: int,
                  width: Optional[int], timed: bool) -> None:
  if (record.get("gamma"), record.get("tree_width")) != (gamma, width):
    raise BadEntry(f"{where}gamma, tree_width = {record.get('gamma')!r}, "
                   f"{record.get('tree_width')!r}: allowed: {gamma}, "
                   f"{width} (the entry's own key)")
  for name in ("examples", "batches_read", "input_width"):
    _integer(record.get(name, _MISSING), where + name, 1)
  _integer(record.get("acceptance_trials", _MISSING),
           where + "acceptance_trials")
  rates = ("alpha", "first_depth", "deeper") if width else ("alpha",)
  for name in rates:
    _number(record.get(name, _MISSING), where + name, 0.0, 1.0, False)
  for name in ("alpha_interval", "first_depth_by_width", "output_lengths"):
    values = record.get(name, [] if name == "first_depth_by_width" else None)
    if not isinstance(values, list):
      raise BadEntry(f"{where}{name}={values!r}: allowed: a list")
    for i, value in enumerate(values):
      if name == "output_lengths":
        _integer(value, f"{where}{name}[{i}]")
      else:
        _number(value, f"{where}{name}[{i}]", 0.0, 1.0, False)
  _number(record.get("mean_output_tokens", _MISSING),
          where + "mean_output_tokens")
  factors = record.get("batch_factor_by_gamma", {})
  if not isinstance(factors, dict):
    raise BadEntry(f"{where}batch_factor_by_gamma={factors!r}: allowed: "
                   "{gamma: factor}")
  for g, value in factors.items():
    _number(value, f"{where}batch_factor_by_gamma[{g!r}]")
  if timed or "speedup" in record:
    seconds = [
        _number(record.get(name, _MISSING), where + name)
        for name in ("baseline_s", "speculative_s")
    ]
    speedup = _number(record.get("speedup", _MISSING), where + "speedup",
                      high=_SPEEDUP_ROOM * (gamma + 1))
    if not math.isclose(speedup, seconds[0] / seconds[1], rel_tol=1e-6):
      raise BadEntry(f"{where}speedup={speedup!r}: allowed: baseline_s / "
                     f"speculative_s = {seconds[0] / seconds[1]:g}")


def store(fields: Mapping[str, Any], value: Mapping[str, Any],
          kind: str = PRICES) -> None:
  """Writes `value` for `fields`; a failure is logged, not raised."""
  if not enabled():
    return
  file = path(fields, kind)
  try:
    io_utils.write_json(file, {
        "fields": _normalized(fields),
        _PAYLOAD[kind]: dict(value)
    })
  except OSError as e:
    logging.warning(
        "SPECULATION='auto': could not cache the %s in %s (%s); the next "
        "run measures them again.", _PAYLOAD[kind], file, e)


# -- prices ----------------------------------------------------------------------
_TARGET_PRICES = ("target_step_s", "call_cost_by_k", "tree_call_cost_by_nodes")


def price_fields(loaded: Any, feed: Any, ks: Sequence[int],
                 tree: Optional[Dict[str, Any]]) -> Dict[str, Any]:
  """The price cache's key: machine, clock, pair, shapes priced."""
  args, pricing = loaded.args, loaded.providers.pricing
  draws = decode_modes.tree_of(args.decode_mode).without_replacement
  clock = pricing.call_seconds  # a test's stand-in is another clock
  name = getattr(clock, "__qualname__", type(clock).__qualname__)
  return {
      "machine": machine_fields(),
      "clock": f"{clock.__module__}.{name}:{pricing.steps}x{pricing.repeats}",
      "pair": {
          "target": loaded.settings.get("target"),
          "draft": loaded.settings.get("draft"),
          "target_checkpoint_path": args.target_checkpoint_path,
          "draft_checkpoint_path": args.draft_checkpoint_path,
          "drafter": args.drafting.name,
          "drafter_settings": args.drafting.record(args.ngram_corpus),
          # TARGET/DRAFT_DECODE_PATH and _TILES where set: another
          # program's prices.
          **args.chosen_decode_paths(),
          **args.chosen_tiles(),
      },
      "input_width": feed.batch_width(0),
      "batch_size": args.batch_size,
      "max_decode_length": args.max_decode_length,
      "method": [args.temperature, args.top_k, args.top_p],
      "tree_without_replacement": draws,
      "call_ks": list(ks),
      "tree": tree,
  }


def target_price_fields(loaded: Any, fields: Mapping[str,
                                                     Any]) -> Dict[str, Any]:
  """The key of the target's call prices alone: `price_fields` less the
  draft and the method (a verifier keeping features is another program)."""
  tree, pair = fields["tree"], fields["pair"]
  path = {
      k: pair[k] for k in ("TARGET_DECODE_PATH", "TARGET_TILES") if k in pair
  }  # if set
  return {
      "machine": fields["machine"],
      "clock": fields["clock"],
      "target": pair["target"],
      "target_checkpoint_path": pair["target_checkpoint_path"],
      **path,
      "verifier_keeps_features": bool(loaded.args.drafting.reads_target_features
                                     ),
      "input_width": fields["input_width"],
      "batch_size": fields["batch_size"],
      "max_decode_length": fields["max_decode_length"],
      "call_ks": fields["call_ks"],
      "tree_nodes": tree and tree["nodes"],
  }


def priced_shapes(
    args: Any, candidates: Sequence[auto.Candidate],
    sizes: Any) -> Tuple[Tuple[int, ...], Optional[Dict[str, Any]]]:
  """(the K to price, () without a chain; the trees' {'gamma', 'widths',
  'nodes'} or None)."""
  chains = [c for c in candidates if c.family == "chains"]
  ks: Tuple[int, ...] = ()
  if chains:
    ks = (auto.AUTO_GAMMA_CALL_KS if args.auto_gamma else
          (1, int(args.gamma) + 1))
  trees = [c for c in candidates if c.family == "trees"]
  if not trees:
    return ks, None
  nodes = sorted({1} | {1 + c.tree_width * c.gamma for c in trees}
                 if not args.auto_gamma else auto.AUTO_TREE_CALL_NODES)
  return ks, {
      "gamma": auto.pilot_gamma(args.gamma, sizes),
      "widths": sorted({c.tree_width for c in trees}),
      "nodes": [int(n) for n in nodes],
  }


def measure_prices(
    loaded: Any, feed: Any, ks: Sequence[int], tree: Optional[Dict[str, Any]],
    fill: int, context_plan: Any,
    target: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
  """The calls' costs in target steps, timed now (a cache entry). Given
  the target's cached prices (`target`), only a step is timed beside the
  drafter."""
  args, batch = loaded.args, feed.batch(0)
  model, drafter = loaded.models.target, loaded.drafter
  context = context_plan.baseline(batch, loaded.rng).tokens
  pricing = loaded.providers.pricing
  entry: Dict[str, Any] = {}
  if ks:
    by_k, guess = step_costs.price_calls(args, drafter, model, batch,
                                         (1,) if target else tuple(ks), fill,
                                         context, pricing,
                                         draft_gamma=max(ks) - 1)
    entry.update(
        target_step_s=by_k[1],
        call_cost_by_k={str(k): by_k[k] / by_k[1] for k in sorted(by_k)},
        cost_coefficient_c=guess / by_k[1])
  if tree is not None:
    draws = decode_modes.tree_of(args.decode_mode).without_replacement
    seconds = step_costs.price_tree_shapes(
        args, drafter, model, batch, fill, context, gamma=tree["gamma"],
        widths=tree["widths"], nodes=[1] if target else tree["nodes"],
        without_replacement=draws, pricing=pricing)
    step = seconds["step"]
    entry.setdefault("target_step_s", step)
    entry.setdefault("call_cost_by_k", {"1": 1.0})
    entry["tree_call_cost_by_nodes"] = {
        str(n): s / step for n, s in sorted(seconds["tree"].items())
    }
    entry["cost_coefficient_by_tree_width"] = {
        str(k): s / step for k, s in sorted(seconds["draft_depth"].items())
    }
  if target:
    entry.update({k: target[k] for k in _TARGET_PRICES if k in target})
  return entry


def _pricing_words(args: Any, ks: Sequence[int], tree: Any, target: Any) -> str:
  who = ("SPECULATION='auto'" if args.speculation == "auto" else
         "GAMMA/TREE_WIDTH='auto'" if tree else "GAMMA='auto'")
  drafted = "c" + (" and the trees' drafts" if tree else "")
  if target:
    what = (f"{drafted} beside a target step (the target's calls from the "
            "cache)")
  else:
    calls = ([f"the target's calls of K = {', '.join(map(str, ks))} tokens"]
             if ks else []) + (["the tree calls"] if tree else [])
    what = f"{drafted}, {' and '.join(calls)}"
  return f"{who}: pricing {what} on this machine (cached for the next run)"


def prices_for(loaded: Any, feed: Any, candidates: Sequence[auto.Candidate],
               fill: int,
               context_plan: Any) -> Tuple[auto.Prices, Dict[str, Any]]:
  """(the candidates' `auto.Prices`, cached or measured, metrics.json's
  `auto.prices`)."""
  ks, tree = priced_shapes(loaded.args, candidates,
                           loaded.providers.pilot_sizes)
  fields = price_fields(loaded, feed, ks, tree)
  target_fields = target_price_fields(loaded, fields)
  t0 = time.perf_counter()
  entry = load(fields, check=lambda e: check_prices(e, ks, tree))
  cached = entry is not None
  target = None if cached else load(
      target_fields,
      check=lambda e: check_prices(e, ks, tree, target_only=True))
  if entry is None:
    with console.phase(_pricing_words(loaded.args, ks, tree, target)):
      entry = measure_prices(loaded, feed, ks, tree, fill, context_plan, target)
    store(fields, entry)
    if target is None:
      store(target_fields, {k: entry[k] for k in _TARGET_PRICES if k in entry})

  def by_size(key):  # JSON's string keys read back as integers
    return {int(n): v for n, v in entry.get(key, {}).items()}

  prices = auto.Prices(by_size("call_cost_by_k"),
                       entry.get("cost_coefficient_c", math.nan),
                       by_size("tree_call_cost_by_nodes"),
                       by_size("cost_coefficient_by_tree_width"))
  return prices, {
      "cached": cached,
      "target_cached": cached or target is not None,
      "file": path(fields) if enabled() else None,
      "seconds": time.perf_counter() - t0,
      "input_width": fields["input_width"],
      **entry
  }
