"""Notebook parameters: the named sets in ``notebooks/params/`` and a check of every value.

A set is a YAML file with a ``common`` section (shared by every notebook) and one section per
notebook, keyed by the notebook's file stem. ``check_parameters`` is the first call of every
notebook: a bad value stops it there with a message naming the parameter, before any worker starts.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from helpers.engine.contract.devices import parse_devices
from helpers.engine.contract.settings import BACKENDS, positive_int
from helpers.study.paths import NOTEBOOKS
from helpers.study.peers import SYSTEMS
from helpers.workloads.binning.rule import Thresholds
from helpers.workloads.embedding.cards.simulated import CARDS

PARAMS = NOTEBOOKS / "params"


def parameter_sets() -> list[str]:
    """The names of the sets in ``notebooks/params/`` (``smoke``, ``cpu``, ``gpu``)."""
    return sorted(p.stem for p in PARAMS.glob("*.yaml"))


def load_parameters(name_or_path: str | Path, notebook: str) -> dict[str, Any]:
    """The parameters set ``name_or_path`` gives ``notebook`` (a file stem): common, then its
    own."""
    import yaml

    path = Path(name_or_path)
    if not path.suffix:
        path = PARAMS / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ValueError(f"params: no parameter set {str(name_or_path)!r}; "
                         f"expected one of {parameter_sets()} or a .yaml file")
    sets = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return resolve_devices({**(sets.get("common") or {}), **(sets.get(notebook) or {})})


def resolve_devices(parameters: dict[str, Any]) -> dict[str, Any]:
    """``parameters`` with ``"auto"`` and ``"cuda:0*2"`` entries of ``devices`` spelled out (one
    per worker) and ``device: auto`` the first visible device, so that a set runs on 1 to N GPUs
    and a notebook sees the devices it runs on."""
    resolved = dict(parameters)
    for name in ("devices", "synthetic_devices"):
        if isinstance(resolved.get(name), (str, list)) and resolved[name]:
            resolved[name] = list(parse_devices(resolved[name]))
    if resolved.get("device") == "auto":
        resolved["device"] = parse_devices("auto")[0]
    return resolved


def _ints(name: str, value: Any) -> None:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{name}: expected a non-empty list of integers >= 1, got {value!r}")
    for item in value:
        positive_int(name, item)


def _ints_or_default(name: str, value: Any) -> None:
    """A non-empty list of integers >= 1, or None for the default (the workload's own)."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"{name}: expected a non-empty list of integers >= 1 or None (the "
                         f"default), got {value!r}")
    for item in value:
        if item is not None:
            positive_int(name, item)


def _device(name: str, value: Any) -> None:
    _devices(name, [value] if isinstance(value, str) else value)


def _devices(name: str, value: Any) -> None:
    if not isinstance(value, list):
        raise ValueError(f"{name}: expected a list of devices, e.g. ['cpu', 'cuda:0'], got {value!r}")
    try:
        parse_devices(value)
    except ValueError as exc:
        raise ValueError(str(exc).replace("devices", name, 1)) from None


def _factors(name: str, value: Any) -> None:
    if not isinstance(value, list) or not value or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value):
        raise ValueError(f"{name}: expected a non-empty list of numbers > 0, got {value!r}")


def _seconds(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name}: expected seconds >= 0, got {value!r}")


def _choice(options: tuple[str, ...]) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if value not in options:
            raise ValueError(f"{name}: expected one of {options}, got {value!r}")
    return check


def _subset(options: tuple[str, ...]) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if not isinstance(value, list) or not value or not set(value) <= set(options):
            raise ValueError(f"{name}: expected a non-empty list drawn from {options}, got {value!r}")
    return check


def _text(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}: expected a non-empty string, got {value!r}")


def _texts(name: str, value: Any) -> None:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{name}: expected a non-empty list of non-empty strings, got {value!r}")


THRESHOLDS = tuple(f.name for f in fields(Thresholds))


def _threshold(name: str, value: Any) -> None:
    Thresholds(**{name: value})  # its ValueError names the threshold and the accepted values


def _model(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name}: expected a model name or path, or '' for the embedded default, "
                         f"got {value!r}")


CHECKS: dict[str, Callable[[str, Any], None]] = {
    "device": _device, "devices": _devices, "synthetic_devices": _devices,
    "worker_counts": _ints, "workunit_sizes": _ints, "speed_factors": _factors,
    "workunit_size": positive_int, "replicates": positive_int, "rounds": positive_int,
    "records": positive_int, "synthetic_records": positive_int, "batch_size": positive_int,
    "estimated_total_chunks": positive_int, "seed": lambda n, v: positive_int(n, v, True),
    "seconds_per_record": _seconds, "workload": _choice(("embedding", "synthetic")),
    "backends": _subset(BACKENDS), "model": _model, "results_dir": _text,
    "figures_dir": _text, "image_folder": _text, "images": positive_int, "pass_images": positive_int,
    "gallery_per_bin": positive_int, "model_threads": positive_int, "prompts": _texts,
    "batch_sizes": _ints, "tune_sample": positive_int, "tune_budget_seconds": _seconds,
    "seconds_per_workunit": _seconds, "parallelism": positive_int, "longer_records": positive_int,
    "sweep_replicates": positive_int, "writer_rows": positive_int, "writer_dim": positive_int,
    "writer_workers": positive_int, "writer_workunit_size": positive_int, "nodes": positive_int,
    "workers_per_node": positive_int, "node_cpus": positive_int, "lose_at_seconds": _seconds,
    "cluster_records": positive_int, "systems": _subset(SYSTEMS), "workers": positive_int,
    "fault_records": positive_int, "kill_after_seconds": _seconds, "limit_seconds": _seconds,
    "card": _choice(tuple(CARDS)), "card_cores": positive_int, "card_workers": _ints,
    "tokenize_threads": _ints_or_default, "card_records": positive_int,
    "card_batch_size": positive_int,
    "card_workunit_size": positive_int, "card_workunit_sizes": _ints,
    "card_replicates": positive_int, "card_batch_sizes": _ints, "card_tune_sample": positive_int,
    **{name: _threshold for name in THRESHOLDS},
}


def check_parameters(**parameters: Any) -> None:
    """Raise ValueError naming the first parameter whose value is not acceptable."""
    for name, value in parameters.items():
        if name not in CHECKS:
            raise ValueError(f"{name}: not a known parameter (known: {sorted(CHECKS)})")
        CHECKS[name](name, value)
