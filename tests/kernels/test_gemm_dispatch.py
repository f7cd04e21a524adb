"""The small-M GEMM dispatch rule (trace_rl/kernels/gemm_dispatch.py) on CPU: which GEMM `fp4_linear` takes for each
input of the rule, the module switch, the once-per-process log, and that a CPU linear never asks for the Gluon GEMM."""

import logging

import torch

from trace_rl.kernels import gemm_dispatch as gd
from trace_rl.kernels.gemm_dispatch import small_m_path


def test_rule_takes_gluon_only_for_small_m_on_sm90_with_gluon():
    assert small_m_path(1, "nvfp4", 4096, (9, 0), True, False)[0] == "gluon"
    assert small_m_path(16, "mxfp4", 12288, (9, 0), True, False)[0] == "gluon"
    cases = [((17, "nvfp4", 4096, (9, 0), True, False), "M > 16"),
             ((16, "nvfp4", 4096, (10, 0), True, False), "not an sm_90"),
             ((16, "nvfp4", 4096, (8, 0), True, False), "not an sm_90"),
             ((16, "nvfp4", 4096, None, True, False), "not an sm_90"),
             ((16, "nvfp4", 4096, (9, 0), False, False), "Gluon is not importable"),
             ((16, "nvfp4", 4096, (9, 0), True, True), "explicit Triton GemmConfig"),
             ((16, "nvfp4", 1280, (9, 0), True, False), "not a multiple"),     # 1280 = 2.5 x 512-column steps
             ((4, "mxfp4", 768, (9, 0), True, False), "not a multiple"),
             ((4, "fp8", 4096, (9, 0), True, False), "format"),
             ((0, "nvfp4", 4096, (9, 0), True, False), "no rows")]
    for args, why in cases:
        path, reason = small_m_path(*args)
        assert path == "triton" and why in reason, (args, reason)
    assert small_m_path(1, "nvfp4", 4096, (9, 0), True, False, enabled=False) == ("triton", "GLUON_SMALL_M is off")


def test_k_step_is_the_shipped_configs():
    from trace_rl.kernels.fp4_gemm_gluon_config import SMALL_M, small_m_fits

    assert SMALL_M.block_k == 512 and SMALL_M.fin
    assert gd.GLUON_MAX_M == max(t for t in (8, 16) if SMALL_M.tile_m(t) == t)
    assert small_m_fits(4096, "nvfp4") and not small_m_fits(1280, "nvfp4") and not small_m_fits(768, "mxfp4")


def test_dense_path_logs_once_and_cpu_takes_triton(monkeypatch, caplog):
    monkeypatch.setattr(gd, "_LOGGED", set())
    with caplog.at_level(logging.INFO, logger="trace_rl.kernels"):
        for _ in range(3):
            assert gd.dense_path(4, torch.device("cpu"), "nvfp4", 4096, False) == "triton"
        assert gd.dense_path(64, torch.device("cpu"), "nvfp4", 4096, False) == "triton"   # M > 16: not logged
    lines = [r.getMessage() for r in caplog.records if "small-M FP4 linears" in r.getMessage()]
    assert len(lines) == 1 and "Triton fp4_matmul" in lines[0] and "not an sm_90" in lines[0]


def test_switch_off_is_logged(monkeypatch, caplog):
    monkeypatch.setattr(gd, "_LOGGED", set())
    monkeypatch.setattr(gd, "GLUON_SMALL_M", False)
    with caplog.at_level(logging.INFO, logger="trace_rl.kernels"):
        assert gd.dense_path(1, torch.device("cpu"), "mxfp4", 4096, False) == "triton"
    assert any("GLUON_SMALL_M is off" in r.getMessage() for r in caplog.records)


