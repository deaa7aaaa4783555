"""Image decoding for the binning workload (the folder source is helpers.engine.inputs.sources's).

``load_image(path)`` returns an RGB uint8 array, or raises an exception whose message names the
problem: not an image, truncated, too many pixels. Large images are decoded at reduced size where
the format allows it (JPEG draft mode) and shrunk to ``max_side``.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

from helpers.engine.contract.protocol import needs

MAX_PIXELS = 250_000_000  # refuse to decode beyond this (a 12,000 × 12,000 image is 144 M)
MAX_SIDE = 2048  # longer sides are shrunk to this before any model sees them


def load_image(path: str | os.PathLike, max_pixels: int = MAX_PIXELS,
               max_side: int = MAX_SIDE) -> np.ndarray:
    """Decode ``path`` to an RGB uint8 array ``[h, w, 3]`` no larger than ``max_side``."""
    pil = needs("PIL.Image", "binning", "reading images (the binning workload)")
    Image, UnidentifiedImageError = pil, pil.UnidentifiedImageError

    # our max_pixels replaces PIL's own limit, before the first open as before every other one:
    # whether an image decodes must not depend on which image came first
    Image.MAX_IMAGE_PIXELS = None
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
            try:
                image.load()
            except OSError as exc:  # "image file is truncated", broken data stream, ...
                raise OSError(f"{Path(path).name}: cannot decode: {exc}") from None
        rgb = image.convert("RGB")
        rgb.thumbnail((max_side, max_side))
        return np.asarray(rgb)
