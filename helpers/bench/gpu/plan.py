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

from helpers.bench.gpu.check import BUDGET_SECONDS
from helpers.bench.gpu.weights import PREPARED, prepare
from helpers.study.paths import ROOT
from helpers.study.provenance import COMMIT_ENV, git_commit

LIMIT_BYTES = 64 * 2 ** 20  # what one call may carry (the device tool's README)
DEVICE_SECONDS = 900  # a session's device time, the machine's start included (the tool's README)
START_SECONDS = 120  # a machine's start and the transfers, about (a minute or more: its README)
OVER_BUDGET_S = 60  # the check past its budget at most: imports, pools closing, tables
TAR_S = 30  # the command's own limit to the call's: the tables packed after it
RETRY_BUDGET_S = 200  # a second try's budget, on the warm machine
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


def timeout_s(budget: float = BUDGET_SECONDS) -> int:
    """The call's limit for a check of ``budget`` seconds: its command's, and the packing."""
    return int(budget + OVER_BUDGET_S + TAR_S)


def command(commit: str, budget: float = BUDGET_SECONDS) -> str:
    """The shell command the call runs on the card (the check's ``budget``: a second try's is
    shorter)."""
    given = "" if budget == BUDGET_SECONDS else f" --budget {budget:g}"
    return (f"export PYTHONUNBUFFERED=1 {COMMIT_ENV}={commit}; "
            f"timeout {int(budget + OVER_BUDGET_S)} python3 -m helpers.bench gpu --out {OUT}"
            f"{given} 2>&1 | tee $OUT/gpu-check.log; tar czf $OUT/gpu-check.tgz -C {OUT} .")


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
    carry = [str(PREPARED.relative_to(ROOT))]
    call = {"command": command(commit.removesuffix("-dirty")), "carry": carry,
            "timeout_s": timeout_s()}
    retry = {"command": command(commit.removesuffix("-dirty"), RETRY_BUDGET_S), "carry": carry,
             "timeout_s": timeout_s(RETRY_BUDGET_S)}
    lines += ["", "the device call (the device tool's `run`):", json.dumps(call, indent=2), "",
              f"if it fails (no .tgz back, or its log's last lines say 'failed (their "
              f"errors above)': the call exits 0), a second try on the warm machine (the "
              f"check's budget "
              f"{RETRY_BUDGET_S} s: with a start of about {START_SECONDS} s, both fit the "
              f"session's {DEVICE_SECONDS} s of device time), then give the machine back:",
              json.dumps(retry, indent=2), "",
              "then, here: python -m helpers.bench gpu --report <files_at>/gpu-check.tgz",
              "(tables into data/results/gpu/, figures into figures/gpu/, the summary printed)"]
    return "\n".join(lines)
