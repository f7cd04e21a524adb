"""The Gluon grouped FP4 GEMM (trace_rl/kernels/fp4_grouped_gluon.py, opt-in) at the MoE rollout's decode batches,
against the shipped Triton grouped kernel and the BF16 grouped baselines, all in one run (issue 15 item 3: >= 2.5x
the BF16 grouped baseline at 64-512 tokens).

    python benchmarks/kernels_moe_gluon.py --out moe_gluon.json [--batches 409,512,128,256] [--gemms gate_up,down]
        [--budget-s 70] [--precompile-only]

Qwen3-30B-A3B experts (hidden 2048, 128 experts of intermediate 768, top-8): gate+up [1536 x 2048] and down
[2048 x 768]; B tokens routed by a random top-8 router (seed 0: the same routing every run), R = 8 B rows; per
(GEMM, B) the row-count stats (min / mean / max rows per expert, active experts). Per format (nvfp4, mxfp4; mxfp4
down is refused by the Gluon kernel: 24-byte scale rows, see its module doc): W4A16 through the Triton kernel
(`fp4_grouped_matmul`, default config) and the Gluon kernel at token tiles 16 / 32 / 64 (`gluon_default_tile`:
`token_tile`'s pick; nvfp4 also GLUON_VARIANTS: 256-row N tiles, a 64-row one, overlap; and the default tile at one
program per SM); nvfp4 W4A4 prequantized (row scales; the activations' quantize launch not timed: the same for both
kernels). Every output is checked against the torch reference (`grouped_linear_reference`, rel. error <
1e-2) before it is timed. Baselines: `torch._grouped_mm` (BF16) and the per-expert cuBLAS loop in a CUDA graph.
CUDA-graph medians; bw = (active experts' FP4 layout bytes + bf16 activations) / time / the read ceiling measured
in this run; x_bf16 = best BF16 baseline / time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kernels_moe_shapes import DEV, GEMMS, MOE, SMOKE, rel_err, routing, time_us  # noqa: E402

TILES = (16, 32, 64)


def _timed(fn, ref, base: float, read_bytes: float, read_bw: float) -> dict:
    """Check `fn()` against `ref`, then time it: {us, x_bf16, bw, rel_err} or {error}."""
    try:
        err = rel_err(fn(), ref)
        if not err < 1e-2:
            return {"rel_err": err, "error": f"rel err {err:.3g} vs the torch reference"}
        us = time_us([fn], reps=20)
        return {"us": round(us, 2), "x_bf16": round(base / us, 3), "bw": round(read_bytes / (us * 1e-6) / read_bw, 3),
                "rel_err": round(err, 5)}
    except Exception as e:   # noqa: BLE001
        return {"error": repr(e)[:300]}


def bench(batches: list[int], gemms: list[str], read_bw: float, log, deadline: float,
          keep=lambda row: None) -> None:
    """`log(row)` per finished (GEMM, B) row; `keep(row)` after each measurement (a hang or timeout keeps them)."""
    from kernel_baselines import cublas_expert_loop, grouped_mm_call

    from trace_rl.backends.fp4 import grouped_linear_reference, prepare_expert_weights
    from trace_rl.kernels.fp4_grouped import fp4_grouped_matmul
    from trace_rl.kernels.fp4_grouped_gluon import (
        GLUON_VARIANTS,
        GROUPED_GLUON,
        fp4_grouped_matmul_gluon,
        tile_config,
        token_tile,
    )
    from trace_rl.kernels.linear import hopper_weight
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    E, k = MOE["experts"], MOE["top_k"]
    weights = {}
    # the missed cells first (gate+up, then down, at B = 409 / 512), then the rest, B-major: a budget cut
    # drops the least important rows
    first = [b for b in batches if b >= 409]
    order = [(n, b) for b in first for n in gemms] + [(n, b) for b in batches if b not in first for n in gemms]
    for name, B in order:
        N, K = next((g[1], g[2]) for g in GEMMS if g[0] == name)
        if name not in weights:
            gen = torch.Generator(device=DEV).manual_seed(0)
            w = torch.randn(E, N, K, device=DEV, dtype=torch.bfloat16, generator=gen) * 0.02
            experts = {f: prepare_expert_weights(w, f) for f in ("nvfp4", "mxfp4")}
            weights[name] = (w, experts, {f: hopper_weight(experts[f]) for f in experts})
        w, experts, hw = weights[name]
        w_t = w.transpose(1, 2)
        if time.time() > deadline:
            log({"skipped": f"{name} B={B}: out of time"})
            continue
        rgen = torch.Generator(device=DEV).manual_seed(B)          # fixed routing per B
        offsets, offs = routing(B, E, k, rgen)
        R = B * k
        counts = [offs[e + 1] - offs[e] for e in range(E)]
        x = torch.randn(R, K, device=DEV, dtype=torch.bfloat16, generator=rgen)
        active = sum(1 for c in counts if c)
        row = {"gemm": name, "N": N, "K": K, "B": B, "rows": R, "active_experts": active,
               "rows_per_expert": {"min": min(counts), "mean": R / E, "max": max(counts),
                                   "over_32": sum(c > 32 for c in counts), "over_64": sum(c > 64 for c in counts)},
               "gluon_default_tile": {f: token_tile(R, E, f) for f in ("nvfp4", "mxfp4")}}
        out = torch.empty(R, N, device=DEV, dtype=torch.bfloat16)
        try:
            row["cublas_loop_us"] = round(time_us([cublas_expert_loop(x, w, offs, out)], reps=10), 2)
        except Exception as e:   # noqa: BLE001
            row["cublas_loop_error"] = repr(e)[:300]
        call, why = grouped_mm_call(x, w_t, offsets[1:])
        if call is not None:
            row["grouped_mm_us"] = round(time_us([call], reps=20), 2)
        else:
            row["grouped_mm_error"] = why
        base = min([row[kk] for kk in ("cublas_loop_us", "grouped_mm_us") if kk in row] or [float("nan")])
        row["bf16_best_us"] = base
        keep(row)
        for fmt in ("nvfp4", "mxfp4"):
            h = hw[fmt]
            read_bytes = h.nbytes * active / E + 2 * R * K
            row[f"{fmt}_floor_us"] = round(read_bytes / read_bw * 1e6, 2)
            try:
                ref = grouped_linear_reference(x, offsets, experts[fmt], "bf16")
            except Exception as e:   # noqa: BLE001
                row[f"{fmt}_ref_error"] = repr(e)[:300]
                continue
            row[f"{fmt}_triton"] = _timed(partial(fp4_grouped_matmul, x, offsets, h, zero_tail=True), ref,
                                          base, read_bytes, read_bw)
            keep(row)
            for bm in TILES:
                c = GROUPED_GLUON[fmt][bm]
                row[f"{fmt}_gluon_{bm}"] = _timed(
                    partial(fp4_grouped_matmul_gluon, x, offsets, h, config=c, zero_tail=True), ref,
                    base, read_bytes, read_bw)
                keep(row)
            if fmt == "nvfp4":
                for vname, c in GLUON_VARIANTS.items():
                    row[f"{fmt}_gluon_{vname}"] = _timed(
                        partial(fp4_grouped_matmul_gluon, x, offsets, h, config=c, zero_tail=True), ref,
                        base, read_bytes, read_bw)
                    keep(row)
                # the default tile's persistent grid at one program per SM (vs SMs x ctas_per_sm): shows whether
                # the occupancy the launcher assumes holds (a second wave of programs would double the time)
                c = tile_config(fmt, token_tile(R, E, fmt))
                if c.ctas_per_sm(c.block_m, fmt) > 1 and not SMOKE:
                    sms = torch.cuda.get_device_properties(0).multi_processor_count
                    row[f"{fmt}_gluon_default_grid_sms"] = _timed(
                        partial(fp4_grouped_matmul_gluon, x, offsets, h, config=c, zero_tail=True,
                                                                  programs=sms), ref, base, read_bytes, read_bw)
            tags = list(TILES) + (list(GLUON_VARIANTS) if fmt == "nvfp4" else [])
            ok = {bm: row[f"{fmt}_gluon_{bm}"]["us"] for bm in tags if "us" in row[f"{fmt}_gluon_{bm}"]}
            if ok:
                best = min(ok, key=ok.get)
                row[f"{fmt}_gluon_best"] = {"tile": best, "us": ok[best], "x_bf16": round(base / ok[best], 3),
                                            "bw": row[f"{fmt}_gluon_{best}"]["bw"]}
            if fmt == "nvfp4":   # W4A4 prequantized: the same operand and row scales into both kernels
                try:
                    xb, rs = quantize_dequant_bf16(x, "nvfp4:row")
                    ref4 = grouped_linear_reference(x, offsets, experts[fmt], fmt)
                    rb = h.nbytes * active / E + 2 * R * K + 4 * R
                    row["nvfp4_a4_triton"] = _timed(
                        partial(fp4_grouped_matmul, xb, offsets, h, row_scale=rs, zero_tail=True), ref4, base,
                        rb, read_bw)
                    c = tile_config(fmt, token_tile(R, E, fmt))
                    row["nvfp4_a4_gluon"] = _timed(
                        partial(fp4_grouped_matmul_gluon, xb, offsets, h, row_scale=rs, config=c,
                                                             zero_tail=True), ref4, base, rb, read_bw)
                except Exception as e:   # noqa: BLE001
                    row["nvfp4_a4_error"] = repr(e)[:300]
            del ref
        log(row)


def precompile(gemms: list[str], fmts: list[str], parts: list[int]) -> None:
    """Compile (and run once, on tiny routed inputs of the real K / N) every kernel the benchmark launches, so the
    timed section does not include a compile; errors are printed, not raised (the benchmark reports them). Parts
    (one process each, in parallel): 0 the Triton kernel's configs (+ the W4A4 row scale, nvfp4), 1 the Gluon token
    tiles, 2 (nvfp4) the Gluon W4A4 row-scale tiles and GLUON_VARIANTS."""
    from trace_rl.backends.fp4 import prepare_expert_weights
    from trace_rl.kernels.fp4_grouped import GROUPED_M16, GROUPED_M32, fp4_grouped_matmul
    from trace_rl.kernels.fp4_grouped_gluon import GLUON_VARIANTS, GROUPED_GLUON, fp4_grouped_matmul_gluon
    from trace_rl.kernels.linear import hopper_weight

    for name, N, K in [g for n in gemms for g in GEMMS if g[0] == n]:
        for fmt in fmts:
            E = MOE["experts"]      # all of them: the Triton kernel's constexpr E_POW2 is next_power_of_2(E)
            h = hopper_weight(prepare_expert_weights(
                torch.randn(E, N, K, device=DEV, dtype=torch.bfloat16) * 0.02, fmt))
            x = torch.randn(40, K, device=DEV).to(torch.bfloat16)
            offs = torch.tensor([0, 17] + [40] * (E - 1), dtype=torch.int32, device=DEV)
            rs = torch.ones(40, device=DEV)
            nv = fmt == "nvfp4"
            fns = {0: [partial(fp4_grouped_matmul, x, offs, h, config=c, zero_tail=True)
                       for c in (GROUPED_M16, GROUPED_M32)] +
                      [partial(fp4_grouped_matmul, x, offs, h, row_scale=rs, config=c, zero_tail=True)
                       for c in ((GROUPED_M16, GROUPED_M32) if nv else ())],
                   1: [partial(fp4_grouped_matmul_gluon, x, offs, h, config=c, zero_tail=True)
                       for c in GROUPED_GLUON[fmt].values()],
                   2: [partial(fp4_grouped_matmul_gluon, x, offs, h, row_scale=rs, config=c, zero_tail=True)
                       for c in (GROUPED_GLUON[fmt].values() if nv else ())] +
                      [partial(fp4_grouped_matmul_gluon, x, offs, h, config=c, zero_tail=True)
                       for c in (GLUON_VARIANTS.values() if nv else ())]}
            for fn in [f for p in parts for f in fns[p]]:
                t = time.time()
                try:
                    fn()
                    torch.cuda.synchronize()
                    print(f"compiled {name} {fmt} in {time.time() - t:.1f} s", flush=True)
                except ValueError as e:   # the launcher's refusals (mxfp4 at K = 768): reported by the benchmark
                    print(f"refused {name} {fmt}: {e}"[:300], flush=True)
                except Exception as e:   # noqa: BLE001
                    print(f"FAILED compile {name} {fmt}: {e!r}"[:300], flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="moe_gluon.json")
    ap.add_argument("--batches", default="409,512,128,256", help="routed tokens B, in the order to run")
    ap.add_argument("--gemms", default="gate_up,down")
    ap.add_argument("--budget-s", type=float, default=70.0, help="stop starting new (GEMM, B) rows after this")
    ap.add_argument("--precompile-only", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU smoke test of this script (interpreter, tiny shapes; "
                    "the Gluon kernel reports its error: it needs an sm_90 GPU)")
    ap.add_argument("--fmts", default="nvfp4,mxfp4", help="formats to precompile (--precompile-only)")
    ap.add_argument("--parts", default="0,1,2", help="kernel groups to precompile (see `precompile`)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    gemms = args.gemms.split(",")
    if args.precompile_only:
        precompile(gemms, args.fmts.split(","), [int(p) for p in args.parts.split(",")])
        return 0
    from kernel_baselines import ceilings, json_saver, run_env

    t0 = time.time()
    res = {"env": run_env("cpu (smoke)" if SMOKE else torch.cuda.get_device_name(0)), "rows": [], "skipped": []}
    save = json_saver(res, args.out)

    def log(obj):
        print(json.dumps(obj)[:3000], flush=True)
        (res["skipped"] if "skipped" in obj else res["rows"]).append(obj)
        res.pop("unfinished_row", None)
        save()

    res["ceilings"] = {"read_TBps": 1.0} if SMOKE else ceilings()
    save()
    try:
        def keep(row):
            res["unfinished_row"] = row
            save()

        bench(batches, gemms, res["ceilings"]["read_TBps"] * 1e12, log, t0 + args.budget_s, keep)
        res.pop("unfinished_row", None)
    except Exception:   # noqa: BLE001
        res["error"] = traceback.format_exc()[-2000:]
        print(res["error"], flush=True)
    res["wall_s"] = round(time.time() - t0, 1)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
