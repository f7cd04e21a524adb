"""The opt-in TMA variant of the dense FP4 GEMM (`GemmConfig(tma=True)`, fp4_gemm_tma.py) against the shipped
kernel and cuBLAS BF16 at the issue's decode shapes (issue 15: M <= 16 needs >= 1.8x cuBLAS, 2.2x resolves it).

    python benchmarks/gemm_tma.py --out gemm_tma.json [--M 1,16] [--budget-s 70]

Per shape (K, N) and M: cuBLAS BF16 `F.linear`, the shipped `default_config` (nvfp4 and mxfp4), the same tiles
and split with tma=True, and a small sweep of the variant: 6 stages, 256-row tiles, half and twice the split.
Each variant's output is compared with the shipped kernel at the same tiles and split (`bit_exact`: they must be
equal). Timing as benchmarks/kernels.py: every call captured over weight copies larger than L2 in one CUDA
graph, median replay in microseconds; `speedup` = cuBLAS us / us. The JSON is rewritten after every row, and no
new row starts once `--budget-s` has passed (those rows are listed in "skipped"), so a timeout keeps what was
measured.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kernel_baselines import graph_us, json_saver, precompile, run_env, weight_copies  # noqa: E402

from trace_rl.backends import PackedWeight  # noqa: E402
from trace_rl.kernels import quantize  # noqa: E402
from trace_rl.kernels.fp4_gemm import GemmConfig, default_config  # noqa: E402
from trace_rl.kernels.linear import fp4_linear, hopper_weight  # noqa: E402

DEV = "cuda"
SHAPES = [(4096, 12288), (12288, 4096), (4096, 1024)]   # (K, N): up, down, k/v


def variants(base: GemmConfig) -> dict[str, GemmConfig]:
    """Name -> config: the TMA twin of the shipped config, then the sweep (stages, tile rows, split)."""
    return {"tma": replace(base, tma=True), "tma_s6": replace(base, tma=True, num_stages=6),
            "tma_bn256": replace(base, tma=True, block_n=256),
            "tma_split_half": replace(base, tma=True, split_k=max(1, base.split_k // 2)),
            "tma_split_x2": replace(base, tma=True, split_k=2 * base.split_k)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--M", default="1,16")
    ap.add_argument("--budget-s", type=float, default=70.0, help="stop starting new rows after this many seconds")
    ap.add_argument("--no-precompile", action="store_true")
    args = ap.parse_args()
    start = time.time()
    Ms = [int(m) for m in args.M.split(",")]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {"env": run_env(torch.cuda.get_device_name(0), sms=sms), "rows": [], "skipped": [], "errors": []}
    save = json_saver(res, args.out)

    if not args.no_precompile:
        bases = {default_config(M, N, K, sms) for K, N in SHAPES for M in Ms}
        cfgs = {(f, replace(v, split_k=1)) for b in bases for f in ("nvfp4", "mxfp4")
                for v in [b, *variants(b).values()]}       # the split is a run-time argument: one binary
        cfgs |= {(f, replace(c, tma=False)) for f, c in cfgs}   # the shipped twins (bit-exactness references)
        jobs = [("dense", f, "bf16", tuple(c.__dict__.items())) for f, c in cfgs]
        t = time.time()
        res["precompile_errors"] = precompile(jobs)
        res["precompile_s"] = time.time() - t
        save()

    for K, N in SHAPES:
        n_copies = weight_copies(N * K // 2)
        w_bf16 = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02 for _ in range(n_copies)]
        packed = {f: [PackedWeight(f, N, K, q=quantize(w, f)) for w in w_bf16] for f in ("nvfp4", "mxfp4")}
        for f in packed:
            [hopper_weight(p) for p in packed[f]]     # derive the layouts before any capture
        for M in Ms:
            if time.time() - start > args.budget_s:
                res["skipped"].append({"K": K, "N": N, "M": M})
                save()
                continue
            x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
            base = default_config(M, N, K, sms)
            row = {"K": K, "N": N, "M": M, "copies": n_copies, "default_config": base.__dict__}
            row["cublas_bf16_us"] = graph_us([lambda w=w, x=x: F.linear(x, w) for w in w_bf16])
            for fmt in ("nvfp4", "mxfp4"):
                shipped_out = {}
                for name, cfg in {"shipped": base, **variants(base)}.items():
                    key = f"{fmt}_{name}"
                    try:
                        y = fp4_linear(x, packed[fmt][0], "bf16", None, config=cfg)
                        twin = replace(cfg, tma=False)
                        if twin not in shipped_out:
                            shipped_out[twin] = fp4_linear(x, packed[fmt][0], "bf16", None, config=twin)
                        us = graph_us([lambda p=p, c=cfg, x=x: fp4_linear(x, p, "bf16", None, config=c)
                                       for p in packed[fmt]])
                    except Exception as e:   # noqa: BLE001 -- one failing variant must not lose the run
                        res["errors"].append(f"K {K} N {N} M {M} {key} {cfg}: {e!r}"[:400])
                        continue
                    row[key] = {"config": cfg.__dict__, "us": us, "speedup": row["cublas_bf16_us"] / us,
                                "bit_exact": bool(torch.equal(y, shipped_out[twin]))}
                    save()
            res["rows"].append(row)
            print({k: (round(v["us"], 2), round(v["speedup"], 2), v["bit_exact"]) if isinstance(v, dict)
                   and "us" in v else v for k, v in row.items() if k != "default_config"}, flush=True)
            save()
        del w_bf16, packed
        torch.cuda.empty_cache()
    res["total_s"] = time.time() - start
    save()


if __name__ == "__main__":
    main()
