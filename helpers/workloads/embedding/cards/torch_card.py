"""The torch card: a SentenceTransformer's own modules on its device, fed batches of ids.

What ``encode`` runs after its tokenizer, and no more: the model's ``forward`` over the modules
(transformer, pooling, dense, normalize), then ``truncate_dim`` and ``normalize`` as ``encode``
applies them (cut, then normalized). The vectors are ``encode``'s (tests/test_torch_card.py:
cosine >= 0.9999 in float32; the batches differ, so the padding does, not the rows).

On CUDA the transfers overlap the forward pass (as ``DataLoader(pin_memory=True)`` with
``non_blocking`` copies): the feeder collates each batch straight into a pinned host buffer of
a small ring (``STAGING_SLOTS``; a slot is reused once its copy is done), the copy to the device
runs on a stream of its own, which the forward's stream waits for by an event, so the copy of
batch n+1 runs while batch n computes; the rows come back into pinned memory without blocking,
and ``collect`` waits for their event only. Per calling thread (the thread backend's workers
share one model): each has its own ring; the card's one copy stream, made with it (and its
graphs' side stream just after), serves them all: torch hands out streams from a pool of 32 in
turn, so a stream made per thread could, past 32, be the very stream the card's graphs capture
on, the copies of another thread joining a graph. On a CPU the same path runs without streams
or pinning, and ``submit`` computes the batch before it returns. With ``graphs`` (CUDA only),
each batch's pass is replayed from a CUDA graph of its padded shape, one launch instead of a
kernel's each (helpers.workloads.embedding.cards.graphs). With ``unpadded``, the transformer
runs on the batch's real tokens alone (helpers.workloads.embedding.cards.unpadded), the other
modules on its rows as they are.

The few CUDA calls are in ``CudaCalls`` so that tests can fake them (CI has no GPU).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from helpers.workloads.embedding.cards import host_staging

STAGING_SLOTS = 4  # pinned buffers a thread collates into in turn: the copies in flight at most
KNOWN_MODULES = ("Transformer", "Pooling", "Normalize", "Dense")  # what the card runs as encode
# does, sentence-transformers' own classes, not subclasses (any other module: the model runs
# through encode, which knows it)
TASK_SETTINGS = ("query_length", "document_length", "query_expansion")  # a transformer's
# settings that encode applies by task, which the feeder does not


def known_types() -> dict[str, type]:
    """sentence-transformers' classes of KNOWN_MODULES, by name."""
    from sentence_transformers import models

    return {name: getattr(models, name) for name in KNOWN_MODULES}


def unsupported(model: Any, prompt: str | None, task: str | None) -> str | None:
    """Why the torch card cannot run ``model`` as ``encode`` would (None: it can): a module it
    does not know (a Router, an image or multimodal model's, a subclass of a known one), a
    transformer whose tokenizing sentence-transformers changes (its own processing settings,
    lengths or expansion by task, a generative task's padding), a tokenizer with no Rust one,
    a prompt its pooling leaves out (``include_prompt=False``)."""
    known = known_types()
    names = [type(module).__name__ for module in model]
    unknown = [name for module, name in zip(model, names)
               if type(module) is not known.get(name)]
    if unknown:
        return (f"its modules {names} include {unknown}, which the feeder does not run"
                f"{' (it routes by task)' if 'Router' in unknown else ''}")
    if names[0] != "Transformer":
        return f"its first module is {names[0]}, not a Transformer"
    first = model[0]
    modalities = set(getattr(first, "modality_config", None) or {"text"})
    if modalities != {"text"}:
        return f"its transformer reads {sorted(modalities)}, not text alone"
    if getattr(first, "processing_kwargs", None):
        return (f"its transformer sets its tokenizer's arguments itself "
                f"({first.processing_kwargs!r})")
    if task is not None and any(getattr(first, name, None) is not None
                                for name in TASK_SETTINGS):
        return f"its transformer tokenizes by task ({task!r}: {', '.join(TASK_SETTINGS)})"
    if getattr(first, "transformer_task", "feature-extraction") != "feature-extraction":
        return f"its transformer's task is {first.transformer_task!r}, not feature-extraction"
    if getattr(getattr(model, "tokenizer", None), "backend_tokenizer", None) is None:
        return "its tokenizer has no Rust tokenizer (not a 'fast' tokenizer)"
    if prompt and any(getattr(module, "include_prompt", True) is False for module in model):
        return "its pooling leaves the prompt's tokens out (include_prompt=False)"
    return None


