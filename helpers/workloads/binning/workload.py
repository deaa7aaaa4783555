"""Image binning: OCR, an object detector and a similarity model per image, then a bin A/B/C.

Offline defaults (every one loads with no network):

- OCR: ``rapidocr-onnxruntime`` (PP-OCRv4 detection + recognition, shipped in its wheel);
- detector: NanoDet-m on the 80 COCO classes, ONNX, from ``data/models/`` (``detector`` here);
- similarity: the embedded all-MiniLM-L6-v2 compares a description (a template caption built from
  the detected classes, then the OCR text) with the prompts; the best cosine is the score.

With hub access, ``clip_model`` (a transformers CLIP id, e.g. ``openai/clip-vit-base-patch32``)
scores the *image* against the prompts instead, and ``caption_model`` (a transformers image-to-text
id, e.g. ``Salesforce/blip-image-captioning-base``) writes the caption instead of the template. On a
``cuda:N`` device the ONNX models ask onnxruntime for its CUDA provider (install
``onnxruntime-gpu``) and fall back to the CPU provider when it is missing; the torch models run on
the device.

Each model runs with ``threads`` intra-op threads (default 1: on a 2-core machine one thread per
model per worker measured faster than two, for every one of these models; None: the worker's
share of the machine's cores, on a GPU too, where onnxruntime's CPU provider may run them).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from helpers.engine.contract.protocol import TEXT, OutputSpec, needs
from helpers.workloads.binning.detector import detect, session
from helpers.workloads.binning.rule import (Thresholds, assign_bin, caption, description,
                                            dispersion, text_area)

DEFAULT_PROMPTS = ("a page of text", "a chart of values by year or region with axis labels")
TIMINGS = ("decode_s", "ocr_s", "detector_s", "similarity_s")
OCR_TEXT_CHARS = 2000  # OCR text kept per image in the output


@dataclass(frozen=True)
class Prepared:
    """A decoded image and what decoding it cost."""

    path: str
    rgb: np.ndarray
    decode_s: float


@dataclass(frozen=True)
class BinningWorkload:
    """Features of each image (text boxes and area, objects, classes, dispersion, similarity), its
    bin, a caption and the seconds each model took. Records are image paths."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    threads: int | None = 1
    detector_weights: str | None = None
    score_threshold: float = 0.35
    similarity_model: str | None = None  # sentence-transformers; None: embedded all-MiniLM-L6-v2
    clip_model: str | None = None
    caption_model: str | None = None
    max_side: int = 2048
    name: str = "binning"
    requires_hardware: bool = True
    imports: ClassVar[tuple[str, ...]] = (  # what load imports (the fork server does it once)
        "onnxruntime", "rapidocr_onnxruntime", "torch", "sentence_transformers")

    def __post_init__(self) -> None:
        if isinstance(self.thresholds, dict):
            object.__setattr__(self, "thresholds", Thresholds(**self.thresholds))
        if isinstance(self.prompts, str):
            object.__setattr__(self, "prompts", (self.prompts,))
        object.__setattr__(self, "prompts", tuple(self.prompts))
        if not self.prompts or not all(isinstance(p, str) and p.strip() for p in self.prompts):
            raise ValueError(f"prompts: expected one or more non-empty strings, got {self.prompts!r}")
        if self.threads is not None and (isinstance(self.threads, bool)
                                         or not isinstance(self.threads, int) or self.threads < 1):
            raise ValueError(f"threads: expected a positive integer or None, got {self.threads!r}")
        if not 0 < self.score_threshold < 1:
            raise ValueError(f"score_threshold: expected a value in (0, 1), got {self.score_threshold!r}")

    def load(self, device: str, threads: int) -> dict[str, Any]:
        threads = self.threads or threads
        cuda = device.startswith("cuda")
        models = {"device": device,
                  "detector": session(self.detector_weights, threads, _providers(device)),
                  "ocr": _load_ocr(threads, cuda)}
        if self.clip_model:
            models["clip"] = _load_clip(self.clip_model, device)
        else:
            from helpers.workloads.embedding import load_sentence_transformer

            st = load_sentence_transformer(self.similarity_model, device, threads)
            models["text"] = st
            models["prompts"] = st.encode(list(self.prompts), normalize_embeddings=True)
        if self.caption_model:
            from transformers import pipeline

            models["captioner"] = pipeline("image-to-text", model=self.caption_model, device=device)
        return models

    def outputs(self, model: Any) -> dict[str, OutputSpec]:
        text, i32, f32 = OutputSpec((), TEXT), OutputSpec((), "int32"), OutputSpec((), "float32")
        return {"path": text, "bin": text, "text_boxes": i32, "text_area": f32, "objects": i32,
                "unique_classes": i32, "classes": text, "dispersion": f32, "similarity": f32,
                "caption": text, "text": text, "detections": text,
                **{name: f32 for name in TIMINGS}}

    def check_record(self, record: Any) -> None:
        if not isinstance(record, (str, os.PathLike)):
            raise TypeError(f"expected an image path, got {type(record).__name__}")

    def prepare(self, record: str) -> Prepared:
        from helpers.workloads.binning.images import load_image

        started = time.perf_counter()
        rgb = load_image(record, max_side=self.max_side)
        return Prepared(str(record), rgb, time.perf_counter() - started)

    def process(self, model: dict[str, Any], records: list[Prepared]) -> dict[str, np.ndarray]:
        rows = [self._features(model, image) for image in records]
        started = time.perf_counter()
        similarity = self._similarity(model, records, rows)
        share = (time.perf_counter() - started) / len(records)
        for row, score in zip(rows, similarity):
            row["similarity"], row["similarity_s"] = float(score), share
            row["bin"] = assign_bin(row["text_boxes"], row["text_area"], row["objects"],
                                    row["unique_classes"], row["dispersion"], row["similarity"],
                                    self.thresholds)
        specs = self.outputs(model)
        return {name: np.array([row[name] for row in rows],
                               dtype=object if spec.dtype == TEXT else spec.dtype)
                for name, spec in specs.items()}

    def _features(self, model: dict[str, Any], image: Prepared) -> dict[str, Any]:
        height, width = image.rgb.shape[:2]
        started = time.perf_counter()
        boxes, texts = _ocr(model["ocr"], image.rgb)
        ocr_s = time.perf_counter() - started
        started = time.perf_counter()
        found = detect(model["detector"], image.rgb, self.score_threshold)
        detector_s = time.perf_counter() - started
        names = found.names()
        if "captioner" in model:
            from PIL import Image

            text = model["captioner"](Image.fromarray(image.rgb))[0]["generated_text"]
        else:
            text = caption(names)
        detections = [[*np.round(b, 1).tolist(), n, round(float(s), 3)]
                      for b, n, s in zip(found.boxes, names, found.scores)]
        return {"path": image.path, "text_boxes": len(boxes),
                "text_area": text_area(boxes, width, height), "objects": len(found),
                "unique_classes": len(set(names)), "classes": " ".join(sorted(set(names))),
                "dispersion": dispersion(found.boxes, width, height), "caption": text,
                "text": " ".join(texts)[:OCR_TEXT_CHARS], "detections": json.dumps(detections),
                "decode_s": image.decode_s, "ocr_s": ocr_s, "detector_s": detector_s}

    def _similarity(self, model: dict[str, Any], images: list[Prepared],
                    rows: list[dict[str, Any]]) -> np.ndarray:
        if "clip" in model:
            return _clip_scores(model["clip"], [i.rgb for i in images], self.prompts)
        texts = [description(r["caption"] if r["objects"] else "", r["text"]) for r in rows]
        scores = np.zeros(len(texts), dtype=np.float32)  # nothing seen, nothing read: no match
        filled = [k for k, text in enumerate(texts) if text]
        if filled:
            vectors = model["text"].encode([texts[k] for k in filled], normalize_embeddings=True,
                                           show_progress_bar=False)
            scores[filled] = (vectors @ model["prompts"].T).max(axis=1)
        return scores

    def fingerprint(self) -> dict[str, Any]:
        """What decides the bins: every attribute but the threads."""
        return {k: v for k, v in self.attrs().items() if k != "threads"}

    def attrs(self) -> dict[str, Any]:
        return {"workload": self.name, "prompts": list(self.prompts), "threads": str(self.threads),
                "detector": str(Path(self.detector_weights).name if self.detector_weights
                                else "nanodet-m-416-coco80.onnx"),
                "similarity_model": self.clip_model or self.similarity_model
                or "sentence-transformers/all-MiniLM-L6-v2",
                "caption_model": self.caption_model or "template",
                **{k: v for k, v in self.thresholds.__dict__.items()}}


