"""The SPECDEC_* environment variables, each read one way.

A switch (`flag`) is on or off: `1`/`true`/`yes`/`on` or
`0`/`false`/`no`/`off` (any case); unset or empty means its default. A
duration (`seconds`) is a finite number > 0. The cache folder
(`cache_dir`) is SPECDEC_JAX_CACHE, or ~/.cache/specdec_jax when unset or
empty: the kernel, the compilation cache and the 'auto' caches all live
under it. Anything else is refused with `BadEnvironment`, naming the
variable, its value and what is allowed: a typo never silently leaves a
feature on or off.

In the core because the CPU kernel reads its own switches; the harness
reads its variables here too.
"""
import math
import os
from typing import Mapping, Optional, Sequence

CACHE = "SPECDEC_JAX_CACHE"
# The switch of SPECULATION='auto''s price and pilot caches: here, so that
# the compilation cache's start-up check reads it without the experiment.
PRICE_CACHE = "SPECDEC_JAX_PRICE_CACHE"
_DEFAULT_CACHE = os.path.join("~", ".cache", "specdec_jax")
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


class BadEnvironment(ValueError):
  """An environment variable with a value it does not allow."""


def _text(name: str, environ: Optional[Mapping[str, str]]) -> str:
  return (os.environ if environ is None else environ).get(name, "").strip()


def flag(name: str, default: bool,
         environ: Optional[Mapping[str, str]] = None) -> bool:
  """The switch `name`: its default when unset or empty.

  Raises:
    BadEnvironment: a value other than 1/0/true/false/yes/no/on/off.
  """
  text = _text(name, environ)
  if not text:
    return default
  if text.lower() in _ON:
    return True
  if text.lower() in _OFF:
    return False
  raise BadEnvironment(
      f"{name}={text!r}: allowed: 1 or 0 (or true/false, yes/no, on/off); "
      f"unset: {'on' if default else 'off'}.")


def seconds(name: str, default: float,
            environ: Optional[Mapping[str, str]] = None) -> float:
  """The duration `name` in seconds: its default when unset or empty.

  Raises:
    BadEnvironment: not a finite number > 0.
  """
  text = _text(name, environ)
  if not text:
    return default
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not (math.isfinite(value) and value > 0):
    raise BadEnvironment(f"{name}={text!r}: allowed: a finite number of "
                         f"seconds > 0; unset: {default:g}.")
  return value


def choice(name: str, allowed: Sequence[str],
           environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
  """The value of `name` if it is one of `allowed`; None when unset/empty.

  Raises:
    BadEnvironment: any other value.
  """
  text = _text(name, environ)
  if not text:
    return None
  if text not in allowed:
    raise BadEnvironment(f"{name}={text!r}: allowed: {', '.join(allowed)} "
                         "(or unset).")
  return text


def cache_dir(environ: Optional[Mapping[str, str]] = None) -> str:
  """The project's cache folder, absolute (it need not exist yet).

  Raises:
    BadEnvironment: SPECDEC_JAX_CACHE names a file, or lies under one.
  """
  text = _text(CACHE, environ)
  folder = os.path.abspath(os.path.expanduser(text or _DEFAULT_CACHE))
  probe = folder
  while not os.path.exists(probe):
    parent = os.path.dirname(probe)
    if parent == probe:
      return folder
    probe = parent
  if not os.path.isdir(probe):
    where = "is" if probe == folder else f"lies under {probe!r}, which is"
    raise BadEnvironment(
        f"{CACHE}={text or _DEFAULT_CACHE!r} {where} a file, not a folder; "
        "allowed: a folder this user can write (or unset: "
        f"{_DEFAULT_CACHE}).")
  return folder
