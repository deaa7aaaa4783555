"""helpers.engine.inputs.table_files: what a table path holds (its files, their one format), the
columns' kinds, the names that can be kept, each file's pieces, and the small rules beside them."""
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from helpers.engine.contract.protocol import TEXT, BadRecord, SourceError
from helpers.engine.inputs import table_files as module
from helpers.engine.inputs.table_files import (MAX_LINES_IN_VALUE, canonical_integers,
                                               check_kept_names, column_kind, column_texts,
                                               count_lines, file_spanning, kept_dtypes, kind,
                                               layout, row_name, table_files)


def test_a_path_names_its_files_sorted_in_one_format(tmp_path):
    for name in ("b.parquet", "a.parquet", ".hidden/c.parquet", "notes.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        pq.write_table(pa.table({"t": ["x"]}), tmp_path / name)
    folder = table_files(tmp_path)
    assert folder == ([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")], "parquet")
    assert table_files(tmp_path / "*.parquet") == folder  # a glob
    assert table_files(tmp_path / "b.parquet") == ([str(tmp_path / "b.parquet")], "parquet")


@pytest.mark.parametrize("files, message", [
    ([], "no such file, folder or glob match"),
    (["a.parquet", "b.csv"], "files of several formats (csv, parquet); give one format"),
    (["a.parquet", "b.txt"], "b.txt' is not a table file"),
])
def test_a_path_that_names_no_table_or_a_mix_is_refused_naming_why(tmp_path, files, message):
    for name in files:
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(SourceError) as caught:
        table_files(tmp_path / "*" if files else tmp_path / "missing.parquet")
    assert message in str(caught.value)


def test_a_dataset_with_splits_asks_for_one_split(tmp_path):
    (tmp_path / "dataset_dict.json").write_text("{}")
    (tmp_path / "train").mkdir()
    (tmp_path / "test").mkdir()
    with pytest.raises(SourceError, match=r"a dataset with splits \(test, train\); name one "
                                          r"split's folder"):
        table_files(tmp_path)


def test_kind_names_what_a_column_holds_whatever_its_width_or_encoding():
    assert [kind(t) for t in (pa.string(), pa.large_string(), pa.dictionary(pa.int8(),
                                                                          pa.string()))] == \
        ["text"] * 3
    assert [kind(t) for t in (pa.binary(), pa.uint16(), pa.int8(), pa.float32(), pa.bool_(),
                              pa.null())] == \
        ["binary", "unsigned", "integer", "float", "bool", "null"]
    assert kind(pa.list_(pa.float32())) == "list<item: float>"


def test_files_must_agree_on_a_column_s_kind_a_file_without_values_agrees_with_any():
    texts, ints, empty = (pa.schema([("c", t)]) for t in (pa.string(), pa.int64(), pa.null()))
    files = ["a.parquet", "b.parquet", "c.parquet"]
    assert column_kind([texts, empty, texts], files, "c", "in", "the text") == "text"
    assert column_kind([empty], files[:1], "c", "in", "the text") == "null"
    with pytest.raises(SourceError, match="files disagree on column 'c': text in 'a.parquet'; "
                                          "integer in 'b.parquet'"):
        column_kind([texts, ints], files[:2], "c", "in", "the text")
    with pytest.raises(SourceError, match="no column 'd' \\(the ids\\) in 'a.parquet'; its "
                                          "columns: c"):
        column_kind([texts], files[:1], "d", "in", "the ids")
    twice = pa.schema([("c", pa.string()), ("c", pa.string())])
    with pytest.raises(SourceError, match="column 'c' appears 2 times"):
        column_kind([twice], files[:1], "c", "in", "the text")
    dates = pa.schema([("c", pa.date32())])  # a CSV reads it as text
    assert column_kind([dates], ["a.csv"], "c", "in", "a column to keep") == "text"
    assert column_kind([dates], ["a.parquet"], "c", "in", "a column to keep") == "date32[day]"


def test_only_scalars_under_a_free_name_are_kept():
    schema = pa.schema([("n", pa.int32()), ("u", pa.uint8()), ("f", pa.float16()),
                        ("b", pa.bool_()), ("s", pa.string()), ("v", pa.list_(pa.int8()))])
    assert kept_dtypes([schema], ["a.parquet"], ["n", "u", "f", "b", "s"], {"text"}, "in") == \
        {"n": "int64", "u": "uint64", "f": "float64", "b": "int8", "s": TEXT}
    with pytest.raises(SourceError, match="'v' holds list<item: int8>; only numbers"):
        kept_dtypes([schema], ["a.parquet"], ["v"], {"text"}, "in")
    for clash in ("text", "ids", "errors", "keys"):
        with pytest.raises(SourceError, match=f"keep_columns: {clash} cannot be kept"):
            check_kept_names([clash], {"text"})
    for odd in ("a/b", ".x", ""):
        with pytest.raises(SourceError, match="holds no '/' and does not start with '.'"):
            check_kept_names([odd], set())


def test_a_row_is_named_in_its_file_and_in_the_input_when_that_has_several():
    assert row_name(("a.csv", 0), 7) == "a.csv row 7"
    assert row_name(("b.csv", 100), 107) == "b.csv row 7 (input row 107)"


def test_count_lines_counts_a_last_line_without_its_newline_and_leaves_out_the_header(tmp_path):
    (tmp_path / "a.csv").write_bytes(b"text\nx\ny\n")
    (tmp_path / "b.csv").write_bytes(b"text\nx\ny")  # no newline at the end
    (tmp_path / "empty.csv").write_bytes(b"")
    files = [str(tmp_path / n) for n in ("a.csv", "b.csv", "empty.csv")]
    assert count_lines(files, header=True) == 4
    assert count_lines(files[:1], header=False) == 3


def test_integers_written_with_leading_zeros_are_not_integers_as_written(tmp_path):
    (tmp_path / "plain.csv").write_text("id,text\n-3,a\n0,b\n120,c\n")
    (tmp_path / "zeros.csv").write_text("id,text\n12,a\n007,b\n")
    assert canonical_integers(str(tmp_path / "plain.csv"), "csv", "id")
    assert not canonical_integers(str(tmp_path / "zeros.csv"), "csv", "id")
    (tmp_path / "empty.csv").write_text("id,text\n1,a\n,b\n3,c\n")
    assert canonical_integers(str(tmp_path / "empty.csv"), "csv", "id")  # (no id: not a key)


def test_a_text_over_max_lines_is_filed_as_a_quote_left_open():
    long = "\n".join(["x"] * (MAX_LINES_IN_VALUE + 2))
    short = "\n".join(["y"] * MAX_LINES_IN_VALUE)
    for column in (pa.array(["a", long, short, None]), pa.array(["a", long, short, None],
                                                                pa.large_binary())):
        records = ["a", long, short, None]
        file_spanning(records, column, np.array([10, 11, 12, 13]), lambda k: f"row {10 + k}")
        assert isinstance(records[1], BadRecord) and records[1].position == 11
        assert f"row 11: its text spans over {MAX_LINES_IN_VALUE} lines: a quote left open" in \
            records[1].message
        assert records[0] == "a" and records[2] == short and records[3] is None


def test_a_binary_text_that_is_not_utf8_is_a_bad_record_of_its_own():
    column = pa.array([b"good", b"\xff\xfe", None], pa.binary())
    texts = column_texts(column, np.array([4, 5, 6]), lambda k: f"row {4 + k}")
    assert texts[0] == "good" and texts[2] is None
    assert isinstance(texts[1], BadRecord) and texts[1].position == 5
    assert texts[1].message.startswith("row 5: the text is not valid UTF-8")
    assert column_texts(pa.array(["a", "b"]).dictionary_encode(), np.arange(2), str) == ["a", "b"]


def test_a_file_s_pieces_know_their_rows_and_read_the_columns_asked(tmp_path):
    table = pa.table({"t": [f"x{i}" for i in range(10)], "n": list(range(10))})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=4)
    schema, pieces = layout(str(tmp_path / "a.parquet"), "parquet")
    assert schema.names == ["t", "n"] and [rows for _, rows, _ in pieces] == [4, 4, 2]
    read = [b.to_pydict() for b in pieces[2][2](["n"])]
    assert read == [{"n": [8, 9]}]
    with pa.OSFile(str(tmp_path / "s.arrow"), "wb") as sink, \
            pa.ipc.new_stream(sink, table.schema) as writer:  # a stream: one piece
        writer.write_table(table, max_chunksize=3)
    _, pieces = layout(str(tmp_path / "s.arrow"), "arrow")
    assert [rows for _, rows, _ in pieces] == [10]
    assert sum(b.num_rows for b in pieces[0][2](["t"])) == 10
    pacsv.write_csv(table, tmp_path / "a.csv")
    schema, pieces = layout(str(tmp_path / "a.csv"), "csv")
    assert schema.names == ["t", "n"] and pieces == []  # its rows: one pass (csv_scan)


def test_a_piece_read_after_its_file_changed_is_refused(tmp_path):
    pq.write_table(pa.table({"t": ["a", "b"]}), tmp_path / "a.parquet")
    _, pieces = layout(str(tmp_path / "a.parquet"), "parquet")
    pq.write_table(pa.table({"t": ["c", "d", "e"]}), tmp_path / "a.parquet")
    with pytest.raises(Exception, match="changed"):
        list(pieces[0][2](["t"]))


def test_a_csv_whose_first_block_holds_no_whole_row_grows_the_block(tmp_path, monkeypatch):
    monkeypatch.setattr(module, "CSV_BLOCK_BYTES", 64)
    (tmp_path / "a.csv").write_text("text,n\n" + "y" * 500 + ",1\n")
    first, block = module.first_rows(str(tmp_path / "a.csv"), "csv")
    assert block == 1024 and first.endswith(b",1\n")
    monkeypatch.setattr(module, "CSV_MAX_BLOCK_BYTES", 256)
    with pytest.raises(ValueError, match="no row of its header's width in its first"):
        module.first_rows(str(tmp_path / "a.csv"), "csv")