def _providers(device: str) -> tuple:
    if not device.startswith("cuda"):
        return ("CPUExecutionProvider",)
    ort = needs("onnxruntime", "binning", "the binning workload")

    index = int(device.partition(":")[2] or 0)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return ("CPUExecutionProvider",)  # onnxruntime (CPU build): the detector runs on the CPU
    return (("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider")


def _load_ocr(threads: int, cuda: bool) -> Any:
    RapidOCR = needs("rapidocr_onnxruntime", "binning", "the binning workload's OCR").RapidOCR

    options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    if cuda:
        options.update(det_use_cuda=True, cls_use_cuda=True, rec_use_cuda=True)
    return RapidOCR(**options)


def _ocr(engine: Any, rgb: np.ndarray) -> tuple[list[Any], list[str]]:
    """Text boxes (4 corner points each) and their recognised strings; none for a blank image."""
    result, _ = engine(rgb[:, :, ::-1])  # RapidOCR takes OpenCV's BGR order
    if not result:
        return [], []
    return [r[0] for r in result], [r[1] for r in result]


def _load_clip(name: str, device: str) -> dict[str, Any]:
    from transformers import CLIPModel, CLIPProcessor

    return {"model": CLIPModel.from_pretrained(name).to(device).eval(),
            "processor": CLIPProcessor.from_pretrained(name), "device": device}


def _clip_scores(clip: dict[str, Any], images: list[np.ndarray], prompts: tuple[str, ...]
                 ) -> np.ndarray:
    import torch

    inputs = clip["processor"](text=list(prompts), images=images, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = clip["model"](**{k: v.to(clip["device"]) for k, v in inputs.items()})
    image = torch.nn.functional.normalize(out.image_embeds, dim=-1)
    text = torch.nn.functional.normalize(out.text_embeds, dim=-1)
    return (image @ text.T).max(dim=1).values.cpu().numpy()
