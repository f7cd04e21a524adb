"""The engine's timer, which the benches share: `median_ms` (CUDA events on GPU, each call timed alone). The
native engine times its decode attention candidates with it; the kernel benchmarks' CUDA-graph timer is
`trace_rl.bench.measure.graph_median_us`."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_ms(fn: Callable[[], object], device: torch.device, iters: int = 10, warmup: int = 3) -> float:
    """Median time of one call, CUDA events on GPU (each call timed alone), perf_counter on CPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(iters):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)
