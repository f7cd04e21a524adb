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
