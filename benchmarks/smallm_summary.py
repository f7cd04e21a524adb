"""The `smallm` / `smallwide` checks' summary from benchmarks/smallm_sweep.py's JSON: the rule proposal (the
fp4_gemm_gluon_config.SMALL_GRID to paste), issue 15's table (the best FP4 time vs cuBLAS BF16 per shape, format and
M: the 2.2x target) and per point the times, the winner and the checks. Plain Python (no GPU, no torch)."""

from __future__ import annotations

from trace_rl.kernels.fp4_gemm_gluon_config import M_BUCKETS, m_bucket

MARGIN = 0.98       # a candidate replaces the shipped config only at <= 98% of its time in EVERY round of every point
ISSUE_TARGET = 2.2                    # issue 15: the FP4 W4A16 GEMM at M <= 16 >= 2.2x cuBLAS BF16
# SMALL_GRID's M buckets (fp4_gemm_gluon_config.M_BUCKETS: 8 = M 1..8, 16 = M 9..16): a bucket's choice must win at
# every measured M in it (the `m16` check's M = 12 and 16 both land in bucket 16)


def _shapes(rows: list[dict]) -> list[tuple[int, int]]:
    seen = []
    for r in rows:
        if (r["K"], r["N"]) not in seen:
            seen.append((r["K"], r["N"]))
    return seen


def bucket_choice(pts: list[dict]) -> dict:
    """One (format, shape, M bucket): among the candidates timed at every point of `pts` (both acts), correct
    (`ok`) and, where checked, bit-identical to the fin=False launch at their split, those at <= MARGIN of the
    shipped time in every round of every point; the one with the lowest mean ratio is the `choice`, else "keep"."""
    pts = [r for r in pts if "shipped" in r.get("us", {})]
    if not pts:
        return {"choice": "keep", "why": "not measured"}
    scores, qualified = {}, {}
    for name in pts[0]["variants"]:
        if name == "shipped":
            continue
        vs = [r["variants"].get(name, {}) for r in pts]
        if not all(v.get("ok") and v.get("bit_identical_vs_nofin", True) for v in vs) or \
                not all(name in r["us"] for r in pts):
            continue
        scores[name] = round(sum(r["us"][name] / r["us"]["shipped"] for r in pts) / len(pts), 3)
        worst = max(c / s for r in pts for c, s in zip(r["rounds_us"][name], r["rounds_us"]["shipped"]))
        if worst <= MARGIN:
            qualified[name] = round(worst, 3)
    entry = {"points": len(pts), "scores": scores}
    if qualified:
        best = min(qualified, key=scores.get)
        entry.update(choice=best, time_vs_shipped=scores[best], worst_round_vs_shipped=qualified[best],
                     same_bits_as_shipped=all(r["variants"][best].get("bit_identical_vs_shipped") for r in pts))
    else:
        entry.update(choice="keep", why=f"no candidate at <= {MARGIN} of shipped in every round"
                     if scores else "no candidate passed its checks")
    return entry


def _name_of(cfg, fmt: str, candidates: dict) -> str:
    return next(n for n, (c, fmts) in candidates.items() if c == cfg and fmt in fmts)


def grid_python(grid: dict) -> str:
    """{fmt: {(lo, hi, K): {bucket: candidate name}}} as the Python of SMALL_GRID (one line)."""
    return "{" + ", ".join(
        f'"{fmt}": {{' + ", ".join(
            f"{key}: {{" + ", ".join(f'{b}: SMALL_GRID_CANDIDATES["{n}"][0]' for b, n in sorted(tiles.items())) + "}"
            for key, tiles in classes.items()) + "}"
        for fmt, classes in grid.items()) + "}"


def rule_proposal(rows: list[dict], small_grid: dict | None = None, candidates: dict | None = None) -> dict:
    """Per format, shape ("KxN") and M bucket: `bucket_choice`; then `SMALL_GRID`: the current rule (`small_grid`,
    default fp4_gemm_gluon_config's) with each winner put at its shape's class (the class the shape already falls
    in, else an exact (rows, rows, K) class of its padded shape), as the Python to paste; `changes`: one line per
    shape and bucket that changes."""
    from trace_rl.kernels import fp4_gemm_gluon_config as gc
    from trace_rl.kernels.hopper_fp4 import padded_shape

    small_grid = gc.SMALL_GRID if small_grid is None else small_grid
    candidates = candidates or gc.SMALL_GRID_CANDIDATES
    grid = {fmt: {key: {b: _name_of(c, fmt, candidates) for b, c in tiles.items()}
                  for key, tiles in (small_grid.get(fmt) or {}).items()} for fmt in ("nvfp4", "mxfp4")}
    out, changes = {}, []
    for fmt in grid:
        per_shape = {}
        for K, N in _shapes(rows):
            pts = [r for r in rows if r["fmt"] == fmt and (r["K"], r["N"]) == (K, N)]
            if not pts:
                continue
            entries = {b: bucket_choice([r for r in pts if m_bucket(r["M"]) == b]) for b in M_BUCKETS}
            per_shape[f"{K}x{N}"] = entries
            n_pad, k_pad = padded_shape(N, K)
            key = next((k for k in grid[fmt] if k[2] == k_pad and k[0] <= n_pad <= k[1]), (n_pad, n_pad, k_pad))
            for b, e in entries.items():
                if e["choice"] != "keep":
                    grid[fmt].setdefault(key, {})[b] = e["choice"]
                    changes.append(f"{fmt} {K}x{N} M bucket {b}: {e['choice']} at {e['time_vs_shipped']} of shipped "
                                   f"(worst round {e['worst_round_vs_shipped']}) -> class {key}")
        out[fmt] = per_shape
    return {"SMALL_GRID": grid_python(grid), "changes": changes, **out}     # the Python to paste first


