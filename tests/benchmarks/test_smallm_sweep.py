"""benchmarks/smallm_sweep.py and smallm_h200.sh on CPU: the variants' launches (--dry), the sweep's bookkeeping with
the weights, the GEMM and the timing replaced (every point, check, ratio and the rule proposal), the proposal's
Python picking the candidate through `config_for`, and the .sh's summary over that JSON."""

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
    plan = sw.dry(132)
    for M in sw.MS:
        nv, mx = plan["nvfp4"][M], plan["mxfp4"][M]
        assert (nv["shipped"]["split"], nv["shipped"]["programs"], nv["shipped"]["columns_per_program"]) == \
            (4, 64, 1024)                         # SMALL_M's auto split at 4096x1024: the point gemlite wins
        assert (nv["split8"]["programs"], nv["split8"]["columns_per_program"]) == (128, 512)
        assert (nv["k256_split16"]["programs"], nv["w8_split8"]["programs"]) == (256, 64)
        assert nv["k256_split4"]["columns_per_program"] == 1024 and set(mx) == {"shipped", "split8", "split2",
                                                                                "w8_split8"}


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


def _run_sweep(monkeypatch, out):
    import kernel_baselines as kb

    from trace_rl.backends import get_backend
    from trace_rl.kernels.hopper_fp4 import to_hopper

    monkeypatch.setattr(sw, "DEV", "cpu")
    monkeypatch.setattr(sw, "N", 200)                # K stays 4096: the shipped split 4 (4 row tiles x 8 steps)

    def weights(fmt, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        ps = [get_backend("fp4").prepare_weight(torch.randn(sw.N, sw.K, generator=g) * 0.02, fmt) for _ in range(n)]
        return ps, [to_hopper(p.q) for p in ps]

    def inputs(fmt, M, seed):
        x = torch.randn(M, sw.K, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
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
    sw.measure(SimpleNamespace(out=str(out), budget_s=1e9))
    return json.load(open(out))


def test_sweep_bookkeeping_and_rule(monkeypatch, tmp_path):
    r = _run_sweep(monkeypatch, tmp_path / "smallm.json")
    assert len(r["rows"]) == len(sw.FMTS) * len(sw.MS) * len(sw.ACTS) and not r["errors"] and not r["skipped"]
    assert r["gemlite"] == {"unavailable": "gemlite not importable: test"}
    for row in r["rows"]:
        vs = row["variants"]
        assert all(v["ok"] for v in vs.values()), row
        assert vs["shipped"]["bit_identical_vs_shipped"] and not vs["split8"]["bit_identical_vs_shipped"]
        assert vs["shipped"]["split"] == 4 and vs["split8"]["split"] == 8
        if row["fmt"] == "nvfp4":
            assert vs["k256_split4"]["bit_identical_vs_shipped"]           # the shipped K partition
        assert all(v.get("bit_identical_vs_nofin", row["act"] == "prequant") for v in vs.values())
        assert ("bit_identical_vs_nofin" in vs["shipped"]) == (row["act"] == "w4a16")
        assert row["best"] == "split8" and row["best_vs_shipped"] == round(5.6 / 5.0, 3)
        assert row["best_wins_every_round"]
        assert len(row["rounds_us"]["shipped"]) == sw.ROUNDS
        assert ("cublas_bf16" in row["us"]) == (row["act"] == "w4a16")
        assert row.get("gemlite_int4", "").startswith("gemlite unavailable") == (row["act"] == "w4a16")
    s = sw.summarize(r)
    prop = s["rule_proposal"]
    for fmt in sw.FMTS:
        for tile in sw.TILE_MS:
            e = prop[fmt][tile]
            assert e["choice"] == "split8" and e["time_vs_shipped"] == round(5.0 / 5.6, 3), e
            assert e["same_bits_as_shipped"] is False
    from trace_rl.kernels import fp4_gemm_gluon_config as gc

    grid = eval(prop["SMALL_GRID"], {"SMALL_GRID_CANDIDATES": gc.SMALL_GRID_CANDIDATES})   # the Python to paste
    monkeypatch.setattr(gc, "SMALL_GRID", grid)
    for fmt in sw.FMTS:
        for M in sw.MS:
            assert gc.config_for(M, fmt, 4096, 1024) == gc.SMALL_GRID_CANDIDATES["split8"][0]
    assert not s["checks_failed"] and len(s["rows"]) == 12 and s["vs_gemlite"] == {}
    # nothing wins by the margin: keep
    for row in r["rows"]:
        for n in row["variants"]:
            row["us"][n] = row["us"]["shipped"] * (0.99 if n != "shipped" else 1)
    assert sw.rule_proposal(r["rows"])["nvfp4"][8]["choice"] == "keep"
    assert sw.rule_proposal(r["rows"])["SMALL_GRID"] == '{"nvfp4": {}, "mxfp4": {}}'


def test_registered_as_named_check():
    checks = open(os.path.join(ROOT, "benchmarks", "h200_session_checks.sh")).read()
    assert "smallm) bash benchmarks/smallm_h200.sh" in checks


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
    assert s["rule_proposal"]["nvfp4"]["8"]["choice"] == "split8" and len(s["rows"]) == 12   # JSON: str keys
    assert s["gemlite_note"] and s["pytest"]["failures"] == 0
