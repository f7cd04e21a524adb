"""benchmarks/gemm_compute.py and gemm_compute_kernels.py on CPU: the variants' launch plans (the shipped one as
fp4_matmul_gluon computes it), the 64-row x 512-column nvfp4 step's data path (descriptors' boxes, ring views,
decode) emulated in torch against the reference, the benchmark's bookkeeping with the launches and the timing
replaced (every row, check and summary field; the .sh's summary), and, with Triton 3.6, every kernel's sm_90
compile (no spills, register-A HGMMA, no full wgmma wait in an overlapped loop)."""

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
    import gemm_compute as gcb  # noqa: E402
    import gemm_compute_kernels as gc  # noqa: E402
except Exception:   # noqa: BLE001 -- a Triton without Gluon
    gluon_ok = False
pytestmark = pytest.mark.skipif(not gluon_ok, reason="needs triton.experimental.gluon")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_plans():
    from trace_rl.kernels.fp4_gemm_gluon import auto_split, step_k

    for fmt in gcb.FMTS:
        for K, N in gcb.SHAPES:
            for M in gcb.MS:
                for v in [v for v in (gc.SHIPPED, ) + gc.VARIANTS if fmt in v.fmts]:
                    p = gc.plan(M, N, K, fmt, v)
                    c = p["config"]
                    assert p["programs"] <= 132 * p["ctas_per_sm"], (v.name, fmt, K, N, M)   # one wave
                    if v is gc.SHIPPED:          # fp4_matmul_gluon's own arithmetic
                        bm = c.tile_m(M)
                        assert p["bk"] == step_k(fmt) and p["ctas_per_sm"] == c.ctas_per_sm(bm, fmt)
                        kb = K // step_k(fmt)
                        assert p["grid"][1] == auto_split(N // c.block_n, kb, 132 * c.ctas_per_sm(bm, fmt))
    p = gc.plan(16, 12288, 4096, "nvfp4", gc.VARIANTS[2])
    assert p["ctas_per_sm"] == 3 and p["grid"] == (192, 2, 1) and p["busiest_sm_elements"] < \
        gc.plan(16, 12288, 4096, "nvfp4", gc.SHIPPED)["busiest_sm_elements"]


@pytest.mark.parametrize("fmt,M,N,K,BN,bk", [("nvfp4", 5, 200, 1024, 64, 512), ("nvfp4", 16, 136, 1536, 64, 512),
                                             ("mxfp4", 3, 200, 1024, 64, 512), ("nvfp4", 9, 136, 1536, 128, 512)])
def test_emulated_k512_data_path(fmt, M, N, K, BN, bk):
    """As test_fp4_gemm_gluon's emulation, with the variant's box sizes: words [bk/128, BN/16, 256] at chunk
    bk/128 x kb, scale words [BN, bk/64 (nvfp4) or bk/128] at word kb x that, the ring's [.., KC(, 2)] views."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "kernels"))
    from test_fp4_gemm_gluon import _bf16, _box, _rotr, _weight

    from trace_rl.kernels.hopper_fp4 import operand, to_hopper

    gen = torch.Generator().manual_seed(3)
    packed = _weight(N, K, fmt, gen)
    h = to_hopper(packed.q)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    np_, kp = h.padded
    assert kp % bk == 0
    mx = fmt == "mxfp4"
    kc_n, sw_n = bk // 128, gc.scale_words(fmt, bk)
    v3 = h.values.view(np_ // 16, kp // 128, 256).permute(1, 0, 2)
    sc = h.scales.view(torch.int32)
    out = torch.zeros(M, N, dtype=torch.float64)
    BM = 16
    for pid_n, pid_m in [(n, m) for m in range(-(-M // BM)) for n in range(-(-np_ // BN))]:
        acc = torch.zeros(BN, BM, dtype=torch.float64)
        for kb in range(kp // bk):
            w_s = _box(v3, [kc_n * kb, pid_n * BN // 16, 0], [kc_n, BN // 16, 256])
            w_s = w_s.reshape(kc_n, BN // 16, 2, 8, 4, 2, 2)
            s_s = _box(sc, [pid_n * BN, sw_n * kb], [BN, sw_n])
            s_s = s_s.reshape(BN // 16, 2, 8, kc_n) if mx else s_s.reshape(BN // 16, 2, 8, kc_n, 2)
            x_s = _box(x, [pid_m * BM, bk * kb], [BM, bk])
            for kc in range(kc_n):
                w = w_s[kc]
                sw = s_s[:, :, :, kc:kc + 1].to(torch.int64) & 0xFFFFFFFF
                byte = [((sw >> (8 * b)) & 0xFF) * 0x10001 for b in range(4)]
                if mx:
                    p = [b << 7 for b in byte]
                    se = torch.stack([torch.stack([p[0], p[2]], -1), torch.stack([p[1], p[3]], -1)], -1)
                    so = se = se.expand(*w.shape)
                else:
                    p = [0x70007000 + 16 * b for b in byte]
                    se = torch.stack([p[0], p[2]], -1).expand(*w.shape)
                    so = torch.stack([p[1], p[3]], -1).expand(*w.shape)
                m = 0x81C081C0
                slots = [(w.to(torch.int64) & 0xFFFFFFFF) & m, _rotr(w, 4) & m, _rotr(w, 10) & m,
                         (_rotr(w, 6) & 0x81808180) | (_rotr(w, 14) & 0x00400040)]
                halves = [[(_bf16(bits >> (16 * e) & 0xFFFF) * _bf16(s >> (16 * e) & 0xFFFF)).float()
                           .to(torch.bfloat16).double() for e in range(2)] for bits, s in zip(slots, (se, se, so, so))]
                a, b, c, d = halves
                r0 = torch.stack([torch.stack(a, -1), torch.stack(b, -1)], -1)
                r1 = torch.stack([torch.stack(c, -1), torch.stack(d, -1)], -1)
                v = torch.stack([r0, r1], -1).permute(0, 1, 2, 4, 5, 8, 7, 3, 6).reshape(BN, 128)
                acc += v @ x_s[:, 128 * kc:128 * (kc + 1)].double().T
        rows = torch.arange(pid_n * BN, min((pid_n + 1) * BN, N))
        toks = torch.arange(pid_m * BM, min((pid_m + 1) * BM, M))
        part = acc[rows - pid_n * BN] * h.row_factor[rows, None].double()
        out[toks[:, None], rows[None, :]] = part[:, toks - pid_m * BM].T
    ref = x.double() @ (operand(h).double() * h.row_factor[:N, None].double()).T
    assert torch.allclose(out, ref, rtol=1e-9, atol=1e-9 * ref.abs().max().item())


def test_measure_bookkeeping(tmp_path, monkeypatch):
    """measure() on CPU at a tiny shape, the launches replaced by the reference (the shipped one and one variant
    exact, one off by a rounding, one wrong: not timed, an error), graph timing by a count; then the .sh's
    summary over that JSON."""
    import kernel_baselines

    from trace_rl.kernels import fp4_gemm_gluon
    from trace_rl.kernels.hopper_fp4 import dequantize

    monkeypatch.setattr(gcb, "DEV", "cpu")
    monkeypatch.setattr(gcb, "SHAPES", [(512, 256)])
    monkeypatch.setattr(gcb, "MS", (1, 16))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "cpu-test")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    calls = []
    monkeypatch.setattr(kernel_baselines, "graph_us", lambda fns: (calls.append(len(fns)), [f() for f in fns],
                                                                   10.0 + len(calls))[-1])
    kern = SimpleNamespace(n_regs=80, n_spills=0, metadata=SimpleNamespace(shared=1024))

    def ref(x, w):
        return (x.float() @ dequantize(w).T).to(torch.bfloat16)

    def fake_full(x, w, v, out):
        y = ref(x, w)
        if v.name == "w8_overlap":
            y = y * (1 + 2 ** -8)
        if v.name == "n64_k512" and w.fmt == "mxfp4":
            y = -y
        out.copy_(y)
        return kern, None

    monkeypatch.setattr(gc, "full", fake_full)
    monkeypatch.setattr(gc, "compute_only", lambda x, w, v, out, k_steps=None: (kern, None))
    monkeypatch.setattr(fp4_gemm_gluon, "fp4_matmul_gluon", lambda x, w, *config: ref(x, w))
    out = str(tmp_path / "gemm_compute.json")
    gcb.measure(SimpleNamespace(out=out, budget_s=60.0, no_precompile=True))
    r = json.load(open(out))
    assert len(r["rows"]) == 4 and not r["skipped"]
    for row in r["rows"]:
        assert row["cublas_bf16_us"] > 0
        s = row["shipped"]
        assert s["bit_equal_fp4_matmul_gluon"] and s["rel_ref"] < 1e-2 and s["full_us"] > 0 and s["compute_only_us"]
        assert row["overlap"]["bit_equal_shipped"] and row["overlap"]["full_speedup"] > 0
        assert not row["w8_overlap"]["bit_equal_shipped"] and 0 < row["w8_overlap"]["rel_shipped"] < 1e-2
        bad = row["n64_k512"]
        assert (bad["ok"], "full_us" in bad) == ((False, False) if row["fmt"] == "mxfp4" else (True, True))
        assert bad["compute_only_us"] > 0 and bad["no_k_steps_us"] > 0 and bad["plan"]["ctas_per_sm"] == 3
        assert ("imad_overlap" in row) == (row["fmt"] == "nvfp4")
    assert len(r["errors"]) == 2 and all("not timed" in e for e in r["errors"])
    # the .sh: the benchmark fails at once without a GPU (its JSON stays), the summary reads it
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("TRITON_INTERPRET", None)
    subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gemm_compute_h200.sh"), str(tmp_path)], cwd=ROOT,
                   env=env, capture_output=True, text=True, timeout=120)
    s = json.load(open(tmp_path / "summary.json"))
    assert s["bench_rc"] != 0 and len(s["rows"]) == 4 and "summary_error" not in s
    assert s["rows"][0]["shipped"]["full_us"] > 0 and s["rows"][0]["n64_k512"]["per_sm"] == 3
    assert s["rows"][0]["shipped"]["no_k_us"] > 0


def _sleepy_job(job):
    import time

    if job[0] == "hangs":
        time.sleep(120)
    return "" if job[0] != "fails" else f"{job}: boom"


def test_precompile_hung_job_is_killed():
    """A job that never finishes (a kernel that hangs) is reported by (variant, fmt) and its worker killed within
    the timeout; failures are errors; the rest completes."""
    import time

    jobs = [("ok", "nvfp4", 1, "full"), ("fails", "mxfp4", 1, "full"), ("hangs", "nvfp4", 16, "compute")]
    t0 = time.time()
    errors, hung = gcb.precompile(workers=3, timeout_s=10.0, jobs=jobs, job_fn=_sleepy_job, ctx="fork")
    assert time.time() - t0 < 60
    assert hung == [("hangs", "nvfp4")] and len(errors) == 1 and "boom" in errors[0]


@pytest.mark.skipif(not __import__("triton").__version__.startswith("3.6"), reason="Gluon is Triton 3.6 here")
def test_compile_sm90(tmp_path):
    """Every kernel the benchmark launches compiles for sm_90: no spills, register-A HGMMA, TMA / mbarrier /
    setmaxnreg present; overlapped loops have no full wgmma wait."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    out = tmp_path / "dry.json"
    rc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gemm_compute.py"), "--dry", "--out",
                         str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300).returncode
    r = json.load(open(out))
    assert rc == 0 and not r["errors"] and len(r["compile"]) == len(gc.all_cases())
    for c in r["compile"]:
        assert not c["violations"] and c["spills"] == 0, c
        assert c["full_waits_in_loop"] == (0 if "overlap" in c["case"] else c["hgmma"] // 16), c
