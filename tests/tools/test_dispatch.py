"""tools.benchmarks.dispatch on tiny random models: both ways of calling a
loop give the same tokens, and what it measures is there (no timing
asserted: the machine may be shared)."""
import numpy as np
import pytest

from tools.benchmarks import dispatch

from conftest import random_model, tiny_config


def test_a_bad_flag_is_one_line_and_exit_2(capsys):
  with pytest.raises(SystemExit) as e:
    dispatch.parse_args(["--rounds=0"])
  assert e.value.code == 2
  assert "--rounds must be >= 1" in capsys.readouterr().err.splitlines()[-1]


def test_both_ways_decode_alike_and_are_measured():
  target = random_model(tiny_config(), seed=0)
  draft = random_model(tiny_config(num_decoder_layers=1), seed=1)
  batches = [np.asarray([[5, 6, 7, 1]], np.int32)]
  fns = dispatch.callers(target, draft, gamma=2)
  rng = np.asarray([0, 0], np.uint32)
  for loop, ways in fns.items():
    tokens = [np.asarray(fn(batches[0], rng).tokens) for fn in ways.values()]
    np.testing.assert_array_equal(tokens[0], tokens[1], err_msg=loop)
  result = dispatch.measure(fns, batches, rounds=2)
  for loop in ("baseline", "speculative"):
    for way in ("pytrees", "bound"):
      r = result[loop][way]
      assert r["samples"] == 2 and 0 < r["handover_s"] <= r["call_s"], r
    assert result[loop]["handover_saved_s"] == pytest.approx(
        result[loop]["pytrees"]["handover_s"] -
        result[loop]["bound"]["handover_s"])
  handover = dispatch.handover(target, draft, batches[0], gamma=2, calls=20)
  assert handover["calls"] == 20
  assert handover["pytrees_us"] > 0 and handover["bound_us"] > 0
