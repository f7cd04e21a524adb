"""The engine's timers and their re-export to the benches (`trace_rl.bench.measure`)."""

from __future__ import annotations

import torch

from trace_rl.bench import measure
from trace_rl.engine import timing


def test_bench_measure_reexports_the_engine_timers():
    """The CUDA-graph timer moved to engine/ (engine must not import bench/): bench callers keep their import."""
    assert measure.graph_median_us is timing.graph_median_us and measure.median_ms is timing.median_ms
    from trace_rl.bench.measure import graph_median_us, median_ms  # noqa: F401  (the benchmarks' import)


def test_median_ms_on_cpu_times_each_call():
    n = []
    ms = timing.median_ms(lambda: n.append(1), torch.device("cpu"), iters=4, warmup=2)
    assert len(n) == 6 and 0 <= ms < 100
