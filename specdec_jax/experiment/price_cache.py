"""SPECULATION='auto''s call prices and pilots, cached, so that a second
run with the same settings prices and pilots nothing.

One small JSON file per key under the project's cache folder
(`SPECDEC_JAX_CACHE`, default ~/.cache/specdec_jax, as the compilation and
kernel caches), `<kind>/<key>.json`, written atomically
(`io_utils.write_json`). The key is a hash of the entry's fields; the entry
holds the fields themselves, so a collision or a stale layout is read as a
miss. `SPECDEC_JAX_PRICE_CACHE=0` turns both kinds off.

* `auto-prices` (`PRICES`): per machine (host, CPU model, JAX backend,
  device kind and count, JAX version, the CPU kernel switch), pair (both
  model configs, checkpoints, the drafter's settings) and what the calls
  are priced at (input width, batch size, decode length, sampling method,
  the K and tree shapes priced); and the target's calls alone, per
  machine, target and shapes (`auto_run.target_price_fields`), so that
  another draft or method on the same target prices only its drafter.
* `auto-pilots` (`PILOTS`): the pilots' α (`auto_run.pilots_for`), per run
  settings, weights (`weights_digest`), pilot shapes and the pilot's
  inputs; per machine as well when a pilot is timed (its walltime ratio
  is this machine's).
"""
import functools
import hashlib
import json
import os
import platform
from typing import Any, Dict, Mapping, Optional

from absl import logging
import jax
import numpy as np

from specdec_jax.files import io_utils

ENV_OFF = "SPECDEC_JAX_PRICE_CACHE"
# Bumped when what a price means changes: older entries are then misses.
VERSION = 1
# The two kinds of entry (their folders) and what each entry holds.
PRICES, PILOTS = "auto-prices", "auto-pilots"
_PAYLOAD = {PRICES: "prices", PILOTS: "pilots"}
# Values sampled per array by `weights_digest`.
_SAMPLED = 4096


def folder(kind: str = PRICES) -> str:
  """Where the `kind` files live."""
  parent = os.environ.get("SPECDEC_JAX_CACHE", "~/.cache/specdec_jax")
  return os.path.join(os.path.expanduser(parent), kind)


def enabled() -> bool:
  """Off with SPECDEC_JAX_PRICE_CACHE=0, and on several processes (each
  would find its own cache: one pricing while another does not would
  leave the others waiting in a collective)."""
  return os.environ.get(ENV_OFF, "1") != "0" and jax.process_count() == 1


@functools.lru_cache(maxsize=None)
def _cpu_model() -> str:
  """/proc/cpuinfo's model name (platform.processor() elsewhere)."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.lower().startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def machine_fields() -> Dict[str, Any]:
  """What makes this machine's prices its own."""
  device = jax.devices()[0]
  return {
      "host": platform.node(),
      "cpu": _cpu_model(),
      "backend": jax.default_backend(),
      "device_kind": device.device_kind,
      "devices": jax.device_count(),
      "jax": jax.__version__,
      "cpu_kernel": os.environ.get("SPECDEC_JAX_CPU_KERNEL", ""),
  }


def key(fields: Mapping[str, Any]) -> str:
  """A stable hash of `fields` (JSON, sorted keys)."""
  text = json.dumps({"version": VERSION, **fields}, sort_keys=True, default=str)
  return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def path(fields: Mapping[str, Any], kind: str = PRICES) -> str:
  return os.path.join(folder(kind), key(fields) + ".json")


def weights_digest(tree: Any) -> str:
  """A digest of the arrays in `tree` (the models, the drafter): each
  array's shape, dtype and _SAMPLED values strided over it. Other weights
  (a checkpoint, a seed, a fine-tune) differ in almost every value; reading
  the sample costs milliseconds, not a hash of every weight."""
  digest = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(tree):
    array = np.asarray(leaf)
    digest.update(f"{array.shape}:{array.dtype};".encode("utf-8"))
    flat = array.reshape(-1)
    step = max(1, flat.size // _SAMPLED)
    digest.update(np.ascontiguousarray(flat[::step]).tobytes())
  return digest.hexdigest()[:24]


def _normalized(fields: Mapping[str, Any]) -> Any:
  return json.loads(
      json.dumps({
          "version": VERSION,
          **fields
      }, sort_keys=True, default=str))


def load(fields: Mapping[str, Any],
         kind: str = PRICES) -> Optional[Dict[str, Any]]:
  """The `kind` entry stored for `fields`, or None (a miss, an unreadable
  file, other fields, the cache off)."""
  if not enabled():
    return None
  file = path(fields, kind)
  try:
    entry = json.loads(io_utils.read_text(file))
  except (OSError, ValueError):
    return None
  if not isinstance(entry, dict) or entry.get("fields") != _normalized(fields):
    return None
  value = entry.get(_PAYLOAD[kind])
  return value if isinstance(value, dict) else None


def store(fields: Mapping[str, Any], value: Mapping[str, Any],
          kind: str = PRICES) -> None:
  """Writes `value` (the prices, the pilots) for `fields` (atomically); a
  failed write is logged, not raised: the run has its value."""
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
