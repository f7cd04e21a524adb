"""benchmarks/smallm_sweep.py, smallm_summary.py and smallm_h200.sh on CPU: the variants' launches (--dry: dedupe,
wave filter), the sweep's bookkeeping with the weights, the GEMM and the timing replaced (every point of two shapes,
check, ratio, the rule proposal per shape and the cuBLAS table), the proposal's Python picking the candidate through
`config_for`, the proposal's margin / every-round / checks rules on hand-made timings, and the .sh's summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")
try:
    import smallm_summary as ss  # noqa: E402
    import smallm_sweep as sw  # noqa: E402

    from trace_rl.kernels import fp4_gemm_gluon as fg  # noqa: E402  (needs triton.experimental.gluon)
    gluon_ok = True
except Exception:   # noqa: BLE001 -- a Triton without Gluon
    gluon_ok = False
pytestmark = pytest.mark.skipif(not gluon_ok, reason="needs triton.experimental.gluon")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _shipped_is_small_m(monkeypatch):
    """The bookkeeping is checked against SMALL_M as `shipped` (SMALL_GRID empty, whatever the module holds)."""
    from trace_rl.kernels import fp4_gemm_gluon_config as gc

    monkeypatch.setattr(gc, "SMALL_GRID", {"nvfp4": {}, "mxfp4": {}})


def test_dry_plan_splits():
    plan = sw.dry([(4096, 1024), (4096, 12288)], 132)
    for M in sw.MS:
        nv, mx = plan["4096x1024"]["nvfp4"][M], plan["4096x1024"]["mxfp4"][M]
        assert (nv["shipped"]["split"], nv["shipped"]["programs"], nv["shipped"]["columns_per_program"]) == \
            (4, 64, 1024)                         # SMALL_M's auto split at 4096x1024: the point gemlite wins
        assert (nv["split8"]["programs"], nv["split8"]["columns_per_program"]) == (128, 512)
        assert (nv["k256_split16"]["programs"], nv["w8_split8"]["programs"]) == (256, 64)
        assert nv["k256_split4"]["columns_per_program"] == 1024
        # split4 at 512-column steps is SMALL_M's launch here: not timed twice
        assert mx["excluded"] == {"split4": "same launch as shipped"}
        # qn_split8 (8-token tiles) is q_split8's launch where M fits one 8-token tile
        assert nv["excluded"] == {"split4": "same launch as shipped",
                                  **({"qn_split8": "same launch as q_split8"} if M <= 8 else {})}
        assert set(mx) == {"shipped", "split8", "split2", "split3", "w8_split8", "w8_split2", "w8_split4", "excluded"}
        big = plan["4096x12288"]["nvfp4"][M]
        assert (big["shipped"]["split"], big["shipped"]["programs"]) == (2, 384)
        assert big["excluded"]["split2"] == "same launch as shipped"
        assert big["excluded"]["k256_split16"] == "3072 programs > 2 waves of 396"
        assert (big["w8_split4"]["programs"], big["k256_split2"]["columns_per_program"]) == (384, 2048)


def test_parse_shapes():
    assert sw.parse_shapes("4096x12288, 12288X4096") == [(4096, 12288), (12288, 4096)]
    for bad in ("", "4096", "4096x0", "ax4"):
        with pytest.raises(SystemExit, match="K x N pairs"):
            sw.parse_shapes(bad)


def _fake_gemm(x, h, config=None, out=None, row_scale=None, bias=None, out_dtype=torch.bfloat16, pdl=False):
    """x @ dequant(W)^T (x row scale) in bf16; a K partition other than the shipped one changes the bits (x 1.004),
    as another split-K rounding would; fin=False gives the fin kernel's bits."""
    from trace_rl.kernels.hopper_fp4 import operand

    w = operand(h).double()[:h.n, :x.shape[1]] * h.row_factor[:h.n, None].double()
    y = x.double() @ w.T
    if row_scale is not None:
        y = y * row_scale.double()[:, None]
    cols = sw._launch_facts(x.shape[0], h.fmt, h.padded, config, 132)["columns_per_program"]
    if cols != sw._launch_facts(x.shape[0], h.fmt, h.padded, None, 132)["columns_per_program"]:
        y = y * 1.004
    return y.to(out_dtype)


