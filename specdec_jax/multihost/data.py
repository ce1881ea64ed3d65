"""Which examples and batch rows a process holds, and gathering outputs.

Batch b holds examples b*B .. b*B+B-1; the 'data' axis splits its rows into
`num_shards` blocks; the processes holding block g read examples g, g +
num_shards, ... (seqio's `ShardInfo`) and feed them as consecutive rows.
"""
import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import logging
import jax
import numpy as np

from specdec_jax.multihost.coordination import CoordinationError
from specdec_jax.multihost.coordination import allgather
from specdec_jax.multihost.coordination import is_multiprocess


@dataclasses.dataclass(frozen=True)
class ShardInfo:
  """seqio.ShardInfo's fields (seqio is not imported for local files)."""
  index: int
  num_shards: int


@dataclasses.dataclass(frozen=True)
class DataLayout:
  """How one process's slice of the examples fills the rows of each batch:
  it holds block `shard_index` of `num_shards` (1: replicated) of each
  batch of `batch_size` rows (all processes together)."""
  shard_index: int
  num_shards: int
  batch_size: int

  @property
  def rows_per_shard(self) -> int:
    return self.batch_size // self.num_shards

  @property
  def shard_info(self) -> ShardInfo:
    return ShardInfo(self.shard_index, self.num_shards)

  def shard_size(self, shard: int, num_examples: int) -> int:
    """Examples of `shard` among the first `num_examples`."""
    return len(range(shard, num_examples, self.num_shards))

  def num_batches(self, num_examples: int) -> int:
    return -(-num_examples // self.batch_size)

  def fed_examples(self, batch: int,
                   num_examples: int) -> Tuple[np.ndarray, np.ndarray]:
    """(example fed to each row [B] (-1: none, an EOS-only row), real [B]):
    row g*k + j of batch b gets example (b*k + j)*n + g (k rows per shard,
    n shards), else the block's last real row, else the shard's last."""
    k, n = self.rows_per_shard, self.num_shards
    fed = np.full((self.batch_size,), -1, np.int64)
    real = np.zeros((self.batch_size,), bool)
    for g in range(n):
      size = self.shard_size(g, num_examples)
      for j in range(k):
        local = batch * k + j
        if local < size:
          fed[g * k + j], real[g * k + j] = local * n + g, True
        elif size:
          fed[g * k + j] = (min(local, size) - 1) * n + g
    return fed, real

  def kept_rows(self, batch: int, num_examples: int) -> np.ndarray:
    """Rows of batch `batch` that hold real examples, in example order."""
    fed, real = self.fed_examples(batch, num_examples)
    rows = np.nonzero(real)[0]
    return rows[np.argsort(fed[rows], kind="stable")]


def data_layout(sharding: jax.sharding.Sharding, batch_size: int) -> DataLayout:
  """The `DataLayout` of input batches [batch_size, S] placed with
  `sharding`; ValueError unless this process holds one block of rows that
  evenly divides the batch."""
  rows = set()
  for index in sharding.addressable_devices_indices_map(
      (batch_size, 1)).values():
    rows.update(range(*index[0].indices(batch_size)[:2]))
  lo, hi = min(rows), max(rows) + 1
  block = hi - lo
  if rows != set(range(lo, hi)) or batch_size % block or lo % block:
    raise ValueError(
        f"process {jax.process_index()} holds rows {sorted(rows)} of a batch "
        f"of BATCH_SIZE={batch_size}: not one of equal blocks. Allowed: a "
        "MESH_SHAPE whose 'data' axis splits evenly over the processes, and "
        "a BATCH_SIZE that it divides.")
  layout = DataLayout(shard_index=lo // block, num_shards=batch_size // block,
                      batch_size=batch_size)
  data_axis = dict(getattr(getattr(sharding, "mesh", None), "shape",
                           {})).get("data", 1)
  if data_axis > 1 and layout.num_shards == 1:
    logging.warning(
        "BATCH_SIZE=%d is not a multiple of the mesh's data axis (%d): the "
        "batch is replicated, and every data replica decodes the same rows.",
        batch_size, data_axis)
  return layout


@dataclasses.dataclass
class SharedExamples:
  """Every process's examples [{'input', 'reference'}] in input order, the
  tokens each is fed with [N] (EOS included, after truncation) and before
  truncation [N]."""
  examples: List[Dict[str, str]]
  lengths: np.ndarray
  full_lengths: np.ndarray


def share_examples(layout: DataLayout, local_examples: Sequence[dict],
                   local_inputs: np.ndarray,
                   local_full_lengths: np.ndarray) -> SharedExamples:
  """Exchanges the processes' slices: `local_examples` (shard
  `layout.shard_index`), their token ids [n_local, S] (0-padded) and
  lengths before truncation [n_local]."""
  lengths = np.sum(np.asarray(local_inputs) != 0,
                   axis=1) if len(local_inputs) else np.zeros((0,), np.int64)
  mine = {
      "shard": layout.shard_index,
      "examples": list(local_examples),
      "lengths": [int(x) for x in lengths],
      "full_lengths": [int(x) for x in local_full_lengths]
  }
  shards = {}
  for part in allgather("examples", mine):
    shards.setdefault(part["shard"], part)  # replicas of a shard agree
  if sorted(shards) != list(range(layout.num_shards)):
    raise CoordinationError(
        f"shards {sorted(shards)} were read, expected 0..{layout.num_shards - 1}"
    )
  total = sum(len(s["examples"]) for s in shards.values())
  examples: List[Any] = [None] * total
  lengths_all = np.ones((total,), np.int64)
  full_all = np.ones((total,), np.int64)
  for g, part in shards.items():
    order = range(g, total, layout.num_shards)
    if len(order) != len(part["examples"]):
      raise CoordinationError(
          f"shard {g} read {len(part['examples'])} examples, expected "
          f"{len(order)} of {total}: the processes read different data.")
    for i, e, n, f in zip(order, part["examples"], part["lengths"],
                          part["full_lengths"]):
      examples[i], lengths_all[i], full_all[i] = e, n, f
  return SharedExamples(examples, lengths_all, full_all)


class Feeder:
  """Global input batches from one process's slice of the inputs.

  Batch b's width is its longest fed row rounded up to `bucket` (at most
  S), the same on every process; each process supplies only its block of
  rows.
  """

  def __init__(self, layout: DataLayout, local_inputs: np.ndarray,
               shared: SharedExamples, sharding: jax.sharding.Sharding,
               bucket: int):
    self.layout = layout
    self.local_inputs = np.asarray(local_inputs)
    self.shared = shared
    self.sharding = sharding
    self.num_examples = len(shared.examples)
    self.width = self.local_inputs.shape[1]
    self.bucket = bucket

  @property
  def num_batches(self) -> int:
    return self.layout.num_batches(self.num_examples)

  def batch_width(self, batch: int) -> int:
    fed, _ = self.layout.fed_examples(batch, self.num_examples)
    longest = max(int(self.shared.lengths[i]) if i >= 0 else 1 for i in fed)
    return min(self.width, -(-longest // self.bucket) * self.bucket)

  def common_width(self, batches: int) -> int:
    """The most common width of the first `batches` batches (at least one;
    a tie: the narrower): a pilot pads to it, compiling once and timing
    this run's usual shape."""
    widths = [
        self.batch_width(b)
        for b in range(min(max(int(batches), 1), self.num_batches))
    ]
    return min(set(widths), key=lambda w: (-widths.count(w), w))

  def host_rows(self, batch: int, width: Optional[int] = None) -> np.ndarray:
    """This process's rows of batch `batch` [rows_per_shard, width]
    (0-padded to `width`, at least the batch's own; None: its own)."""
    layout = self.layout
    fed, _ = layout.fed_examples(batch, self.num_examples)
    k = layout.rows_per_shard
    block = fed[layout.shard_index * k:(layout.shard_index + 1) * k]
    rows = np.zeros((k, self.width), np.int32)
    for j, example in enumerate(block):
      if example < 0:
        rows[j, 0] = 1  # EOS only: this shard has no example at all
      else:
        rows[j] = self.local_inputs[example // layout.num_shards]
    own = self.batch_width(batch)
    if width is not None and not own <= width <= self.width:
      raise ValueError(f"width={width} must be in [{own}, {self.width}]: "
                       f"batch {batch}'s own width up to the inputs'.")
    return rows[:, :own if width is None else width]

  def batch(self, batch: int, width: Optional[int] = None) -> jax.Array:
    """Batch `batch` [B, width] on the mesh (`width`: see `host_rows`)."""
    rows = self.host_rows(batch, width)
    if not is_multiprocess():
      return jax.device_put(rows, self.sharding)
    shape = (self.layout.batch_size, rows.shape[1])
    return jax.make_array_from_process_local_data(self.sharding, rows, shape)

  def first_of_each_width(self) -> List[int]:
    """The first batch of every distinct width, by width (for warm-up)."""
    firsts = {}
    for b in range(self.num_batches):
      firsts.setdefault(self.batch_width(b), b)
    return [firsts[w] for w in sorted(firsts)]

  def kept_rows(self, batch: int) -> np.ndarray:
    """Rows of batch `batch` with real examples, in example order: the
    outputs to keep (`to_host(out)[rows]`)."""
    return self.layout.kept_rows(batch, self.num_examples)


def to_host(tree: Any) -> Any:
  """Outputs holding every row, gathered from all processes (with one, the
  tree as it is)."""
  if not is_multiprocess():
    return tree
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return multihost_utils.process_allgather(tree, tiled=True)
