"""Figures 1 and 5 of the paper for one decoded example: each target
call's accepted and rejected guesses and the target's token (HTML and a
raster), and when the draft and the target ran, modeled from the example's
`accepted_counts` and the run's step times (the loop is one compiled
program: calls are not timed one by one). Tokens that would not print as
they are show escaped (`piece`), never as look-alikes.
"""
import html
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
import unicodedata

from specdec_jax.reporting import figures
from specdec_jax.reporting import tables

# Figure 1's colours: accepted and rejected guesses, the target's token.
ACCEPTED_COLOR = "#1a7f37"
REJECTED_COLOR = "#cf222e"
TARGET_COLOR = "#0969da"
PREFIX_COLOR = "#222222"

_NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}


def _escape_char(ch: str) -> str:
  code = ord(ch)
  if code < 0x100:
    return f"\\x{code:02x}"
  return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def piece(token: Optional[str]) -> str:
  """Display form of a decoded piece ('▁' a space), escaping what prints as
  nothing or as something else (control, format, unassigned characters,
  spaces but ' ', U+FFFD, a leading combining mark) and backslashes."""
  if token is None:
    return ""
  out = []
  for i, ch in enumerate(token.replace("▁", " ")):
    if ch in _NAMED_ESCAPES:
      out.append(_NAMED_ESCAPES[ch])
    elif ch != " " and (not ch.isprintable() or ch == "\ufffd" or
                        (i == 0 and unicodedata.category(ch).startswith("M"))):
      out.append(_escape_char(ch))
    else:
      out.append(ch)
  return "".join(out)


FONT_FAMILY = "DejaVu Sans Mono"


def font_has_glyph_fn(family: str = FONT_FAMILY):
  """A predicate: does the trace figure's font have a glyph for a char?"""
  from matplotlib import font_manager
  from matplotlib import ft2font
  path = font_manager.findfont(font_manager.FontProperties(family=family),
                               fallback_to_default=True)
  charmap = ft2font.FT2Font(path).get_charmap()
  return lambda ch: ord(ch) in charmap


def escape_missing_glyphs(text: str, has_glyph) -> str:
  """Escapes characters the font would draw as empty boxes."""
  return "".join(
      ch if ch in " …" or has_glyph(ch) else _escape_char(ch) for ch in text)


def trace_lines(
    trace: Sequence[Mapping[str, Any]]
) -> List[Tuple[str, List[str], List[str], str]]:
  """(prefix, accepted, rejected, target) display strings per target call."""
  out = []
  prefix = ""
  for step in trace:
    drafts = [piece(t) for t in step["draft_tokens"]]
    n = step["num_accepted"]
    target = piece(step.get("target_token"))
    out.append((prefix, drafts[:n], drafts[n:], target))
    prefix += "".join(drafts[:n]) + target
  return out


def render_trace_html(example: Mapping[str, Any], run: Mapping[str,
                                                               Any]) -> str:
  """Figure-1-style HTML of one example's speculative decoding trace."""
  esc = html.escape
  lines = []
  for i, (prefix, acc, rej, tgt) in enumerate(trace_lines(example["trace"])):
    parts = [
        f'<span class="n">{i + 1}</span>',
        f'<span class="prefix">{esc(prefix)}</span>'
    ]
    parts += [f'<span class="acc">{esc(t)}</span>' for t in acc]
    parts += [f'<del class="rej">{esc(t)}</del>' for t in rej]
    if tgt:
      parts.append(f'<span class="tgt">{esc(tgt)}</span>')
    lines.append('<div class="line">' + "".join(parts) + "</div>")
  info = (
      f"task {run['task']}, M_p = {run['target_model']}, M_q = "
      f"{run['draft_model']}, γ = {run['gamma']}, T = "
      f"{tables.fmt_temp(run['temperature'])}; run {run['run_name']}, example "
      f"{example.get('index', '?')}")
  tgt_words = ("token the target chose (its argmax, T = 0)"
               if run["temperature"] == 0 else "token sampled from the target")
  fields = []
  for key in ("input", "reference", "baseline", "speculative"):
    if isinstance(example.get(key), str):
      fields.append(f"<dt>{key}</dt><dd>{esc(example[key])}</dd>")
  return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Speculative decoding trace</title>
