"""The onnx card: a SentenceTransformer's modules after its tokenizer, exported to ONNX
(helpers.workloads.embedding.runtimes.exported), run by ONNX Runtime's CPU provider on the batches
the feeder collates; ``truncate_dim`` and ``normalize`` as ``encode`` applies them."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from helpers.engine.contract.protocol import needs
from helpers.workloads.embedding.cards import host_staging


class OnnxCard:
    """The onnx card (the module docstring): ``path``, the exported file; ``threads``, ONNX
    Runtime's intra-op threads; ``dim``, the rows' width before ``truncate_dim``."""

    asynchronous = False  # (ONNX Runtime's run returns the rows)

    def __init__(self, path: Path, threads: int, dim: int, normalize: bool = False,
                 truncate_dim: int | None = None, label: str | None = None) -> None:
        ort = needs("onnxruntime", "onnx", "runtime='onnx'")

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.path = path
        self.session = ort.InferenceSession(str(path), options,
                                            providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.normalize, self.truncate_dim = normalize, truncate_dim
        self.dim = int(truncate_dim or dim)
        self.label = label or f"onnx {path.name}"

    def staging(self, texts: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
        return host_staging(texts, tokens)

    def submit(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The batch's rows (computed before this returns: the ticket is the rows)."""
        given = {"input_ids": ids, "attention_mask": mask}
        feed = {name: given[name] if name in given else np.zeros_like(ids)
                for name in self.inputs}  # (token_type_ids: zeros, one text a row)
        rows = self.session.run(None, feed)[0]
        rows = np.ascontiguousarray(rows[:, :self.truncate_dim], dtype=np.float32)
        if self.normalize:
            rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        return rows

    def collect(self, tickets: list[np.ndarray]) -> list[np.ndarray]:
        return list(tickets)
