"""Issue 15 at M = 256 / 512 (W4A16 >= 0.8x cuBLAS BF16): the stream-K 256-token GEMM with the register-side
two-segment fix-up (fp4_gemm_wide256_sk2.py) against the current best (the wide Gluon tile, the 256-token split-K
grid, stream-K at 128 tokens) and the old stream-K (nvfp4), plus two probes of why the old stream-K was slow
(check `skfix`).

    python benchmarks/skfix.py --out skfix.json [--rounds 3] [--budget-s 60]
    python benchmarks/skfix.py --precompile-only --out /dev/null

Points: (K, N) in gemm_wide256.SHAPES x M = 256, 512 x nvfp4, mxfp4. Variants (OLD / NEW / PROBES below): cublas
(F.linear on bf16 weight copies); OLD = wide (config_for(M)), w256 (the 256-token grid at its auto split), sk_bm128,
sk (the old stream-K at 256 tokens, nvfp4 only); NEW = sk2 (256 tokens), sk2_bm128 (128 tokens), sk2_nooverlap (the
old sk was faster without overlap: 59.5 against 75.2 us), each at fp4_gemm_wide256_sk2.default_grid, and sk2_allsm
(nvfp4 only: sk2 on every SM, sk's grid: the fix-up change alone); the probe sk2_nofixup (every segment stored
directly: WRONG split tiles, timing only: what the fix-up costs). Each point: every output compared with the wide
kernel's (rel_diff_vs_wide), then `rounds` interleaved rounds of CUDA-graph medians over weight copies beyond L2
(kernel_baselines: graph_us / interleaved_rounds / round_stats).

Probe `rate` (first, nvfp4, K = 4096, M = 256): the 256-token grid at split 1 over N = 128 x 66 / 96 / 132 tiles (one
CTA of 32 K steps per tile, no fix-up at all): us per call as the busy SMs grow from 66 to 132. If the 132-tile call
takes ~the 96-tile time, an SM's rate holds with every SM busy and a balanced schedule's loss is its own; if it
grows ~132/96, the machine (L2 bandwidth, clocks under power) bounds it. `clock` samples nvidia-smi (SM clock, power)
while each probe's graph replays.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gemm_wide256 import SHAPES, _rel, _wide_configs, is_cuda_error  # noqa: E402
from kernel_baselines import graph_us, interleaved_rounds, json_saver, round_stats, run_env, weight_copies  # noqa: E402

from trace_rl.backends import PackedWeight  # noqa: E402
from trace_rl.kernels import quantize  # noqa: E402
from trace_rl.kernels.fp4_gemm_gluon import auto_split, fp4_matmul_gluon  # noqa: E402
from trace_rl.kernels.fp4_gemm_wide256 import BK, WIDE256, Wide256Config, fp4_matmul_wide256  # noqa: E402
from trace_rl.kernels.fp4_gemm_wide256_sk import fp4_matmul_wide256_sk  # noqa: E402
from trace_rl.kernels.fp4_gemm_wide256_sk2 import fp4_matmul_wide256_sk2  # noqa: E402
from trace_rl.kernels.linear import hopper_weight  # noqa: E402

DEV = "cuda"
BM128 = Wide256Config(block_m=128)
OLD = ("wide", "w256", "sk_bm128", "sk")
NEW = ("sk2", "sk2_bm128", "sk2_nooverlap", "sk2_allsm")
PROBES = ("sk2_nofixup", )
RATE_TILES = (66, 96, 132)


def w256_split(h, M: int, sms: int) -> int:
    """fp4_matmul_wide256's auto split for this weight and M (what `w256` launches)."""
    bm = WIDE256.tile_m(M)
    return auto_split(triton.cdiv(h.padded[0], WIDE256.block_n) * triton.cdiv(M, bm), h.padded[1] // BK,
                      sms * WIDE256.ctas_per_sm(bm))


