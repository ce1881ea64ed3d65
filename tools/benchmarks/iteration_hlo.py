r"""What XLA runs per iteration: the decode loops' compiled ops, part by part.

Compiles the baseline and speculative loops of the shipped pair (the
README's main job: 38M target, distilled 1M draft, γ 3, T 0) on this host's
CPU, twice: with XLA's default options and with the project's CPU options
(`kernels.CPU_BASELINE_COMPILER_OPTIONS`, `CPU_SPECULATIVE_COMPILER_OPTIONS`),
and counts, in each while loop's body of the optimized HLO, the ops by kind
and by the part of the iteration they come from (the source op names JAX
records: the model calls, the draft's propose, acceptance, the emit, the
statistics), and the copies with their bytes. No timing: the op counts are
the compiler's, the same on any host with this jaxlib.

  python -m tools.benchmarks.iteration_hlo \
      --output=/tmp/specdec_jax/iteration_hlo.json

`loop_bodies` reads the optimized HLO text of a compiled program
(`compiled.as_text()`) and counts, per while-loop body, its ops by kind and
by the part of the iteration they come from (the named scopes of
`decoding.loops`), and its copies with their bytes
(`tests/core/test_in_place_caches.py` uses it too).
"""
import argparse
import collections
import dataclasses
import json
import re
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from specdec_jax.core import decoding
from specdec_jax.core import kernels
from specdec_jax.core import sampling
from specdec_jax.core.decoding import loops
from specdec_jax.experiment import hlo_reads
from tools.benchmarks import common

# Source-op-name fragments -> the part of an iteration (first match wins).
# The loops' named scopes (`decoding.loops`); the rest: the copies, the
# loop's own bookkeeping (state updates, rng, the rollback), and ops XLA
# made without a source name (most are the model call's).
PARTS = (("/propose/", "draft propose"), ("/verify/", "target call"),
         ("/acceptance/", "acceptance"), ("/emit/", "emit"),
         ("/statistics/", "statistics"), ("/start/", "start"))
_SKIP = ("parameter", "get-tuple-element", "tuple", "constant", "bitcast")


def _computations(hlo: str) -> Dict[str, List[str]]:
  comps, name = {}, None
  for line in hlo.splitlines():
    header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if header:
      name = header.group(1)
      comps[name] = []
    elif name and line.startswith("  "):
      comps[name].append(line.strip())
  return comps


def _source(line: str, comps: Dict[str, List[str]]) -> str:
  """The JAX op name an HLO op came from (a fusion without one: the first
  one among its fused ops)."""
  source = re.search(r'op_name="([^"]*)"', line)
  if source:
    return source.group(1)
  called = re.search(r"calls=%?([\w.\-]+)", line)
  for inner in comps.get(called.group(1), []) if called else []:
    source = re.search(r'op_name="([^"]*)"', inner)
    if source:
      return source.group(1)
  return line.split("=", 1)[0].strip()


def _part(line: str, comps: Dict[str, List[str]]) -> str:
  if re.search(r"= (?:\([^)]*\)|\S+) copy(?:-start)?\(", line):
    return "copies"
  text = _source(line, comps)
  if text.startswith("%"):  # no source op name: an op XLA made
    return "unnamed (XLA-made: dots, reductions, layouts)"
  return next((part for key, part in PARTS if key in text + "/"),
              "loop bookkeeping")


def _nested_loops(comps: Dict[str, List[str]], entry: str) -> List[str]:
  """While bodies, outermost first (depth-first from the entry)."""
  order = []
  for line in comps[entry]:
    body = re.search(r"\swhile\(.*?body=%?([\w.\-]+)", " " + line)
    if body:
      order.append(body.group(1))
      order.extend(_nested_loops(comps, body.group(1)))
  return order


def loop_bodies(hlo: str) -> Dict[str, Dict[str, Any]]:
  """Per while body (outermost first, then the loops inside it, e.g. the
  draft's steps): ops by kind, by part, and copies."""
  comps = _computations(hlo)
  entry = re.search(r"^ENTRY %?([\w.\-]+)", hlo, re.M).group(1)
  out = {}
  for body in _nested_loops(comps, entry):
    kinds, parts = collections.Counter(), collections.Counter()
    copy_bytes, copy_shapes = 0, collections.Counter()
    for line in comps[body]:
      m = re.match(r"(?:ROOT )?%?[\w.\-]+ = (.*?) ([\w\-]+)\(", line)
      if not m or m.group(2) in _SKIP:
        continue
      kinds[m.group(2)] += 1
      parts[_part(line, comps)] += 1
      if m.group(2) == "copy":
        copy_bytes += hlo_reads.array_bytes(m.group(1))
        copy_shapes[re.sub(r"\{.*", "", m.group(1))] += 1
    out[f"loop_{len(out)}"] = {
        "ops": sum(kinds.values()),
        "by_kind": dict(kinds.most_common()),
        "by_part": dict(parts.most_common()),
        "copies": kinds["copy"],
        "copy_bytes": copy_bytes,
        "copy_shapes": dict(copy_shapes),
    }
  return out