def test_backend_records_the_gemm_it_takes(monkeypatch, gen):
    """On CPU tensors with the kernels forced (the interpreter), a small-M W4A16 linear is recorded as fp4.triton
    (the rule's answer off sm_90); with the rule answering "gluon" the record follows it."""
    from trace_rl.backends import PackedWeight
    from trace_rl.backends import fp4 as fp4_backend
    from trace_rl.formats import get_format
    from trace_rl.kernels import linear

    w = torch.randn(24, 64, generator=gen)
    p = PackedWeight("nvfp4", 24, 64, q=get_format("nvfp4").quantize(w))
    backend = fp4_backend.FP4Backend()
    backend._record_dense(3, p, torch.device("cpu"))
    assert backend.paths.last == "fp4.triton"
    monkeypatch.setattr(linear, "dense_path", lambda *a: "gluon")
    backend._record_dense(3, p, torch.device("cpu"))
    assert backend.paths.last == "fp4.gluon"


# -- mid M (16 < M <= MID_M_LIMIT): GLUON_MID_M's measured weights only --------------------------------------------

# What gemm_dispatch.GLUON_MID_M ships: check `midm`'s rule_proposal.GLUON_MID_M (H200 2026-12-03,
# benchmarks/results/midm_h200_1203a_summary.json), pasted both into gemm_dispatch.py and here.
SHIPPED_MID_M = {
    "nvfp4": {(12288, 4096): 128, (4096, 12288): 64, (6144, 4096): 128, (24576, 4096): 128},
    "mxfp4": {(12288, 4096): 128, (4096, 12288): 128, (6144, 4096): 128, (4096, 4096): 128, (1024, 4096): 96}}


def test_mid_m_table_is_the_measured_one():
    """The shipped table is what the H200 measured (check `midm`): a listed weight takes Gluon up to its M and Triton
    past it, every other weight (and every M past MID_M_LIMIT) the Triton fp4_matmul."""
    assert gd.GLUON_MID_M == SHIPPED_MID_M
    assert gd.MID_M_LIMIT == 128
    assert all(16 < m <= gd.MID_M_LIMIT for t in SHIPPED_MID_M.values() for m in t.values())
    shapes = {(12288, 4096), (4096, 12288), (6144, 4096), (4096, 4096), (24576, 4096), (1024, 4096)}
    for fmt in ("nvfp4", "mxfp4"):
        for n, k in shapes | set(SHIPPED_MID_M[fmt]):
            for M in (17, 24, 32, 33, 48, 64, 65, 96, 128):
                path, why = small_m_path(M, fmt, k, (9, 0), True, False, n_padded=n)
                assert path == ("gluon" if M <= SHIPPED_MID_M[fmt].get((n, k), 16) else "triton"), (fmt, n, k, M, why)


def test_mid_m_table_entry_takes_gluon_up_to_its_m(monkeypatch):
    monkeypatch.setattr(gd, "GLUON_MID_M", {"nvfp4": {(12288, 4096): 64}, "mxfp4": {(4096, 12288): 512}})
    for M in (17, 24, 32, 33, 48, 64):
        path, why = small_m_path(M, "nvfp4", 4096, (9, 0), True, False, n_padded=12288)
        assert path == "gluon" and "GLUON_MID_M" in why, (M, why)
    path, why = small_m_path(65, "nvfp4", 4096, (9, 0), True, False, n_padded=12288)
    assert path == "triton" and "M > 64" in why and "GLUON_MID_M" in why
    assert small_m_path(16, "nvfp4", 4096, (9, 0), True, False, n_padded=12288)[0] == "gluon"   # small M: as before
    others = [((64, "nvfp4", 4096, (9, 0), True, False, True, 6144), "M > 16"),           # another shape
              ((64, "nvfp4", 12288, (9, 0), True, False, True, 4096), "M > 16"),          # N and K swapped
              ((64, "mxfp4", 4096, (9, 0), True, False, True, 12288), "M > 16"),          # the other format's entry
              ((64, "nvfp4", 4096, (8, 0), True, False, True, 12288), "not an sm_90"),
              ((64, "nvfp4", 4096, (9, 0), False, False, True, 12288), "not importable"),
              ((64, "nvfp4", 4096, (9, 0), True, True, True, 12288), "explicit Triton GemmConfig"),
              ((64, "nvfp4", 4096, (9, 0), True, False, False, 12288), "GLUON_SMALL_M is off")]
    for args, why in others:
        path, reason = small_m_path(*args)
        assert path == "triton" and why in reason, (args, reason)
    # an entry past MID_M_LIMIT is capped there: from DEQUANT_CUBLAS_MIN_M on the cuBLAS paths take over anyway
    assert small_m_path(128, "mxfp4", 12288, (9, 0), True, False, n_padded=4096)[0] == "gluon"
    assert small_m_path(129, "mxfp4", 12288, (9, 0), True, False, n_padded=4096)[0] == "triton"


