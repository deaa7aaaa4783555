"""Regenerate ``data/python_docs_paragraphs.h5``: English paragraphs from the Python documentation.

Source: the reStructuredText sources of the Python 3.11 documentation, as shipped by Debian's
``python3.11-doc`` package (``/usr/share/doc/python3.11/html/_sources``). Licence: PSF License
Agreement (see ``data/README.md``). The generated file is committed, so set-up never needs apt;
this script documents and reproduces it::

    apt-get download python3.11-doc && dpkg -x python3.11-doc_*.deb /tmp/pydoc
    python data/make_text_sample.py --sources /tmp/pydoc/usr/share/doc/python3.11/html/_sources

Layout written (the one our users already have): a group ``batches/`` of 1-D UTF-8 string datasets
``batches/0``, ``batches/1``, ...; a record's id is its global position across the batches in order.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import h5py
import numpy as np

MIN_CHARS = 200  # the issue asks for paragraphs of at least 200 characters
BATCH_SIZE = 1000  # records per batches/<n> dataset, like the study's input files
DEFAULT_SOURCES = Path("/usr/share/doc/python3.11/html/_sources")
DEFAULT_OUTPUT = Path(__file__).with_name("python_docs_paragraphs.h5")

_ROLE = re.compile(r":([\w:+-]+):`([^`]*)`")  # :func:`len` -> len, :pep:`8` -> PEP 8
_LITERAL = re.compile(r"``([^`]*)``")
_LINK = re.compile(r"`([^`<]*?)\s*<[^>]*>`_{1,2}")  # `text <url>`_ -> text
_REF = re.compile(r"`([^`]+)`_{0,2}")
_EMPHASIS = re.compile(r"\*{1,2}([^*\s][^*]*?)\*{1,2}")
_HEADING = re.compile(r"^([=\-~^\"'`#*+<>_.:])\1{2,}\s*$")


def _clean_role(match: re.Match) -> str:
    role, text = match.group(1), re.sub(r"\s*<[^>]*>$", "", match.group(2))  # `title <target>`
    if role in ("pep", "rfc"):
        return f"{role.upper()} {text}"
    return text.lstrip("~!").rsplit(".", 1)[-1] if text.startswith("~") else text.lstrip("!")


def clean_inline(text: str) -> str:
    """Strip reST inline markup, keeping the words a reader sees."""
    text = _ROLE.sub(_clean_role, text)
    text = _LITERAL.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _REF.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    text = text.replace("\\", "")
    if text.endswith("::"):
        text = text[:-1]
    return " ".join(text.split())


def _is_prose(lines: list[str]) -> bool:
    first = lines[0].lstrip()
    if first.startswith(("..", ":", "|", "+-", ">>>", "...", "* ", "- ", "#", "=")):
        return False
    if any(_HEADING.match(line.strip()) for line in lines):
        return False
    return first[:1].isalpha() or first[:1] in "`*\"'("


def paragraphs(rst: str) -> list[str]:
    """Prose paragraphs of one reST file, literal blocks and directives left out."""
    found, block, literal_indent = [], [], None
    for line in rst.splitlines() + [""]:
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None:  # inside a literal block opened by "::"
            if not line.strip() or indent > literal_indent:
                continue
            literal_indent = None
        if line.strip():
            if block and indent != block[0][0]:
                block = []  # indentation changed inside a block: a list or a directive body
            block.append((indent, line))
            continue
        if block:
            lines = [text for _, text in block]
            if _is_prose(lines):
                found.append(clean_inline(" ".join(text.strip() for text in lines)))
            if lines[-1].rstrip().endswith("::"):
                literal_indent = block[0][0]
            block = []
    return found


def collect(sources: Path) -> list[str]:
    """Every distinct paragraph of at least MIN_CHARS characters, in file order."""
    seen, kept = set(), []
    for path in sorted(sources.rglob("*.txt")):
        for paragraph in paragraphs(path.read_text(encoding="utf-8", errors="replace")):
            if len(paragraph) >= MIN_CHARS and paragraph not in seen:
                seen.add(paragraph)
                kept.append(paragraph)
    return kept


def write(records: list[str], output: Path) -> None:
    """Write records as batches/0, batches/1, ... of BATCH_SIZE UTF-8 strings."""
    with h5py.File(output, "w") as f:
        group = f.create_group("batches")
        for n, start in enumerate(range(0, len(records), BATCH_SIZE)):
            batch = np.array(records[start:start + BATCH_SIZE], dtype=object)
            group.create_dataset(str(n), data=batch, dtype=h5py.string_dtype("utf-8"),
                                 compression="gzip", compression_opts=6)
        f.attrs["source"] = "Python 3.11 documentation reST sources (Debian python3.11-doc)"
        f.attrs["licence"] = "PSF License Agreement for Python 3.11"
        f.attrs["min_chars"] = MIN_CHARS
        f.attrs["records"] = len(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=Path, default=DEFAULT_SOURCES,
                        help="folder of *.rst.txt files (default: %(default)s)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    if not args.sources.is_dir():
        parser.error(f"--sources {args.sources} is not a folder; see this script's docstring")
    records = collect(args.sources)
    write(records, args.output)
    print(f"wrote {len(records)} paragraphs to {args.output}")


if __name__ == "__main__":
    main()
