"""Measurement helpers of the benches: timers (`median_ms` and `graph_median_us`, the engine's: see
`trace_rl.engine.timing`), bandwidth ceilings, memory sizing, random caches."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from trace_rl.engine.timing import graph_median_us, median_ms  # noqa: F401  (re-exported: benches time through them)
from trace_rl.formats.paged_kv import PagedKV
from trace_rl.kv import PagedKVCache


def wall_s(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def bandwidth_ceilings(device: torch.device, gbytes: float = 4.0) -> dict:
    """Measured read-only (sum over a bf16 tensor) and copy (read + write counted) bandwidth, bytes/s."""
    if device.type != "cuda":
        return {"read": None, "copy": None}
    n = int(gbytes * 2**30) // 2
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    out = torch.empty((), device=device, dtype=torch.float32)
    read_ms = median_ms(lambda: torch.sum(src, 0, dtype=torch.float32, out=out), device, iters=10)
    copy_ms = median_ms(lambda: dst.copy_(src), device, iters=10)
    return {"read": src.nbytes / (read_ms * 1e-3), "copy": 2 * src.nbytes / (copy_ms * 1e-3)}


def kv_bytes_per_token(kv_format: str, num_layers: int, kv_heads: int, head_dim: int) -> float:
    """Cache bytes one token takes over all layers, K and V, scales included."""
    one = PagedKV.allocate(kv_format, 1, 16, kv_heads, head_dim, "cpu", torch.bfloat16)   # quantized pages: 16k tokens
    return 2 * num_layers * one.bytes_per_token()


@torch.no_grad()
def fill_random(cache: PagedKVCache, generator: torch.Generator, chunk: int = 2**26) -> None:
    """Random but valid values in every cache tensor (timing on zeros can flatter a kernel). Filled in
    chunks: the cache may hold nearly all free memory, so no full-size temporary."""
    def fill(t: torch.Tensor, make) -> None:
        flat = t.view(-1) if t.dtype != torch.float8_e4m3fn else t.view(torch.uint8).view(-1)
        for i in range(0, flat.numel(), chunk):
            part = flat[i:i + chunk]
            values = make(part.numel(), part.device)
            part.copy_(values.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else values)

    randn = lambda n, dev, dt: torch.randn(n, device=dev, generator=generator).to(dt)  # noqa: E731
    for c in cache.k + cache.v:
        if c.codes.dtype == torch.uint8:                       # packed E2M1: every byte is a valid pair
            fill(c.codes, lambda n, dev: torch.randint(0, 256, (n,), device=dev, generator=generator,
                                                       dtype=torch.uint8))
        else:                                                  # bf16 values or fp8 codes
            fill(c.codes, lambda n, dev, dt=c.codes.dtype: randn(n, dev, dt))
        if c.scales is not None:
            if c.scales.dtype == torch.uint8:                  # E8M0 exponents near 2**-4
                fill(c.scales, lambda n, dev: torch.randint(121, 125, (n,), device=dev, generator=generator,
                                                            dtype=torch.uint8))
            else:
                fill(c.scales, lambda n, dev, dt=c.scales.dtype: (torch.rand(n, device=dev, generator=generator)
                                                                  + 0.5).to(dt))
        if c.global_scale is not None:
            c.global_scale.fill_(1.0 / 448)


def weight_bytes(model, within: str = "") -> int:
    """Bytes a decode step reads from the rollout weights (every Linear's packed buffers; `within`: only
    the Linears whose name starts with it)."""
    total = 0
    for name, lin in model.linears().items():
        if not name.startswith(within):
            continue
        q = lin.quant
        tensors = (q.weight,) if q.weight_fmt == "bf16" else (q.w_codes, q.w_scales, q.w_global_scale)
        total += sum(t.nbytes for t in tensors if t is not None)
    return total


def free(*objs) -> None:
    """Collect garbage (engines and their graphs form reference cycles) and return cached GPU memory."""
    import gc

    del objs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def build_rollout_model(name: str, plan, device, dtype, seed: int, layers: int = 0):
    """Random weights of a preset's shape (first `layers` layers when > 0), converted in place to the
    plan's rollout form (no trainer copy is kept)."""
    from dataclasses import replace

    from trace_rl.models import build, preset

    config = preset(name)
    if layers:
        config = replace(config, num_layers=layers)
    model = build(config, device=device, dtype=dtype, plan=plan)
    model.init_random(generator=torch.Generator(device=device).manual_seed(seed))
    model = model.to_rollout()
    model.plan = plan
    return model
