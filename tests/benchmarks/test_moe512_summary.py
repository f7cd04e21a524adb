"""benchmarks/moe512_summary.py (check `moe512`'s summary) on a made-up result: the winner per B is the least
gate_up + down among bit-identical configs and only past MIN_GAIN; the TILE_RULE it suggests merges equal buckets and
keeps mxfp4's Triton range where the Triton kernel still wins."""

from __future__ import annotations

import json

import moe512_summary as ms


def _fmt(shipped_tile, shipped_us, triton_us, configs):
    return {"shipped": {"path": "gluon" if shipped_tile else "triton", "tile": shipped_tile, "us": shipped_us},
            "triton": {"us": triton_us},
            "configs": {n: {"us": us, "x_bf16": 1.0, "bit_equal": eq, "model": {"tiles_max": 7}}
                        for n, (us, eq) in configs.items()}}


def _rows():
    rows = []
    for B, tile in ((256, "32"), (409, "32"), (512, "64x64")):
        for g, scale in (("gate_up", 1.0), ("down", 0.5)):
            nv = {"32": (100 * scale, True), "64x64": (126 * scale, True), "32b": (100 * scale, True),
                  "32x64ob": ({256: 101, 409: 90, 512: 130}[B] * scale, True), "64": (80 * scale, False)}
            if B == 512:
                nv["32"] = (158 * scale, True)
                nv["32b"] = (110 * scale, True)
                nv["64x64"] = (126 * scale, True)
            ship = nv[tile][0]
            row = {"gemm": g, "B": B, "rows_per_expert": {}, "bf16_best_us": 260 * scale, "nvfp4":
                   _fmt(tile, ship, 120 * scale, nv)}
            if g == "gate_up":
                row["mxfp4"] = _fmt(None if B == 409 else tile, 105 if B == 409 else 100, 105,
                                    {"32": (116, True), "32x64b": (95 if B == 409 else 99, True)})
            rows.append(row)
    return rows


def test_winners_need_bit_identity_and_the_margin():
    win = ms.winners(_rows(), "nvfp4")
    assert win[256]["pick"] == "32"                   # 32x64ob 1% faster: under MIN_GAIN
    assert win[409]["pick"] == "32x64ob" and win[409]["gain"] == round(150 / 135, 3)
    assert win[512]["pick"] == "32b"                  # "64" is faster but not bit-identical
    mx = ms.winners(_rows(), "mxfp4")
    assert mx[409]["pick"] == "32x64b" and mx[409]["shipped"] == "triton"


def test_suggested_rule_text():
    now = ((12, 16), (28, 32), (None, "64x64"))
    s = ms.suggest_rule(ms.winners(_rows(), "nvfp4"), "nvfp4", now)
    assert s["rule"] == repr(((12, 16), (20, 32), (28, "32x64ob"), (None, "32b"))) and s["changed"]
    assert s["line"].startswith('"nvfp4": ((12, 16), (20, 32)')
    assert s["test_expect"]["tests/kernels/test_fp4_grouped_gluon.py"] == [16, 16, 16, 32, 32, "32x64ob", "32b"]
    same = ms.suggest_rule({256: {"pick": "32"}, 409: {"pick": "32"}, 512: {"pick": "64x64"}}, "nvfp4", now)
    assert same["rule"] == repr(now) and not same["changed"]
    tri = ms.suggest_rule({256: {"pick": "32"}, 409: {"pick": "triton"}, 512: {"pick": 64}}, "mxfp4",
                          ((12, 16), (20, 32), (None, 64)))
    assert tri["triton_faster"] == repr(((20, 28),)) and tri["rule"] == repr(((12, 16), (20, 32), (None, 64)))


def test_summarize_reads_the_run(tmp_path):
    (tmp_path / "moe512.json").write_text(json.dumps({"ceilings": {"read_TBps": 4.4}, "rows": _rows()}))
    s = ms.summarize(str(tmp_path))
    assert len(s["points"]) == 9 and s["tile_rule"]["nvfp4"]["changed"]
    p = next(p for p in s["points"] if p["B"] == 409 and p["fmt"] == "nvfp4" and p["gemm"] == "gate_up")
    assert p["configs"]["32x64ob"]["us"] == 90 and p["shipped"]["x_bf16"] == 2.6