# Ops that launch no kernel of their own (`iteration_kernels`; the device
# check's `paths.launch_ops` too): the rest are kernels (fusions, custom
# calls: cuBLAS, Triton; on the CPU, its loops) or copies.
NOT_LAUNCHES = frozenset(
    ("parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while",
     "conditional", "call", "opt-barrier", "after-all", "add-dependency",
     "domain"))
# Parts that are the models' own calls (the rest: the loop's work).
MODEL_PARTS = ("draft propose", "target call",
               "unnamed (XLA-made: dots, reductions, layouts)")


@dataclasses.dataclass
class _Launches:
  """What a computation launches per run: kernels by part, the while loops
  inside it (`_loop` each), its conditionals' branches (kernels each) and
  each kernel as (part, `_described`)."""
  parts: collections.Counter = dataclasses.field(
      default_factory=collections.Counter)
  loops: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
  conditionals: List[List[int]] = dataclasses.field(default_factory=list)
  kernels: List[Tuple[str, str]] = dataclasses.field(default_factory=list)


def _launches(comps: Dict[str, List[str]], name: str, out: _Launches) -> None:
  """Counts computation `name` into `out`: its ops less `NOT_LAUNCHES` and
  the `-done` half of async pairs, the ops of a `call` (XLA:GPU's command
  buffers) in its place; a while loop goes to `out.loops`, not counted; a
  conditional runs one branch: its largest is counted (on a GPU the host
  reads the branch index back first) and every branch's kernels go to
  `out.conditionals`."""
  for line in comps.get(name, []):
    m = re.match(r"(?:ROOT )?%?[\w.\-]+ = (.*?) ([a-z][\w\-]*)\(", line)
    if not m:
      continue
    kind = m.group(2)
    called = re.search(r"(?:to_apply|calls)=%?([\w.\-]+)", line)
    if kind == "call" and called:
      _launches(comps, called.group(1), out)
    elif kind == "while":
      out.loops.append(_loop(comps, line))
    elif kind == "conditional":
      branches = []
      for branch in _branches(line):
        branches.append(_Launches())
        _launches(comps, branch, branches[-1])
      largest = max(branches, key=lambda b: sum(b.parts.values()))
      out.parts.update(largest.parts)
      out.loops.extend(largest.loops)
      out.conditionals.extend(largest.conditionals)
      out.conditionals.append([sum(b.parts.values()) for b in branches])
      out.kernels.extend(largest.kernels)
    elif kind not in NOT_LAUNCHES and not kind.endswith("-done"):
      part = _part(line, comps)
      out.parts[part] += 1
      out.kernels.append((part, _described(line, comps, part, m.group(1))))


def _described(line: str, comps: Dict[str, List[str]], part: str,
               result_type: str) -> str:
  """'part: source -> type' of one kernel, the source its JAX op name
  after the loop's scope (what a reader looks up in `decoding.loops`) and
  the type its `result_type` without layouts, e.g. 'emit:
  emit/jit(_where)/select_n -> s32[1,53]'."""
  source = _source(line, comps).rsplit("/while/body/", 1)[-1]
  kind = re.sub(r"\{[^}]*\}", "", result_type)
  return f"{part}: {source.rsplit('/while/cond/', 1)[-1]} -> {kind}"


def _branches(line: str) -> List[str]:
  """A conditional's branch computations, in order."""
  listed = re.search(r"branch_computations=\{([^}]*)\}", line)
  if listed:
    return [b.strip().lstrip("%") for b in listed.group(1).split(",")]
  return [
      re.search(rf"{key}_computation=%?([\w.\-]+)", line).group(1)
      for key in ("true", "false")
  ]


def _iteration(comps: Dict[str, List[str]],
               line: str) -> Tuple[_Launches, _Launches]:
  """What one iteration of the while loop `line` launches: (its body's,
  its condition's)."""
  body, condition = _Launches(), _Launches()
  _launches(comps, re.search(r"body=%?([\w.\-]+)", line).group(1), body)
  _launches(comps,
            re.search(r"condition=%?([\w.\-]+)", line).group(1), condition)
  return body, condition


def _loop(comps: Dict[str, List[str]], line: str) -> Dict[str, Any]:
  """The kernels one iteration of the while loop `line` launches."""
  return _counted(*_iteration(comps, line))


