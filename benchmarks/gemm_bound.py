"""What bounds the FP4 W4A16 GEMM at M <= 16 (every variant of benchmarks/gemm_gluon.py lands at 15.6-20.5 us,
~1.7 TB/s, on 4096x12288 and 12288x4096): the read floor at this size and launch pattern, and the shipped kernel
with its decode + MMA or its loads cut out (probe kernels: benchmarks/gemm_bound_kernels.py).

    python benchmarks/gemm_bound.py --out gemm_bound.json [--M 1,16] [--fmts nvfp4,mxfp4] [--budget-s 60]
    python benchmarks/gemm_bound.py --dry [--facts]  # CPU: the plan (grids, programs, bytes); --facts: sm_90 compile
    python benchmarks/gemm_bound.py --ncu-target     # eager shipped + load-only launches, M = 1, 4096x12288 nvfp4

Timing is gemm_gluon.py's (`graph_us`: every call captured over `weight_copies` weight copies > L2 in one CUDA graph,
median replay, us per call). Per shape (K, N) and format (M-independent, "floor"):
- `stream_grid<P>`: `_stream_kernel` XOR-reducing exactly the weight's bytes (values + scale words) into one word per
  program (16 KB cp.async blocks, 3 stages), with P = the shipped config's program count, `stream_persistent<k>`
  with P = k x SMs (k = 1, 2, 4), and `stream_persistent2_ldg` (plain 16-byte loads, no cp.async pipeline);
- `torch_sum` (`.sum()` of a float32 buffer of the same bytes) and `torch_copy` (`copy_`: reads and writes them).
Per shape, M and format: `cublas_bf16`, `shipped` (fp4_matmul), and the probe in `full` (the shipped body: should
match `shipped`), `load_only` (same loads, XOR-accumulated, no decode / wgmma / epilogue) and `compute_only` (no
weight loads: decode of register words + the wgmmas, same trip count and epilogue) modes, each with us, effective
TB/s over the weight's bytes and, for the probe modes, the compiled kernel's registers / spills / shared memory, the
CTAs per SM they allow and the waves of the grid; then `gluon_ws` (fp4_gemm_gluon, gemm_gluon.py's "ws" / "mx_ws_s2"
config at its auto split), `gluon_load_only` (its TMA producer feeding a consumer that only drains the ring) and
`gluon_compute_only` (only activations through the ring; decode of register words + wgmma):
benchmarks/gemm_bound_gluon.py. The "verdicts" say, per shape, M and format, which part is slow.
The JSON is rewritten after every measurement; no new format x shape starts past `--budget-s` ("skipped"; formats
outer, so nvfp4's two shapes come first).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gemm_bound_kernels as gk  # noqa: E402
import triton  # noqa: E402

from trace_rl.kernels.fp4_gemm import default_config  # noqa: E402
from trace_rl.kernels.hopper_fp4 import block_size, padded_shape  # noqa: E402

SHAPES = [(4096, 12288), (12288, 4096)]   # (K, N), as gemm_gluon.SHAPES
# The layout's 16-row blocks sit 2 Kp words apart (32 KB at K = 4096), the shipped programs 8 blocks (256 KB)
# apart: power-of-two strides over every concurrently streaming program. The padded variant moves each block by
# PAD_WORDS more (the kernel takes the values' row stride), to see whether DRAM channel/bank aliasing is the bound.
PAD_WORDS = 64
PERSISTENT = (1, 2, 4)                    # stream_persistent<k>: k x SMs programs
REGS_PER_SM, SMEM_PER_SM, SMEM_PER_CTA_RESERVED, WARPS_PER_SM, CTAS_PER_SM = 65536, 233472, 1024, 64, 32


def weight_bytes(fmt: str, N: int, K: int) -> tuple[int, int]:
    """(value bytes, scale bytes) of the Hopper layout of an N x K weight (the row factor's 4 B per row aside)."""
    np_, kp = padded_shape(N, K)
    return np_ * kp // 2, np_ * kp // block_size(fmt)


def grid_of(M: int, N: int, K: int, cfg) -> tuple[int, int, int]:
    """The launcher's grid (n tiles, m tiles, split) for `cfg` (fp4_matmul's split normalisation)."""
    np_, kp = padded_shape(N, K)
    kb = kp // cfg.block_k
    split = max(1, min(cfg.split_k, kb))
    split = triton.cdiv(kb, triton.cdiv(kb, split))
    return triton.cdiv(np_, cfg.block_n), triton.cdiv(M, cfg.block_m), split


def occupancy(regs: int, shared: int, warps: int) -> dict:
    """CTAs per SM that ptxas's registers and the kernel's shared memory allow on sm_90 (registers allocated per warp
    in 256-register units), and which resource limits it."""
    per_warp = -(-regs * 32 // 256) * 256
    lim = {"registers": (REGS_PER_SM // max(per_warp, 1)) // warps,
           "shared": SMEM_PER_SM // (shared + SMEM_PER_CTA_RESERVED), "warps": WARPS_PER_SM // warps,
           "ctas": CTAS_PER_SM}
    ctas = min(lim.values())
    return {"ctas_per_sm": ctas, "limited_by": min(lim, key=lim.get)}


def kernel_facts(kernel, programs: int, sms: int, nbytes: int) -> dict:
    """Registers, spills, shared memory of a launched CompiledKernel; its occupancy, waves and bytes per program."""
    warps = kernel.metadata.num_warps
    f = {"registers": kernel.n_regs, "spills": kernel.n_spills, "shared_bytes": kernel.metadata.shared,
         "num_warps": warps, **occupancy(kernel.n_regs, kernel.metadata.shared, warps)}
    f["waves"] = round(programs / (sms * f["ctas_per_sm"]), 3)
    f["bytes_per_program"] = nbytes // programs
    return f


def plan(Ms: list[int], fmts: list[str], sms: int = 132) -> list[dict]:
    """The configurations measured: shipped config, grid, programs, weight bytes (CPU only)."""
    rows = []
    for K, N in SHAPES:
        for fmt in fmts:
            vb, sb = weight_bytes(fmt, N, K)
            for M in Ms:
                cfg = default_config(M, N, K, sms)
                g = grid_of(M, N, K, cfg)
                progs = g[0] * g[1] * g[2]
                rows.append({"K": K, "N": N, "M": M, "fmt": fmt, "config": asdict(cfg), "grid": g, "programs": progs,
                             "weight_bytes": vb + sb, "bytes_per_program": (vb + sb) // progs,
                             "k_steps_per_program": padded_shape(N, K)[1] // cfg.block_k // g[2],
                             "stream_programs": [progs] + [k * sms for k in PERSISTENT]})
    return rows


def compile_facts(fmt: str) -> dict:
    """Registers, shared memory and CTAs per SM of every kernel the probe launches at M <= 16, compiled for sm_90
    on this machine (no GPU; Triton as installed: the H200's is 3.6): the shipped kernel (SMALL_M), the probe's
    modes, the streams, and with Triton 3.6 the Gluon kernel and its load-only probe."""
    import gemm_bound_kernels as gk_

    from trace_rl.kernels import sass_gate
    from trace_rl.kernels.fp4_gemm import SMALL_M, gemm_gate_case

    cases = {"shipped": (gemm_gate_case(SMALL_M, fmt), SMALL_M.num_warps)}
    cases |= {m: (gk_.probe_gate_case(SMALL_M, fmt, v), SMALL_M.num_warps) for m, v in gk_.MODES.items()}
    cases |= {f"stream_s{st}": (gk_.stream_gate_case(stages=st), 4) for st in (3, 1)}
    out = {}
    for name, (case, warps) in cases.items():
        _, res = sass_gate.compile_sass(case)
        out[name] = {"registers": res["REG"], "spills": res.get("LOCAL", 0) + res.get("STACK", 0),
                     "shared_bytes": res["TRITON_SHARED"], **occupancy(res["REG"], res["TRITON_SHARED"], warps)}
    if triton.__version__.startswith("3.6"):
        import gemm_bound_gluon as gbg

        from trace_rl.kernels.fp4_gemm_gluon import GluonConfig
        from trace_rl.kernels.fp4_gemm_gluon_gate import gate_case

        c = GluonConfig() if fmt == "nvfp4" else GluonConfig(stages=2)
        for name, case in (("gluon_ws", gate_case(c, 16, 2.6, fmt)), ("gluon_load_only", gbg.gate_case(c, 16, fmt)),
                           ("gluon_compute_only", gbg.gate_case(c, 16, fmt, "compute_only"))):
            _, res = sass_gate.compile_sass(case)
            out[name] = {"registers": res["REG"], "shared_bytes": res["TRITON_SHARED"],
                         "ctas_per_sm": c.ctas_per_sm(16, fmt), "limited_by": "GluonConfig.ctas_per_sm"}
    return out


def verdict(row: dict, fl: dict) -> str:
    """One line: which of the launch pattern, the loads, decode + MMA, or their overlap explains the shipped time.
    `fl`: the shape's floor entry (floor_us = the fastest read-only pass; stream_grid* = the shipped grid's)."""
    full, load, comp = row["shipped"]["us"], row["load_only"]["us"], row["compute_only"]["us"]
    floor = fl["floor_us"]
    grid = next((v["us"] for k, v in fl.items() if k.startswith("stream_grid")), floor)
    head = (f"K {row['K']} N {row['N']} M {row['M']} {row['fmt']}: shipped {full:.1f} us, floor {floor:.1f} "
            f"(stream at the shipped grid {grid:.1f}), load-only {load:.1f} ({load / floor:.2f}x floor), "
            f"compute-only {comp:.1f}: ")
    notes = []
    if grid > 1.2 * floor:
        notes.append(f"the shipped grid's pattern alone costs {grid - floor:.1f} us over the best stream")
    if load > 1.3 * max(grid, floor):
        notes.append("the memory stream itself is slow (the shipped tile's loads alone are far above a plain "
                     "stream)" + ("; load-only ~ shipped: the loads are the whole cost" if load > 0.8 * full else ""))
    elif comp > 0.8 * full:
        notes.append("load-only near the stream, compute-only ~ shipped: decode + MMA issue/latency bound")
    elif max(load, comp) < 0.75 * full:
        notes.append("load-only near the stream and compute-only well under shipped: the overlap is the problem")
    else:
        notes.append("load-only near the stream; compute-only a large share of shipped: decode + MMA partly exposed")
    if "shipped_padded_stride" in row:
        pad = row["shipped_padded_stride"]["us"]
        notes.append(f"block stride padded: {pad:.1f} us" + (" (faster: DRAM address aliasing is part of it)"
                                                            if pad < 0.9 * full else ""))
    if "gluon_load_only" in row and "gluon_ws" in row:
        gl_load, gl_full = row["gluon_load_only"]["us"], row["gluon_ws"]["us"]
        notes.append(f"Gluon: load-only {gl_load:.1f} us ({gl_load / floor:.2f}x floor) vs full {gl_full:.1f}" +
                     (f", compute-only {row['gluon_compute_only']['us']:.1f}" if "gluon_compute_only" in row else ""))
    return head + "; ".join(notes)


def measure(args) -> None:
    import torch
    import torch.nn.functional as F
    from kernel_baselines import graph_us, json_saver, run_env, weight_copies

    from trace_rl.backends import PackedWeight
    from trace_rl.kernels import quantize
    from trace_rl.kernels.fp4_gemm import fp4_matmul
    from trace_rl.kernels.linear import hopper_weight

    start = time.time()
    Ms, fmts = [int(m) for m in args.M.split(",")], args.fmts.split(",")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {"env": run_env(torch.cuda.get_device_name(0), sms=sms), "floor": [], "rows": [], "verdicts": [],
           "skipped": [], "errors": []}
    save = json_saver(res, args.out)
    dev = "cuda"
    for fmt in fmts:          # format outer: past the budget the later format is skipped, never the second shape
        for K, N in SHAPES:
            if time.time() - start > args.budget_s:
                res["skipped"].append({"K": K, "N": N, "fmt": fmt})
                continue
            n_copies = weight_copies(N * K // 2)
            w_bf16 = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(n_copies)]
            hws = [hopper_weight(PackedWeight(fmt, N, K, q=quantize(w, fmt))) for w in w_bf16]
            vb, sb = weight_bytes(fmt, N, K)
            nbytes = vb + sb
            assert hws[0].values.numel() * 4 == vb and hws[0].scales.numel() == sb, "layout bytes"
            tbps = lambda us, b=nbytes: b / us / 1e6   # noqa: E731
            fl = {"K": K, "N": N, "fmt": fmt, "copies": n_copies, "weight_bytes": nbytes}
            g0 = grid_of(Ms[0], N, K, default_config(Ms[0], N, K, sms))    # the same for M = 1 .. 16 (BM 16)
            ship_progs = g0[0] * g0[1] * g0[2]
            sink = torch.empty(max(ship_progs, max(PERSISTENT) * sms) * 4, device=dev, dtype=torch.int32)
            flats = [(h.values.view(-1), h.scales.view(torch.int32).view(-1)) for h in hws]
            streams = [(f"stream_grid{ship_progs}", ship_progs, 3)] + \
                [(f"stream_persistent{k}", k * sms, 3) for k in PERSISTENT] + [("stream_persistent2_ldg", 2 * sms, 1)]
            for name, progs, stages in streams:
                try:
                    kern = gk.stream_words(*flats[0], sink, progs, stages=stages)
                    us = graph_us([lambda a=a, b=b, p=progs, s=stages, o=sink: gk.stream_words(a, b, o, p, stages=s)
                                   for a, b in flats])
                    fl[name] = {"programs": progs, "stages": stages, "us": us, "TBps": tbps(us),
                                **kernel_facts(kern, progs, sms, nbytes)}
                except Exception as e:   # noqa: BLE001 -- one failing variant must not lose the run
                    res["errors"].append(f"{fmt} {K}x{N} {name}: {e!r}"[:400])
            bufs = [torch.randn(nbytes // 4, device=dev) for _ in range(n_copies)]
            dst = torch.empty_like(bufs[0])
            us = graph_us([lambda b=b: b.sum() for b in bufs])
            fl["torch_sum"] = {"us": us, "TBps": tbps(us)}
            us = graph_us([lambda b=b, d=dst: d.copy_(b) for b in bufs])
            fl["torch_copy"] = {"us": us, "TBps_read": tbps(us), "TBps_read_write": 2 * tbps(us)}
            del bufs, dst
            reads = [v["us"] for k, v in fl.items() if k.startswith(("stream", "torch_sum"))]
            fl["floor_us"] = min(reads)      # the fastest read-only pass over the weight's bytes
            res["floor"].append(fl)
            save()
            for M in Ms:
                x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                cfg = default_config(M, N, K, sms)
                g = grid_of(M, N, K, cfg)
                progs = g[0] * g[1] * g[2]
                row = {"K": K, "N": N, "M": M, "fmt": fmt, "config": asdict(cfg), "grid": g, "programs": progs,
                       "bytes_per_program": nbytes // progs}
                try:
                    us = graph_us([lambda w=w, x=x: F.linear(x, w) for w in w_bf16])
                    row["cublas_bf16"] = {"us": us, "TBps_bf16_bytes": 2 * N * K / us / 1e6}
                    ref = fp4_matmul(x, hws[0], config=cfg)
                    us = graph_us([lambda h=h, x=x, c=cfg: fp4_matmul(x, h, config=c) for h in hws])
                    row["shipped"] = {"us": us, "TBps": tbps(us)}
                    padded = [replace(h, values=padded_rows(h.values, PAD_WORDS)) for h in hws]
                    same = bool(torch.equal(fp4_matmul(x, padded[0], config=cfg), ref))
                    us = graph_us([lambda h=h, x=x, c=cfg: fp4_matmul(x, h, config=c) for h in padded])
                    row["shipped_padded_stride"] = {"us": us, "TBps": tbps(us), "pad_words": PAD_WORDS,
                                                    "bit_equal_shipped": same}
                    del padded
                    for mode_name, mode in gk.MODES.items():
                        out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
                        kern = gk.probe_matmul(x, hws[0], mode, cfg, out, sink)
                        torch.cuda.synchronize()
                        same = bool(torch.equal(out, ref))
                        us = graph_us([lambda h=h, x=x, m=mode, c=cfg, o=out, s=sink:
                                       gk.probe_matmul(x, h, m, c, o, s) for h in hws])
                        row[mode_name] = {"us": us, "TBps": tbps(us), **kernel_facts(kern, progs, sms, nbytes)}
                        if mode == gk.FULL:
                            row[mode_name]["bit_equal_shipped"] = same
                except Exception as e:   # noqa: BLE001
                    res["errors"].append(f"{fmt} {K}x{N} M {M}: {e!r}"[:400])
                try:
                    gluon_rows(row, x, hws, sink, graph_us, tbps, sms)
                except Exception as e:   # noqa: BLE001 -- Gluon needs Triton 3.6: the Triton rows stand alone
                    res["errors"].append(f"{fmt} {K}x{N} M {M} gluon: {e!r}"[:400])
                if all(k in row for k in ("shipped", "load_only", "compute_only")):
                    res["verdicts"].append(verdict(row, fl))
                res["rows"].append(row)
                save()
                print({k: (round(v["us"], 2), round(v.get("TBps", 0), 2)) if isinstance(v, dict) and "us" in v
                       else v for k, v in row.items() if k != "config"}, flush=True)
            del hws, flats, w_bf16
            torch.cuda.empty_cache()
    res["total_s"] = time.time() - start
    save()


def padded_rows(values, pad: int):
    """The same int32 [rows, cols] values in storage whose rows are `pad` words longer (a strided view)."""
    import torch

    buf = torch.empty(values.shape[0], values.shape[1] + pad, dtype=values.dtype, device=values.device)
    view = buf[:, :values.shape[1]]
    view.copy_(values)
    return view


def gluon_rows(row: dict, x, hws: list, sink, graph_us, tbps, sms: int) -> None:
    """The Gluon warp-specialised kernel (gemm_gluon.py's first variant of the format, auto split) and its probes
    (benchmarks/gemm_bound_gluon.py): load-only (the same TMA producer, a consumer that only drains the ring) and
    compute-only (activations only through the ring, decode of register words + wgmma) -> row."""
    import gemm_bound_gluon as gbg
    import torch

    from trace_rl.kernels.fp4_gemm_gluon import GluonConfig, fp4_matmul_gluon

    c = GluonConfig() if row["fmt"] == "nvfp4" else GluonConfig(stages=2)   # gemm_gluon's "ws" / "mx_ws_s2"
    fp4_matmul_gluon(x, hws[0], c)
    us = graph_us([lambda h=h, x=x: fp4_matmul_gluon(x, h, c) for h in hws])
    row["gluon_ws"] = {"us": us, "TBps": tbps(us), "config": asdict(c)}
    kern, progs = gbg.gluon_load_only(x, hws[0], c, sink)
    us = graph_us([lambda h=h, x=x: gbg.gluon_load_only(x, h, c, sink) for h in hws])
    ctas = c.ctas_per_sm(c.tile_m(x.shape[0]), row["fmt"])
    row["gluon_load_only"] = {"us": us, "TBps": tbps(us), "programs": progs, "registers": kern.n_regs,
                              "shared_bytes": kern.metadata.shared, "ctas_per_sm": ctas,
                              "waves": round(progs / (sms * ctas), 3)}
    out = torch.empty(x.shape[0], hws[0].n, device=x.device, dtype=torch.bfloat16)
    kern, progs = gbg.gluon_compute_only(x, hws[0], c, out)
    us = graph_us([lambda h=h, x=x: gbg.gluon_compute_only(x, h, c, out) for h in hws])
    row["gluon_compute_only"] = {"us": us, "TBps": tbps(us), "programs": progs, "registers": kern.n_regs,
                                 "shared_bytes": kern.metadata.shared}


def ncu_target() -> None:
    """Eager launches at M = 1 on 4096x12288 nvfp4: the shipped kernel, then the load-only probe, twice (ncu
    profiles the second round: `--launch-skip 2 --launch-count 2`; the first compiles)."""
    import torch

    from trace_rl.backends import PackedWeight
    from trace_rl.kernels import quantize
    from trace_rl.kernels.fp4_gemm import fp4_matmul
    from trace_rl.kernels.linear import hopper_weight

    K, N = SHAPES[0]
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
    h = hopper_weight(PackedWeight("nvfp4", N, K, q=quantize(w, "nvfp4")))
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    cfg = default_config(1, N, K, torch.cuda.get_device_properties(0).multi_processor_count)
    out = torch.empty(1, N, device="cuda", dtype=torch.bfloat16)
    sink = torch.empty(4096, device="cuda", dtype=torch.int32)
    for _ in range(2):
        fp4_matmul(x, h, config=cfg)
        gk.probe_matmul(x, h, gk.LOAD_ONLY, cfg, out, sink)
    torch.cuda.synchronize()
    print({"config": asdict(cfg), "grid": grid_of(1, N, K, cfg)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--M", default="1,16")
    ap.add_argument("--fmts", default="nvfp4,mxfp4", help="in order: past --budget-s the later ones are skipped")
    ap.add_argument("--budget-s", type=float, default=60.0, help="start no new shape x format after this many s")
    ap.add_argument("--dry", action="store_true", help="print the plan (CPU, no GPU)")
    ap.add_argument("--facts", action="store_true", help="with --dry: compile the kernels for sm_90 (no GPU) and "
                    "print their registers, shared memory and CTAs per SM")
    ap.add_argument("--ncu-target", action="store_true", help="the launch for ncu (see ncu_target)")
    args = ap.parse_args()
    if args.dry:
        for r in plan([int(m) for m in args.M.split(",")], args.fmts.split(",")):
            print(r)
        if args.facts:
            for fmt in args.fmts.split(","):
                for name, f in compile_facts(fmt).items():
                    print(fmt, name, f)
        return
    if args.ncu_target:
        ncu_target()
        return
    if not args.out:
        ap.error("--out is required (unless --dry / --ncu-target)")
    measure(args)


if __name__ == "__main__":
    main()
