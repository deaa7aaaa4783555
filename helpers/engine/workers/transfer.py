"""Messages over a worker's pipe: a small pickle, then each large array as raw bytes.

A Result of 4,096 rows of 384-d float32 is 6 MB. Sent as one ordinary pickle it is copied three
times in the driver (64 KB reads into a growing buffer, the buffer into the unpickled array, and
again at the writer), each under the GIL. Here instead::

    worker:  pickle protocol 5 with a buffer_callback                  arrays stay out of band
             conn.send_bytes(sizes + pickle)                           one small framed message
             os.write(fd, array memory) for each buffer                no copy on this side
    driver:  conn.recv_bytes() -> sizes, pickle
             os.readv(fd, [np.empty(size)]) for each buffer            one copy: kernel to array
             pickle.loads(pickle, buffers=...)                         arrays built on those bytes

Only the worker writes its outbox and only one driver thread reads it
(helpers.engine.workers.backends), so the raw bytes always follow their header. A worker killed
mid-message leaves a short read: EOFError, which the listener takes for the worker's death. Messages
are pickled in memory between our own processes, as the Connection did before; this module never
touches a file.
"""
from __future__ import annotations

import os
import pickle
import struct
import sys
from typing import Any

import numpy as np

PIPE_BYTES = 1 << 20  # pipe capacity asked for on Linux (its default limit for any user): fewer
# wake-ups per megabyte than the default 64 KB
_COUNT = struct.Struct("<I")


def widen(conn: Any) -> None:
    """Ask for a PIPE_BYTES pipe buffer (Linux; elsewhere, or if refused, nothing changes)."""
    if sys.platform != "linux":
        return
    import fcntl

    try:
        fcntl.fcntl(conn.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except OSError:
        pass


def frame(message: Any) -> tuple[bytes, list[memoryview]]:
    """The header (buffer count, their sizes, the pickle) and the out-of-band buffers' memory."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    views = [buffer.raw() for buffer in buffers]
    sizes = struct.pack(f"<{len(views)}Q", *(view.nbytes for view in views))
    return _COUNT.pack(len(views)) + sizes + payload, views


def send(conn: Any, message: Any) -> None:
    """Write ``message`` to ``conn``; its contiguous arrays go as raw bytes after the header."""
    header, views = frame(message)
    conn.send_bytes(header)
    fd = conn.fileno()
    for view in views:
        sent = 0
        while sent < view.nbytes:
            sent += os.write(fd, view[sent:])


def receive(conn: Any) -> Any:
    """Read one message written by ``send``; EOFError if the pipe closes part-way."""
    header = conn.recv_bytes()
    count = _COUNT.unpack_from(header)[0]
    sizes = struct.unpack_from(f"<{count}Q", header, _COUNT.size)
    payload = memoryview(header)[_COUNT.size + 8 * count:]
    fd = conn.fileno()
    buffers = []
    for size in sizes:
        buffer = np.empty(size, dtype=np.uint8)
        view, got = memoryview(buffer), 0
        while got < size:
            n = os.readv(fd, [view[got:]])
            if n == 0:
                raise EOFError(f"pipe closed after {got} of {size} bytes of a message")
            got += n
        buffers.append(buffer)
    return pickle.loads(payload, buffers=buffers)
