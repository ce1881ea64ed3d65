"""SPECULATION='auto''s call prices, cached per machine, pair and input
width, so that a second run prices nothing.

One small JSON file per key under the project's cache folder
(`SPECDEC_JAX_CACHE`, default ~/.cache/specdec_jax, as the compilation and
kernel caches), `auto-prices/<key>.json`, written atomically
(`io_utils.write_json`). The key is a hash of `key_fields`: the machine
(host, CPU model, JAX backend, device kind and count, JAX version, the CPU
kernel switch), the pair (both model configs, checkpoints, the drafter's
settings) and what the calls are priced at (input width, batch size, decode
length, sampling method, the K and tree shapes priced). The entry holds the
fields themselves, so a collision or a stale layout is read as a miss.
`SPECDEC_JAX_PRICE_CACHE=0` turns the cache off.
"""
import functools
import hashlib
import json
import os
import platform
from typing import Any, Dict, Mapping, Optional

from absl import logging
import jax

from specdec_jax.files import io_utils

ENV_OFF = "SPECDEC_JAX_PRICE_CACHE"
# Bumped when what a price means changes: older entries are then misses.
VERSION = 1


def folder() -> str:
  """Where the price files live."""
  parent = os.environ.get("SPECDEC_JAX_CACHE", "~/.cache/specdec_jax")
  return os.path.join(os.path.expanduser(parent), "auto-prices")


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


def path(fields: Mapping[str, Any]) -> str:
  return os.path.join(folder(), key(fields) + ".json")


def _normalized(fields: Mapping[str, Any]) -> Any:
  return json.loads(
      json.dumps({
          "version": VERSION,
          **fields
      }, sort_keys=True, default=str))


def load(fields: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
  """The prices stored for `fields`, or None (a miss, an unreadable
  file, other fields, the cache off)."""
  if not enabled():
    return None
  file = path(fields)
  try:
    entry = json.loads(io_utils.read_text(file))
  except (OSError, ValueError):
    return None
  if not isinstance(entry, dict) or entry.get("fields") != _normalized(fields):
    return None
  prices = entry.get("prices")
  return prices if isinstance(prices, dict) else None


def store(fields: Mapping[str, Any], prices: Mapping[str, Any]) -> None:
  """Writes `prices` for `fields` (atomically); a failed write is logged,
  not raised: the run has its prices."""
  if not enabled():
    return
  file = path(fields)
  try:
    io_utils.write_json(file, {
        "fields": _normalized(fields),
        "prices": dict(prices)
    })
  except OSError as e:
    logging.warning(
        "SPECULATION='auto': could not cache the call prices in "
        "%s (%s); the next run prices them again.", file, e)
