"""Where a result came from: the machine, the commit and (helpers.engine.contract.versions) the
package versions, recorded beside every result table."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo where there is one, else platform's guess."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(gpus: bool = False) -> dict[str, Any]:
    """CPU, cores and memory; the GPUs (name, memory, driver) where torch sees them.

    torch is consulted if it is already imported, or if ``gpus`` asks for it (importing it costs
    seconds, so the pipeline's own provenance does not).
    """
    import psutil

    from helpers.engine.contract.devices import available_cores

    info: dict[str, Any] = {"cpu": cpu_model(), "cores": available_cores(),
                            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
                            "platform": platform.platform(), "gpus": []}
    if gpus and "torch" not in sys.modules:
        try:
            import torch  # noqa: F401
        except ImportError:
            return info
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        info["gpus"] = [{"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1)}
                        for p in map(torch.cuda.get_device_properties,
                                     range(torch.cuda.device_count()))]
        info["cuda"] = torch.version.cuda
        info["driver"] = _nvidia_driver()
    return info


def describe_machine(info: dict[str, Any]) -> str:
    """One line: '2 × Intel Xeon ... , 24 GiB' or '4 × NVIDIA H100 80GB HBM3 (driver 550.54)'."""
    if info.get("gpus"):
        names = sorted({g["name"] for g in info["gpus"]})
        driver = f" (driver {info['driver']})" if info.get("driver") else ""
        return f"{len(info['gpus'])} × {', '.join(names)}{driver}; {info['cores']} CPU cores"
    return f"CPU only: {info['cores']} cores of {info['cpu']}, {info['memory_gib']} GiB"


def _nvidia_driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True, check=False)
    return done.stdout.splitlines()[0].strip() if done.returncode == 0 and done.stdout else None


CODE = ("helpers", "notebooks", "pyproject.toml", "environment.yml", "Makefile")  # what makes a
# result: the code, the notebooks and their parameters, the pinned environment (not the README,
# the tests, nor the tables and figures a run writes as it goes)


COMMIT_ENV = "GPUFEED_COMMIT"  # the commit of a copy of the checkout without its .git (the
# working tree a device call carries to a GPU machine), set by the command that sends it


def git_commit(root: Path) -> str:
    """The checkout's commit, with ``-dirty`` if a tracked file of CODE differs from it (the
    results and figures a run rewrites as it goes do not count); outside git, what COMMIT_ENV
    says, else 'unknown'."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              check=False)
    try:
        head = git("rev-parse", "HEAD")
    except FileNotFoundError:  # no git on this machine
        head = None
    if head is None or head.returncode != 0:
        return os.environ.get(COMMIT_ENV) or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", *CODE).stdout.strip()
    return head.stdout.strip() + ("-dirty" if dirty else "")
