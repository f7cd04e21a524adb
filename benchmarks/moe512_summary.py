"""The summary of check `moe512` (benchmarks/moe512_h200.sh): from benchmarks/moe512.py's JSON (and the compile gate's
JSON of the same run, for SASS per weight element), per (GEMM, B, format) the shipped pick and the best bit-identical
config with their ratios to BF16 `torch._grouped_mm` / the cuBLAS loop, and the TILE_RULE (and grouped_dispatch
TRITON_FASTER) that the measured winners give.

    python benchmarks/moe512_summary.py OUT_DIR        # reads OUT/moe512.json, OUT/sass_gate.json; prints the dict

The rule is one token tile per bucket of mean rows per expert: B = 256 (16 rows), 409 (25.6) and 512 (32) at top-8 of
128 experts. Per B and format the winner is the config with the least gate_up + down time (mxfp4: gate_up only: its
down projection, K = 768, always takes the Triton kernel) among those bit-identical to the shipped tile or to the
Triton kernel (the tile N may or may not change the wgmma's bits: both are recorded), and it
replaces the shipped pick only when it is at least MIN_GAIN faster in sum (below it: run-to-run noise, see
`shipped_again_us`). Buckets: (12, 16] keeps 16; (16, 20] and (20, 28] take the 256 and 409 winners; above 28 the 512
one (nothing above 32 rows per expert is measured: grouped_dispatch.GLUON_MAX_MEAN keeps those on Triton).
"""

from __future__ import annotations

import json
import os
import sys

MIN_GAIN = 1.03
BUCKETS = ((256, 20), (409, 28), (512, None))      # B whose winner takes the bucket (previous bound, bound]


def _tile(name: str):
    return int(name) if name.isdigit() else name


def _rule_tile(rule: tuple, mean: float):
    """token_tile's pick from `rule` at `mean` rows per expert."""
    return next(t for b, t in rule if b is None or mean <= b)


def _valid(res: dict) -> bool:
    """Timed, and bit-identical to the shipped Gluon tile or to the Triton kernel."""
    return "us" in res and bool(res.get("bit_equal") or res.get("bit_equal_triton"))


def winners(rows: list[dict], fmt: str) -> dict:
    """B -> {"pick": config name or "triton", "gain": shipped / pick (gate_up + down), "shipped": ..., "sum_us"}."""
    gemms = ("gate_up", "down") if fmt == "nvfp4" else ("gate_up", )
    out = {}
    for B in sorted({r["B"] for r in rows}):
        per = {g: next((r.get(fmt, {}) for r in rows if r["B"] == B and r["gemm"] == g), {}) for g in gemms}
        if not all(p.get("shipped", {}).get("us") for p in per.values()):
            out[B] = {"pick": None, "why": "the shipped pick was not measured in every GEMM"}
            continue
        ship = sum(p["shipped"]["us"] for p in per.values())
        names = set.intersection(*[set(p.get("configs", {})) for p in per.values()])
        totals = {n: sum(p["configs"][n]["us"] for p in per.values()) for n in names
                  if all(_valid(p["configs"][n]) for p in per.values())}
        if all(p.get("triton", {}).get("us") for p in per.values()):
            totals["triton"] = sum(p["triton"]["us"] for p in per.values())
        shipped_name = per["gate_up"]["shipped"]["tile"] or "triton"
        if not totals:
            out[B] = {"pick": shipped_name, "why": "no config measured and bit-identical in every GEMM"}
            continue
        best = min(totals, key=totals.get)
        gain = ship / totals[best]
        pick = best if gain >= MIN_GAIN else shipped_name
        out[B] = {"pick": pick, "best": best, "gain": round(gain, 3), "shipped": shipped_name,
                  "shipped_sum_us": round(ship, 2), "best_sum_us": round(totals[best], 2)}
    return out


def suggest_rule(win: dict, fmt: str, now: tuple) -> dict:
    """The TILE_RULE[fmt] the winners give (and whether mxfp4's TRITON_FASTER (20, 28) stays), as Python text."""
    entries, triton_ranges = [(12, 16)], []
    prev = 12
    for B, bound in BUCKETS:
        pick = win.get(B, {}).get("pick")
        if pick is None:     # not measured: the rule's tile at this B, as it is
            pick = _rule_tile(now, B * 8 / 128)
        if pick == "triton":
            triton_ranges.append((prev, bound))
            pick = _rule_tile(now, B * 8 / 128)     # the Gluon tile the rule keeps under it
        entries.append((bound, _tile(str(pick))))
        prev = bound
    merged = []
    for b, t in entries:
        if merged and merged[-1][1] == t:
            merged[-1] = (b, t)
        else:
            merged.append((b, t))
    rule = tuple(merged)
    # the pinned expectations of the tests that check TILE_RULE, under the suggested rule (same batches, top-8 of 128)
    tests = {"tests/kernels/test_grouped_dispatch.py": (64, 128, 192, 256, 320, 409, 448, 512),
             "tests/kernels/test_fp4_grouped_gluon.py": (64, 128, 192, 256, 320, 409, 512)}
    return {"rule": repr(rule), "changed": rule != tuple(now), "triton_faster": repr(tuple(triton_ranges)),
            "line": f'"{fmt}": {rule!r},',
            "test_expect": {f: [_rule_tile(rule, 8 * b / 128) for b in bs] for f, bs in tests.items()}}


