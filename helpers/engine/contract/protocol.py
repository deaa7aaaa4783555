"""The two protocols: what a workload gives the pipeline (a model's job) and what a source gives it
(the records).

A workload is a small frozen, picklable description (model name, batch size, ...), never a loaded
model, so that any backend can ship it to a worker: a worker process, a thread, a Ray actor. A
worker then calls, in order::

    model = workload.load(device, threads)       # once, on the worker's device
    specs = workload.outputs(model)              # the datasets the writer creates
    workload.check_record(record)                # per record; raise to reject that record alone
    record = workload.prepare(record)            # optional, per record: decode; raise to reject
    arrays = workload.process(model, records)    # per workunit; one row per record in each array

A workload may also define ``record_cost(record) -> float`` (a text's length, say): the reader then
orders a window of records by it before cutting workunits, so records of similar cost share a batch.
And it may define ``phases(model) -> dict[str, float]``: the seconds the calling thread's last
``process`` spent in each of its phases (the embedding workload: tokenize, forward, copy_out); the
worker asks right after each workunit, and the stats and the timeline carry the answer. Likewise
``counts(model) -> dict[str, int]``: what that ``process`` counted (the embedding workload:
tokens_computed, tokens_needed, whose ratio is ``stats.padding``). And ``report(model) -> dict``:
what a worker says of the model it loaded (its variant, the quality guard's figures: the output's
``loaded`` attribute).

A workload whose model computes on a card while the CPU goes on may define ``launches(model) ->
bool`` and ``launch(model, records) -> finish``: ``process`` in two steps, the records handed to
the card, then ``finish()`` waiting for their arrays. Where ``launches`` says so, a worker starts
its next workunit before it finishes the last (helpers.engine.workers.worker.serve), so the card has
work while the worker writes and answers; ``phases`` and ``counts`` are asked after ``finish``.

A workload whose model holds what its references alone do not end (the embedding workload's
tokenizing processes) may define ``close(model)``: the thread backend, whose threads share one
model per device, calls it once for each model when the pool shuts down (a worker process's
children end with it).

And it may define ``fingerprint() -> dict``: what decides its values (model, options), which a
resumed run must keep; without it, ``attrs()`` is used, every field of it. A field an older
output did not record is not compared, unless the fingerprint's UNRECORDED field gives the value
such an output was made with (an option added later: unset there). And ``identity(model) ->
dict``: the fields of that fingerprint as a worker's load decided them (the embedding workload: the
model's files as that worker found them, a hub model fetched there, not on the driver): the
output records the workers' where the driver could not tell, and a run whose workers loaded
other files than each other, or than the driver found, is refused (helpers.engine.pool).

A workload imports its heavy libraries (torch, onnxruntime) inside ``load``, never at module level:
a process that merely unpickles it should pay for nothing it does not run. It may name them in an
attribute ``imports`` (module names): the process backend's fork server imports them once, and
every worker process it forks starts with them imported (helpers.engine.workers.backends; the server
keeps the first pool's).

A workload that captures CUDA graphs holds ``CUDA_GRAPHS_LOCK`` through each capture: the engine
holds it to empty torch's cache after an out-of-memory error, which would trip torch's allocator
while another thread of the process (a worker of the thread backend) captures.
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from helpers.engine.contract.id_ranges import packed, unpacked

CUDA_GRAPHS_LOCK = threading.RLock()  # a process's (the module docstring)
MODEL_COPY_ENV = "GPUFEED_MODEL_COPY"  # set in each worker process: the n-th model copy on its
# device, from 0 (like torchrun's LOCAL_RANK), for a workload that places copies itself
TEXT = "str"  # OutputSpec dtype of a UTF-8 string column (a path, a caption, a class list)
INT64_MAX = int(np.iinfo(np.int64).max)
NO_ID = np.iinfo(np.int64).min  # errors/ids of a record that has no usable id (a line that is not
# JSON, an id outside int64): its errors/position says where it is. No record may have this id.


@dataclass(frozen=True)
class OutputSpec:
    """One output dataset: each record contributes one row of ``shape`` and ``dtype``.

    ``dtype`` is a NumPy dtype name, or TEXT for variable-length UTF-8 strings.
    """

    shape: tuple[int, ...]
    dtype: str

    def check(self, name: str, array: np.ndarray, rows: int) -> None:
        """Raise ValueError if ``array`` is not ``rows`` rows of this spec."""
        expected = (rows, *self.shape)
        if self.dtype == TEXT:
            ok = array.dtype.kind in "OU" and all(isinstance(v, str) for v in array.flat)
        else:
            ok = array.dtype == np.dtype(self.dtype)
        if array.shape != expected or not ok:
            declared = "str" if self.dtype == TEXT else np.dtype(self.dtype)
            raise ValueError(f"output {name!r}: got shape {array.shape} dtype {array.dtype}, "
                             f"declared {expected} {declared}")


class SourceError(ValueError):
    """The source as a whole cannot be read (missing, wrong layout, no such column)."""


def id_problem(record_id: Any) -> str:
    """What makes ``record_id`` unusable as an id ("" if nothing): ids are int64, NO_ID aside."""
    if isinstance(record_id, bool) or not isinstance(record_id, (int, np.integer)):
        return f"is not an integer: {repr(record_id)[:80]}"
    if not NO_ID < int(record_id) <= INT64_MAX:
        return f"{record_id} is outside the ids gpufeed takes ({NO_ID + 1} to {INT64_MAX})"
    return ""


class OptionRefused(ValueError):
    """A workload's option the model turns down when it loads (a prompt name it lacks, more
    dimensions than it has): the user's argument, not a failed run (the command line exits 2)."""


