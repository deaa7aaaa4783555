"""How an embedding model runs on its device: its precision (float32, bfloat16, float16: the
weights cast, as ``model.half()`` does) and its runtime (PyTorch, or ONNX Runtime in float32 or
with int8 weights), and the quality guard every variant but float32 PyTorch passes before it is
used.

ONNX: the model's modules after the tokenizer (the transformer, pooling, normalising: what
``encode`` runs) are exported once per model into a cache folder (GPUFEED_CACHE, else
``~/.cache/gpufeed``), keyed by a digest of the weights, under a lock: the first worker exports,
the others wait and reuse the file. ``onnx-int8`` quantises the exported file's matrix products
(dynamic quantisation, per-channel int8 weights, QUANTIZED_EXCLUDE left in float: the variant
onnxruntime's defaults give fails the guard, see docs/model.md), into a file of the same folder
named by onnxruntime's version and these settings. The tokenizer stays the model's own.

The guard: the embeddings of GUARD_TEXTS (64 fixed texts, 18 to 935 characters) by the variant
against float32 PyTorch's, in the worker that loads it: mean cosine ≥ GUARD_MEAN and min ≥
GUARD_MIN (``EmbeddingWorkload(guard=...)``), else QualityRefused with the numbers.

Two options of the PyTorch runtime: ``compile`` (``torch.compile`` of the transformer, dynamic
shapes: one graph for every batch size and length; its compilation is paid in the worker's load,
by the guard's first encode) and, on CUDA, pinned host memory for the tokenized batches (copied
to the device without blocking, as ``DataLoader(pin_memory=True)`` does).
"""
from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import json
import os
import tempfile
import threading
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from helpers.engine.contract.protocol import needs

PRECISIONS = ("fp32", "bf16", "fp16")
RUNTIMES = ("torch", "onnx", "onnx-int8")
GUARD_MEAN, GUARD_MIN = 0.99, 0.98
GUARD_TEXTS = Path(__file__).with_name("guard_texts.json")
CACHE_ENV = "GPUFEED_CACHE"
OPSET = 17
QUANTIZED_EXCLUDE: tuple[str, ...] = ()  # node name patterns left in float by onnx-int8
QUANTIZED = {"per_channel": True, "weight_type": "QInt8", "op_types_to_quantize": ["MatMul"]}
# (onnx-int8's settings of quantize_dynamic: with onnxruntime's version and QUANTIZED_EXCLUDE, the
# name of its file in the model's cache folder, so that a change of either makes a new one)


class QualityRefused(ValueError):
    """A variant whose embeddings are too far from float32 PyTorch's (the guard)."""


@dataclass(frozen=True)
class Quality:
    """How close a variant's embeddings of the guard sample are to float32 PyTorch's."""

    mean: float
    min: float
    texts: int

    def passes(self, mean: float, least: float) -> bool:
        return self.mean >= mean and self.min >= least


