"""Messages over a worker's pipe: arrays travel as raw bytes after a small pickle, intact."""
import multiprocessing
import os
import pickle
import threading
from dataclasses import replace

import numpy as np
import pytest

from helpers.engine.contract.messages import Result, Workunit
from helpers.engine.contract.protocol import Rows
from helpers.engine.workers import transfer

pytestmark = pytest.mark.timeout(60)  # reached only on deadlock


def pipe():
    read, write = multiprocessing.Pipe(duplex=False)
    transfer.widen(read)
    return read, write


def test_a_result_with_large_float_and_text_arrays_arrives_equal():
    read, write = pipe()
    values = np.random.default_rng(0).random((4096, 384), dtype=np.float32)
    result = Result(3, 17, np.arange(4096, dtype=np.int64),
                    {"embeddings": values, "caption": np.array(["a", "b é"] * 2048, dtype=object)},
                    [(5, "ValueError", "bad", 1.0)], 1.0, 2.0, 123.0, None)
    sender = threading.Thread(target=transfer.send, args=(write, result))  # 6 MB > the pipe
    sender.start()
    got = transfer.receive(read)
    sender.join()
    assert got.worker == 3 and got.workunit == 17 and got.rejected == result.rejected
    np.testing.assert_array_equal(got.ids, result.ids)
    np.testing.assert_array_equal(got.arrays["embeddings"], values)
    assert got.arrays["embeddings"].flags.writeable  # built on our own buffer, not a bytes copy
    assert got.arrays["caption"].tolist() == result.arrays["caption"].tolist()
    transfer.send(write, "END_OF_WORK")  # plain messages travel the same way
    assert transfer.receive(read) == "END_OF_WORK"


def test_a_message_cut_short_raises_eof():
    read, write = pipe()
    values = np.ones((1000, 100), np.float32)

    def send_and_die():
        header, views = transfer.frame(values)
        write.send_bytes(header)
        os.write(write.fileno(), views[0][:1000])  # a worker killed mid-message
        write.close()

    send_and_die()
    with pytest.raises(EOFError, match="pipe closed after 1000 of 400000 bytes"):
        transfer.receive(read)


class _Opener:  # a source's reader as a worker gets it (pickled by value)
    def __eq__(self, other):
        return isinstance(other, _Opener)


def test_a_workunit_and_result_of_consecutive_ids_pickle_small_and_arrive_equal():
    """A workunit of 4,096 positions (records a worker reads: Rows) and its Result pickle their
    ids as first and count: a Ray call of four stays under Ray's 100 KB for inline arguments.
    Ids that do not run one by one still travel whole."""
    ids = np.arange(8192, 8192 + 4096, dtype=np.int64)
    unit = Workunit(9, ids, Rows(_Opener(), ids.copy()), attempts=1)
    result = Result(1, 9, ids, {}, [], 1.0, 2.0)
    four = [Workunit(i, ids + 4096 * i, Rows(_Opener(), ids + 4096 * i)) for i in range(4)]
    header, views = transfer.frame(four)
    assert len(header) < 2_000 and not views
    got = pickle.loads(pickle.dumps([unit, result]))
    assert np.array_equal(got[0].ids, ids) and np.array_equal(got[0].records.ids, ids)
    assert got[0].attempts == 1 and got[1].workunit == 9 and np.array_equal(got[1].ids, ids)
    shuffled = np.random.default_rng(0).permutation(ids)
    header, views = transfer.frame(Workunit(9, shuffled, []))
    assert sum(v.nbytes for v in views) == shuffled.nbytes
    read, write = pipe()
    transfer.send(write, replace(result, ids=shuffled))
    assert np.array_equal(transfer.receive(read).ids, shuffled)