<style>
body {{ font-family: sans-serif; max-width: 60em; margin: 2em auto; }}
.trace {{ font-family: monospace; font-size: 15px; line-height: 1.6; }}
.line {{ white-space: pre-wrap; border-bottom: 1px solid #eee; }}
.n {{ color: #999; display: inline-block; width: 2.5em; }}
.prefix {{ color: {PREFIX_COLOR}; }}
.acc {{ color: {ACCEPTED_COLOR}; font-weight: bold; }}
.rej {{ color: {REJECTED_COLOR}; text-decoration: line-through; }}
.tgt {{ color: {TARGET_COLOR}; font-weight: bold; }}
dt {{ font-weight: bold; }}
</style></head><body>
<h1>Speculative decoding trace (Figure 1 style)</h1>
<p>{esc(info)}</p>
<p>One line per target-model call: <span class="acc">accepted draft tokens</span>,
<del class="rej">rejected draft tokens</del>, and the
<span class="tgt">{esc(tgt_words)}</span>
(correction after a rejection, or the extra token when all γ were accepted).</p>
<div class="trace">
{chr(10).join(lines)}
</div>
<dl>{"".join(fields)}</dl>
</body></html>
"""


# One piece of text on the figure: (row, column in characters, text, colour,
# struck through).
Segment = Tuple[int, int, str, str, bool]


def _char_width(family: str, fontsize: float) -> float:
  """Points per character of the monospace font, measured at the figure's
  DPI (glyph advances are hinted at the output resolution)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  probe = Figure(dpi=figures.DPI)
  canvas = FigureCanvasAgg(probe)
  t = probe.text(0, 0, "M" * 100, family=family, size=fontsize, weight="bold")
  return t.get_window_extent(
      canvas.get_renderer()).width / 100 * 72 / (figures.DPI)


def _layout(shown, label_chars: int, prefix_chars: int,
            width_chars: int) -> Tuple[List[Segment], int]:
  """(segments of the trace lines `shown` wrapped at width_chars, rows)."""
  segs = []
  row = 0
  for i, (prefix, acc, rej, tgt) in enumerate(shown):
    col = label_chars
    segs.append((row, 0, f"{i + 1:>3}", "#999999", False))
    prefix = _clipped(prefix, prefix_chars)
    pieces = [(prefix, PREFIX_COLOR, False)]
    pieces += [(t, ACCEPTED_COLOR, False) for t in acc]
    pieces += [(t, REJECTED_COLOR, True) for t in rej]
    if tgt:
      pieces.append((tgt, TARGET_COLOR, False))
    for text, color, struck in pieces:
      if not text:
        continue
      if col + len(text) > width_chars and col > label_chars:
        row += 1
        col = label_chars
      segs.append((row, col, text, color, struck))
      col += len(text)
    row += 1
  return segs, row


def _clipped(prefix: str, chars: int) -> str:
  """`prefix` in at most `chars` characters: its end after an ellipsis, cut
  at a word boundary (a cut word reads as another word: '…lauen Hemd')."""
  if len(prefix) <= chars:
    return prefix
  tail = prefix[-(chars - 1):]
  if not prefix[-chars].isspace() and " " in tail.strip():
    tail = tail[tail.index(" ", len(tail) - len(tail.lstrip())):]
  return "…" + tail


def target_words(temperature: float) -> str:
  """Figure 1's name of the target's token at this temperature."""
  return "target's token (argmax)" if temperature == 0 else "target sample"


def _draw_text(ax, x: float, y: float, text: str, color: str, struck: bool,
               char_w: float, family: str, fontsize: float, bold: bool) -> None:
  """One piece of text, `struck` through over its non-space characters."""
  ax.text(x, y, text, family=family, size=fontsize, color=color, va="center",
          ha="left", parse_math=False, weight="bold" if bold else "normal")
  if struck:
    lead = len(text) - len(text.lstrip())
    body = len(text.strip())
    if body:
      ax.plot([x + lead * char_w, x + (lead + body) * char_w], [y, y],
              color=color, lw=1.2)


def render_trace_png(example: Mapping[str, Any], run: Mapping[str, Any],
                     max_lines: int = 16, prefix_chars: int = 40,
                     width_chars: int = 96):
  """Figure-1-style raster of a trace (monospace, wraps long lines)."""
  fontsize, family = 10.0, FONT_FAMILY
  char_w = _char_width(family, fontsize)  # points per character
  line_h = fontsize * 1.55
  label_chars = 5
  lines = trace_lines(example["trace"])
  has_glyph = font_has_glyph_fn(family)

  def esc(text):
    return escape_missing_glyphs(text, has_glyph)

  shown = [(esc(p), list(map(esc, a)), list(map(esc, r)), esc(t))
           for p, a, r, t in lines[:max_lines]]
  segs, rows = _layout(shown, label_chars, prefix_chars, width_chars)
  n_rows = rows + (1 if len(lines) > max_lines else 0)
  header_h = 3 * line_h
  width_pt = (width_chars + 2) * char_w
  height_pt = header_h + n_rows * line_h + line_h
  fig = figures.new_figure(width_pt / 72, height_pt / 72)
  ax = fig.add_axes([0, 0, 1, 1])
  ax.set_xlim(0, width_pt)
  ax.set_ylim(height_pt, 0)
  ax.axis("off")
  x0 = char_w
  draw = dict(char_w=char_w, family=family, fontsize=fontsize)
  title = (f"{run['task']}: M_p={run['target_model']}, M_q="
           f"{run['draft_model']}, γ={run['gamma']}, T="
           f"{tables.fmt_temp(run['temperature'])} (example "
           f"{example.get('index', '?')})")
  _draw_text(ax, x0, line_h, title, "black", False, bold=False, **draw)
  col = 0
  for text, color, struck in (("accepted", ACCEPTED_COLOR,
                               False), ("rejected", REJECTED_COLOR, True),
                              (target_words(run["temperature"]), TARGET_COLOR,
                               False)):
    _draw_text(ax, x0 + col * char_w, 2 * line_h, text, color, struck,
               bold=not struck, **draw)
    col += len(text) + 3
  for row, col, text, color, struck in segs:
    _draw_text(ax, x0 + col * char_w, header_h + (row + 0.5) * line_h, text,
               color, struck, bold=color in (ACCEPTED_COLOR, TARGET_COLOR),
               **draw)
  if len(lines) > max_lines:
    _draw_text(
        ax, x0, header_h + (n_rows - 0.5) * line_h,
        f"… {len(lines) - max_lines} more target calls (see "
        "example_trace.html)", "#999999", False, bold=False, **draw)
  return fig


def modeled_timeline(accepted_counts: Sequence[int], gamma: int,
                     draft_step_s: float,
                     target_step_s: float) -> List[Dict[str, Any]]:
  """Figure 5's events: per target call, γ draft steps of `draft_step_s`
  then the call, `target_step_s` (Theorem 3.8's cost model)."""
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
  """The example's timeline, recorded (older runs) or modeled, or None."""
  if example.get("timeline"):
    return example["timeline"]
  counts = example.get("accepted_counts")
  if (counts and run.get("draft_step_s") is not None and
      run.get("target_step_s") is not None):
    return modeled_timeline(counts, run["gamma"], run["draft_step_s"],
                            run["target_step_s"])
  return None


def call_tokens(example: Mapping[str, Any], calls: int) -> Optional[List[int]]:
  """Tokens each of the example's `calls` target calls added to its output:
  the kept guesses and the target's token, none after the output's end
  (a trace's `target_token` null); None if the row does not say."""
  trace = example.get("trace")
  if isinstance(trace, list) and len(trace) == calls:
    # A null target_token: the output ended inside the kept guesses.
    return [
        s["num_accepted"] +
        ("target_token" not in s or s["target_token"] is not None)
        for s in trace
    ]
  counts = example.get("accepted_counts")
  if isinstance(counts, list) and len(counts) == calls:
    return [n + 1 for n in counts]  # a tree's: its last call may hold fewer
  return None


def render_timeline(example: Mapping[str, Any], run: Mapping[str, Any]):
  """Figure-5-style timeline: draft and target calls of one example."""
  events = example_timeline(example, run)
  t0 = min(ev["start_s"] for ev in events)
  fig = figures.new_figure(9, 2.4)
  ax = fig.subplots()
  lanes = {
      "draft": (1, ACCEPTED_COLOR, f"M_q ({run['draft_model']})"),
      "target": (0, TARGET_COLOR, f"M_p ({run['target_model'] or 'unnamed'})")
  }
  for kind, (y, color, _) in lanes.items():
    bars = [((ev["start_s"] - t0) * 1e3, (ev["end_s"] - ev["start_s"]) * 1e3)
            for ev in events
            if ev["kind"] == kind]
    if bars:
      ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=color,
                     edgecolors="white", linewidth=0.5, alpha=0.85)
  targets = [ev for ev in events if ev["kind"] == "target"]
  emitted = call_tokens(example, len(targets))
  if emitted:
    for ev, n in zip(targets, emitted):
      mid = ((ev["start_s"] + ev["end_s"]) / 2 - t0) * 1e3
      ax.text(mid, 0, f"+{n}", ha="center", va="center", fontsize=7,
              color="white", weight="bold")
  end = max(ev["end_s"] for ev in events) - t0
  ax.set_yticks([0, 1])
  ax.set_yticklabels([lanes["target"][2], lanes["draft"][2]])
  ax.set_ylim(-0.7, 1.7)
  ax.set_xlim(0, end * 1e3 * 1.01 if end > 0 else 1)
  ax.set_xlabel("time (ms)" if example.get("timeline") else
                "time (ms), modeled: γ draft steps then one target call per "
                "iteration, at the run's measured step times")
  n_tokens = sum(emitted) if emitted else None
  ax.set_title(
      f"Speculative decoding timeline ({run['task']}, γ={run['gamma']}, "
      f"example {example.get('index', '?')}): {len(targets)} target calls" +
      (f", {n_tokens} tokens (labels: tokens per call)" if n_tokens else ""),
      fontsize=9)
  ax.grid(axis="x", alpha=0.3)
  return fig
