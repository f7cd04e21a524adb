"""The FP8 operand cache (trace_rl/kernels/operand_cache_fp8.py) against the bf16 one at Qwen3-8B's decode shapes, all
in one run: issue 16's last 6% for mxfp4 (bf16 cuBLAS GEMMs on the operand cache are ~7 ms of the 27.5 ms step).

    python benchmarks/fp8cache_gemm.py --out fp8cache_gemm.json [--budget-s 60]      # an sm_90 GPU
    python benchmarks/fp8cache_gemm.py --out x.json --dry                            # CPU plumbing (tiny, no timing)

Shapes (mxfp4 weights, random normal x per-row scale): qkv 6144x4096 (the fused q/k/v), gate_up 24576x4096, o_proj
4096x4096, down 4096x12288; M = 128 / 313 / 512. Per row, microseconds per call (engine.timing.graph_median_us: one
CUDA graph of calls over cache copies >= 200 MB together, so replays read HBM as the decode step does; median of 15
replays after 3 warm-up), each measured in this run:
- `gemm_bf16_us`: the bf16 cache's GEMM (torch.mm, bf16 x bf16 -> float32: `fp4_dequant.accumulate`);
- `gemm_fp8_us` / `gemm_fp8_fast_us`: torch._scaled_mm on the E4M3 cache, use_fast_accum False (shipped) / True;
- `linear_bf16_us` / `linear_fp8_us`: the whole W4A4 linear (`fp4_linear(x, packed, "mxfp4")`: the quantize launch,
  bf16 or E4M3 stores, + GEMM + the FP4 epilogue), i.e. with the activation path;
- `quant_bf16_us` / `quant_e4m3_us`: the quantize launch alone with bf16 / E4M3 stores (the store-dtype change's
  cost), `cast_us`: one torch cast launch bf16 -> float8 over the same rows (what a separate cast launch would add at
  least, instead of the E4M3 stores);
- TFLOP/s (2 M N K / time) and the speedups fp8 over bf16.
Numerics, outside the graphs: `operand_mismatch` (E4M3 activation x 2**(top - 133) != its bf16 operand: 0 expected
for these rows; weights: E4M3 == bf16 operand x 32, `weight_mismatch`), and the float32 accumulators of bf16 / fp8
slow / fp8 fast against a float64 sum of the same operand values: max |err| / max |ref| (`err_*`). The JSON is
rewritten after every row; past `--budget-s` no new row starts. Per shape also the weight sync's refresh of each
cache (`refresh_bf16_us`: the dequant kernel into the bf16 cache, `refresh_fp8_us`: the E4M3 writer with its
exactness count).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = {"qkv": (6144, 4096), "gate_up": (24576, 4096), "o_proj": (4096, 4096), "down": (4096, 12288)}
MS = [128, 313, 512]
DRY_SHAPES = {"qkv": (96, 64), "down": (64, 192)}
COPY_BYTES = 200e6


def _weight(N, K, device, gen):
    import torch

    from trace_rl.backends import PackedWeight, get_backend

    w = torch.randn(N, K, generator=gen, device="cpu").to(device)
    w = (w * torch.exp(0.5 * torch.randn(N, 1, generator=gen)).to(device)).to(torch.bfloat16)
    q = get_backend("fp4").prepare_weight(w, "mxfp4").q
    return lambda: PackedWeight("mxfp4", N, K, q=q)


def _err(y, ref) -> float:
    return ((y - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()


def _timed(row: dict, key: str, calls: list, flop: int | None = None) -> None:
    """row[key_us] (and key_tflops for a GEMM of `flop`): `graph_median_us(calls)`; a failure is recorded, not
    raised (one failing variant must not stop the others)."""
    from trace_rl.engine.timing import graph_median_us

    try:
        us = graph_median_us(calls)
        row[f"{key}_us"] = us
        if flop:
            row[f"{key}_tflops"] = flop / us / 1e6
    except Exception as e:   # noqa: BLE001
        row[f"{key}_error"] = repr(e)[:300]


def measure(name: str, N: int, K: int, ms: list[int], device, gen, dry: bool) -> list[dict]:
    import torch

    from trace_rl.kernels import fp4_dequant, operand_cache
    from trace_rl.kernels import operand_cache_fp8 as f8
    from trace_rl.kernels.linear import fp4_linear
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16, quantize_dequant_e4m3

    make = _weight(N, K, device, gen)
    copies = 1 if dry else max(1, min(6, math.ceil(COPY_BYTES / (N * K * 2))))
    bfs, f8s = [make() for _ in range(copies)], [make() for _ in range(copies)]
    for p in bfs:
        operand_cache.attach(p)
    ok = [f8.attach_fp8(p, f"{name}[{i}]") is not None for i, p in enumerate(f8s)]
    wb, w8 = operand_cache.cached(bfs[0]).buf, operand_cache.cached(f8s[0]).buf if ok[0] else None
    rows = []
    sync = {}
    if all(ok) and not dry:   # the weight sync's refresh of each cache (kernels only; the FP8 check's host sync
        # is one .item() per weight on top)
        from trace_rl.kernels.linear import hopper_weight

        h, q, cnt = hopper_weight(f8s[0]), f8s[0].q, torch.zeros(1, dtype=torch.int32, device=device)
        _timed(sync, "refresh_bf16", [lambda: fp4_dequant.dequantize_to(q, h, wb)] * 2)
        _timed(sync, "refresh_fp8", [lambda: f8.write_weight_e4m3(q, h, w8, cnt)] * 2)
    for M in ms:
        row = {"shape": name, "N": N, "K": K, "M": M, "copies": copies, "fp8_attached": all(ok), **sync}
        rows.append(row)
        if not all(ok):
            row["error"] = "the weight does not fit E4M3 exactly (attach_fp8 returned None)"
            continue
        x = torch.randn(M, K, generator=gen).to(torch.bfloat16).to(device)
        xb, _ = quantize_dequant_bf16(x, "mxfp4")
        a8, rs = quantize_dequant_e4m3(x)
        shift = rs.double()[:, None] * 2.0 ** f8.WEIGHT_SHIFT
        row["operand_mismatch"] = int(((a8.double() * shift) != xb.double()).sum())
        row["weight_mismatch"] = int((w8.double() != wb.double() * 32).sum())
        ref = xb.double() @ wb.double().t()
        row["err_bf16"] = _err(fp4_dequant.accumulate(xb, wb).double(), ref)
        for fast in (False, True):
            f8.FAST_ACCUM = fast
            y = fp4_dequant.accumulate(a8, w8).double() * rs.double()[:, None]
            row["err_fp8_fast" if fast else "err_fp8"] = _err(y, ref)
        f8.FAST_ACCUM = False
        if dry:
            continue
        flop = 2 * M * N * K
        _timed(row, "gemm_bf16", [lambda p=p, xb=xb: fp4_dequant.accumulate(xb, operand_cache.cached(p).buf)
                                  for p in bfs], flop)
        for fast in (False, True):
            f8.FAST_ACCUM = fast
            _timed(row, "gemm_fp8_fast" if fast else "gemm_fp8",
                   [lambda p=p, a8=a8: fp4_dequant.accumulate(a8, operand_cache.cached(p).buf) for p in f8s], flop)
        f8.FAST_ACCUM = False
        _timed(row, "linear_bf16", [lambda p=p, x=x: fp4_linear(x, p, "mxfp4") for p in bfs], flop)
        _timed(row, "linear_fp8", [lambda p=p, x=x: fp4_linear(x, p, "mxfp4") for p in f8s], flop)
        n = max(4, copies)
        _timed(row, "quant_bf16", [lambda x=x: quantize_dequant_bf16(x, "mxfp4")] * n)
        _timed(row, "quant_e4m3", [lambda x=x: quantize_dequant_e4m3(x)] * n)
        _timed(row, "cast", [lambda xb=xb: xb.to(torch.float8_e4m3fn)] * n)
        for a, b in (("gemm_fp8", "gemm_bf16"), ("gemm_fp8_fast", "gemm_bf16"), ("linear_fp8", "linear_bf16")):
            if f"{a}_us" in row and f"{b}_us" in row:
                row[f"{a}_speedup"] = row[f"{b}_us"] / row[f"{a}_us"]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--dry", action="store_true", help="CPU, tiny shapes, numerics only (the plumbing)")
    args = ap.parse_args(argv)
    if args.dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    device = "cpu" if args.dry else "cuda"
    shapes = DRY_SHAPES if args.dry else {k: SHAPES[k] for k in args.shapes.split(",") if k}
    ms = [5] if args.dry else [int(m) for m in args.ms.split(",") if m]
    gen = torch.Generator().manual_seed(0)
    t0 = time.time()
    from trace_rl.kernels import operand_cache_fp8 as f8

    res = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "fast_accum_shipped": f8.FAST_ACCUM, "rows": [], "skipped": [], "errors": []}

    def dump():
        res["wall_s"] = time.time() - t0
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    for name, (N, K) in shapes.items():
        if time.time() - t0 > args.budget_s:
            res["skipped"].append(name)
            continue
        try:
            res["rows"] += measure(name, N, K, ms, device, gen, args.dry)
        except Exception as e:   # noqa: BLE001 - the next shape still runs
            res["errors"].append({"shape": name, "error": repr(e)[:500]})
        dump()
        if device == "cuda":
            torch.cuda.empty_cache()
    dump()
    bad = [r for r in res["rows"] if r.get("operand_mismatch") or r.get("weight_mismatch") or "error" in r]
    print(json.dumps({"rows": len(res["rows"]), "bad": len(bad), "errors": res["errors"]}))
    return 1 if bad or res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
