"""Runs on several hosts: JAX's multi-controller runtime, as T5X uses it.

Every process runs the same command: `coordination` (starting the runtime,
exchanging values, ending every process on one's error), `data` (which
examples and batch rows a process holds), `partitioning` (T5X's sharding
rules). What each process reads and writes: docs/usage/tpu.md.
"""
from specdec_jax.multihost.coordination import allgather
from specdec_jax.multihost.coordination import barrier
from specdec_jax.multihost.coordination import is_first
from specdec_jax.multihost.coordination import run_on_first
from specdec_jax.multihost.coordination import slowest
from specdec_jax.multihost.data import DataLayout
from specdec_jax.multihost.data import Feeder
from specdec_jax.multihost.data import ShardInfo
from specdec_jax.multihost.data import data_layout
from specdec_jax.multihost.data import share_examples
from specdec_jax.multihost.data import to_host
from specdec_jax.multihost.coordination import failures_end_every_process
from specdec_jax.multihost.coordination import define_flags
from specdec_jax.multihost.coordination import initialize
from specdec_jax.multihost.coordination import initialize_from_flags

__all__ = [
    "allgather",
    "barrier",
    "is_first",
    "run_on_first",
    "slowest",
    "DataLayout",
    "Feeder",
    "ShardInfo",
    "data_layout",
    "share_examples",
    "to_host",
    "failures_end_every_process",
    "define_flags",
    "initialize",
    "initialize_from_flags",
]
