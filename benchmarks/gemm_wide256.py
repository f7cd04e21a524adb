"""The 256-token Gluon FP4 W4A16 GEMM (fp4_gemm_wide256.py, opt-in) against cuBLAS BF16 and the existing wide Gluon
configs, same run (issue 15: M = 256 / 512 need >= 0.8x cuBLAS, M = 64 >= 1.6x).

    python benchmarks/gemm_wide256.py --out gemm_wide256.json [--M 256,512,64,128] [--budget-s 70] [--families w256,sk]
    python benchmarks/gemm_wide256.py --precompile-only --M 256,512,64,128 --out /dev/null [--families ...]

`--families` (default all of benchmarks/gemm_wide256_smoke.FAMILIES) limits the new kernel's variants to the families
whose smoke passed (`family`: w256 = VARIANTS on the split-K grid, w256no = `w256_nooverlap`, sk = the stream-K
WIDE256 variants, skno = `sk_nooverlap`, 2cta = WIDE64_2CTA on the grid, sk2cta = `sk_2cta`); the existing wide
kernel is always timed.

Rows (M >= 256 of both formats first, then the smaller M: a budget cut drops the tail), per shape (K, N) in SHAPES:
cuBLAS BF16 `F.linear` on bf16 weight copies, the existing wide Gluon kernel (`wide`: config_for(M); `wide_overlap`:
WIDE_OVERLAP) at its auto split, and the 256-token kernel: its split-K grid (fp4_gemm_wide256.VARIANTS: `w256` at the
auto split, x2 and /2) and its stream-K schedule (fp4_gemm_wide256_sk: `sk`, last in a row); `sk_2cta` (64-token
tiles, two CTAs per SM) at M < 256; the other variants (`w256_nooverlap`, `w256_s2`, `sk_nooverlap`, `sk_bm128`:
128-token tiles) only for nvfp4 at M >= 256. Every output is compared with the existing wide kernel's
(`rel_diff_vs_wide`) before it is timed.
Timing as benchmarks/gemm_gluon.py: all calls over weight copies > L2 captured in one CUDA graph, median replay us;
`speedup` = cuBLAS us / us. The JSON is rewritten after each measurement; past `--budget-s` no new row starts
("skipped").
"""

from __future__ import annotations

import argparse
import os
import re
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
from trace_rl.kernels import quantize  # noqa: E402
from trace_rl.kernels.fp4_gemm_gluon import WIDE_OVERLAP, auto_split, config_for, fp4_matmul_gluon  # noqa: E402
from trace_rl.kernels.fp4_gemm_wide256 import BK, VARIANTS, WIDE64_2CTA, Wide256Config, fp4_matmul_wide256  # noqa: E402,E501
from trace_rl.kernels.fp4_gemm_wide256_sk import fp4_matmul_wide256_sk  # noqa: E402
from trace_rl.kernels.linear import hopper_weight  # noqa: E402

DEV = "cuda"
SHAPES = [(4096, 12288), (12288, 4096)]   # (K, N)
FORMATS = ("nvfp4", "mxfp4")
# the stream-K schedule (one CTA per SM, equal K-step ranges) with fp4_gemm_wide256's configs
# (sk_2cta: 64-token tiles at two CTAs per SM, timed at M < 256; sk_bm128: 128-token tiles with 5 slots at M >= 256,
# nvfp4: twice the decode, a deeper ring -- what the 256-token tile itself brings)
SK_VARIANTS = {"sk": VARIANTS["w256"], "sk_nooverlap": VARIANTS["w256_nooverlap"], "sk_2cta": WIDE64_2CTA,
               "sk_bm128": Wide256Config(block_m=128)}


def family(kind: str, name: str) -> str:
    """The smoke family (benchmarks/gemm_wide256_smoke.py) of variant `name` of `kind` ("w256" / "sk")."""
    if name in ("w64_2cta", "sk_2cta"):
        return "2cta" if kind == "w256" else "sk2cta"
    if name in ("w256_nooverlap", "sk_nooverlap"):   # the no-overlap controls have their own smoke
        return "w256no" if kind == "w256" else "skno"
    return kind


def times(fmt: str, M: int, name: str) -> bool:
    """Whether the benchmark times variant `name` at (fmt, M): `sk` and `w256` always, `sk_2cta` at M < 256, the
    others for nvfp4 at M >= 256."""
    if name in ("sk", "w256"):
        return True
    if name == "sk_2cta":
        return M < 256
    return M >= 256 and fmt == "nvfp4"


def _wide_configs(M: int, fmt: str) -> dict:
    """The existing wide Gluon configs to time at M: config_for, and WIDE_OVERLAP's (nvfp4 only: it is gated so)."""
    out = {"wide": config_for(M, fmt)}
    if fmt == "nvfp4":
        out["wide_overlap"] = WIDE_OVERLAP[next((t for t in sorted(WIDE_OVERLAP) if t >= M), max(WIDE_OVERLAP))]
    return out


def is_cuda_error(e: Exception) -> bool:
    """A CUDA runtime error (torch's "CUDA error: ...", Triton's launcher "Triton Error [CUDA]: ..."): sticky."""
    return bool(re.search(r"CUDA error|Error \[CUDA\]", repr(e)))


