"""Decode attention on a GPU: our paged kernel per KV format against SDPA over a contiguous BF16 cache and the
roofline, at B x context (Qwen3-8B heads: 32 query / 8 KV heads x 128).

    python benchmarks/attention.py --out attention.json [--batches 32,256] [--contexts 8192,32768]
                                   [--formats bf16,fp8_e4m3,nvfp4,mxfp4] [--sweep] [--check] [--splits 1,2,3,4]

- ceilings, measured in the same run: read-only bandwidth (a sum over 4 GiB) and a copy (read + write).
- SDPA: `scaled_dot_product_attention(q [B, 32, 1, 128], K/V [B, 8, L, 128], enable_gqa=True)` under each
  backend (default, cuDNN, efficient, flash); the fastest is the baseline (and named).
- ours: `kernels.paged_attention.decode_attention` over pages scattered at random (64 tokens per page for the
  quantized formats, 16 for bf16), with valid random codes and scales; a few sequences checked against the
  torch reference first. roofline = cache bytes read / read bandwidth.
- `--sweep`: tile (block_t), pipeline stages and the split heuristic (programs per SM) for each format at
  each shape; the best is reported next to the default.
- `--splits`: ours with each of these split counts as well (the engine's timed variants, `kernels.decode_attention:
  sN`), each checked against the reference; `split_rows` per count: us, launched splits, read TB/s, x SDPA.
- Read bandwidth (`read_TBps`, per SDPA backend and per variant of ours): the live K/V bytes (B x L tokens) over
  the time; contexts need not be a multiple of the page (the last page is partly filled, as in the engine).

Times are medians of CUDA-graph replays (each replay runs the call `reps` times back to back) in microseconds.
The caches are GBs, far above the 50 MB L2: every replay reads HBM. Results are written after every row.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from trace_rl.bench.measure import graph_median_us  # noqa: E402
from trace_rl.formats.paged_kv import PagedKV, default_block_size  # noqa: E402

SMOKE = os.environ.get("ATTN_BENCH_SMOKE") == "1"     # CPU dry run of the script (interpreter, tiny shapes)
DEV = "cpu" if SMOKE else "cuda"
HQ, HKV, D = 32, 8, 128


def graph_us(fn, calls: int = 5, reps: int = 9) -> float:
    """Median microseconds per call: `calls` calls captured in one CUDA graph, replayed `reps` times."""
    if SMOKE:
        import time

        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    return graph_median_us([fn] * calls, reps, warmup=1)


def ceilings() -> dict:
    n = 1 << (16 if SMOKE else 30)                                  # 1 Gi floats = 4 GiB
    a = torch.randn(n, device=DEV)
    b = torch.empty_like(a)
    out = torch.empty((), device=DEV)
    read = graph_us(lambda a=a, out=out: torch.sum(a, 0, out=out), calls=3, reps=7)
    copy = graph_us(lambda a=a, b=b: b.copy_(a), calls=3, reps=7)
    del a, b
    torch.cuda.empty_cache()
    return {"read_TBps": 4 * n / read / 1e6, "copy_rw_TBps": 2 * 4 * n / copy / 1e6}


def sdpa(batch: int, ctx: int, log) -> dict:
    from kernel_baselines import sdpa_backends_us

    q = torch.randn(batch, HQ, 1, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(batch, HKV, ctx, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    res = {"kv_bytes": 2 * k.numel() * 2, **sdpa_backends_us(q, k, v, graph_us)}
    res["read_TBps"] = {n[:-3]: res["kv_bytes"] / t / 1e6 for n, t in res.items() if n.endswith("_us")}
    del q, k, v
    torch.cuda.empty_cache()
    return res


def random_cache(fmt: str, role: str, blocks: int, page: int, gen: torch.Generator) -> PagedKV:
    """Valid random contents (timing on zeros can flatter a kernel): codes uniform, scales in a normal range."""
    c = PagedKV.allocate(fmt, blocks, page, HKV, D, device=DEV, role=role)
    if fmt == "bf16":
        c.codes.normal_(generator=gen)
        return c
    c.codes.random_(0, 256, generator=gen)
    if fmt == "fp8_e4m3":
        c.codes.bitwise_and_(0x77)                                  # no NaN codes
        c.scales.uniform_(0.001, 0.01, generator=gen)
        return c
    lo, hi = (64, 100) if fmt == "nvfp4" else (120, 130)           # stored bytes of finite, normal scales
    c.scales.random_(lo, hi, generator=gen)
    if c.global_scale is not None:
        c.global_scale.uniform_(0.001, 0.01, generator=gen)
    return c


def ours(fmt: str, batch: int, ctx: int, read_bw: float, sweep: bool, log, gen, splits: tuple = ()) -> dict:
    from trace_rl.kernels.attention_config import launch_config, split_tokens
    from trace_rl.kernels.attention_reference import decode_attention_reference
    from trace_rl.kernels.paged_attention import decode_attention

    page = default_block_size(fmt)
    pages = -(-ctx // page)
    blocks = batch * pages
    table = torch.randperm(blocks, device=DEV, generator=None).to(torch.int32).reshape(batch, pages)
    lens = torch.full((batch,), ctx, device=DEV, dtype=torch.int32)
    q = torch.randn(batch, HQ, D, device=DEV, dtype=torch.bfloat16)
    k, v = random_cache(fmt, "k", blocks, page, gen), random_cache(fmt, "v", blocks, page, gen)
    nbytes = (k.nbytes + v.nbytes) * ctx // (pages * page)        # the live tokens' bytes
    row = {"format": fmt, "batch": batch, "context": ctx, "page": page, "cache_bytes": nbytes,
           "roofline_us": nbytes / read_bw * 1e6}
    scale = D ** -0.5
    # correctness on two sequences (the reference gathers and dequantizes their whole context)
    sub = slice(0, 2)
    want = decode_attention_reference(q[sub], k, v, table[sub], lens[sub], scale).float()

    def rel_err(splits=None, k=k, v=v) -> float:
        got = decode_attention(q, k, v, table, lens, scale, splits=splits)[sub].float()
        return ((got - want).norm() / want.norm()).item()

    row["rel_err_vs_reference"] = rel_err()
    call = lambda kw={}, q=q, k=k, v=v: decode_attention(q, k, v, table, lens, scale, **kw)  # noqa: E731
    row["us"] = graph_us(call)
    row["bw_frac"] = row["roofline_us"] / row["us"]
    row["read_TBps"] = nbytes / row["us"] / 1e6
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    block_t = 64 if SMOKE else launch_config(fmt, batch, HKV, pages * page, sms)[0].block_t
    row["default_splits"] = launch_config(fmt, batch, HKV, pages * page, sms)[1]
    for s in splits:                 # the engine's split variants (here the table holds exactly the context)
        try:
            err = rel_err(splits=s)
            us = graph_us(lambda s=s: call({"splits": s}))
            rs = {"splits": s, "launched": split_tokens(pages * page, s, block_t)[1], "us": us,
                  "read_TBps": nbytes / us / 1e6, "bw_frac": row["roofline_us"] / us,
                  "vs_default": row["us"] / us, "rel_err_vs_reference": err}
        except Exception as e:
            rs = {"splits": s, "error": repr(e)[:300]}
        row.setdefault("split_rows", []).append(rs)
        log(rs)
    if sweep:
        best = None
        many = batch * HKV < 4 * torch.cuda.get_device_properties(0).multi_processor_count   # splits matter
        configs = [dict(block_t=bt, num_stages=st, programs_per_sm=pps, **({"maxnreg": mr} if mr else {}))
                   for bt, st, mr in ((64, 2, None), (64, 3, None), (64, 2, 128), (128, 2, None), (128, 2, 168),
                                      (128, 3, 168), (128, 3, None))
                   for pps in ((1.0, 2.0, 4.0) if many else (2.0,))]
        for kw in configs:
            try:
                us = graph_us(lambda kw=kw: call(kw), calls=3, reps=5)
            except Exception as e:
                row.setdefault("sweep_errors", []).append(f"{kw}: {repr(e)[:150]}")
                continue
            row.setdefault("sweep", []).append({**kw, "us": us})
            if best is None or us < best["us"]:
                best = {**kw, "us": us}
        row["sweep_best"] = best
    del k, v
    torch.cuda.empty_cache()
    return row


def run_checks(spec: str) -> dict:
    """`spec`: test files (comma list), optionally ':' and a pytest -k expression; they run on the GPU."""
    files, _, expr = spec.partition(":")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files.split(",")]
    proc = subprocess.run(cmd + (["-k", expr] if expr else ["-m", "gpu"]), capture_output=True, text=True,
                          timeout=400)
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    return {"returncode": proc.returncode, "summary": tail[-1] if tail else "", "tail": tail[-30:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="attention.json")
    ap.add_argument("--batches", default="32,256")
    ap.add_argument("--contexts", default="8192,32768")
    ap.add_argument("--formats", default="bf16,fp8_e4m3,nvfp4,mxfp4")
    ap.add_argument("--sweep", default="", help="formats to sweep (comma list)")
    ap.add_argument("--sweep-shapes", default="32x8192,256x8192", help="BxL shapes swept ('all': every shape)")
    ap.add_argument("--check", default="", help="FILES[:K_EXPR]: tests to run on the GPU first (default -m gpu)")
    ap.add_argument("--splits", default="", help="split counts to time ours with as well (comma list, e.g. 1,2,3,4)")
    args = ap.parse_args()
    splits = tuple(int(s) for s in args.splits.split(",") if s)
    import triton

    if SMOKE:
        torch.cuda.get_device_name = lambda *a: "cpu (smoke)"
        torch.cuda.get_device_properties = lambda *a: type("P", (), {"multi_processor_count": 4})()
    props = torch.cuda.get_device_properties(0)
    res = {"env": {"device": torch.cuda.get_device_name(0), "sms": props.multi_processor_count,
                   "torch": torch.__version__, "triton": triton.__version__,
                   "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                   "command": " ".join(sys.argv)}, "rows": []}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    def log(obj):
        print(json.dumps(obj), flush=True)

    if args.check:
        res["check"] = run_checks(args.check)
        log(res["check"]["summary"])
        save()
    res["ceilings"] = ceilings()
    log(res["ceilings"])
    save()
    read_bw = res["ceilings"]["read_TBps"] * 1e12
    gen = torch.Generator(device=DEV)
    gen.manual_seed(0)
    sweep_fmts = set(filter(None, args.sweep.split(",")))
    sweep_shapes = {tuple(int(x) for x in s.split("x")) for s in args.sweep_shapes.split(",") if "x" in s}
    for batch in (int(b) for b in args.batches.split(",")):
        for ctx in (int(c) for c in args.contexts.split(",")):
            base = {"batch": batch, "context": ctx}
            try:
                base["sdpa"] = sdpa(batch, ctx, log)
                base["sdpa"]["bw_frac"] = base["sdpa"]["kv_bytes"] / (base["sdpa"]["best_us"] * 1e-6) / read_bw
            except Exception:
                base["sdpa_error"] = traceback.format_exc()[-1500:]
            log(base)
            for fmt in args.formats.split(","):
                try:
                    swept = fmt in sweep_fmts and (args.sweep_shapes == "all" or (batch, ctx) in sweep_shapes)
                    row = ours(fmt, batch, ctx, read_bw, swept, log, gen, splits)
                    if "sdpa" in base:
                        row["speedup_vs_sdpa"] = base["sdpa"]["best_us"] / row["us"]
                        cudnn = base["sdpa"].get("cudnn_us")
                        for rs in (r for r in row.get("split_rows", []) if "us" in r):
                            rs["speedup_vs_sdpa"] = base["sdpa"]["best_us"] / rs["us"]
                            rs["speedup_vs_cudnn"] = cudnn / rs["us"] if cudnn else None
                    row["sdpa_best"] = base.get("sdpa", {}).get("best")
                except Exception:
                    row = {"format": fmt, "batch": batch, "context": ctx, "error": traceback.format_exc()[-1500:]}
                res["rows"].append({**row, "sdpa_us": base.get("sdpa", {}).get("best_us")})
                log(res["rows"][-1])
                save()
            res.setdefault("sdpa", []).append(base)
            save()
    print_table(res)


def print_table(res: dict) -> None:
    print(f"\nread {res['ceilings']['read_TBps']:.2f} TB/s; us (x SDPA; fraction of read bandwidth)")
    by = {}
    for r in res["rows"]:
        by.setdefault((r["batch"], r["context"]), {})[r["format"]] = r
    for (b, c), rows in by.items():
        sd = next((s["sdpa"] for s in res.get("sdpa", [])
                   if (s["batch"], s["context"]) == (b, c) and "sdpa" in s), {})
        cells = [f"SDPA({sd.get('best', '?')}) {sd.get('best_us', float('nan')):.0f}"]
        for fmt, r in rows.items():
            if "us" in r:
                cells.append(f"{fmt} {r['us']:.0f} ({r.get('speedup_vs_sdpa', float('nan')):.2f}x; "
                             f"{r['bw_frac']:.2f}) err {r['rel_err_vs_reference']:.1e}"
                             + (f" best {r['sweep_best']['us']:.0f} {r['sweep_best']}" if r.get("sweep_best") else ""))
                cells += [f"{fmt}:s{x['splits']} {x['us']:.0f} ({x.get('speedup_vs_sdpa', float('nan')):.2f}x; "
                          f"{x['read_TBps']:.2f} TB/s)" if "us" in x else f"{fmt}:s{x['splits']} error"
                          for x in r.get("split_rows", [])]
            else:
                cells.append(f"{fmt} error")
        print(f"B={b} L={c}: " + " | ".join(cells))


if __name__ == "__main__":
    main()
