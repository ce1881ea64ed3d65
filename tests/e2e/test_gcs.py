"""gs:// for real, against a local GCS emulator (`gcp-storage-emulator`).

The emulator runs in this process on 127.0.0.1; TensorStore (checkpoint
arrays and metadata, and every result file: `io_utils`) is pointed at it
with `TENSORSTORE_GCS_HTTP_URL`, and `GOOGLE_AUTH_TOKEN_FOR_TESTING` keeps
it from looking for Google credentials. TensorFlow's gfile (seqio's
SentencePiece reader, TFDS `data_dir`) has no endpoint setting (only
`GCS_*` tuning variables; the host is compiled in), so those gs:// paths
cannot be tested here.
"""
import http
import json
import os
import signal
import socket
import subprocess
import sys
import threading

from conftest import T5X_TINY
from conftest import require_shared
import multihost_worker
import pytest
from run_helpers import gcs_at
from run_helpers import parse_gin_files

from specdec_jax import run as run_lib
from specdec_jax import sweep
from specdec_jax.experiment import predictions
from specdec_jax.experiment import resume
from specdec_jax.experiment import runner
from specdec_jax.experiment.plan import Providers
from specdec_jax.experiment.plan import make_decoders
from specdec_jax.files import io_utils
from specdec_jax.files import output_folder

try:
  from gcp_storage_emulator.handlers import objects as emulator_objects
  from gcp_storage_emulator.server import create_server
except ImportError:  # pragma: no cover
  create_server = None

# End to end: marked slow, like every test in tests/e2e/.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        create_server is None,
        reason="the gs:// tests need the `gcp-storage-emulator` package (a "
        "local GCS emulator; `pip install -e '.[test]'` installs it)"),
    # A cleared gin configuration before and after each test (conftest.py).
    pytest.mark.usefixtures("clean_gin"),
]

BUCKET = "specdec-test"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def emulator():
  """(port, gs://bucket) of an in-memory emulator, TensorStore pointed at
  it for this module's tests."""
  port = _free_port()
  server = create_server("127.0.0.1", port, in_memory=True,
                         default_bucket=BUCKET)
  server.start()
  with pytest.MonkeyPatch.context() as mp:
    # GCS sends an object's generation with its data (x-goog-generation);
    # this emulator does not, and TensorStore's OCDBT reader (T5X's Orbax
    # layout) refuses a read without one.
    download = emulator_objects.download

    def download_with_generation(request, response, storage, *args, **kw):
      download(request, response, storage, *args, **kw)
      try:
        response["x-goog-generation"] = storage.get_file_obj(
            request.params["bucket_name"],
            request.params["object_id"])["generation"]
      except Exception:  # pylint: disable=broad-except  # not found
        pass

    mp.setattr(emulator_objects, "download", download_with_generation)
    gcs_at(mp, port, token="emulator")
    yield port, f"gs://{BUCKET}"
  server.stop()


def test_files_on_gcs(emulator):
  _, root = emulator
  folder = f"{root}/io/a"
  io_utils.probe_writable_dir(folder)
  assert not io_utils.exists(folder)  # the probe object is gone
  io_utils.write_json(f"{folder}/x.json", {"v": float("nan"), "w": [1]})
  io_utils.atomic_write(f"{folder}/sub/y.txt", "hello")
  assert json.loads(io_utils.read_text(f"{folder}/x.json")) == {
      "v": None,
      "w": [1]
  }
  assert io_utils.isfile(f"{folder}/x.json")
  assert not io_utils.isfile(f"{folder}/sub")
  assert io_utils.isdir(f"{folder}/sub") and io_utils.exists(folder)
  assert io_utils.listdir(folder) == ["sub", "x.json"]
  with pytest.raises(FileNotFoundError):
    io_utils.read_bytes(f"{folder}/missing")
  io_utils.remove(f"{folder}/x.json")
  assert io_utils.listdir(folder) == ["sub"]
  with pytest.raises(ValueError, match="cannot write an object there"):
    io_utils.probe_writable_dir("gs://no-such-bucket/out")


