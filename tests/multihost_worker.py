"""One process of a multi-process test (`tests/e2e/test_multihost.py`).

  python tests/multihost_worker.py run|sweep [the command's flags...]

Runs `specdec_jax.run` or `specdec_jax.sweep` as their command lines do
(T5X's multi-host flags included), with TensorFlow kept out of the process:
its import costs 10-20 s per process on a 2-core machine, and here it would
only build a vocabulary. So the vocabulary is `CharVocabulary` (no seqio)
and `console.setup` skips TensorFlow's quiet import.

Fault injection, by environment variable (tests only):

* SPECDEC_TEST_FAIL=I: process I raises a RuntimeError instead of its
  first call of the baseline decoder, while the others run that call and
  wait in its collectives.
* SPECDEC_TEST_FORGETFUL=1: processes other than 0 see no finished sweep
  points (as a host whose view of RESULTS_DIR differs would): they must
  follow process 0's decision anyway.
* SPECDEC_TEST_STOP_AT=N: every process is interrupted (KeyboardInterrupt,
  as a preempted slice's SIGTERM) when its N-th batch's rows would be
  written, after a checkpoint at every batch before (MODE='infer').
"""
import os
import sys


class CharVocabulary:
  """Printable ASCII, one id per character; T5's pad 0, EOS 1, unk 2."""
  eos_id = 1
  vocab_size = 3 + 95

  def encode(self, text):
    return [3 + ord(c) - 32 if 32 <= ord(c) < 127 else 2 for c in text]

  def decode(self, ids):
    return "".join(chr(i - 3 + 32) for i in ids if 3 <= i < self.vocab_size)


def providers():
  """`run`'s providers here: `CharVocabulary`, and SPECDEC_TEST_FAIL's
  injected failure (that process's baseline decoder raises)."""
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax.experiment import plan  # pylint: disable=g-import-not-at-top
  fail = os.environ.get("SPECDEC_TEST_FAIL")

  def decoders(run_plan, *args):
    baseline, speculative = plan.make_decoders(run_plan, *args)
    if fail is None:
      return baseline, speculative

    def failing(batch, rng):
      if jax.process_index() == int(fail):
        raise RuntimeError(f"injected failure in process {fail}")
      return baseline(batch, rng)

    return failing, speculative

  return plan.Providers(vocabulary=CharVocabulary, decoders=decoders)


def _forgetful(sweep_lib) -> None:
  """SPECDEC_TEST_FORGETFUL: only process 0 sees finished points."""
  import jax  # pylint: disable=g-import-not-at-top
  if os.environ.get("SPECDEC_TEST_FORGETFUL"):
    real_is_done = sweep_lib.is_done
    sweep_lib.is_done = lambda d: (real_is_done(d)
                                   if jax.process_index() == 0 else False)


def _stopping() -> None:
  """SPECDEC_TEST_STOP_AT: interrupted at the N-th batch's rows."""
  stop_at = os.environ.get("SPECDEC_TEST_STOP_AT")
  if not stop_at:
    return
  from specdec_jax.experiment import predictions  # pylint: disable=g-import-not-at-top
  from specdec_jax.experiment import resume  # pylint: disable=g-import-not-at-top
  resume.CHECKPOINT_S = 0.0
  add, calls = predictions.PredictionsWriter.add, []

  def add_until_stopped(self, rows):
    calls.append(len(rows))
    if len(calls) == int(stop_at):
      raise KeyboardInterrupt()
    add(self, rows)

  predictions.PredictionsWriter.add = add_until_stopped


def main() -> int:
  command, argv = sys.argv[1], sys.argv[2:]
  from specdec_jax import run as run_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax import sweep as sweep_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.terminal import console  # pylint: disable=g-import-not-at-top
  console.setup = lambda: None
  _forgetful(sweep_lib)
  _stopping()
  module = {"run": run_lib, "sweep": sweep_lib}[command]
  return module.cli([f"specdec_jax.{command}", *argv], providers())


if __name__ == "__main__":
  sys.exit(main())