_FAULTED = []   # this worker's first job that raised a CUDA error: a CUDA error is sticky, later jobs would inherit it


def _compile_job(job: tuple) -> str:
    """One launch in a worker process (fills Triton's cache): ("w256", fmt, variant, M, N) or ("wide", fmt, config
    items, M, N). After a CUDA error in this worker its later jobs are not run but reported as inherited (they would
    fail whatever their kernel)."""
    kind, fmt, what, M, N = job
    if _FAULTED:
        return f"{job}: not run (this worker's CUDA context was poisoned by {_FAULTED[0]})"[:300]
    try:
        from trace_rl.kernels.fp4_gemm_gluon import GluonConfig

        g = torch.Generator(device=DEV).manual_seed(0)
        w = torch.randn(N, 1024, device=DEV, generator=g).to(torch.bfloat16)
        h = hopper_weight(PackedWeight(fmt, N, 1024, q=quantize(w, fmt)))
        x = torch.randn(M, 1024, device=DEV, generator=g).to(torch.bfloat16)
        if kind == "w256":
            fp4_matmul_wide256(x, h, {**VARIANTS, "w64_2cta": WIDE64_2CTA}[what])
        elif kind == "sk":
            fp4_matmul_wide256_sk(x, h, SK_VARIANTS[what])
        else:
            fp4_matmul_gluon(x, h, GluonConfig(**dict(what)))
        torch.cuda.synchronize()
        return ""
    except Exception as e:   # noqa: BLE001
        if is_cuda_error(e):
            _FAULTED.append(job)
        return f"{job}: {e!r}"[:300]