def launcher(name: str, M: int, fmt: str, sms: int, h0):
    """(x, h) -> out for variant `name`."""
    if name == "wide":
        cfg = _wide_configs(M, fmt)["wide"]
        return lambda x, h: fp4_matmul_gluon(x, h, cfg)
    if name == "w256":
        cfg = replace(WIDE256, split_k=w256_split(h0, M, sms))
        return lambda x, h: fp4_matmul_wide256(x, h, cfg)
    if name in ("sk", "sk_bm128"):
        cfg = BM128 if name.endswith("bm128") else WIDE256
        return lambda x, h: fp4_matmul_wide256_sk(x, h, cfg)
    if name in ("sk2", "sk2_bm128", "sk2_nooverlap"):
        cfg = {"sk2": WIDE256, "sk2_bm128": BM128, "sk2_nooverlap": replace(WIDE256, overlap=False)}[name]
        return lambda x, h: fp4_matmul_wide256_sk2(x, h, cfg)
    if name == "sk2_allsm":      # every SM (sk's grid): the fix-up change without default_grid's choice
        return lambda x, h: fp4_matmul_wide256_sk2(x, h, WIDE256, grid=sms * WIDE256.ctas_per_sm(WIDE256.tile_m(M)))
    if name == "sk2_nofixup":
        return lambda x, h: fp4_matmul_wide256_sk2(x, h, WIDE256, fixup=False)
    raise ValueError(f"skfix: unknown variant {name!r}")


def timed(name: str, fmt: str) -> bool:
    """The diagnostics (the old 256-token stream-K `sk`: 0.48x at the issue's shape; `sk2_allsm`) only for nvfp4."""
    return name not in ("sk", "sk2_allsm") or fmt == "nvfp4"


def _compile_job(job: tuple) -> str:
    """One launch of variant `name` in a worker process (fills Triton's cache); `sk` / `sk_bm128` specialise on the
    shape (MAXSEG is their constexpr), the others take a small weight."""
    fmt, K, N, M, name = job
    try:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        w = torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02
        h = hopper_weight(PackedWeight(fmt, N, K, q=quantize(w, fmt)))
        x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
        launcher(name, M, fmt, sms, h)(x, h)
        torch.cuda.synchronize()
        return ""
    except Exception as e:   # noqa: BLE001
        return f"{job}: {e!r}"[:300]


