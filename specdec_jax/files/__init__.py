"""Files the project writes: crash-safe writes and the compilation cache.

* `io_utils`: a reader sees the old file or the new one, never half.
* `compilation_cache`: JAX's persistent compilation cache for the commands.
"""
