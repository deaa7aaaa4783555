"""The CUDA calls the torch card makes (``torch_card.CudaCalls``), faked for a machine without a
GPU: streams are names, events and graphs record what is done with them, pinned buffers are plain
tensors. A capture refuses what CUDA refuses while a stream captures (a sync: ``.item()``,
``bool(tensor)``, ``nonzero``), and a second capture under way in the process (torch's rule),
with ``torch.cuda.is_current_stream_capturing`` true inside it as on a card; it records a trace
of the captured function's operations (``make_fx``: its Python branches taken as they were at
capture, as a graph's kernels are), which a replay runs on the static buffers into the static
output. (``trace=False``: a replay calls the function again, a second a capture cheaper, for
tests about streams, threads and errors rather than the rows.)"""
import contextlib
import threading
import time
from unittest import mock

from torch.fx.experimental.proxy_tensor import make_fx

from torch.utils._python_dispatch import TorchDispatchMode

SYNCS = ("aten.is_nonzero", "aten._local_scalar_dense", "aten.item", "aten.nonzero",
         "aten.masked_select")  # what a capture refuses (each waits for the card)


class FakeEvent:
    def __init__(self, calls):
        self.calls, self.stream = calls, None

    def record(self, stream=None):
        self.stream = stream
        self.calls.append(("record", stream))

    def synchronize(self):
        self.calls.append(("synchronize", self.stream))


class FakeStream(str):
    def __new__(cls, calls, name="compute"):
        made = super().__new__(cls, name)
        made.calls = calls
        return made

    def wait_event(self, event):
        self.calls.append(("wait", event.stream))

    def wait_stream(self, other):
        self.calls.append(("wait_stream", str(self), str(other)))


class NoSyncs(TorchDispatchMode):
    """Raises on an operation that syncs the host with the card (CUDA refuses it in a capture:
    cudaErrorStreamCaptureUnsupported)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(SYNCS):
            raise RuntimeError(f"{func}: operation not permitted when stream is capturing")
        return func(*args, **(kwargs or {}))


class FakeGraph:
    def __init__(self, calls):
        self.calls, self.trace, self.out = calls, None, None

    def replay(self):
        self.calls.append(("replay",))
        self.out.copy_(self.trace())


class FakeCuda:
    """The CUDA calls the card makes, recorded in ``calls``. ``tells_capturing``: whether
    ``torch.cuda.is_current_stream_capturing`` says so in a capture (a card's does); ``trace``:
    whether a capture records a trace for its replays (the module docstring)."""

    def __init__(self, tells_capturing=True, trace=True):
        import torch

        self.torch, self.calls, self.streams, self.entered = torch, [], 0, []
        self.tells_capturing, self.trace = tells_capturing, trace

    def stream(self):
        self.streams += 1
        return FakeStream(self.calls, f"copies-{self.streams}")

    def current(self):
        return FakeStream(self.calls, self.entered[-1] if self.entered else "compute")

    def event(self):
        return FakeEvent(self.calls)

    def pinned(self, size, dtype):
        self.calls.append(("pinned", size, dtype))
        return self.torch.empty(size, dtype=dtype)

    @contextlib.contextmanager
    def use(self, stream):
        self.entered.append(stream)
        self.calls.append(("enter", stream))
        yield
        self.calls.append(("leave", stream))
        self.entered.pop()

    def graph(self):
        return FakeGraph(self.calls)

    def pool(self):
        return "pool"

    under_way = 0  # captures in the process (at most one)
    _counting = threading.Lock()

    def capture(self, graph, forward, pool, stream):
        self.calls.append(("capture", pool, str(stream)))
        with FakeCuda._counting:
            FakeCuda.under_way += 1
            others = FakeCuda.under_way - 1
        try:
            if others:
                raise RuntimeError("another capture is under way in this process")
            time.sleep(0.01)  # (a window for another thread's capture to be caught in)
            with self.use(stream), NoSyncs(), mock.patch(
                    "torch.cuda.is_current_stream_capturing", return_value=self.tells_capturing):
                graph.trace = make_fx(forward, tracing_mode="real")() if self.trace else None
                if graph.trace is None:
                    forward()  # (refused as a capture refuses it)
                    graph.trace = forward
            graph.out = graph.trace()
            return graph.out
        finally:
            with FakeCuda._counting:
                FakeCuda.under_way -= 1
