"""predictions.jsonl, written as batches finish (a full disk loses no run):
rows go to a fresh hidden `.partial` file (never through a link), renamed
at the end; a failed write is raised after the summary (`OutputWriteError`).
"""
import contextlib
import errno
import functools
import hashlib
import json
import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from specdec_jax.core import decoding
from specdec_jax.data import vocab as vocab_lib
from specdec_jax.files import io_utils
from specdec_jax.metrics import run_metrics

# The rows of a run still decoding (renamed to predictions.jsonl at the end).
PARTIAL_FILE = "." + run_metrics.PREDICTIONS_FILE + ".partial"


class OutputWriteError(OSError):
  """A result file could not be written; says which and what was kept."""


def _create_fresh(path: str) -> int:
  """A descriptor of `path` created anew, never through a link (OSError:
  it could not be removed or created)."""
  for _ in range(3):
    try:
      return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                     0o666)
    except FileExistsError:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a link itself, not what it points to
  raise FileExistsError(errno.EEXIST, "recreated each time it was removed",
                        path)


class PredictionsWriter:
  """Appends predictions.jsonl rows as they come; `finish` publishes them
  (`partial`: None on gs://, where rows wait in memory; `error`, `failed`:
  the first write error and its file). `kept_lines`: an interrupted run's
  first rows, as it wrote them (`resume`), written first."""

  def __init__(self, folder: str, enabled: bool = True,
               kept_lines: Sequence[str] = ()):
    self.path = os.path.join(folder, run_metrics.PREDICTIONS_FILE)
    self.enabled = enabled
    self.remote_partial = os.path.join(folder, PARTIAL_FILE)
    self.partial = (None if io_utils.is_url(folder) else self.remote_partial)
    self.written = 0
    self.error: Optional[OSError] = None
    self.failed: Optional[str] = None
    self._rows: List[str] = []
    self._file = None
    self._published = False
    self._uploaded = 0  # gs://: the rows `durable` last uploaded
    self._sha256 = hashlib.sha256()  # of the rows counted in `written`
    if enabled and self.partial is not None:
      self._guard(self._open_partial, self.partial)
    if kept_lines:
      self._append("".join(kept_lines), len(kept_lines))

  def _open_partial(self) -> None:
    fd = _create_fresh(self.partial)
    try:
      self._file = open(fd, "w", encoding="utf-8")
    except BaseException:
      os.close(fd)
      raise

  def durable(self) -> bool:
    """Makes the rows written so far survive a kill or a power loss
    (local: fsync; gs://: one upload of them all to `remote_partial`);
    False if a write failed (kept for `finish`)."""
    if not self.enabled or self.error is not None:
      return False
    if self.partial is None:

      def upload():
        io_utils.atomic_write(self.remote_partial, "".join(self._rows))
        self._uploaded = self.written

      return self._guard(upload, self.remote_partial)

    def sync():
      self._file.flush()
      os.fsync(self._file.fileno())

    return self._guard(sync, self.partial)

  def _guard(self, fn, path: str) -> bool:
    """Runs `fn`; an OSError is kept (with its file, else `path`)."""
    if self.error is not None:
      return False
    try:
      fn()
      return True
    except OSError as e:
      self.error = e
      self.failed = os.fspath(e.filename) if e.filename else path
      return False

  def add(self, rows: List[Dict[str, Any]]) -> None:
    """Appends rows (one batch's); a failure is kept for `finish`."""
    if not self.enabled:
      return
    self._append(
        "".join(
            json.dumps(io_utils.json_safe(r), ensure_ascii=False,
                       allow_nan=False) + "\n" for r in rows), len(rows))

  def _append(self, text: str, count: int) -> None:
    """`count` rows as `text`, counted once written."""
    if not self.enabled:
      return
    if self.partial is None:
      self._rows.append(text)
    else:

      def append():
        self._file.write(text)
        self._file.flush()

      if not self._guard(append, self.partial):
        return
    self._sha256.update(text.encode("utf-8"))
    self.written += count

  def digest(self) -> str:
    """The SHA-256 (hex) of the rows counted in `written`."""
    return self._sha256.hexdigest()

  def kept(self) -> str:
    """What is on disk now, in words."""
    if not self.enabled:
      return "no predictions rows here (process 0 writes them)"
    if self.partial is None:  # gs://: what the last `durable` uploaded
      rows, where = self._uploaded, self.remote_partial
    else:
      rows, where = self.written, self.partial
    if not rows:
      return "no predictions rows"
    return f"{rows} predictions rows in {where}"

  def finish(self, total: int) -> None:
    """Publishes predictions.jsonl; OutputWriteError if a write failed."""
    if not self.enabled:
      return
    if self.partial is None:
      if (self._guard(
          lambda: io_utils.atomic_write(self.path, "".join(self._rows)),
          self.path) and self._uploaded):
        with contextlib.suppress(OSError):  # predictions.jsonl holds them
          io_utils.remove(self.remote_partial)
    else:

      def publish():
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.partial, self.path)  # replaces a link, if planted
        self._published = True

      self._guard(publish, self.partial)
    if self.error is not None:
      self.close()
      how = (f"writing {self.failed} failed: "
             if self.failed and self.failed != self.path else "")
      raise OutputWriteError(
          f"cannot write {self.path}: {how}"
          f"{self.error.strerror or self.error}. "
          f"Kept: the summary above, {self.kept()} (of {total}); "
          f"{run_metrics.METRICS_FILE} was not written.")

  def close(self) -> None:
    """Closes the partial file, removed if it holds no row."""
    if self._file is not None and not self._file.closed:
      with contextlib.suppress(OSError):
        self._file.close()
    if (self._file is not None and not self.written and not self._published):
      with contextlib.suppress(OSError):
        os.unlink(self.partial)


