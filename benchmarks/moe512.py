"""Issue 15's grouped MoE GEMM at 409-512 routed tokens: every Gluon grouped config that could take 25-32 rows per
expert (the shipped tiles, GLUON_VARIANTS and fp4_grouped_gluon_candidates.GROUPED_CANDIDATES) against the BF16
baselines and the shipped dispatch, all in one run, each output bit-compared with the shipped Gluon tile's.

    python benchmarks/moe512.py --out moe512.json [--batches 409,512,256] [--gemms gate_up,down]
        [--fmts nvfp4,mxfp4] [--budget-s 60]
    python benchmarks/moe512.py --precompile-only --fmts nvfp4 --configs 32b,32x64     # one compile worker

Qwen3-30B-A3B experts (hidden 2048, 128 experts of intermediate 768, top-8): gate+up [1536 x 2048], down
[2048 x 768]; B tokens through a random top-8 router (seed B: the same routing every run; kernels_moe_gluon.py's).
Per (GEMM, B): the per-expert row counts; `torch._grouped_mm` (BF16) and the per-expert cuBLAS loop in a CUDA graph;
per format the Triton grouped kernel, the dispatch's pick (grouped_dispatch.grouped_path + TILE_RULE: `shipped`)
and every config: us (median of CUDA-graph replays), x_bf16 (best BF16 baseline / us), x_shipped, bw (FP4 bytes
of the active experts + bf16 activations / us / the read ceiling measured in this run), rel_err against the torch
reference, bit_equal / bit_equal_triton (torch.equal with the shipped Gluon tile's / the Triton kernel's output on
the same rows: the candidates change which program runs a tile, not the arithmetic), and the model: token tiles per
program (max / mean over the persistent grid, fp4_grouped_gluon_schedule.program_tiles) and padded MMA rows / rows.
The shipped pick is timed again at the end of each row (`shipped_again_us`: the drift within the row). mxfp4's down
projection (K = 768) is refused by the Gluon launcher: its row has the Triton kernel and the baselines only.
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

# nvfp4 / mxfp4 Gluon tiles that can take 25-32 rows per expert (16 cannot: 2+ tiles for every expert)
SHIPPED_TILES = {"nvfp4": [32, 64, "64x64", "64x256", "64o"], "mxfp4": [32, 64]}


EXCLUDE: set = set()   # "fmt:name" of configs left out of the timed run (--exclude: their precompile failed or hung)


def configs(fmt: str) -> dict:
    """name -> GluonConfig of every config timed for `fmt` (less EXCLUDE)."""
    from trace_rl.kernels.fp4_grouped_gluon import tile_config
    from trace_rl.kernels.fp4_grouped_gluon_candidates import GROUPED_CANDIDATES

    names = [str(t) for t in SHIPPED_TILES[fmt] + list(GROUPED_CANDIDATES[fmt])]
    return {n: tile_config(fmt, int(n) if n.isdigit() else n) for n in names if f"{fmt}:{n}" not in EXCLUDE}


def model(c, counts: list[int], n: int, fmt: str, sms: int) -> dict:
    """The tile deal of config `c` on this routing: tiles per program (max, mean; a dual tile: up to 2 x block_m
    rows, one decode) and padded MMA rows / rows (the wgmma N granularity is block_m in every config)."""
    from trace_rl.kernels.fp4_grouped_gluon_schedule import program_tiles

    nt = -(-n // c.block_n)
    nprog = min(len(counts) * nt, sms * c.ctas_per_sm(c.block_m, fmt))
    offs = [0]
    for k in counts:
        offs.append(offs[-1] + k)
    tile_rows = c.block_m * (2 if getattr(c, "dual", False) else 1)    # a dual tile holds up to 2 x block_m rows
    per = program_tiles(offs, nt, tile_rows, nprog, getattr(c, "balanced", False))
    padded = sum(-(-k // c.block_m) * c.block_m for k in counts)
    return {"programs": nprog, "ctas_per_sm": c.ctas_per_sm(c.block_m, fmt), "tiles_max": max(per),
            "tiles_mean": round(sum(per) / nprog, 2), "weight_rows_per_tile": c.block_n,
            "mma_rows_padded_x": round(padded / max(sum(counts), 1), 3)}


def timed(fn, ref, base: float, read_bytes: float, read_bw: float, shipped_out=None,
          triton_out=None) -> tuple[dict, object]:
    """({us, x_bf16, bw, rel_err, bit_equal, bit_equal_triton} or {error}, output): `fn()` checked against the torch
    reference `ref` (not timed past 1e-2) and bit-compared with the shipped Gluon tile's output (`bit_equal`) and the
    Triton grouped kernel's (`bit_equal_triton`) where given; then timed (median of graph replays)."""
    try:
        y = fn()
        res = {"rel_err": round(rel_err(y, ref), 5)}
        if shipped_out is not None:
            res["bit_equal"] = bool(torch.equal(y, shipped_out))
        if triton_out is not None:
            res["bit_equal_triton"] = bool(torch.equal(y, triton_out))
        if not res["rel_err"] < 1e-2:
            res["error"] = f"rel err {res['rel_err']:.3g} vs the torch reference: not timed"
            return res, y
        us = time_us([fn], reps=30)
        res.update(us=round(us, 2), x_bf16=round(base / us, 3), bw=round(read_bytes / (us * 1e-6) / read_bw, 3))
        return res, y
    except Exception as e:   # noqa: BLE001
        return {"error": repr(e)[:300]}, None


