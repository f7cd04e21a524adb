"""benchmarks/gemm_ship.py on CPU: its byte count, the dispatch switch it times the Triton path under, and the check
script's registration (the timing itself runs on the H200: benchmarks/gemm_ship_h200.sh)."""

import os

import gemm_ship as gs  # noqa: E402

from trace_rl.kernels import gemm_dispatch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bytes_and_switch():
    assert gs.fp4_bytes(12288, 4096, 1, "nvfp4") == 12288 * 2048 + 12288 * 256 + 4 * 12288 + 2 * 4096 + 2 * 12288
    assert gs.fp4_bytes(1024, 4096, 16, "mxfp4") == 1024 * 2048 + 1024 * 128 + 4 * 1024 + 2 * 16 * 4096 + 2 * 16 * 1024
    assert gemm_dispatch.GLUON_SMALL_M
    with gs.gluon_small_m(False):
        assert not gemm_dispatch.GLUON_SMALL_M
    assert gemm_dispatch.GLUON_SMALL_M
    assert [(K, N) for K, N in gs.SHAPES] == [(4096, 12288), (12288, 4096), (4096, 1024)] and gs.MS == [1, 4, 16]


def test_check_is_registered():
    checks = open(os.path.join(ROOT, "benchmarks", "h200_session_checks.sh")).read()
    assert "gemmship) bash benchmarks/gemm_ship_h200.sh" in checks
    script = open(os.path.join(ROOT, "benchmarks", "gemm_ship_h200.sh")).read()
    assert "GEMLITE_SRC" in script and "test_fp4_gemm_gluon_small.py" in script
