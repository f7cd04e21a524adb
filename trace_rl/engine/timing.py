"""The engine's timers, which the benches share (`trace_rl.bench.measure` re-exports them): `median_ms` (CUDA
events on GPU, each call timed alone: launch gaps count) and `graph_median_us` (many calls in one CUDA graph:
launch gaps do not count). The native engine times its decode-attention candidates with the graph timer when its
decode step runs as CUDA graphs (what the step runs), with `median_ms` otherwise."""

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


def graph_median_us(calls: list[Callable[[], object]], reps: int = 15, warmup: int = 3) -> float:
    """Median microseconds per call of `calls`, captured once in a CUDA graph (after running the first two
    on a side stream, which compiles and allocates) and replayed `reps` times after `warmup` replays.
    Pass calls over different buffers (e.g. weight copies larger than L2) so replays read memory, not cache."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls[:2]:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    for _ in range(warmup):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return statistics.median(times)
