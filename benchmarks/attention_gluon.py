"""The opt-in Gluon warp-specialised nvfp4 decode attention (trace_rl/kernels/paged_attention_gluon.py) against the
shipped Triton nvfp4 kernel (paged_attention.decode_attention, its launch policy) and SDPA over a contiguous bf16
cache (every backend; cuDNN reported), Qwen3-8B heads (32 q / 8 kv x 128), 64-token pages scattered at random,
B = 32 and 256 at 8k, B = 32 at 32k. Method of benchmarks/attention.py (reused): CUDA-graph medians (5 calls per
graph, 9 replays), the read ceiling measured in the same run (a sum over 4 GiB), fraction = live cache bytes / us /
ceiling. Each row also records the Gluon output's relative difference from the shipped kernel's (whole batch) and
from the torch reference (two sequences).

    python benchmarks/attention_gluon.py --out OUT.json [--budget-s 80]
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

SHAPES = ((32, 8192), (256, 8192), (32, 32768))
VARIANTS = {"gluon_s3": dict(stages=3), "gluon_s2": dict(stages=2), "gluon_s4": dict(stages=4)}


def row(batch: int, ctx: int, read_bw: float, gen, log) -> dict:
    from trace_rl.kernels.attention_reference import decode_attention_reference
    from trace_rl.kernels.paged_attention import decode_attention
    from trace_rl.kernels.paged_attention_gluon import GluonAttentionConfig, decode_attention_gluon

    page = 64
    pages = -(-ctx // page)
    blocks = batch * pages
    table = torch.randperm(blocks, device="cuda").to(torch.int32).reshape(batch, pages)
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    q = torch.randn(batch, A.HQ, A.D, device="cuda", dtype=torch.bfloat16)
    k, v = A.random_cache("nvfp4", "k", blocks, page, gen), A.random_cache("nvfp4", "v", blocks, page, gen)
    nbytes = (k.nbytes + v.nbytes) * ctx // (pages * page)
    r = {"batch": batch, "context": ctx, "cache_bytes": nbytes, "roofline_us": nbytes / read_bw * 1e6}
    scale = A.D ** -0.5
    shipped = decode_attention(q, k, v, table, lens, scale)
    r["shipped_us"] = A.graph_us(lambda k=k, v=v: decode_attention(q, k, v, table, lens, scale))
    r["shipped_bw_frac"] = r["roofline_us"] / r["shipped_us"]
    log({"batch": batch, "context": ctx, "shipped_us": r["shipped_us"]})
    sub = slice(0, 2)
    want = decode_attention_reference(q[sub], k, v, table[sub], lens[sub], scale).float()
    for name, kw in VARIANTS.items():
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
    torch.cuda.empty_cache()
    try:
        sd = A.sdpa(batch, ctx, log)
        sd["bw_frac"] = sd["kv_bytes"] / (sd["best_us"] * 1e-6) / read_bw
        r["sdpa"] = sd
        r["cudnn_us"] = sd.get("cudnn_us")
    except Exception:   # noqa: BLE001
        r["sdpa_error"] = traceback.format_exc()[-800:]
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=80.0)
    args = ap.parse_args()
    start = time.time()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": [], "skipped": []}
    import triton

    res["triton"] = triton.__version__

    def log(obj):
        print(json.dumps(obj), flush=True)

    save = json_saver(res, args.out)

    res["ceilings"] = A.ceilings()
    log(res["ceilings"])
    read_bw = res["ceilings"]["read_TBps"] * 1e12
    gen = torch.Generator(device="cuda").manual_seed(0)
    for batch, ctx in SHAPES:
        if time.time() - start > args.budget_s:
            res["skipped"].append([batch, ctx])
            continue
        try:
            res["rows"].append(row(batch, ctx, read_bw, gen, log))
        except Exception:   # noqa: BLE001
            res["rows"].append({"batch": batch, "context": ctx, "error": traceback.format_exc()[-1500:]})
        save()
    save()
    print("\nB x ctx: shipped us (frac) | gluon s2/s3/s4 us (frac) | cuDNN us")
    for r in res["rows"]:
        g = " ".join(f"{r.get(n, {}).get('us', float('nan')):.0f} ({r.get(n, {}).get('bw_frac', float('nan')):.2f})"
                     for n in VARIANTS)
        print(f"{r['batch']} x {r['context']}: {r.get('shipped_us', float('nan')):.0f} "
              f"({r.get('shipped_bw_frac', float('nan')):.2f}) | {g} | {r.get('cudnn_us')}")


if __name__ == "__main__":
    main()
