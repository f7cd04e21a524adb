"""The fused residual add + RMSNorm + W4A4 activation quantization (trace_rl/kernels/rmsnorm_quantize.py) against
the two kernels it replaces (`add_rms_norm`, then `quantize_dequant_bf16` on its h), at the decode step's shapes.

    python benchmarks/norm_quant.py --out OUT.json [--budget-s 60]
    NORMQUANT_SMOKE=1 python benchmarks/norm_quant.py --out /tmp/nq.json    # CPU dry run (interpreter, tiny shapes)

Per format (nvfp4:row, mxfp4) and rows B (1, 16, 313, 512) x 4096 (Qwen3-8B's hidden size), bf16, with a residual:
- `bit_identical`: the fused outputs (h, new residual, operand, row scale) equal the separate kernels', bits (NaN
  positions compared), on random rows plus a NaN row and an Inf row;
- `separate_us`, `fused_us` (h written too, as when an activation hook reads it), `fused_noh_us` (h not written:
  what the decoder runs): CUDA-graph medians (8 calls over 8 distinct input sets per graph, 15 replays after 3
  warm-up, `trace_rl.engine.timing.graph_median_us`);
- `fused_noh_8warps`: the same at 8 warps a row (informational: not the norm kernel's reduction order, so not its
  bits; whether the operand still equals is reported);
- the bytes each moves (bf16 activations: separate = read x, r; write r', h; read h; write operand = 6 x B x N x 2
  (+ row scales); fused = 5 or 4 x B x N x 2) and the floor at the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

SMOKE = os.environ.get("NORMQUANT_SMOKE") == "1"
if SMOKE:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trace_rl.kernels.rmsnorm import add_rms_norm  # noqa: E402
from trace_rl.kernels.rmsnorm_quantize import add_rms_norm_quantize  # noqa: E402
from trace_rl.kernels.row_quantize import quantize_dequant_bf16  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
DTYPE = torch.float32 if SMOKE else torch.bfloat16      # the interpreter's bf16 casts are not faithful
N = 64 if SMOKE else 4096
BATCHES = (1, 5) if SMOKE else (1, 16, 313, 512)
FORMATS = ("nvfp4:row", "mxfp4")
SETS = 2 if SMOKE else 8
EPS = 1e-6


def timed_us(calls) -> float:
    if SMOKE:
        t = time.perf_counter()
        for fn in calls:
            fn()
        return (time.perf_counter() - t) * 1e6 / len(calls)
    from trace_rl.engine.timing import graph_median_us

    return graph_median_us(calls, reps=15, warmup=3)


def copy_TBps() -> float | None:
    """Read + write bandwidth of a 2 GiB device copy (bytes moved both ways / time)."""
    if SMOKE:
        return None
    a = torch.empty(1 << 30, device=DEV, dtype=torch.bfloat16).normal_()
    b = torch.empty_like(a)
    us = timed_us([lambda a=a, b=b: b.copy_(a)] * 3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * 2 * (1 << 30) / us / 1e6


def inputs(batch: int, gen: torch.Generator):
    x = torch.randn(batch, N, generator=gen) * 4
    r = torch.randn(batch, N, generator=gen)
    if batch > 2:
        x[1, 7] = float("nan")
        r[2, N - 1] = float("inf")
    w = torch.rand(N, generator=gen) + 0.5
    return x.to(DEV, DTYPE), r.to(DEV, DTYPE), w.to(DEV, DTYPE)


def separate(x, r, w, fmt):
    h, r2 = add_rms_norm(x, r, w, EPS)
    xq, rs = quantize_dequant_bf16(h, fmt)
    return h, r2, xq, rs


def same_bits(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if not torch.equal(a.isnan(), b.isnan()):
        return False
    ok = ~a.isnan()
    view = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return bool(torch.equal(a.view(view)[ok], b.view(view)[ok]))


def row(fmt: str, batch: int, copy_bw: float | None, gen: torch.Generator) -> dict:
    sets = [inputs(batch, gen) for _ in range(SETS)]
    x, r, w = sets[0]
    f = add_rms_norm_quantize(x, r, w, EPS, fmt)
    s = separate(x, r, w, fmt)
    names = ("h", "residual", "operand", "row_scale")
    res = {"format": fmt, "batch": batch, "N": N,
           "bit_identical": {n: same_bits(a, b) for n, a, b in zip(names, f, s)},
           "nan_row_propagates": bool(batch <= 2 or f[2][1].isnan().any().item())}
    f_noh = add_rms_norm_quantize(x, r, w, EPS, fmt, store_h=False)
    res["bit_identical"]["operand_without_h"] = same_bits(f_noh[2], s[2])
    res["separate_us"] = timed_us([lambda x=x, r=r, w=w: separate(x, r, w, fmt) for x, r, w in sets])
    res["fused_us"] = timed_us([lambda x=x, r=r, w=w: add_rms_norm_quantize(x, r, w, EPS, fmt) for x, r, w in sets])
    res["fused_noh_us"] = timed_us([lambda x=x, r=r, w=w: add_rms_norm_quantize(x, r, w, EPS, fmt, store_h=False)
                                    for x, r, w in sets])
    act = batch * N * 2
    rs = batch * 4 if fmt == "nvfp4:row" else 0
    res["bytes"] = {"separate": 6 * act + rs, "fused": 5 * act + rs, "fused_noh": 4 * act + rs}
    if copy_bw:
        res["floor_us"] = {k: v / copy_bw / 1e6 for k, v in res["bytes"].items()}
    # informational: 8 warps a row (the quantize kernel's count at 4096) reduce the norm's sum in another order, so
    # not the shipped kernel's bits; what a switch of both norm kernels to 8 warps would buy
    f8 = add_rms_norm_quantize(x, r, w, EPS, fmt, store_h=False, num_warps=8)
    res["fused_noh_8warps"] = {"operand_bits_equal": same_bits(f8[2], s[2]), "us": timed_us(
        [lambda x=x, r=r, w=w: add_rms_norm_quantize(x, r, w, EPS, fmt, store_h=False, num_warps=8)
         for x, r, w in sets])}
    res["saved_us"] = res["separate_us"] - res["fused_noh_us"]
    res["speedup_noh"] = res["separate_us"] / res["fused_noh_us"]
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=60.0)
    args = ap.parse_args()
    t0 = time.time()
    gen = torch.Generator().manual_seed(0)
    out = {"device": torch.cuda.get_device_name() if not SMOKE else "cpu (interpreter smoke)", "rows": [],
           "errors": [], "skipped": []}
    try:
        out["copy_rw_TBps"] = copy_TBps()
    except Exception:   # noqa: BLE001
        out["errors"].append({"what": "copy bandwidth", "trace": traceback.format_exc()[-1500:]})
        out["copy_rw_TBps"] = None
    for fmt in FORMATS:
        for batch in BATCHES:
            if time.time() - t0 > args.budget_s:
                out["skipped"].append(f"{fmt} B={batch}: budget")
                continue
            try:
                r = row(fmt, batch, out["copy_rw_TBps"], gen)
                out["rows"].append(r)
                print(json.dumps(r), flush=True)
            except Exception:   # noqa: BLE001
                out["errors"].append({"what": f"{fmt} B={batch}", "trace": traceback.format_exc()[-1500:]})
                print(out["errors"][-1]["trace"], flush=True)
    out["all_bit_identical"] = all(all(r["bit_identical"].values()) for r in out["rows"]) and bool(out["rows"])
    out["total_s"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0 if out["all_bit_identical"] and not out["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
