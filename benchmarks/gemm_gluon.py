"""The opt-in Gluon warp-specialised nvfp4 W4A16 GEMM (fp4_gemm_gluon.py) against the shipped Triton kernel and
cuBLAS BF16 at the issue's shapes (issue 15: M <= 16 needs >= 1.8x cuBLAS, 2.2x resolves it; M = 64 >= 1.6x; M =
256 / 512 >= 0.8x).

    python benchmarks/gemm_gluon.py --out gemm_gluon.json [--M 1,16] [--budget-s 60]
    python benchmarks/gemm_gluon.py --out gemm_gluon_wide.json --M 64,256,512     # the wide token tiles

Variants apply by M: the decode ones (VARIANTS) at M <= 16, the wide-token-tile ones (WIDE_VARIANTS: config None is
`config_for(M, fmt)`, the launcher's own choice; a dict maps token tiles to configs, the smallest tile covering M,
else the largest) at M > 16.

Per shape (K, N) and M: cuBLAS BF16 `F.linear`, the shipped kernel (`default_config`, nvfp4 and mxfp4), and Gluon
variants (VARIANTS: one / two consumer warpgroups, wgmma overlap, ring depth and register budgets for 2-3 CTAs per
SM) each at its auto split, twice and half that split. Each variant's output is checked against the shipped kernel's
(`rel_diff`, relative Frobenius difference; the split differs, so not bit-exact) before it is timed. Timing as
benchmarks/gemm_tma.py: every call captured over weight copies larger than L2 in one CUDA graph, median replay in
microseconds; `speedup` = cuBLAS us / us. The JSON is rewritten after every measurement, and no new variant starts
once `--budget-s` has passed (listed in "skipped"), so a timeout keeps what was measured.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, replace

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kernel_baselines import graph_us, json_saver, run_env, weight_copies  # noqa: E402

from trace_rl.backends import PackedWeight  # noqa: E402
from trace_rl.kernels import fp4_gemm_gluon as gg  # noqa: E402
from trace_rl.kernels import quantize  # noqa: E402
from trace_rl.kernels.fp4_gemm import default_config, fp4_matmul  # noqa: E402
from trace_rl.kernels.fp4_gemm_gluon import GluonConfig, auto_split, config_for, fp4_matmul_gluon, step_k  # noqa: E402
from trace_rl.kernels.linear import hopper_weight  # noqa: E402

DEV = "cuda"
SHAPES = [(4096, 12288), (12288, 4096)]   # (K, N): up, down
VARIANTS = {   # name -> (format, config), in order of interest: `--budget-s` skips the last ones first; all gated
    "ws": ("nvfp4", GluonConfig()),                                    # 1 consumer WG, 4 stages, 2 CTAs/SM
    "ws_w8_overlap": ("nvfp4", GluonConfig(num_warps=8, maxnreg=80, overlap=True)),   # 2 consumer WGs, 2 CTAs/SM
    "ws_s2_r72": ("nvfp4", GluonConfig(stages=2, maxnreg=72)),         # 3 CTAs/SM, 2-slot rings
    "mx_ws_s2": ("mxfp4", GluonConfig(stages=2)),                      # 512-column steps: 2 x 50 KB, 2 CTAs/SM
    "ws_overlap": ("nvfp4", GluonConfig(overlap=True)),                # next chunk's decode under the wgmma
    "mx_ws_w8_overlap_s2": ("mxfp4", GluonConfig(num_warps=8, maxnreg=80, overlap=True, stages=2)),
    "ws_s3_r72": ("nvfp4", GluonConfig(stages=3, maxnreg=72)),         # 3 CTAs/SM at M <= 8, else 2
    "ws_w8": ("nvfp4", GluonConfig(num_warps=8, maxnreg=80)),
}
WIDE_VARIANTS = {   # M > 16: wgmma N = 32 / 64 / 128 (fp4_gemm_gluon.WIDE); all gated
    "wide": ("nvfp4", None),                                           # config_for(M): 128-token tiles past 64
    "mx_wide": ("mxfp4", None),                                        # 64-token tiles past 32
    "wide_bm64": ("nvfp4", gg.WIDE["nvfp4"][64]),                         # 64-token tiles: twice the grid at M >= 128
    "wide_bm128_r120": ("nvfp4", replace(gg.WIDE["nvfp4"][128], maxnreg=120)),   # the gated register floor
    "wide_overlap": ("nvfp4", gg.WIDE_OVERLAP),                           # decode under the in-flight wgmma group
    "wide_bm32": ("nvfp4", gg.WIDE["nvfp4"][32]),                         # 2 CTAs per SM, 32-token tiles
}
ALL_VARIANTS = {**VARIANTS, **WIDE_VARIANTS}


def variant_config(name: str, M: int) -> GluonConfig | None:
    """The config of variant `name` at M, or None where it does not apply (decode variants at M > 16, wide ones at
    M <= 16)."""
    fmt, cfg = ALL_VARIANTS[name]
    if (name in WIDE_VARIANTS) != (M > 16):
        return None
    if isinstance(cfg, dict):
        return cfg[next((t for t in sorted(cfg) if t >= M), max(cfg))]
    return cfg or config_for(M, fmt)


def _compile_gluon(job: tuple) -> str:
    """Run one (format, config items, M, N) Gluon GEMM in a worker process: fills Triton's on-disk cache (the binary
    depends on the format, the config, BM (from M) and whether N is a multiple of 16, through out's row stride)."""
    fmt, items, M, N = job
    try:
        g = torch.Generator(device=DEV).manual_seed(0)
        w = torch.randn(N, 1024, device=DEV, generator=g).to(torch.bfloat16)
        h = hopper_weight(PackedWeight(fmt, N, 1024, q=quantize(w, fmt)))
        x = torch.randn(M, 1024, device=DEV, generator=g).to(torch.bfloat16)
        fp4_matmul_gluon(x, h, GluonConfig(**dict(items)))
        torch.cuda.synchronize()
        return ""
    except Exception as e:   # noqa: BLE001
        return f"{job}: {e!r}"[:300]


