"""The single writer: appends results to one HDF5 file as they arrive, in any order.

Layout::

    ids                 int64   [n]            record ids, in arrival order
    <output>            <dtype> [n, *shape]    one dataset per workload output, row i is ids[i]
    errors/ids          int64   [m]            records that failed, with why and when
    errors/type         str     [m]
    errors/message      str     [m]
    errors/time         float64 [m]            unix time of the failure

Every dataset is resizable and chunked. Rows are buffered and written in chunk-sized blocks (or when
the buffer is older than ``FLUSH_SECONDS``), so a run of one-record workunits does not pay one resize
per record. File attributes carry the provenance given at creation.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from helpers.workloads.base import TEXT, OutputSpec

CHUNK_RECORDS = 1024  # rows per HDF5 chunk and per buffered write
FLUSH_SECONDS = 2.0  # a buffer older than this is written even if not full
_STR = h5py.string_dtype("utf-8")


class HDF5Sink:
    """Append-only writer of ids, workload outputs and per-record errors."""

    def __init__(self, path: str | os.PathLike, outputs: Mapping[str, OutputSpec],
                 attrs: Mapping[str, Any] | None = None) -> None:
        reserved = {"ids", "errors"} & set(outputs)
        if reserved:
            raise ValueError(f"outputs: {sorted(reserved)} are reserved dataset names")
        self.path, self.outputs = Path(path), dict(outputs)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = h5py.File(self.path, "w")
        self._datasets = {"ids": _resizable(self._file, "ids", (), "int64")}
        for name, spec in self.outputs.items():
            dtype = _STR if spec.dtype == TEXT else spec.dtype
            self._datasets[name] = _resizable(self._file, name, spec.shape, dtype)
        errors = self._file.create_group("errors")
        self._errors = {"ids": _resizable(errors, "ids", (), "int64"),
                        "type": _resizable(errors, "type", (), _STR),
                        "message": _resizable(errors, "message", (), _STR),
                        "time": _resizable(errors, "time", (), "float64")}
        for key, value in (attrs or {}).items():
            self._file.attrs[key] = _attr(value)
        self._buffer: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []
        self._buffered, self._buffer_since = 0, time.monotonic()
        self.records_written = self.errors_written = 0

    def append(self, ids: np.ndarray, arrays: Mapping[str, np.ndarray]) -> None:
        """Queue rows for writing; ValueError if they do not match the declared outputs."""
        ids = np.asarray(ids, dtype=np.int64)
        if set(arrays) != set(self.outputs):
            raise ValueError(f"outputs: got {sorted(arrays)}, declared {sorted(self.outputs)}")
        for name, spec in self.outputs.items():
            spec.check(name, arrays[name], len(ids))
        if not self._buffer:
            self._buffer_since = time.monotonic()
        self._buffer.append((ids, dict(arrays)))
        self._buffered += len(ids)
        if self._buffered >= CHUNK_RECORDS or time.monotonic() - self._buffer_since > FLUSH_SECONDS:
            self.flush()

    def append_errors(self, failures: list[tuple[int, str, str, float]]) -> None:
        """Write ``(record id, error type, message, unix time)`` rows to ``errors/``."""
        if not failures:
            return
        ids, types, messages, times = zip(*failures)
        _extend(self._errors["ids"], np.asarray(ids, dtype=np.int64))
        _extend(self._errors["type"], np.asarray(types, dtype=object))
        _extend(self._errors["message"], np.asarray(messages, dtype=object))
        _extend(self._errors["time"], np.asarray(times, dtype=np.float64))
        self.errors_written += len(failures)

    def flush(self) -> None:
        """Write buffered rows and flush the file."""
        if self._buffer:
            _extend(self._datasets["ids"], np.concatenate([ids for ids, _ in self._buffer]))
            for name, spec in self.outputs.items():
                rows = np.concatenate([a[name] for _, a in self._buffer])
                _extend(self._datasets[name], rows.astype(object) if spec.dtype == TEXT else rows)
            self.records_written += self._buffered
            self._buffer, self._buffered = [], 0
        self._file.flush()

    def close(self) -> None:
        if self._file.id.valid:
            self.flush()
            self._file.close()

    def __enter__(self) -> "HDF5Sink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _resizable(group: h5py.Group, name: str, shape: tuple[int, ...], dtype: Any) -> h5py.Dataset:
    return group.create_dataset(name, shape=(0, *shape), maxshape=(None, *shape), dtype=dtype,
                                chunks=(CHUNK_RECORDS, *shape))


def _extend(dataset: h5py.Dataset, rows: np.ndarray) -> None:
    start = dataset.shape[0]
    dataset.resize(start + len(rows), axis=0)
    dataset[start:] = rows


def _attr(value: Any) -> Any:
    if value is None:
        return "None"
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return np.asarray(value, dtype=_STR)
    if isinstance(value, (str, int, float, bool, np.generic, np.ndarray)):
        return value
    return str(value)


def read_output(path: str | os.PathLike) -> dict[str, Any]:
    """Load an output file sorted by id: ``{"ids", <outputs>..., "errors", "attrs"}``.

    For inspection and tests; a 20-million-row file is better read in slices with h5py.
    """
    with h5py.File(path, "r") as f:
        order = np.argsort(f["ids"][...], kind="stable")
        data = {name: _values(f[name])[order] for name in f if isinstance(f[name], h5py.Dataset)}
        errors = f["errors"]
        data["errors"] = [
            {"id": int(i), "type": t, "message": m, "time": float(s)}
            for i, t, m, s in zip(errors["ids"][...], errors["type"].asstr()[...],
                                  errors["message"].asstr()[...], errors["time"][...])]
        data["attrs"] = {k: _plain(v) for k, v in f.attrs.items()}
    return data


def _values(dataset: h5py.Dataset) -> np.ndarray:
    """A dataset's rows; strings as ``str`` objects, not bytes."""
    if h5py.check_string_dtype(dataset.dtype) is not None:
        return dataset.asstr()[...]
    return dataset[...]


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [v.decode() if isinstance(v, bytes) else v for v in value.tolist()]
    return value.item() if isinstance(value, np.generic) else value