def cosines(reference: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Row by row cosine similarity of two embedding matrices (float64)."""
    a, b = reference.astype(np.float64), other.astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(norms, 1e-30)


def guard_texts() -> list[str]:
    return json.loads(GUARD_TEXTS.read_text(encoding="utf-8"))


def variant_label(variant: dict[str, Any]) -> str:
    """A variant in words: 'bf16 torch', 'fp32 torch compiled', 'tokenize_threads=2' (options
    set to False unsaid)."""
    words = [str(v) if isinstance(v, str) else f"{k}={v}"
             for k, v in variant.items() if not isinstance(v, bool)]
    return " ".join(words + ["compiled" if k == "compile" else k
                             for k, v in variant.items() if v is True])


def check_variant(precision: str, runtime: str, device: str, hardware: bool = True) -> None:
    """ValueError naming what is wrong with running ``precision`` and ``runtime`` on
    ``device`` (before anything is loaded); ``hardware`` False: not asking the card itself (in
    the driver, which should not open a CUDA context)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime: expected one of {', '.join(RUNTIMES)}, got {runtime!r}")
    cuda = device.startswith("cuda")
    if runtime != "torch":
        if precision != "fp32":
            raise ValueError(f"runtime={runtime!r} runs float32 activations (onnx-int8: int8 "
                             f"weights); precision={precision!r} is for runtime='torch'")
        if cuda:
            raise ValueError(f"runtime={runtime!r} runs on CPU devices (onnxruntime's CPU "
                             f"build); on {device} use runtime='torch' with precision 'fp16' or "
                             f"'bf16'")
    if precision == "fp16" and not cuda:
        raise ValueError(f"precision='fp16' runs on CUDA devices only ({device} has no fast "
                         f"float16 kernels): use 'bf16' or 'fp32' there")
    if precision == "bf16" and cuda and hardware:
        import torch

        if not torch.cuda.is_bf16_supported():
            raise ValueError(f"precision='bf16': {device} does not support bfloat16 (before "
                             f"Ampere): use 'fp16'")


def torch_dtype(precision: str) -> Any:
    """The dtype a torch variant's weights are cast to (as ``model.half()`` and
    sentence-transformers' ``torch_dtype`` do)."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def weights_digest(model: Any) -> str:
    """A digest of a torch model's weights, its modules and their settings (and the versions
    that export them): the cache key. Weights alone would give one key to two models with the
    same transformer and different pooling or normalisation, which hold no weights."""
    import torch
    import transformers

    digest = hashlib.sha1(f"{torch.__version__} {transformers.__version__} {OPSET}".encode())
    for name, module in model.named_children():
        config = getattr(module, "get_config_dict", dict)()
        digest.update(f"{name} {type(module).__qualname__} "
                      f"{json.dumps(config, sort_keys=True, default=str)}".encode())
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()[:16]


def cache_folder() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "gpufeed")


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes)
        yield


def exported(model: Any, runtime: str, folder: Path | None = None) -> Path:
    """The ONNX file of ``model`` (a SentenceTransformer) for ``runtime``, made once per model
    and reused (module docstring)."""
    folder = (folder or cache_folder()) / f"onnx-{weights_digest(model)}"
    with _locked(folder):
        path = folder / "onnx.onnx"
        if not path.exists():
            _export(model, path)
        if runtime == "onnx-int8":
            path, source = folder / f"onnx-int8-{_quantized_key()}.onnx", path
            if not path.exists():
                _quantized(source, path)
    return path


class _Modules:
    """What ``encode`` runs after the tokenizer, as one module taking tensors (for export)."""

    def __new__(cls, model: Any, names: list[str]) -> Any:
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *tensors: Any) -> Any:
                features = dict(zip(names, tensors))
                for module in self.model:
                    features = module(features)
                return features["sentence_embedding"]

        return Wrapped().eval()


def model_inputs(model: Any, texts: list[str]) -> dict[str, Any]:
    """The tokenizer's tensors for ``texts`` (a model's other features, like its modality,
    left out)."""
    import torch

    preprocess = getattr(model, "preprocess", None) or model.tokenize
    return {k: v for k, v in preprocess(texts).items() if isinstance(v, torch.Tensor)}


def _export(model: Any, path: Path) -> None:
    import torch

    needs("onnx", "onnx", "exporting the model to ONNX (runtime='onnx')")
    sample = model_inputs(model, ["a short text", "and a somewhat longer one to export with"])
    names = list(sample)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        temporary = Path(scratch) / path.name
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the exporter's notes on tracing: a page a worker)
            torch.onnx.export(_Modules(model, names), tuple(sample.values()), str(temporary),
                              input_names=names, output_names=["embedding"],
                              dynamic_axes={**{n: {0: "batch", 1: "tokens"} for n in names},
                                            "embedding": {0: "batch"}},
                              opset_version=OPSET, dynamo=False)
        os.replace(temporary, path)


def _quantized_key() -> str:
    """What makes onnx-int8's file besides the exported one: onnxruntime's version, QUANTIZED
    and QUANTIZED_EXCLUDE."""
    import onnxruntime

    said = json.dumps({"onnxruntime": onnxruntime.__version__, **QUANTIZED,
                       "nodes_to_exclude": list(QUANTIZED_EXCLUDE)}, sort_keys=True)
    return hashlib.sha1(said.encode()).hexdigest()[:12]


def _quantized(source: Path, path: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        temporary = Path(scratch) / path.name
        quantize_dynamic(str(source), str(temporary),
                         **{**QUANTIZED, "weight_type": getattr(QuantType,
                                                                QUANTIZED["weight_type"])},
                         nodes_to_exclude=list(QUANTIZED_EXCLUDE))
        os.replace(temporary, path)


def compile_transformer(model: Any) -> None:
    """``torch.compile`` the transformer inside a SentenceTransformer, in place (dynamic shapes,
    so batches of any size and length share one graph). The first call compiles."""
    import torch

    first = model[0]
    name = next((n for n in ("model", "auto_model") if n in first._modules), None)  # (ST 6, 5)
    if name is None:
        raise ValueError(f"compile=True: the model's first module "
                         f"({type(first).__name__}) holds no transformer to compile")
    setattr(first, name, torch.compile(first._modules[name], dynamic=True))


def pinned(tokenize: Any, device: str) -> Any:
    """``tokenize``, its tensors put in pinned host memory and copied to ``device`` without
    blocking (``encode``'s own move then finds them there): the copy overlaps the host's work."""

    def call(*args: Any, **kwargs: Any) -> Any:
        features = tokenize(*args, **kwargs)
        for key, value in list(features.items()):
            if hasattr(value, "pin_memory"):
                features[key] = value.pin_memory().to(device, non_blocking=True)
        return features

    return call


def token_lengths(model: Any, texts: list[str]) -> list[int]:
    """Each text's tokens as the model will see them (special tokens in, truncated at its
    max_seq_length): what batches should be sorted by. Characters are a poor proxy here: the
    sample's batches of 16 sorted by characters computed 1.30x the tokens they needed, sorted
    by tokens 1.01x (texts past the truncation, code against prose)."""
    ids = _own_tokenizer(model)(texts, truncation=True, max_length=model.max_seq_length,
                                return_attention_mask=False,
                                return_token_type_ids=False)["input_ids"]
    return [len(i) for i in ids]


_copies = threading.local()  # each thread's own copy of each model's tokenizer


def _own_tokenizer(model: Any) -> Any:
    """This thread's copy of ``model``'s tokenizer, for measuring. A fast tokenizer keeps its
    padding and truncation on itself, set by each call: measuring (no padding) with the one
    ``encode`` uses (padding) in another thread sharing the model switched its padding off under
    that thread's call, which then failed ("Unable to create tensor", 413 of 1,387 calls)."""
    copies = getattr(_copies, "by_model", None)
    if copies is None:
        copies = _copies.by_model = weakref.WeakKeyDictionary()
    tokenizer = copies.get(model)
    if tokenizer is None:
        tokenizer = copies[model] = copy.deepcopy(model.tokenizer)
    return tokenizer


