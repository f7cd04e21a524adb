"""FP4/FP8 Triton kernels on a GPU: correctness (the kernel tests) and timings against cuBLAS / SDPA.

    python benchmarks/kernels.py --out kernels.json [--check] [--sweep] [--sections gemm,quant,attn]

- `--check` runs `pytest tests/kernels` first (GPU tests included) and records the summary.
- ceilings: device-to-device copy (read + write) and a read-only reduction, measured here.
- gemm: W4A16 / W4A4 (nvfp4, mxfp4) against cuBLAS BF16 `F.linear` at Qwen3-8B shapes (K, N) and
  M = 1..512. `--sweep` also times candidate tile configs for nvfp4 W4A16 and records the best.
- quant: weight quantization throughput (one 12288x4096 weight, and every linear weight of an 8B model
  in a Python loop), activation quantization per token.
- attn: paged decode attention per KV format against BF16 SDPA over a contiguous cache, contexts 1k-32k.

Timing: each measured call is captured `n` times in a CUDA graph (over `n` different weight copies, so
that together they exceed the 50 MB L2 and the bytes come from HBM) and the graph is replayed; the
median replay over `n` is reported in microseconds. Warm-up (compilation) happens before capture.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trace_rl.backends import PackedWeight  # noqa: E402
from trace_rl.bench.measure import median_ms  # noqa: E402
from trace_rl.formats.paged_kv import PagedKV  # noqa: E402

DEV = "cuda"
GEMM_SHAPES = [(4096, 4096), (4096, 1024), (4096, 12288), (12288, 4096)]   # (K, N): q/o, k/v, up, down
GEMM_M = [1, 4, 16, 64, 256, 512]
SWEEP_M = [1, 64, 256]
ATTN_CONTEXTS = [1024, 4096, 8192, 16384, 32768]
QWEN3_8B_LINEARS = [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096), (12288, 4096), (12288, 4096),
                    (4096, 12288)]   # (N, K) of q, k, v, o, gate, up, down; 36 layers


def graph_us(calls: list, reps: int = 15) -> float:
    """Median microseconds per call: all `calls` captured once in a CUDA graph, replayed `reps` times."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls[:2]:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return statistics.median(times)


def loop_ms(fn, reps: int = 3) -> float:
    """Median milliseconds of fn() (eager: Python and launch overheads included), CUDA events."""
    return median_ms(fn, torch.device("cuda"), iters=reps, warmup=0)


def ceilings() -> dict:
    n = 1 << 30                                                  # 1 Gi floats = 4 GiB
    a = torch.randn(n, device=DEV)
    b = torch.empty_like(a)
    copy = graph_us([lambda a=a, b=b: b.copy_(a)], reps=10)
    read = graph_us([lambda a=a: torch.amax(a)], reps=10)
    del a, b
    return {"copy_rw_TBps": 2 * 4 * n / copy / 1e6, "read_TBps": 4 * n / read / 1e6}


def num_sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def _copies(nbytes: int, target: int = 200 << 20, cap: int = 64) -> int:
    return max(2, min(cap, math.ceil(target / nbytes)))


