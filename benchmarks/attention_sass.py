"""The Gluon FP4-KV decode attention's SASS-reduction variants (issue 15; docs/benchmarks.md "Decode attention", the
compile-only class table from trace_rl/kernels/sass_histogram.py) timed against the shipped Gluon config and SDPA
over a contiguous bf16 cache (cuDNN and the other backends, the best of them), Qwen3-8B heads (32 q / 8 kv x 128),
64-token pages scattered at random, every sequence at the row's length: B = 32 x 8192, 313 x 8447, 256 x 8192,
32 x 32768, 313 x 257 (in that order: the budget drops the last ones first), nvfp4 and mxfp4.

Variants (GluonAttentionConfig; SASS per K/V element at group 4 from the compile gate): gluon (the shipped default:
nvfp4 3.08, mxfp4 3.43), lean (paged_attention_gluon.LEAN: N = 8, two tiles per loop iteration, the one-barrier
column max: nvfp4 2.78, mxfp4 3.21), for nvfp4 also colmax (the column max alone, 2.87: LEAN_WIDE, what groups
9..16 would run), lean_s2 (LEAN with 2 stages, 2.73) and the persistent kernel without / with the column max
(persistent, 3.36 with every wgmma serialised by ptxas; persistent_colmax, 2.91, not serialised), for mxfp4 fold
(the opt-in folded bias, 3.15), fold_lean (2.82) and checked_lean (paged_attention_gluon.LEAN_CHECKED: the
2**5-offset fold, exact in its scale window 64..134, out-of-window items recomputed by a second launch: 2.86;
its base is the exact lean) and checked_lean_pdl (LEAN_CHECKED_PDL: the same with its REDO launched as a
programmatic dependent, redo_pdl; base the exact lean).
--pair-rounds N: after a row's variants, each pair of PAIRS (checked_lean_pdl / checked_lean) timed N more times
alternately (`pairs`: both medians per round and the best of each), so that a few-us difference is not one sample's
noise.
Method of benchmarks/attention.py (reused): CUDA-graph medians
(5 calls per graph, 9 replays), the read ceiling measured in the same run, fraction = live cache bytes of that
format / us / ceiling.
Each variant's output is compared with its base's (`vs_base`: bit-identical or the max |diff|; the base is the
shipped default, gluon, except fold_lean's, fold; fold itself against gluon differs from the exact bias only
outside its scale window, which the random scales here never reach, and may differ in the last bit where the score
scale's rounding changes) and, on two sequences, with the torch reference (attention_reference).

    python benchmarks/attention_sass.py --out OUT.json [--budget-s 80]
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

SHAPES = ((3, 130), (2, 257)) if A.SMOKE else ((32, 8192), (313, 8447), (256, 8192), (32, 32768), (313, 257))
FORMATS = ("nvfp4", "mxfp4")
LEAN = dict(n_pad=8, unroll=2, col_max=True)       # paged_attention_gluon.LEAN's fields
VARIANTS = {"nvfp4": {"gluon": dict(), "lean": LEAN, "colmax": dict(col_max=True),
                      "colmax_u2": dict(col_max=True, unroll=2), "lean_s2": dict(LEAN, stages=2),
                      "persistent": dict(persistent=True), "persistent_colmax": dict(persistent=True, col_max=True),
                      "persistent_lean": dict(LEAN, persistent=True)},
            "mxfp4": {"gluon": dict(), "lean": LEAN, "colmax": dict(col_max=True),
                      "colmax_u2": dict(col_max=True, unroll=2), "fold": dict(mx_fold=True),
                      "fold_lean": dict(LEAN, mx_fold=True), "persistent_lean": dict(LEAN, persistent=True),
                      "checked_lean": dict(LEAN, mx_checked=True),
                      "checked_lean_pdl": dict(LEAN, mx_checked=True, redo_pdl=True)}}
# what a variant must be bit-identical to (the rest: the shipped default, gluon)
# (persistent_lean: against gluon, the same bits)
BASE = {"fold_lean": "fold", "persistent_colmax": "persistent", "checked_lean": "lean", "checked_lean_pdl": "lean"}
PAIRS = {"checked_lean_pdl": "checked_lean"}     # --pair-rounds: timed again alternately
PAIR_ROUNDS = [0]
DEV = A.DEV
ONLY: set[str] = set()      # --variants


def _diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    bits = bool(torch.equal(a.view(torch.int16), b.view(torch.int16))) if a.dtype == torch.bfloat16 else \
        bool(torch.equal(a, b))
    a, b = a.float(), b.float()
    return {"max_abs": (a - b).abs().max().item(), "bit_identical": bits}


def row(fmt: str, batch: int, ctx: int, read_bw: float, gen, log, sdpa: dict | None) -> dict:
    from trace_rl.kernels.attention_reference import decode_attention_reference
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
    sub = slice(0, 2)
    want = decode_attention_reference(q[sub], k, v, table[sub], lens[sub], scale).float()
    outs, fns = {}, {}
    for name, kw in VARIANTS[fmt].items():
        if ONLY and name not in ONLY and name != "gluon":
            continue
        try:
            c = GluonAttentionConfig(**kw)
            got = outs[name] = decode_attention_gluon(q, k, v, table, lens, scale, config=c)
            res = {"nan": bool(got.isnan().any()),
                   "rel_err_vs_reference": ((got[sub].float() - want).norm() / want.norm()).item()}
            base_name = BASE.get(name, "gluon")
            if name != base_name and base_name in outs:
                res["vs_base"] = {"base": base_name, **_diff(got, outs[base_name])}
            fns[name] = lambda c=c, k=k, v=v: decode_attention_gluon(q, k, v, table, lens, scale, config=c)
            res["us"] = A.graph_us(fns[name])
            res["bw_frac"] = r["roofline_us"] / res["us"]
        except Exception:   # noqa: BLE001
            res = {"error": traceback.format_exc()[-1500:]}
        r[name] = res
        log({name: res})
    for a, b in PAIRS.items():
        if PAIR_ROUNDS[0] and a in fns and b in fns:
            try:
                rounds = [{n: A.graph_us(fns[n]) for n in (b, a)} for _ in range(PAIR_ROUNDS[0])]
                r.setdefault("pairs", {})[a] = {"vs": b, "rounds": rounds, f"{a}_best_us": min(x[a] for x in rounds),
                                                f"{b}_best_us": min(x[b] for x in rounds)}
            except Exception:   # noqa: BLE001
                r.setdefault("pairs", {})[a] = {"error": traceback.format_exc()[-800:]}
            log({"pairs": r["pairs"][a]})
    base = r.get("gluon", {}).get("us")
    for name in VARIANTS[fmt]:
        if name != "gluon" and base and "us" in r.get(name, {}):
            r[name]["speedup_vs_gluon"] = base / r[name]["us"]
    del k, v, outs, fns
    if not A.SMOKE:
        torch.cuda.empty_cache()
    if sdpa is None and not A.SMOKE:
        try:
            sdpa = A.sdpa(batch, ctx, log)
            sdpa["bw_frac"] = sdpa["kv_bytes"] / (sdpa["best_us"] * 1e-6) / read_bw
            r["sdpa"] = sdpa
        except Exception:   # noqa: BLE001
            r["sdpa_error"] = traceback.format_exc()[-800:]
    if sdpa is not None and sdpa.get("best_us"):
        r["sdpa_best"], r["sdpa_best_us"], r["cudnn_us"] = sdpa["best"], sdpa["best_us"], sdpa.get("cudnn_us")
        r["sdpa_bw_frac"] = sdpa.get("bw_frac")
        for name in VARIANTS[fmt]:
            if "us" in r.get(name, {}):
                r[name]["speedup_vs_sdpa"] = sdpa["best_us"] / r[name]["us"]
    r["elapsed_s"] = time.time() - t0
    return r, sdpa


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=80.0)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--shapes", default="", help='B x L rows to run instead of SHAPES, e.g. "313x4352,313x8447"')
    ap.add_argument("--variants", default="", help="comma list of variant names to time (gluon always; default all): "
                    "a variant whose kernel faults poisons the process's CUDA context for every later row")
    ap.add_argument("--pair-rounds", type=int, default=0, help="extra alternate timings of each PAIRS pair per row")
    args = ap.parse_args()
    PAIR_ROUNDS[0] = args.pair_rounds
    ONLY.update(v for v in args.variants.split(",") if v)
    start = time.time()
    import triton

    res = {"device": "cpu (smoke)" if A.SMOKE else torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "rows": [], "skipped": []}

    def log(obj):
        print(json.dumps(obj), flush=True)

    save = json_saver(res, args.out)
    res["ceilings"] = A.ceilings()
    log(res["ceilings"])
    read_bw = res["ceilings"]["read_TBps"] * 1e12
    gen = torch.Generator(device=DEV).manual_seed(0)
    shapes = [tuple(int(v) for v in t.split("x")) for t in args.shapes.split(",") if t] or SHAPES
    for batch, ctx in shapes:
        sdpa = None                   # once per shape (the bf16 cache is the same for both formats)
        for fmt in args.formats.split(","):
            if time.time() - start > args.budget_s:
                res["skipped"].append([fmt, batch, ctx])
                continue
            try:
                r, sdpa = row(fmt, batch, ctx, read_bw, gen, log, sdpa)
            except Exception:   # noqa: BLE001
                r = {"format": fmt, "batch": batch, "context": ctx, "error": traceback.format_exc()[-1500:]}
            res["rows"].append(r)
            save()
    res["elapsed_s"] = time.time() - start
    save()
    nan = float("nan")
    print("\nfmt B x L: variant us (fraction of read ceiling, speedup vs shipped gluon, bit-identical to its base) | "
          "sdpa best us")
    for r in res["rows"]:
        cells = [f"{n} {r.get(n, {}).get('us', nan):.1f} ({r.get(n, {}).get('bw_frac', nan):.2f}, "
                 f"{r.get(n, {}).get('speedup_vs_gluon', 1.0):.3f}x, "
                 f"{r.get(n, {}).get('vs_base', {}).get('bit_identical', '-')})" for n in VARIANTS[r["format"]]]
        print(f"{r['format']} {r['batch']} x {r['context']}: " + " | ".join(cells) + f" | {r.get('sdpa_best_us')}")


if __name__ == "__main__":
    main()
