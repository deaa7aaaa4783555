"""What the card can do, measured in the same call, and what the model asks of it.

The two ceilings of the device tool's METHOD.md, measured once: the dense bf16 rate of a large
matrix product (random operands, never zeros: a product of zeros ran 13 % faster on an H200 here;
fp32's too, the ceiling of the fp32 variant) and the bandwidth of a large device-to-device copy
(bytes read plus bytes written). Datasheet
figures are leads only. The model's arithmetic comes from its configuration (``flops``), so a
texts-per-second figure becomes a share of the card's limit. ``Stopwatch`` times a stretch of
work on the device: CUDA events where there is a card, else the host clock.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

MATMUL_SIZE = 8192  # n of the n×n×n bf16 product: fills an H100 (2 n³ = 1.1 TFLOP a product)
COPY_BYTES = 2 ** 31  # one 2 GiB copy: far over the L2 (50-60 MB), well past launch overhead
WARMUPS, REPEATS = 3, 10


class Stopwatch:
    """Seconds between ``start()`` and ``stop()`` on the device's own clock: CUDA events on a
    card (from the card reaching the first to its reaching the second: its kernels, and any wait
    for the host to launch the next), the host clock on a CPU."""

    def __init__(self, device: str) -> None:
        import torch

        self.cuda = device.startswith("cuda")
        self._torch = torch
        if self.cuda:
            self._begin = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self.cuda:
            self._begin.record()
        else:
            self._started = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self._end.record()
            self._end.synchronize()
            return self._begin.elapsed_time(self._end) / 1000
        return time.perf_counter() - self._started


def timed(device: str, work: Any, warmups: int = WARMUPS, repeats: int = REPEATS) -> list[float]:
    """The seconds of each of ``repeats`` calls of ``work()`` on ``device``, after ``warmups``."""
    for _ in range(warmups):
        work()
    watch, seconds = Stopwatch(device), []
    for _ in range(repeats):
        watch.start()
        work()
        seconds.append(watch.stop())
    return seconds


def _spread(seconds: list[float]) -> tuple[float, float, float]:
    return statistics.median(seconds), min(seconds), max(seconds)


def ceilings(device: str, matmul_size: int = MATMUL_SIZE,
             copy_bytes: int = COPY_BYTES) -> list[dict[str, Any]]:
    """Tidy rows: the bf16 and fp32 matrix rates (TFLOP/s) and the copy bandwidth (TB/s, read +
    written), each the median of REPEATS after WARMUPS, with their range."""
    import torch

    generator = torch.Generator(device=device).manual_seed(0)
    rows = [_matmul(device, matmul_size, generator, torch.bfloat16),
            _matmul(device, matmul_size, generator, torch.float32),
            _copy(device, copy_bytes, generator)]
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # (the operands, gone with their functions)
    return rows


def _matmul(device: str, size: int, generator: Any, dtype: Any) -> dict[str, Any]:
    """An n×n×n product's rate in ``dtype`` (float32 as torch runs it by default: no TF32)."""
    import torch

    a, b = (torch.randn(size, size, device=device, dtype=dtype, generator=generator)
            for _ in range(2))
    median, least, most = _spread(timed(device, lambda: torch.matmul(a, b)))
    flop = 2.0 * size ** 3
    name = {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]
    return {"ceiling": f"matmul_{name}", "size": size, "value": flop / median / 1e12,
            "low": flop / most / 1e12, "high": flop / least / 1e12, "unit": "TFLOP/s",
            "repeats": REPEATS}


def _copy(device: str, size: int, generator: Any) -> dict[str, Any]:
    import torch

    source = torch.randint(0, 255, (size,), device=device, dtype=torch.uint8,
                           generator=generator)
    target = torch.empty_like(source)
    median, least, most = _spread(timed(device, lambda: target.copy_(source)))
    moved = 2.0 * size  # read once, written once
    return {"ceiling": "copy", "size": size, "value": moved / median / 1e12,
            "low": moved / most / 1e12, "high": moved / least / 1e12, "unit": "TB/s",
            "repeats": REPEATS}


def flops(config: Any, batch: int, length: int) -> float:
    """FLOPs of one forward pass of a BERT-like encoder over ``batch`` texts padded to
    ``length`` tokens: per token and layer 2 × (4 h² + 2 h i) in the matrix products (the four
    attention projections, the two feed-forward ones) and 4 L h in attention's two products with
    the other tokens (Q Kᵀ and the weights times V). MiniLM-L6 at 128 tokens: 22.4 MFLOP a token.
    The embedding look-up, layer norms, softmax and pooling are left out (a few percent)."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    per_token = layers * (2 * (4 * h * h + 2 * h * i) + 4 * length * h)
    return float(batch * length * per_token)
