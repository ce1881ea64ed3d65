"""SPECULATION='auto' / 'off' (issue 45) end to end on tiny runs (the
candidates, the prediction, the choice and the price cache as pure
functions: tests/harness/test_auto.py): 'off' runs the baseline only;
'auto' writes its table to metrics.json, says why in its `auto:` line,
stays token for token the target's at T = 0, and reads its prices and
pilots from the cache the second time."""
import json

import pytest

from specdec_jax import run as run_lib
from specdec_jax.core import decoding
from specdec_jax.experiment import arguments
from specdec_jax.experiment import loading
from specdec_jax.experiment import plan
from specdec_jax.experiment import price_cache
from specdec_jax.experiment import summary
from specdec_jax.metrics import step_costs

from run_helpers import parse_local_tiny_out

# A cleared gin configuration before and after each test (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("clean_gin")]


def _no_speculative_decoder(*args, **kwargs):
  raise AssertionError("SPECULATION='off' built a speculative decoder")


def test_off_runs_only_the_baseline(tmp_path, monkeypatch):
  monkeypatch.setattr(decoding, "speculative_decoder", _no_speculative_decoder)
  loaded = []

  def load_model(config, path, seed, mesh, what, decode_path=None):
    loaded.append(what)
    return loading.load_model(config, path, seed, mesh, what, decode_path)

  parse_local_tiny_out(tmp_path, "SPECULATION = 'off'", "NUM_EXAMPLES = 2")
  metrics = run_lib.run(providers=plan.Providers(
      load_model=load_model, pricing=step_costs.Pricing(
          _no_speculative_decoder)))
  assert loaded == ["target"]  # no draft is loaded
  assert metrics["speculation"] == "off" and "auto" not in metrics
  assert metrics["speedup"] == 1.0
  assert metrics["walltime_speculative_s"] == metrics["walltime_baseline_s"]
  assert metrics["target_calls_speculative"] == metrics["target_calls_baseline"]
  assert metrics["alpha"] == 0.0 and metrics["greedy_outputs_identical"]
  assert metrics["settings"]["run"]["speculation"] == "off"
  lines = summary.summary_lines(metrics, arguments.run_arguments())
  assert lines[1].startswith("speculation off: the target alone decoded all 2")
  rows = [
      json.loads(line)
      for line in (tmp_path / "out" /
                   "predictions.jsonl").read_text().splitlines()
  ]
  assert all(r["prediction"] == r["aux"]["baseline"] for r in rows)


def _token_pays(calls, *args, **kwargs):
  """`Pricing.call_seconds` making token verification pay: a target step 1
  ms, a K-token call and a guess 1 µs, a tree call 1 s (trees lose)."""
  del args, kwargs
  seconds = {}
  for name, (_, k) in calls.items():
    tree = str(name).startswith("tree")
    seconds[name] = 1.0 if tree else 1e-3 if k == 1 and name != "draft" else (
        1e-6)
  return seconds


class _BuiltDecoders:
  """`Providers.decoders`: the real ones; records each build's (acceptance,
  γ, tree width)."""

  def __init__(self):
    self.built = []

  def __call__(self, run_plan, *args):
    mode = run_plan.mode
    self.built.append(
        (mode.acceptance, run_plan.args.gamma, getattr(mode, "width", 1)))
    return plan.make_decoders(run_plan, *args)