def _fake_graph_us(calls):
    """A time by what the calls launch: split 8 of 64-row tiles 5.0 us, shipped 5.6, other candidates 5.8, cuBLAS 7.7
    (each call run once)."""
    for fn in calls:
        fn()
    env = dict(zip(calls[0].__code__.co_freevars, (c.cell_contents for c in calls[0].__closure__ or ())))
    if "cfg" not in env:
        return 7.7
    c = env["cfg"]
    return 5.6 if c is None else 5.0 if (c.split_k, c.block_n) == (8, 64) else 5.8


# K x N: 4096 x 200, the shipped split 4 (4 row tiles x 8 steps); 2048 x 128: split 2 (2 tiles x 4 steps)
SHAPES = [(4096, 200), (2048, 128)]


def _run_sweep(monkeypatch, out):
    import kernel_baselines as kb

    from trace_rl.backends import get_backend
    from trace_rl.kernels.hopper_fp4 import to_hopper

    monkeypatch.setattr(sw, "DEV", "cpu")
    # the candidates before the M = 16 ones (SMALLM_VARIANTS' filter; the bookkeeping is the same for every
    # candidate, and each one costs this CPU run ~10 s)
    from trace_rl.kernels.fp4_gemm_gluon_config import M16_CANDIDATES, SMALL_GRID_CANDIDATES

    monkeypatch.setattr(sw, "VARIANTS", [n for n in SMALL_GRID_CANDIDATES if n not in M16_CANDIDATES])

    def weights(fmt, K, N, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        ps = [get_backend("fp4").prepare_weight(torch.randn(N, K, generator=g) * 0.02, fmt) for _ in range(n)]
        return ps, [to_hopper(p.q) for p in ps]

    def inputs(fmt, K, M, seed):
        x = torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
        return x, x, (torch.rand(M) + 0.5 if fmt == "nvfp4" else None)

    monkeypatch.setattr(sw, "_weights", weights)
    monkeypatch.setattr(sw, "_inputs", inputs)
    monkeypatch.setattr(fg, "fp4_matmul_gluon", _fake_gemm)
    monkeypatch.setattr(kb, "graph_us", _fake_graph_us)
    monkeypatch.setattr(kb, "weight_copies", lambda nbytes: 2)
    monkeypatch.setattr(kb, "gemlite_available", lambda: (False, "gemlite not importable: test"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "cpu test")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    sw.measure(SimpleNamespace(out=str(out), budget_s=1e9, shapes=SHAPES))
    return json.load(open(out))


def test_sweep_bookkeeping_and_rule(monkeypatch, tmp_path):
    r = _run_sweep(monkeypatch, tmp_path / "smallm.json")
    assert len(r["rows"]) == len(SHAPES) * len(sw.FMTS) * len(sw.MS) * len(sw.ACTS) and not r["errors"]
    assert not r["skipped"] and r["gemlite"] == {"unavailable": "gemlite not importable: test"}
    assert r["shapes"] == [{"K": 4096, "N": 200}, {"K": 2048, "N": 128}]
    for row in r["rows"]:
        vs = row["variants"]
        shipped_split = 4 if row["K"] == 4096 else 2
        assert all(v["ok"] for v in vs.values()), row
        assert vs["shipped"]["bit_identical_vs_shipped"] and not vs["split8"]["bit_identical_vs_shipped"]
        assert vs["shipped"]["split"] == shipped_split and vs["split8"]["split"] == 8 if row["K"] == 4096 else 4
        assert row["excluded"][f"split{shipped_split}"] == "same launch as shipped"      # timed once, as shipped
        if row["fmt"] == "nvfp4" and row["K"] == 4096:
            assert vs["k256_split4"]["bit_identical_vs_shipped"]           # the shipped K partition
        assert all(v.get("bit_identical_vs_nofin", row["act"] == "prequant") for v in vs.values())
        assert ("bit_identical_vs_nofin" in vs["shipped"]) == (row["act"] == "w4a16")
        assert row["best"] == "split8" and row["best_vs_shipped"] == round(5.6 / 5.0, 3)
        assert row["best_wins_every_round"] and row["best_vs_cublas_bf16"] == round(7.7 / 5.0, 3)
        assert len(row["rounds_us"]["shipped"]) == sw.ROUNDS
        assert "cublas_bf16" in row["us"]                                   # both acts: the issue's baseline
        assert row.get("gemlite_int4", "").startswith("gemlite unavailable") == (row["act"] == "w4a16")
    s = ss.summarize(r)
    prop = s["rule_proposal"]
    for fmt in sw.FMTS:
        for shape in ("4096x200", "2048x128"):
            for bucket in ss.M_BUCKETS:
                e = prop[fmt][shape][bucket]
                assert e["choice"] == "split8" and e["time_vs_shipped"] == round(5.0 / 5.6, 3), e
                assert e["same_bits_as_shipped"] is False
    assert len(prop["changes"]) == 8
    from trace_rl.kernels import fp4_gemm_gluon_config as gc

    grid = eval(prop["SMALL_GRID"], {"SMALL_GRID_CANDIDATES": gc.SMALL_GRID_CANDIDATES})   # the Python to paste
    assert set(grid["nvfp4"]) == {(208, 208, 4096), (128, 128, 2048)}      # exact classes of the padded shapes
    monkeypatch.setattr(gc, "SMALL_GRID", grid)
    for fmt in sw.FMTS:
        for M in sw.MS:
            assert gc.config_for(M, fmt, 4096, 208) == gc.config_for(M, fmt, 2048, 128) == \
                gc.SMALL_GRID_CANDIDATES["split8"][0]
            assert gc.config_for(M, fmt, 4096, 1024) == gc.config_for(M, fmt, 2048, 256) == gc.SMALL_M
    assert not s["checks_failed"] and len(s["rows"]) == 24 and s["vs_gemlite"] == {}
    table = s["issue_table"]
    assert table["table"]["nvfp4 4096x200"]["M=1 w4a16"] == f"{round(7.7 / 5.6, 3)} / {round(7.7 / 5.0, 3)} (split8)"
    assert table["best_at_target"] == 0 and len(table["shipped_below_target"]) == 24
    # nothing wins by the margin: keep, and the Python is the rule as it was
    for row in r["rows"]:
        for n in row["rounds_us"]:
            if n in row["variants"] and n != "shipped":
                row["us"][n] = row["us"]["shipped"] * 0.99
                row["rounds_us"][n] = [u * 0.99 for u in row["rounds_us"]["shipped"]]
    keep = ss.rule_proposal(r["rows"], {"nvfp4": {}, "mxfp4": {}})     # the rule before the paste above
    assert keep["nvfp4"]["4096x200"][8]["choice"] == "keep" and keep["changes"] == []
    assert keep["SMALL_GRID"] == '{"nvfp4": {}, "mxfp4": {}}'


def _row(fmt, K, N, M, rounds, act="w4a16", **checks):
    """A sweep row with hand-made round times {name: [round 1, round 2]}; `checks` {name: {check: value}}."""
    vs = {n: {"ok": True, "bit_identical_vs_nofin": True, "bit_identical_vs_shipped": n == "shipped",
              **checks.get(n, {})} for n in rounds if n != "cublas_bf16"}
    us = {n: sum(t) / len(t) for n, t in rounds.items()}
    row = {"fmt": fmt, "K": K, "N": N, "M": M, "act": act, "variants": vs, "us": us, "rounds_us": rounds}
    fp4 = {n: u for n, u in us.items() if n in vs}
    row["best"] = min(fp4, key=fp4.get)
    if "cublas_bf16" in us:
        row["best_vs_cublas_bf16"] = round(us["cublas_bf16"] / fp4[row["best"]], 3)
        row["shipped_vs_cublas_bf16"] = round(us["cublas_bf16"] / us["shipped"], 3)
    return row


def test_rule_proposal_per_shape_keeps_the_control(monkeypatch):
    """Against the rule as committed: a winner at 4096x12288 M = 16 (every round <= 98%) becomes an exact class
    (12288 rows, K 4096) with bucket 16 only; M = 1 / 4 (1% only, or losing a round, or failing its bit check) keep;
    the 4096x1024 control's entries stay unless a candidate wins there; a control winner goes into its class."""
    from trace_rl.kernels import fp4_gemm_gluon_config as gc

    k16, s8 = gc.SMALL_GRID_CANDIDATES["k256_split16"][0], gc.SMALL_GRID_CANDIDATES["split8"][0]
    monkeypatch.setattr(gc, "SMALL_GRID", {"nvfp4": {(1, 1024, 4096): {8: k16, 16: k16}},
                                           "mxfp4": {(1, 1024, 4096): {8: s8}}})
    rows = []
    for act in sw.ACTS:
        rows += [_row("nvfp4", 4096, 12288, 16, {"shipped": [10.0, 10.2], "split3": [9.7, 9.9], "w8_split4": [9.0, 9.5],
                                                 "cublas_bf16": [22.0, 22.0]}, act,
                      w8_split4={"bit_identical_vs_nofin": act != "w4a16"}),
                 _row("nvfp4", 4096, 12288, 1, {"shipped": [10.0, 10.0], "split3": [9.9, 9.9],
                                                "k256_split2": [9.0, 9.9], "cublas_bf16": [23.0, 23.0]}, act),
                 _row("nvfp4", 4096, 12288, 4, {"shipped": [10.0, 10.0], "split3": [9.9, 9.9],
                                                "k256_split2": [9.0, 9.9], "cublas_bf16": [23.0, 23.0]}, act),
                 _row("mxfp4", 4096, 1024, 16, {"shipped": [6.0, 6.0], "split3": [5.0, 5.5]}, act)]
    prop = ss.rule_proposal(rows)
    big = prop["nvfp4"]["4096x12288"]
    assert big[16]["choice"] == "split3" and big[16]["worst_round_vs_shipped"] == round(9.9 / 10.2, 3)
    assert "w8_split4" not in big[16]["scores"]                            # failed bit_identical_vs_nofin
    assert big[8]["choice"] == "keep" and big[8]["scores"]["k256_split2"] < 0.98   # the mean wins, a round does not
    assert prop["mxfp4"]["4096x1024"][16]["choice"] == "split3" and prop["mxfp4"]["4096x1024"][8]["why"] == \
        "not measured"
    grid = eval(prop["SMALL_GRID"], {"SMALL_GRID_CANDIDATES": gc.SMALL_GRID_CANDIDATES})
    cand = {n: c for n, (c, _) in gc.SMALL_GRID_CANDIDATES.items()}
    assert grid == {"nvfp4": {(1, 1024, 4096): {8: cand["k256_split16"], 16: cand["k256_split16"]},
                              (12288, 12288, 4096): {16: cand["split3"]}},
                    "mxfp4": {(1, 1024, 4096): {8: cand["split8"], 16: cand["split3"]}}}
    monkeypatch.setattr(gc, "SMALL_GRID", grid)
    assert gc.config_for(16, "nvfp4", 4096, 12288) == gc.config_for(9, "nvfp4", 4096, 12288) == cand["split3"]
    assert gc.config_for(8, "nvfp4", 4096, 12288) == gc.SMALL_M                # bucket 8 not named: SMALL_M
    assert gc.config_for(16, "nvfp4", 4096, 6144) == gc.SMALL_M                # other rows: no extrapolation
    assert gc.config_for(1, "nvfp4", 4096, 1024) == cand["k256_split16"]       # the control as it was
    t = ss.issue_table(rows)
    assert t["table"]["nvfp4 4096x12288"]["M=16 w4a16"] == f"{round(22.0 / 10.1, 3)} / {round(22.0 / 9.25, 3)} " \
        "(w8_split4)"
    assert t["best_at_target"] == 6 and "mxfp4 4096x1024 M=16 w4a16" not in str(t)   # no cuBLAS there: no cell
    assert "nvfp4 4096x12288 M=16 w4a16: shipped 2.178, best 2.378 (w8_split4)" in t["shipped_below_target"]


def _sweep_env(env: dict, code: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SMALLM_")}
    full.update(env, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "benchmarks")]))
    return subprocess.run([sys.executable, "-c", f"import smallm_sweep as sw; {code}"], env=full, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_sweep_env_restricts_it():
    """SMALLM_MS / SMALLM_ROUNDS / SMALLM_VARIANTS / SMALLM_GEMLITE (the `m16` check's restriction), read at import;
    bad values stop it with what to pass."""
    p = _sweep_env({"SMALLM_MS": "1, 8,12,16", "SMALLM_ROUNDS": "3", "SMALLM_VARIANTS": "q_split3,split8",
                    "SMALLM_GEMLITE": "0"},
                   "sw.check_variants(); print(sw.MS, sw.ROUNDS, sw.GEMLITE, list(sw.all_variants('nvfp4')), "
                   "list(sw.all_variants('mxfp4')))")
    assert p.stdout.split() == ["[1,", "8,", "12,", "16]", "3", "False", "['shipped',", "'split8',", "'q_split3']",
                                "['shipped',", "'split8']"], p.stderr
    p = _sweep_env({}, "print(sw.MS, sw.ROUNDS, sw.VARIANTS, sw.GEMLITE)")
    assert p.stdout.strip() == "[1, 4, 16] 2 None True", p.stderr
    for env, msg in (({"SMALLM_MS": "1,17"}, "SMALLM_MS takes comma-separated integers in 1..16"),
                     ({"SMALLM_ROUNDS": "x"}, "SMALLM_ROUNDS takes"),
                     ({"SMALLM_VARIANTS": "q_split3,qsplit8"}, "SMALLM_VARIANTS names no candidate ['qsplit8']")):
        p = _sweep_env(env, "sw.check_variants()")
        assert p.returncode != 0 and msg in p.stderr, (env, p.stderr[-500:])


def test_summary_buckets_m12_with_m16_and_bits():
    """M = 12 and 16 both make SMALL_GRID's bucket 16 (M_BUCKETS), M = 1 and 8 bucket 8: a candidate must win at
    every M of its bucket; bits_vs_shipped per shape and variant over every point."""
    rows = []
    for act in sw.ACTS:
        rows += [_row("nvfp4", 12288, 4096, 16, {"shipped": [10.0, 10.0], "q_split6": [9.0, 9.1],
                                                 "q_split8": [9.0, 9.0], "cublas_bf16": [22.0, 22.0]}, act),
                 _row("nvfp4", 12288, 4096, 12, {"shipped": [10.0, 10.0], "q_split6": [9.5, 9.6],
                                                 "q_split8": [9.9, 9.9], "cublas_bf16": [21.0, 21.0]}, act,
                      q_split6={"bit_identical_vs_shipped": True}),
                 _row("nvfp4", 12288, 4096, 8, {"shipped": [10.0, 10.0], "q_split6": [9.5, 9.6],
                                                "q_split8": [9.0, 9.0], "cublas_bf16": [22.0, 22.0]}, act),
                 _row("nvfp4", 12288, 4096, 1, {"shipped": [10.0, 10.0], "q_split6": [9.9, 9.9],
                                                "q_split8": [9.0, 9.0], "cublas_bf16": [22.0, 22.0]}, act)]
    prop = ss.rule_proposal(rows, {"nvfp4": {}, "mxfp4": {}})
    e = prop["nvfp4"]["12288x4096"]
    assert e[16]["points"] == 4 and e[16]["choice"] == "q_split6" and e[16]["same_bits_as_shipped"] is False
    assert e[8]["points"] == 4 and e[8]["choice"] == "q_split8"              # q_split6 loses at M = 1
    assert prop["SMALL_GRID"] == ('{"nvfp4": {(4096, 4096, 12288): {8: SMALL_GRID_CANDIDATES["q_split8"][0], '
                                  '16: SMALL_GRID_CANDIDATES["q_split6"][0]}}, "mxfp4": {}}')
    assert ss.bits_vs_shipped(rows) == {"nvfp4 12288x4096": {"q_split6": "mixed", "q_split8": "differs"}}
    t = ss.issue_table(rows)["table"]["nvfp4 12288x4096"]
    assert t["M=12 w4a16"] == f"{round(21.0 / 10.0, 3)} / {round(21.0 / 9.55, 3)} (q_split6)"


def test_registered_as_named_check():
    checks = open(os.path.join(ROOT, "benchmarks", "h200_session_checks.sh")).read()
    assert "smallm) bash benchmarks/smallm_h200.sh" in checks
    wide = checks[checks.index("        smallwide)"):]
    assert "SMALLM_SHAPES=4096x12288,12288x4096,4096x6144,4096x4096,4096x1024" in wide.split(";;")[0]
    assert sw.WIDE_SHAPES in wide.split(";;")[0]
    m16 = checks[checks.index("        m16)"):].split(";;")[0]
    assert "#   m16 " in checks and "benchmarks/smallm_h200.sh" in m16
    for env in ("SMALLM_SHAPES=4096x12288,12288x4096 ", "SMALLM_MS=1,8,12,16 ", "SMALLM_GEMLITE=0 "):
        assert env in m16
    from trace_rl.kernels.fp4_gemm_gluon_config import M16_CANDIDATES, SMALL_GRID_CANDIDATES

    named = m16.split("SMALLM_VARIANTS=")[1].split()[0].split(",")
    assert set(M16_CANDIDATES) <= set(named) <= set(SMALL_GRID_CANDIDATES)
    tests = m16.split("SMALLM_TESTS='")[1].split("'")[0]
    assert all(n in tests for n in M16_CANDIDATES) and "test_fp4_gemm_gluon_m16.py" in m16


@pytest.mark.slow
def test_sh_summary(monkeypatch, tmp_path):
    """The whole .sh on CPU (~2 min on 2 cores: its GPU tests skip, its precompile and sweep fail without CUDA) over
    the fake sweep's JSON, which stays: the summary is built from it."""
    _run_sweep(monkeypatch, tmp_path / "smallm.json")
    env = dict(os.environ, PYTHON=sys.executable, GEMLITE_SRC=str(tmp_path / "absent"))
    env.pop("TRITON_INTERPRET", None)
    subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "smallm_h200.sh"), str(tmp_path)], cwd=ROOT, env=env,
                   capture_output=True, text=True, timeout=300)
    s = json.load(open(tmp_path / "summary.json"))
    assert s["bench_rc"] != 0 and "bench_error" not in s, s.get("bench_error")    # no GPU: the test's JSON stays
    assert s["rule_proposal"]["nvfp4"]["4096x200"]["8"]["choice"] == "split8" and len(s["rows"]) == 24  # str keys
    assert s["gemlite_note"] and s["pytest"]["failures"] == 0
    assert s["look_at"].startswith("pass:") and list(s)[:2] == ["config", "look_at"]
    assert s["bits_vs_shipped"]["nvfp4 4096x200"]["split8"] == "differs"
