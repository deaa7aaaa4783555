"""An output as the files other tools read: Parquet, or NumPy arrays.

``export(output, to, path)`` streams the output EXPORT_ROWS rows at a time, each with its id
named as the input named it, then the kept columns and every workload dataset (``columns``):

- a string id column (``doc_id``) comes back as ``doc_id``, the row numbers beside it
  (``ids``) only with ``row_numbers``;
- an integer id column comes back under its name (the output's ``ids`` renamed);
- without an id column (row numbers, an HDF5 input's positions), as ``ids``.

Errors are not rows: they stay in the output's ``errors/``.

Rows come in id order (``order="id"``, the default): the input's order where ids are row
numbers (no id column, or keys), so that row k of every exported array is the same record, as
``read_output`` and ``embed`` give them. A run stores rows as they arrive (nearly in order: a
window of workunits at a time), so each EXPORT_ROWS of the id order are gathered from the few
stretches of the stored rows that hold them, read whole (``_gather``); the ids and their order
are held (16 bytes a row: 320 MB at 20 M rows), never the vectors. ``order="stored"`` writes
them as stored, a little faster.

- ``parquet``: one file; a row per record; a vector (embeddings) is a fixed-size list column, so
  pyarrow, polars, DuckDB and LanceDB read it as it is; strings are strings.
- ``npy``: a folder of ``<column>.npy`` files (``ids.npy``, ``embeddings.npy``, ...), each
  memory-mappable (``np.load(path, mmap_mode="r")``); a string column (``doc_id``, a kept one) as
  ``<name>.utf8.npy`` and ``<name>.offsets.npy``, Arrow's layout, no string padded to the
  longest (a fixed-width ``<U`` array of 20 M keys of up to 100 characters took 8 GB):
  ``load_strings(folder, name)`` reads it.

What made the rows goes with them: the output's attributes (the model, the encode options, a
stored int8's calibration ranges, the versions) as JSON, the Parquet file's metadata key ATTRS
and an npy folder's ``attrs.json`` (``exported_attrs(path)`` reads either).

The export is written under a temporary name and renamed when whole, and marked as gpufeed's
(the Parquet file's metadata, a MARK file in the npy folder): an existing ``path`` is refused, and
with ``overwrite`` replaced only if it is such an export. An unfinished run's output (killed,
interrupted) is refused unless ``partial``: its rows are only those written so far. An output a
run is writing is refused (OutputLocked, naming the run): the export holds the output's lock, as
a run does, so no merge of the run's parts can delete what it reads (``read_output`` reads a
live output).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from helpers.engine.contract.fingerprint import INPUT_ATTR, NO_ID_COLUMN, decode
from helpers.engine.contract.protocol import key_column
from helpers.engine.outputs.atomic import temporary
from helpers.engine.outputs.hdf5_sink import check_parts, plain
from helpers.engine.outputs.ownership import owning

TARGETS = ("parquet", "npy")
ORDERS = ("id", "stored")
EXPORT_ROWS = 65536
MARK = ".gpufeed-export"  # in an npy export's folder; in a Parquet export's metadata (a key)
ATTRS = "gpufeed.attrs"  # the output's attributes: a Parquet metadata key; an npy's ATTRS_FILE
ATTRS_FILE = "attrs.json"


class ExportError(ValueError):
    """What was asked cannot be exported (no such output, a target that exists)."""


def export(output: str | os.PathLike, to: str, path: str | os.PathLike,
           overwrite: bool = False, partial: bool = False, order: str = "id",
           row_numbers: bool = False) -> int:
    """Write ``output`` (a gpufeed output: a finished file or, with ``partial``, a run's index)
    as ``to`` at ``path``, its rows in ``order``, the row numbers of a keyed input with
    ``row_numbers`` (module docstring); returns the rows written."""
    if to not in TARGETS:
        raise ExportError(f"to: expected one of {TARGETS}, got {to!r}")
    if order not in ORDERS:
        raise ExportError(f"order: expected one of {ORDERS}, got {order!r}")
    output, path = Path(output), Path(path)
    if not output.is_file():
        raise ExportError(f"{output}: no such output")
    if path.exists() and not _is_export(path, to):  # (suggest only what works: not overwrite)
        raise ExportError(f"{path} exists and is not a gpufeed {to} export; it is left as it "
                          f"is: give another path (overwrite replaces only an earlier export)")
    if path.exists() and not overwrite:
        raise ExportError(f"{path} exists (an earlier export); give another path, or "
                          f"overwrite=True (--overwrite) to replace it")
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
        names = columns(f, row_numbers)
        stored = _id_order(f) if order == "id" else None
        tmp = temporary(path)
        _remove(tmp)  # one a killed export left
        try:
            rows = (_parquet if to == "parquet" else _npy)(f, names, tmp, stored)
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
        all(p.suffix == ".npy" and p.is_file() for p in path.iterdir()
            if p.name not in (MARK, ATTRS_FILE))


def _attrs_text(f: h5py.File) -> str:
    """The output's attributes as JSON text (arrays as lists)."""
    return json.dumps({k: plain(v) for k, v in f.attrs.items()}, sort_keys=True, default=str)


def exported_attrs(path: str | os.PathLike) -> dict[str, Any]:
    """The attributes of the output an export at ``path`` (Parquet or an npy folder) came from:
    what made its rows (the model, the encode options, int8's calibration ranges, ...)."""
    path = Path(path)
    if path.is_dir():
        return json.loads((path / ATTRS_FILE).read_text(encoding="utf-8"))
    import pyarrow.parquet as pq

    return json.loads((pq.read_schema(path).metadata or {}).get(ATTRS.encode(), b"{}"))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _id_order(f: h5py.File) -> np.ndarray | None:
    """The stored rows' positions in id order; None where they are stored in it already."""
    ids = np.empty(len(f["ids"]), np.int64)
    for start in range(0, len(ids), EXPORT_ROWS * 16):
        ids[start:start + EXPORT_ROWS * 16] = f["ids"][start:start + EXPORT_ROWS * 16]
    if not len(ids) or (np.diff(ids) >= 0).all():
        return None
    return np.argsort(ids, kind="stable")


def columns(f: h5py.File, row_numbers: bool = False) -> dict[str, str]:
    """An output's columns as an export names them, in its order: ``{column: dataset}``, the id
    first under the input's name for it (module docstring), then the rest in the file's order."""
    made = decode(f.attrs.get(INPUT_ATTR, "")) or {}
    given = made.get("id_column")
    named = isinstance(given, str) and given != NO_ID_COLUMN
    key = key_column(given) if named else None
    own = [n for n in f if isinstance(f[n], h5py.Dataset) and n not in ("ids", key)]
    if key is not None and key in f and h5py.check_string_dtype(f[key].dtype) is not None:
        first = {given: key}
        if row_numbers:  # (an id column named ids: the row numbers under another name)
            first["ids" if given != "ids" else "row_numbers"] = "ids"
    elif named and made.get("ids", "given") == "given" and given not in own:  # (integer ids:
        first = {given: "ids"}  # a JSONL input says "given", a table's are, line numbers not)
    else:
        first = {"ids": "ids"}
    return first | {n: n for n in own}


def _chunks(f: h5py.File, names: list[str], stored: np.ndarray | None):
    """The rows EXPORT_ROWS at a time: as stored, or those at ``stored``'s positions, in its
    order."""
    total = len(f["ids"])
    for start in range(0, total, EXPORT_ROWS):
        stop = min(start + EXPORT_ROWS, total)
        if stored is None:
            yield {n: _read(f[n], start, stop) for n in names}
        else:
            yield {n: _gather(f[n], stored[start:stop]) for n in names}


def _gather(dataset: h5py.Dataset, wanted: np.ndarray) -> np.ndarray:
    """``dataset``'s rows at positions ``wanted``, in that order: each stretch of the stored rows
    that holds them read whole (a gap of more than EXPORT_ROWS rows starts another stretch), so
    that rows stored nearly in order cost about one read of their own."""
    at = np.sort(wanted)
    cuts = np.flatnonzero(np.diff(at) > EXPORT_ROWS) + 1
    values = np.concatenate([_read(dataset, int(run[0]), int(run[-1]) + 1)[run - run[0]]
                             for run in np.split(at, cuts)])
    out = np.empty_like(values)
    out[np.argsort(wanted, kind="stable")] = values  # (values are at's; at = wanted sorted)
    return out


def _read(dataset: h5py.Dataset, start: int, stop: int) -> np.ndarray:
    if h5py.check_string_dtype(dataset.dtype) is not None:
        return dataset.asstr()[start:stop]
    return dataset[start:stop]


def _parquet(f: h5py.File, names: dict[str, str], path: Path, stored: np.ndarray | None
             ) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(n, _arrow_type(f[d])) for n, d in names.items()],
                       metadata={MARK: "1", ATTRS: _attrs_text(f)})
    rows = 0
    with pq.ParquetWriter(path, schema) as writer:
        for chunk in _chunks(f, list(names.values()), stored):
            writer.write_batch(pa.record_batch([_arrow_array(chunk[d], schema.field(n).type)
                                                for n, d in names.items()], schema=schema))
            rows += len(chunk[next(iter(names.values()))])
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