def test_auto_writes_its_table_says_why_and_stays_exact(tmp_path, monkeypatch):
  """A tiny T = 0 run whose handed-in clock makes token verification pay
  (random weights would choose the target alone): its outputs are the
  target's, token for token; metrics.json holds the table; the pilot's
  decoders decode the run. A second run with the same settings reads the
  prices and the pilots from the cache: it decodes no pilot and builds
  the chosen decoders only."""
  monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.delenv(price_cache.ENV_OFF, raising=False)
  first = None
  for cached in (False, True):
    decoders = _BuiltDecoders()
    providers = plan.Providers(decoders=decoders,
                               pricing=step_costs.Pricing(_token_pays),
                               pilot_sizes=plan.PilotSizes(tree_max_width=2))
    parse_local_tiny_out(tmp_path, "SPECULATION = 'auto'", "NUM_EXAMPLES = 2",
                         "GAMMA = 3")
    metrics = run_lib.run(providers=providers)
    auto = metrics["auto"]
    assert auto["prices"]["cached"] is cached
    assert auto["pilot_cache"]["cached"] is cached
    assert auto["pilot_cache"]["file"].startswith(str(tmp_path / "cache"))
    assert auto["choice"]["label"] == "token γ=3"
    assert auto["decoders_reused"] is True
    assert metrics["acceptance"] == "token" and metrics["gamma"] == 3
    assert metrics["speculation"] == "auto"
    assert metrics["greedy_outputs_identical"] is True
    assert [r["label"] for r in auto["candidates"]
           ] == ["the target alone", "token γ=3", "tree γ=3 k=2"]
    for row in auto["candidates"][1:]:
      assert row["predicted_speedup"] > 0 and row["call_cost"] > 0
      assert 0 <= row["alpha"] <= 1 and row["cost_coefficient_c"] > 0
    assert set(auto["pilots"]) == {"token", "tree"}
    tree = auto["pilots"]["tree"]  # one pilot, a_1 of k = 1 and 2
    assert tree["tree_width"] == 2 and len(tree["first_depth_by_width"]) == 2
    assert tree["first_depth_by_width"][-1] == pytest.approx(
        tree["first_depth"])
    assert tree["first_depth_by_width"][0] <= tree["first_depth"]
    # Both families timed: κ of the chains and of the trees.
    assert auto["calibration"]["pilot"] == "token"
    assert auto["tree_calibration"]["pilot"] == "tree"
    assert auto["tree_calibration"]["tree_width"] == 2
    assert "speedup" in tree and "speedup" in auto["pilots"]["token"]
    assert auto["pilots"]["token"]["examples"] >= 1
    assert auto["choice_s"] >= auto["pilot_s"] >= 0
    if cached:  # nothing piloted: the run's own decoders only
      assert auto["pilot_cache"]["decoded"] == []
      assert auto["pilots"] == first["pilots"]
      assert decoders.built == [("token", 3, 1)]
    else:  # a pilot per mode; the token pilot's decoders decode the run
      assert auto["pilot_cache"]["decoded"] == ["token", "tree"]
      assert decoders.built == [("token", 3, 1), ("tree", 3, 2)]
    lines = summary.summary_lines(metrics, arguments.run_arguments())
    assert [l for l in lines if l.startswith("auto:")] == [
        auto["reason"] +
        ("; call prices and pilots from the cache" if cached else "")
    ]
    assert auto["reason"].startswith("auto: chose token γ=3, predicted ")
    first = first or auto
  written = json.loads((tmp_path / "out" / "metrics.json").read_text())
  assert written["auto"]["choice"] == metrics["auto"]["choice"]


class _PricedCalls:
  """`Pricing.call_seconds` as `_token_pays`, recording the (name, k) of
  the calls of each session it was asked to time."""

  def __init__(self):
    self.sessions = []

  def __call__(self, calls, *args, **kwargs):
    self.sessions.append([(str(name), int(k)) for name, (_, k) in calls.items()
                         ])
    return _token_pays(calls, *args, **kwargs)


def test_another_temperature_prices_only_its_drafter(tmp_path, monkeypatch):
  """The target's call prices are cached per target, not per draft or
  sampling method: a run at another temperature times its drafter and
  one step only, and takes the target's K-token and tree calls from the
  first run's entry."""
  monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.delenv(price_cache.ENV_OFF, raising=False)
  runs = []
  for temperature in ("0.0", "1.0"):
    pricing = _PricedCalls()
    parse_local_tiny_out(tmp_path / temperature, "SPECULATION = 'auto'",
                         "NUM_EXAMPLES = 2", "GAMMA = 3",
                         f"TEMPERATURE = {temperature}")
    metrics = run_lib.run(providers=plan.Providers(
        pricing=step_costs.Pricing(pricing), pilot_sizes=plan.PilotSizes(
            tree_max_width=2)))
    # The choice's two sessions (chains, trees); the summary's come after.
    runs.append((metrics["auto"]["prices"], sum(pricing.sessions[:2], [])))
  (first, first_timed), (second, second_timed) = runs
  assert not first["cached"] and not first["target_cached"]
  assert not second["cached"] and second["target_cached"]
  # The first timed the target's 4-token and 7-node calls; the second
  # timed steps and its drafter's guesses only.
  assert {(4, "4"), (7, "tree_7")} <= {(k, n) for n, k in first_timed}
  assert {k for n, k in second_timed if not n.startswith("draft")} == {1}
  assert {"draft", "draft_2"} <= {n for n, _ in second_timed}
  for key in ("call_cost_by_k", "tree_call_cost_by_nodes", "target_step_s"):
    assert second[key] == first[key]
