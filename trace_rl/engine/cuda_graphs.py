"""`DecodeGraphs`: captured CUDA graphs of the decode step, one per key, captured on first use.

A key names everything a graph bakes in: the batch bucket, the decode-attention path, the sampling
parameters (Python scalars at capture). `run(key, step, quiet)` replays the key's graph, capturing it
first: `quiet()` is a context manager under which `step()` may run twice for warm-up (lazy allocations,
cuBLAS handles, Triton compiles) without changing the engine's state; then the step is captured (capture
records, it does not execute) and replayed once. Steps write their results into static buffers and return
nothing (or a tensor kept alive as the graph's output, as `forward_only` graphs do). All graphs share one
memory pool: they are replayed one at a time, so their temporaries may alias.

A graph keeps reading the buffers it was captured with: weights must be updated in place
(`QuantLinear.load_weight`), or the graphs invalidated and captured again (`invalidate()`).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager

import torch

log = logging.getLogger("trace_rl.engine")


def batch_buckets(max_batch: int) -> list[int]:
    """Powers of two below `max_batch`, and `max_batch` itself."""
    buckets, b = [], 1
    while b < max_batch:
        buckets.append(b)
        b *= 2
    return buckets + [max_batch]


def bucket_for(buckets: list[int], n: int) -> int:
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise ValueError(f"batch {n} exceeds the largest bucket {buckets[-1]}")
    return buckets[i]


class DecodeGraphs:
    def __init__(self, warmup: int = 2):
        self.warmup = warmup
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[Hashable, object] = {}
        self.pool = None
        self.capture_s = 0.0

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def capture(self, key: Hashable, step: Callable[[], object], quiet: Callable[[], AbstractContextManager]) -> None:
        t0 = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), quiet():
            for _ in range(self.warmup):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[key] = step()
        self.pool = graph.pool()
        self.graphs[key] = graph
        torch.cuda.synchronize()
        self.capture_s += time.perf_counter() - t0
        log.info("captured a decode CUDA graph for %s (%.2f s)", key, time.perf_counter() - t0)

    def run(self, key: Hashable, step: Callable[[], object], quiet: Callable[[], AbstractContextManager]):
        if key not in self.graphs:
            self.capture(key, step, quiet)
        self.graphs[key].replay()
        return self.outputs[key]

    def invalidate(self) -> None:
        self.graphs.clear()
        self.outputs.clear()
        self.pool = None
