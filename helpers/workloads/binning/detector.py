"""NanoDet-m (80 COCO classes) run by onnxruntime: image in, boxes, classes and scores out.

The weights ship in ``data/models/nanodet-m-416-coco80.onnx`` (see ``data/models/README.md`` for
where they come from, their licences and the conversion script). The recipe, from the model's notes:

- input ``[1, 3, 416, 416]`` float32, BGR, per channel ``(x - MEAN) / STD``;
- per stride 8, 16, 32 (grids of 52², 26², 13² cells): class scores ``[1, cells, 80]``, already
  sigmoid-activated, and box sides ``[1, cells, 44]`` = 4 sides × 11 bins; output names are not in
  stride order, so the pairs are matched by their cell counts;
- a cell i on a grid of g columns has its centre at ``((i mod g)·stride, (i div g)·stride)``; a side's
  distance is the expectation of a softmax over its 11 bins, times the stride;
- keep class scores above ``score_threshold``, then non-maximum suppression per class.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.engine.contract.protocol import needs

# shipped in the checkout, not the wheel: <checkout>/data/models/ (this file is helpers/workloads/binning/)
DEFAULT_WEIGHTS = (Path(__file__).resolve().parents[3] / "data" / "models"
                   / "nanodet-m-416-coco80.onnx")
INPUT_SIZE = 416
STRIDES = (8, 16, 32)
BINS = 11  # distance bins per box side (reg_max + 1)
MEAN_BGR = np.array([103.53, 116.28, 123.675], dtype=np.float32)
STD_BGR = np.array([57.375, 57.12, 58.395], dtype=np.float32)
SCORE_THRESHOLD = 0.35
IOU_THRESHOLD = 0.5

COCO_CLASSES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite",
    "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich", "orange",
    "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch", "potted plant",
    "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard", "cell phone",
    "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors",
    "teddy bear", "hair drier", "toothbrush")


@dataclass(frozen=True)
class Detections:
    """Boxes ``[n, 4]`` as (x0, y0, x1, y1) in image pixels, class indices and scores."""

    boxes: np.ndarray
    classes: np.ndarray
    scores: np.ndarray

    def names(self) -> list[str]:
        return [COCO_CLASSES[c] for c in self.classes.tolist()]

    def __len__(self) -> int:
        return len(self.classes)


def session(weights: str | Path | None = None, threads: int = 1,
            providers: tuple[str, ...] = ("CPUExecutionProvider",)) -> Any:
    """An onnxruntime session for the detector, with ``threads`` intra-op threads."""
    ort = needs("onnxruntime", "binning", "the binning workload's detector")

    path = Path(weights) if weights else DEFAULT_WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"detector weights {str(path)!r} not found")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=list(providers))


def preprocess(rgb: np.ndarray) -> np.ndarray:
    """An RGB uint8 image ``[h, w, 3]`` -> the model's input ``[1, 3, 416, 416]``."""
    import cv2

    resized = cv2.resize(rgb, (INPUT_SIZE, INPUT_SIZE), interpolation=cv2.INTER_LINEAR)
    bgr = resized[:, :, ::-1].astype(np.float32)
    return ((bgr - MEAN_BGR) / STD_BGR).transpose(2, 0, 1)[None].copy()


def detect(sess: Any, rgb: np.ndarray, score_threshold: float = SCORE_THRESHOLD,
           iou_threshold: float = IOU_THRESHOLD) -> Detections:
    """Run the detector on one RGB image and decode its boxes into image pixels."""
    outputs = sess.run(None, {sess.get_inputs()[0].name: preprocess(rgb)})
    boxes, scores = decode(outputs, score_threshold)
    height, width = rgb.shape[:2]
    boxes *= np.array([width, height, width, height], dtype=np.float32) / INPUT_SIZE
    keep_boxes, keep_classes, keep_scores = [], [], []
    for cls in np.unique(scores[1]).tolist():
        mask = scores[1] == cls
        kept = nms(boxes[mask], scores[0][mask], iou_threshold)
        keep_boxes.append(boxes[mask][kept])
        keep_classes.append(np.full(len(kept), cls, dtype=np.int64))
        keep_scores.append(scores[0][mask][kept])
    if not keep_boxes:
        return Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.int64),
                          np.zeros(0, np.float32))
    order = np.argsort(-np.concatenate(keep_scores), kind="stable")
    return Detections(np.concatenate(keep_boxes)[order], np.concatenate(keep_classes)[order],
                      np.concatenate(keep_scores)[order])


def decode(outputs: list[np.ndarray], score_threshold: float
           ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Raw outputs -> candidate boxes in 416-space and (score, class) of each, above threshold."""
    by_cells: dict[tuple[int, int], np.ndarray] = {}
    for out in outputs:
        by_cells[(out.shape[1], out.shape[2])] = out[0]
    all_boxes, all_scores, all_classes = [], [], []
    for stride in STRIDES:
        grid = INPUT_SIZE // stride
        cells = grid * grid
        cls_scores, regression = by_cells[(cells, len(COCO_CLASSES))], by_cells[(cells, 4 * BINS)]
        best = cls_scores.argmax(axis=1)
        score = cls_scores[np.arange(cells), best]
        keep = np.flatnonzero(score > score_threshold)
        if not len(keep):
            continue
        bins = regression[keep].reshape(-1, 4, BINS)
        bins = np.exp(bins - bins.max(axis=2, keepdims=True))
        distances = (bins / bins.sum(axis=2, keepdims=True)) @ np.arange(BINS, dtype=np.float32)
        distances *= stride
        cx, cy = (keep % grid) * stride, (keep // grid) * stride
        all_boxes.append(np.stack([cx - distances[:, 0], cy - distances[:, 1],
                                   cx + distances[:, 2], cy + distances[:, 3]], axis=1))
        all_scores.append(score[keep])
        all_classes.append(best[keep])
    if not all_boxes:
        return np.zeros((0, 4), np.float32), (np.zeros(0, np.float32), np.zeros(0, np.int64))
    boxes = np.clip(np.concatenate(all_boxes).astype(np.float32), 0, INPUT_SIZE)
    return boxes, (np.concatenate(all_scores), np.concatenate(all_classes))


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Indices of the boxes kept by greedy non-maximum suppression, best score first."""
    order = np.argsort(-scores, kind="stable")
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    kept = []
    while len(order):
        best, rest = order[0], order[1:]
        kept.append(best)
        x0 = np.maximum(boxes[best, 0], boxes[rest, 0])
        y0 = np.maximum(boxes[best, 1], boxes[rest, 1])
        x1 = np.minimum(boxes[best, 2], boxes[rest, 2])
        y1 = np.minimum(boxes[best, 3], boxes[rest, 3])
        inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
        iou = inter / np.maximum(areas[best] + areas[rest] - inter, 1e-9)
        order = rest[iou <= iou_threshold]
    return np.asarray(kept, dtype=np.int64)
