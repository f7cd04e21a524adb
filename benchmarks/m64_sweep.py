"""Gluon FP4 GEMM configs at M = 64 (issue 15: W4A16 >= 1.6x cuBLAS BF16 at 4096x12288 and 12288x4096; the opt-in
wide 64-token tile reaches 1.29-1.33x) against the wide tile and cuBLAS BF16, in one run.

    python benchmarks/m64_sweep.py --out m64.json [--budget-s 60]     # an sm_90 GPU, Triton 3.6
    python benchmarks/m64_sweep.py --precompile-only                  # fill Triton's cache (worker processes)
    python benchmarks/m64_sweep.py --dry                              # each launch's grid on 132 SMs (no GPU)

K x N = 4096 x 12288 and 12288 x 4096 (x [M, K] @ W^T, W [N, K]), M = 64 (then 128 if the budget allows), nvfp4 and
mxfp4, W4A16 (bf16 x):
- `wide`: config None (`config_for`: WIDE's token tile, or M64_GRID's config where one is set);
- each of fp4_gemm_gluon_config.M64_CANDIDATES for the format (see there: split, tile, warps, slots, overlap);
- `cublas_bf16` (F.linear on bf16 weight copies).
Before timing, per point: each variant against the float64 reference (relative Frobenius < 1e-2 and finite, else
not timed), run twice (`deterministic`), and `bit_identical_vs_wide_same_split`: against WIDE's tile config run at
the candidate's own K partition (`wide_at_partition`; the project's bit rule: bits depend on the K partition only;
None where WIDE's step cannot cut it), `bit_identical_vs_wide` (only candidates with wide's K partition can be).
Timing: microseconds per call, one CUDA graph of calls over weight copies beyond L2, median of 15 replays
(kernel_baselines.graph_us), 2 rounds per point, the variants in reverse order in the second round; a variant's `us`
is the mean of its round medians, `rounds_us` lists them. The JSON is rewritten after every point; past
`--budget-s` no new point starts ("skipped"). torch, triton and trace_rl's kernels only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = [(4096, 12288), (12288, 4096)]     # K x N
MS = [64, 128]                             # M = 64 first for every shape and format; 128 only as the budget allows
FMTS = ["nvfp4", "mxfp4"]
ROUNDS = 2
DEV = "cuda"


def variants(fmt: str) -> dict:
    """name -> GluonConfig (None: config_for's choice) for `fmt`."""
    from trace_rl.kernels.fp4_gemm_gluon_config import M64_CANDIDATES

    return {"wide": None, **{n: c for n, (c, fmts) in M64_CANDIDATES.items() if fmt in fmts}}


def wide_config(M: int, fmt: str):
    """WIDE's tile at M (what `wide` runs while M64_GRID is empty; the bit reference at any split)."""
    from trace_rl.kernels.fp4_gemm_gluon_config import WIDE

    tiles = WIDE[fmt]
    return tiles[next((t for t in sorted(tiles) if t >= M), max(tiles))]


def wide_at_partition(M: int, fmt: str, padded: tuple[int, int], facts: dict):
    """WIDE's tile at the same K partition as a launch (`_launch_facts`): the same number of programs along K, each
    over the same columns (the bits depend on that partition only), or None where WIDE's K step cannot cut it."""
    w = wide_config(M, fmt)
    kb_w = padded[1] // w.bk(fmt)
    if w.bk(fmt) * -(-kb_w // facts["split"]) != facts["columns_per_program"]:
        return None
    return replace(w, split_k=facts["split"])


def _weights(fmt: str, K: int, N: int, n: int, seed: int = 0) -> tuple[list, list]:
    """`n` random [N, K] weights: (PackedWeights, their Hopper layouts), made now (never inside a capture)."""
    import torch

    from trace_rl.backends import PackedWeight
    from trace_rl.kernels import quantize
    from trace_rl.kernels.linear import hopper_weight

    g = torch.Generator(device=DEV).manual_seed(seed)
    ps = []
    for _ in range(n):
        w = torch.randn(N, K, device=DEV, generator=g, dtype=torch.float32).to(torch.bfloat16) * 0.02
        ps.append(PackedWeight(fmt, N, K, q=quantize(w, fmt)))
    return ps, [hopper_weight(p) for p in ps]


def _x(M: int, K: int, seed: int):
    import torch

    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(M, K, device=DEV, generator=g, dtype=torch.float32).to(torch.bfloat16)


def _call(x, h, cfg):
    from trace_rl.kernels.fp4_gemm_gluon import fp4_matmul_gluon

    return fp4_matmul_gluon(x, h, cfg)


def _compile_job(job: tuple) -> str:
    """Worker (spawn): every launch of one (format, variant) at every shape and M, + the bit-reference launches
    (WIDE at the variant's split), to fill Triton's cache."""
    fmt, name = job
    try:
        import torch

        from trace_rl.kernels.fp4_gemm_gluon import _sm_count

        sms = _sm_count(0)
        cfg = variants(fmt)[name]
        hs = {(K, N): _weights(fmt, K, N, 1)[1][0] for K, N in SHAPES}
        for M in MS:                 # M = 64 first: a precompile cut by its timeout has compiled those
            for (K, _), h in hs.items():
                x = _x(M, K, 1)
                _call(x, h, cfg)
                ref_cfg = wide_at_partition(M, fmt, h.padded, _launch_facts(M, fmt, h.padded, cfg, sms))
                if ref_cfg is not None:
                    _call(x, h, ref_cfg)
        torch.cuda.synchronize()
        return ""
    except Exception as e:   # noqa: BLE001
        return f"{job}: {e!r}"[:300]


def precompile(timeout_s: float = 40.0, workers: int = 12) -> tuple[list[str], list[tuple]]:
    """Every job of `_compile_job` in `workers` spawned processes; a job still running after `timeout_s` has its
    workers killed (a kernel that never finishes would hang the run). Returns (errors, hung jobs)."""
    from concurrent.futures import ProcessPoolExecutor, wait
    from multiprocessing import get_context

    jobs = [(fmt, name) for fmt in FMTS for name in variants(fmt)]
    pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=get_context("spawn"))
    futs = {pool.submit(_compile_job, j): j for j in jobs}
    done, pending = wait(futs, timeout=timeout_s)
    errors = [e for e in (f.result() for f in done) if e]
    if pending:
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    return errors, sorted(futs[f] for f in pending)


def _rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _launch_facts(M: int, fmt: str, padded: tuple[int, int], cfg, sms: int) -> dict:
    """The launch's config, token tile, K step, split, programs, waves and CTAs per SM on `sms` SMs, as
    fp4_matmul_gluon computes them (importable without a GPU)."""
    import triton

    from trace_rl.kernels.fp4_gemm_gluon_config import auto_split, config_for

    c = cfg or config_for(M, fmt, padded[1], padded[0])
    bm, bk = c.tile_m(M), c.bk(fmt)
    # = fp4_gemm_gluon.launch_grid (that module needs Triton 3.6's Gluon; --dry runs anywhere)
    n_tiles, m_tiles, kb = triton.cdiv(padded[0], c.block_n), triton.cdiv(M, bm), padded[1] // bk
    per_sm = c.ctas_per_sm(bm, fmt)
    split = c.split_k or auto_split(n_tiles * m_tiles, kb, sms * per_sm)
    split = triton.cdiv(kb, triton.cdiv(kb, max(1, min(split, kb))))
    programs = n_tiles * m_tiles * split
    return {"config": asdict(c), "block_m": bm, "block_k": bk, "split": split, "programs": programs,
            "ctas_per_sm": per_sm, "waves": round(programs / (sms * per_sm), 2),
            "k_steps_per_program": -(-kb // split), "columns_per_program": -(-kb // split) * bk,
            "smem_bytes": c.smem_bytes(bm, fmt)}


def _point(fmt, K, N, M, ps, hs, w_bf16, graph_us, errors) -> dict:
    """One (format, shape, M) point: checks, then ROUNDS rounds of timing."""
    import torch
    import torch.nn.functional as F
    from kernel_baselines import interleaved_rounds, round_stats

    from trace_rl.kernels.fp4_gemm_gluon import GluonConfig, launch_grid

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = _x(M, K, 1000 + M)
    ref = x.double() @ ps[0].q.dequantize().double().T
    row = {"fmt": fmt, "K": K, "N": N, "M": M, "padded": list(hs[0].padded), "variants": {}}
    outs = {}
    for name, cfg in variants(fmt).items():
        v = row["variants"][name] = {}
        try:
            v.update(_launch_facts(M, fmt, hs[0].padded, cfg, sms))
            used = GluonConfig(**v["config"])
            split = launch_grid(M, hs[0].padded, used, v["block_m"], v["block_k"],
                                lambda u=used, bm=v["block_m"]: sms * u.ctas_per_sm(bm, fmt))[3]
            if split != v["split"]:
                raise AssertionError(f"launch facts: split {v['split']}, fp4_gemm_gluon.launch_grid {split}")
            y = _call(x, hs[0], cfg)
            torch.cuda.synchronize()
            v["rel_vs_ref"] = _rel(y, ref)
            v["ok"] = bool(torch.isfinite(y).all()) and v["rel_vs_ref"] < 1e-2
            v["deterministic"] = bool(torch.equal(y, _call(x, hs[0], cfg)))
            ref_cfg = wide_at_partition(M, fmt, hs[0].padded, v)
            if ref_cfg is None:         # e.g. 512-column steps at a split whose chunks WIDE's 256 cannot cut
                v["bit_identical_vs_wide_same_split"] = None
            else:
                v["bit_identical_vs_wide_same_split"] = bool(torch.equal(y, _call(x, hs[0], ref_cfg)))
            outs[name] = y
        except Exception as e:   # noqa: BLE001 -- one failing variant must not lose the point
            v["ok"] = False
            errors.append(f"{fmt} {K}x{N} M {M} {name}: {e!r}"[:400])
    base = outs.get("wide")
    for name, y in outs.items():
        if base is not None:
            v = row["variants"][name]
            v["bit_identical_vs_wide"] = bool(torch.equal(y, base))
            v["rel_vs_wide"] = _rel(y, base)
    timed = {n: (lambda cfg=cfg: [lambda h=h: _call(x, h, cfg) for h in hs])
             for n, cfg in variants(fmt).items() if row["variants"][n].get("ok")}
    bf = [w_bf16[i % len(w_bf16)] for i in range(len(hs))]
    timed["cublas_bf16"] = lambda: [lambda w=w: F.linear(x, w) for w in bf]
    row.update(round_stats(interleaved_rounds(timed, lambda n: graph_us(timed[n]()), ROUNDS, errors,
                                              f"{fmt} {K}x{N} M {M}")))
    fp4 = {n: u for n, u in row["us"].items() if n in row["variants"]}
    cub = row["us"].get("cublas_bf16")
    if fp4:
        best = min(fp4, key=fp4.get)
        row["best"], row["best_us"] = best, fp4[best]
        wide = fp4.get("wide")
        if wide:
            row["best_vs_wide"] = round(wide / fp4[best], 3)      # > 1: the best candidate is faster
            row["best_wins_every_round"] = best != "wide" and all(
                b < s for b, s in zip(row["rounds_us"][best], row["rounds_us"]["wide"]))
        if cub:
            row["best_vs_cublas_bf16"] = round(cub / fp4[best], 3)
            row["vs_cublas_bf16"] = {n: round(cub / u, 3) for n, u in fp4.items()}
            if wide:
                row["wide_vs_cublas_bf16"] = round(cub / wide, 3)
    return row


def measure(args) -> None:
    import torch
    from kernel_baselines import graph_us, json_saver, run_env, weight_copies

    start = time.time()
    res = {"env": run_env(torch.cuda.get_device_name(0), sms=torch.cuda.get_device_properties(0).multi_processor_count),
           "rows": [], "skipped": [], "errors": []}
    save = json_saver(res, args.out)
    save()
    torch.manual_seed(0)
    order = [(M, K, N, fmt) for M in MS for K, N in SHAPES for fmt in FMTS]
    for M, K, N, fmt in order:
        if time.time() - start > args.budget_s:
            res["skipped"].append({"fmt": fmt, "K": K, "N": N, "M": M})
            continue
        try:
            n = weight_copies(N * K // 2)
            ps, hs = _weights(fmt, K, N, n)
            w_bf16 = [torch.randn(N, K, device=DEV, dtype=torch.bfloat16) * 0.02
                      for _ in range(weight_copies(N * K * 2))]
            row = _point(fmt, K, N, M, ps, hs, w_bf16, graph_us, res["errors"])
            row["weight_copies"] = n
            res["rows"].append(row)
            del ps, hs, w_bf16
        except Exception as e:   # noqa: BLE001 -- one failing point must not lose the others
            res["errors"].append(f"{fmt} {K}x{N} M {M}: {e!r}"[:400])
        save()
        r = res["rows"][-1] if res["rows"] else {}
        print({k: r.get(k) for k in ("fmt", "K", "N", "M", "best", "best_us", "best_vs_wide", "best_vs_cublas_bf16")},
              r.get("us"), flush=True)
    res["total_s"] = round(time.time() - start, 1)
    save()


MARGIN = 0.98       # a candidate replaces the wide tile at a point only at <= 98% of its time, every round


def _eligible(r: dict, name: str) -> bool:
    v = r["variants"].get(name, {})
    return bool(v.get("ok") and v.get("deterministic") and v.get("bit_identical_vs_wide_same_split")
                and name in r.get("us", {}))


def rule_proposal(rows: list[dict]) -> dict:
    """Per format and shape at M = 64: the fastest candidate that passed its checks (reference, deterministic, bits of
    WIDE at its split), proposed when it is <= MARGIN of wide's time and beat it in every round, else "keep".
    `common`: the one candidate with the lowest mean ratio over both shapes that qualifies at both (a None key)."""
    out = {}
    for fmt in FMTS:
        pts = [r for r in rows if r["fmt"] == fmt and r["M"] == 64 and "wide" in r.get("us", {})]
        per_shape, ratios = {}, {}
        for r in pts:
            key = f"{r['K']}x{r['N']}"
            scores = {}
            for name in r["variants"]:
                if name == "wide" or not _eligible(r, name):
                    continue
                ratio = r["us"][name] / r["us"]["wide"]
                every = all(c < w for c, w in zip(r["rounds_us"][name], r["rounds_us"]["wide"]))
                scores[name] = (round(ratio, 3), every)
                ratios.setdefault(name, {})[key] = (ratio, every)
            best = min(scores, key=lambda n: scores[n][0], default=None)
            entry = {"padded_n_k": r["padded"], "scores": {n: s for n, (s, _) in scores.items()}}
            if best is not None and scores[best][0] <= MARGIN and scores[best][1]:
                entry.update(choice=best, time_vs_wide=scores[best][0],
                             vs_cublas_bf16=r.get("vs_cublas_bf16", {}).get(best),
                             same_bits_as_wide=r["variants"][best].get("bit_identical_vs_wide"))
            else:
                entry.update(choice="keep", why=f"no candidate at <= {MARGIN} of wide in every round"
                             if best else "no candidate passed its checks")
            per_shape[key] = entry
        both = {n: d for n, d in ratios.items() if len(d) == len(pts) == len(SHAPES)
                and all(e and q <= MARGIN for q, e in d.values())}
        common = min(both, key=lambda n: sum(q for q, _ in both[n].values()), default=None)
        out[fmt] = {"per_shape": per_shape, "common": common or "keep"}
    # the Python for fp4_gemm_gluon_config.M64_GRID: per shape (padded N, K) keys; `common` would be a None key
    items = {}
    for fmt in FMTS:
        for e in out.get(fmt, {}).get("per_shape", {}).values():
            if e["choice"] != "keep":
                items.setdefault(fmt, []).append(f'({e["padded_n_k"][0]}, {e["padded_n_k"][1]}): '
                                                 f'M64_CANDIDATES["{e["choice"]}"][0]')
    out["M64_GRID"] = "M64_GRID = {" + ", ".join(f'"{fmt}": {{' + ", ".join(items.get(fmt, [])) + "}"
                                                 for fmt in FMTS) + "}"
    out["M64_GRID_common"] = "M64_GRID = {" + ", ".join(
        f'"{fmt}": {{None: M64_CANDIDATES["{out[fmt]["common"]}"][0]}}' if out.get(fmt, {}).get("common", "keep")
        != "keep" else f'"{fmt}": {{}}' for fmt in FMTS) + "}"
    return out


def summarize(res: dict) -> dict:
    """The check's summary.json body: `rule_proposal`, failed checks, per point the us, the best variant, its ratios
    to cuBLAS and wide, whether it won every round, each variant's grid."""
    s = {"total_s": res.get("total_s"), "errors": res.get("errors", [])[:8], "skipped": res.get("skipped", [])}
    rows = res.get("rows", [])
    s["rule_proposal"] = rule_proposal(rows)
    # one line per point, first in the file: what the coordinator reads (issue 15's target: >= 1.6x cuBLAS at M = 64)
    s["table"] = [f"{r['fmt']} {r['K']}x{r['N']} M={r['M']}: best {r.get('best')} {r.get('best_us')} us = "
                  f"{r.get('best_vs_cublas_bf16')}x cuBLAS ({r.get('us', {}).get('cublas_bf16')} us), "
                  f"{r.get('best_vs_wide')}x wide (wide {r.get('us', {}).get('wide')} us = "
                  f"{r.get('wide_vs_cublas_bf16')}x cuBLAS), won every round: {r.get('best_wins_every_round')}"
                  f"{', meets 1.6x' if (r.get('best_vs_cublas_bf16') or 0) >= 1.6 else ''}" for r in rows]
    s["checks_failed"] = [f"{r['fmt']} {r['K']}x{r['N']} M={r['M']} {n}: " + ", ".join(
        k for k in ("ok", "deterministic", "bit_identical_vs_wide_same_split") if v.get(k) is False)
        for r in rows for n, v in r["variants"].items()
        if any(v.get(k) is False for k in ("ok", "deterministic", "bit_identical_vs_wide_same_split"))]
    s["rows"] = [{"fmt": r["fmt"], "K": r["K"], "N": r["N"], "M": r["M"],
                  "us": {k: round(u, 2) for k, u in r.get("us", {}).items()},
                  **{k: r[k] for k in ("best", "best_us", "best_vs_cublas_bf16", "wide_vs_cublas_bf16",
                                       "best_vs_wide", "best_wins_every_round", "vs_cublas_bf16") if k in r},
                  "grid": {n: f"split {v.get('split')} programs {v.get('programs')} x{v.get('ctas_per_sm')}/SM "
                              f"waves {v.get('waves')}" for n, v in r["variants"].items() if "split" in v},
                  "bits_vs_wide": {n: v.get("bit_identical_vs_wide") for n, v in r["variants"].items()},
                  "max_rel_vs_ref": max((v.get("rel_vs_ref", 0) for v in r["variants"].values()), default=None)}
                 for r in rows]
    return s


def dry(sms: int = 132) -> dict:
    """Per format, shape and M, each variant's launch on `sms` SMs: no GPU."""
    from trace_rl.kernels.hopper_fp4 import padded_shape

    return {f"{fmt} {K}x{N}": {M: {n: _launch_facts(M, fmt, padded_shape(N, K), c, sms)
                                   for n, c in variants(fmt).items()} for M in MS}
            for fmt in FMTS for K, N in SHAPES}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="m64.json")
    ap.add_argument("--budget-s", type=float, default=60.0, help="start no new point after this many seconds")
    ap.add_argument("--precompile-only", action="store_true")
    ap.add_argument("--precompile-timeout-s", type=float, default=40.0)
    ap.add_argument("--dry", action="store_true", help="print each variant's launch on 132 SMs (no GPU) and exit")
    args = ap.parse_args()
    if args.dry:
        import json

        plan = dry()
        with open(args.out, "w") as f:
            json.dump(plan, f, indent=1)
        for key, per_m in plan.items():
            for M, vs in per_m.items():
                print(key, M, {n: (v["split"], v["programs"], v["ctas_per_sm"], v["waves"], v["k_steps_per_program"])
                               for n, v in vs.items()})
        return 0
    if args.precompile_only:
        import gemm_compute as gcb

        return gcb.precompile_exit(lambda: precompile(args.precompile_timeout_s))
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
