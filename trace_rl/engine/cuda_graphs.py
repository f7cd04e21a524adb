"""`DecodeGraphs`: the decode step captured in one CUDA graph per batch bucket (static shapes, one launch).

`step(n)` must read its inputs from static buffers and return its output tensor; `run(n)` replays the
graph of the smallest bucket >= n, whose output stays valid until the next replay. Graphs share one memory
pool, captured largest first so that smaller ones reuse its blocks. A graph keeps reading the buffers it
was captured with: weights must be updated in place (`QuantLinear.load_weight`), or the graphs
invalidated and captured again (`invalidate()`).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable

import torch

log = logging.getLogger("trace_rl.engine")


def batch_buckets(max_batch: int) -> list[int]:
    """Powers of two below `max_batch`, and `max_batch` itself."""
    buckets, b = [], 1
    while b < max_batch:
        buckets.append(b)
        b *= 2
    return buckets + [max_batch]


class DecodeGraphs:
    def __init__(self, step: Callable[[int], torch.Tensor], buckets: list[int], warmup: int = 2):
        self.step, self.buckets, self.warmup = step, sorted(buckets), warmup
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def bucket(self, n: int) -> int:
        i = bisect.bisect_left(self.buckets, n)
        if i == len(self.buckets):
            raise ValueError(f"batch {n} exceeds the largest captured bucket {self.buckets[-1]}")
        return self.buckets[i]

    def capture(self) -> None:
        self.invalidate()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):          # warm-up: lazy allocations, cuBLAS handles, Triton compiles
            for n in reversed(self.buckets):
                for _ in range(self.warmup):
                    self.step(n)
        torch.cuda.current_stream().wait_stream(side)
        for n in reversed(self.buckets):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs[n] = self.step(n)
            self.pool = graph.pool()
            self.graphs[n] = graph
        torch.cuda.synchronize()
        log.info("captured decode CUDA graphs for batch buckets %s", self.buckets)

    def invalidate(self) -> None:
        self.graphs.clear()
        self.outputs.clear()
        self.pool = None

    def run(self, n: int) -> tuple[int, torch.Tensor]:
        """Replay the bucket covering n rows; returns (bucket, output of the bucket's `step`)."""
        b = self.bucket(n)
        self.graphs[b].replay()
        return b, self.outputs[b]