def precompile_all(Ms: list[int], families: set[str], workers: int = 16) -> list[str]:
    """This benchmark's binaries (N % 16 == 0) and the GPU tests' (tests/kernels/test_fp4_gemm_wide256.py: N = 199 /
    264 / 4096) of the new kernel's `families` and the existing wide kernel, in `workers` spawned processes."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    kinds = (("sk", SK_VARIANTS), ("w256", VARIANTS))
    jobs = [(kind, f, v, M, 512) for M in Ms for f in FORMATS for kind, names in kinds for v in names
            if times(f, M, v)]
    jobs = list({(k, f, v, (SK_VARIANTS if k == "sk" else VARIANTS)[v].tile_m(M), n): 0
                 for k, f, v, M, n in jobs})          # one per binary: the token tile, not M
    jobs += [("wide", f, tuple(asdict(c).items()), c.tile_m(M), 512) for f in FORMATS for M in Ms
             for c in _wide_configs(M, f).values()]
    # the tests': odd N (stride_om not a multiple of 16) at every token tile, the variants at N = 264, N = 4096
    jobs += [("w256", f, "w256", M, 199) for f in FORMATS for M in (17, 100, 256)]
    jobs += [("wide", f, tuple(asdict(config_for(M, f)).items()), config_for(M, f).tile_m(M), 199) for f in FORMATS
             for M in (17, 64, 100, 256)]
    jobs += [("w256", "nvfp4", v, 256, 264) for v in VARIANTS if v != "w256"]     # (264 specialises as 199 does)
    jobs += [("sk", f, "sk", t, 199) for f in FORMATS for t in (64, 128, 256)] + \
        [("sk", "nvfp4", "sk_nooverlap", 256, 199)] + [(k, f, v, 64, 199) for f in FORMATS
                                                       for k, v in (("sk", "sk_2cta"), ("w256", "w64_2cta"))]
    jobs = [j for j in dict.fromkeys(jobs) if j[0] == "wide" or family(j[0], j[2]) in families]
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=get_context("spawn")) as pool:
        return [e for e in pool.map(_compile_job, jobs) if e]


def _note_cuda_error(res: dict, e: Exception, what: str) -> None:
    """The first launch that raised a CUDA error (`poisoned_by`): the error is sticky, so no later row is measured."""
    if is_cuda_error(e) and "poisoned_by" not in res:
        res["poisoned_by"] = what


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--M", default="256,512,64,128")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--budget-s", type=float, default=70.0, help="start no new row after this many seconds")
    ap.add_argument("--precompile-only", action="store_true")
    ap.add_argument("--skip-sk", action="store_true", help="do not time the stream-K schedule")
    ap.add_argument("--families", default="w256,w256no,sk,skno,2cta,sk2cta",
                    help="the new kernel's families to compile / time (those whose smoke passed)")
    args = ap.parse_args()
    start = time.time()
    Ms = [int(m) for m in args.M.split(",")]
    fams = set(filter(None, args.families.split(",")))
    if args.precompile_only:
        errors = precompile_all(Ms, fams)
        print({"precompile_s": round(time.time() - start, 1), "errors": errors}, flush=True)
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {"env": run_env(torch.cuda.get_device_name(0), sms=sms), "families": sorted(fams), "rows": [],
           "skipped": [], "errors": []}
    save = json_saver(res, args.out)
    fmts = args.formats.split(",")
    weights = {}                       # (fmt, K, N) -> (bf16 copies, Hopper FP4 copies); the bf16 ones per shape
    for K, N in SHAPES:
        n_copies = weight_copies(N * K // 2)
        w_bf16 = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02 for _ in range(n_copies)]
        for fmt in fmts:
            weights[fmt, K, N] = (w_bf16, [hopper_weight(PackedWeight(fmt, N, K, q=quantize(w, fmt))) for w in w_bf16])
    # the most informative rows first (a budget cut drops the tail): M >= 256 of both formats, then the small M
    order = [(f, M) for M in Ms if M >= 256 for f in fmts] + [(f, M) for M in Ms if M < 256 for f in fmts]
    for fmt, M in order:
        for K, N in SHAPES:
            if time.time() - start > args.budget_s or "poisoned_by" in res:
                # (after a CUDA error every later launch of this process fails: not measured, not blamed)
                res["skipped"].append({"fmt": fmt, "K": K, "N": N, "M": M,
                                       "why": res.get("poisoned_by", "budget")})
                continue
            w_bf16, hw = weights[fmt, K, N]
            x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
            row = {"fmt": fmt, "K": K, "N": N, "M": M, "copies": len(hw)}
            res["rows"].append(row)
            row["cublas_bf16_us"] = graph_us([lambda w=w, x=x: F.linear(x, w) for w in w_bf16])
            ref = None
            for name, cfg in _wide_configs(M, fmt).items():     # the existing wide kernel (baseline)
                try:
                    y = fp4_matmul_gluon(x, hw[0], cfg)
                    torch.cuda.synchronize()
                    ref = y if ref is None else ref
                    us = graph_us([lambda h=h, x=x, c=cfg: fp4_matmul_gluon(x, h, c) for h in hw])
                    row[name] = {"us": us, "speedup": row["cublas_bf16_us"] / us, "rel_diff_vs_wide": _rel(y, ref)}
                    if us < row.get("best_wide", {}).get("us", 1e30):
                        row["best_wide"] = {"variant": name, "us": us, "speedup": row["cublas_bf16_us"] / us}
                except Exception as e:   # noqa: BLE001
                    res["errors"].append(f"{fmt} K {K} N {N} M {M} {name}: {e!r}"[:400])
                    _note_cuda_error(res, e, f"{fmt} K {K} N {N} M {M} {name}")
            for name, cfg in VARIANTS.items():
                bm = cfg.tile_m(M)
                auto = auto_split(triton.cdiv(hw[0].padded[0], cfg.block_n) * triton.cdiv(M, bm),
                                  hw[0].padded[1] // BK, sms)
                splits = sorted({auto, 2 * auto, max(1, auto // 2)}) if name == "w256" else [auto]
                if not times(fmt, M, name) or family("w256", name) not in fams:
                    continue
                for split in splits:
                    key = f"{name}_split{split}"
                    c = replace(cfg, split_k=split)
                    try:
                        y = fp4_matmul_wide256(x, hw[0], c)
                        torch.cuda.synchronize()
                        rel = _rel(y, ref) if ref is not None else None
                        us = graph_us([lambda h=h, x=x, c=c: fp4_matmul_wide256(x, h, c) for h in hw])
                    except Exception as e:   # noqa: BLE001 -- one failing variant must not lose the run
                        res["errors"].append(f"{fmt} K {K} N {N} M {M} {key}: {e!r}"[:400])
                        _note_cuda_error(res, e, f"{fmt} K {K} N {N} M {M} {key}")
                        continue
                    row[key] = {"us": us, "speedup": row["cublas_bf16_us"] / us, "auto": split == auto,
                                "rel_diff_vs_wide": rel}
                    if us < row.get("best_w256", {}).get("us", 1e30):
                        row["best_w256"] = {"variant": key, "us": us, "speedup": row["cublas_bf16_us"] / us}
                    save()
            for name, cfg in SK_VARIANTS.items():   # last: a hang here loses only these
                if args.skip_sk or not times(fmt, M, name) or family("sk", name) not in fams:
                    continue
                try:
                    y = fp4_matmul_wide256_sk(x, hw[0], cfg)
                    torch.cuda.synchronize()
                    rel = _rel(y, ref) if ref is not None else None
                    us = graph_us([lambda h=h, x=x, c=cfg: fp4_matmul_wide256_sk(x, h, c) for h in hw])
                except Exception as e:   # noqa: BLE001
                    res["errors"].append(f"{fmt} K {K} N {N} M {M} {name}: {e!r}"[:400])
                    _note_cuda_error(res, e, f"{fmt} K {K} N {N} M {M} {name}")
                    continue
                row[name] = {"us": us, "speedup": row["cublas_bf16_us"] / us, "rel_diff_vs_wide": rel}
                if us < row.get("best_w256", {}).get("us", 1e30):
                    row["best_w256"] = {"variant": name, "us": us, "speedup": row["cublas_bf16_us"] / us}
                save()
            save()
            print({k: (round(v["us"], 2), round(v["speedup"], 3)) if isinstance(v, dict) and "us" in v else v
                   for k, v in row.items() if k != "copies"}, flush=True)
    res["total_s"] = time.time() - start
    save()


if __name__ == "__main__":
    main()