def precompile(Ms: list, fmts: list, workers: int = 10) -> list:
    """Every binary the timing launches, in `workers` spawned processes; returns the errors."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    jobs = [(f, K, N, M, n) for f in fmts for M in Ms for n in ("sk", "sk_bm128") if timed(n, f) for K, N in SHAPES]
    # the rest: one binary per format and token tile (M = 256 and 512 share them), `wide` per M (config_for)
    jobs += [(f, 1024, 4096, Ms[0], n) for f in fmts for n in OLD + NEW + PROBES if n not in ("wide", "sk", "sk_bm128")]
    jobs += [(f, 1024, 4096, M, "wide") for f in fmts for M in Ms]
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=get_context("spawn")) as pool:
        return [e for e in pool.map(_compile_job, jobs) if e]


def clock_under_load(calls: list, seconds: float = 0.8) -> dict:
    """nvidia-smi's SM clock (MHz), power (W) and temperature (C) sampled while `calls` replay (a CUDA graph queued
    for ~`seconds`; nvidia-smi itself takes ~0.1-0.3 s to answer)."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in calls:
            fn()
    g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    g.replay()
    torch.cuda.synchronize()
    reps = max(1, int(seconds / max(time.perf_counter() - t, 1e-6)))
    for _ in range(reps):
        g.replay()
    time.sleep(0.2)
    try:
        q = subprocess.run(["nvidia-smi", "-i", str(torch.cuda.current_device()),
                            "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=5).stdout
        sm, power, temp = (float(v) for v in q.strip().split(","))
        out = {"sm_mhz": sm, "power_w": power, "temp_c": temp}
    except Exception as e:   # noqa: BLE001 -- a probe: report, do not lose the run
        out = {"error": repr(e)[:200]}
    torch.cuda.synchronize()
    return out


def fp4_copies(fmt: str, N: int, K: int, w_bf16: list) -> list:
    return [hopper_weight(PackedWeight(fmt, N, K, q=quantize(w, fmt))) for w in w_bf16]


def rate_probe(res: dict, save, rounds: int) -> None:
    """The `rate` probe (module docstring)."""
    K, M = 4096, 256
    x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
    cfg = replace(WIDE256, split_k=1)
    hs, w_bf = {}, None
    for tiles in RATE_TILES:
        N = tiles * 128
        w = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02 for _ in range(weight_copies(N * K // 2))]
        hs[tiles] = fp4_copies("nvfp4", N, K, w)
        if tiles == 132:
            w_bf = w
    calls = {f"n{t}": [lambda h=h: fp4_matmul_wide256(x, h, cfg) for h in hs[t]] for t in RATE_TILES}
    calls["cublas_n132"] = [lambda w=w: F.linear(x, w) for w in w_bf]
    r = round_stats(interleaved_rounds(list(calls), lambda n: graph_us(calls[n]), rounds, res["errors"], "rate"))
    res["rate"] = {**r, "us_per_k_step": {n: round(u / 32, 3) for n, u in r["us"].items() if n.startswith("n")},
                   "clock": {n: clock_under_load(c) for n, c in calls.items()}}
    save()


def summarize(res: dict) -> dict:
    """summary.json's body: per point us and x cuBLAS of every variant, the best old / new variant, whether the new
    one beat the old best in every round, the issue target (0.8x); the rate probe and what it says."""
    out = {"target_x_cublas": 0.8, "points": [], "errors": res.get("errors", [])[:6],
           "poisoned_by": res.get("poisoned_by"), "skipped": [s["point"] for s in res.get("skipped", [])]}
    for p in res.get("points", []):
        us, rounds = p.get("us", {}), p.get("rounds_us", {})
        cub = us.get("cublas")
        if not cub:
            out["points"].append({k: p[k] for k in ("fmt", "K", "N", "M")} | {"error": "not timed"})
            continue
        old = min((n for n in OLD if n in us), key=us.get, default=None)
        new = min((n for n in NEW if n in us), key=us.get, default=None)
        c = {k: p[k] for k in ("fmt", "K", "N", "M")}
        c["cublas_us"] = cub
        c["x_cublas"] = {n: round(cub / u, 3) for n, u in us.items() if n != "cublas"}
        c["us"] = us
        c["best_old"] = [old, us.get(old), c["x_cublas"].get(old)] if old else None
        c["best_new"] = [new, us.get(new), c["x_cublas"].get(new)] if new else None
        if old and new:
            olds = [min(rounds[n][r] for n in OLD if n in rounds and r < len(rounds[n]))
                    for r in range(len(rounds[new]))]
            c["new_beats_old_every_round"] = all(a < b for a, b in zip(rounds[new], olds))
            c["new_vs_old"] = round(us[old] / us[new], 3)
        best = min((n for n in OLD + NEW if n in us), key=us.get, default=None)
        c["best"] = best
        c["meets_0.8"] = bool(best and cub / us[best] >= 0.8)
        c["max_rel_diff_vs_wide"] = max(p.get("rel_diff_vs_wide", {}).values(), default=None)
        c["fixup_cost_us"] = round(us["sk2"] - us["sk2_nofixup"], 2) if "sk2" in us and "sk2_nofixup" in us else None
        out["points"].append(c)
    wins = [f"{c['fmt']} {c['K']}x{c['N']} M={c['M']}: {c['best_new'][0]}" for c in out["points"]
            if c.get("new_beats_old_every_round")]
    out["wiring"] = {"new_wins_every_round": wins, "how": (
        "not wired (dispatch defaults unchanged). If it wins: a per-weight table in gemm_dispatch like GLUON_MID_M "
        "({fmt: {(padded N, padded K): (max M, 'sk2' | 'sk2_bm128')}}) consulted by dense_path for MID_M_LIMIT < M "
        "<= 512 on sm_90 + Gluon, ahead of fp4_dequant's dequantize + cuBLAS (M >= DEQUANT_CUBLAS_MIN_M) when the "
        "operand cache is off (with the cache on, the engine's M >= 128 linears use cached operands, not this "
        "kernel); first give sk2's _store_tile fp4_gemm_gluon_epilogue's W4A4 row scale and bias (fp4_linear needs "
        "both) and time it against the dequantize + cuBLAS path, which this check does not")}
    rate = res.get("rate")
    if rate and all(f"n{t}" in rate["us"] for t in RATE_TILES):
        u = rate["us"]
        out["rate"] = {"us": u, "clock": rate.get("clock"),
                       "n132_over_n96": round(u["n132"] / u["n96"], 3), "n96_over_n66": round(u["n96"] / u["n66"], 3),
                       "reading": "n132_over_n96 ~1.0: an SM's rate holds with all 132 busy, so a balanced "
                                  "schedule's loss is its own (fix-up, pipeline); ~1.375 (= 132/96): the machine "
                                  "(L2 bandwidth / clocks: see clock) bounds the 256-token tile at full occupancy"}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--M", default="256,512")
    ap.add_argument("--formats", default="nvfp4,mxfp4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=60.0, help="start no new point after this many seconds")
    ap.add_argument("--precompile-only", action="store_true")
    ap.add_argument("--no-rate", action="store_true")
    ap.add_argument("--no-new", action="store_true",
                    help="time only cuBLAS and the old variants (the new kernel's GPU tests hit a CUDA error, which "
                         "is sticky: it would poison every later launch of this process)")
    args = ap.parse_args()
    start = time.time()
    Ms = [int(m) for m in args.M.split(",")]
    fmts = args.formats.split(",")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if args.precompile_only:   # exit 1 on any compile error, so skfix_h200.sh's precompile_rc reports it
        from gemm_compute import precompile_exit

        return precompile_exit(lambda: (precompile(Ms, fmts), []))
    res = {"env": run_env(torch.cuda.get_device_name(0), sms=sms), "points": [], "skipped": [], "errors": [],
           "new_timed": not args.no_new}
    save = json_saver(res, args.out)
    if not args.no_rate:
        try:
            rate_probe(res, save, args.rounds)
        except Exception as e:   # noqa: BLE001
            res["errors"].append(f"rate probe: {e!r}"[:400])
        print({"rate": res.get("rate", {}).get("us")}, flush=True)
    for fmt in fmts:
        for K, N in SHAPES:
            w_bf16 = hw = None
            for M in Ms:
                where = f"{fmt} K {K} N {N} M {M}"
                if time.time() - start > args.budget_s or "poisoned_by" in res:
                    res["skipped"].append({"point": where, "why": res.get("poisoned_by", "budget")})
                    continue
                if hw is None:
                    w_bf16 = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02
                              for _ in range(weight_copies(N * K // 2))]
                    hw = fp4_copies(fmt, N, K, w_bf16)
                x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
                pt = {"fmt": fmt, "K": K, "N": N, "M": M, "copies": len(hw), "rel_diff_vs_wide": {}}
                res["points"].append(pt)
                calls = {"cublas": [lambda w=w, x=x: F.linear(x, w) for w in w_bf16]}
                ref = None
                for name in OLD + (() if args.no_new else NEW + PROBES):
                    if not timed(name, fmt):
                        continue
                    try:
                        run = launcher(name, M, fmt, sms, hw[0])
                        y = run(x, hw[0])
                        torch.cuda.synchronize()
                        ref = y if ref is None else ref
                        if name not in PROBES:
                            pt["rel_diff_vs_wide"][name] = _rel(y, ref)
                        calls[name] = [lambda h=h, run=run, x=x: run(x, h) for h in hw]
                    except Exception as e:   # noqa: BLE001 -- one failing variant must not lose the point
                        res["errors"].append(f"{where} {name}: {e!r}"[:400])
                        if is_cuda_error(e):
                            res["poisoned_by"] = f"{where} {name}"
                            break
                if "poisoned_by" in res:
                    continue
                rounds = interleaved_rounds(list(calls), lambda n, c=calls: graph_us(c[n]), args.rounds, res["errors"],
                                            where)
                pt.update(round_stats(rounds))
                save()
                print({k: pt[k] for k in ("fmt", "K", "N", "M", "us")}, flush=True)
    res["total_s"] = round(time.time() - start, 1)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
