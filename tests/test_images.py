"""The image folder source and the careful decoder: every bad file gets a message naming it."""
import numpy as np
import pytest
from PIL import Image

from helpers.engine.inputs.sources import ImageFolderSource, SourceError, open_source
from helpers.workloads.binning.images import load_image


def test_folder_source_sorted_ids_and_only_images(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("b.png", "a.jpg", "sub/c.PNG"):
        Image.new("RGB", (4, 4)).save(tmp_path / name, format="PNG" if "png" in name.lower() else "JPEG")
    (tmp_path / "manifest.csv").write_text("file\n")
    source = ImageFolderSource(tmp_path)
    assert len(source) == 3
    assert [p.split("/")[-1] for _, p in source] == ["a.jpg", "b.png", "c.PNG"]
    assert [i for i, _ in source] == [0, 1, 2]
    assert isinstance(open_source(str(tmp_path)), ImageFolderSource)


def test_folder_source_errors(tmp_path):
    with pytest.raises(SourceError, match="not a folder"):
        ImageFolderSource(tmp_path / "missing")
    with pytest.raises(SourceError, match="no image files"):
        ImageFolderSource(tmp_path)


def test_load_image_shrinks_and_converts(tmp_path):
    Image.new("L", (3000, 1000), 128).save(tmp_path / "wide.png")
    rgb = load_image(tmp_path / "wide.png", max_side=600)
    assert rgb.shape == (200, 600, 3) and rgb.dtype == np.uint8
    Image.new("RGBA", (1, 1)).save(tmp_path / "dot.png")
    assert load_image(tmp_path / "dot.png").shape == (1, 1, 3)


def test_load_image_names_what_is_wrong(tmp_path):
    (tmp_path / "text.jpg").write_text("not an image")
    with pytest.raises(ValueError, match="text.jpg: not an image"):
        load_image(tmp_path / "text.jpg")
    Image.new("RGB", (200, 200), "red").save(tmp_path / "full.jpg", quality=95)
    data = (tmp_path / "full.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[:len(data) // 2])
    with pytest.raises(OSError, match="cut.jpg: cannot decode"):
        load_image(tmp_path / "cut.jpg")
    with pytest.raises(ValueError, match="above max_pixels"):
        load_image(tmp_path / "full.jpg", max_pixels=100)


@pytest.mark.parametrize("after_another", [False, True])
def test_the_pixel_limit_is_the_same_whatever_image_came_first(tmp_path, monkeypatch,
                                                                after_another):
    """PIL's own limit (here shrunk to 1,000 pixels, as if an image were 225 M) once refused an
    image decoded first and let it through after any other: only max_pixels decides."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000)
    Image.new("L", (10, 10)).save(tmp_path / "small.png")
    Image.new("L", (100, 50)).save(tmp_path / "big.png")  # 5,000 pixels: > 2x PIL's limit
    if after_another:
        load_image(tmp_path / "small.png")
    assert load_image(tmp_path / "big.png", max_pixels=10_000).shape == (50, 100, 3)
    with pytest.raises(ValueError, match="above max_pixels"):
        load_image(tmp_path / "big.png", max_pixels=4_000)
