"""`python -m specdec_jax.device_check --preflight`: will the tree travel?

Run here, before a device call (no JAX, no device time): the device tool
sends the working tree (tracked files and untracked files git does not
ignore, as `git ls-files -co --exclude-standard` lists them) plus the
carried paths, 64 MiB at most, and refuses a call above that. This sums
what is there now, names the largest folders, and says which of them the
check does not read (`NEEDED` is what it does read).
"""
import collections
import os
import subprocess
from typing import Dict, Iterable, List, Sequence, Tuple

from specdec_jax.config import paths

LIMIT_BYTES = 64 * 2**20
# What the check reads, relative to the repository root.
NEEDED = ("specdec_jax", "scripts/device_check.sh", "gin/ende_", "gin/cnndm_",
          "configs/data/captions_en_de.tsv", "pretrained/multi30k/target_38m",
          "pretrained/multi30k/draft_1m_distill_38m",
          "pretrained/multi30k/multi30k.model", ".whl")


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


def main(carry: Sequence[str], root: str = "") -> int:
  """Prints the verdict; 0 if the tree fits, 1 if not."""
  root = root or str(paths.REPO_DIR)
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
  print(f"over the limit by {(total - LIMIT_BYTES) / 2**20:.1f} MiB: move "
        "folders the check does not read out of the checkout for the call "
        f"(docs/usage/gpu.md), largest first: {', '.join(spare[:6])}")
  return 1