def test_mid_m_k_step_is_the_mid_m_configs(monkeypatch):
    """At mid M the K check is the mid-M config's step (nvfp4 wide tiles: 256 columns), not SMALL_M's 512."""
    monkeypatch.setattr(gd, "GLUON_MID_M", {"nvfp4": {(4096, 1280): 64, (4096, 1152): 64}, "mxfp4": {(4096, 1280): 64}})
    assert small_m_path(48, "nvfp4", 1280, (9, 0), True, False, n_padded=4096)[0] == "gluon"   # 5 x 256
    path, why = small_m_path(48, "nvfp4", 1152, (9, 0), True, False, n_padded=4096)            # 4.5 x 256
    assert path == "triton" and "256-column K step" in why
    path, why = small_m_path(48, "mxfp4", 1280, (9, 0), True, False, n_padded=4096)            # 2.5 x 512
    assert path == "triton" and "512-column K step" in why


def test_dense_path_mid_m_asks_the_rule_only_for_listed_weights(monkeypatch, caplog):
    monkeypatch.setattr(gd, "_LOGGED", set())
    monkeypatch.setattr(gd, "GLUON_MID_M", {"nvfp4": {(12288, 4096): 64}, "mxfp4": {}})
    with caplog.at_level(logging.INFO, logger="trace_rl.kernels"):
        assert gd.dense_path(64, torch.device("cpu"), "nvfp4", 4096, False, 12288) == "triton"    # CPU: the rule says
        assert gd.dense_path(65, torch.device("cpu"), "mxfp4", 4096, False, 6144) == "triton"
    lines = [r.getMessage() for r in caplog.records if "small-M FP4 linears" in r.getMessage()]
    assert len(lines) == 1 and "not an sm_90" in lines[0]


def test_mid_m_config_is_the_wide_pick_on_the_fin_kernel():
    from dataclasses import replace

    from trace_rl.kernels.fp4_gemm_gluon_config import M64_GRID, WIDE, config_for, mid_m_config

    for fmt in ("nvfp4", "mxfp4"):
        for M in (17, 24, 32, 33, 48, 64, 65, 96, 128):
            for n, k in ((12288, 4096), (4096, 12288), (6144, 4096), (4096, 4096)):
                c = mid_m_config(M, fmt, n, k)
                assert c.fin and c == replace(config_for(M, fmt, k, n), fin=True), (fmt, M, n, k)
        assert mid_m_config(24, fmt, 6144, 4096) == replace(WIDE[fmt][32], fin=True)
        assert mid_m_config(64, fmt, 12288, 4096) == replace(M64_GRID[fmt][(12288, 4096)], fin=True)
        assert mid_m_config(64, fmt, 6144, 4096) == replace(WIDE[fmt][64], fin=True)
    try:
        mid_m_config(16, "nvfp4", 4096, 4096)
    except ValueError as e:
        assert "M <= 16" in str(e)
    else:
        raise AssertionError("mid_m_config(16) must refuse: M <= 16 is the small-M config's")


