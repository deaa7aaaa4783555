"""The single writer: appends results to one HDF5 file as they arrive, in any order.

Layout::

    ids                 int64   [n]            record ids, in arrival order
    <output>            <dtype> [n, *shape]    one dataset per workload output, row i is ids[i]
    errors/ids          int64   [m]            records that failed, with why and when
    errors/type         str     [m]
    errors/message      str     [m]
    errors/time         float64 [m]            unix time of the failure

Rows are buffered and written in blocks of CHUNK_RECORDS (or when the buffer is older than
FLUSH_SECONDS), so a run of one-record workunits does not pay one write per record.

``durable=True`` (the default) writes each block as a part file and keeps the output an index over
the parts until the run ends (helpers.checkpoint): whatever kills the run, the output opens and
holds every block flushed before, and ``resume=True`` carries on from there. ``durable=False``
appends to the file in place: a little faster, but a run killed mid-write may leave it unreadable.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from helpers.checkpoint import CHUNK_RECORDS, STR, Parts, columns, is_index, set_attrs
from helpers.workloads.base import TEXT, OutputSpec

FLUSH_SECONDS = 2.0  # a buffer older than this is written even if not full: at most this is lost


class HDF5Sink:
    """Append-only writer of ids, workload outputs and per-record errors."""

    def __init__(self, path: str | os.PathLike, outputs: Mapping[str, OutputSpec],
                 attrs: Mapping[str, Any] | None = None, durable: bool = True,
                 resume: bool = False) -> None:
        reserved = {"ids", "errors"} & set(outputs)
        if reserved:
            raise ValueError(f"outputs: {sorted(reserved)} are reserved dataset names")
        if resume and not durable:
            raise ValueError("resume: needs durable=True (an in-place file may not survive a crash)")
        self.path, self.outputs = Path(path), dict(outputs)
        self.attrs = dict(attrs or {})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns = columns(self.outputs)
        self._blocks: list[dict[str, np.ndarray]] = []
        self._buffered, self._buffer_since = 0, time.monotonic()
        self.records_written = self.errors_written = 0
        self.done_ids = np.empty(0, np.int64)  # resume: ids a previous run wrote or gave up on
        self._parts: Parts | None = None
        self._file: h5py.File | None = None
        if durable:
            self._open_parts(resume)
        else:
            self._open_in_place()

    def _open_parts(self, resume: bool) -> None:
        parts = self._parts = Parts(self.path, self.outputs)
        if not resume and parts.folder.exists():
            shutil.rmtree(parts.folder)  # a new run: what an older one left is not ours
        if resume and self.path.exists() and not is_index(self.path):
            parts.adopt(self.path)  # a finished (or in-place) file: build on it
        parts.scan()
        self.done_ids = parts.done_ids()
        if resume:
            self.attrs["resumed_after"] = len(self.done_ids)
            logging.getLogger("gpufeed").info("resume: %s holds %d ids (written or failed); "
                                              "they are skipped", self.path, len(self.done_ids))
        parts.write_index(self.attrs)  # from now on the output is this run's, even if it dies

    def _open_in_place(self) -> None:
        self._file = f = h5py.File(self.path, "w")
        for name, (shape, dtype) in self.columns.items():
            f.create_dataset(name, shape=(0, *shape), maxshape=(None, *shape), dtype=dtype,
                             chunks=(CHUNK_RECORDS, *shape))
        set_attrs(f, self.attrs)

    def append(self, ids: np.ndarray, arrays: Mapping[str, np.ndarray]) -> None:
        """Queue rows for writing; ValueError if they do not match the declared outputs."""
        ids = np.asarray(ids, dtype=np.int64)
        if set(arrays) != set(self.outputs):
            raise ValueError(f"outputs: got {sorted(arrays)}, declared {sorted(self.outputs)}")
        for name, spec in self.outputs.items():
            spec.check(name, arrays[name], len(ids))
        block = {"ids": ids, **{n: (a.astype(object) if self.outputs[n].dtype == TEXT else a)
                                for n, a in arrays.items()}}
        self._add(block, len(ids))

    def append_errors(self, failures: list[tuple[int, str, str, float]]) -> None:
        """Queue ``(record id, error type, message, unix time)`` rows for ``errors/``."""
        if not failures:
            return
        ids, types, messages, times = zip(*failures)
        self._add({"errors/ids": np.asarray(ids, dtype=np.int64),
                   "errors/type": np.asarray(types, dtype=object),
                   "errors/message": np.asarray(messages, dtype=object),
                   "errors/time": np.asarray(times, dtype=np.float64)}, len(failures))

    def _add(self, block: dict[str, np.ndarray], rows: int) -> None:
        if not self._blocks:
            self._buffer_since = time.monotonic()
        self._blocks.append(block)
        self._buffered += rows
        if self._buffered >= CHUNK_RECORDS or time.monotonic() - self._buffer_since > FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows: a new part (durable) or appended in place; then flush."""
        if not self._blocks:
            return
        data = {}
        for name, (shape, dtype) in self.columns.items():
            pieces = [b[name] for b in self._blocks if name in b]
            data[name] = np.concatenate(pieces) if pieces else \
                np.empty((0, *shape), dtype=object if dtype is STR else dtype)
        if self._parts is not None:
            self._parts.write(data)  # and the index over every part
        else:
            for name, rows in data.items():
                dataset = self._file[name]
                start = dataset.shape[0]
                dataset.resize(start + len(rows), axis=0)
                dataset[start:] = rows
            self._file.flush()
        self.records_written += len(data["ids"])
        self.errors_written += len(data["errors/ids"])
        self._blocks, self._buffered = [], 0

    def close(self, complete: bool = True) -> None:
        """Flush; a complete durable run is merged into one file, an incomplete one keeps its
        index (and parts) for ``resume``."""
        if self._parts is not None:
            self.flush()
            parts, self._parts = self._parts, None
            if complete:
                parts.finish(self.attrs)
        elif self._file is not None and self._file.id.valid:
            self.flush()
            self._file.close()

    def __enter__(self) -> "HDF5Sink":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close(complete=exc_type is None)


def read_output(path: str | os.PathLike) -> dict[str, Any]:
    """Load an output file sorted by id: ``{"ids", <outputs>..., "errors", "attrs"}``.

    Reads a finished file and the index of an unfinished run alike. For inspection and tests; a
    20-million-row file is better read in slices with h5py.
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