def bench_gemm(read_bw: float, sweep: bool, log, rows: list) -> list:
    from trace_rl.kernels import quantize
    from trace_rl.kernels.fp4_gemm import default_config
    from trace_rl.kernels.linear import fp4_linear

    sms = num_sms()
    for K, N in GEMM_SHAPES:
        n_copies = _copies(N * K // 2)
        w_bf16 = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02 for _ in range(n_copies)]
        packed = {f: [PackedWeight(f, N, K, q=quantize(w, f)) for w in w_bf16] for f in ("nvfp4", "mxfp4")}
        for M in GEMM_M:
            x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
            row = {"K": K, "N": N, "M": M, "copies": n_copies}
            row["cublas_bf16_us"] = graph_us([lambda w=w, x=x: F.linear(x, w) for w in w_bf16])
            cfg = default_config(M, N, K, sms)
            row["default_config"] = cfg.__dict__
            for fmt in ("nvfp4", "mxfp4"):
                q0 = packed[fmt][0].q
                w_bytes = q0.codes.numel() + q0.scales.numel() * q0.scales.element_size()
                for act in ("bf16", fmt):
                    tag = f"{fmt}_{'w4a16' if act == 'bf16' else 'w4a4'}"
                    try:
                        us = graph_us([lambda p=p, x=x, a=act: fp4_linear(x, p, a) for p in packed[fmt]])
                    except Exception as e:   # record and go on: one failing variant must not lose the run
                        row[tag + "_error"] = repr(e)[:300]
                        continue
                    row[tag + "_us"] = us
                    row[tag + "_speedup"] = row["cublas_bf16_us"] / us
                    row[tag + "_bw_frac"] = (w_bytes + 2 * M * (K + N)) / (us * 1e-6) / read_bw
            if sweep and K * N >= 4096 * 12288 and M in SWEEP_M:
                best = None
                for c in _candidates(M, N, K):
                    try:
                        calls = [lambda p=p, x=x, c=c: fp4_linear(x, p, "bf16", None, config=c)
                                 for p in packed["nvfp4"]]
                        us = graph_us(calls, reps=7)
                    except Exception as e:
                        row.setdefault("sweep_errors", []).append(f"{c}: {repr(e)[:200]}")
                        continue
                    row.setdefault("sweep", []).append({**c.__dict__, "us": us})
                    if best is None or us < best[1]:
                        best = (c.__dict__, us)
                if best:
                    row["sweep_best"] = {**best[0], "us": best[1]}
            log(row)
        del w_bf16, packed
        torch.cuda.empty_cache()
    return rows


def _candidates(M, N, K):
    from trace_rl.kernels.fp4_gemm import GemmConfig

    out = []
    if M <= 16:
        tiles = [(16, 64, 256, 4, 4), (16, 64, 128, 4, 4), (16, 32, 256, 4, 4)]
        splits = [1, 2, 4, 8]
    elif M <= 64:
        tiles = [(64, 64, 128, 4, 3), (32, 64, 128, 4, 3)]
        splits = [1, 2, 4]
    else:
        tiles = [(128, 64, 128, 4, 3), (64, 64, 128, 4, 3), (128, 128, 64, 8, 4), (64, 128, 128, 8, 3)]
        splits = [1, 2]
    for bm, bn, bk, nw, ns in tiles:
        for s in splits:
            if K // (bk * s) >= 2:
                out.append(GemmConfig(bm, bn, bk, s, nw, ns, 1))
    bm, bn, bk, nw, ns = tiles[0]
    out.append(GemmConfig(bm, bn, bk, splits[1] if M <= 16 else 1, nw, ns, 0))   # the pure-Triton decode
    return out


def bench_quant(read_bw: float, log) -> dict:
    from trace_rl.kernels import quantize
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    res = {}
    N, K = 12288, 4096
    ws = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) for _ in range(4)]
    for fmt in ("nvfp4", "mxfp4", "fp8_e4m3:row"):
        us = graph_us([lambda w=w, f=fmt: quantize(w, f) for w in ws])
        passes = 2 if fmt == "nvfp4" else 1                 # nvfp4: amax pass, then the quantize pass
        out_bytes = N * K // 2 + N * K // 16 if fmt != "fp8_e4m3:row" else N * K
        res[f"weight_{fmt}_us"] = us
        res[f"weight_{fmt}_bw_frac"] = (passes * 2 * N * K + out_bytes) / (us * 1e-6) / read_bw
    del ws
    # every linear weight of a Qwen3-8B-shaped model (36 layers), quantized in a Python loop
    weights = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16) for _ in range(36) for n, k in QWEN3_8B_LINEARS]
    params = sum(w.numel() for w in weights)
    for fmt in ("nvfp4", "mxfp4"):
        for w in weights[:7]:
            quantize(w, fmt)
        res[f"model_8b_{fmt}_ms"] = loop_ms(lambda f=fmt, ws=weights: [quantize(w, f) for w in ws])
        # the same 252 calls captured in one CUDA graph: GPU time without Python/launch overhead
        res[f"model_8b_{fmt}_graph_ms"] = graph_us([lambda f=fmt, ws=weights: [quantize(w, f) for w in ws]],
                                                   reps=3) / 1e3
    res["model_8b_params"] = params
    del weights
    torch.cuda.empty_cache()
    for M in (1, 64, 512):
        x = torch.randn(M, 4096, device=DEV, dtype=torch.bfloat16)
        res[f"act_nvfp4_row_M{M}_us"] = graph_us([lambda x=x: quantize(x, "nvfp4:row")] * 8)
        res[f"act_w4a4_nvfp4_M{M}_us"] = graph_us([lambda x=x: quantize_dequant_bf16(x, "nvfp4:row")] * 8)
        res[f"act_fp8_row_M{M}_us"] = graph_us([lambda x=x: quantize(x, "fp8_e4m3:row")] * 8)
    log(res)
    return res


