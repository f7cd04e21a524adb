"""benchmarks/gemm_fixed.py and gemm_fixed_kernels.py on CPU: the variants' plans, the fixed-cost decomposition,
the SASS facts outside the K loop (on a synthetic listing), the benchmark's bookkeeping with the launches and the
timing replaced (every row, check and summary field; the .sh's summary), and, with Triton 3.6, every kernel's sm_90
compile (n64_fin: one GPU fence and no reduction loop after the K loop, against n64_k512's two and two)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")
gluon_ok = True
try:
    import gemm_compute_kernels as gc  # noqa: E402
    import gemm_fixed as gfb  # noqa: E402
    import gemm_fixed_kernels as gf  # noqa: E402
except Exception:   # noqa: BLE001 -- a Triton without Gluon
    gluon_ok = False
pytestmark = pytest.mark.skipif(not gluon_ok, reason="needs triton.experimental.gluon")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_plans():
    for fmt in gfb.FMTS:
        for K, N in gfb.SHAPES:
            for M in gfb.MS:
                base = gc.plan(M, N, K, fmt, gf.BASE)
                fin = gc.plan(M, N, K, fmt, gf.FIN)
                ns = gc.plan(M, N, K, fmt, gf.NOSPLIT)
                assert fin["grid"] == base["grid"] and fin["config"] == base["config"]   # the same launch
                assert ns["grid"] == (base["grid"][0], 1, 1) and ns["steps_per_program"] == base["kb"]
                assert ns["programs"] <= 132 * ns["ctas_per_sm"]
    assert gc.plan(1, 4096, 12288, "nvfp4", gf.FIN)["grid"] == (64, 6, 1)


def test_decompose():
    row = {"empty_us": {"(192, 2, 1)": 2.0, "(192, 1, 1)": 1.9}, "cublas_tiny_k_us": 4.0,
           "n64_k512": {"plan": {"grid": [192, 2, 1]}, "no_k_steps_us": 5.0},
           "n64_fin": {"plan": {"grid": [192, 2, 1]}, "no_k_steps_us": 4.0},
           "n64_nosplit": {"plan": {"grid": [192, 1, 1]}, "no_k_steps_us": 3.0}}
    assert gfb.decompose(row) == {"launch_floor": 2.0, "setup_and_store": 1.1, "split_k_epilogue": 2.0,
                                  "fin_saves": 1.0, "cublas_fixed": 4.0}
    del row["n64_nosplit"]
    assert set(gfb.decompose(row)) == {"launch_floor", "fin_saves", "cublas_fixed"}


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HGMMA.64x16x16.F32.BF16 R24, R0, gdesc[UR4], R24 ;
        /*0020*/               @P0 BRA 0x10 ;
        /*0030*/                   STG.E desc[UR14][R10.64], R24 ;
        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0, 0x80 ;
        /*0050*/               @P0 MEMBAR.ALL.GPU ;
        /*0060*/               @P0 ATOMG.E.ADD.STRONG.GPU PT, R10, desc[UR14][R8.64], R3 ;
        /*0070*/                   LDG.E.STRONG.GPU R28, desc[UR14][R20.64] ;
        /*0080*/                   FADD R8, R8, R28 ;
        /*0090*/               @!P2 BRA 0x70 ;
        /*00a0*/                   STG.E.U16 desc[UR14][R8.64], R24 ;
        /*00b0*/                   EXIT ;
        /*00c0*/                   BRA 0xc0 ;
"""


def test_epilogue_facts():
    e = gfb.epilogue_facts(SASS)
    assert e["instructions_total"] == 12 and e["instructions_loop"] == 2 and e["instructions_outside_loop"] == 10
    assert (e["membar_gpu"], e["atomics"], e["ldg"], e["stg"], e["bar_sync"], e["load_loops"]) == (1, 1, 1, 2, 1, 1)
    assert (e["gdc_wait"], e["gdc_launch"], e["tma_before_gdc_wait"]) == (0, 0, 0)