def sass_per_element(out: str) -> dict:
    """Compile-gate case name -> SASS per weight element, from OUT/sass_gate.json (this run's compile gate)."""
    try:
        rep = json.load(open(os.path.join(out, "sass_gate.json")))
        rep = rep if isinstance(rep, list) else rep.get("reports", [])
        return {r["name"]: round(r["per_element"], 3) for r in rep if r.get("per_element")}
    except Exception:   # noqa: BLE001 -- the summary says it is missing
        return {}


def gate_name(fmt: str, name: str) -> str | None:
    try:
        from trace_rl.kernels.fp4_grouped_gluon import gate_case, tile_config
        from trace_rl.kernels.fp4_grouped_gluon_dual import gate_case as dual_case

        c = tile_config(fmt, _tile(name))
        return (dual_case if getattr(c, "dual", False) else gate_case)(fmt, c, 9.0).name
    except Exception:   # noqa: BLE001
        return None


def headline(pt: dict) -> str:
    """One line per point: the shipped pick and the best bit-identical config, us and x BF16."""
    sh, be = pt.get("shipped") or {}, pt.get("best") or {}
    text = f"{pt['gemm']} B={pt['B']} {pt['fmt']}: bf16 {pt.get('bf16_best_us')} us"
    if sh.get("us"):
        text += f" | shipped {sh.get('tile') or 'triton'} {sh['us']} us ({sh.get('x_bf16')}x)"
    if be:
        text += f" | best {be['config']} {be['us']} us ({be['x_bf16']}x bf16, {be['x_shipped']}x shipped)"
    return text + (f" | gluon: {pt['gluon_error'][:80]}" if pt.get("gluon_error") else "")


def summarize(out: str) -> dict:
    """The check's summary (see the module doc): headline, tile_rule, points (every config), skipped / excluded."""
    r = json.load(open(os.path.join(out, "moe512.json")))
    sass = sass_per_element(out)
    s = {"read_TBps": round(r.get("ceilings", {}).get("read_TBps", 0), 3), "sass_gate_cases": len(sass),
         "headline": [], "tile_rule": {}, "points": []}
    for row in r["rows"]:
        for fmt in ("nvfp4", "mxfp4"):
            p = row.get(fmt)
            if not p:
                continue
            pt = {"gemm": row["gemm"], "B": row["B"], "fmt": fmt, "rows_per_expert": row["rows_per_expert"],
                  "grouped_mm_us": row.get("grouped_mm_us"), "cublas_loop_us": row.get("cublas_loop_us"),
                  "bf16_best_us": row.get("bf16_best_us"), "floor_us": p.get("floor_us"),
                  "triton_us": p.get("triton", {}).get("us"), "shipped": p.get("shipped"),
                  "shipped_again_us": p.get("shipped_again_us"), "best": p.get("best")}
            base = row.get("bf16_best_us")
            if pt["shipped"] and pt["shipped"].get("us") and base:
                pt["shipped"] = dict(pt["shipped"], x_bf16=round(base / pt["shipped"]["us"], 3))
            pt["configs"] = {n: ({"us": v["us"], "x_bf16": v.get("x_bf16"), "bit_equal": v.get("bit_equal"),
                                  "bit_equal_triton": v.get("bit_equal_triton"),
                                  "tiles_max": v.get("model", {}).get("tiles_max"),
                                  "sass_per_elem": sass.get(gate_name(fmt, n))}
                                 if "us" in v else {"error": v.get("error", "")[:160]})
                             for n, v in p.get("configs", {}).items()}
            if p.get("gluon_shipped_tile", {}).get("error"):
                pt["gluon_error"] = p["gluon_shipped_tile"]["error"][:160]
            pt["meets_2_5x"] = bool(pt["best"] and pt["best"]["x_bf16"] >= 2.5)
            s["points"].append(pt)
            s["headline"].append(headline(pt))
    try:
        from trace_rl.kernels.fp4_grouped_gluon import TILE_RULE

        for fmt in ("nvfp4", "mxfp4"):
            win = winners(r["rows"], fmt)
            s["tile_rule"][fmt] = {"now": repr(TILE_RULE[fmt]), "winners": win,
                                   **suggest_rule(win, fmt, TILE_RULE[fmt])}
    except Exception as e:   # noqa: BLE001
        s["tile_rule_error"] = repr(e)[:300]
    s["skipped"], s["excluded"] = r.get("skipped", []), r.get("excluded", [])
    if "unfinished_row" in r:
        s["unfinished_row"] = {k: r["unfinished_row"].get(k) for k in ("gemm", "B")}
    if "error" in r:
        s["bench_error"] = r["error"][-800:]
    return s


if __name__ == "__main__":
    print(json.dumps(summarize(sys.argv[1]), indent=1))
