"""helpers.engine.inputs.table_layouts: a table's schema (what its columns are) and its layout per
format (how its files are read), each decided once when the source opens."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.engine.contract.fingerprint import file_stats
from helpers.engine.contract.id_ranges import IdRanges
from helpers.engine.contract.protocol import NO_ID, TEXT, BadRecord, OutputSpec, SourceError
from helpers.engine.inputs.csv_rows import CSVRows
from helpers.engine.inputs.table_files import layout
from helpers.engine.inputs.table_layouts import CSVLayout, PieceLayout, TableSchema
from helpers.engine.inputs.table_rows import TableRows


def schema_of(fmt, files, text="text", ids=None, keep=()):
    schemas = [layout(f, fmt)[0] for f in files]
    return TableSchema.check(schemas, files, fmt, files[0], text, ids, keep)


def test_the_id_column_decides_whether_ids_are_row_numbers(tmp_path):
    path = str(tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": ["x"], "n": [7], "key": ["k"], "f": [0.5]}), path)
    assert schema_of("parquet", [path]).by_row and not schema_of("parquet", [path]).keyed
    given = schema_of("parquet", [path], ids="n")
    assert not given.keyed and not given.by_row  # integers: the ids
    keys = schema_of("parquet", [path], ids="key", keep=["n", "f"])
    assert keys.keyed and keys.by_row and keys.kept == {"n": "int64", "f": "float64"}
    with pytest.raises(SourceError, match="id column 'f' holds float; ids are integers or strings"):
        schema_of("parquet", [path], ids="f")
    with pytest.raises(SourceError, match="column 'n' holds integer, not text"):
        schema_of("parquet", [path], text="n")
    with pytest.raises(SourceError, match="id_column: 'text' is the text column too"):
        schema_of("parquet", [path], ids="text")


def test_a_csv_s_zero_padded_integers_are_keys_kept_as_written(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("id,text\n007,a\n12,b\n")
    assert schema_of("csv", [str(path)], ids="id").keyed
    path.write_text("id,text\n7,a\n12,b\n")
    assert not schema_of("csv", [str(path)], ids="id").keyed


def test_pieces_know_their_rows_and_a_stream_is_not_read_by_row(tmp_path):
    table = pa.table({"text": [f"t{i}" for i in range(10)]})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=4)
    files = [str(tmp_path / "a.parquet")]
    pieces = PieceLayout(files[0], "parquet", files, file_stats(files),
                         layout(files[0], "parquet")[1])
    assert len(pieces) == 10 and pieces.accounted(None) == 10 and pieces.accounted(3) == 3
    assert pieces.by_row and isinstance(pieces.opener("text"), TableRows)
    assert list(pieces.unparsed(IdRanges(), None, {})) == []
    records = ["a\n" * 2000]
    pieces.check_texts(records, pa.array(records), np.arange(1), str)
    assert records == ["a\n" * 2000]  # a value is one value, whatever its line breaks
    with pa.OSFile(str(tmp_path / "s.arrow"), "wb") as sink, \
            pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    stream = [str(tmp_path / "s.arrow")]
    assert not PieceLayout(stream[0], "arrow", stream, file_stats(stream),
                           layout(stream[0], "arrow")[1]).by_row


def csv_layout(path):
    files = [str(path)]
    schema, _ = layout(files[0], "csv")
    return CSVLayout(files[0], "csv", files, file_stats(files), [tuple(schema.names)])


def test_a_csv_s_rows_of_another_width_are_filed_after_its_rows_once(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("text,n\na,1\nb,2,extra\nc,3\n")
    csv = csv_layout(path)
    assert len(csv) == 2 and csv.accounted(None) == 3 and csv.by_row
    assert isinstance(csv.opener("text"), CSVRows)
    assert [p[1] for p in csv.pieces()] == [2]
    (ids, records, carried), = csv.unparsed(IdRanges(), None, {"keys": OutputSpec((), TEXT)})
    assert ids.tolist() == [NO_ID] and isinstance(records[0], BadRecord)
    assert records[0].position == 2  # after the input's two rows
    assert "a row with the wrong number of fields" in records[0].message
    assert carried["keys"].tolist() == [""]
    assert list(csv.unparsed(IdRanges.from_ids(np.array([2])), None, {})) == []  # filed before


def test_a_csv_changed_before_its_pass_is_refused(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("text\na\n")
    csv = csv_layout(path)
    path.write_text("text\na\nb\n")
    with pytest.raises(SourceError, match="written to since it was opened; open it again"):
        len(csv)
