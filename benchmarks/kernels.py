"""FP4/FP8 Triton kernels on a GPU: correctness (the kernel tests) and timings against cuBLAS, gemlite and SDPA.

    python benchmarks/kernels.py --out kernels.json [--check] [--sweep] [--sections gemm,grouped,quant,attn,gemlite]

- `--check` runs `pytest tests/kernels` first (GPU tests included; the compile gate is left to CI) and records the
  summary.
- ceilings: device-to-device copy (read + write) and a read-only reduction, measured here.
- gemm: W4A16 / W4A4 (nvfp4, mxfp4) against cuBLAS BF16 `F.linear` at Qwen3-8B shapes (K, N) and M = 1..512; W4A4
  twice: with the activation quantize kernel (`fp4_linear`) and on pre-quantized activations
  (`fp4_linear_prequantized`, what a fused producer feeds). Roofline: FP4 bytes / measured read bandwidth.
  `--sweep` times candidate tiles and splits (nvfp4 W4A16) at the issue's shapes and uses the fastest for
  every variant of that row (the default config's nvfp4 W4A16 time is recorded too).
- grouped: the mixture-of-experts GEMM at the Qwen3-30B-A3B expert shape (hidden 2048, expert intermediate 768,
  128 experts, top-8; gate+up [1536, 2048] and down [2048, 768]) for 64-512 tokens, against a per-expert cuBLAS
  loop captured in a CUDA graph and `torch._grouped_mm` (`kernels_moe.sweep_grouped`; its own script sweeps the
  configs at the MoE rollout's decode batches).
- quant: activation quantization per token; the weight re-quantization of a Qwen3-8B-shaped model (252 linears:
  quantize + the Hopper layout) captured in one CUDA graph: the default kernels (quantize(fast=False) then
  relayout), and the engine's sync as it runs (`sync_8b_*_engine_*`: `QuantLinear.load_weight` of all 252 linears,
  the fused path, checked bit-exact against the default first) (`--fast-quantize`: also with
  `quantize(..., fast=True)` and the raw `quantize_relayout` calls, each checked bit-exact first)
  (kernels_quant.py).
- gemlite: its 4-bit (INT4, group 64) GEMM at the same shapes (source carried in GEMLITE_SRC, never installed).
- attn: paged decode attention per KV format against BF16 SDPA over a contiguous cache, contexts 1k-32k.

Timing: each measured call is captured `n` times in a CUDA graph (over `n` different weight copies, so that
together they exceed the 50 MB L2 and the bytes come from HBM) and the graph is replayed; the median replay
over `n` is reported in microseconds. Kernel variants are compiled first, in parallel processes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kernel_baselines import (  # noqa: E402
    ceilings,
    finish_pytest,
    gemlite_available,
    gemlite_int4_linear,
    graph_us,
    json_saver,
    precompile,
    run_env,
    start_pytest,
    weight_copies,
)
from kernels_moe import sweep_grouped  # noqa: E402
from kernels_quant import bench_quant  # noqa: E402

from trace_rl.backends import PackedWeight  # noqa: E402
from trace_rl.bench.measure import median_ms  # noqa: E402
from trace_rl.formats.paged_kv import PagedKV  # noqa: E402

DEV = "cuda"
GEMM_SHAPES = [(4096, 12288), (12288, 4096), (4096, 1024), (4096, 4096)]   # (K, N): up, down, k/v, q/o
GEMM_M = [1, 4, 16, 32, 64, 128, 256, 512]
SWEEP_SHAPES = [(4096, 12288), (12288, 4096), (4096, 1024)]
SWEEP_M = [1, 16, 64, 256]
ATTN_CONTEXTS = [1024, 4096, 8192, 16384, 32768]
MOE_TOKENS = [64, 128, 256, 512]


def loop_ms(fn, reps: int = 3) -> float:
    """Median milliseconds of fn() (eager: Python and launch overheads included), CUDA events."""
    return median_ms(fn, torch.device("cuda"), iters=reps, warmup=0)


def num_sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def sweep_candidates(M: int) -> list:
    from trace_rl.kernels.fp4_gemm import GemmConfig

    if M <= 16:
        tiles, splits = [(16, 256, 128, 4, 4), (16, 256, 128, 4, 3), (16, 128, 256, 4, 3), (16, 128, 128, 4, 4),
                         (16, 256, 256, 8, 3)], [1, 2, 4, 8, 16]
    elif M <= 32:
        tiles, splits = [(32, 256, 128, 4, 3), (32, 128, 128, 4, 3), (16, 256, 128, 4, 4)], [1, 2, 4, 8]
    elif M <= 64:
        tiles = [(64, 256, 128, 8, 3), (64, 128, 128, 4, 3), (64, 128, 128, 8, 3), (32, 256, 128, 4, 3)]
        splits = [1, 2, 4]
    else:
        tiles = [(128, 256, 128, 8, 3), (128, 128, 128, 8, 3), (256, 128, 128, 8, 3), (64, 256, 128, 8, 3)]
        splits = [1, 2]
    return [GemmConfig(bm, bn, bk, s, nw, ns) for bm, bn, bk, nw, ns in tiles for s in splits]


def compile_jobs(sweep: bool, grouped: bool) -> list:
    from kernels_moe import grouped_configs

    from trace_rl.kernels.fp4_gemm import default_config
    from trace_rl.kernels.fp4_grouped import GROUPED_M16, GROUPED_M32

    cfgs = [default_config(M, 4096, 4096, num_sms()) for M in GEMM_M]
    if sweep:
        cfgs += [c for M in GEMM_M for c in sweep_candidates(M) if c.split_k == 1]
    jobs = [("dense", f, a, tuple(c.__dict__.items())) for c in cfgs for f in ("nvfp4", "mxfp4") for a in ("bf16", f)]
    if grouped:
        for c in [GROUPED_M16, GROUPED_M32] + (grouped_configs() if sweep else []):
            jobs += [("grouped", f, "bf16", tuple(c.__dict__.items())) for f in ("nvfp4", "mxfp4")]
    return [(k, f, a, tuple((n, 1 if n == "split_k" else v) for n, v in c)) for k, f, a, c in jobs]


def _sweep(M, packed_nv, x, cublas_us, row) -> object:
    """Time the candidate tiles/splits (nvfp4 W4A16); record them and return the fastest config."""
    from trace_rl.kernels.linear import fp4_linear

    best = None
    for c in sweep_candidates(M):
        try:
            us = graph_us([lambda p=p, x=x, c=c: fp4_linear(x, p, "bf16", None, config=c) for p in packed_nv], reps=7)
        except Exception as e:   # noqa: BLE001
            row.setdefault("sweep_errors", []).append(f"{c}: {repr(e)[:200]}")
            continue
        row.setdefault("sweep", []).append({**c.__dict__, "us": us})
        if best is None or us < best[1]:
            best = (c, us)
    if best:
        row["sweep_best"] = {**best[0].__dict__, "us": best[1], "speedup": cublas_us / best[1]}
        return best[0]
    return None


def bench_gemm(read_bw: float, sweep: bool, log) -> list:
    """Per shape and M: cuBLAS; with --sweep the candidate configs first (nvfp4 W4A16), then every variant with
    the fastest one ("config"), and nvfp4 W4A16 with `default_config` too."""
    from trace_rl.formats import per_token
    from trace_rl.kernels import quantize
    from trace_rl.kernels.fp4_gemm import default_config
    from trace_rl.kernels.linear import fp4_linear, fp4_linear_prequantized, hopper_weight
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    sms, rows = num_sms(), []
    for K, N in GEMM_SHAPES:
        n_copies = weight_copies(N * K // 2)
        w_bf16 = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02 for _ in range(n_copies)]
        packed = {f: [PackedWeight(f, N, K, q=quantize(w, f)) for w in w_bf16] for f in ("nvfp4", "mxfp4")}
        layout_bytes = {f: [hopper_weight(p) for p in packed[f]][0].nbytes for f in packed}   # derive all now
        for M in GEMM_M:
            x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
            row = {"K": K, "N": N, "M": M, "copies": n_copies}
            row["cublas_bf16_us"] = graph_us([lambda w=w, x=x: F.linear(x, w) for w in w_bf16])
            cfg = default_config(M, N, K, sms)
            row["default_config"] = cfg.__dict__
            row["nvfp4_w4a16_default_us"] = graph_us(
                [lambda p=p, x=x, c=cfg: fp4_linear(x, p, "bf16", None, config=c) for p in packed["nvfp4"]])
            if sweep and (K, N) in SWEEP_SHAPES:
                cfg = _sweep(M, packed["nvfp4"], x, row["cublas_bf16_us"], row) or cfg
            row["config"] = cfg.__dict__
            for fmt in ("nvfp4", "mxfp4"):
                nbytes = layout_bytes[fmt] + 2 * M * (K + N)
                row[f"{fmt}_floor_us"] = nbytes / read_bw * 1e6
                xq, rs = quantize_dequant_bf16(x, per_token(fmt))
                variants = {"w4a16": lambda p, x=x, c=cfg: fp4_linear(x, p, "bf16", None, config=c),
                            "w4a4": lambda p, x=x, f=fmt, c=cfg: fp4_linear(x, p, f, None, config=c),
                            "w4a4pre": lambda p, xq=xq, rs=rs, c=cfg: fp4_linear_prequantized(xq, rs, p, config=c)}
                for tag, fn in variants.items():
                    key = f"{fmt}_{tag}"
                    try:   # one failing variant must not lose the run
                        us = graph_us([lambda p=p, fn=fn: fn(p) for p in packed[fmt]])
                    except Exception as e:   # noqa: BLE001
                        row[key + "_error"] = repr(e)[:300]
                        continue
                    row[key + "_us"] = us
                    row[key + "_speedup"] = row["cublas_bf16_us"] / us
                    row[key + "_bw_frac"] = nbytes / (us * 1e-6) / read_bw
            log(row)
            rows.append(row)
        del w_bf16, packed
        torch.cuda.empty_cache()
    return rows


def bench_gemlite(read_bw: float, gemm_rows: list, log) -> list:
    ok, info = gemlite_available()
    if not ok:
        log({"gemlite": info})
        return [{"error": info}]
    rows = []
    cublas = {(r["K"], r["N"], r["M"]): r["cublas_bf16_us"] for r in gemm_rows}
    for K, N in SWEEP_SHAPES:
        n_copies = weight_copies(N * K // 2)
        try:
            layers = [gemlite_int4_linear(torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02)
                      for _ in range(n_copies)]
        except Exception as e:   # noqa: BLE001
            rows.append({"K": K, "N": N, "error": repr(e)[:300]})
            continue
        for M in (1, 16, 64, 256, 512):
            x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
            row = {"K": K, "N": N, "M": M, "version": info}
            try:
                row["gemlite_int4_g64_us"] = graph_us([lambda lay=lay, x=x: lay(x) for lay in layers], reps=10)
                if (K, N, M) in cublas:
                    row["speedup_vs_cublas"] = cublas[(K, N, M)] / row["gemlite_int4_g64_us"]
            except Exception as e:   # noqa: BLE001
                row["error"] = repr(e)[:300]
            log(row)
            rows.append(row)
        del layers
        torch.cuda.empty_cache()
    return rows

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




def start_checks(paths: str):
    """`pytest` on the kernel tests (GPU tests included; the compile gate is CI's), in the background."""
    files = paths.split(",") if paths else ["tests/kernels"]
    return start_pytest(files, "--deselect", "tests/kernels/test_sass_gate.py")


def finish_checks(proc, timeout: float = 400) -> dict:
    return finish_pytest(proc, timeout)


def _cell(r: dict, key: str) -> str:
    return f"{r[key + '_us']:6.1f} ({r[key + '_speedup']:.2f}x)" if key + "_us" in r else "error"


def print_tables(res: dict) -> None:
    if res.get("gemm"):
        print("\nGEMM us (speedup vs cuBLAS bf16); w4a4 = with the quantize kernel, pre = pre-quantized activations")
        heads = ("nv w4a16", "nv w4a4", "nv pre", "mx w4a16", "mx w4a4", "mx pre")
        print(f"{'KxN':>11} {'M':>4} {'cuBLAS':>7} " + " ".join(f"{h:>15}" for h in heads)
              + f" {'nv bw':>6} {'sweep':>14}")
        for r in res["gemm"]:
            cells = [_cell(r, f"{f}_{t}") for f in ("nvfp4", "mxfp4") for t in ("w4a16", "w4a4", "w4a4pre")]
            best = f"{r['sweep_best']['us']:.1f} ({r['sweep_best']['speedup']:.2f}x)" if "sweep_best" in r else "-"
            bw = r.get("nvfp4_w4a16_bw_frac", float("nan"))
            print(f"{r['K']:>5}x{r['N']:<5} {r['M']:>4} {r['cublas_bf16_us']:7.1f} "
                  + " ".join(f"{c:>15}" for c in cells) + f" {bw:6.2f} {best:>14}")
    if res.get("grouped"):
        print("\ngrouped MoE us (Qwen3-30B-A3B experts, top-8 of 128; best config, x the best BF16 baseline)")
        print(f"{'gemm':>8} {'tokens':>6} {'cublas loop':>11} {'grouped_mm':>10} {'nvfp4':>14} {'mxfp4':>14}")
        for r in res["grouped"]:
            g = lambda k, r=r: f"{r[k]:.1f}" if k in r else "-"  # noqa: E731
            fp = [f"{r[f + '_a16_best']['us']:.1f} ({r[f + '_a16_best']['x_bf16_best']:.2f}x)"
                  if f + "_a16_best" in r else "error" for f in ("nvfp4", "mxfp4")]
            print(f"{r['gemm']:>8} {r['B']:>6} {g('cublas_loop_us'):>11} {g('grouped_mm_us'):>10} "
                  f"{fp[0]:>14} {fp[1]:>14}")
    if res.get("gemlite"):
        print("\ngemlite:", json.dumps(res["gemlite"])[:2000])
    if "quant" in res:
        print("\nquantize:", json.dumps({k: round(v, 3) for k, v in res["quant"].items() if isinstance(v, float)}))
    if res.get("attn"):
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
    ap.add_argument("--check-only", default="", help="comma-separated test paths for --check (default tests/kernels)")
    ap.add_argument("--sweep", action="store_true", help="GEMM and grouped tile/split sweeps")
    ap.add_argument("--attn-sweep", action="store_true", help="attention tile/split sweep at 8k context")
    ap.add_argument("--sections", default="gemm,grouped,quant,gemlite,attn")
    ap.add_argument("--jobs", type=int, default=12, help="processes compiling kernel variants before timing")
    ap.add_argument("--fast-quantize", action="store_true",
                    help="quant: also time the 8B weight sync with quantize(..., fast=True)")
    args = ap.parse_args()
    sections = args.sections.split(",")
    props = torch.cuda.get_device_properties(0)
    res = {"env": run_env(torch.cuda.get_device_name(0), sms=props.multi_processor_count)}
    save = json_saver(res, args.out)

    def log(obj):
        print(json.dumps(obj), flush=True)

    checks = start_checks(args.check_only) if args.check else None   # runs while the variants compile
    t0 = datetime.datetime.now()
    res["compile_errors"] = precompile(compile_jobs(args.sweep, "grouped" in sections), args.jobs) \
        if ("gemm" in sections or "grouped" in sections) else []
    res["compile_s"] = (datetime.datetime.now() - t0).total_seconds()
    log({"compile_s": res["compile_s"], "errors": res["compile_errors"][:5]})
    if checks is not None:
        res["check"] = finish_checks(checks)
        log(res["check"]["summary"])
        save()
    res["ceilings"] = ceilings()
    log(res["ceilings"])
    read_bw = res["ceilings"]["read_TBps"] * 1e12
    res["gemm"], res["grouped"] = [], []

    def logger(key):
        def _log(row):
            log(row)
            save()
        return _log

    for name, fn in (("gemm", lambda: bench_gemm(read_bw, args.sweep, logger("gemm"))),
                     ("grouped", lambda: sweep_grouped(MOE_TOKENS, read_bw, logger("grouped"), float("inf"),
                                                       args.sweep)),
                     ("quant", lambda: bench_quant(read_bw, log, args.fast_quantize)),
                     ("gemlite", lambda: bench_gemlite(read_bw, res.get("gemm") or [], log)),
                     ("attn", lambda: bench_attn(read_bw, log, sweep=args.attn_sweep))):
        if name in sections:
            try:
                res[name] = fn()
            except Exception:   # noqa: BLE001
                res[name + "_error"] = traceback.format_exc()[-2000:]
                print(res[name + "_error"], flush=True)
            save()
    print_tables(res)


if __name__ == "__main__":
    main()