def publish(writer: PredictionsWriter, total: int, path: str,
            record: Dict[str, Any]) -> None:
  """predictions.jsonl, then the result file `path` (a sweep's "done")."""
  writer.finish(total)
  write_result(
      path, record, f"the summary above and {run_metrics.PREDICTIONS_FILE} "
      "(complete)")


def write_result(path: str, record: Dict[str, Any], kept: str) -> None:
  """io_utils.write_json; a failure names the file and what was kept."""
  try:
    io_utils.write_json(path, record)
  except OSError as e:
    raise OutputWriteError(
        f"cannot write {path}: {e.strerror or e}. Kept: {kept}.") from None


# -- rows ----------------------------------------------------------------------
def row(index: int, example: Dict[str, Any], prediction: str, target_calls: int,
        baseline: Optional[str] = None,
        trace: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
  """One predictions.jsonl row, T5X's `write_inferences_to_file` schema
  (docs/usage/outputs.md): `inputs`, `prediction` (the speculative text)
  and `aux` (index, the baseline's text, target calls, `trace`)."""
  inputs = {run_metrics.INPUTS_FEATURE: example["input"]}
  if example.get("reference") is not None:
    inputs[run_metrics.TARGETS_FEATURE] = example["reference"]
  aux: Dict[str, Any] = {"index": index}
  if baseline is not None:
    aux["baseline"] = baseline
  aux["target_calls"] = target_calls
  aux.update(trace or {})
  return {"inputs": inputs, "prediction": prediction, "aux": aux}


# -- traces --------------------------------------------------------------------
def traces(vocab, out: decoding.SpeculativeOutput,
           keep: Sequence[int]) -> List[dict]:
  """Accepted counts and a Figure-1-style trace of each target call of the
  rows `keep` (`out` on the host)."""
  rows = []
  calls = np.asarray(out.target_calls)
  drafts = np.asarray(out.trace_draft_tokens)
  accepted = np.asarray(out.trace_num_accepted)
  nexts = np.asarray(out.trace_next_token)
  piece = functools.partial(token_text, vocab)
  for r in keep:
    n = int(calls[r])
    rows.append({
        "accepted_counts": accepted[r, :n].tolist(),
        "trace": [
            {
                "draft_tokens": [
                    piece(t) for t in drafts[r, i] if t != decoding.NO_GUESS
                ],
                "num_accepted": int(accepted[r, i]),
                # None: the output ended inside the accepted guesses.
                "target_token":
                    (None if nexts[r,
                                   i] == decoding.NO_TOKEN else piece(nexts[r,
                                                                            i]))
            } for i in range(n)
        ],
    })
  return rows


def tree_traces(out: decoding.TreeOutput, keep: Sequence[int]) -> List[dict]:
  """The accepted count of each tree call of the rows `keep`; "trace" is
  null (k branches have no one Figure-1 line)."""
  calls = np.asarray(out.target_calls)
  accepted = np.asarray(out.trace_num_accepted)
  return [{
      "accepted_counts": accepted[r, :int(calls[r])].tolist(),
      "trace": None
  } for r in keep]


_SPECIAL_PIECES = {
    vocab_lib.PAD_ID: "<pad>",
    vocab_lib.EOS_ID: "</s>",
    vocab_lib.UNK_ID: "<unk>"
}


def token_text(vocab, token) -> str:
  """One token as text, keeping SentencePiece's word-initial space; one
  that decodes to nothing alone is written as a piece (`</s>`, `<0xC3>`)."""
  token = int(token)
  tokenizer = getattr(vocab, "tokenizer", None)
  if tokenizer is not None and 0 <= token < tokenizer.get_piece_size():
    return tokenizer.id_to_piece(token).replace("\u2581", " ")
  if token in _SPECIAL_PIECES:
    return _SPECIAL_PIECES[token]
  if tokenizer is None and type(vocab).__name__ == "ByteVocabulary":
    byte = token - len(_SPECIAL_PIECES)  # seqio: 3 special ids, then bytes
    if 0 <= byte < 256:
      return chr(byte) if 0x20 <= byte < 0x7f else f"<0x{byte:02X}>"
  text = vocab.decode([token]) if token >= 0 else ""
  return text if text else f"<id {token}>"
