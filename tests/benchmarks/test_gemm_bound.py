"""benchmarks/gemm_bound.py's probe kernels (benchmarks/gemm_bound_kernels.py) through Triton's CPU interpreter at
tiny shapes (load-only reduces to the XOR of what the shipped loop loads; full is the shipped kernel; compute-only
runs; the stream kernel XORs every word once), the probes' sm_90 compile (the full mode's K loop is the shipped
kernel's, instruction for instruction; with Triton 3.6 also the Gluon load- and compute-only probes), the plan's
grid / occupancy arithmetic and the verdicts."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")

import gemm_bound as gb  # noqa: E402
import gemm_bound_kernels as gk  # noqa: E402

from trace_rl.backends import PackedWeight  # noqa: E402
from trace_rl.kernels import quantize  # noqa: E402
from trace_rl.kernels.fp4_decode import DECODE_PURE  # noqa: E402
from trace_rl.kernels.fp4_gemm import GemmConfig, fp4_matmul  # noqa: E402
from trace_rl.kernels.linear import hopper_weight  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
interp = pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
                            reason="interpreter test (CPU)")
CFG = GemmConfig(16, 64, 256, split_k=2, num_warps=4, num_stages=2, decode=DECODE_PURE)   # 2 n tiles x 2 splits


def _xor(t: torch.Tensor) -> int:
    return functools.reduce(lambda a, b: a ^ b, t.flatten().tolist(), 0)


def _setup(fmt: str, M: int = 3, N: int = 128, K: int = 512):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(N, K, generator=g).to(torch.bfloat16) * 0.02
    h = hopper_weight(PackedWeight(fmt, N, K, q=quantize(w, fmt)))
    return h, torch.randn(M, K, generator=g).to(torch.bfloat16)


@interp
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_load_only_xors_every_loaded_word(fmt):
    h, x = _setup(fmt)
    sink = torch.full((8,), -1, dtype=torch.int32)
    out = torch.empty(x.shape[0], h.n, dtype=torch.bfloat16)
    gk.probe_matmul(x, h, gk.LOAD_ONLY, CFG, out, sink)
    sw = h.scales.view(torch.int32)
    n_words, s_words = 2 * CFG.block_k, sw.shape[1] // 2            # per K step: layout words, scale words
    xbits = torch.zeros(16, x.shape[1], dtype=torch.int16)
    xbits[: x.shape[0]] = x.view(torch.int16)
    for pid_k in range(2):
        for pid_n in range(2):
            v = h.values[pid_n * 4:(pid_n + 1) * 4, pid_k * n_words:(pid_k + 1) * n_words]
            s = sw[pid_n * 64:(pid_n + 1) * 64, pid_k * s_words:(pid_k + 1) * s_words]
            xb = xbits[:, pid_k * CFG.block_k:(pid_k + 1) * CFG.block_k]
            want = _xor(v) ^ _xor(s) ^ _xor(xb.to(torch.int32))          # int16 sign-extended, as the kernel
            assert sink[pid_k * 2 + pid_n].item() == want, (pid_n, pid_k)
    assert (sink[4:] == -1).all()


@interp
def test_full_is_the_shipped_kernel_and_compute_only_runs():
    h, x = _setup("nvfp4")
    ref = fp4_matmul(x, h, config=CFG)
    out = torch.empty_like(ref)
    gk.probe_matmul(x, h, gk.FULL, CFG, out)
    assert torch.equal(out, ref)
    comp = torch.full_like(ref, float("nan"))
    gk.probe_matmul(x, h, gk.COMPUTE_ONLY, CFG, comp)
    assert torch.isfinite(comp.float()).all() and not torch.equal(comp, ref)


@interp
def test_padded_block_stride_is_the_same_product():
    """The padded-stride variant: the layout's rows in longer storage rows (a strided view) give the same bits."""
    from dataclasses import replace

    h, x = _setup("nvfp4")
    padded = replace(h, values=gb.padded_rows(h.values, gb.PAD_WORDS))
    assert padded.values.stride(0) == h.values.shape[1] + gb.PAD_WORDS and torch.equal(padded.values, h.values)
    assert torch.equal(fp4_matmul(x, padded, config=CFG), fp4_matmul(x, h, config=CFG))


@interp
def test_stream_words_xors_each_word_once():
    g = torch.Generator().manual_seed(2)
    a = torch.randint(-2**31, 2**31 - 1, (5000,), generator=g, dtype=torch.int32)
    b = torch.randint(-2**31, 2**31 - 1, (700,), generator=g, dtype=torch.int32)
    sink = torch.zeros(3, dtype=torch.int32)
    gk.stream_words(a, b, sink, 3, block=256, stages=2)
    assert _xor(sink) == _xor(a) ^ _xor(b)


