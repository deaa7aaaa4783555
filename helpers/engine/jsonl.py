"""JSON lines parsed a block at a time with pyarrow, for JSONLSource.

A file is cut into blocks of whole lines (BLOCK_BYTES); pyarrow parses a block's text and id fields
into columns at C speed, other fields ignored. A block pyarrow cannot take whole, or takes in a
way that loses a line's meaning (a line that is blank or not an object, a missing or null text, an
id of another type, invalid UTF-8), is left to the caller's line-at-a-time parser, which says what
is wrong with each line: one bad line costs its block's speed, never a record.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

BLOCK_BYTES = 4 << 20


def blocks(path: Any, limit_lines: int | None = None) -> Iterator[tuple[int, bytes]]:
    """``(first line number, bytes of whole lines)`` through the file; the last line may lack
    its newline."""
    first, rest = 0, b""
    with open(path, "rb") as f:
        while True:
            data = f.read(BLOCK_BYTES)
            if not data:
                break
            data = rest + data
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # one line longer than a block: read on
                rest = data
                continue
            block, rest = data[:cut], data[cut:]
            yield first, block
            first += block.count(b"\n")
            if limit_lines is not None and first >= limit_lines:
                return
    if rest:
        yield first, rest


def parse(block: bytes, text: str, key: str, key_type: str) -> tuple[list, Any] | None:
    """``(texts, ids)`` of every line of ``block``, or None where the caller must parse it a
    line at a time (module docstring). ``key_type`` "int": ``ids`` is ``(int64 array, missing)``,
    ``missing`` a mask of the lines without the id field (None if none); "str": a list of keys,
    None where missing."""
    import pyarrow as pa
    import pyarrow.json as pajson

    lines = block.count(b"\n") + (not block.endswith(b"\n"))
    schema = pa.schema([(text, pa.string()), (key, pa.int64() if key_type == "int"
                                              else pa.string())])
    try:
        table = pajson.read_json(
            pa.py_buffer(block),
            read_options=pajson.ReadOptions(use_threads=False, block_size=len(block) + 1),
            parse_options=pajson.ParseOptions(explicit_schema=schema,
                                              unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != lines or table.column(text).null_count:
        return None  # a blank line (pyarrow skips it), a missing or null text
    texts = table.column(text).to_pylist()
    ids = table.column(key)
    if key_type == "int":
        missing = ids.is_null().to_numpy(zero_copy_only=False) if ids.null_count else None
        return texts, (ids.fill_null(-1).to_numpy(), missing)
    return texts, ids.to_pylist()


def lines_of(block: bytes) -> list[bytes]:
    """The block's lines, as the line-at-a-time parser takes them."""
    return block.split(b"\n")[:block.count(b"\n") + (not block.endswith(b"\n"))]


def fill_missing(ids: np.ndarray, missing: np.ndarray | None, first: int) -> np.ndarray:
    """Ids with each line that has none given its line number (JSONLSource's rule)."""
    if missing is not None:
        ids = ids.copy()
        ids[missing] = first + np.flatnonzero(missing)
    return ids