class OnnxEncoder:
    """A SentenceTransformer's ``encode`` run by ONNX Runtime: the model's own tokenizer, the
    exported modules, texts batched by token count, longest first."""

    def __init__(self, model: Any, path: Path, threads: int) -> None:
        ort = needs("onnxruntime", "onnx", "runtime='onnx'")

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.model, self.path = model, path
        self.session = ort.InferenceSession(str(path), options,
                                            providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self._local = threading.local()  # this thread's last encode's tokens (take_counts)

    def encode(self, texts: list[str], batch_size: int, normalize_embeddings: bool = False,
               truncate_dim: int | None = None, **_: Any) -> np.ndarray:
        order = np.argsort([-n for n in token_lengths(self.model, texts)], kind="stable")
        out: np.ndarray | None = None
        self._local.counts = counts = {"tokens_computed": 0, "tokens_needed": 0}
        for start in range(0, len(texts), batch_size):
            take = order[start:start + batch_size]
            features = model_inputs(self.model, [texts[k] for k in take])
            mask = features.get("attention_mask")
            if mask is not None:
                counts["tokens_computed"] += int(mask.numel())
                counts["tokens_needed"] += int(mask.sum())
            got = self.session.run(None, {name: features[name].numpy()
                                          for name in self.inputs})[0]
            if out is None:
                out = np.empty((len(texts), got.shape[1]), dtype=np.float32)
            out[take] = got
        if out is None:
            return np.empty((0, self.get_embedding_dimension()), dtype=np.float32)
        out = np.ascontiguousarray(out[:, :truncate_dim])  # (cut, then normalized: as encode)
        if normalize_embeddings:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out

    def take_counts(self) -> dict[str, int]:
        """This thread's last ``encode``'s tokens: computed (padded) and needed."""
        return dict(getattr(self._local, "counts", {}))

    def get_embedding_dimension(self) -> int:
        get = getattr(self.model, "get_embedding_dimension", None) \
            or self.model.get_sentence_embedding_dimension
        return int(get())