def issue_table(rows: list[dict]) -> dict:
    """{"fmt KxN": {"M act": "shipped x / best x (name)"}}: cuBLAS BF16's time over the shipped and the best FP4
    variant's (same rounds); `met` lists where the best reaches ISSUE_TARGET, `missed` where the shipped does not."""
    table, met, missed = {}, [], []
    for r in rows:
        if "cublas_bf16" not in r.get("us", {}) or "best" not in r:
            continue
        sh, best = r.get("shipped_vs_cublas_bf16"), r.get("best_vs_cublas_bf16")
        cell = f"{sh} / {best} ({r['best']})"
        table.setdefault(f"{r['fmt']} {r['K']}x{r['N']}", {})[f"M={r['M']} {r['act']}"] = cell
        where = f"{r['fmt']} {r['K']}x{r['N']} M={r['M']} {r['act']}"
        if sh is not None and sh < ISSUE_TARGET:
            missed.append(f"{where}: shipped {sh}" + (f", best {best} ({r['best']})"
                                                      if best is not None and best >= ISSUE_TARGET else ""))
        if best is not None and best >= ISSUE_TARGET:
            met.append(where)
    return {"target": ISSUE_TARGET, "cells": "cuBLAS BF16 us / FP4 us: shipped / best (best's name)",
            "table": table, "shipped_below_target": missed, "best_at_target": len(met), "points": len(rows)}


def bits_vs_shipped(rows: list[dict]) -> dict:
    """{"fmt KxN": {variant: "same" | "differs" | "mixed"}} over that shape's points (every M and act): whether the
    variant's output was bit-identical to the shipped launch's (the same K partition gives the same bits)."""
    seen: dict = {}
    for r in rows:
        for n, v in r["variants"].items():
            b = v.get("bit_identical_vs_shipped")
            if n != "shipped" and b is not None:
                seen.setdefault(f"{r['fmt']} {r['K']}x{r['N']}", {}).setdefault(n, set()).add(b)
    return {shape: {n: "same" if b == {True} else "differs" if b == {False} else "mixed" for n, b in vs.items()}
            for shape, vs in seen.items()}


def summarize(res: dict) -> dict:
    """The check's summary.json body from the sweep's JSON: `rule_proposal` first (its `SMALL_GRID` is the Python to
    paste), `issue_table`, failed checks, then per point the us, the best variant and the ratios."""
    rows = res.get("rows", [])
    s = {"rule_proposal": rule_proposal(rows), "issue_table": issue_table(rows),
         "bits_vs_shipped": bits_vs_shipped(rows),
         "gemlite": res.get("gemlite"), "weight_copies": res.get("weight_copies"), "total_s": res.get("total_s"),
         "errors": res.get("errors", [])[:8], "skipped": res.get("skipped", [])}
    s["vs_gemlite"] = {f"{r['fmt']} {r['K']}x{r['N']} M={r['M']}": {
        "shipped": r.get("shipped_vs_gemlite_int4"), "best": r.get("best_vs_gemlite_int4"), "best_name": r.get("best")}
        for r in rows if r["act"] == "w4a16" and "gemlite_int4" in r.get("us", {})}
    s["checks_failed"] = [f"{r['fmt']} {r['K']}x{r['N']} M={r['M']} {r['act']} {n}: " + ", ".join(
        k for k in ("ok", "bit_identical_vs_nofin") if v.get(k) is False)
        for r in rows for n, v in r["variants"].items()
        if v.get("ok") is False or v.get("bit_identical_vs_nofin") is False]
    s["rows"] = [{"fmt": r["fmt"], "K": r["K"], "N": r["N"], "M": r["M"], "act": r["act"],
                  "us": {k: round(u, 2) for k, u in r["us"].items()},
                  **{k: r[k] for k in ("best", "best_vs_shipped", "best_wins_every_round", "best_vs_gemlite_int4",
                                       "shipped_vs_gemlite_int4", "best_vs_cublas_bf16", "shipped_vs_cublas_bf16")
                     if k in r},
                  "split": {n: v.get("split") for n, v in r["variants"].items()},
                  "bits_vs_shipped": {n: v.get("bit_identical_vs_shipped") for n, v in r["variants"].items()},
                  "excluded": r.get("excluded", {}),
                  "max_rel_vs_ref": max((v.get("rel_vs_ref", 0) for v in r["variants"].values()), default=None)}
                 for r in rows]
    return s