class ExtraMissing(ImportError):
    """A package one of gpufeed's extras installs is not here (``needs``)."""


def needs(module: str, extra: str, purpose: str) -> Any:
    """``module``, imported; where it is not installed, ExtraMissing naming ``purpose``, the
    module and the ``pip install`` of gpufeed's ``extra`` that brings it (a library install has
    what running and exporting need; notebooks, reports, onnx, binning and Ray are extras)."""
    import importlib

    import importlib.util

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        if sys.modules.get(top, False) is not None and importlib.util.find_spec(top) is not None:
            raise  # (installed, but broken: a missing CUDA library, say; that is the message)
        raise ExtraMissing(f"{purpose} needs {module.split('.')[0]}, which gpufeed's "
                           f"[{extra}] extra installs: pip install 'gpufeed[{extra}]' (in a "
                           f"checkout: pip install -e '.[{extra}]')", name=exc.name) from None


@dataclass(frozen=True)
class BadRecord:
    """Stands in for a record the reader could not decode (or whose id is unusable or taken): it
    goes to ``errors/`` as the reader meets it, never to a worker, and costs no other record.

    ``position``: where the record is in its source (a JSONL file's 0-based line, an HDF5 input's
    row, an iterable's item), -1 if the source cannot say."""

    error_type: str
    message: str
    position: int = -1


UNRECORDED = "unrecorded"  # a fingerprint's field: {field: the value an output that did not
# record that field was made with}
KEYS = "keys"  # a string id column's dataset where its own name cannot be one (key_column)
OWN_NAMES = frozenset({"ids", "errors", "resume", "attrs"})  # datasets and keys an output uses


def key_column(id_column: str) -> str:
    """The output dataset holding a string id column's keys: the column's own name (a user's
    ``doc_id`` comes back as ``doc_id``), or KEYS where that name is one the output uses itself
    or cannot name an HDF5 dataset (a '/' in it, a leading '.')."""
    if id_column in OWN_NAMES or "/" in id_column or id_column.startswith(".") or not id_column:
        return KEYS
    return id_column


def null_texts(records: list, where: Callable[[int], str], positions: Any = None) -> None:
    """Each null text in a slice's ``records`` made a BadRecord: it goes to ``errors/`` from the
    reader (``where(k)`` names the k-th record), not to a worker. Without ``positions`` it is
    known by its id (its own: a resumed run counts it done, and skips a row group holding it)."""
    if None in records:
        for k in [k for k, record in enumerate(records) if record is None]:
            records[k] = BadRecord("ValueError", f"{where(k)}: the text is null",
                                   -1 if positions is None else int(positions[k]))


class Rows:
    """Records a worker reads itself: those at ``ids`` (positions) of the source ``opener``
    opens, a small picklable object with ``read(ids) -> list`` (the records, BadRecords for
    those it cannot decode). Sliced and joined like the list of records it stands for, so a
    workunit of Rows is cut, joined, retried and split like any other. An opener that knows
    much of its source (a JSON-lines file's line starts) may define ``narrowed(ids)``: itself with
    only what reading ``ids`` takes, which is what a Rows pickles."""

    __slots__ = ("opener", "ids")

    def __init__(self, opener: Any, ids: np.ndarray) -> None:
        self.opener, self.ids = opener, ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, part: slice) -> Rows:
        if not isinstance(part, slice):
            raise TypeError("Rows: a worker reads the records (Rows.read); slice them here")
        return Rows(self.opener, self.ids[part])

    def __add__(self, other: Any) -> Rows:
        if isinstance(other, list) and not other:
            return self
        if not isinstance(other, Rows) or other.opener != self.opener:
            return NotImplemented
        return Rows(self.opener, np.concatenate([self.ids, other.ids]))

    __radd__ = __add__  # ([] + rows: the reader's empty start)

    def __getstate__(self) -> tuple:
        narrowed = getattr(self.opener, "narrowed", None)
        return self.opener if narrowed is None else narrowed(self.ids), packed(self.ids)

    def __setstate__(self, state: tuple) -> None:
        self.opener, self.ids = state[0], unpacked(state[1])

    def read(self) -> list:
        return self.opener.read(self.ids)


_CLOSERS: list[Callable[[], None]] = []  # (``holds_inputs``)


