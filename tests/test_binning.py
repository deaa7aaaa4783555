"""The A/B/C rule at each of its boundaries, the feature helpers, and the CSV of a run."""
import csv
import re

import numpy as np
import pytest

from helpers.engine.contract.protocol import TEXT, OutputSpec
from helpers.engine.outputs.hdf5_sink import HDF5Sink, read_output
from helpers.workloads.binning.rule import (Thresholds, assign_bin, caption, description,
                                            dispersion, text_area)
from helpers.workloads.binning.table import write_csv

T = Thresholds()
NONE = dict(text_boxes=0, text_area=0.0, objects=0, unique_classes=0, dispersion=0.0, similarity=0.0)


def bin_of(**features):
    return assign_bin(**{**NONE, **features}, thresholds=T)


def test_the_rule_s_documentation_states_every_default_threshold_as_it_is():
    """The module docstring gives each threshold's default in brackets: it must not drift."""
    from dataclasses import asdict

    from helpers.workloads.binning import rule

    documented = {name: float(value) for name, value in
                  re.findall(r"(\w+_threshold)``\s*\[([\d.]+)\]", rule.__doc__)}
    assert documented == {name: float(value) for name, value in asdict(T).items()}


@pytest.mark.parametrize("boxes, area, similarity, expected", [
    (2, 0.2, 0.0, "A"),      # both at their thresholds: >= passes
    (1, 0.9, 0.9, "C"),      # one text box is not text-rich, however large
    (2, 0.1999, 0.0, "C"),   # just under the area, no similarity
    (2, 0.1999, 0.25, "A"),  # ... but the content matches a prompt (a chart)
    (2, 0.0, 0.2499, "C"),
    (30, 0.05, 0.3, "A"),
])
def test_rule_a_text_rich(boxes, area, similarity, expected):
    assert bin_of(text_boxes=boxes, text_area=area, similarity=similarity) == expected


@pytest.mark.parametrize("objects, unique, spread, expected", [
    (5, 1, 0.3, "B"),     # object count at its threshold, dispersion at its threshold
    (4, 3, 0.3, "B"),     # unique classes at their threshold
    (4, 2, 0.9, "C"),     # too few of either
    (50, 10, 0.2999, "C"),  # many objects, bunched together
])
def test_rule_b_object_rich_dispersed(objects, unique, spread, expected):
    assert bin_of(objects=objects, unique_classes=unique, dispersion=spread) == expected


def test_rule_a_wins_over_b_and_thresholds_are_parameters():
    features = dict(text_boxes=3, text_area=0.5, objects=9, unique_classes=5, dispersion=0.5)
    assert bin_of(**features) == "A"
    strict = Thresholds(text_area_threshold=0.6, similarity_threshold=1.0)
    assert assign_bin(**{**NONE, **features}, thresholds=strict) == "B"
    assert bin_of() == "C"


@pytest.mark.parametrize("kwargs, message", [
    ({"text_area_threshold": 1.5}, "text_area_threshold"), ({"text_boxes_threshold": -1},
                                                            "text_boxes_threshold"),
    ({"similarity_threshold": "high"}, "similarity_threshold")])
def test_bad_thresholds_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Thresholds(**kwargs)


def test_dispersion_of_box_centres():
    quadrants = np.array([[0, 0, 50, 50], [50, 0, 100, 50], [0, 50, 50, 100], [50, 50, 100, 100]],
                         dtype=np.float32)
    assert dispersion(quadrants, 100, 100) == pytest.approx(np.sqrt(0.125))  # 0.354
    assert dispersion(quadrants[:1], 100, 100) == 0.0
    assert dispersion(np.tile(quadrants[:1], (5, 1)), 100, 100) == 0.0  # stacked: no spread
    assert dispersion(quadrants, 200, 100) < dispersion(quadrants, 100, 100)


def test_text_area_is_the_covered_fraction():
    square = [[0, 0], [10, 0], [10, 10], [0, 10]]
    assert text_area([square], 100, 100) == pytest.approx(0.01)
    assert text_area([square] * 200, 10, 10) == 1.0  # capped
    assert text_area([], 100, 100) == 0.0


def test_caption_template_and_description():
    assert caption(["dog", "bicycle", "car", "dog"]) == "a photo of a dog, a bicycle and a car"
    assert caption(["umbrella"]) == "a photo of an umbrella"
    assert caption([]) == "a photo"
    assert description("a photo of a cup", "Menu") == "a photo of a cup. Menu"
    assert description("", "") == ""


def test_csv_has_one_row_per_image_errors_included(tmp_path):
    text, i32, f32 = OutputSpec((), TEXT), OutputSpec((), "int32"), OutputSpec((), "float32")
    names = {"path": text, "bin": text, "text_boxes": i32, "text_area": f32, "objects": i32,
             "unique_classes": i32, "classes": text, "dispersion": f32, "similarity": f32,
             "caption": text, "text": text, "decode_s": f32, "ocr_s": f32, "detector_s": f32,
             "similarity_s": f32}
    rows = {"path": ["b.png", "a.png"], "bin": ["C", "A"], "classes": ["", "cat dog"],
            "caption": ["a photo", "a photo of a cat and a dog"], "text": ["", "Hello"]}
    arrays = {n: np.array(rows.get(n, [1, 2]), dtype=object if s.dtype == TEXT else s.dtype)
              for n, s in names.items()}
    with HDF5Sink(tmp_path / "out.h5", names) as sink:
        sink.append(np.array([2, 0]), arrays)
        sink.append_errors([(1, "OSError", "broken.jpg: cannot decode", 0.0)])
    path = write_csv(read_output(tmp_path / "out.h5"), tmp_path / "out.csv", {1: "broken.jpg"})
    table = list(csv.DictReader(open(path)))
    assert [r["id"] for r in table] == ["0", "1", "2"]
    assert table[0]["path"] == "a.png" and table[0]["classes"] == "cat dog" and table[0]["bin"] == "A"
    assert table[1]["path"] == "broken.jpg" and table[1]["error"].startswith("OSError")
    assert {"path", "bin", "text_boxes", "text_area", "objects", "unique_classes", "classes",
            "dispersion", "similarity", "caption"} <= set(table[0])
