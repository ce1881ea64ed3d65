"""MODE='infer' resumes an interrupted run, as T5X's `infer.py` resumes
from its last checkpointed chunk.

At most every CHECKPOINT_S seconds, and on Ctrl-C or SIGTERM, the rows of
the batches decoded so far are made durable (`PredictionsWriter.durable`)
and then STATE_FILE records how many batches and rows they are, a digest
of the rows and the decoder's counts (`batches.Tally.state`). The same
command, with the same settings on the same examples, then decodes only
the batches after them. Batch b's rng is the run's folded with b, so each
row is the one an uninterrupted run writes, at T > 0 too. MODE='walltime'
starts over: its speedup is timed within one process.
"""
import dataclasses
import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging

from specdec_jax.checkpoints import digests
from specdec_jax.experiment import batches as batches_lib
from specdec_jax.experiment import predictions
from specdec_jax.experiment.plan import comparable
from specdec_jax.files import io_utils

STATE_FILE = ".infer.resume.json"
VERSION = 1
# Seconds between checkpoints: each costs an fsync (gs://: an upload of
# every row so far), so a long run spends a negligible share on them.
CHECKPOINT_S = 60.0


@dataclasses.dataclass(frozen=True)
class Resumed:
  """What an interrupted run left: its first `batches` batches' rows as it
  wrote them (`lines`, each with its newline) and its counts (`tally`, a
  `Tally.state()`); the default: nothing, start over."""
  batches: int = 0
  lines: Tuple[str, ...] = ()
  tally: Optional[Dict[str, Any]] = None

  @property
  def examples(self) -> int:
    return len(self.lines)

  def texts(self) -> List[str]:
    """The kept rows' predictions, in example order."""
    return [json.loads(line)["prediction"] for line in self.lines]

  def new_tally(self) -> batches_lib.Tally:
    """The tally to go on counting in."""
    if self.tally is None:
      return batches_lib.Tally()
    return batches_lib.Tally.from_state(self.tally)

  def to_json(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, value: Dict[str, Any]) -> "Resumed":
    return cls(value["batches"], tuple(value["lines"]), value["tally"])


def identity(settings: Dict[str, Any],
             examples: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
  """What a resuming run must share with the run it resumes: its settings
  (as `comparable` writes them) and a digest of every example's input and
  reference (a file edited under the same name is not resumed)."""
  texts = json.dumps([[e["input"], e.get("reference")] for e in examples],
                     ensure_ascii=False)
  return {
      "settings": comparable(settings),
      "examples": digests.digest(texts.encode("utf-8"))
  }


def load(folder: str, ident: Dict[str, Any]) -> Resumed:
  """The interrupted run's progress in `folder`, or `Resumed()` when there
  is none, it is another run's (settings, examples) or its rows are not
  all there unchanged (each case logged)."""
  path = os.path.join(folder, STATE_FILE)
  if not io_utils.isfile(path):
    return Resumed()
  start_over = "decoding from the first example"
  try:
    state = json.loads(io_utils.read_text(path))
    text = io_utils.read_text(os.path.join(folder, predictions.PARTIAL_FILE),
                              max_bytes=None)
  except (OSError, ValueError) as e:
    logging.warning("%s: cannot resume (%s); %s", path, e, start_over)
    return Resumed()
  if not (isinstance(state, dict) and state.get("version") == VERSION and
          isinstance(state.get("identity"), dict)):
    logging.warning("%s: not a version %d record; %s", path, VERSION,
                    start_over)
    return Resumed()
  recorded = dict(state["identity"],
                  settings=comparable(state["identity"].get("settings")))
  if recorded != ident:
    what = ("settings"
            if recorded.get("settings") != ident["settings"] else "examples")
    logging.info("%s: an interrupted run of other %s; %s", path, what,
                 start_over)
    return Resumed()
  rows = int(state["rows"])
  lines = tuple(text.splitlines(keepends=True)[:rows])
  if (len(lines) < rows or (lines and not lines[-1].endswith("\n")) or
      digests.digest("".join(lines).encode("utf-8")) != state["digest"]):
    logging.warning("%s records %d rows that %s does not hold unchanged; %s",
                    path, rows, predictions.PARTIAL_FILE, start_over)
    return Resumed()
  return Resumed(int(state["batches"]), lines, state["tally"])


class Checkpointer:
  """Saves the run's progress (on the process that writes the rows) at
  most every `period_s` seconds, or at once when forced."""

  def __init__(self, folder: str, ident: Dict[str, Any],
               writer: predictions.PredictionsWriter,
               period_s: Optional[float] = None,
               clock: Callable[[], float] = time.monotonic):
    self.path = os.path.join(folder, STATE_FILE)
    self.ident, self.writer = ident, writer
    self.period_s = CHECKPOINT_S if period_s is None else period_s
    self.clock = clock
    self.last = clock()
    self.saved = 0  # batches the last checkpoint holds

  def after(self, tally: batches_lib.Tally, force: bool = False) -> None:
    """A checkpoint of the batches `tally` counted (their rows all
    written) if one is due; a failure only warns (a kill would then
    resume from the checkpoint before, or start over)."""
    if not self.writer.enabled or tally.examples != self.writer.written:
      return  # not this process's, or interrupted between the two
    if not force and self.clock() - self.last < self.period_s:
      return
    self.last = self.clock()
    if not self.writer.durable():
      return  # the write error is the writer's to report
    state = {
        "version": VERSION,
        "identity": self.ident,
        "batches": tally.batches,
        "rows": self.writer.written,
        "digest": self.writer.digest(),
        "tally": tally.state()
    }
    try:
      io_utils.write_json(self.path, state)
    except OSError as e:
      logging.warning(
          "could not save %s (%s): a rerun would resume from "
          "the checkpoint before", self.path, e)
      return
    self.saved = tally.batches

  def finish(self) -> None:
    """Drops the record once the results are written."""
    if not self.writer.enabled:
      return
    try:
      if io_utils.isfile(self.path):
        io_utils.remove(self.path)
    except OSError as e:
      logging.warning("could not remove %s: %s", self.path, e)