def test_measure_bookkeeping(tmp_path, monkeypatch):
    """measure() on CPU at a tiny shape, the launches replaced by the reference (n64_fin equal to n64_k512 except
    mxfp4's, which is wrong: not timed, errors), graph timing by a count; then the .sh's summary over that JSON."""
    import kernel_baselines

    from trace_rl.kernels.hopper_fp4 import dequantize

    monkeypatch.setattr(gfb, "DEV", "cpu")
    monkeypatch.setattr(gfb, "SHAPES", [(512, 256)])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "cpu-test")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(kernel_baselines, "weight_copies", lambda nbytes: 3)
    calls = []
    monkeypatch.setattr(kernel_baselines, "graph_us", lambda fns: (calls.append(len(fns)), [f() for f in fns],
                                                                   10.0 + len(calls))[-1])
    kern = SimpleNamespace(n_regs=80, n_spills=0, metadata=SimpleNamespace(shared=1024))
    launched = []

    def fake_full(x, w, v, out):
        y = (x.float() @ dequantize(w).T).to(torch.bfloat16)
        if v.name in ("n64_nosplit", "n64_nosplit_pdl"):
            y = y * (1 + 2 ** -8)
        if v.name == "n64_fin" and w.fmt == "mxfp4":
            y = -y
        out.copy_(y)
        return kern, None

    monkeypatch.setattr(gf, "full", fake_full)
    monkeypatch.setattr(gf, "compute_only", lambda x, w, v, out, k_steps=None: (kern, None))
    monkeypatch.setattr(gf, "empty", lambda grid, scratch, pdl=False: launched.append((tuple(grid), pdl)))
    out = str(tmp_path / "gemm_fixed.json")
    gfb.measure(SimpleNamespace(out=out, budget_s=60.0, no_precompile=True))
    r = json.load(open(out))
    assert len(r["rows"]) == 4 and not r["skipped"]
    # 256 rows: shipped's 128-row tiles, n64's 64-row (split 1); PDL's floor at n64's grid
    assert set(launched) == {((4, 1, 1), False), ((2, 1, 1), False), ((4, 1, 1), True)}
    for row in r["rows"]:
        assert row["cublas_bf16_us"] > 0 and row["cublas_tiny_k_us"] > 0 and len(row["empty_us"]) == 2
        assert row["empty_pdl_us"] > 0
        keys = {"launch_floor", "setup_and_store", "split_k_epilogue", "fin_saves", "cublas_fixed",
                "pdl_saves_no_k", "launch_floor_pdl", "nosplit_pdl_no_k"}
        assert set(row["split"]) == keys | ({"fin_saves_full", "pdl_saves_full"} if row["fmt"] == "nvfp4" else set())
        for name in ("shipped", "n64_k512", "n64_nosplit", "n64_fin_pdl", "n64_nosplit_pdl"):
            v = row[name]
            assert v["ok"] and v["full_us"] > 0 and v["no_k_steps_us"] > 0 and v["compute_only_us"] > 0, name
        assert row["n64_nosplit"]["bit_equal_n64_k512"] is False and "bit_equal_n64_k512" not in row["shipped"]
        fin = row["n64_fin"]
        assert (fin["ok"], fin["bit_equal_n64_k512"], "full_us" in fin) == \
            ((False, False, False) if row["fmt"] == "mxfp4" else (True, True, True))
    assert len(r["errors"]) == 4 and sum("not timed" in e for e in r["errors"]) == 2
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("TRITON_INTERPRET", None)
    subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gemm_fixed_h200.sh"), str(tmp_path)], cwd=ROOT,
                   env=env, capture_output=True, text=True, timeout=120)
    s = json.load(open(tmp_path / "summary.json"))
    assert s["bench_rc"] != 0 and len(s["rows"]) == 4 and "summary_error" not in s
    row = s["rows"][0]
    assert row["n64_k512"]["full_us"] > 0 and row["n64_fin"]["bit_equal_n64_k512"] and row["split"]
    assert row["shipped"]["no_k_us"] > 0 and row["n64_nosplit"]["grid"] == [4, 1, 1]
    assert row["n64_fin_pdl"]["bit_equal_n64_k512"] and "pdl_saves_full" in row["split"]


@pytest.mark.skipif(not __import__("triton").__version__.startswith("3.6"), reason="Gluon is Triton 3.6 here")
def test_compile_sm90(tmp_path):
    """Every kernel compiles for sm_90 without spills; n64_fin's (and n64_fin_pdl's) epilogue has one
    MEMBAR.ALL.GPU and no loop around its partial loads, n64_k512's two and two; n64_fin_pdl's producer requests
    weight boxes before griddepcontrol.wait (ACQBULK) and the kernel launches dependents (PREEXIT); the empty
    kernel compiles with and without PDL."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    out = tmp_path / "dry.json"
    rc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gemm_fixed.py"), "--dry", "--out",
                         str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300).returncode
    r = json.load(open(out))
    assert rc == 0 and not r["errors"]
    kernels = [c for c in r["compile"] if "variant" in c]
    assert len(kernels) == 8 + 16 + 16 + 8
    empties = {c["case"]: c for c in r["compile"] if "empty" in c["case"]}
    assert empties["gemmfix empty"]["griddepcontrol"] == [] and \
        empties["gemmfix empty pdl"]["griddepcontrol"] == ["PREEXIT", "ACQBULK"]
    for c in kernels:
        assert not c["violations"] and c["spills"] == 0 and c["registers"] <= 80, c
        pdl = c["variant"] in ("n64_fin_pdl", "n64_nosplit_pdl")
        assert (c["gdc_wait"] > 0, c["gdc_launch"] > 0) == (pdl, pdl), c
        if pdl:        # the full kernel's producer: weight words + scales of the first slot(s) before the wait
            assert c["tma_before_gdc_wait"] >= (2 if c["mode"] == "full" else 0), c
        fin = c["variant"] in ("n64_fin", "n64_fin_pdl")
        nosplit = c["variant"] == "n64_nosplit_pdl"       # direct store: no fence, no atomic, no partial loads
        assert (c["membar_gpu"], c["load_loops"]) == ((0, 0) if nosplit else (1, 0) if fin else (2, 2)), c
        if nosplit:
            assert c["atomics"] == 0 and c["ldg"] == 2, c