def _bits_ok(res: dict) -> bool:
    """A config may replace the shipped pick if its output equals the shipped Gluon tile's or the Triton kernel's bit
    for bit (the grouped path's contract: the dispatch may switch kernels and tiles without changing a bit)."""
    return bool(res.get("bit_equal") or res.get("bit_equal_triton"))


def bench(batches, gemms, fmts, read_bw, log, deadline, keep) -> None:
    from kernel_baselines import cublas_expert_loop, grouped_mm_call

    from trace_rl.backends.fp4 import grouped_linear_reference, prepare_expert_weights
    from trace_rl.kernels.fp4_grouped import fp4_grouped_matmul
    from trace_rl.kernels.fp4_grouped_gluon import fp4_grouped_matmul_gluon, tile_config, token_tile
    from trace_rl.kernels.grouped_dispatch import grouped_path
    from trace_rl.kernels.linear import hopper_weight

    E, k = MOE["experts"], MOE["top_k"]
    sms = 132 if SMOKE else torch.cuda.get_device_properties(0).multi_processor_count
    weights = {}
    for B in batches:
        for name in gemms:
            if time.time() > deadline:
                log({"skipped": f"{name} B={B}: out of time"})
                continue
            N, K = next((g[1], g[2]) for g in GEMMS if g[0] == name)
            if name not in weights:
                gen = torch.Generator(device=DEV).manual_seed(0)
                w = torch.randn(E, N, K, device=DEV, dtype=torch.bfloat16, generator=gen) * 0.02
                experts = {f: prepare_expert_weights(w, f) for f in fmts}
                weights[name] = (w, experts, {f: hopper_weight(experts[f]) for f in fmts})
            w, experts, hw = weights[name]
            rgen = torch.Generator(device=DEV).manual_seed(B)          # kernels_moe_gluon.py's routing per B
            offsets, offs = routing(B, E, k, rgen)
            R = B * k
            counts = [offs[e + 1] - offs[e] for e in range(E)]
            x = torch.randn(R, K, device=DEV, dtype=torch.bfloat16, generator=rgen)
            active = sum(1 for c in counts if c)
            row = {"gemm": name, "N": N, "K": K, "B": B, "rows": R, "active_experts": active,
                   "rows_per_expert": {"min": min(counts), "mean": R / E, "max": max(counts),
                                       "over_32": sum(c > 32 for c in counts), "over_48": sum(c > 48 for c in counts),
                                       "over_64": sum(c > 64 for c in counts)}}
            out = torch.empty(R, N, device=DEV, dtype=torch.bfloat16)
            try:
                row["cublas_loop_us"] = round(time_us([cublas_expert_loop(x, w, offs, out)], reps=10), 2)
            except Exception as e:   # noqa: BLE001
                row["cublas_loop_error"] = repr(e)[:300]
            call, why = grouped_mm_call(x, w.transpose(1, 2), offsets[1:])
            if call is not None:
                row["grouped_mm_us"] = round(time_us([call], reps=30), 2)
            else:
                row["grouped_mm_error"] = why
            base = min([row[kk] for kk in ("cublas_loop_us", "grouped_mm_us") if kk in row] or [float("nan")])
            row["bf16_best_us"] = base
            keep(row)
            for fmt in fmts:
                h = hw[fmt]
                r = row[fmt] = {}
                read_bytes = h.nbytes * active / E + 2 * R * K
                r["floor_us"] = round(read_bytes / read_bw * 1e6, 2)
                path, why = grouped_path(fmt, h.padded[1], R, E, (9, 0), True)   # as on the H200
                tile = token_tile(R, E, fmt)
                r["dispatch"] = {"path": path, "why": why, "tile": str(tile)}

                try:
                    ref = grouped_linear_reference(x, offsets, experts[fmt], "bf16")
                except Exception as e:   # noqa: BLE001
                    r["ref_error"] = repr(e)[:300]
                    keep(row)
                    continue
                tri = partial(fp4_grouped_matmul, x, offsets, h, zero_tail=True)
                r["triton"], tri_y = timed(tri, ref, base, read_bytes, read_bw)
                tri_y = tri_y.clone() if tri_y is not None else None
                if path == "triton":
                    r["shipped"] = {"path": path, "tile": None, "us": r["triton"].get("us")}
                keep(row)
                try:
                    ship_c = tile_config(fmt, tile)
                except ValueError as e:
                    r["shipped_error"] = str(e)
                    continue
                gluon = partial(fp4_grouped_matmul_gluon, x, offsets, h, zero_tail=True)
                r["gluon_shipped_tile"], ship_y = timed(partial(gluon, config=ship_c), ref, base, read_bytes, read_bw,
                                                        triton_out=tri_y)
                if ship_y is None:   # refused (mxfp4 at K = 768) or failed: nothing to compare against
                    keep(row)
                    continue
                ship_y = ship_y.clone()
                r["configs"] = {}
                for cname, c in configs(fmt).items():
                    if time.time() > deadline + 15:
                        r["configs"][cname] = {"error": "skipped: out of time"}
                        continue
                    res, _ = timed(partial(gluon, config=c), ref, base, read_bytes, read_bw, ship_y, tri_y)
                    res["model"] = model(c, counts, N, fmt, sms)
                    r["configs"][cname] = res
                    keep(row)
                if path == "gluon":
                    r["shipped"] = {"path": path, "tile": str(tile), "us": r["gluon_shipped_tile"].get("us")}
                again, _ = timed(partial(gluon, config=ship_c) if path == "gluon" else tri, ref, base, read_bytes,
                                 read_bw)
                r["shipped_again_us"] = again.get("us")
                ok = {n_: v["us"] for n_, v in r["configs"].items() if "us" in v and _bits_ok(v)}
                if ok and r["shipped"]["us"]:
                    best = min(ok, key=ok.get)
                    r["best"] = {"config": best, "us": ok[best], "x_bf16": round(base / ok[best], 3),
                                 "x_shipped": round(r["shipped"]["us"] / ok[best], 3)}
                for v in r["configs"].values():
                    if "us" in v and r["shipped"]["us"]:
                        v["x_shipped"] = round(r["shipped"]["us"] / v["us"], 3)
                del ref
                keep(row)
            log(row)


