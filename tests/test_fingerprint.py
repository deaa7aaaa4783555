"""What an output records of its input and workload (helpers.engine.contract.fingerprint), and how a
resume compares it: a changed file is caught, a change is named field by field."""
import os
import pickle
import subprocess
import sys
import time

import pytest

from helpers.engine.contract.fingerprint import (InputChanged, check_path, check_unchanged,
                                                 contents_of, decode, known_contents,
                                                 describe, differences, encode, file_identity,
                                                 file_stats, input_paths, listing_identity,
                                                 same_everywhere, sampled_only,
                                                 source_fingerprint, unchanged)
from helpers.engine.contract.protocol import UNRECORDED
from helpers.study.paths import ROOT


def test_a_file_s_identity_changes_with_its_bytes_even_at_the_same_size_and_time(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"a" * 5000)
    before = file_identity(path)
    stat = os.stat(path)
    path.write_bytes(b"a" * 2499 + b"b" + b"a" * 2500)  # (the middle sample holds it)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # its time put back
    after = file_identity(path)
    assert before["size"] == after["size"] and before["modified"] == after["modified"]
    assert before["digest"] != after["digest"]


def test_a_folder_s_identity_changes_when_a_file_is_replaced(tmp_path):
    for name in ("a.parquet", "b.parquet"):
        (tmp_path / name).write_bytes(name.encode() * 10)
    files = sorted(tmp_path.iterdir())
    before = listing_identity(tmp_path, files)
    (tmp_path / "b.parquet").write_bytes(b"x" * len("b.parquet") * 10)
    assert before["files"] == 2 and listing_identity(tmp_path, files) != before


