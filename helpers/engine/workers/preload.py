"""Imported by the process backend's fork server only (helpers.engine.workers.backends): the modules
a workload names in ``imports``, listed in ``$GPUFEED_PRELOAD`` when the server starts (never
imported by the pool's process).

multiprocessing's own preload passes over a module that raises ImportError, but any other error
ends the server, and every worker start then fails with a bare ``EOFError``. Here a module that
cannot be imported is left out: a worker imports it again in its ``load``, and the run reports
that error, naming the worker, as it would with spawned workers.
"""
from __future__ import annotations

import importlib
import os

from helpers.engine.workers.backends import PRELOAD_ENV  # module names, comma-separated


def preload(names: str) -> None:
    """Import each of the comma-separated ``names`` that can be imported."""
    for name in filter(None, (n.strip() for n in names.split(","))):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - its worker meets it again, and says it
            pass


preload(os.environ.get(PRELOAD_ENV, ""))
