"""An output as the files other tools read: Parquet, or NumPy arrays.

``export(output, to, path)`` streams the output EXPORT_ROWS rows at a time (memory bounded at any
size), in the order the rows are stored, each with its id: ``ids`` and, if the run kept them,
``keys`` and the kept columns, then every workload dataset. Errors are not rows: they stay in the
output's ``errors/``.

- ``parquet``: one file; a row per record; a vector (embeddings) is a fixed-size list column, so
  pyarrow, polars, DuckDB and LanceDB read it as it is; strings are strings.
- ``npy``: a folder of ``<dataset>.npy`` files (``ids.npy``, ``embeddings.npy``, ...), each
  memory-mappable (``np.load(path, mmap_mode="r")``); strings as fixed-width Unicode.

The export is written under a temporary name and renamed when whole, and marked as gpufeed's
(the Parquet file's metadata, a MARK file in the npy folder): an existing ``path`` is refused, and
with ``overwrite`` replaced only if it is such an export. An unfinished run's output (killed,
interrupted) is refused unless ``partial``: its rows are only those written so far. An output a
run is writing is refused (OutputLocked, naming the run): the export holds the output's lock, as
a run does, so no merge of the run's parts can delete what it reads (``read_output`` reads a
live output).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from helpers.engine.atomic import temporary
from helpers.engine.hdf5_sink import check_parts
from helpers.engine.ownership import owning

TARGETS = ("parquet", "npy")
EXPORT_ROWS = 65536
MARK = ".gpufeed-export"  # in an npy export's folder; in a Parquet export's metadata (a key)
NPY_MAX_CHARS = 4096  # a longer string makes every row of its fixed-width .npy that wide
FIRST = ("ids", "keys")  # these columns first, then the rest in the file's order


class ExportError(ValueError):
    """What was asked cannot be exported (no such output, a target that exists)."""


def export(output: str | os.PathLike, to: str, path: str | os.PathLike,
           overwrite: bool = False, partial: bool = False) -> int:
    """Write ``output`` (a gpufeed output: a finished file or, with ``partial``, a run's index)
    as ``to`` at ``path`` (module docstring); returns the rows written."""
    if to not in TARGETS:
        raise ExportError(f"to: expected one of {TARGETS}, got {to!r}")
    output, path = Path(output), Path(path)
    if not output.is_file():
        raise ExportError(f"{output}: no such output")
    if path.exists() and not overwrite:
        raise ExportError(f"{path} exists; give another path, or overwrite=True (--overwrite)")
    if path.exists() and not _is_export(path, to):
        raise ExportError(f"{path} exists and is not a gpufeed {to} export; it is left as it "
                          f"is (overwrite replaces only an earlier export)")
    if path.resolve() == output.resolve():
        raise ExportError(f"{path} is the output itself")
    if not h5py.is_hdf5(output):
        raise ExportError(f"{output}: not a gpufeed output (not an HDF5 file)")
    with owning(output), h5py.File(output, "r") as f:  # (no run writes it meanwhile)
        if "ids" not in f:
            raise ExportError(f"{output}: not a gpufeed output (no ids)")
        if not f.attrs.get("complete", True) and not partial:
            raise ExportError(f"{output}: the run that writes it has not finished "
                              f"({len(f['ids']):,} rows so far); --resume it first, or export "
                              f"what is there with partial=True (--partial)")
        check_parts(f, output)
        names = [n for n in FIRST if n in f] + [
            n for n in f if n not in FIRST and isinstance(f[n], h5py.Dataset)]
        tmp = temporary(path)
        _remove(tmp)  # one a killed export left
        try:
            rows = (_parquet if to == "parquet" else _npy)(f, names, tmp)
            if path.exists():  # overwrite: the old one goes only once the new one is whole
                _remove(path)
            os.replace(tmp, path)
        except BaseException:
            _remove(tmp)
            raise
    return rows


def _is_export(path: Path, to: str) -> bool:
    """Whether ``path`` looks like what an export to ``to`` writes (all overwrite replaces)."""
    if path.is_symlink():
        return False
    if to == "parquet":
        import pyarrow.parquet as pq

        try:
            return MARK.encode() in (pq.read_schema(path).metadata or {})
        except Exception:  # not Parquet at all
            return False
    return path.is_dir() and (path / MARK).is_file() and \
        all(p.suffix == ".npy" and p.is_file() for p in path.iterdir() if p.name != MARK)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _chunks(f: h5py.File, names: list[str]):
    total = len(f["ids"])
    for start in range(0, total, EXPORT_ROWS):
        stop = min(start + EXPORT_ROWS, total)
        yield {n: _read(f[n], start, stop) for n in names}


def _read(dataset: h5py.Dataset, start: int, stop: int) -> np.ndarray:
    if h5py.check_string_dtype(dataset.dtype) is not None:
        return dataset.asstr()[start:stop]
    return dataset[start:stop]


def _parquet(f: h5py.File, names: list[str], path: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(n, _arrow_type(f[n])) for n in names], metadata={MARK: "1"})
    rows = 0
    with pq.ParquetWriter(path, schema) as writer:
        for chunk in _chunks(f, names):
            writer.write_batch(pa.record_batch([_arrow_array(chunk[n], schema.field(n).type)
                                                for n in names], schema=schema))
            rows += len(chunk["ids"])
    return rows


def _arrow_type(dataset: h5py.Dataset) -> Any:
    import pyarrow as pa

    if h5py.check_string_dtype(dataset.dtype) is not None:
        return pa.string()
    item = pa.from_numpy_dtype(dataset.dtype)
    for size in reversed(dataset.shape[1:]):  # (n, 384) -> fixed_size_list<float>[384]
        item = pa.list_(item, size)
    return item


def _arrow_array(values: np.ndarray, arrow_type: Any) -> Any:
    import pyarrow as pa

    if pa.types.is_fixed_size_list(arrow_type):
        inner = _arrow_array(values.reshape(-1, *values.shape[2:]), arrow_type.value_type)
        return pa.FixedSizeListArray.from_arrays(inner, arrow_type.list_size)
    return pa.array(values.tolist() if values.dtype == object else values, arrow_type)


def _npy(f: h5py.File, names: list[str], folder: Path) -> int:
    total = len(f["ids"])
    dtypes = {}
    for name in names:  # first: is every string column narrow enough?
        dataset = f[name]
        if h5py.check_string_dtype(dataset.dtype) is not None:
            longest = max((len(max(c[name], key=len, default="")) for c in _chunks(f, [name])),
                          default=0)
            if longest > NPY_MAX_CHARS:
                raise ExportError(f"{name!r} holds a string of {longest:,} characters: as a "
                                  f"fixed-width .npy every row would take that much; export "
                                  f"to parquet instead")
            dtypes[name] = np.dtype(f"<U{max(1, longest)}")
        else:
            dtypes[name] = dataset.dtype
    folder.mkdir()
    (folder / MARK).write_text("written by python -m helpers export\n")
    for name in names:
        dataset, dtype = f[name], dtypes[name]
        target = np.lib.format.open_memmap(folder / f"{name}.npy", mode="w+", dtype=dtype,
                                           shape=(total, *dataset.shape[1:]))
        for start, chunk in zip(range(0, total, EXPORT_ROWS), _chunks(f, [name])):
            target[start:start + len(chunk[name])] = chunk[name]
        target.flush()
        del target
    return total