def _random_cache(fmt: str, blocks: int, page: int, heads: int, dim: int) -> PagedKV:
    c = PagedKV.allocate(fmt, blocks, page, heads, dim, device=DEV)
    if fmt == "bf16":
        c.codes.normal_()
        return c
    c.codes.view(torch.uint8).copy_(torch.randint(0, 256, c.codes.shape, device=DEV, dtype=torch.uint8))
    if fmt == "fp8_e4m3":
        c.codes.view(torch.uint8).bitwise_and_(0xF7)                # no NaN codes (0x7F / 0xFF)
        c.scales.uniform_(0.001, 0.01)
    elif fmt == "nvfp4":
        c.scales.view(torch.uint8).copy_(torch.randint(0x30, 0x60, c.scales.shape, device=DEV, dtype=torch.uint8))
        c.global_scale.uniform_(0.001, 0.01)
    else:
        c.scales.copy_(torch.randint(120, 130, c.scales.shape, device=DEV, dtype=torch.uint8))
    return c


def bench_attn(read_bw: float, log, batch: int = 32, sweep: bool = False) -> list:
    from trace_rl.kernels.paged_attention import decode_attention

    hq, hkv, dim, page = 32, 8, 128, 16
    rows = []
    for ctx in ATTN_CONTEXTS:
        pages = ctx // page
        blocks = batch * pages
        block_table = torch.randperm(blocks, device=DEV).to(torch.int32).reshape(batch, pages)
        lens = torch.full((batch,), ctx, device=DEV, dtype=torch.int32)
        q = torch.randn(batch, hq, dim, device=DEV, dtype=torch.bfloat16)
        row = {"context": ctx, "batch": batch}
        kc = torch.randn(batch, hkv, ctx, dim, device=DEV, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        q4 = q.unsqueeze(2)
        sdpa = lambda q4=q4, kc=kc, vc=vc: F.scaled_dot_product_attention(q4, kc, vc, enable_gqa=True)  # noqa: E731
        row["sdpa_bf16_us"] = graph_us([sdpa])
        row["kv_bytes_bf16"] = 2 * kc.numel() * 2
        row["sdpa_bw_frac"] = row["kv_bytes_bf16"] / (row["sdpa_bf16_us"] * 1e-6) / read_bw
        del kc, vc, sdpa
        for fmt in ("bf16", "fp8_e4m3", "nvfp4", "mxfp4"):
            k, v = _random_cache(fmt, blocks, page, hkv, dim), _random_cache(fmt, blocks, page, hkv, dim)
            nbytes = k.nbytes + v.nbytes
            try:
                call = lambda q=q, k=k, v=v, bt=block_table, n=lens: decode_attention(q, k, v, bt, n, dim**-0.5)  # noqa
                us = graph_us([call])
            except Exception as e:
                row[f"{fmt}_error"] = repr(e)[:300]
                continue
            row[f"{fmt}_us"] = us
            row[f"{fmt}_bw_frac"] = nbytes / (us * 1e-6) / read_bw
            del k, v
            torch.cuda.empty_cache()
        if sweep and ctx == 8192:   # tiles and splits around the launcher's defaults, bf16 and nvfp4
            for fmt in ("bf16", "nvfp4"):
                k, v = _random_cache(fmt, blocks, page, hkv, dim), _random_cache(fmt, blocks, page, hkv, dim)
                for bt_ in (32, 64, 128):
                    for sp in (3, 6, 12, 24):
                        call = lambda q=q, k=k, v=v, b=block_table, n=lens, t=bt_, s=sp: decode_attention(  # noqa
                            q, k, v, b, n, dim**-0.5, block_t=t, splits=s)
                        try:
                            row.setdefault("sweep", []).append({"fmt": fmt, "block_t": bt_, "splits": sp,
                                                                "us": graph_us([call], reps=7)})
                        except Exception as e:
                            row.setdefault("sweep_errors", []).append(repr(e)[:200])
                del k, v
        for fmt in ("fp8_e4m3", "nvfp4", "mxfp4"):
            if f"{fmt}_us" in row and "bf16_us" in row:
                row[f"{fmt}_speedup_vs_bf16_kernel"] = row["bf16_us"] / row[f"{fmt}_us"]
                row[f"{fmt}_speedup_vs_sdpa"] = row["sdpa_bf16_us"] / row[f"{fmt}_us"]
        log(row)
        rows.append(row)
    return rows


def run_checks() -> dict:
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/kernels", "-q", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, timeout=240)
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    return {"returncode": proc.returncode, "summary": tail[-1] if tail else "", "tail": tail[-40:]}


def print_tables(res: dict) -> None:
    if "gemm" in res:
        print("\nGEMM us (speedup vs cuBLAS bf16; bw = fraction of read bandwidth)")
        heads = ("nv w4a16", "nv w4a4", "mx w4a16", "mx w4a4")
        print(f"{'KxN':>11} {'M':>4} {'cuBLAS':>7} " + " ".join(f"{h:>15}" for h in heads) + f" {'sweep best':>10}")
        for r in res["gemm"]:
            cells = []
            for tag in ("nvfp4_w4a16", "nvfp4_w4a4", "mxfp4_w4a16", "mxfp4_w4a4"):
                cells.append(f"{r[tag + '_us']:6.1f} ({r[tag + '_speedup']:.2f}x)" if tag + "_us" in r else "error")
            best = f"{r['sweep_best']['us']:.1f}" if "sweep_best" in r else "-"
            print(f"{r['K']:>5}x{r['N']:<5} {r['M']:>4} {r['cublas_bf16_us']:7.1f} "
                  + " ".join(f"{c:>15}" for c in cells) + f" {best:>10}")
    if "quant" in res:
        print("\nquantize:", json.dumps({k: round(v, 3) for k, v in res["quant"].items()}))
    if "attn" in res:
        print("\ndecode attention us (B=32, 32q/8kv heads x 128, pages of 16)")
        print(f"{'ctx':>6} {'sdpa':>8} {'bf16':>8} {'fp8':>8} {'nvfp4':>8} {'mxfp4':>8} {'nvfp4 vs bf16':>14}")
        for r in res["attn"]:
            g = lambda k, r=r: f"{r[k]:8.1f}" if k in r else "   error"  # noqa: E731
            sp = r.get("nvfp4_speedup_vs_bf16_kernel", float("nan"))
            print(f"{r['context']:>6} {g('sdpa_bf16_us')} {g('bf16_us')} {g('fp8_e4m3_us')} {g('nvfp4_us')} "
                  f"{g('mxfp4_us')} {sp:14.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="kernels.json")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="GEMM tile sweep (large shapes)")
    ap.add_argument("--attn-sweep", action="store_true", help="attention tile/split sweep at 8k context")
    ap.add_argument("--sections", default="gemm,quant,attn")
    args = ap.parse_args()
    import triton

    props = torch.cuda.get_device_properties(0)
    res = {"env": {"device": torch.cuda.get_device_name(0), "sms": props.multi_processor_count,
                   "torch": torch.__version__, "triton": triton.__version__,
                   "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                   "command": " ".join(sys.argv)}}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    def log(obj):
        print(json.dumps(obj), flush=True)

    if args.check:
        res["check"] = run_checks()
        log(res["check"]["summary"])
        save()
    res["ceilings"] = ceilings()
    log(res["ceilings"])
    read_bw = res["ceilings"]["read_TBps"] * 1e12
    sections = args.sections.split(",")
    res["gemm"] = []

    def log_gemm(row):
        res["gemm"].append(row)
        log(row)
        save()

    for name, fn in (("gemm", lambda: bench_gemm(read_bw, args.sweep, log_gemm, res["gemm"])),
                     ("quant", lambda: bench_quant(read_bw, log)),
                     ("attn", lambda: bench_attn(read_bw, log, sweep=args.attn_sweep))):
        if name in sections:
            try:
                res[name] = fn()
            except Exception:
                res[name + "_error"] = traceback.format_exc()[-2000:]
                print(res[name + "_error"], flush=True)
            save()
    print_tables(res)


if __name__ == "__main__":
    main()
