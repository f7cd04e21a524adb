"""One launch of one 256-token Gluon FP4 GEMM family (fp4_gemm_wide256.py / fp4_gemm_wide256_sk.py) in THIS process,
checked against the float64 reference: the first step of benchmarks/gemm_wide256_h200.sh, one process per family and
format, so that a family whose kernel faults (a CUDA error is sticky: every later launch in the process fails too)
cannot be blamed on, or poison, another.

    python benchmarks/gemm_wide256_smoke.py FAMILY FMT --out smoke_FAMILY_FMT.json

FAMILY (FAMILIES): `w256` the split-K grid at WIDE256 (M = 256: one 256-token tile, HGMMA 64x256x16; overlap in
pairs of steps), `w256no` the same without overlap (the control: it passed before the fix), `sk` the stream-K
schedule at WIDE256 (M = 256), `skno` stream-K without overlap (control), `2cta` the split-K grid at WIDE64_2CTA
(M = 64, maxnreg 80, two CTAs per SM, no overlap), `sk2cta` the stream-K schedule at WIDE64_2CTA (the benchmark's
`sk_2cta`). K = 1536 (12 steps of 128 columns: the odd steps' scale words sit in the second half of their 16-byte TMA
box, the mxfp4 ones at all four positions), N = 264 (a partial row tile). Each family launches LAUNCHES: the grid
at auto split, split 1 (12 steps: six overlapped pairs) and split 4 (3 steps: a pair and the unoverlapped odd tail);
stream-K at its default grid and at 5 CTAs (ranges of 7 and 8 steps). The JSON: {"family", "fmt", "ok", "rel_err"
(the worst launch), "launches": {name: rel_err}, "launch_s", "error"}; ok = every launch synchronised without a CUDA
error and rel_err < 1e-2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FAMILIES = ("w256", "w256no", "sk", "skno", "2cta", "sk2cta")


def smoke(family: str, fmt: str) -> dict:
    from dataclasses import replace

    import torch

    from trace_rl.backends import get_backend
    from trace_rl.kernels.fp4_gemm_wide256 import VARIANTS, WIDE64_2CTA, WIDE256, fp4_matmul_wide256
    from trace_rl.kernels.fp4_gemm_wide256_sk import fp4_matmul_wide256_sk
    from trace_rl.kernels.hopper_fp4 import to_hopper

    cfg, M = {"w256": (WIDE256, 256), "w256no": (VARIANTS["w256_nooverlap"], 256), "sk": (WIDE256, 256),
              "skno": (VARIANTS["w256_nooverlap"], 256), "2cta": (WIDE64_2CTA, 64), "sk2cta": (WIDE64_2CTA, 64)}[family]
    if family.startswith("sk"):
        launches = {"grid_default": lambda x, h: fp4_matmul_wide256_sk(x, h, cfg),
                    "grid5": lambda x, h: fp4_matmul_wide256_sk(x, h, cfg, grid=5)}
    else:
        def grid(k):
            return lambda x, h: fp4_matmul_wide256(x, h, replace(cfg, split_k=k))
        launches = {f"split{k or '_auto'}": grid(k) for k in (0, 1, 4)}
    res = {"family": family, "fmt": fmt, "M": M, "config": repr(cfg), "ok": False, "launches": {}}
    g = torch.Generator().manual_seed(0)
    N, K = 264, 1536
    packed = get_backend("fp4").prepare_weight(torch.randn(N, K, generator=g).cuda(), fmt)
    h = to_hopper(packed.q)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16).cuda()
    ref = x.double() @ packed.q.to(x.device).dequantize().double().T
    torch.cuda.synchronize()          # nothing of ours has run yet: a fault below is this family's
    t0 = time.time()
    for name, run in launches.items():
        try:
            y = run(x, h)
            torch.cuda.synchronize()
        except Exception as e:   # noqa: BLE001 -- reported, the process ends here
            res["error"] = f"{name}: {type(e).__name__}: {e}"[:400]
            return res
        res["launches"][name] = ((y.double() - ref).norm() / ref.norm()).item()
    res["launch_s"] = round(time.time() - t0, 2)   # compiles included
    res["rel_err"] = max(v if v == v else float("inf") for v in res["launches"].values())   # nan: the worst
    res["ok"] = bool(res["rel_err"] < 1e-2)        # nan compares False: not ok
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("family", choices=FAMILIES)
    ap.add_argument("fmt", choices=("nvfp4", "mxfp4"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        res = smoke(args.family, args.fmt)
    except Exception as e:   # noqa: BLE001 -- setup failed (before the launch): still a result
        res = {"family": args.family, "fmt": args.fmt, "ok": False, "error": f"setup: {type(e).__name__}: {e}"[:400]}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res), flush=True)
    sys.exit(0 if res["ok"] else 1)


if __name__ == "__main__":
    main()
