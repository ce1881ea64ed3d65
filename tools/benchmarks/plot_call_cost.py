r"""The two regimes side by side: a K-token target call's cost in one-token steps.

Reads `python -m tools.benchmarks.decode` JSON files (their
`target_cost_ratio_by_k`: medians of per-round ratios, measured interleaved,
compilation excluded) and writes one figure and a Markdown table:

  python -m tools.benchmarks.plot_call_cost \
      --bench 11M=benchmarks/call_cost_11m_cpu.json \
      --bench 38M=benchmarks/call_cost_38m_cpu.json \
      --out benchmarks/call_cost_cpu

Theorem 3.8 assumes that the (γ+1)-token verification call costs one step:
the dashed line. A target whose decoder weights stream from memory at every
step stays near it for a few tokens; one whose weights sit in the cache pays
about K steps for K tokens, and speculative decoding cannot pay there.
"""
import argparse
import io
import json
import os
import sys
from typing import Dict, List, Tuple

from specdec_jax.files import io_utils


def _parse_bench(text: str) -> Tuple[str, str]:
  label, sep, path = text.partition("=")
  if not sep or not label or not path:
    raise argparse.ArgumentTypeError(
        f"--bench must be LABEL=JSON_PATH, got {text!r}")
  return label, path


def load_curve(path: str) -> Dict[str, object]:
  """{'k': [K...], 'ratio': [cost / step...], 'step_ms', 'decoder_mb'}."""
  bench = json.loads(io_utils.read_text(path))
  if "target_cost_ratio_by_k" not in bench:
    raise ValueError(f"{path}: no target_cost_ratio_by_k (not a "
                     "tools.benchmarks.decode output?)")
  ratios = {int(k): float(v) for k, v in bench["target_cost_ratio_by_k"].items()}
  ks = sorted(ratios)
  return {
      "k": ks,
      "ratio": [ratios[k] for k in ks],
      "step_ms": float(bench["target_ms_per_step"]),
      "decoder_mb": bench["target_decoder_param_bytes_per_token"] / 1e6,
      "load": bench.get("host_load_average_1min")
  }


def markdown(curves: Dict[str, Dict[str, object]]) -> str:
  ks = sorted({k for c in curves.values() for k in c["k"]})
  lines = [
      "| target | decoder weights | one step | " +
      " | ".join(f"K={k}" for k in ks) + " |", "|" + "---|" * (3 + len(ks))
  ]
  for label, c in curves.items():
    by_k = dict(zip(c["k"], c["ratio"]))
    cells = [f"{by_k[k]:.2f}" if k in by_k else "–" for k in ks]
    lines.append(f"| {label} | {c['decoder_mb']:.0f} MB | "
                 f"{c['step_ms']:.2f} ms | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def plot(curves: Dict[str, Dict[str, object]], path: str) -> None:
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(6, 4))
  FigureCanvasAgg(fig)
  ax = fig.add_subplot(1, 1, 1)
  top = 1
  for label, c in curves.items():
    ax.plot(
        c["k"], c["ratio"], marker="o",
        label=f"{label} ({c['decoder_mb']:.0f} MB decoder, "
        f"step {c['step_ms']:.2f} ms)")
    top = max(top, max(c["k"]))
  ax.plot([1, top], [1, 1], "k--", lw=1, label="Theorem 3.8's premise")
  ax.plot([1, top], [1, top], ":", color="gray", lw=1, label="K steps")
  ax.set_xlabel("tokens in one target call (K = γ + 1)")
  ax.set_ylabel("call cost / one-token step")
  ax.set_title("Verification call cost on this CPU")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=120)
  io_utils.atomic_write(path, png.getvalue())


def main(argv: List[str] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--bench", type=_parse_bench, action="append",
                      required=True, help="LABEL=benchmark JSON (repeatable)")
  parser.add_argument("--out", required=True,
                      help="output prefix: writes PREFIX.png and PREFIX.md")
  args = parser.parse_args(argv)
  curves = {}
  for label, path in args.bench:
    if not os.path.isfile(path):
      parser.error(f"--bench {label}={path}: no such file")
    try:
      curves[label] = load_curve(path)
    except ValueError as e:
      parser.error(f"--bench {label}={path}: {e}")
  table = markdown(curves)
  print(table, end="")
  io_utils.atomic_write(args.out + ".md", table)
  plot(curves, args.out + ".png")
  print(f"wrote {args.out}.png and {args.out}.md")
  return 0


if __name__ == "__main__":
  sys.exit(main())
