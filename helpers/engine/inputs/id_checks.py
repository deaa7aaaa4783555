"""Checking a slice's ids: usable (int64, NO_ID aside), each once in the input, done ones dropped.

Every source's ids pass here a slice at a time, vectorised where the ids allow: integer ids
(``checked_ids`` for Python values, ``integer_ids`` for an Arrow column), string keys
(``key_problems``: null, NUL-holding or repeated), then ``screen`` (repeats of ids, positions for
bad records, done ids dropped). A record whose id is unusable becomes a BadRecord: it goes to
``errors/`` and costs no other record.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from helpers.engine.contract.id_ranges import IdRanges, SeenIds
from helpers.engine.contract.protocol import NO_ID, BadRecord, id_problem

REPEAT = "appeared earlier in the input; this record is not processed"


def id_record(problem: str, where: str, position: int) -> BadRecord:
    """The BadRecord of a record whose id or key has ``problem`` (a repeat: DuplicateId);
    ``where`` names the record and its id field."""
    return BadRecord("DuplicateId" if problem.endswith(REPEAT) else "ValueError",
                     f"{where} {problem}", position)


def checked_ids(raw: tuple, records: list, positions: tuple, where: Callable[[int], str]
                ) -> np.ndarray:
    """A slice's ids as int64; a record whose id is unusable becomes a BadRecord (in
    ``records``) under NO_ID. Plain ints inside int64, the usual case, cost one array."""
    if all(type(i) is int for i in raw):
        try:
            ids = np.array(raw, dtype=np.int64)
        except OverflowError:
            pass
        else:
            if not (ids == NO_ID).any():
                return ids
    ids = np.empty(len(raw), dtype=np.int64)
    for k, record_id in enumerate(raw):
        problem = id_problem(record_id)
        if problem:
            ids[k] = NO_ID
            if not isinstance(records[k], BadRecord):  # (one already, a line not JSON: kept)
                records[k] = BadRecord("ValueError", f"{where(positions[k])} {problem}",
                                       positions[k])
        else:
            ids[k] = int(record_id)
    return ids


def screen(ids: np.ndarray, records: list, positions: np.ndarray, seen: SeenIds | None,
            skip: IdRanges) -> tuple[np.ndarray, list, np.ndarray] | None:
    """A slice's checked ids further screened: an id ``seen`` earlier (done or not) makes its
    record a BadRecord, bad records get their positions, done ids are dropped (bad records are
    kept: known by their position). ``(ids, records, kept mask)``, or None if nothing is left."""
    if seen is not None:
        usable = ids != NO_ID
        again = np.zeros(len(ids), dtype=bool)
        again[usable] = seen.add(ids[usable])
        for k in np.flatnonzero(again).tolist():
            records[k] = BadRecord("DuplicateId", f"id {ids[k]} {REPEAT}", int(positions[k]))
    bad = [k for k, record in enumerate(records) if isinstance(record, BadRecord)]
    for k in bad:
        if records[k].position < 0:  # a BadRecord of the caller's own
            records[k] = replace(records[k], position=int(positions[k]))
    keep = np.ones(len(ids), dtype=bool)
    if skip.runs:
        keep = ~skip.contains(ids)
        keep[bad] = True
        if not keep.all():
            ids, records = ids[keep], list(itertools.compress(records, keep))
    return (ids, records, keep) if len(ids) else None


def integer_ids(values: Any, seen: SeenIds) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """A slice's ids from an integer column (or CSV text), and ``(row in slice, problem)`` for
    each unusable one (null, outside int64, not an integer, seen earlier): its id is NO_ID."""
    import pyarrow as pa

    problems = []
    if (pa.types.is_string(values.type) or pa.types.is_binary(values.type)) and \
            values.null_count == 0:  # CSV: read as text, cast here
        try:
            values = values.cast(pa.string()).cast(pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # a value that is not an integer: one at a time below
    if pa.types.is_integer(values.type) and values.null_count == 0 and \
            values.type != pa.uint64():
        ids = np.array(values.to_numpy(zero_copy_only=False), dtype=np.int64)  # a copy to write
    else:
        ids = np.empty(len(values), dtype=np.int64)
        for k, value in enumerate(values.to_pylist()):
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            if isinstance(value, str):
                try:
                    value = int(value)
                except ValueError:
                    pass
            problem = "is null" if value is None else id_problem(value)
            if problem:
                ids[k] = NO_ID
                problems.append((k, problem))
            else:
                ids[k] = value
    if not problems and (ids == NO_ID).any():
        for k in np.flatnonzero(ids == NO_ID).tolist():
            problems.append((k, f"{NO_ID} is outside the ids gpufeed takes"))
            ids[k] = NO_ID
    usable = ids != NO_ID
    again = np.zeros(len(ids), dtype=bool)
    again[usable] = seen.add(ids[usable])
    for k in np.flatnonzero(again).tolist():
        problems.append((k, f"{ids[k]} {REPEAT}"))
        ids[k] = NO_ID
    return ids, problems


def key_problems(keys: list, seen: Any) -> list[tuple[int, str]]:
    """``(row in slice, problem)`` for each null, empty, non-string or NUL-holding key and each
    key seen earlier in the input: by a 64-bit hash of it, in ``seen`` (a SeenValues). An empty
    key is no key, in every format (a CSV's empty field reads as a null, a Parquet's "" would
    otherwise be a key). Two keys whose hashes collide (about N**2 / 2**65: one in 10**5 for
    20 M keys) would file the later as a repeat; Python's str hash, seeded per process, is the
    fastest there is here."""
    if all(map(str.__instancecheck__, keys)) and "\0" not in "".join(keys) \
            and "" not in keys:  # the usual case
        usable, problems = np.ones(len(keys), dtype=bool), []
        hashes = np.fromiter(map(hash, keys), dtype=np.int64, count=len(keys))
    else:
        usable = np.array([type(key) is str and key != "" and "\0" not in key for key in keys],
                          dtype=bool)
        problems = [(k, "is null" if keys[k] is None else "is empty" if keys[k] == "" else
                     f"{keys[k]!r:.60} holds a NUL character, which HDF5 strings cannot"
                     if type(keys[k]) is str else f"is not a string: {keys[k]!r:.60}")
                    for k in np.flatnonzero(~usable).tolist()]
        hashes = np.array([hash(key) if ok else 0 for key, ok in zip(keys, usable)],
                          dtype=np.int64)
    again = np.zeros(len(keys), dtype=bool)
    again[usable] = seen.add(hashes[usable])
    problems += [(k, f"{keys[k]!r:.60} {REPEAT}") for k in np.flatnonzero(again).tolist()]
    return problems