def test_a_file_changed_while_open_is_named(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("text\none\n")
    stat, = file_stats([str(path)])
    with unchanged(stat) as f:
        assert f.read() == b"text\none\n"
        with open(path, "a") as out:
            out.write("two\n")
        with pytest.raises(InputChanged, match=r"in\.csv: changed since the run started "
                                               r"\(9 bytes then, 13 now"):
            check_unchanged(f, stat)


def test_differences_name_each_field_and_skip_what_either_cannot_tell():
    recorded = {"model": "a", "size": 1024, "outputs": None}
    assert differences(recorded, {"model": "b", "size": 1024, "outputs": {"x": "[3] f4"},
                                  "new": 1}) == {"model": ("a", "b")}
    assert describe(differences({"size": 1024}, {"size": 2048})) == "size 1,024 -> 2,048"
    assert differences({"shape": [3]}, {"shape": (3,)}) == {}  # (compared as recorded: JSON)


def test_a_field_added_later_compares_with_what_older_outputs_were_made_with():
    """UNRECORDED: an output that lacks a field was made with the value given there; set
    otherwise now, the change is named."""
    older = {"model": "a"}
    now = {"model": "a", "prompt": "(none)", UNRECORDED: {"prompt": "(none)"}}
    assert differences(older, now) == {}
    changed = {**now, "prompt": "query: "}
    assert differences(older, changed) == {"prompt": ("(none)", "query: ")}
    assert differences({"model": "a", "prompt": "query: "}, changed) == {}


def test_a_field_an_older_output_recorded_under_its_older_name_compares_under_its_new_one():
    """A JSON-lines input's text_field and id_field are text_column and id_column now: an output
    that recorded the older names resumes with the same columns, and is refused with others."""
    older = {"format": "jsonl", "text_field": "text", "id_field": "id", "size": 3}
    now = {"format": "jsonl", "text_column": "text", "id_column": "id", "size": 3}
    assert differences(older, now) == {}
    assert differences(older, {**now, "text_column": "body"}) == \
        {"text_column": ("text", "body")}
    mine = {"source": "mine", "text_field": "body"}  # a user's own source's own field
    assert differences(mine, {**mine, "text_field": "title"}) == \
        {"text_column": ("body", "title")}
    synthetic = {"workload": "synthetic", "model_mb": 100.0, "device_memory_mb": {}}
    assert differences(synthetic, {"workload": "synthetic", "model_mib": 200.0,
                                   "device_memory_mib": {}}) == {"model_mib": (100.0, 200.0)}


def test_attributes_round_trip_and_name_the_input_s_path():
    text = encode({"path": "/data/in.jsonl", "size": 3})
    assert decode(text) == {"path": "/data/in.jsonl", "size": 3}
    assert decode(text.encode()) == decode(text)
    assert decode("not json") is None and decode("[1, 2]") is None
    assert input_paths({"input_fingerprint": text}) == ("/data/in.jsonl",)
    assert input_paths({}) == ()


def test_a_file_a_reader_opens_by_its_path_is_checked_the_same_way(tmp_path):
    """h5py opens a file by its path: ``check_path`` asks what ``check_unchanged`` asks of an open
    file, and says it the same way."""
    from helpers.engine.contract.fingerprint import check_path, file_stats

    path = tmp_path / "in.h5"
    path.write_bytes(b"x" * 9)
    stat = file_stats([str(path)])[0]
    check_path(stat)  # as found
    path.write_bytes(b"y" * 13)
    with pytest.raises(InputChanged, match=r"in\.h5: changed since the run started "
                                           r"\(9 bytes then, 13 now"):
        check_path(stat)


def _rewritten_in_place(path, data: bytes) -> None:
    """``path`` rewritten in place with ``data`` (its size), its times put back as ``touch -d``,
    ``cp -p`` and ``rsync -a`` leave them."""
    stat = os.stat(path)
    assert len(data) == stat.st_size
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_file_rewritten_at_its_size_with_its_time_put_back_is_caught_by_its_change_time(
        tmp_path):
    """Issue 59: size and modification time alone let such a rewrite mix two files in one
    output on every format; the change time, which every write moves, does not."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"a" * 5000)
    stat, = file_stats([str(path)])
    time.sleep(0.01)  # (a change time apart on any filesystem's clock)
    _rewritten_in_place(path, b"b" * 5000)
    with pytest.raises(InputChanged, match=r"in\.jsonl: changed since the run started \(same "
                                           r"size and modification time, but its change time "
                                           r"moved"):
        check_path(stat)
    now, = file_stats([str(path)])
    assert (now.size, now.modified_ns, now.inode) == (stat.size, stat.modified_ns, stat.inode)


def test_a_file_replaced_by_a_rename_is_named_as_another_file(tmp_path):
    path, other = tmp_path / "in.csv", tmp_path / "next.csv"
    path.write_text("text\none\n")
    other.write_text("text\ntwo\n")
    stat, = file_stats([str(path)])
    os.utime(other, ns=(stat.modified_ns, stat.modified_ns))
    os.replace(other, path)
    with pytest.raises(InputChanged, match=r"in\.csv: changed since the run started \(another "
                                           r"file now \(inode \d+ then, \d+ now: replaced\)"):
        check_path(stat)


def test_content_is_every_byte_where_the_samples_miss_a_change(tmp_path):
    """Issue 59: a 9.7 MB JSONL whose bytes between 1.5 MiB and its middle were rewritten, its
    time put back, was resumed over (the samples hold the start, middle and end MiB): the
    whole file's ``content`` tells them apart; a folder's too."""
    path = tmp_path / "in.jsonl"
    size = 8 << 20
    path.write_bytes(b"a" * size)
    before = file_identity(path)
    folder_before = listing_identity(tmp_path, [path])
    data = bytearray(b"a" * size)
    data[(3 << 19): (3 << 19) + 10] = b"b" * 10  # at 1.5 MiB: outside every sample
    _rewritten_in_place(path, bytes(data))
    after = file_identity(path)
    assert {k for k in before if before[k] != after[k]} == {"content"}
    folder_after = listing_identity(tmp_path, [path])
    assert {k for k in folder_before if folder_before[k] != folder_after[k]} == {"content"}
    assert differences(before, after) == {"content": (before["content"], after["content"])}


def test_sampled_only_leaves_content_out_and_a_source_keeps_both_kinds_apart(tmp_path):
    """A run with a limit takes the input's identity without reading every byte; a source asked
    both ways (a try, then the whole run, on one source object) answers each as asked."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"a" * 5000)
    whole = file_identity(path)
    with sampled_only():
        sampled = file_identity(path)
        folder = listing_identity(tmp_path, [path])
    with sampled_only(False):
        assert file_identity(path) == whole
    assert "content" in whole and sampled == {k: v for k, v in whole.items() if k != "content"}
    assert "content" not in folder and "content" in listing_identity(tmp_path, [path])

    class Source:
        def fingerprint(self):
            return file_identity(path)

    source = Source()
    with sampled_only():
        assert "content" not in source_fingerprint(source)
    assert source_fingerprint(source) == whole
    with sampled_only():
        assert "content" not in source_fingerprint(source)


def test_what_workers_loaded_is_one_value_a_field_or_the_run_is_refused_naming_who_differs():
    """A hub model fetched by each worker: the same files in other caches are one model; other
    files (a revision that moved between machines, or since the driver fetched it) are not."""
    same = {"model_path": "/a/cache", "model_revision": "r1", "model_digest": "d1"}
    elsewhere = {"model_path": "/b/cache", "model_revision": "r2", "model_digest": "d1"}
    assert same_everywhere({}, {"worker 0": same, "worker 1": elsewhere}) == same
    assert same_everywhere({"model_digest": "d1"}, {"worker 0": same}) == same
    assert same_everywhere({}, {}) == {}
    other = {**same, "model_digest": "d2"}
    with pytest.raises(ValueError, match=r"worker 0 and worker 1 loaded different models "
                                         r"\(model_digest 'd1' and 'd2'\)"):
        same_everywhere({}, {"worker 0": same, "worker 1": other})
    with pytest.raises(ValueError, match=r"worker 0 loaded another model than the driver found "
                                         r"\(model_digest 'd2' here, 'd1' there\)"):
        same_everywhere({"model_digest": "d2"}, {"worker 0": same})


def _moved_later():
    time.sleep(0.01)  # (a change time apart on any filesystem's clock)


def test_a_new_mode_or_link_with_the_same_bytes_goes_on_and_says_so_once(tmp_path, caplog):
    """Issue 59: a chmod or a new hard link (a backup's cp -al) moves the change time as a
    rewrite does, and stopped the run. With the digest the run took as it started, the file's
    bytes are digested again: the same, the run goes on, saying so once per change."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"a" * 5000)
    stat, = file_stats([str(path)])
    file_identity(path)  # (the run's start: its content digest taken)
    _moved_later()
    os.chmod(path, 0o600 if stat.owned[0] & 0o777 != 0o600 else 0o640)
    with caplog.at_level("WARNING", logger="gpufeed"):
        check_path(stat)
        check_path(stat)
    assert caplog.text.count("its permissions, owner or links changed during the run") == 1
    _moved_later()
    os.link(path, tmp_path / "backup.jsonl")
    with unchanged(stat) as f:
        assert f.read() == b"a" * 5000


def test_a_new_mode_with_other_bytes_or_without_a_digest_still_stops_the_run(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"a" * 5000)
    stat, = file_stats([str(path)])
    file_identity(path)
    _moved_later()
    _rewritten_in_place(path, b"b" * 5000)
    os.chmod(path, 0o600 if stat.owned[0] & 0o777 != 0o600 else 0o640)
    with pytest.raises(InputChanged, match="its permissions, owner or links changed, and its "
                                           "bytes are not those the run started with"):
        check_path(stat)
    other = tmp_path / "limited.jsonl"  # (a --limit run takes no digest of every byte)
    other.write_bytes(b"a" * 5000)
    stat, = file_stats([str(other)])
    with sampled_only():
        file_identity(other)
    _moved_later()
    os.chmod(other, 0o600 if stat.owned[0] & 0o777 != 0o600 else 0o640)
    with pytest.raises(InputChanged, match=r"a run that took no digest of its bytes \(--limit\) "
                                           r"cannot tell that from a rewrite"):
        check_path(stat)
    written = tmp_path / "written.jsonl"  # (the same bytes again, nothing else: as a rewrite)
    written.write_bytes(b"a" * 5000)
    stat, = file_stats([str(written)])
    file_identity(written)
    _moved_later()
    _rewritten_in_place(written, b"a" * 5000)
    with pytest.raises(InputChanged, match=r"written to, its time put back"):
        check_path(stat)


def test_the_start_s_digest_travels_to_a_worker_process_with_the_stat_or_a_table_s_opener(
        tmp_path):
    """A worker process checks the file itself: its stat, pickled, brings the digest the
    driver took; a table's opener brings its files' digests as one bytes object."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"a" * 5000)
    stat, = file_stats([str(path)])
    file_identity(path)
    assert contents_of([stat]) == bytes.fromhex(file_identity(path)["content"])
    pickled = tmp_path / "stat.pickle"
    pickled.write_bytes(pickle.dumps((stat, contents_of([stat]))))
    _moved_later()
    os.chmod(path, 0o600 if stat.owned[0] & 0o777 != 0o600 else 0o640)
    check = ("import pickle, sys; from helpers.engine.contract import fingerprint as f; "
             "stat, blob = pickle.loads(open(sys.argv[1], 'rb').read()); "
             "f._CONTENTS.clear() if sys.argv[2] == 'opener' else None; "
             "f.known_contents([stat], blob) if sys.argv[2] == 'opener' else None; "
             "f.check_path(stat); print('went on')")
    for how in ("stat", "opener"):
        done = subprocess.run([sys.executable, "-c", check, str(pickled), how],
                              capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0 and "went on" in done.stdout, done.stderr
    fresh = tmp_path / "fresh.jsonl"  # (zeros: no digest was taken, and none is made up)
    fresh.write_bytes(b"c" * 10)
    unread, = file_stats([str(fresh)])
    known_contents([unread], b"\0" * 16)
    assert contents_of([unread]) == b"\0" * 16