def test_run_lock_on_gcs_is_exclusive(emulator, monkeypatch):
  """Issue 26: the lock object is created with a "does not exist"
  precondition, checked by the server; a stale one is taken over."""
  _, root = emulator
  media_upload = emulator_objects._media_upload  # pylint: disable=protected-access

  def upload_if_generation_matches(request, response, storage):
    # GCS's ifGenerationMatch (0: "no such object"), which this emulator
    # ignores; TensorStore sends it for a write with a precondition.
    match = request.query.get("ifGenerationMatch")
    if match:
      try:
        generation = str(
            storage.get_file_obj(request.params["bucket_name"],
                                 request.query["name"][0])["generation"])
      except Exception:  # pylint: disable=broad-except  # not found
        generation = "0"
      if generation != match[0]:
        response.status = http.HTTPStatus.PRECONDITION_FAILED
        return None
    return media_upload(request, response, storage)

  monkeypatch.setattr(emulator_objects, "_media_upload",
                      upload_if_generation_matches)
  folder = f"{root}/locked"
  first = output_folder.acquire(folder, "first")
  with pytest.raises(output_folder.LockedError, match="in use by first"):
    output_folder.acquire(folder, "second")
  # Created only if absent: the server refuses a second create.
  assert io_utils.create_new(f"{folder}/{output_folder.LOCK_FILE}",
                             b"x") is None
  first.release()
  assert not io_utils.isfile(f"{folder}/{output_folder.LOCK_FILE}")
  second = output_folder.acquire(folder, "second")
  record = {
      "program": "gone",
      "pid": 1,
      "host": "elsewhere",
      "started": 0.0,
      "started_utc": "1970",
      "token": "t"
  }
  # (Its conditional delete, ifGenerationMatch on DELETE, is not
  # checked by this emulator: `second` is not released here.)
  del second
  io_utils.write_json(f"{folder}/{output_folder.LOCK_FILE}", record)
  monkeypatch.setenv(output_folder.STALE_ENV, "60")
  output_folder.acquire(folder, "third").release()  # the stale one taken over
  assert not io_utils.isfile(f"{folder}/{output_folder.LOCK_FILE}")


class _CommitOnComplete:
  """A proxy before the emulator that forwards only whole requests, as GCS
  commits an upload only once all of it arrived (the emulator would store
  the part it got). An upload whose request line contains `hold` is read
  for `hold_bytes` and then no further: its writer is stuck mid-upload
  (`held` is set) until it is killed."""

  def __init__(self, upstream_port: int, hold: str, hold_bytes: int):
    self.upstream_port = upstream_port
    self.hold = hold.encode()
    self.hold_bytes = hold_bytes
    self.held = threading.Event()
    self.listener = socket.create_server(("127.0.0.1", 0))
    self.port = self.listener.getsockname()[1]
    threading.Thread(target=self._accept, daemon=True).start()

  def _accept(self):
    while True:
      try:
        client, _ = self.listener.accept()
      except OSError:
        return
      threading.Thread(target=self._serve, args=(client,), daemon=True).start()

  def _serve(self, client):
    # The emulator answers one request per connection (HTTP/1.0) and one
    # connection at a time: connect only to forward a whole request.
    buffer = b""
    while True:
      head_end = buffer.find(b"\r\n\r\n")
      if head_end >= 0:
        length = 0
        for line in buffer[:head_end].lower().split(b"\r\n"):
          if line.startswith(b"content-length:"):
            length = int(line.split(b":")[1])
        if self.hold in buffer[:buffer.find(b"\r\n")] and (
            len(buffer) >= head_end + 4 + self.hold_bytes):
          self.held.set()
          return  # read no more: the writer blocks mid-upload
        if len(buffer) >= head_end + 4 + length:
          upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
          upstream.sendall(buffer)
          self._relay(upstream, client)
          return
      data = client.recv(1 << 16)
      if not data:
        client.close()
        return  # the writer died: its partial request goes nowhere
      buffer += data

  @staticmethod
  def _relay(source, sink):
    try:
      while True:
        data = source.recv(1 << 16)
        if not data:
          break
        sink.sendall(data)
    except OSError:
      pass
    finally:
      source.close()
      sink.close()

  def close(self):
    self.listener.close()


_WRITER = """
import sys
from specdec_jax.files import io_utils
io_utils.write_json(sys.argv[1], {"settings": {}, "padding": "x" * (8 << 20)})
"""


def _sweep_bindings(root):
  config = json.loads((T5X_TINY / "config.json").read_text())
  fields = [
      f"{role}/T5Config.{key} = {value!r}" for role in ("target", "draft")
      for key, value in config.items() if key != "dropout_rate"
  ]
  fields = [f.replace("[", "(").replace("]", ")") for f in fields]
  return fields + [
      f"TARGET_CHECKPOINT_PATH = '{root}/t5x_tiny/legacy/checkpoint_0'",
      f"DRAFT_CHECKPOINT_PATH = '{root}/t5x_tiny/orbax/checkpoint_0'",
      "SOURCE_FILE = 'configs/data/tiny_en_de.tsv'", "GAMMA = 3",
      "TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 8}"
  ]