def _counted(body: _Launches, condition: _Launches) -> Dict[str, Any]:
  """An iteration's kernels by part and its nested loops (`_loop`)."""
  return {
      "body": sum(body.parts.values()),
      "body_by_part": dict(body.parts.most_common()),
      "condition": sum(condition.parts.values()),
      "nested": body.loops,
      "conditionals": body.conditionals,
  }


def _outermost_while(comps: Dict[str, List[str]], name: str) -> Optional[str]:
  """The first while op of computation `name`, else the first of the
  computations it `call`s (XLA:CPU from JAX 0.12 wraps the loop in one),
  or None."""
  lines = comps.get(name, [])
  for line in lines:
    if re.search(r"\swhile\(", " " + line):
      return line
  for line in lines:
    called = re.search(r"\scall\(.*?to_apply=%?([\w.\-]+)", " " + line)
    found = _outermost_while(comps, called.group(1)) if called else None
    if found:
      return found
  return None


def iteration_kernels(hlo: str) -> Dict[str, Any]:
  """The kernels one iteration of the program's outermost while loop
  launches (optimized HLO of any backend: the CPU's ops, the GPU's
  fusions and custom calls): `body` by part, `condition` (the loop's
  test, on a GPU read back by the host every iteration), `nested` (each
  loop inside the body, e.g. the draft's steps, per iteration of its own,
  and `nested_loops` their number), `conditionals` (each conditional's
  branches' kernels; the largest is in `body`), `outside_model_calls`:
  the body's and condition's kernels of no model call (`MODEL_PARTS`),
  each in `outside_model_call_kernels` ('part: source op -> type'), and
  `outside_loop` (and by part): the kernels a decode launches once,
  around its loop (its `start`: the models' encoders and caches; the
  rest: the outputs), a fixed cost per call."""
  comps = _computations(hlo)
  entry = re.search(r"^ENTRY %?([\w.\-]+)", hlo, re.M).group(1)
  line = _outermost_while(comps, entry)
  if line is None:
    raise ValueError("the program has no while loop.")
  body, condition = _iteration(comps, line)
  loop = _counted(body, condition)
  # The loop's test is no model call, whatever its source op's name.
  glue = [d for part, d in body.kernels if part not in MODEL_PARTS
         ] + [d for _, d in condition.kernels]
  once = _Launches()
  _launches(comps, entry, once)
  return {
      **loop,
      "nested_loops": len(loop["nested"]),
      "outside_model_calls": len(glue),
      "outside_model_call_kernels": glue,
      "outside_loop": sum(once.parts.values()),
      "outside_loop_by_part": dict(once.parts.most_common()),
  }


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--gamma", type=int, default=3,
                 help="draft guesses per iteration γ")
  p.add_argument("--max_decode_length", type=int, default=48,
                 help="decode length")
  p.add_argument("--output", default=None, help="write the counts as JSON")
  args = p.parse_args(argv)
  for name in ("gamma", "max_decode_length"):
    if getattr(args, name) < 1:
      p.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
  return args


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Compiles both loops twice; prints and writes the counts."""
  args = parse_args(argv)
  target = common.load_for_decoding(str(common.PRETRAINED / "target_38m"),
                                    "models/multi30k_target_38m.gin")
  draft = decoding.ModelDrafter(
      common.load_for_decoding(str(common.PRETRAINED / "draft_1m_distill_38m"),
                               "models/multi30k_draft_1m.gin"))
  inputs = np.ones((1, 64), np.int32)
  rng, eos, greedy = jax.random.PRNGKey(0), np.int32(1), sampling.Greedy()
  length = args.max_decode_length
  programs = {
      "baseline": (loops.temperature_loop, (target, inputs, rng, eos),
                   dict(max_decode_length=length,
                        method=greedy), kernels.CPU_BASELINE_COMPILER_OPTIONS),
      "speculative": (loops.speculative_loop, (target, draft, inputs, rng, eos),
                      dict(gamma=args.gamma, max_decode_length=length,
                           method=greedy, statistics=True,
                           acceptance=decoding.ExactAcceptance()),
                      kernels.CPU_SPECULATIVE_COMPILER_OPTIONS),
  }
  result = {"jax": jax.__version__, "gamma": args.gamma}
  for name, (fn, args, kwargs, options) in programs.items():
    static = [k for k in kwargs if k != "acceptance"]
    lowered = jax.jit(fn, static_argnames=static).lower(*args, **kwargs)
    for label, opts in (("xla_defaults", {}), ("project_options", options)):
      bodies = loop_bodies(lowered.compile(compiler_options=opts).as_text())
      result[f"{name}/{label}"] = {"compiler_options": opts, **bodies}
      outer = bodies["loop_0"]
      print(f"{name}, {label}: {outer['ops']} ops per iteration "
            f"({outer['copies']} copies, {outer['copy_bytes'] / 1e6:.2f} MB); "
            f"by part {outer['by_part']}")
  common.write_result(args.output, result)
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
