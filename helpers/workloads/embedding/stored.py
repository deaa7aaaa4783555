"""How an embedding is stored: its precision on disk (``EmbeddingWorkload(stored=...)``), as
sentence-transformers' ``encode(precision=...)`` and ``quantize_embeddings`` name and compute it.

- ``float32``: as the model gives it (4 bytes a dimension);
- ``float16``: half (2 bytes; cosines within about 1e-4 of float32's);
- ``int8`` / ``uint8``: each dimension cut into 256 steps between a low and a high value, the
  calibration ``ranges`` (a ``(2, dim)`` array: the least and the greatest value each dimension
  took on a sample, ``calibration_ranges``). Every row of one output is cut with the same
  ranges, which its attributes keep, so a later run, a resume or a reader cuts or reads them
  alike (``encode(precision="int8")`` computes them from each call's own texts instead);
- ``binary`` / ``ubinary``: one bit a dimension (> 0), packed eight to a byte (``int8``: the
  packed byte less 128, ``uint8``: the byte as is): 32x smaller than float32.

The bytes are those of sentence-transformers 6's ``quantize_embeddings`` (tests compare them),
computed here so that every version gives the same: older ones neither clip a value outside the
ranges (a row after the calibration sample's may be; it would wrap around) nor round as 6 does.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from helpers.engine.contract.protocol import OutputSpec

STORED = ("float32", "float16", "int8", "uint8", "binary", "ubinary")
CALIBRATED = ("int8", "uint8")  # the forms that need calibration ranges
MOST_CALIBRATED = 8_000  # dimensions whose ranges an HDF5 attribute holds (64 KiB, float32)


def stored_spec(stored: str, dim: int) -> OutputSpec:
    """The output dataset of ``dim``-dimensional embeddings stored as ``stored``."""
    if stored in ("binary", "ubinary"):
        return OutputSpec(((dim + 7) // 8,), "int8" if stored == "binary" else "uint8")
    return OutputSpec((dim,), {"int8": "int8", "uint8": "uint8"}.get(stored, stored))


def check_stored(stored: Any, ranges: Any) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """``ranges`` as the workload keeps them (two tuples of floats; None where ``stored`` takes
    none); ValueError naming what is wrong with the pair."""
    if stored not in STORED:
        raise ValueError(f"stored: expected one of {', '.join(STORED)}, got {stored!r}")
    if stored not in CALIBRATED:
        if ranges is not None:
            raise ValueError(f"ranges: calibration ranges are for stored='int8' or 'uint8' "
                             f"(stored={stored!r} takes none)")
        return None
    if ranges is None:
        raise ValueError(f"stored={stored!r}: needs the calibration ranges every row is cut "
                         f"with: ranges=helpers.calibration_ranges(sample of the texts, "
                         f"...) (the command line computes them from the input's first rows)")
    try:
        array = np.asarray(ranges, dtype=np.float64)
    except (TypeError, ValueError):
        array = np.empty(0)
    if array.ndim != 2 or array.shape[0] != 2 or array.shape[1] < 1 \
            or not np.isfinite(array).all() or (array[0] > array[1]).any():
        raise ValueError(f"ranges: expected a (2, dim) array of finite numbers, each "
                         f"dimension's low then high (low <= high), got "
                         f"{np.shape(ranges) if array.size else repr(ranges)[:80]}")
    if array.shape[1] > MOST_CALIBRATED:
        raise ValueError(f"stored={stored!r}: the ranges of {array.shape[1]:,} dimensions are "
                         f"more than an output's attribute holds ({MOST_CALIBRATED:,}); "
                         f"truncate_dim, or stored='float16' or 'binary'")
    return tuple(map(float, array[0])), tuple(map(float, array[1]))


def stored_form(embeddings: np.ndarray, stored: str,
                ranges: Sequence[Sequence[float]] | None = None) -> np.ndarray:
    """float32 ``embeddings`` ``[n, dim]`` as ``stored`` (see the module)."""
    if stored == "float32":
        return np.asarray(embeddings, dtype=np.float32)
    array = np.asarray(embeddings, dtype=np.float32)
    if stored == "float16":
        return array.astype(np.float16)
    if stored in ("binary", "ubinary"):
        packed = np.packbits(array > 0, axis=-1)
        return packed if stored == "ubinary" else (packed.astype(np.int16) - 128).astype(np.int8)
    if stored not in CALIBRATED or ranges is None:
        raise ValueError(f"stored={stored!r}: expected one of {', '.join(STORED)}, with ranges "
                         f"for {' and '.join(CALIBRATED)}")
    low, high = np.asarray(ranges, dtype=np.float32)
    steps = (high - low) / 255
    steps = np.where(steps == 0, 1, steps)
    cut = np.clip(np.floor((array - low) / steps), 0, 255)
    return cut.astype(np.uint8) if stored == "uint8" else (cut - 128).astype(np.int8)


def calibration_ranges(embeddings: np.ndarray) -> np.ndarray:
    """The ``(2, dim)`` ranges int8 and uint8 are cut with, from float32 ``embeddings`` of a
    sample: each dimension's least and greatest value (sentence-transformers' rule)."""
    array = np.asarray(embeddings, dtype=np.float32)
    if array.ndim != 2 or len(array) < 2:
        raise ValueError(f"calibration: needs the embeddings of two texts or more (a "
                         f"sample of the input: 1,000 texts or more is better), got "
                         f"{len(array) if array.ndim == 2 else 'an array of shape'} "
                         f"{'' if array.ndim == 2 else array.shape}".rstrip())
    return np.vstack((array.min(axis=0), array.max(axis=0)))
