"""Issue 15's W4A4 o_proj miss (4096x4096, K x N; W4A4 / W4A16 1.16-1.48 at M <= 16): the prefetch-all configs of the
Gluon GEMM (trace_rl/kernels/fp4_gemm_gluon_prefetch.py: a ring as deep as a program's K steps, so every weight
load issues before the PDL wait on the activation quantize) against the shipped config, on `fp4_linear`'s W4A4 path
as the engine's CUDA graph runs it (its own quantize, launched with PDL), and the attention's new
griddepcontrol.launch_dependents (GluonAttentionConfig.launch_dependents) in front of it.

    python benchmarks/oproj_prefetch.py --out oprojpf.json [--budget-s 60]   # an sm_90 GPU, Triton 3.6
    python benchmarks/oproj_prefetch.py --precompile-only                     # fill Triton's cache

Rows (nvfp4 and mxfp4, M = 1 / 4 / 8 / 16), microseconds per linear (one CUDA graph over weight copies beyond L2,
median of 15 replays, `kernel_baselines.graph_us`; 3 rounds, alternating order: `kernel_baselines.interleaved_rounds`;
`rounds_us` per variant, `median_us` their medians): `w4a16` (fp4_linear on bf16, its
config_for config), `shipped` (fp4_linear(a, p, fmt) with W4A4_PDL_GRID as committed), and each prefetch-all
candidate (the table's entry for 4096x4096 set to it while captured). The kernel before each quantize in the graph is
the previous copy's GEMM, which signals launch_dependents at its start. Per row: `ratio_w4a16` (W4A4 / W4A16 per
variant, median of rounds; target <= 1.15), `best` (the fastest candidate and whether it beat the shipped config by
>= 2% in every round: `wins`), `bits` (each candidate's graph output = its eager output on the same quantized operand,
and = the shipped output where the K partition is the same).
Engine pair (`engine`): the Gluon decode attention (B = 16, L = 2048, Qwen3-8B heads, the format's cache, its default
config; the same cache every call, so partly L2-resident) then o_proj on its output, in one graph over the o_proj
weight copies, with the attention's launch_dependents on / off (ABBA, the faster of two), o_proj W4A4 at the shipped
config and at the M = 16 row's best candidate, and W4A16: `*_on_over_off`, `*_over_w4a16` (attention + o_proj).
The JSON is rewritten after every row; past `--budget-s` no new row starts ("skipped").
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from w4a4_pdl import TARGET  # noqa: E402 (issue 15's W4A4 / W4A16 bound, 1.15)

MS = [1, 4, 8, 16]
FMTS = ("nvfp4", "mxfp4")
K = N = 4096
SHAPE = (4096, 4096)            # padded (N, K)
WIN = 0.98                      # a candidate wins a round at <= 0.98 x the shipped time
ROUNDS = 3
DEV = "cuda"
ENGINE_B, ENGINE_L = 16, 2048


def candidates(fmt: str) -> dict:
    from trace_rl.kernels.fp4_gemm_gluon_prefetch import PREFETCH_ALL_CANDIDATES

    return {n: c for n, (c, fmts) in PREFETCH_ALL_CANDIDATES.items() if fmt in fmts}


@contextlib.contextmanager
def table_entry(fmt: str, M: int, config):
    """W4A4_PDL_GRID[fmt][SHAPE] = {bucket of M: config} while inside (None: the table as committed)."""
    from trace_rl.kernels import fp4_gemm_gluon_prefetch as pf

    if config is None:
        yield
        return
    old = pf.W4A4_PDL_GRID[fmt].get(SHAPE)
    pf.W4A4_PDL_GRID[fmt][SHAPE] = {**(old or {}), pf.m_bucket(M): config}
    try:
        yield
    finally:
        if old is None:
            pf.W4A4_PDL_GRID[fmt].pop(SHAPE)
        else:
            pf.W4A4_PDL_GRID[fmt][SHAPE] = old


def variants(fmt: str) -> dict:
    """name -> (act_fmt, candidate config or None)."""
    out = {"w4a16": ("bf16", None), "shipped": (fmt, None)}
    out.update({n: (fmt, c) for n, c in candidates(fmt).items()})
    return out


def time_variant(name, fmt, M, a, ps) -> float:
    from kernel_baselines import graph_us

    from trace_rl.kernels.linear import fp4_linear

    act, c = variants(fmt)[name]
    with table_entry(fmt, M, c):
        return graph_us([lambda p=p: fp4_linear(a, p, act) for p in ps])


def graph_once(fn):
    """fn captured in a CUDA graph (warmed up on a side stream), replayed once: its output."""
    import torch
    from kernel_baselines import capture_graph

    g, out = capture_graph(fn)
    g.replay()
    torch.cuda.synchronize()
    return out.clone()


def check_bits(fmt, M, a, p) -> dict:
    """The shipped W4A4 path captured with QUANTIZE_PDL off / on = eager (`shipped`: w4a4_pdl.check_bits); per
    candidate: its W4A4 PDL path in a graph = the same config run eagerly on the eagerly quantized operand
    (`eq_eager`), and = the shipped graph output where the K partition is the shipped one (`eq_shipped`)."""
    import torch
    import w4a4_pdl

    from trace_rl.formats import per_token
    from trace_rl.kernels.fp4_gemm_gluon import fp4_matmul_gluon
    from trace_rl.kernels.fp4_gemm_gluon_prefetch import same_partition, shipped_w4a4_config
    from trace_rl.kernels.linear import fp4_linear, hopper_weight
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    h = hopper_weight(p)
    xq, rs = quantize_dequant_bf16(a, per_token(fmt))
    shipped = graph_once(lambda: fp4_linear(a, p, fmt))
    base = shipped_w4a4_config(M, fmt, *SHAPE)
    split_b = None
    if not base.split_k:       # SMALL_M's auto split on this device
        from trace_rl.kernels.fp4_gemm_gluon import _sm_count, launch_grid

        bm = base.tile_m(M)
        split_b = launch_grid(M, h.padded, base, bm, base.bk(fmt), lambda: _sm_count(0) * base.ctas_per_sm(bm, fmt))[3]
    out = {"shipped": w4a4_pdl.check_bits(lambda: fp4_linear(a, p, fmt))}
    for name, c in candidates(fmt).items():
        with table_entry(fmt, M, c):
            got = graph_once(lambda: fp4_linear(a, p, fmt))
        eager = fp4_matmul_gluon(xq, h, c, row_scale=rs, out_dtype=a.dtype, pdl=True)    # the graph's compile
        r = {"eq_eager": bool(torch.equal(got, eager)), "finite": bool(torch.isfinite(got).all())}
        if same_partition(c, base, fmt, K, split_b):
            r["eq_shipped"] = bool(torch.equal(got, shipped))
        out[name] = r
    return out


def summarize_row(row: dict) -> None:
    """ratio_w4a16, per-round wins against shipped, best candidate (in place) from row["rounds_us"] ({variant: us per
    round}, kernel_baselines.interleaved_rounds)."""
    import statistics

    rounds = {n: t for n, t in row["rounds_us"].items() if t}
    med = {n: statistics.median(t) for n, t in rounds.items()}
    row["median_us"] = {n: round(v, 3) for n, v in med.items()}
    if "w4a16" in med:
        row["ratio_w4a16"] = {n: round(v / med["w4a16"], 3) for n, v in med.items() if n != "w4a16"}
    cands = [n for n in med if n not in ("w4a16", "shipped")]
    if "shipped" not in med or not cands:
        return
    ship = rounds["shipped"]       # a win: every round timed for both, and <= WIN x shipped in each
    wins = {n: len(rounds[n]) == len(ship) == ROUNDS and all(a <= WIN * b for a, b in zip(rounds[n], ship))
            for n in cands}
    best = min(cands, key=lambda n: med[n])
    row["best"] = {"name": best, "over_shipped": round(med[best] / med["shipped"], 3), "wins": wins[best],
                   "ratio_w4a16": row.get("ratio_w4a16", {}).get(best)}
    row["winners"] = sorted((n for n in cands if wins[n]), key=lambda n: med[n])


def engine_pair(fmt, ps, config_name, gen) -> dict:
    """Gluon attention (B = 16, L = 2048) then o_proj W4A4 on its output, one graph over the weight copies, with the
    attention's launch_dependents on and off; o_proj at the shipped config and at `config_name`."""
    import dataclasses

    import attention as A
    import torch
    from kernel_baselines import graph_us

    from trace_rl.kernels.linear import fp4_linear
    from trace_rl.kernels.paged_attention_gluon import decode_attention_gluon, default_config

    pages = ENGINE_L // 64
    blocks = ENGINE_B * pages
    table = torch.randperm(blocks, device=DEV).to(torch.int32).reshape(ENGINE_B, pages)
    lens = torch.full((ENGINE_B, ), ENGINE_L, device=DEV, dtype=torch.int32)
    q = torch.randn(ENGINE_B, A.HQ, A.D, device=DEV, dtype=torch.bfloat16)
    k, v = A.random_cache(fmt, "k", blocks, 64, gen), A.random_cache(fmt, "v", blocks, 64, gen)
    base = default_config(A.HQ // A.HKV, k.fmt)
    res = {"B": ENGINE_B, "L": ENGINE_L, "kv": k.fmt, "attention_config": repr(base)}
    conf = {"shipped": (fmt, None), "w4a16": ("bf16", None)}
    if config_name:
        conf[config_name] = (fmt, candidates(fmt)[config_name])
    for deps in (True, False, False, True):      # ABBA: the faster of two per variant
        c = dataclasses.replace(base, launch_dependents=deps)
        for name, (act, gc) in conf.items():
            def call(p, c=c, act=act):
                o = decode_attention_gluon(q, k, v, table, lens, A.D ** -0.5, config=c)
                return fp4_linear(o.reshape(ENGINE_B, A.HQ * A.D), p, act)
            key = f"{name}_deps_{'on' if deps else 'off'}_us"
            with table_entry(fmt, ENGINE_B, gc):
                us = round(graph_us([lambda p=p, call=call: call(p) for p in ps]), 3)
            res[key] = min(us, res.get(key, us))
    res["attention_alone_us"] = round(graph_us(
        [lambda: decode_attention_gluon(q, k, v, table, lens, A.D ** -0.5, config=base)] * len(ps)), 3)
    for name in conf:
        on, off = res.get(f"{name}_deps_on_us"), res.get(f"{name}_deps_off_us")
        if on and off:
            res[f"{name}_on_over_off"] = round(on / off, 3)
    w16 = res.get("w4a16_deps_on_us")
    for name in conf:          # the engine-like W4A4 / W4A16 (attention + o_proj over attention + o_proj)
        if name != "w4a16" and w16 and res.get(f"{name}_deps_on_us"):
            res[f"{name}_over_w4a16"] = round(res[f"{name}_deps_on_us"] / w16, 3)
    return res


def _compile_job(job: tuple) -> str:
    """Worker (spawn): every variant of (fmt, M) captured once (the PDL compiles), or the engine pair's kernels."""
    fmt, M, what = job
    try:
        import torch
        from kernel_baselines import fp4_weights, graph_us

        ps = fp4_weights(fmt, N, K, 2)
        a = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
        from trace_rl.kernels.linear import fp4_linear

        if what == "engine":
            engine_pair(fmt, ps, None, torch.Generator(device=DEV).manual_seed(0))
        elif what == "shipped":     # the timed graph and check_bits' eager / QUANTIZE_PDL-off launches
            import w4a4_pdl

            w4a4_pdl.check_bits(lambda: fp4_linear(a, ps[0], fmt))
        else:                       # the timed graph (check_bits' eager launch of a candidate is the same compile)
            with table_entry(fmt, M, variants(fmt)[what][1]):
                graph_us([lambda p=p: fp4_linear(a, p, variants(fmt)[what][0]) for p in ps], reps=1)
        torch.cuda.synchronize()
        return ""
    except Exception as e:   # noqa: BLE001
        return f"{job}: {e!r}"[:300]


def compile_jobs(fmts, ms) -> list:
    tiles = sorted({1 if M <= 8 else 16 for M in ms})      # M = 1..8 share the 8-token tile's compiles
    return [(f, M, v) for f in fmts for M in tiles for v in variants(f)] + [(f, 16, "engine") for f in fmts]


def measure(args) -> None:
    import torch
    import w4a4_producers as wprod
    from kernel_baselines import fp4_weights, interleaved_rounds, json_saver, run_env, weight_copies

    start = time.time()
    fmts, ms = wprod.parse_list(args.fmts, FMTS), wprod.parse_list(args.ms, (), int)
    res = {"env": run_env(torch.cuda.get_device_name(0)), "target_w4a4_over_w4a16": TARGET, "win_factor": WIN,
           "rounds": ROUNDS, "rows": [], "engine": [], "skipped": [], "errors": []}
    save = json_saver(res, args.out)
    gen = torch.Generator().manual_seed(0)
    for fmt in fmts:
        torch.manual_seed(0)
        ps = fp4_weights(fmt, N, K, weight_copies(N * K // 2))
        for M in ms:
            if time.time() - start > args.budget_s:
                res["skipped"].append({"fmt": fmt, "M": M})
                continue
            a = torch.randn(M, K, generator=gen).to(DEV, torch.bfloat16)
            row = {"fmt": fmt, "M": M, "K": K, "N": N, "copies": len(ps)}
            try:
                row["bits"] = check_bits(fmt, M, a, ps[0])
            except Exception as e:   # noqa: BLE001
                res["errors"].append(f"{fmt} M {M} bits: {e!r}"[:400])
            def one(n, f=fmt, m=M, a=a, ps=ps):
                return time_variant(n, f, m, a, ps)
            timed = interleaved_rounds(list(variants(fmt)), one, ROUNDS, res["errors"], f"{fmt} M {M}")
            row["rounds_us"] = {n: [round(u, 3) for u in t] for n, t in timed.items()}
            summarize_row(row)
            res["rows"].append(row)
            save()
            print({k: row.get(k) for k in ("fmt", "M", "ratio_w4a16", "best")}, flush=True)
        if time.time() - start > args.budget_s:
            res["skipped"].append({"fmt": fmt, "engine": True})
            continue
        try:
            row16 = next((r for r in res["rows"] if r["fmt"] == fmt and r["M"] == 16), {})
            best = (row16.get("best") or {}).get("name")
            res["engine"].append({"fmt": fmt, **engine_pair(fmt, ps, best, torch.Generator(device=DEV).manual_seed(0))})
            print(res["engine"][-1], flush=True)
        except Exception as e:   # noqa: BLE001
            res["errors"].append(f"{fmt} engine pair: {e!r}"[:400])
        save()
        ps = None         # free the copies before the next format's
        torch.cuda.empty_cache()
    res["total_s"] = round(time.time() - start, 1)
    save()


def summarize(res: dict) -> dict:
    """The check's headline: bits, per point W4A4 / W4A16 shipped and best, the rule to paste, the engine A/B."""
    rows = res.get("rows", [])
    bits = [(r["fmt"], r["M"], n, b) for r in rows for n, b in (r.get("bits") or {}).items()]
    s = {"bits_ok": bool(bits) and all(all(v for v in b.values()) for *_, b in bits),
         "bits_failed": [f"{f} M={M} {n}: {b}" for f, M, n, b in bits if not all(b.values())]}
    s["points"] = [{"fmt": r["fmt"], "M": r["M"], "shipped_over_w4a16": r.get("ratio_w4a16", {}).get("shipped"),
                    "best": r.get("best"), "winners": r.get("winners"), "median_us": r.get("median_us")}
                   for r in rows]
    s["over_target_shipped"] = [f"{p['fmt']} M={p['M']}: {p['shipped_over_w4a16']}" for p in s["points"]
                                if (p["shipped_over_w4a16"] or 0) > TARGET]
    s["over_target_with_rule"] = []
    rule: dict = {}
    for r in rows:
        bucket = 8 if r["M"] <= 8 else 16
        best, ship = r.get("best") or {}, r.get("ratio_w4a16", {}).get("shipped")
        won = bool(best.get("wins"))
        ratio = best.get("ratio_w4a16") if won else ship
        if ratio is not None and ratio > TARGET:
            s["over_target_with_rule"].append(f"{r['fmt']} M={r['M']}: {ratio}")
        rule.setdefault(r["fmt"], {}).setdefault(bucket, []).append(best.get("name") if won else None)
    # a bucket takes a candidate only if the same one won at every measured M of the bucket
    table = {f: {b: names[0] for b, names in bs.items() if names[0] and all(n == names[0] for n in names)}
             for f, bs in rule.items()}
    lines = {f: "{" + ", ".join(f"{b}: PREFETCH_ALL_CANDIDATES[{n!r}][0]" for b, n in sorted(t.items())) + "}"
             for f, t in table.items() if t}
    s["rule_proposal"] = {
        "W4A4_PDL_GRID": "{" + ", ".join(f"{f!r}: {{{SHAPE!r}: {line}}}" for f, line in lines.items()) + "}"
        if lines else "none: no candidate beat the shipped config by >= 2% in every round at every M of a bucket",
        "where": "trace_rl/kernels/fp4_gemm_gluon_prefetch.py W4A4_PDL_GRID (keep the other format's empty dict)",
        "per_bucket": table}
    s["engine"] = res.get("engine", [])
    s["skipped"], s["errors"], s["total_s"] = res.get("skipped", []), res.get("errors", [])[:8], res.get("total_s")
    return s


def main() -> int:
    import w4a4_producers as wprod

    def precompile_rows(_pairs, fmts, ms, timeout_s, workers):
        import gemm_compute as gcb

        return gcb.precompile(workers=workers, jobs=compile_jobs(fmts, ms), job_fn=_compile_job, timeout_s=timeout_s)

    return wprod.run_cli(__doc__, "oprojpf.json", None, FMTS, MS, precompile_rows, measure,
                         ms_help="comma list of row counts (<= 16)")


if __name__ == "__main__":
    sys.exit(main())
