"""The opt-in Gluon warp-specialised FP4-KV decode attention (trace_rl/kernels/paged_attention_gluon.py) over mxfp4
and nvfp4 caches against the shipped Triton kernel over the same cache (paged_attention.decode_attention, its launch
policy) and SDPA over a contiguous bf16 cache (every backend; cuDNN reported; measured once per shape, shared by the
two formats' rows), Qwen3-8B heads (32 q / 8 kv x 128), 64-token pages scattered at random, B = 32 and 256 at 8k,
B = 32 at 32k; per shape the mxfp4 row first. Method of benchmarks/attention.py (reused): CUDA-graph medians (5
calls per graph, 9 replays), the read ceiling measured in the same run (a sum over 4 GiB), fraction = live cache
bytes of that format (codes, scales and nvfp4's per-token factors) / us / ceiling. Each row also records the Gluon
output's relative difference from the shipped kernel's (whole batch) and from the torch reference (two sequences).
Gluon stages 2 and 4, otherwise the default config (mxfp4: the exact 2**125 bias multiply), and for mxfp4 also 4
stages with the bias folded into the scale pairs (opt-in mx_fold=True, exact for scales 2**-70 .. 2**63); 3 stages,
the slowest of the three at every shape on 2026-12-02 (results/*_1202b), dropped to keep the run under 120 s with
both formats.

    python benchmarks/attention_gluon.py --out OUT.json [--budget-s 80] [--formats mxfp4,nvfp4]
    ATTN_BENCH_SMOKE=1 TRITON_INTERPRET=1 python benchmarks/attention_gluon.py --out /tmp/x.json   # CPU dry run
      (tiny shapes; the Gluon calls fail there with its "needs an sm_90 GPU" error, recorded per row)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import attention as A  # noqa: E402
import torch  # noqa: E402
from kernel_baselines import json_saver  # noqa: E402

SHAPES = ((2, 200), (3, 130)) if A.SMOKE else ((32, 8192), (256, 8192), (32, 32768))
FORMATS = ("mxfp4", "nvfp4")
VARIANTS = {"gluon_s2": dict(stages=2), "gluon_s4": dict(stages=4), "gluon_s4_fold": dict(stages=4, mx_fold=True)}
DEV = A.DEV


def row(fmt: str, batch: int, ctx: int, read_bw: float, gen, log, sdpa: dict | None) -> dict:
    """One format at one shape; SDPA measured here unless `sdpa` (the shape's, from the other format's row)."""
    from trace_rl.kernels.attention_reference import decode_attention_reference
    from trace_rl.kernels.paged_attention import decode_attention
    from trace_rl.kernels.paged_attention_gluon import GluonAttentionConfig, decode_attention_gluon

    page = 64
    pages = -(-ctx // page)
    blocks = batch * pages
    t0 = time.time()
    table = torch.randperm(blocks, device=DEV).to(torch.int32).reshape(batch, pages)
    lens = torch.full((batch,), ctx, device=DEV, dtype=torch.int32)
    q = torch.randn(batch, A.HQ, A.D, device=DEV, dtype=torch.bfloat16)
    k, v = A.random_cache(fmt, "k", blocks, page, gen), A.random_cache(fmt, "v", blocks, page, gen)
    nbytes = (k.nbytes + v.nbytes) * ctx // (pages * page)
    r = {"format": fmt, "batch": batch, "context": ctx, "cache_bytes": nbytes, "roofline_us": nbytes / read_bw * 1e6}
    scale = A.D ** -0.5
    shipped = decode_attention(q, k, v, table, lens, scale)
    r["shipped_us"] = A.graph_us(lambda k=k, v=v: decode_attention(q, k, v, table, lens, scale))
    r["shipped_bw_frac"] = r["roofline_us"] / r["shipped_us"]
    log({"format": fmt, "batch": batch, "context": ctx, "shipped_us": r["shipped_us"]})
    sub = slice(0, 2)
    want = decode_attention_reference(q[sub], k, v, table[sub], lens[sub], scale).float()
    for name, kw in VARIANTS.items():
        if kw.get("mx_fold") and fmt != "mxfp4":
            continue
        try:
            c = GluonAttentionConfig(**kw)
            got = decode_attention_gluon(q, k, v, table, lens, scale, config=c)
            res = {"rel_diff_vs_shipped": ((got.float() - shipped.float()).norm() / shipped.float().norm()).item(),
                   "rel_err_vs_reference": ((got[sub].float() - want).norm() / want.norm()).item(),
                   "nan": bool(got.isnan().any())}
            res["us"] = A.graph_us(lambda c=c, k=k, v=v: decode_attention_gluon(q, k, v, table, lens, scale, config=c))
            res["bw_frac"] = r["roofline_us"] / res["us"]
            res["speedup_vs_shipped"] = r["shipped_us"] / res["us"]
        except Exception:   # noqa: BLE001
            res = {"error": traceback.format_exc()[-1500:]}
        r[name] = res
        log({name: res})
    del k, v
    if not A.SMOKE:
        torch.cuda.empty_cache()
    if sdpa is None:
        try:
            sdpa = A.sdpa(batch, ctx, log)
            sdpa["bw_frac"] = sdpa["kv_bytes"] / (sdpa["best_us"] * 1e-6) / read_bw
            r["sdpa"] = sdpa
        except Exception:   # noqa: BLE001
            r["sdpa_error"] = traceback.format_exc()[-800:]
    else:
        r["sdpa_from"] = "the shape's other row"
    if sdpa is not None and sdpa.get("best_us"):
        r["sdpa_best"], r["sdpa_best_us"], r["cudnn_us"] = sdpa["best"], sdpa["best_us"], sdpa.get("cudnn_us")
        r["shipped_speedup_vs_sdpa"] = sdpa["best_us"] / r["shipped_us"]
        for name in VARIANTS:
            if "us" in r.get(name, {}):
                r[name]["speedup_vs_sdpa"] = sdpa["best_us"] / r[name]["us"]
    r["elapsed_s"] = time.time() - t0
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=80.0)
    ap.add_argument("--formats", default=",".join(FORMATS))
    args = ap.parse_args()
    start = time.time()
    device = "cpu (smoke)" if A.SMOKE else torch.cuda.get_device_name()
    res = {"device": device, "torch": torch.__version__, "rows": [], "skipped": []}
    import triton

    res["triton"] = triton.__version__

    def log(obj):
        print(json.dumps(obj), flush=True)

    save = json_saver(res, args.out)

    res["ceilings"] = A.ceilings()
    log(res["ceilings"])
    read_bw = res["ceilings"]["read_TBps"] * 1e12
    gen = torch.Generator(device=DEV).manual_seed(0)
    for batch, ctx in SHAPES:
        sdpa = None
        for fmt in args.formats.split(","):
            if time.time() - start > args.budget_s:
                res["skipped"].append([fmt, batch, ctx])
                continue
            try:
                r = row(fmt, batch, ctx, read_bw, gen, log, sdpa)
                sdpa = r.get("sdpa", sdpa)
            except Exception:   # noqa: BLE001
                r = {"format": fmt, "batch": batch, "context": ctx, "error": traceback.format_exc()[-1500:]}
            res["rows"].append(r)
            save()
    res["elapsed_s"] = time.time() - start
    save()
    print("\nfmt B x ctx: shipped us (frac) | gluon " + "/".join(VARIANTS) + " us (frac, x SDPA) | SDPA best us")
    nan = float("nan")
    for r in res["rows"]:
        g = " ".join(f"{r.get(n, {}).get('us', nan):.0f} ({r.get(n, {}).get('bw_frac', nan):.2f}, "
                     f"{r.get(n, {}).get('speedup_vs_sdpa', nan):.2f}x)" for n in VARIANTS)
        print(f"{r['format']} {r['batch']} x {r['context']}: {r.get('shipped_us', nan):.0f} "
              f"({r.get('shipped_bw_frac', nan):.2f}) | {g} | {r.get('sdpa_best_us')}")


if __name__ == "__main__":
    main()
