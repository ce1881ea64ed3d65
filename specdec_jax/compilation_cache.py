"""JAX's persistent compilation cache, on by default for the commands.

A run compiles its decoders (several seconds each) and the step programs
that price c; the same programs come back in the next run of the same gin
file, a sweep's next point, or a re-run after a crash. With the cache the
second run reads them from disk instead of compiling (the main job: ~10 s
of its start). The folder is ~/.cache/specdec_jax/jax-compilation-cache
(SPECDEC_JAX_CACHE moves the parent); SPECDEC_JAX_COMPILATION_CACHE=0 turns
it off; an explicit JAX_COMPILATION_CACHE_DIR (the test suite's) wins.
"""
import os

ENV_OFF = "SPECDEC_JAX_COMPILATION_CACHE"


def cache_dir() -> str:
  """The folder the commands cache compiled programs in."""
  parent = os.environ.get("SPECDEC_JAX_CACHE", "~/.cache/specdec_jax")
  return os.path.join(os.path.expanduser(parent), "jax-compilation-cache")


def enable() -> str:
  """Turns the cache on for this process (before the first compile);
  returns its folder, or '' when turned off."""
  import jax  # pylint: disable=g-import-not-at-top
  if os.environ.get(ENV_OFF, "1") == "0":
    return ""
  folder = os.environ.get("JAX_COMPILATION_CACHE_DIR") or cache_dir()
  jax.config.update("jax_compilation_cache_dir", folder)
  # Every program: the step programs compile in well under a second each,
  # but a run compiles several per input width.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return folder
