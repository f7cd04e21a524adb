"""W4A4 the way the engine runs it (the producer emits the quantized operand, then `fp4_linear_prequantized`) against
W4A16 the way it would run (the producer, then `fp4_linear` on bf16), all in one run: issue 15's "W4A4 within 15% of
W4A16 at every M" measured on the pairs the decoder runs, not on a bare GEMM with its quantize launch.

    python benchmarks/w4a4_producers.py --out w4a4_producers.json [--budget-s 60]    # an sm_90 GPU, Triton 3.6
    python benchmarks/w4a4_producers.py --precompile-only                            # fill Triton's cache

Pairs (benchmarks/w4a4_producer_pairs.py; Qwen3-8B): `layer_input` residual add + RMSNorm -> 4096x6144 (q/k/v),
`mlp_down` SiLU x mul -> 12288x4096, `o_proj` attention output -> 4096x4096; nvfp4 and mxfp4; M = 1, 4, 16, 64, 256,
512 (o_proj also 313: the fixed 8k workload's batch). Per row, microseconds per pair (one CUDA graph of calls over
weight copies larger than L2, median of 15 replays after 3 warm-up: `kernel_baselines.graph_us`), each measured in
this run: `bf16` (cuBLAS F.linear after the same producer), `w4a16`, `w4a4` (fused producer + prequantized GEMM;
o_proj: the GEMM on an operand quantized outside the graph), `w4a4_apart` (producer + `fp4_linear(.., fmt)` with its
quantize launch: o_proj's path in the engine today, and the MLP's where the SiLU x mul quantize fusion does not
apply), the producers alone (`producer_w4a16`, `producer_w4a4`) and o_proj's `quantize_alone`. Then
`w4a4_over_w4a16` (target <= 1.15), `apart_over_w4a16`, `engine_today` (the W4A4 variant the decoder runs today at
that pair, `engine_today`'s doc) and `engine_today_over_w4a16` (over the W4A16 plan's own variant there: for nvfp4's
MLP both run torch's SiLU and multiply, `*_torch_silu*`), the GEMM path (`gemm_path`: gluon / triton /
dequant_cublas, the choice `fp4_linear` makes at that M), and the bits: the fused producer's operand = the unfused
producer + the separate quantize, and the W4A4 pair's output = W4A4 apart's, bit for bit (checked outside the graph
before timing; a row whose check fails is still timed, and says so). The JSON is rewritten after every row; past
`--budget-s` no new row starts ("skipped").
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MS = [1, 4, 16, 64, 256, 512]
O_PROJ_EXTRA_M = 313            # the fixed 8k workload's decode batch: o_proj's quantize launch per layer there
DEV = "cuda"
TARGET = 1.15


def pair_ms(pair: str, ms: list[int]) -> list[int]:
    return sorted(set(ms) | {O_PROJ_EXTRA_M}) if pair == "o_proj" else list(ms)


def parse_list(text: str | None, allowed, cast=str) -> list:
    """--pairs / --ms: a comma list, each in `allowed` (pairs) or a positive int (ms); None: all of `allowed`."""
    if not text:
        return list(allowed)
    items = [cast(t) for t in text.split(",") if t]
    bad = [i for i in items if (cast is str and i not in allowed) or (cast is int and i < 1)]
    if bad:
        raise SystemExit(f"{bad}: not among {list(allowed)}" if cast is str else f"{bad}: rows must be >= 1")
    return items


def gemm_path(M: int, p) -> str:
    """The GEMM `fp4_linear` / `fp4_linear_prequantized` runs for M rows of weight p (FP4Backend._record_dense's rule;
    the bench's weights have no operand cache)."""
    from trace_rl.kernels.fp4_dequant import use_dequant_cublas
    from trace_rl.kernels.linear import small_m_gemm
    from trace_rl.kernels.operand_cache import use_operand_cache

    if use_operand_cache(M, p):
        return "operand_cache_cublas"
    if use_dequant_cublas(M, p.out_features, p.in_features):
        return "dequant_cublas"
    return small_m_gemm(M, p.q.codes.device, p)


def engine_today(pair: str, fmt: str, M: int) -> tuple[str, str, str]:
    """(W4A4 variant, W4A16 variant, why): which of the pair's variants the decoder runs today (models/decoder.py,
    models/linear.py at 3ff6bd1), without the engine's opt-in operand cache (the bench's weights have none)."""
    if pair == "layer_input":
        return "w4a4", "w4a16", "norm_into_group -> FP4Backend.norm_quantize_input (both formats, every M)"
    if pair == "o_proj":
        return "w4a4_apart", "w4a16", "Attention.forward -> self.o_proj(out): fp4_linear(x, p, fmt), its own quantize"
    if fmt == "mxfp4":
        return "w4a4_apart", "w4a16", ("gate/up stacked as gate_up_proj: MLP.forward's first branch runs "
                                       "kernels.silu_mul, then down_proj(h): fp4_linear(h, p, fmt), its own quantize "
                                       "launch (the SiLU x mul quantize fusion is never reached)")
    return "w4a4_torch_silu_apart", "w4a16_torch_silu", (
        "nvfp4 gate/up apart: silu_mul_linear needs gate | up in one buffer, which only the operand stack gives (M >= "
        "128 with the operand cache: then the epilogue-fused tail, not timed here); else F.silu(gate) * up, then "
        "down_proj: fp4_linear(h, p, fmt), its own quantize launch")


def _compile_job(job: tuple) -> str:
    """Worker (spawn): every variant of one (pair, format, M) row, eager and captured (the captured Gluon GEMM is its
    PDL variant, another compile), to fill Triton's cache."""
    pair, fmt, M = job
    try:
        import torch
        import w4a4_producer_pairs as wp
        from kernel_baselines import fp4_weights, graph_us

        K, N = wp.PAIRS[pair]
        (p, ) = fp4_weights(fmt, N, K, 1)
        w = torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02
        inp = wp.make_inputs(pair, M, K, DEV)
        for fn in wp.variants(pair, fmt, wp.produce_quantized(pair, inp, fmt)).values():
            graph_us([lambda fn=fn: fn(inp, p, w)], reps=1)
        wp.produce_apart(pair, inp, fmt)
        torch.cuda.synchronize()
        return ""
    except Exception as e:   # noqa: BLE001
        return f"{job}: {e!r}"[:300]


def precompile(pairs, ms, fmts, timeout_s: float = 40.0, workers: int = 12):
    import gemm_compute as gcb

    # small M first (the rows the target is about), then wider; each worker compiles one row's kernels
    jobs = sorted(((pair, fmt, M) for pair in pairs for fmt in fmts for M in pair_ms(pair, ms)),
                  key=lambda j: (j[2] > 16, j[0] == "o_proj", j[2]))
    return gcb.precompile(workers=workers, jobs=jobs, job_fn=_compile_job, timeout_s=timeout_s)


def _ratios(row: dict) -> None:
    us = {k[:-3]: v for k, v in row.items() if k.endswith("_us")}
    if "w4a16" in us:
        for name in ("w4a4", "w4a4_apart"):
            if name in us:
                row[f"{'w4a4' if name == 'w4a4' else 'apart'}_over_w4a16"] = round(us[name] / us["w4a16"], 3)
        if "w4a4" in us:
            row["meets_target"] = us["w4a4"] / us["w4a16"] <= TARGET
        today, today16 = row.get("engine_today"), row.get("engine_today_w4a16", "w4a16")
        if today in us and today16 in us:
            row["engine_today_over_w4a16"] = round(us[today] / us[today16], 3)
    if "bf16" in us:
        row["speedup_vs_bf16"] = {n: round(us["bf16"] / us[n], 3) for n in ("w4a16", "w4a4", "w4a4_apart") if n in us}
    if "producer_w4a16" in us and "producer_w4a4" in us:
        row["producer_w4a4_minus_w4a16_us"] = round(us["producer_w4a4"] - us["producer_w4a16"], 2)
    if "quantize_alone" in us and "w4a4_apart" in us:
        row["quantize_share_of_apart"] = round(us["quantize_alone"] / us["w4a4_apart"], 3)


def measure_row(pair, fmt, M, ps, w_bf16, graph_us, errors) -> dict:
    import torch
    import w4a4_producer_pairs as wp

    K, N = wp.PAIRS[pair]
    row = {"pair": pair, "fmt": fmt, "K": K, "N": N, "M": M, "copies": len(ps), "gemm_path": gemm_path(M, ps[0])}
    row["engine_today"], row["engine_today_w4a16"], row["engine_today_why"] = engine_today(pair, fmt, M)
    inp = wp.make_inputs(pair, M, K, DEV)
    try:
        row["check"] = wp.check_pair(pair, fmt, inp, ps[0], w_bf16[0])
        torch.cuda.synchronize()
        if not all(v for k, v in row["check"].items() if isinstance(v, bool)):
            errors.append(f"{pair} {fmt} M {M}: check {row['check']} (timed anyway)")
    except Exception as e:   # noqa: BLE001
        errors.append(f"{pair} {fmt} M {M} check: {e!r}"[:400])
    prequant = wp.produce_quantized(pair, inp, fmt) if pair == "o_proj" else None
    bf16_cycle = [w_bf16[i % len(w_bf16)] for i in range(len(ps))]
    for name, fn in wp.variants(pair, fmt, prequant).items():
        try:
            row[f"{name}_us"] = graph_us([lambda fn=fn, p=p, w=w: fn(inp, p, w) for p, w in zip(ps, bf16_cycle)])
        except Exception as e:   # noqa: BLE001 -- one failing variant must not lose the row
            errors.append(f"{pair} {fmt} M {M} {name}: {e!r}"[:400])
    _ratios(row)
    return row


def measure(args) -> None:
    import torch
    import w4a4_producer_pairs as wp
    from kernel_baselines import ceilings, fp4_weights, graph_us, json_saver, run_env, weight_copies

    start = time.time()
    pairs, ms, fmts = parse_list(args.pairs, wp.PAIRS), parse_list(args.ms, (), int), parse_list(args.fmts, wp.FMTS)
    res = {"env": run_env(torch.cuda.get_device_name(0)), "target_w4a4_over_w4a16": TARGET,
           "rows": [], "skipped": [], "errors": []}
    save = json_saver(res, args.out)
    try:
        res["ceilings"] = ceilings()
    except Exception as e:   # noqa: BLE001
        res["errors"].append(f"ceilings: {e!r}"[:300])
    save()
    for pair in pairs:
        K, N = wp.PAIRS[pair]
        w_bf16 = None
        for fmt in fmts:
            todo = pair_ms(pair, ms)
            if time.time() - start > args.budget_s:
                res["skipped"] += [{"pair": pair, "fmt": fmt, "M": M} for M in todo]
                continue
            torch.manual_seed(0)
            if w_bf16 is None:
                w_bf16 = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02
                          for _ in range(weight_copies(N * K * 2))]
            ps = fp4_weights(fmt, N, K, weight_copies(N * K // 2))
            for M in todo:
                if time.time() - start > args.budget_s:
                    res["skipped"].append({"pair": pair, "fmt": fmt, "M": M})
                    continue
                row = measure_row(pair, fmt, M, ps, w_bf16, graph_us, res["errors"])
                res["rows"].append(row)
                save()
                print({k: row.get(k) for k in ("pair", "fmt", "M", "gemm_path", "w4a4_over_w4a16", "apart_over_w4a16",
                                               "engine_today", "check")}, flush=True)
            del ps
            torch.cuda.empty_cache()
        del w_bf16
        torch.cuda.empty_cache()
    res["total_s"] = time.time() - start
    save()


def run_cli(doc: str, out: str, pairs, fmts, ms: list[int], precompile_rows, measure_rows,
            ms_help: str = "comma list of row counts") -> int:
    """The command line this bench, w4a4_pdl.py and oproj_prefetch.py share (the same flags and defaults; `out`:
    --out's default, `pairs` / `fmts`: what --pairs / --fmts take (pairs None: no --pairs flag, precompile_rows gets
    []), `ms`: --ms's default). --precompile-only: precompile_rows(pairs, fmts, ms, timeout_s, workers) -> (errors,
    hung) on the parsed lists, printed with its time, exit 1 on any error or hung job; else measure_rows(args)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", default=out)
    ap.add_argument("--budget-s", type=float, default=60.0, help="start no new row after this many seconds")
    if pairs is not None:
        ap.add_argument("--pairs", default=None, help=f"comma list of {list(pairs)} (default: all)")
    ap.add_argument("--ms", default=",".join(map(str, ms)), help=ms_help)
    ap.add_argument("--fmts", default=None, help=f"comma list of {list(fmts)} (default: both)")
    ap.add_argument("--precompile-only", action="store_true")
    ap.add_argument("--precompile-timeout-s", type=float, default=40.0)
    ap.add_argument("--workers", type=int, default=12, help="precompile processes")
    args = ap.parse_args()
    if args.precompile_only:
        import gemm_compute as gcb

        rows = (parse_list(args.pairs, pairs) if pairs is not None else [], parse_list(args.fmts, fmts),
                parse_list(args.ms, (), int))
        return gcb.precompile_exit(lambda: precompile_rows(*rows, args.precompile_timeout_s, args.workers))
    measure_rows(args)
    return 0


def main() -> int:
    import w4a4_producer_pairs as wp

    def precompile_rows(pairs, fmts, ms, timeout_s, workers):
        return precompile(pairs, ms, fmts, timeout_s, workers)

    return run_cli(__doc__, "w4a4_producers.json", wp.PAIRS, wp.FMTS, MS, precompile_rows, measure,
                   ms_help="comma list of row counts (o_proj adds 313)")


if __name__ == "__main__":
    sys.exit(main())