def test_sweep_on_gcs_reads_t5x_checkpoints_and_resumes(emulator, tmp_path,
                                                        monkeypatch):
  """The T5X fixture in the bucket (legacy layout as target, Orbax layout as
  draft: the same weights, so α = 1); a sweep with results on gs:// is
  killed after its first point, a crash in the middle of uploading the
  second point's metrics.json leaves nothing a resumed sweep takes as
  finished, and the resumed sweep runs just that point."""
  require_shared(T5X_TINY)
  port, root = emulator
  for path in sorted(T5X_TINY.rglob("*")):
    if path.is_file() and path.parent != T5X_TINY:
      rel = path.relative_to(T5X_TINY).as_posix()
      io_utils.atomic_write(f"{root}/t5x_tiny/{rel}", path.read_bytes())
  results = f"{root}/sweep"
  base, bindings = ["local_tiny.gin"], _sweep_bindings(root)
  points = sweep.parse_sweep_args(["NUM_EXAMPLES=1,2"])
  first, second = (f"{results}/{sweep.point_name(p)}" for p in points)
  calls, dying = [], [True]

  def decoders(plan, *args):  # each point builds its decoders once
    if dying[0] and calls:  # killed as the second point starts
      raise KeyboardInterrupt
    calls.append(plan.args.output_dir)
    return make_decoders(plan, *args)

  counting = Providers(vocabulary=multihost_worker.CharVocabulary,
                       decoders=decoders)
  with pytest.raises(KeyboardInterrupt):
    sweep.run_sweep(points, results, base, bindings, providers=counting)
  assert calls == [first] and sweep.is_done(first)
  assert not sweep.is_done(second)
  snapshot = io_utils.read_text(f"{first}/metrics.json")

  # A writer killed in the middle of uploading the second metrics.json.
  proxy = _CommitOnComplete(port, hold="metrics.json", hold_bytes=1 << 16)
  try:
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, f"{second}/metrics.json"],
        env=dict(os.environ,
                 TENSORSTORE_GCS_HTTP_URL=f"http://127.0.0.1:{proxy.port}"))
    try:
      assert proxy.held.wait(timeout=120), "the upload never started"
    finally:
      writer.send_signal(signal.SIGKILL)
      writer.wait(timeout=60)
  finally:
    proxy.close()
  assert not io_utils.exists(f"{second}/metrics.json")
  assert not sweep.is_done(second)

  calls.clear()
  dying[0] = False
  sweep.run_sweep(points, results, base, bindings, providers=counting)
  assert calls == [second]
  assert io_utils.read_text(f"{first}/metrics.json") == snapshot
  for folder, n in ((first, 1), (second, 2)):
    metrics = json.loads(io_utils.read_text(f"{folder}/metrics.json"))
    assert metrics["num_examples"] == n and metrics["random_weights"] is False
    assert metrics["alpha"] == 1.0 and metrics["greedy_outputs_identical"]
    rows = io_utils.read_text(f"{folder}/predictions.jsonl").splitlines()
    assert len(rows) == n
  assert not [
      name for name in io_utils.listdir(results) if name.startswith(".")
  ]
  assert sorted(io_utils.listdir(results)) == sorted(
      [sweep.SWEEP_FILE,
       first.rsplit("/", 1)[1],
       second.rsplit("/", 1)[1]])


def test_infer_on_gcs_resumes_from_its_uploaded_rows(emulator, tmp_path,
                                                     monkeypatch):
  """MODE='infer' with OUTPUT_DIR on gs:// (no append there): a checkpoint
  uploads the rows so far as the `.partial` object; interrupted at its 4th
  batch and run again, the run decodes the rest and writes the rows of a
  local uninterrupted run, leaving no hidden object behind."""
  _, root = emulator
  out, local = f"{root}/infer", tmp_path / "local"
  bindings = ["MODE = 'infer'", "NUM_EXAMPLES = 6", "TEMPERATURE = 1.0"]
  parse_gin_files(["local_tiny.gin"], [f"OUTPUT_DIR = '{local}'", *bindings])
  run_lib.run()

  monkeypatch.setattr(resume, "CHECKPOINT_S", 0.0)
  add, adds = predictions.PredictionsWriter.add, []

  def add_until_the_fourth(self, rows):
    adds.append(len(rows))
    if len(adds) == 4:
      raise KeyboardInterrupt()
    add(self, rows)

  monkeypatch.setattr(predictions.PredictionsWriter, "add",
                      add_until_the_fourth)
  parse_gin_files(["local_tiny.gin"], [f"OUTPUT_DIR = '{out}'", *bindings])
  with pytest.raises(
      KeyboardInterrupt, match=r"kept 3 predictions rows in "
      r"gs://.*/infer/\.predictions\.jsonl\.partial; .* "
      "resumes after them"):
    run_lib.run()
  kept = io_utils.read_text(f"{out}/{predictions.PARTIAL_FILE}")
  assert len(kept.splitlines()) == 3

  monkeypatch.setattr(predictions.PredictionsWriter, "add", add)
  parse_gin_files(["local_tiny.gin"], [f"OUTPUT_DIR = '{out}'", *bindings])
  record = run_lib.run()
  assert record["resumed_after_examples"] == 3
  assert io_utils.read_text(f"{out}/predictions.jsonl") == (
      local / "predictions.jsonl").read_text()
  hidden = {n for n in io_utils.listdir(out) if n.startswith(".")}
  assert hidden == {runner.SETTINGS_FILE}  # no rows or record left
