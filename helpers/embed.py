"""``embed(texts)``: embeddings as an array, in input order, for a user who wants an array and not
a file; the shape of sentence-transformers' ``encode``.

Underneath it is an ordinary run (``run_pipeline`` into a temporary output, removed afterwards):
the same workers, devices, retries and checks, and ``encode``'s options (prompt, prompt_name,
task, max_seq_length, truncate_dim, and ``stored`` for its ``precision``) giving ``encode``'s
vectors. ``embed([])`` is a ``(0, dim)`` array. A text the model cannot take (not a string, too
long, or empty or blank: gpufeed refuses those everywhere, where ``encode`` would embed the
special tokens alone, a vector that matches nothing in particular) raises ValueError naming each
such text's index, after the run: the others were done, but an array with holes in it would be
worse than none.
"""
from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.contract.settings import PoolSettings
from helpers.engine.outputs.hdf5_sink import read_output
from helpers.engine.pipeline import run_pipeline
from helpers.workloads.embedding import EmbeddingWorkload
from helpers.workloads.embedding.stored import CALIBRATED, stored_form
from helpers.workloads.embedding.stored import calibration_ranges as ranges_of

SHOWN_ERRORS = 5  # failed texts named in the message


ENCODE_OPTIONS = ("prompt", "prompt_name", "task", "max_seq_length", "truncate_dim", "stored",
                  "ranges")  # EmbeddingWorkload's fields that embed passes on


def embed(texts: str | Sequence[str] | Iterable[str], model: str | None = None,
          devices: Iterable[str] | str = PoolSettings.devices, batch_size: int = 32,
          normalize: bool = False, backend: str = "process", **options: Any) -> np.ndarray:
    """``texts`` embedded on ``devices`` (one entry per worker, as in run_pipeline; "auto": every
    GPU here, else MPS, else the CPU, as encode picks its device): an array of
    ``(len(texts), dim)`` in the order given, of ``stored``'s dtype (float32 by default); one
    text gives one vector, no texts a ``(0, dim)`` array. ``model``: a sentence-transformers
    name or path (None: the embedded all-MiniLM-L6-v2). ``options``: EmbeddingWorkload's
    ``prompt``, ``prompt_name``, ``task``, ``max_seq_length``, ``truncate_dim``, ``stored``
    and ``ranges`` (stored int8 or uint8 without ranges: calibrated on ``texts`` themselves, as
    ``encode(precision="int8")`` does), then run_pipeline's (workunit_size, workers_per_device,
    threads_per_worker, ...)."""
    one = isinstance(texts, str)
    pairs = list(enumerate([texts] if one else texts))
    encoding = {k: options.pop(k) for k in ENCODE_OPTIONS if k in options}
    stored = encoding.get("stored", "float32")
    if stored in CALIBRATED and encoding.get("ranges") is None:  # float32 first, then cut
        encoding["stored"] = "float32"  # with the ranges of these very embeddings
    workload = EmbeddingWorkload(model=model, batch_size=batch_size, normalize=normalize,
                                 **encoding)
    embeddings = _embedded(pairs, workload, devices, backend, options)
    if stored != workload.stored:
        embeddings = stored_form(embeddings, stored, ranges_of(embeddings)) if len(embeddings) \
            else stored_form(embeddings, stored, np.zeros((2, embeddings.shape[1])))
    return embeddings[0] if one else embeddings


def calibration_ranges(texts: Sequence[str], model: str | None = None,
                       devices: Iterable[str] | str = PoolSettings.devices, batch_size: int = 32,
                       normalize: bool = False, backend: str = "process",
                       **options: Any) -> np.ndarray:
    """The ``(2, dim)`` ranges stored int8 and uint8 are cut with (``EmbeddingWorkload(
    stored="int8", ranges=...)``): each dimension's least and greatest value over the float32
    embeddings of ``texts``, a sample of the input (1,000 texts or more; the command line
    takes the input's first ``--calibration-rows``), with the same encode options as the run
    (``prompt``, ``truncate_dim``, ...; ``normalize``)."""
    options.pop("stored", None), options.pop("ranges", None)
    return ranges_of(embed(list(texts), model, devices, batch_size, normalize, backend,
                           **options))


def _embedded(pairs: list[tuple[int, str]], workload: EmbeddingWorkload, devices: Any,
              backend: str, options: dict[str, Any]) -> np.ndarray:
    """The run under ``embed``: ``pairs``' embeddings in their order."""
    options.setdefault("progress", False)
    with tempfile.TemporaryDirectory(prefix="gpufeed-embed-") as folder:
        output = Path(folder) / "embeddings.h5"
        run_pipeline(pairs, workload, devices, output=output, backend=backend, **options)
        data = read_output(output)
    if data["errors"]:
        errors = sorted(data["errors"], key=lambda e: e["id"] if e["id"] is not None else -1)
        shown = "; ".join(f"texts[{e['id']}]: {e['type']}: {e['message']}"
                          for e in errors[:SHOWN_ERRORS])
        more = len(errors) - SHOWN_ERRORS
        raise ValueError(f"{len(errors)} of {len(pairs)} texts could not be embedded: {shown}"
                         + (f" (and {more} more)" if more > 0 else ""))
    return data["embeddings"]  # read_output sorts by id: the input order
