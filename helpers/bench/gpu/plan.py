"""``python -m helpers.bench gpu --plan``: what a device call carries, prepared here, its size
against the call's limit, and the call to make.

A call sends the working tree (tracked files, and untracked ones git does not ignore) and the
ignored paths it names in ``carry``: here PREPARED, the model's configuration and tokenizer
(helpers.bench.gpu.weights). Its commit travels in COMMIT_ENV (the copy has no .git), so the
tables it brings back name it; a tree whose code differs from its commit is said to be dirty,
and its tables would say so.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers.bench.gpu.weights import PREPARED, prepare
from helpers.study.paths import ROOT
from helpers.study.provenance import COMMIT_ENV, git_commit

LIMIT_BYTES = 64 * 2 ** 20  # what one call may carry (the device tool's README)
TIMEOUT_S = 540  # the call's limit: the check's budget (400 s) and start-up, and room to spare
OUT = "/tmp/gpu-check"  # where the check writes on the card; $OUT gets its log and a .tgz


def _files(*args: str) -> list[Path]:
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", *args],
                            capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def sizes() -> dict[str, int]:
    """Bytes that a call carries: tracked files, untracked ones not ignored, and PREPARED."""
    return {"tracked": sum(p.stat().st_size for p in _files()),
            "untracked": sum(p.stat().st_size for p in _files("--others", "--exclude-standard")),
            "carried": sum(p.stat().st_size for p in PREPARED.rglob("*") if p.is_file())}


def command(commit: str) -> str:
    """The shell command the call runs on the card."""
    return (f"export PYTHONUNBUFFERED=1 {COMMIT_ENV}={commit}; "
            f"timeout {TIMEOUT_S - 90} python3 -m helpers.bench gpu --out {OUT} 2>&1 "
            f"| tee $OUT/gpu-check.log; tar czf $OUT/gpu-check.tgz -C {OUT} .")


def plan() -> str:
    """Prepare what the call carries; say its size and the call, or why not yet."""
    prepare()
    found = sizes()
    total = sum(found.values())
    commit = git_commit(ROOT)
    lines = [f"{name}: {size / 2 ** 20:.1f} MiB" for name, size in found.items()]
    fits = "fits" if total <= LIMIT_BYTES else "TOO LARGE"
    lines.append(f"a call carries {total / 2 ** 20:.1f} MiB of at most "
                 f"{LIMIT_BYTES / 2 ** 20:.0f} MiB: {fits}")
    if commit.endswith("-dirty") or commit == "unknown":
        lines.append(f"commit first: the code differs from its commit ({commit}), and the "
                     f"tables would name no commit that made them")
    call = {"command": command(commit.removesuffix("-dirty")),
            "carry": [str(PREPARED.relative_to(ROOT))], "timeout_s": TIMEOUT_S}
    lines += ["", "the device call (the device tool's `run`):", json.dumps(call, indent=2), "",
              "then, here: python -m helpers.bench gpu --report <files_at>/gpu-check.tgz",
              "(tables into data/results/gpu/, figures into figures/gpu/, the summary printed)"]
    return "\n".join(lines)
