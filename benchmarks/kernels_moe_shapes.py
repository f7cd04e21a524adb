"""Shapes, tile candidates and shared helpers of the MoE kernel benchmarks (kernels_moe.py, kernels_moe_layer.py):
the Qwen3-30B-A3B expert shape (or a tiny one under --smoke), the swept configs, random top-k routing and timing."""

from __future__ import annotations

import os
import sys
import time

import torch

MOE = dict(experts=128, top_k=8, hidden=2048, inter=768)
SMOKE = "--smoke" in sys.argv     # CPU smoke test of this script: interpreter, tiny shapes, wall-clock timing
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
    MOE = dict(experts=4, top_k=2, hidden=256, inter=128)
DEV = "cpu" if SMOKE else "cuda"
GEMMS = (("gate_up", 2 * MOE["inter"], MOE["hidden"]), ("down", MOE["hidden"], MOE["inter"]))
# (BM, BN, BK, warps, stages): the shipped two first
GROUPED_TILES = [(16, 128, 128, 4, 4), (32, 128, 128, 4, 3), (32, 128, 128, 4, 4), (32, 64, 128, 4, 4),
                 (16, 64, 128, 4, 4), (32, 256, 128, 8, 3), (64, 128, 128, 4, 3), (64, 128, 128, 8, 3),
                 (16, 128, 256, 4, 3), (32, 128, 256, 4, 3), (32, 128, 128, 8, 4), (16, 128, 128, 8, 4),
                 (64, 128, 128, 4, 3, 1), (32, 128, 128, 4, 4, 1)]   # 6th field 1: dual halves (see fp4_grouped)
# W4A4 quantized inside the grouped kernel: ruled out by the SASS (14.6 / 8.5 per weight element) and the H200
# (gate+up, 16x128x128: 763-1359 us against 95-231 with the separate launch); `--fused-tiles` to re-measure
FUSED_TILES: list = []
DENSE_SHAPES = [(256, 128)] if SMOKE else [(4096, 12288), (12288, 4096)]
DENSE_M = [1, 16, 64]
if SMOKE:
    GROUPED_TILES, FUSED_TILES = GROUPED_TILES[:1], FUSED_TILES[:1]


def time_us(calls: list, reps: int = 10) -> float:
    """Median microseconds per call: CUDA-graph replays (kernel_baselines.graph_us); wall clock under --smoke."""
    if SMOKE:
        t = time.perf_counter()
        for fn in calls:
            fn()
        return (time.perf_counter() - t) * 1e6 / len(calls)
    from kernel_baselines import graph_us

    return graph_us(calls, reps)


def grouped_configs(tiles=None):
    from trace_rl.kernels.fp4_gemm import GemmConfig

    tiles = GROUPED_TILES if tiles is None else tiles
    return [GemmConfig(bm, bn, bk, 1, nw, ns, dual=bool(d and d[0])) for bm, bn, bk, nw, ns, *d in tiles]


def dense_configs(M: int):
    from trace_rl.kernels.fp4_gemm import GemmConfig

    if M <= 16:
        tiles, splits = [(16, 128, 128, 4, 4), (16, 128, 128, 4, 5), (16, 128, 128, 4, 6), (16, 64, 128, 4, 5),
                         (16, 128, 256, 4, 3), (16, 256, 128, 4, 4), (16, 128, 128, 8, 4), (16, 128, 256, 8, 3)], \
            [4, 8, 16]
    else:
        tiles, splits = [(64, 128, 128, 8, 3), (64, 128, 128, 4, 3), (64, 128, 128, 4, 4), (32, 128, 128, 4, 3),
                         (64, 64, 128, 4, 4)], [1, 2, 4]
    cfgs = [GemmConfig(bm, bn, bk, s, nw, ns) for bm, bn, bk, nw, ns in tiles for s in splits]
    return cfgs[:1] if SMOKE else cfgs


def variants():
    """(fmt, act tag, config) of every grouped binary the sweep runs."""
    out = []
    for fmt in ("nvfp4", "mxfp4"):
        out += [(fmt, "a16", c) for c in grouped_configs()]
        out += [(fmt, "a4sep", c) for c in grouped_configs()]
        out += [(fmt, "a4fused", c) for c in grouped_configs(FUSED_TILES)] if FUSED_TILES else []
    return out


def routing(T: int, E: int, k: int, gen) -> tuple[torch.Tensor, list[int]]:
    """Top-k of random router logits: (int32 offsets [E + 1] on the device, the same on the host)."""
    logits = torch.randn(T, E, device=DEV, generator=gen)
    experts = logits.topk(k, dim=1).indices.reshape(-1)
    counts = torch.bincount(experts, minlength=E)
    offsets = torch.zeros(E + 1, dtype=torch.int32, device=DEV)
    offsets[1:] = counts.cumsum(0).to(torch.int32)
    return offsets, offsets.tolist()


def rel_err(y, ref) -> float:
    return ((y.float() - ref.float()).norm() / ref.float().norm()).item()
