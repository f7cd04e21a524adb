"""GPU diagnosis of the 64-token FP4 decode-attention tiles (wrong tails and an illegal address on the H200;
docs/benchmarks.md, "Decode attention"): one launch variant per process, every result flushed as one JSON line
before the next launch, so a CUDA fault (which kills the process) still leaves what ran and names the launch
that faulted.

    python benchmarks/attention_small_tiles.py --variant nvfp4_t64 --out DIR/nvfp4_t64.jsonl
    python benchmarks/attention_small_tiles.py --time --out DIR/time.jsonl      # 64 against 128-token tiles

Checks: a ragged problem (MoE heads: 32 query / 4 KV x 128, pages of 64 tokens scattered, stale NaN V scales in
unwritten slots) with tails of 1-64 tokens in the last tile, against the
torch reference (`decode_attention_reference`), per sequence; split counts 2, 4 and 12 (several tiles per
split, partials merged), then one split with each sequence launched alone (B = 1) and synchronised, shortest
tails first. Variants: the 64-token FP4 tiles as the launcher runs them now (the partial last tile before the
full ones: `paged_attention._last_tile_first`), the same with the old order (last tile after the loop: its
P^T and scratch then reuse q^T's shared memory, the suspected cause), one pipeline stage, and the controls
(128-token tiles and fp8 64-token tiles, which passed in the sweep).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HQ, HKV, D, PAGE, TABLE_PAGES = 32, 4, 128, 64, 48
DEV = "cuda"                     # --device cpu: a dry run in Triton's interpreter (TRITON_INTERPRET=1)
# Last-tile tails: 0 (64), 2 (130), 15, 16, 17, 24, 40, 56, 63; longer ones; a 1-token and an empty sequence.
LENS = [64, 130, 79, 80, 81, 88, 104, 120, 127, 312, 600, 1999, 1, 0]
# name: (kv format, block_t, num_warps, num_stages, maxnreg, order of the last tile: None = the launcher's policy
# (paged_attention._last_tile_first: first for 64-token FP4 tiles), "after" = the old order, after the full tiles)
VARIANTS = {
    "nvfp4_t128": ("nvfp4", 128, 4, 3, 168, None),
    "fp8_t64": ("fp8_e4m3", 64, 4, 3, 128, None),
    "nvfp4_t64": ("nvfp4", 64, 4, 3, 128, None),
    "mxfp4_t64": ("mxfp4", 64, 4, 3, 128, None),
    "nvfp4_t64_s1": ("nvfp4", 64, 4, 1, 128, None),
    "nvfp4_t64_after": ("nvfp4", 64, 4, 3, 128, "after"),
    "mxfp4_t64_after": ("mxfp4", 64, 4, 3, 128, "after"),
}


def log(f, obj) -> None:
    f.write(json.dumps(obj) + "\n")
    f.flush()
    print(json.dumps(obj), flush=True)


def problem(fmt: str, seed: int = 1234):
    import torch

    from trace_rl.formats.paged_kv import PagedKV, slots_for
    from trace_rl.kernels import kv_write

    gen = torch.Generator().manual_seed(seed)
    pages = [math.ceil(n / PAGE) for n in LENS]
    blocks = sum(pages) + 4
    perm = torch.randperm(blocks, generator=gen)
    table = torch.zeros(len(LENS), TABLE_PAGES, dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[used : used + n].to(torch.int32)
        used += n
    k = PagedKV.allocate(fmt, blocks, PAGE, HKV, D, device=DEV, role="k")
    v = PagedKV.allocate(fmt, blocks, PAGE, HKV, D, device=DEV, role="v")
    v.codes.fill_(0x77)
    if fmt == "fp8_e4m3":
        k.scales.fill_(-1.0)
        v.scales.fill_(-1.0)
    else:                                          # NaN block scales in stale slots
        v.scales.fill_(127 if fmt == "nvfp4" else 255)
    for b, n in enumerate(LENS):
        if n:
            slots = slots_for(table[b : b + 1].long(), torch.arange(n)[None], PAGE)[0].to(DEV)
            kv_write(k, slots, (torch.randn(n, HKV, D, generator=gen) * 2).to(torch.bfloat16).to(DEV))
            kv_write(v, slots, torch.randn(n, HKV, D, generator=gen).to(torch.bfloat16).to(DEV))
    q = torch.randn(len(LENS), HQ, D, generator=gen).to(torch.bfloat16).to(DEV)
    return q, k, v, table.to(DEV), torch.tensor(LENS, dtype=torch.int32).to(DEV)


def sync() -> None:
    if DEV == "cuda":
        import torch

        torch.cuda.synchronize()


def rel_errs(out, ref, lens) -> list[float]:
    return [round(((out[b].float() - ref[b].float()).norm() / ref[b].float().norm()).item(), 5) if int(lens[b])
            else round(float(out[b].abs().max()), 5) for b in range(out.shape[0])]


def run_variant(name: str, out_path: str) -> None:
    os.environ["TRACE_RL_TEST_SMALL_FP4_TILES"] = "1"
    fmt, bt, warps, stages, maxnreg, order = VARIANTS[name]
    from trace_rl.kernels import paged_attention
    from trace_rl.kernels.attention_reference import decode_attention_reference
    from trace_rl.kernels.paged_attention import decode_attention

    if order == "after":
        paged_attention.LAST_TILE_FIRST = False

    kw = dict(block_t=bt, num_warps=warps, num_stages=stages, maxnreg=maxnreg)
    with open(out_path, "a") as f:
        q, k, v, table, lens = problem(fmt)
        ref = decode_attention_reference(q, k, v, table, lens, D ** -0.5).float()
        sync()
        last = [n - (n - 1) // bt * bt if n else 0 for n in LENS]      # tokens in the last tile
        log(f, {"variant": name, "lens": LENS, "kw": kw, "last_tile": last, "order": order or "policy"})
        for splits in (2, 4, 12):
            log(f, {"variant": name, "launch": f"splits={splits}"})
            t = time.time()
            out = decode_attention(q, k, v, table, lens, D ** -0.5, splits=splits, **kw)
            sync()
            errs = rel_errs(out, ref, lens)
            log(f, {"variant": name, "splits": splits, "errs": errs, "ok": all(e < 1e-2 for e in errs),
                    "seconds": round(time.time() - t, 2)})
        order = sorted(range(len(LENS)), key=lambda b: (LENS[b] % bt, LENS[b]))   # no masked tile first
        for b in order:                            # one split, one sequence per launch, shortest tails first
            log(f, {"variant": name, "launch": f"splits=1 seq={b} len={LENS[b]}"})
            sl = slice(b, b + 1)
            out = decode_attention(q[sl], k, v, table[sl], lens[sl], D ** -0.5, splits=1, **kw)
            sync()
            e = rel_errs(out, ref[sl], lens[sl])[0]
            log(f, {"variant": name, "splits": 1, "seq": b, "len": LENS[b], "err": e, "ok": e < 1e-2})
        out = decode_attention(q, k, v, table, lens, D ** -0.5, splits=1, **kw)
        sync()
        errs = rel_errs(out, ref, lens)
        log(f, {"variant": name, "splits": 1, "errs": errs, "ok": all(e < 1e-2 for e in errs), "done": True})


def run_timing(out_path: str, variants: list[str]) -> None:
    """64- against 128-token tiles (the shipped launch) at the MoE rollout shapes, 8k context, CUDA graphs; each
    timed launch is first checked against the reference on two sequences of that shape."""
    import torch

    os.environ["TRACE_RL_TEST_SMALL_FP4_TILES"] = "1"
    from trace_rl.bench.measure import graph_median_us
    from trace_rl.formats.paged_kv import PagedKV
    from trace_rl.kernels.attention_config import choose_splits, launch_config
    from trace_rl.kernels.attention_reference import decode_attention_reference
    from trace_rl.kernels.paged_attention import decode_attention

    ctx = 8192
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    with open(out_path, "a") as f:
        for fmt in dict.fromkeys(VARIANTS[v][0] for v in variants):       # in the order given
            for batch in (409, 472):
                gen = torch.Generator(device="cuda").manual_seed(batch)
                pages = ctx // PAGE
                table = torch.randperm(batch * pages, device="cuda").to(torch.int32).reshape(batch, pages)
                lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
                lens[1] = ctx - 37
                q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
                caches = []
                for role in ("k", "v"):
                    c = PagedKV.allocate(fmt, batch * pages, PAGE, HKV, D, device=DEV, role=role)
                    c.codes.random_(0, 256, generator=gen)
                    c.scales.random_(*((64, 100) if fmt == "nvfp4" else (120, 130)), generator=gen)
                    if c.global_scale is not None:
                        c.global_scale.uniform_(0.001, 0.01, generator=gen)
                    caches.append(c)
                k, v = caches
                ref = decode_attention_reference(q[:2], k, v, table[:2], lens[:2], D ** -0.5).float()
                cfg, policy = launch_config(fmt, batch, HKV, ctx, sms)
                runs = [("shipped", {})]
                for name in variants:
                    f_, bt, warps, stages, maxnreg, _ = VARIANTS[name]
                    if f_ != fmt:
                        continue
                    for splits in sorted({1, 2, choose_splits(batch, HKV, ctx, bt, sms, 4.0, 4)}):
                        runs.append((f"{name} splits={splits}", dict(block_t=bt, num_warps=warps, num_stages=stages,
                                                                      maxnreg=maxnreg, splits=splits)))
                for label, kw in runs:
                    row = {"format": fmt, "batch": batch, "context": ctx, "launch": label, "cache_bytes":
                           k.nbytes + v.nbytes, "shipped_cfg": [cfg.block_t, cfg.num_stages, cfg.maxnreg, policy]}
                    log(f, {"launch": label, "batch": batch, "format": fmt})
                    try:
                        out = decode_attention(q, k, v, table, lens, D ** -0.5, **kw)[:2].float()
                        torch.cuda.synchronize()
                        row["rel_err"] = max(((out[i] - ref[i]).norm() / ref[i].norm()).item() for i in range(2))
                        if row["rel_err"] < 1e-2:
                            args = (q, k, v, table, lens, D ** -0.5)
                            row["us"] = graph_median_us([lambda a=args, kw=kw: decode_attention(*a, **kw)] * 3,
                                                        reps=5, warmup=1)
                    except Exception:
                        row["error"] = traceback.format_exc()[-600:]
                    log(f, row)
                del q, k, v, caches
                torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=sorted(VARIANTS))
    ap.add_argument("--time", action="store_true", help="time the --timed variants against the shipped launch")
    ap.add_argument("--timed", default="nvfp4_t64,mxfp4_t64", help="comma-separated variants to time")
    ap.add_argument("--out", required=True, help="JSON-lines file (appended)")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run in Triton's interpreter (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    global DEV
    DEV = args.device
    if args.time:
        run_timing(args.out, [v for v in args.timed.split(",") if v])
    elif args.variant:
        run_variant(args.variant, args.out)
    else:
        ap.error("--variant or --time")


if __name__ == "__main__":
    main()
