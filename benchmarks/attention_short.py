"""Short-context FP4-KV decode attention: the shipped Gluon kernel (one program per (kv head, sequence)) against its
persistent variant (`GluonAttentionConfig(persistent=True)`, trace_rl/kernels/paged_attention_gluon_persistent.py)
and the shipped Triton kernel (paged_attention.decode_attention, its launch policy), Qwen3-8B heads (32 q / 8 kv x
128), 64-token pages scattered at random, every sequence at the row's length: B = 313 at L = 257 / 1024 / 4352 /
8447 (the engine's fixed 8k workload's batch; 257 / 4352 / 8447 are its three profiled contexts) and B = 32 at 8192
(the long-context shape of benchmarks/attention_gluon.py), nvfp4 and mxfp4 (the default exact bias multiply).
Method of benchmarks/attention.py (reused): CUDA-graph medians (5 calls per graph, 9 replays), the read ceiling
measured in the same run, fraction = live cache bytes of that format (codes, scales, nvfp4's per-token factors of
the L tokens; the tile padding a kernel also reads is not counted) / us / ceiling. Each row records the variants'
differences (persistent vs shipped Gluon: max |diff| and whether bit-identical; both vs the Triton kernel) and,
on two sequences, the relative error against the torch reference (attention_reference).

    python benchmarks/attention_short.py --out OUT.json [--budget-s 80]
    ATTN_BENCH_SMOKE=1 TRITON_INTERPRET=1 python benchmarks/attention_short.py --out /tmp/x.json   # CPU dry run
      (tiny shapes; the Gluon calls fail there with "needs an sm_90 GPU", recorded per row)
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

SHAPES = ((3, 130), (2, 257)) if A.SMOKE else ((313, 257), (313, 1024), (313, 4352), (313, 8447), (32, 8192))
FORMATS = ("nvfp4", "mxfp4")
VARIANTS = {"gluon": dict(), "persistent": dict(persistent=True)}
DEV = A.DEV


def _diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.float(), b.float()
    return {"max_abs": (a - b).abs().max().item(), "rel": ((a - b).norm() / b.norm()).item(),
            "bit_identical": bool(torch.equal(a, b))}


def row(fmt: str, batch: int, ctx: int, read_bw: float, gen, log) -> dict:
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
    r = {"format": fmt, "batch": batch, "context": ctx, "programs_shipped": batch * A.HKV, "cache_bytes": nbytes,
         "roofline_us": nbytes / read_bw * 1e6}
    scale = A.D ** -0.5
    triton_out = decode_attention(q, k, v, table, lens, scale)
    r["triton_us"] = A.graph_us(lambda k=k, v=v: decode_attention(q, k, v, table, lens, scale))
    r["triton_bw_frac"] = r["roofline_us"] / r["triton_us"]
    log({"format": fmt, "batch": batch, "context": ctx, "triton_us": r["triton_us"]})
    sub = slice(0, 2)
    want = decode_attention_reference(q[sub], k, v, table[sub], lens[sub], scale).float()
    outs = {}
    for name, kw in VARIANTS.items():
        try:
            c = GluonAttentionConfig(**kw)
            got = outs[name] = decode_attention_gluon(q, k, v, table, lens, scale, config=c)
            res = {"vs_triton": _diff(got, triton_out), "nan": bool(got.isnan().any()),
                   "rel_err_vs_reference": ((got[sub].float() - want).norm() / want.norm()).item()}
            res["us"] = A.graph_us(lambda c=c, k=k, v=v: decode_attention_gluon(q, k, v, table, lens, scale, config=c))
            res["bw_frac"] = r["roofline_us"] / res["us"]
            res["speedup_vs_triton"] = r["triton_us"] / res["us"]
        except Exception:   # noqa: BLE001
            res = {"error": traceback.format_exc()[-1500:]}
        r[name] = res
        log({name: res})
    if "us" in r["gluon"] and "us" in r["persistent"]:
        r["persistent_speedup_vs_gluon"] = r["gluon"]["us"] / r["persistent"]["us"]
        r["persistent_vs_gluon"] = _diff(outs["persistent"], outs["gluon"])
    del k, v
    if not A.SMOKE:
        torch.cuda.empty_cache()
    r["elapsed_s"] = time.time() - t0
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=80.0)
    ap.add_argument("--formats", default=",".join(FORMATS))
    args = ap.parse_args()
    start = time.time()
    import triton

    res = {"device": "cpu (smoke)" if A.SMOKE else torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "rows": [], "skipped": []}
    if not A.SMOKE:
        res["sms"] = torch.cuda.get_device_properties(0).multi_processor_count

    def log(obj):
        print(json.dumps(obj), flush=True)

    save = json_saver(res, args.out)
    res["ceilings"] = A.ceilings()
    log(res["ceilings"])
    read_bw = res["ceilings"]["read_TBps"] * 1e12
    gen = torch.Generator(device=DEV).manual_seed(0)
    for batch, ctx in SHAPES:
        for fmt in args.formats.split(","):
            if time.time() - start > args.budget_s:
                res["skipped"].append([fmt, batch, ctx])
                continue
            try:
                r = row(fmt, batch, ctx, read_bw, gen, log)
            except Exception:   # noqa: BLE001
                r = {"format": fmt, "batch": batch, "context": ctx, "error": traceback.format_exc()[-1500:]}
            res["rows"].append(r)
            save()
    res["elapsed_s"] = time.time() - start
    save()
    nan = float("nan")
    print("\nfmt B x L: triton us (frac) | gluon us (frac) | persistent us (frac) | persistent / gluon speedup")
    for r in res["rows"]:
        g, p = r.get("gluon", {}), r.get("persistent", {})
        print(f"{r['format']} {r['batch']} x {r['context']}: {r.get('triton_us', nan):.1f} "
              f"({r.get('triton_bw_frac', nan):.2f}) | {g.get('us', nan):.1f} ({g.get('bw_frac', nan):.2f}) | "
              f"{p.get('us', nan):.1f} ({p.get('bw_frac', nan):.2f}) | {r.get('persistent_speedup_vs_gluon', nan):.2f}")


if __name__ == "__main__":
    main()