def holds_inputs(close: Callable[[], None]) -> Callable[[], None]:
    """Register ``close``, which closes the inputs a Rows opener's module keeps open in this
    process between workunits (a decorator)."""
    _CLOSERS.append(close)
    return close


def close_inputs() -> None:
    """Close every input Rows openers hold open in this process: a thread pool's end (its
    workers' files are the driver process's; a worker process's close with it)."""
    for close in _CLOSERS:
        close()


ROWS_SLICE = 65536  # ids per slice of Rows (nothing read: a slice costs its ids, 8 bytes each)


def positions(opener: Any, end: int, skip: Any) -> Iterator[tuple[np.ndarray, Rows]]:
    """A source's ``rows``: positions ``0 .. end - 1`` as ``(ids, Rows)`` ROWS_SLICE at a time,
    those in ``skip`` (IdRanges: what a resumed run has done) left out."""
    for start in range(0, end, ROWS_SLICE):
        stop = min(start + ROWS_SLICE, end)
        if skip.runs and skip.covers(start, stop):
            continue
        ids = np.arange(start, stop, dtype=np.int64)
        if skip.runs:
            ids = ids[~skip.contains(ids)]
        yield ids, Rows(opener, ids)


def decoded(raw: bytes | str, position: int, what: str = "record") -> str | BadRecord:
    """``raw`` as text, or the BadRecord saying that ``what`` is not valid UTF-8."""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadRecord("UnicodeDecodeError", f"{what} is not valid UTF-8: {exc}", position)


@runtime_checkable
class Workload(Protocol):
    """What the pipeline needs of a workload (see the module docstring for the call order)."""

    name: str
    requires_hardware: bool  # False: device strings are only labels (the synthetic workload)

    def load(self, device: str, threads: int) -> Any:
        """Load the model on ``device``; return it. ``threads``: the worker's share of this
        machine's cores (PoolSettings.worker): on the CPU, its model's threads; beside a card,
        whose compute is the card's, the cores for its work around the card (tokenizing,
        collating), not threads to compute with."""

    def outputs(self, model: Any) -> dict[str, OutputSpec]:
        """Declare the output datasets, given the loaded model."""

    def check_record(self, record: Any) -> None:
        """Raise TypeError or ValueError if ``record`` cannot be processed."""

    # Optional: ``prepare(record) -> Any`` runs in the worker after check_record and turns a record
    # into what ``process`` takes (an image path into pixels); any exception it raises rejects
    # that record alone. ``check_devices(devices)`` runs in the driver before any worker starts
    # and raises ValueError naming a device the workload cannot run on.

    def process(self, model: Any, records: list[Any]) -> dict[str, np.ndarray]:
        """Run the model over ``records``; each array has one row per record, in order."""

    def attrs(self) -> dict[str, Any]:
        """Provenance written to the output file (model, batch size, ...)."""


@runtime_checkable
class Source(Protocol):
    """What the pipeline needs of a record source (helpers.engine.inputs.sources,
    helpers.engine.inputs.tables): a new format is one class with ``describe`` and one way to give
    its records:

    - ``slices(skip: IdRanges, limit: int | None)``: ``(ids, records)`` or ``(ids, records,
      carried)`` a slice at a time, int64 ids checked by the source (unusable or repeated ones as
      BadRecords under NO_ID), the first ``limit`` records only, and records whose ids are in
      ``skip`` (what a resumed run has done) dropped, best before they are read or decoded;
      ``carried``: ``{name: array}`` row-aligned with ``ids``, the source's own columns for the
      output (a string key column: ``keys``), declared by ``carried() -> dict[str, OutputSpec]``;
    - or ``items()``: ``(position, id, record)`` triples; the reader checks the ids (int64,
      each once) a slice at a time and skips done ones (the whole source is read);
    - or iteration over ``(id, record)`` pairs, checked like ``items``.

    Optional: ``rows(skip, limit)``, for a source every worker can open by itself (a file on
    storage they share): ``(ids, Rows)`` or ``(ids, Rows, carried)`` like ``slices``, ids that
    are positions, made from the source's layout and its carried columns alone (a slice of
    BadRecords for rows those rule out); with ``writes="workers"`` each worker reads its
    workunit's records itself (``Rows.read``), so the driver handles no record at all (a source
    whose options rule that out this time says ``positional = False``: a table whose ids are an
    integer column, say). ``Rows.read`` gives a record it cannot decode as a BadRecord at its
    position; whatever it raises is the input's fault (gone, cut short, changed since the driver
    looked), and stops the run.
    ``__len__`` (records, for the progress bar's total and ``tune``'s estimate),
    ``where(position) -> str`` (how a message names a record's id), ``fingerprint() -> dict``
    (what a resumed run must read again; else ``describe()``). A record the source cannot decode
    is a ``BadRecord`` carrying its position: it goes to ``errors/`` and costs no other record.
    What is wrong with the source as a whole raises ``SourceError`` (a ValueError) when it is
    opened, before any worker starts."""

    def describe(self) -> str:
        """What the source is, for the output's attrs (``parquet:corpus/#text``)."""
