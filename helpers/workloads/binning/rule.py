"""Sorting images into bins A/B/C from their features.

The rule (``assign_bin``), with the thresholds of ``Thresholds`` (defaults in brackets), applied in
this order:

- **A — text-rich**: ``text_boxes >= text_boxes_threshold`` [2] and either
  ``text_area >= text_area_threshold`` [0.2] (text covers a fifth of the image: pages, slides,
  scans) or ``similarity >= similarity_threshold`` [0.25] (what was read and seen is close to the
  prompt, e.g. a chart: little ink, but its words say "chart").
- **B — object-rich, dispersed scene**: not A, and ``objects >= object_count_threshold`` [5] or
  ``unique_classes >= unique_objects_threshold`` [3], and ``dispersion >=
  spatial_dispersion_threshold`` [0.3]: many things, or many kinds of things, spread over the frame.
- **C — the rest**: single subjects, textures, empty or tiny images.

Every comparison is ``>=``: a value exactly at its threshold passes. ``dispersion`` is the root mean
square distance of the box centres from their centroid, in image-normalised coordinates (0 for one
box or none; about 0.35 for four boxes in the four quadrants; at most about 0.71).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

BINS = ("A", "B", "C")  # in the order the rule tries them


@dataclass(frozen=True)
class Thresholds:
    """The binning rule's thresholds (see the module docstring for the rule)."""

    text_boxes_threshold: int = 2
    text_area_threshold: float = 0.2
    object_count_threshold: int = 5
    unique_objects_threshold: int = 3
    similarity_threshold: float = 0.25
    spatial_dispersion_threshold: float = 0.3

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name}: expected a number >= 0, got {value!r}")
        for name in ("text_area_threshold", "spatial_dispersion_threshold"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name}: expected a fraction in [0, 1], got {getattr(self, name)!r}")


def assign_bin(text_boxes: int, text_area: float, objects: int, unique_classes: int,
               dispersion: float, similarity: float, thresholds: Thresholds = Thresholds()) -> str:
    """"A", "B" or "C" for one image's features (the rule is in the module docstring)."""
    t = thresholds
    if text_boxes >= t.text_boxes_threshold and (
            text_area >= t.text_area_threshold or similarity >= t.similarity_threshold):
        return "A"
    if (objects >= t.object_count_threshold or unique_classes >= t.unique_objects_threshold) \
            and dispersion >= t.spatial_dispersion_threshold:
        return "B"
    return "C"


def dispersion(boxes: np.ndarray, width: int, height: int) -> float:
    """RMS distance of box centres ``[n, 4]`` (x0, y0, x1, y1) from their centroid, normalised."""
    if len(boxes) < 2:
        return 0.0
    centres = np.stack([(boxes[:, 0] + boxes[:, 2]) / (2 * width),
                        (boxes[:, 1] + boxes[:, 3]) / (2 * height)], axis=1)
    return float(np.sqrt(((centres - centres.mean(axis=0)) ** 2).sum(axis=1).mean()))


def caption(names: list[str]) -> str:
    """A template caption standing in for a captioning model: 'a photo of a dog, a bicycle and a car'."""
    unique = list(dict.fromkeys(names))  # first seen first: the detector's best scores lead
    if not unique:
        return "a photo"
    phrases = [f"{_article(n)} {n}" for n in unique]
    listed = phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]
    return f"a photo of {listed}"


def _article(noun: str) -> str:
    return "an" if noun[0] in "aeiou" else "a"


def description(caption_text: str, ocr_text: str, max_chars: int = 500) -> str:
    """What the similarity model compares with the prompts: the caption, then the text read.

    ``caption_text`` is "" when nothing was detected: a bare "a photo" scores about 0.3 against
    any prompt with MiniLM, which would say more about the template than about the image.
    """
    return ". ".join(part for part in (caption_text, ocr_text) if part)[:max_chars]


def text_area(boxes: list[Any], width: int, height: int) -> float:
    """Fraction of the image covered by OCR text boxes (quadrilaterals), at most 1."""
    total = 0.0
    for box in boxes:
        points = np.asarray(box, dtype=np.float64).reshape(-1, 2)
        x, y = points[:, 0], points[:, 1]
        total += 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))  # shoelace
    return float(min(1.0, total / max(1, width * height)))