def test_linear_launches_the_mid_m_config(monkeypatch, gen):
    """`_dense_matmul` on the Gluon path hands fp4_matmul_gluon `mid_m_config` at M > 16 and None (config_for's
    small-M pick) at M <= 16, with the row scale and bias (a stand-in launcher: no sm_90 here)."""
    import sys
    import types

    from trace_rl.backends import PackedWeight
    from trace_rl.formats import get_format
    from trace_rl.kernels import linear
    from trace_rl.kernels.fp4_gemm_gluon_config import mid_m_config

    calls = []

    def fake(x2, h, config=None, row_scale=None, bias=None, out_dtype=torch.bfloat16, pdl=False):
        calls.append((x2.shape[0], config, row_scale is not None, bias is not None, pdl))
        return torch.zeros(x2.shape[0], h.n, dtype=out_dtype)

    monkeypatch.setitem(sys.modules, "trace_rl.kernels.fp4_gemm_gluon",
                        types.SimpleNamespace(fp4_matmul_gluon=fake))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)    # a CPU-only torch has no CUDA
    p = PackedWeight("nvfp4", 200, 512, q=get_format("nvfp4").quantize(torch.randn(200, 512, generator=gen)))
    bias = torch.randn(200)
    for M in (8, 40):
        x = torch.randn(M, 512, generator=gen).to(torch.bfloat16)
        linear._dense_matmul(x, p, torch.ones(M), bias, torch.bfloat16, None, "gluon")
    h = linear.hopper_weight(p)
    assert calls[0] == (8, None, True, True, False)
    assert calls[1] == (40, mid_m_config(40, "nvfp4", *h.padded), True, True, False) and calls[1][1].fin


def test_linear_asks_the_mid_m_config_once_per_call(monkeypatch, gen):
    """An eager mid-M fp4_linear / fp4_linear_prequantized asks `mid_m_config` once per call (the rule's K-step check
    and the launch share it), and asks again at every call: a GLUON_MID_M patched between calls takes effect (no
    cache). The rule is answered as on sm_90 with Gluon; both GEMMs are stand-ins (no sm_90 here)."""
    import sys
    import types

    from trace_rl.backends import PackedWeight
    from trace_rl.formats import get_format
    from trace_rl.kernels import fp4_gemm_gluon_config as gcfg
    from trace_rl.kernels import linear

    asked, launched = [], []

    def counting(M, fmt, n_padded=None, k_padded=None):
        asked.append(M)
        return gcfg.mid_m_config(M, fmt, n_padded, k_padded)

    def gluon(x2, h, config=None, row_scale=None, bias=None, out_dtype=torch.bfloat16, pdl=False):
        launched.append(("gluon", config))
        return torch.zeros(x2.shape[0], h.n, dtype=out_dtype)

    def triton(x2, h, row_scale=None, bias=None, out_dtype=torch.bfloat16, config=None):
        launched.append(("triton", config))
        return torch.zeros(x2.shape[0], h.n, dtype=out_dtype)

    def as_on_sm90(rows, device, fmt, k_padded, explicit_config, n_padded=None, launch_config=None):
        return small_m_path(rows, fmt, k_padded, (9, 0), True, explicit_config, True, n_padded, launch_config)[0]

    monkeypatch.setitem(sys.modules, "trace_rl.kernels.fp4_gemm_gluon", types.SimpleNamespace(fp4_matmul_gluon=gluon))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)    # a CPU-only torch has no CUDA
    monkeypatch.setattr(gd, "mid_m_config", counting)
    monkeypatch.setattr(linear, "mid_m_config", counting)
    monkeypatch.setattr(linear, "dense_path", as_on_sm90)
    monkeypatch.setattr(linear, "fp4_matmul", triton)
    p = PackedWeight("nvfp4", 200, 512, q=get_format("nvfp4").quantize(torch.randn(200, 512, generator=gen)))
    monkeypatch.setattr(gd, "GLUON_MID_M", {"nvfp4": {(208, 512): 64}, "mxfp4": {}})     # 200 x 512 pads to 208 x 512
    x = torch.randn(40, 512, generator=gen).to(torch.bfloat16)
    linear.fp4_linear(x, p)
    linear.fp4_linear_prequantized(x, torch.ones(40), p)
    assert asked == [40, 40] and launched == [("gluon", gcfg.mid_m_config(40, "nvfp4", 208, 512))] * 2
    monkeypatch.setattr(gd, "GLUON_MID_M", {"nvfp4": {(208, 512): 32}, "mxfp4": {}})     # 40 rows: past the entry
    linear.fp4_linear(x, p)
    assert asked == [40, 40] and launched[-1][0] == "triton"