def _compile_any(job: tuple) -> str:
    if job[0] == "dense":
        from kernel_baselines import _compile_one

        return _compile_one(job)
    return _compile_gluon(job)


def precompile_all(Ms: list[int], workers: int = 16) -> list[str]:
    """The binaries of this benchmark (VARIANTS at BM 8 and 16, WIDE_VARIANTS at M 64 and 256; N % 16 == 0), of
    tests/kernels/test_fp4_gemm_gluon.py (its GPU_JOBS) and the shipped kernel's configs, for `Ms` (the decode
    ones where an M <= 16, the wide ones where an M > 16: the script's two calls), in `workers` processes (spawn),
    Gluon ones first."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from trace_rl.kernels.fp4_gemm import GemmConfig

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "kernels"))
    from test_fp4_gemm_gluon import GPU_JOBS

    small, wide = min(Ms) <= 16, max(Ms) > 16
    jobs = [(f, tuple(asdict(c).items()), M, 512) for f, c in VARIANTS.values() for M in (1, 16) if small]
    jobs += [(ALL_VARIANTS[v][0], tuple(asdict(variant_config(v, M)).items()), M, 512) for v in WIDE_VARIANTS
             for M in (64, 256) if wide]
    jobs += [(f, tuple(asdict(c).items()), M, N) for f, c, M, N in GPU_JOBS if (small and M <= 16) or (wide and M > 16)]
    shipped = {default_config(M, N, K, 132) for K, N in SHAPES for M in Ms} | \
        ({GemmConfig(16, 128, 128, 1, 4, 3)} if small else set())
    jobs += [("dense", f, "bf16", tuple(replace(c, split_k=1).__dict__.items())) for c in shipped
             for f in ("nvfp4", "mxfp4")]
    jobs = list(dict.fromkeys(jobs))
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=get_context("spawn")) as pool:
        return [e for e in pool.map(_compile_any, jobs) if e]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--M", default="1,16")
    ap.add_argument("--variants", default=",".join(ALL_VARIANTS))
    ap.add_argument("--budget-s", type=float, default=60.0, help="start no new variant after this many seconds")
    ap.add_argument("--precompile-only", action="store_true", help="only fill the compile cache (see precompile_all)")
    args = ap.parse_args()
    start = time.time()
    if args.precompile_only:
        errors = precompile_all([int(m) for m in args.M.split(",")])
        print({"precompile_s": round(time.time() - start, 1), "errors": errors}, flush=True)
        return
    Ms = [int(m) for m in args.M.split(",")]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {"env": run_env(torch.cuda.get_device_name(0), sms=sms), "rows": [], "skipped": [], "errors": []}
    save = json_saver(res, args.out)
    fmts = sorted({ALL_VARIANTS[v][0] for v in args.variants.split(",")}, reverse=True)    # nvfp4 first
    setups = []
    for K, N in SHAPES:     # weights, cuBLAS and the shipped kernel first, for every shape, M and format
        n_copies = weight_copies(N * K // 2)
        w_bf16 = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02 for _ in range(n_copies)]
        hws = {f: [hopper_weight(PackedWeight(f, N, K, q=quantize(w, f))) for w in w_bf16] for f in fmts}
        for M in Ms:
            x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
            base = default_config(M, N, K, sms)
            row = {"K": K, "N": N, "M": M, "copies": n_copies, "shipped_config": asdict(base)}
            row["cublas_bf16_us"] = graph_us([lambda w=w, x=x: F.linear(x, w) for w in w_bf16])
            refs = {}
            for f, hw in hws.items():
                refs[f] = fp4_matmul(x, hw[0], config=base)
                us = graph_us([lambda h=h, x=x, b=base: fp4_matmul(x, h, config=b) for h in hw])
                row[f"{f}_shipped"] = {"us": us, "speedup": row["cublas_bf16_us"] / us}
            res["rows"].append(row)
            setups.append((row, x, hws, refs))
            save()
        del w_bf16
    torch.cuda.empty_cache()
    for name in args.variants.split(","):    # then the variants, each over every shape and M before the next
        fmt = ALL_VARIANTS[name][0]
        for row, x, hws, refs in setups:
            M, hw = row["M"], hws[fmt]
            cfg = variant_config(name, M)
            if cfg is None:
                continue
            if time.time() - start > args.budget_s:
                res["skipped"].append({"K": row["K"], "N": row["N"], "M": M, "variant": name})
                continue
            bm = cfg.tile_m(M)
            auto = auto_split(triton.cdiv(hw[0].padded[0], cfg.block_n) * triton.cdiv(M, bm),
                              hw[0].padded[1] // step_k(fmt),
                              sms * cfg.ctas_per_sm(bm, fmt))
            for split in sorted({auto, 2 * auto, max(1, auto // 2)}):
                key = f"{name}_split{split}"
                c = replace(cfg, split_k=split)
                try:
                    y = fp4_matmul_gluon(x, hw[0], c)
                    torch.cuda.synchronize()
                    rel = _rel(y, refs[fmt])
                    us = graph_us([lambda h=h, x=x, c=c: fp4_matmul_gluon(x, h, c) for h in hw])
                except Exception as e:   # noqa: BLE001 -- one failing variant must not lose the run
                    res["errors"].append(f"K {row['K']} N {row['N']} M {M} {key}: {e!r}"[:400])
                    save()
                    continue
                row[key] = {"fmt": fmt, "config": asdict(c), "ctas_per_sm": cfg.ctas_per_sm(bm, fmt),
                            "auto": split == auto, "us": us, "speedup": row["cublas_bf16_us"] / us,
                            "rel_diff_vs_shipped": rel}
                best = row.get(f"{fmt}_best_gluon")
                if best is None or us < best["us"]:
                    row[f"{fmt}_best_gluon"] = {"variant": key, "us": us, "speedup": row["cublas_bf16_us"] / us}
                save()
            print({k: (round(v["us"], 2), round(v["speedup"], 2)) if isinstance(v, dict) and "us" in v else v
                   for k, v in row.items() if k not in ("shipped_config", "copies")}, flush=True)
    res["total_s"] = time.time() - start
    save()


if __name__ == "__main__":
    main()
