"""Figure 5 of the paper for one decoded example: when the draft and the
target ran. `run` measures steps, not calls (the decode loop is one compiled
program), so the timeline is modeled: each target call of the example
(`accepted_counts` in predictions.jsonl) is drawn after γ draft steps, at the
run's measured `draft_step_s` and `target_step_s` (metrics.json). Older
predictions.jsonl files that carry a `timeline` are drawn as they are.
"""
from typing import Any, Dict, List, Mapping, Optional, Sequence

from specdec_jax.reporting import figures
from specdec_jax.reporting import trace


def modeled_timeline(accepted_counts: Sequence[int], gamma: int,
                     draft_step_s: float,
                     target_step_s: float) -> List[Dict[str, Any]]:
  """A Figure-5-style call timeline from measured step costs.

  The decode loop is one compiled program, so calls are not timed one by
  one: each iteration is drawn as γ draft steps of `draft_step_s` then one
  target call of `target_step_s` (the paper's cost model, Theorem 3.8).
  """
  events, t = [], 0.0
  for _ in accepted_counts:
    for _ in range(gamma):
      events.append({"kind": "draft", "start_s": t, "end_s": t + draft_step_s})
      t += draft_step_s
    events.append({"kind": "target", "start_s": t, "end_s": t + target_step_s})
    t += target_step_s
  return events


def example_timeline(example: Mapping[str, Any],
                     run: Mapping[str, Any]) -> Optional[List[Dict[str, Any]]]:
  """The example's timeline: recorded (older runs) or modeled; None if
  neither is possible."""
  if example.get("timeline"):
    return example["timeline"]
  counts = example.get("accepted_counts")
  if (counts and run.get("draft_step_s") is not None and
      run.get("target_step_s") is not None):
    return modeled_timeline(counts, run["gamma"], run["draft_step_s"],
                            run["target_step_s"])
  return None


def render_timeline(example: Mapping[str, Any], run: Mapping[str, Any]):
  """Figure-5-style timeline: draft and target calls of one example."""
  events = example_timeline(example, run)
  t0 = min(ev["start_s"] for ev in events)
  fig = figures.new_figure(9, 2.4)
  ax = fig.subplots()
  lanes = {
      "draft": (1, trace.ACCEPTED_COLOR, f"M_q ({run['draft_model']})"),
      "target":
          (0, trace.TARGET_COLOR, f"M_p ({run['target_model'] or 'unnamed'})")
  }
  for kind, (y, color, _) in lanes.items():
    bars = [((ev["start_s"] - t0) * 1e3, (ev["end_s"] - ev["start_s"]) * 1e3)
            for ev in events
            if ev["kind"] == kind]
    if bars:
      ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=color,
                     edgecolors="white", linewidth=0.5, alpha=0.85)
  targets = [ev for ev in events if ev["kind"] == "target"]
  counts = example.get("accepted_counts")
  if not (isinstance(counts, list) and len(counts) == len(targets)):
    calls = example.get("trace") or []
    counts = ([s["num_accepted"] for s in calls]
              if len(calls) == len(targets) else None)
  if counts:
    for ev, n in zip(targets, counts):
      mid = ((ev["start_s"] + ev["end_s"]) / 2 - t0) * 1e3
      ax.text(mid, 0, f"+{n + 1}", ha="center", va="center", fontsize=7,
              color="white", weight="bold")
  end = max(ev["end_s"] for ev in events) - t0
  ax.set_yticks([0, 1])
  ax.set_yticklabels([lanes["target"][2], lanes["draft"][2]])
  ax.set_ylim(-0.7, 1.7)
  ax.set_xlim(0, end * 1e3 * 1.01 if end > 0 else 1)
  ax.set_xlabel("time (ms)" if example.get("timeline") else
                "time (ms), modeled: γ draft steps then one target call per "
                "iteration, at the run's measured step times")
  n_tokens = sum(n + 1 for n in counts) if counts else None
  ax.set_title(
      f"Speculative decoding timeline ({run['task']}, γ={run['gamma']}, "
      f"example {example.get('index', '?')}): {len(targets)} target calls" +
      (f", {n_tokens} tokens (labels: tokens per call)" if n_tokens else ""),
      fontsize=9)
  ax.grid(axis="x", alpha=0.3)
  return fig
