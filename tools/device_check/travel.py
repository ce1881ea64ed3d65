"""Will the tree travel? `python -m tools.device_check --preflight`.

Run here, before a device call (no JAX, no device time): the device tool
sends the working tree (tracked files and untracked files git does not
ignore, as `git ls-files -co --exclude-standard` lists them) plus the
carried paths, 64 MiB at most, and refuses a call above that. `main` sums
what is there now, names the largest folders, and says which of them the
check does not read (`NEEDED` is what it does read: every module its
phases import and every file they open; tests/tools/test_device_check.py
checks the modules). `aside` moves what the check does not need (`ASIDE`:
the unread checkpoints, `benchmarks/`, `tests/`; not `docs/`, which a
session reads while the call runs) out of the checkout for
the call, keeping their paths, and `back` returns them: no git command,
nothing committed.
"""
import collections
import os
import shutil
import subprocess
from typing import Dict, Iterable, List, Sequence, Tuple

from specdec_jax.files import io_utils

LIMIT_BYTES = 64 * 2**20
# What the check reads, relative to the repository root.
NEEDED = ("specdec_jax", "tools/__init__.py", "tools/device_check",
          "tools/benchmarks/__init__.py", "tools/benchmarks/common.py",
          "tools/benchmarks/dispatch.py", "tools/benchmarks/iteration_hlo.py",
          "tools/benchmarks/loop_overhead.py", "scripts/device_check.sh",
          "gin/ende_", "gin/cnndm_", "configs/data/captions_en_de.tsv",
          "pretrained/multi30k/target_38m",
          "pretrained/multi30k/draft_1m_distill_38m",
          "pretrained/multi30k/shared_encoder_1m",
          "pretrained/multi30k/multi30k.model", ".whl")
# What a device call leaves behind (`aside`): the largest paths the check
# does not read.
ASIDE = ("pretrained/multi30k/target", "pretrained/multi30k/draft_1m",
         "pretrained/multi30k/draft_4m_distill_38m",
         "pretrained/multi30k/feature_1m",
         "pretrained/multi30k/feature_1m_head2000",
         "pretrained/multi30k/shared_encoder_4m", "benchmarks", "tests")


def travelling_files(root: str) -> List[str]:
  """The files a device call would send (those that exist)."""
  listed = subprocess.run(
      ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root,
      capture_output=True, check=True).stdout.decode().split("\0")
  return [f for f in listed if f and os.path.isfile(os.path.join(root, f))]


def _walk(root: str, path: str) -> Iterable[str]:
  full = os.path.join(root, path)
  if os.path.isfile(full):
    yield path
  for folder, _, files in os.walk(full):
    for name in files:
      yield os.path.relpath(os.path.join(folder, name), root)


def sizes(root: str, files: Iterable[str]) -> Dict[str, int]:
  return {f: os.path.getsize(os.path.join(root, f)) for f in files}


def by_folder(file_sizes: Dict[str, int],
              depth: int = 3) -> List[Tuple[str, int]]:
  """(folder at `depth` levels, bytes), largest first."""
  total: Dict[str, int] = collections.Counter()
  for f, size in file_sizes.items():
    total["/".join(f.split("/")[:depth])] += size
  return sorted(total.items(), key=lambda x: -x[1])


def is_needed(path: str) -> bool:
  return any(path == n or path.startswith(n) for n in NEEDED)


def is_aside(path: str) -> bool:
  """Whether `path` is under one of `ASIDE`."""
  return any(path == a or path.startswith(a + "/") for a in ASIDE)


def main(carry: Sequence[str], root: str = "") -> int:
  """Prints the verdict; 0 if the tree fits, 1 if not."""
  root = root or _repo()
  files = sizes(root, travelling_files(root))
  for c in carry:
    files.update(sizes(root, _walk(root, c)))
  total = sum(files.values())
  needed = sum(s for f, s in files.items() if is_needed(f))
  print(f"travels: {len(files)} files, {total / 2**20:.1f} MiB "
        f"(limit {LIMIT_BYTES / 2**20:.0f} MiB); the check reads "
        f"{needed / 2**20:.1f} MiB of it")
  for folder, size in by_folder(files)[:8]:
    mark = "" if is_needed(folder) else "  (not read by the check)"
    print(f"  {size / 2**20:7.1f} MiB  {folder}{mark}")
  if total <= LIMIT_BYTES:
    print("fits")
    return 0
  spare = [f for f, _ in by_folder(files) if not is_needed(f)]
  print(f"over the limit by {(total - LIMIT_BYTES) / 2**20:.1f} MiB: "
        "`--preflight --aside=DIR` moves what the check does not read out "
        "of the checkout for the call, `--back=DIR` returns it "
        f"(docs/contributing/device_check.md); largest: {', '.join(spare[:6])}")
  return 1


def aside(folder: str, root: str = "", paths: Sequence[str] = ASIDE) -> int:
  """Moves each of `paths` that is here to `folder`, at the same relative
  path, then prints `main`'s verdict (its exit code). Refuses (2), moving
  nothing, when `folder` already holds one of them (an earlier call's, not
  yet returned)."""
  root = root or _repo()
  here = [p for p in paths if os.path.exists(os.path.join(root, p))]
  held = [p for p in paths if os.path.exists(os.path.join(folder, p))]
  if held:
    print(f"aside: {folder} already holds {', '.join(held)}: return them "
          f"first (--back={folder})")
    return 2
  for p in here:
    os.makedirs(os.path.dirname(os.path.join(folder, p)), exist_ok=True)
    shutil.move(os.path.join(root, p), os.path.join(folder, p))
  print(f"aside: moved {len(here)} paths to {folder}")
  return main([], root)


def back(folder: str, root: str = "", paths: Sequence[str] = ASIDE) -> int:
  """Moves each of `paths` in `folder` back into the checkout; refuses (2),
  moving nothing, when the checkout already has one of them."""
  root = root or _repo()
  moved = [p for p in paths if os.path.exists(os.path.join(folder, p))]
  clash = [p for p in moved if os.path.exists(os.path.join(root, p))]
  if clash:
    print(f"back: the checkout already has {', '.join(clash)}; nothing moved")
    return 2
  for p in moved:
    os.makedirs(os.path.dirname(os.path.join(root, p)), exist_ok=True)
    shutil.move(os.path.join(folder, p), os.path.join(root, p))
    _prune(folder, os.path.dirname(p))
  print(f"back: returned {len(moved)} paths from {folder}")
  return 0


def _prune(folder: str, relative: str) -> None:
  """Removes the folders `aside` made for `relative` under `folder` while
  empty, and `folder` itself when nothing is left in it."""
  while True:
    path = os.path.join(folder, relative)
    if os.path.isdir(path) and not os.listdir(path):
      os.rmdir(path)
    if not relative:
      return
    relative = os.path.dirname(relative)


def _repo() -> str:
  return str(io_utils.REPO_DIR)
