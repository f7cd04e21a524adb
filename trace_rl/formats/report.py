"""Quantization error table: each format applied to a model-sized tensor (SQNR, relative error, bits/value)."""

from __future__ import annotations

import time

import torch

from trace_rl.formats.registry import get_format

TABLE_FORMATS = ("bf16", "fp8_e4m3:tensor", "fp8_e4m3:row", "fp8_e4m3:block", "fp8_e5m2:row", "nvfp4",
                 "nvfp4:row", "mxfp4")


def error_table(rows: int = 4096, cols: int = 4096, seed: int = 0,
                formats: tuple[str, ...] = TABLE_FORMATS) -> list[dict]:
    """Quantize a [rows, cols] Gaussian weight-like tensor (with a few outlier channels) in each format."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * 0.02
    x[:, torch.randperm(cols, generator=g)[:8]] *= 20.0   # outlier input channels, as real layers have
    results = []
    for name in formats:
        fmt = get_format(name)
        t0 = time.perf_counter()
        q = fmt.quantize(x)
        seconds = time.perf_counter() - t0
        err = fmt.dequantize(q) - x
        results.append({
            "format": name,
            "sqnr_db": (10 * torch.log10(x.pow(2).sum() / err.pow(2).sum())).item(),
            "rel_error": (err.norm() / x.norm()).item(),
            "max_abs_error": err.abs().max().item(),
            "bits_per_value": fmt.bits_per_value,
            "bytes": q.nbytes,
            "quantize_seconds_cpu": seconds,
        })
    return results


def format_table(results: list[dict]) -> str:
    head = f"{'format':18s} {'SQNR dB':>8s} {'rel err':>9s} {'max |err|':>10s} {'bits/val':>9s} {'MB':>8s}"
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r['format']:18s} {r['sqnr_db']:8.2f} {r['rel_error']:9.4f} {r['max_abs_error']:10.4g} "
                     f"{r['bits_per_value']:9.2f} {r['bytes'] / 2**20:8.2f}")
    return "\n".join(lines)