def input_names(model: Any) -> tuple[str, ...]:
    """The features the model's tokenizer gives besides ids and mask (``token_type_ids``:
    zeros for one text a row, as the tokenizer's own)."""
    names = getattr(getattr(model, "tokenizer", None), "model_input_names", None) or ()
    return tuple(name for name in names if name == "token_type_ids")


class CudaCalls:
    """The CUDA calls the card makes (streams, events, pinned buffers), in one place."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch, self.device = torch, torch.device(device)

    def stream(self) -> Any:
        return self.torch.cuda.Stream(self.device)

    def current(self) -> Any:
        return self.torch.cuda.current_stream(self.device)

    def event(self) -> Any:
        """An event whose ``synchronize`` sleeps (``cudaEventBlockingSync``): a default one
        spins a core while a worker waits for its rows, a core its tokenizing processes
        need."""
        return self.torch.cuda.Event(blocking=True)

    def pinned(self, size: int, dtype: Any) -> Any:
        return self.torch.empty(size, dtype=dtype, pin_memory=True)

    def use(self, stream: Any) -> Any:
        return self.torch.cuda.stream(stream)

    def graph(self) -> Any:
        return self.torch.cuda.CUDAGraph()

    def pool(self) -> Any:
        return self.torch.cuda.graph_pool_handle()

    def capture(self, graph: Any, forward: Callable[[], Any], pool: Any, stream: Any) -> Any:
        """``forward()`` captured into ``graph`` on ``stream`` (the caller makes it the only
        capture under way); its output (static). ``torch.cuda.graph`` would also synchronize the
        device and empty the caches first, stalling every worker's batches. A capture that
        fails leaves the allocator as it found it (``_end_pool``)."""
        with self.torch.cuda.stream(stream):
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                out = forward()
            except BaseException:
                with contextlib.suppress(Exception):  # (a capture the error invalidated)
                    graph.capture_end()
                self._end_pool(pool)
                raise
            try:
                graph.capture_end()
            except BaseException:
                self._end_pool(pool)
                raise
        return out

    def _end_pool(self, pool: Any) -> None:
        """Tell the caching allocator that the capture into ``pool`` is over, after a failed
        one: torch releases whose ``capture_end`` raises on CUDA's error before telling it (as
        ``torch.cuda.graph`` would, too) leave it routing this device's allocations to the
        pool, never reusing memory freed after ``record_stream``, and tripping an assertion at
        every later ``empty_cache()`` (the engine's, after an out-of-memory error). Where
        ``capture_end`` told it already, the allocator refuses, and that is ignored."""
        torch = self.torch
        index = self.device.index if self.device.index is not None \
            else torch.cuda.current_device()
        with contextlib.suppress(Exception):
            torch._C._cuda_endAllocateToPool(index, pool)  # (torch.cuda.use_mem_pool's call;
            # not the pool's release: the graph's own teardown releases it)


@dataclass
class _Slot:
    """A pinned staging buffer (ids and mask, flat) and the event of its last copy."""

    ids: Any
    mask: Any
    copied: Any = None


@dataclass
class TorchTicket:
    """A submitted batch: its rows (on a CPU, already computed; on CUDA, a pinned buffer
    filled without blocking) and the event ``collect`` waits for (CUDA)."""

    rows: Any
    done: Any = None
    busy_s: None = None  # (the card's own time is not measured here)
    tokens: int | None = None  # the tokens computed, where a graph's bucket padded the batch


class TorchCard:
    """The torch card (the module docstring). ``model``: a SentenceTransformer on ``device``,
    its weights in the precision it runs in; ``normalize`` and ``truncate_dim``: as ``encode``'s;
    ``pinned``: on CUDA, staging in pinned memory (False: pageable arrays, each copy blocking);
    ``half_rows``: on CUDA, rows come back in float16 (the output stores float16: half the
    bytes copied; the same values as casting on the host); ``graphs``: on CUDA, each batch's
    pass replayed from a CUDA graph of its bucket (``cards.graphs``: batches of at most
    ``batch_size`` texts); ``unpadded``: the transformer over the real tokens alone
    (``cards.unpadded``; ValueError where it cannot run the model, or with graphs, whose
    shapes are the padded batch's); ``cuda``: the CUDA calls (tests give a fake)."""

    def __init__(self, model: Any, device: str, normalize: bool = False,
                 truncate_dim: int | None = None, label: str | None = None,
                 pinned: bool = True, half_rows: bool = False, graphs: bool = False,
                 batch_size: int = 32, cuda: Any = None, unpadded: bool = False) -> None:
        import torch

        self.torch, self.model = torch, model.eval()  # (dropout off, as encode's own call)
        self.device = torch.device(device)
        self.normalize, self.truncate_dim = normalize, truncate_dim
        self.extra = input_names(model)
        get_dim = getattr(model, "get_embedding_dimension", None) \
            or model.get_sentence_embedding_dimension
        self.dim = int(truncate_dim or get_dim())
        self.asynchronous = self.device.type == "cuda"
        self.cuda = (cuda or CudaCalls(self.device)) if self.asynchronous else None
        self._copies = self.cuda.stream() if self.cuda is not None else None  # (every
        # thread's copies: the module docstring)
        self.pinned, self.half_rows = pinned, half_rows
        self.label = label or f"torch on {device}"
        self._local = threading.local()
        self.unpadded = None
        if unpadded:
            from helpers.workloads.embedding.cards.unpadded import UnpaddedBert
            from helpers.workloads.embedding.cards.unpadded import unsupported as why_not

            why = "CUDA graphs replay the padded batch's shapes" if graphs else \
                why_not(model, str(self.device))
            if why is not None:
                raise ValueError(f"unpadded: {why}")
            self.unpadded = UnpaddedBert(model[0].auto_model, str(self.device))
            self.label += " (unpadded)"
        self.graphs = None
        if graphs:
            if self.cuda is None:
                raise ValueError(f"graphs: CUDA graphs replay CUDA kernels; the device is "
                                 f"{device}")
            from helpers.workloads.embedding.cards.graphs import CardGraphs

            pad = getattr(getattr(model, "tokenizer", None), "pad_token_id", None)
            self.graphs = CardGraphs(lambda ids, mask: self._forward(self._features(ids, mask)),
                                     batch_size, int(model.max_seq_length), int(pad or 0),
                                     self.cuda)
            self.label += " (CUDA graphs)"

    def _thread(self) -> Any:
        """This thread's staging ring (CUDA)."""
        local = self._local
        if not hasattr(local, "ring"):
            local.ring, local.turn, local.staged = [], 0, None
        return local

    def staging(self, texts: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """Host arrays to collate a batch into: on CUDA, views of the next pinned slot of this
        thread's ring (once the copy that last used it is done)."""
        if self.cuda is None or not self.pinned:
            return host_staging(texts, tokens)
        local, size = self._thread(), texts * tokens
        if len(local.ring) < STAGING_SLOTS:
            local.ring.append(_Slot(None, None))
        slot = local.ring[local.turn % len(local.ring)]
        local.turn += 1
        if slot.copied is not None:
            slot.copied.synchronize()  # (its last batch is on the device by now, mostly)
        if slot.ids is None or slot.ids.numel() < size:
            grown = max(size, 2 * (slot.ids.numel() if slot.ids is not None else 0))
            slot.ids = self.cuda.pinned(grown, self.torch.int64)
            slot.mask = self.cuda.pinned(grown, self.torch.int64)
        local.staged = (slot, texts, tokens)
        return (slot.ids[:size].numpy().reshape(texts, tokens),
                slot.mask[:size].numpy().reshape(texts, tokens))

    def submit(self, ids: np.ndarray, mask: np.ndarray) -> TorchTicket:
        """Launch the batch (on a CPU: compute it)."""
        torch = self.torch
        with torch.inference_mode():
            if self.cuda is None:
                features = self._features(torch.from_numpy(ids), torch.from_numpy(mask))
                rows = self._forward(features, mask)
                return TorchTicket(rows.float().numpy() if rows.dtype != torch.float16
                                   else rows.numpy(),
                                   tokens=int(mask.sum()) if self.unpadded is not None else None)
            return self._submit_cuda(ids, mask)

    def _submit_cuda(self, ids: np.ndarray, mask: np.ndarray) -> TorchTicket:
        torch, cuda, local = self.torch, self.cuda, self._thread()
        staged, local.staged = local.staged, None
        if staged is None or staged[0].ids[:ids.size].numpy().ctypes.data != ids.ctypes.data:
            on_device = [torch.from_numpy(ids).to(self.device),  # (pageable: blocking)
                         torch.from_numpy(mask).to(self.device)]
        else:
            slot, texts, tokens = staged
            size, compute = texts * tokens, cuda.current()
            with cuda.use(self._copies):
                on_device = [slot.ids[:size].view(texts, tokens).to(self.device,
                                                                    non_blocking=True),
                             slot.mask[:size].view(texts, tokens).to(self.device,
                                                                     non_blocking=True)]
                slot.copied = cuda.event()
                slot.copied.record(self._copies)
            compute.wait_event(slot.copied)
            for tensor in on_device:
                tensor.record_stream(compute)  # (allocated on the copy stream, used here)
        compute = cuda.current()
        rows, tokens = self.compute(*on_device, host_mask=mask)
        if rows.dtype not in (torch.float16, torch.float32):
            rows = rows.float()  # (bfloat16: NumPy has none; float32 holds it exactly)
        if self.half_rows:
            rows = rows.half()  # (round to nearest even, as NumPy's cast on the host)
        host = cuda.pinned(rows.numel(), rows.dtype).view(rows.shape)
        host.copy_(rows, non_blocking=True)
        done = cuda.event()
        done.record(compute)
        return TorchTicket(host, done, tokens=tokens)

    def capture_ahead(self) -> None:
        """With graphs, capture the full batches' buckets now (``CardGraphs.capture_ahead``: in
        the worker's load)."""
        if self.graphs is not None:
            torch = self.torch
            with torch.inference_mode():
                self.graphs.capture_ahead(torch.zeros((1, 1), dtype=torch.int64).to(self.device))

    def compute(self, ids: Any, mask: Any, host_mask: np.ndarray | None = None
                ) -> tuple[Any, int]:
        """The rows of a batch already on the card (on the current stream: replayed from its
        bucket's graph, or launched eager), and the tokens computed for them (``host_mask``:
        the mask on the host, where the unpadded pass reads the texts' spans; None: read back
        from the device)."""
        if self.graphs is not None:
            return self.graphs.run(ids, mask)
        if self.unpadded is not None:
            host_mask = mask.cpu().numpy() if host_mask is None else host_mask
            return self._forward(self._features(ids, mask), host_mask), int(host_mask.sum())
        return self._forward(self._features(ids, mask)), int(ids.numel())

    def _features(self, ids: Any, mask: Any) -> dict[str, Any]:
        features = {"input_ids": ids, "attention_mask": mask}
        for name in self.extra:
            features[name] = self.torch.zeros_like(ids)
        return features

    def _forward(self, features: dict[str, Any], host_mask: np.ndarray | None = None) -> Any:
        """The model's modules, then ``truncate_dim`` and ``normalize`` (as ``encode``); with
        ``unpadded``, its transformer's token embeddings from the real tokens alone
        (``host_mask``: the batch's mask on the host), the other modules as they are."""
        if self.unpadded is not None:
            features["token_embeddings"] = self.unpadded(
                features["input_ids"], features["attention_mask"], host_mask)
            for module in list(self.model)[1:]:
                features = module(features)
            rows = features["sentence_embedding"]
        else:
            rows = self.model(features)["sentence_embedding"]
        if self.truncate_dim is not None:
            rows = rows[..., :self.truncate_dim]
        if self.normalize:
            rows = self.torch.nn.functional.normalize(rows, p=2, dim=1)
        return rows

    def collect(self, tickets: list[TorchTicket]) -> list[np.ndarray]:
        """Each batch's rows (float32, or float16 where the model computes in it), once the
        card is done with it."""
        rows = []
        for ticket in tickets:
            if ticket.done is not None:
                ticket.done.synchronize()
                rows.append(ticket.rows.numpy())
            else:
                rows.append(ticket.rows)
        return rows
