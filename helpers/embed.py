"""``embed(texts)``: embeddings as an array, in input order, for a user who wants an array and not
a file; the shape of sentence-transformers' ``encode``.

Underneath it is an ordinary run (``run_pipeline`` into a temporary output, removed afterwards):
the same workers, devices, retries and checks. A text the model cannot take (empty, not a string,
too long) raises ValueError naming each such text's index, after the run: the others were done,
but an array with holes in it would be worse than none.
"""
from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.hdf5_sink import read_output
from helpers.engine.pipeline import run_pipeline
from helpers.workloads.embedding import EmbeddingWorkload

SHOWN_ERRORS = 5  # failed texts named in the message


def embed(texts: str | Sequence[str] | Iterable[str], model: str | None = None,
          devices: Iterable[str] | str = ("cpu",), batch_size: int = 32, normalize: bool = False,
          backend: str = "process", **options: Any) -> np.ndarray:
    """``texts`` embedded on ``devices`` (one entry per worker, as in run_pipeline): an array of
    ``(len(texts), dim)`` float32 in the order given; one text gives one vector. ``model``:
    a sentence-transformers name or path (None: the embedded all-MiniLM-L6-v2). ``options``:
    run_pipeline's (workunit_size, workers_per_device, threads_per_worker, ...)."""
    one = isinstance(texts, str)
    pairs = list(enumerate([texts] if one else texts))
    if not pairs:
        raise ValueError("texts: nothing to embed")
    workload = EmbeddingWorkload(model=model, batch_size=batch_size, normalize=normalize)
    options.setdefault("progress", False)
    options.setdefault("durable", False)  # a temporary file: no resume to prepare for
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
    embeddings = data["embeddings"]  # read_output sorts by id: the input order
    return embeddings[0] if one else embeddings
