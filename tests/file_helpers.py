"""Files a reader must refuse, and a guard that turns a blocked read into
a failure (tests/harness/test_safe_reads.py, tests/core/test_kernels.py).

`special(path, kind)` makes `path` a FIFO (whose reader blocks until
killed), a link to /dev/zero (read until the memory runs out) or a folder;
`KINDS` says how `io_utils.RefusedFile` names each. `no_hang()` fails its
block after a few seconds: the old code's reads fail the test instead of
hanging the suite.
"""
import contextlib
import os
import signal

KINDS = {
    "fifo": "a FIFO",
    "zero": "a link to /dev/zero, a character device",
    "folder": "a folder"
}


def special(path, kind: str) -> str:
  """Makes `path` a FIFO, a link to /dev/zero or a folder (`KINDS`)."""
  if kind == "fifo":
    os.mkfifo(path)
  elif kind == "zero":
    os.symlink("/dev/zero", path)
  else:
    os.mkdir(path)
  return str(path)


@contextlib.contextmanager
def no_hang(seconds: int = 5):
  """Fails the block (TimeoutError) if it takes over `seconds`."""

  def fail(*_):
    raise TimeoutError(f"blocked for {seconds} s")

  previous = signal.signal(signal.SIGALRM, fail)
  signal.alarm(seconds)
  try:
    yield
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
