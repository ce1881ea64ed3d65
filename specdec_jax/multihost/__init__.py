"""Runs on several hosts: JAX's multi-controller runtime, as T5X uses it.

Every process (one per host: a TPU VM of a pod slice, or a GPU/CPU machine)
runs the same command. `initialize` starts JAX's distributed runtime
(`runtime`):

* on a Cloud TPU VM, `jax.distributed.initialize()` with no arguments (the
  TPU metadata names the workers);
* elsewhere with T5X's flags (`t5x/train.py`): `--multiprocess_gpu`,
  `--coordinator_address=HOST:PORT`, `--process_count=N`,
  `--process_index=I` (on CPU, cross-process collectives use gloo);
* otherwise nothing: one process, exactly the single-host program.

The mesh then spans every process's devices (`jax.devices()` is global), and
the processes share the work as follows:

* **Data** (`data`). Batch b holds examples b*B .. b*B+B-1 (B = BATCH_SIZE,
  as on one host). The 'data' axis splits a batch's rows into `num_shards`
  blocks of `rows_per_shard` = B / num_shards rows; the processes whose
  devices hold block g read examples g, g + num_shards, g + 2*num_shards,
  ... (seqio's `ShardInfo(g, num_shards)` semantics: a strided slice), and
  feed them as consecutive rows of their block. Processes that share a
  block (a 'model' axis across hosts) read the same slice. Example texts
  and token counts are exchanged once (`share_examples`), so every process
  knows every example; outputs are gathered after each batch (`to_host`).
* **Outputs.** Process 0 alone writes (`run_on_first`); the others wait for
  it, so every process ends with the write's outcome. Walltimes are the
  slowest process's (`slowest`).
* **Decisions** that read shared state (is OUTPUT_DIR another run's? which
  sweep points are done?) are taken by process 0 and sent to all
  (`run_on_first`), so no process can skip a point another one runs.

`partitioning` lays the parameters and inputs over the ('data', 'model')
mesh with T5X's rules.

Coordination goes through the key-value store of JAX's coordination service
(`coordination`), with a deadline on every wait; a process that fails ends
every process with its error (`failures`).

With one process every function here is the identity or runs its argument:
nothing is exchanged and single-host runs are unchanged.
"""
from specdec_jax.multihost.coordination import DEFAULT_TIMEOUT_S
from specdec_jax.multihost.coordination import CoordinationError
from specdec_jax.multihost.coordination import PeerFailed
from specdec_jax.multihost.coordination import allgather
from specdec_jax.multihost.coordination import barrier
from specdec_jax.multihost.coordination import is_first
from specdec_jax.multihost.coordination import is_multiprocess
from specdec_jax.multihost.coordination import run_on_first
from specdec_jax.multihost.coordination import slowest
from specdec_jax.multihost.data import DataLayout
from specdec_jax.multihost.data import Feeder
from specdec_jax.multihost.data import SharedExamples
from specdec_jax.multihost.data import ShardInfo
from specdec_jax.multihost.data import data_layout
from specdec_jax.multihost.data import share_examples
from specdec_jax.multihost.data import to_host
from specdec_jax.multihost.failures import failures_end_every_process
from specdec_jax.multihost.runtime import define_flags
from specdec_jax.multihost.runtime import initialize
from specdec_jax.multihost.runtime import initialize_from_flags

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "CoordinationError",
    "PeerFailed",
    "allgather",
    "barrier",
    "is_first",
    "is_multiprocess",
    "run_on_first",
    "slowest",
    "DataLayout",
    "Feeder",
    "SharedExamples",
    "ShardInfo",
    "data_layout",
    "share_examples",
    "to_host",
    "failures_end_every_process",
    "define_flags",
    "initialize",
    "initialize_from_flags",
]
