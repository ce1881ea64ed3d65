"""DECODE='beam': the beam macros' checks and resolved values.

`check_values` checks BEAM_SIZE, BEAM_ALPHA, BEAM_WIDTH and BEAM_ROWS,
`check_unused` that a sampling run leaves them at their defaults, and
`check_rules` what speculative beam search needs of the sampling macros (it
is the target's own beam search, exactly: no sampling (TEMPERATURE, TOPK,
TOPP), no lenience, one fixed γ), with no model and no I/O;
`decode_modes.BEAM` calls them. `width` / `rows` resolve the None defaults
(u = k; rows = 2u, at most γ·u + k).
"""
from typing import Any

from specdec_jax.experiment import values

DEFAULT_BEAM_SIZE = 4
DEFAULT_BEAM_ALPHA = 0.6  # T5X's `EncoderDecoderModel` default.


def width(args: Any) -> int:
  """u, the draft's beam width (BEAM_WIDTH, None: BEAM_SIZE)."""
  return args.beam_size if args.beam_width is None else args.beam_width


def rows(args: Any) -> int:
  """The candidate rows of a target call (BEAM_ROWS, None: 2u, at most
  γ·u + k, all the draft's beams)."""
  if args.beam_rows is not None:
    return args.beam_rows
  return min(2 * width(args), args.gamma * width(args) + args.beam_size)


def check_values(args: Any) -> None:
  """BEAM_SIZE, BEAM_ALPHA, BEAM_WIDTH and BEAM_ROWS themselves."""
  k, alpha = args.beam_size, args.beam_alpha
  if not values.is_int(k) or k < 1:
    raise ValueError(f"BEAM_SIZE={k!r}: allowed: an integer >= 1 (the beams "
                     "kept).")
  if not (values.is_real(alpha) and alpha >= 0):
    raise ValueError(f"BEAM_ALPHA={alpha!r}: allowed: a finite number >= 0 "
                     "(the brevity penalty's exponent; T5X: 0.6).")
  u = args.beam_width
  if u is not None and (not values.is_int(u) or u < k):
    raise ValueError(f"BEAM_WIDTH={u!r} with BEAM_SIZE={k}: allowed: None "
                     f"(= BEAM_SIZE) or an integer >= BEAM_SIZE = {k} (the "
                     "draft's beam width u >= k).")
  r, gamma = args.beam_rows, args.gamma
  if r is None or not values.is_int(gamma):
    return  # GAMMA itself is checked on its own
  most = gamma * width(args) + k
  if not values.is_int(r) or not k <= r <= most:
    raise ValueError(
        f"BEAM_ROWS={r!r} with BEAM_SIZE={k}, BEAM_WIDTH={width(args)}, "
        f"GAMMA={gamma}: allowed: None (= 2·BEAM_WIDTH) or an integer from "
        f"{k} (one row per beam) to GAMMA·BEAM_WIDTH + BEAM_SIZE = {most} "
        "(one per draft beam and beam).")


def check_unused(args: Any) -> None:
  """DECODE='sample': the beam macros at their defaults (a sweep over
  BEAM_SIZE that forgot DECODE='beam' would otherwise measure nothing)."""
  changed = [(name, value)
             for name, value, default in (("BEAM_SIZE", args.beam_size,
                                           DEFAULT_BEAM_SIZE),
                                          ("BEAM_ALPHA", args.beam_alpha,
                                           DEFAULT_BEAM_ALPHA),
                                          ("BEAM_WIDTH", args.beam_width, None),
                                          ("BEAM_ROWS", args.beam_rows, None))
             if value != default]
  if changed:
    name, value = changed[0]
    raise ValueError(
        f"{name}={value!r} with DECODE={args.decode!r}: only beam search "
        f"reads it; allowed: DECODE='beam', or {name} left at its default.")


def check_rules(args: Any) -> None:
  """What DECODE='beam' needs of the sampling macros (`decode_modes.BEAM`
  adds ACCEPTANCE and DRAFTER)."""

  def refuse(setting: str, why: str, allowed: str) -> ValueError:
    return ValueError(f"DECODE='beam' with {setting}: {why}; allowed: "
                      f"{allowed}.")

  if args.temperature != 0:
    raise refuse(f"TEMPERATURE={args.temperature!r}",
                 "beam search draws nothing", "TEMPERATURE=0")
  if args.top_k != 0 or args.top_p != 1:  # metrics.json recorded them
    raise refuse(
        f"TOPK={args.top_k!r}" if args.top_k != 0 else f"TOPP={args.top_p!r}",
        "beam search draws nothing, so TOPK and TOPP would change nothing",
        "TOPK=0 and TOPP=1 (off)")
  if args.gamma == "auto":
    raise refuse("GAMMA='auto'",
                 "Theorem 3.8's choice of γ is for sampling one sequence",
                 "an integer GAMMA >= 1")
  if args.lenience != 1:
    raise refuse(
        f"LENIENCE={args.lenience!r}",
        "speculative beam search is the target's beam search "
        "exactly", "LENIENCE=1")
  if args.tree_width != 1:
    raise refuse(f"TREE_WIDTH={args.tree_width!r}",
                 "the draft's beams are its branches (BEAM_WIDTH)",
                 "TREE_WIDTH=1")
  if args.adaptive_threshold is not None:
    raise refuse(f"ADAPTIVE_THRESHOLD={args.adaptive_threshold!r}",
                 "the draft's beam search runs γ steps every call",
                 "ADAPTIVE_THRESHOLD=None")
  if args.mode == "alpha":
    raise refuse(f"MODE={args.mode!r}", "MODE='alpha' estimates α of sampling",
                 "MODE='walltime'")