def precompile(fmts: list[str], names: list[str]) -> None:
    """Compile (and run once, on tiny routed inputs of both GEMMs' K / N) the named configs (all: "all"; "triton":
    the Triton grouped kernel's configs), so the timed section does not include a compile."""
    from trace_rl.backends.fp4 import prepare_expert_weights
    from trace_rl.kernels.fp4_grouped import GROUPED_M16, GROUPED_M32, fp4_grouped_matmul
    from trace_rl.kernels.fp4_grouped_gluon import fp4_grouped_matmul_gluon
    from trace_rl.kernels.linear import hopper_weight

    for fmt in fmts:
        cfgs = configs(fmt)
        for name, N, K in GEMMS:
            E = MOE["experts"]
            h = hopper_weight(prepare_expert_weights(
                torch.randn(E, N, K, device=DEV, dtype=torch.bfloat16) * 0.02, fmt))
            # experts of 17, 46 and 17 rows: one and two 32-row tiles, the dual kernel's both paths
            x = torch.randn(80, K, device=DEV).to(torch.bfloat16)
            offs = torch.tensor([0, 17, 63] + [80] * (E - 2), dtype=torch.int32, device=DEV)
            for cname in names:
                fns = [partial(fp4_grouped_matmul, x, offs, h, config=c, zero_tail=True)
                       for c in (GROUPED_M16, GROUPED_M32)] if cname == "triton" else \
                    [partial(fp4_grouped_matmul_gluon, x, offs, h, config=c, zero_tail=True)
                     for n_, c in cfgs.items() if cname in ("all", n_)]
                for fn in fns:
                    t = time.time()
                    try:
                        fn()
                        torch.cuda.synchronize()
                        print(f"compiled {name} {fmt} {cname} in {time.time() - t:.1f} s", flush=True)
                    except ValueError as e:   # the launcher's refusals (mxfp4 at K = 768)
                        print(f"refused {name} {fmt} {cname}: {e}"[:300], flush=True)
                    except Exception as e:   # noqa: BLE001
                        print(f"FAILED compile {name} {fmt} {cname}: {e!r}"[:300], flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="moe512.json")
    ap.add_argument("--batches", default="409,512,256")
    ap.add_argument("--gemms", default="gate_up,down")
    ap.add_argument("--fmts", default="nvfp4,mxfp4")
    ap.add_argument("--budget-s", type=float, default=60.0, help="start no new (GEMM, B) row after this")
    ap.add_argument("--precompile-only", action="store_true")
    ap.add_argument("--configs", default="all", help="--precompile-only: config names (or 'triton')")
    ap.add_argument("--smoke", action="store_true", help="CPU smoke test of this script (interpreter, tiny shapes; "
                    "the Gluon kernel reports its error: it needs an sm_90 GPU)")
    ap.add_argument("--exclude", default="", help="fmt:name,... configs not to run (a hang would stop the run)")
    args = ap.parse_args()
    fmts = args.fmts.split(",")
    EXCLUDE.update(e for e in args.exclude.split(",") if e)
    if args.precompile_only:
        precompile(fmts, args.configs.split(","))
        return 0
    from kernel_baselines import ceilings, json_saver, run_env

    t0 = time.time()
    res = {"env": run_env("cpu (smoke)" if SMOKE else torch.cuda.get_device_name(0)), "rows": [], "skipped": [],
           "excluded": sorted(EXCLUDE)}
    save = json_saver(res, args.out)

    def log(obj):
        print(json.dumps(obj)[:2000], flush=True)
        (res["skipped"] if "skipped" in obj else res["rows"]).append(obj)
        res.pop("unfinished_row", None)
        save()

    def keep(row):
        res["unfinished_row"] = row
        save()

    try:
        res["ceilings"] = {"read_TBps": 1.0} if SMOKE else ceilings()
        save()
        bench([int(b) for b in args.batches.split(",")], args.gemms.split(","), fmts,
              res["ceilings"]["read_TBps"] * 1e12, log, t0 + args.budget_s, keep)
    except Exception:   # noqa: BLE001
        res["error"] = traceback.format_exc()[-2000:]
        print(res["error"], flush=True)
    res["wall_s"] = round(time.time() - t0, 1)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