def _npy(f: h5py.File, names: dict[str, str], folder: Path, stored: np.ndarray | None) -> int:
    total = len(f["ids"])
    folder.mkdir()
    (folder / MARK).write_text("written by python -m helpers export\n")
    (folder / ATTRS_FILE).write_text(_attrs_text(f), encoding="utf-8")
    for name, source in names.items():
        dataset = f[source]
        if h5py.check_string_dtype(dataset.dtype) is not None:
            _npy_strings(f, source, folder / name, stored, total)
            continue
        target = np.lib.format.open_memmap(folder / f"{name}.npy", mode="w+",
                                           dtype=dataset.dtype, shape=(total, *dataset.shape[1:]))
        for start, chunk in zip(range(0, total, EXPORT_ROWS), _chunks(f, [source], stored)):
            target[start:start + len(chunk[source])] = chunk[source]
        target.flush()
        del target
    return total


def _npy_strings(f: h5py.File, name: str, named: Path, stored: np.ndarray | None,
                 total: int) -> None:
    """The string dataset ``name`` as ``<named>.utf8.npy`` (its strings' UTF-8 bytes, one after
    another) and ``<named>.offsets.npy`` (int64, rows + 1: string k is bytes
    ``offsets[k]:offsets[k + 1]``), as Arrow holds strings: no string padded to the longest
    (``load_strings`` reads them back)."""
    folder, column = named.parent, named.name
    size = sum(len(s.encode()) for chunk in _chunks(f, [name], None) for s in chunk[name])
    offsets = np.lib.format.open_memmap(folder / f"{column}.offsets.npy", mode="w+",
                                        dtype=np.int64, shape=(total + 1,))
    data = np.lib.format.open_memmap(folder / f"{column}.utf8.npy", mode="w+", dtype=np.uint8,
                                     shape=(size,))
    offsets[0], at = 0, 0
    for start, chunk in zip(range(0, total, EXPORT_ROWS), _chunks(f, [name], stored)):
        encoded = [s.encode() for s in chunk[name]]
        lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
        offsets[start + 1:start + 1 + len(encoded)] = at + np.cumsum(lengths)
        joined = b"".join(encoded)
        data[at:at + len(joined)] = np.frombuffer(joined, np.uint8)
        at += len(joined)
    offsets.flush()
    data.flush()
    del offsets, data


def load_strings(folder: str | os.PathLike, name: str, mmap: bool = True) -> np.ndarray:
    """An npy export's string column ``name`` (a string id column, a kept one) as an array of
    str."""
    folder = Path(folder)
    offsets = np.load(folder / f"{name}.offsets.npy", mmap_mode="r" if mmap else None)
    data = np.load(folder / f"{name}.utf8.npy", mmap_mode="r" if mmap else None)
    raw = bytes(data)
    bounds = offsets.tolist()
    return np.array([raw[a:b].decode() for a, b in zip(bounds[:-1], bounds[1:])], dtype=object)
