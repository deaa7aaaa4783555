"""Image inputs: a folder of image files as a record source, and a careful decoder.

``ImageFolderSource(folder)`` yields ``(id, path)`` for every file under ``folder`` whose suffix is
an image format, in sorted relative-path order (ids 0, 1, ... in that order, so a rerun over the same
folder gives the same ids). Paths travel through the queues; workers decode them, so the reader
stays cheap and a bad file only ever costs its own record.

``load_image(path)`` returns an RGB uint8 array, or raises an exception whose message names the
problem: not an image, truncated, too many pixels. Large images are decoded at reduced size where
the format allows it (JPEG draft mode) and shrunk to ``max_side``.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from helpers.sources import SourceError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")
MAX_PIXELS = 250_000_000  # refuse to decode beyond this (a 12,000 × 12,000 image is 144 M)
MAX_SIDE = 2048  # longer sides are shrunk to this before any model sees them


class ImageFolderSource:
    """Every image file under ``folder`` (recursively), by sorted relative path."""

    def __init__(self, folder: str | os.PathLike, suffixes: tuple[str, ...] = IMAGE_SUFFIXES) -> None:
        self.folder, self.suffixes = Path(folder), tuple(s.lower() for s in suffixes)
        if not self.folder.is_dir():
            raise SourceError(f"input {str(self.folder)!r}: not a folder of images")
        self._paths = sorted(p for p in self.folder.rglob("*")
                             if p.is_file() and p.suffix.lower() in self.suffixes
                             and not p.name.startswith("."))
        if not self._paths:
            raise SourceError(f"input {str(self.folder)!r}: no image files "
                              f"({', '.join(self.suffixes)})")

    def __len__(self) -> int:
        return len(self._paths)

    def __iter__(self) -> Iterator[tuple[int, str]]:
        for record_id, path in enumerate(self._paths):
            yield record_id, str(path)

    def describe(self) -> str:
        return f"images:{self.folder}"


def load_image(path: str | os.PathLike, max_pixels: int = MAX_PIXELS,
               max_side: int = MAX_SIDE) -> np.ndarray:
    """Decode ``path`` to an RGB uint8 array ``[h, w, 3]`` no larger than ``max_side``."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(path)
    except UnidentifiedImageError:
        raise ValueError(f"{Path(path).name}: not an image (no known image format)") from None
    with image:
        width, height = image.size
        if width * height > max_pixels:
            raise ValueError(f"{Path(path).name}: {width}×{height} = {width * height / 1e6:.0f} M "
                             f"pixels, above max_pixels={max_pixels / 1e6:.0f} M")
        if image.format == "JPEG":
            image.draft("RGB", (max_side, max_side))  # decode at 1/2, 1/4 or 1/8 scale
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            Image.MAX_IMAGE_PIXELS = None  # our own max_pixels check above replaces PIL's
            try:
                image.load()
            except OSError as exc:  # "image file is truncated", broken data stream, ...
                raise OSError(f"{Path(path).name}: cannot decode: {exc}") from None
        rgb = image.convert("RGB")
        rgb.thumbnail((max_side, max_side))
        return np.asarray(rgb)
