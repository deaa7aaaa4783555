"""The driver's one pass over a CSV/TSV file (helpers.engine.inputs.csv_scan): it finds the rows
pyarrow finds (quoted line breaks, stray quotes, rows of another width, any line ending) in any
file, read in chunks cut anywhere; the quotes that toggle are those pyarrow's rules say."""
import io
import random

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from helpers.engine.inputs import csv_scan
from helpers.engine.inputs.table_files import csv_parse

pytestmark = pytest.mark.timeout(300)  # reached only on deadlock


def pyarrow_reads(data, fmt, **read):
    """The rows and the bad rows' texts pyarrow reads in ``data``, every value a string."""
    bad = []
    names = read.get("column_names") or pacsv.read_csv(
        io.BytesIO(data), parse_options=csv_parse(fmt, lambda row: "skip")).column_names
    table = pacsv.read_csv(io.BytesIO(data), pacsv.ReadOptions(**read),
                           csv_parse(fmt, lambda row: bad.append(row.text) or "skip"),
                           pacsv.ConvertOptions(column_types={c: pa.string() for c in names}))
    return table, bad


def random_csv(rng, delimiter):
    """A small file of every awkward thing: quoted delimiters, quotes and line breaks, empty
    quoted values, stray quotes outside quotes, quotes after a closed value, rows of other
    widths, blank lines, a byte-order mark, any line ending, a quote left open at the end."""
    columns = rng.randint(1, 4)
    lines = [delimiter.join(f"c{i}" for i in range(columns))]
    for _ in range(rng.randint(0, 40)):
        fields = []
        for _ in range(columns if rng.random() < 0.8 else rng.randint(1, 5)):
            if rng.random() < 0.4:
                inside = "".join(rng.choice(["a", delimiter, "\n", '""', "\r\n", " "])
                                 for _ in range(rng.randint(0, 5)))
                fields.append(f'"{inside}"' + (rng.choice(["x", '"']) if rng.random() < 0.1
                                               else ""))
            else:
                fields.append("".join(rng.choice(["a", " ", '"' if rng.random() < 0.3 else "y"])
                                      for _ in range(rng.randint(0, 4))))
        lines.append(delimiter.join(fields))
        if rng.random() < 0.1:
            lines.append("")
    end = rng.choice(["\n", "\r\n", "\r"])
    text = end.join(lines) + (end if rng.random() < 0.5 else "")
    return (b"\xef\xbb\xbf" if rng.random() < 0.1 else b"") + text.encode()


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [3, 64, 8 << 20])
def test_the_pass_finds_the_rows_pyarrow_finds_in_any_file(tmp_path, monkeypatch, chunk):
    """400 random files (but for a few pyarrow refuses), the reads cut anywhere: as many rows and
    bad rows as pyarrow finds, each bad row's text, and every row start (ROW_STEP 1) one pyarrow
    reads on from; where a quote is left open (the file ends inside it), its row is filed and
    pyarrow's reading of the file without it is what the pass finds."""
    monkeypatch.setattr(csv_scan, "SCAN_BYTES", chunk)
    monkeypatch.setattr(csv_scan, "ROW_STEP", 1)
    rng, checked, opened = random.Random(chunk), 0, 0
    for _ in range(400):
        fmt = rng.choice(["csv", "tsv"])
        data = random_csv(rng, "," if fmt == "csv" else "\t")
        path = tmp_path / f"f.{fmt}"
        path.write_bytes(data)
        index = csv_scan.row_index(str(path), "," if fmt == "csv" else "\t")
        unclosed = index.bad[np.isin(index.bad[:, 0], index.unclosed)]
        try:  # (a quote left open: its row filed, pyarrow reads the rest as the readers do)
            table, bad = pyarrow_reads(csv_scan.without(data, unclosed), fmt)
        except pa.ArrowInvalid:  # a header alone, no line break: refused as an input
            continue
        checked += 1
        opened += len(unclosed) > 0
        assert (index.rows, index.fields) == (table.num_rows, table.num_columns), data
        texts = [data[a:b].decode().removesuffix("\n").removesuffix("\r")
                 for a, b in index.bad.tolist()]
        assert [t for t, a in zip(texts, index.bad[:, 0]) if a not in index.unclosed] == bad
        assert len(index.bad_rows) == len(index.bad) and (np.diff(index.bad_rows) > 0).all()
        assert index.rows + len(index.bad) > (index.bad_rows[-1] if len(index.bad) else -1)
        for k, start in enumerate(index.starts.tolist()):
            after = csv_scan.without(data[start:], unclosed[unclosed[:, 0] >= start] - start)
            rest, _ = pyarrow_reads(after, fmt, column_names=table.column_names)
            assert rest.to_pylist() == table.slice(k).to_pylist(), (data, k)
    assert checked > 350 and opened > 10


def test_the_quotes_that_toggle_are_those_pyarrow_s_rules_say(tmp_path):
    """The vectorised state (csv_scan._toggling) against the rules walked a byte at a time, on
    random bytes of quotes, delimiters, line breaks and letters, begun inside a value or not."""
    def walked(data, quoted, before):
        toggles, inside, k = [], quoted, 0
        while k < len(data):
            if data[k] != ord('"'):
                k += 1
                continue
            run = len(data[k:]) - len(data[k:].lstrip(b'"'))
            previous = data[k - 1] if k else before
            if run % 2 and (inside or previous in b",\r\n"):
                toggles.append(k)
                inside ^= 1
            elif run % 2:  # outside, not at a field's start: characters
                pass
            k += run
        return toggles

    rng = random.Random(0)
    for _ in range(3000):
        data = bytes(rng.choice(b'"",\n\ra') for _ in range(rng.randrange(1, 30)))
        quoted, before = rng.randrange(2), rng.choice(b",a\n")
        got = csv_scan._toggling(np.frombuffer(data, np.uint8), quoted, before, ord(","))
        assert got.tolist() == walked(data, quoted, before), (data, quoted, before)


def test_a_chunk_ending_in_quotes_takes_the_rest_of_that_run_only(tmp_path):
    data = io.BytesIO(b'""x"""' + b"a" * 70_000)
    assert csv_scan._rest_of_run(data) == b'""' and data.read(1) == b"x"
    data = io.BytesIO(b'"' * 70_000 + b"b")
    assert csv_scan._rest_of_run(data) == b'"' * 70_000 and data.read() == b"b"