def test_plan_and_occupancy():
    rows = {(r["K"], r["N"], r["M"], r["fmt"]): r for r in gb.plan([1, 16], ["nvfp4"])}
    up, down = rows[(4096, 12288, 1, "nvfp4")], rows[(12288, 4096, 16, "nvfp4")]
    assert (up["programs"], up["k_steps_per_program"], up["weight_bytes"]) == (384, 8, 12288 * 4096 * 9 // 16)
    assert (down["programs"], down["k_steps_per_program"]) == (256, 12)
    assert gb.occupancy(124, 66 * 1024, 4) == {"ctas_per_sm": 3, "limited_by": "shared"}
    assert gb.occupancy(176, 16 * 1024, 4) == {"ctas_per_sm": 2, "limited_by": "registers"}   # 176 x 128 x 3 > 64 K


_COMPILE = """
import json, sys
sys.path.insert(0, "benchmarks")
import gemm_bound_kernels as gk
from trace_rl.kernels import sass_gate
from trace_rl.kernels.fp4_gemm import SMALL_M, gemm_gate_case
res = {}
for fmt in ("nvfp4", "mxfp4"):
    ship = sass_gate.main_loop(sass_gate.compile_sass(gemm_gate_case(SMALL_M, fmt))[0])
    for mode in (0, 1, 2):
        case = gk.probe_gate_case(SMALL_M, fmt, mode)
        r = sass_gate.inspect(case, *sass_gate.compile_sass(case))
        loop = sass_gate.main_loop(sass_gate.compile_sass(case)[0])
        res[f"{fmt} {mode}"] = dict(same=loop == ship, violations=r.violations, ops=r.opcodes)
import triton
if triton.__version__.startswith("3.6"):    # the Gluon probe (Gluon's API is pinned to 3.6)
    import gemm_bound_gluon as gbg
    from trace_rl.kernels.fp4_gemm_gluon import GluonConfig
    for fmt, c in (("nvfp4", GluonConfig()), ("mxfp4", GluonConfig(stages=2))):
        for mode in ("load_only", "compute_only"):
            case = gbg.gate_case(c, 16, fmt, mode)
            res[f"gluon {mode} {fmt}"] = sass_gate.inspect(case, *sass_gate.compile_sass(case)).violations
print(json.dumps(res))
"""


def test_probe_compiles_for_sm90_and_full_mode_is_the_shipped_loop():
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool) and not os.environ.get("TRACE_RL_GATE_TRITON"):
        pytest.skip("this Triton wheel carries no cuobjdump")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("TRACE_RL_GATE_TRITON", ""), ROOT) if p)
    proc = subprocess.run([sys.executable, "-c", _COMPILE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    for fmt in ("nvfp4", "mxfp4"):
        assert res[f"{fmt} 0"]["same"], fmt                               # the mirror is the shipped K loop
        load, comp = res[f"{fmt} 1"]["ops"], res[f"{fmt} 2"]["ops"]
        assert any(op.startswith("LDGSTS") for op in load), load           # pipelined like the shipped loads
        assert not any(op.startswith("HGMMA") for op in load)
        loads = lambda ops: sum(c for op, c in ops.items() if op.startswith("LDG"))   # noqa: E731
        assert any(op.startswith("HGMMA") for op in comp)
        assert loads(comp) < loads(res[f"{fmt} 0"]["ops"])               # only the activation tile's loads left
        assert not res[f"{fmt} 2"]["violations"], res[f"{fmt} 2"]
        for mode in ("load_only", "compute_only"):   # TMA, mbarriers, setmaxnreg; compute-only: register-A HGMMA
            assert not res.get(f"gluon {mode} {fmt}"), res[f"gluon {mode} {fmt}"]


def test_verdicts_name_the_slow_part():
    fl = {"floor_us": 7.0, "stream_grid384": {"us": 7.5}}
    row = lambda full, load, comp: {"K": 4096, "N": 12288, "M": 1, "fmt": "nvfp4", "shipped": {"us": full},  # noqa: E731
                                    "load_only": {"us": load}, "compute_only": {"us": comp}}
    assert "memory stream itself is slow" in gb.verdict(row(17, 15, 6), fl)
    assert "the loads are the whole cost" in gb.verdict(row(17, 15, 6), fl)
    assert "decode + MMA issue/latency bound" in gb.verdict(row(17, 8, 15), fl)
    assert "the overlap is the problem" in gb.verdict(row(17, 8, 9), fl)
    assert "grid's pattern alone" in gb.verdict(row(17, 12, 9), {"floor_us": 7.0, "stream_grid384": {"us": 11.0}})
    r = row(17, 8, 9) | {"gluon_load_only": {"us": 14.0}, "gluon_ws": {"us": 16.0}}
    assert "Gluon: load-only 14.0 us (2.00x floor) vs full 16.0" in gb.verdict(r, fl)
    assert "DRAM address aliasing" in gb.verdict(row(17, 8, 9) | {"shipped_padded_stride": {"us": 12.0}}, fl)
    assert "aliasing" not in gb.verdict(row(17, 8, 9) | {"shipped_padded_stride": {"us": 16.8}}, fl)
