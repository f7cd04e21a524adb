"""benchmarks/midm_sweep.py on CPU: the table switch it times under, the GLUON_MID_M rule its summary proposes, issue
15's M = 64 ratios, and the check's registration (the timing runs on the H200: benchmarks/midm_h200.sh)."""

import os

import midm_sweep as ms  # noqa: E402

from trace_rl.kernels import gemm_dispatch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _row(fmt, K, N, M, win16=True, win4=True, g_us=20.0, cub=30.0):
    t16 = g_us * (1.1 if win16 else 0.9)
    t4 = g_us * (1.1 if win4 else 0.9)
    return {"fmt": fmt, "K": K, "N": N, "M": M, "padded": [N, K],
            "us": {"w4a16_gluon": g_us, "w4a16_triton": t16, "w4a4_gluon": g_us, "w4a4_triton": t4,
                   "cublas_bf16": cub},
            "rounds_us": {"w4a16_gluon": [g_us] * 2, "w4a16_triton": [t16] * 2},
            "w4a16_gluon_wins_every_round": win16, "w4a4_gluon_wins_every_round": win4,
            "w4a16_gluon_x_cublas": round(cub / g_us, 3), "w4a16_triton_x_cublas": round(cub / t16, 3)}


def test_table_switch_restores_the_shipped_table():
    shipped = gemm_dispatch.GLUON_MID_M
    with ms.mid_m_table("nvfp4", (12288, 4096)):
        assert gemm_dispatch.GLUON_MID_M == {"nvfp4": {(12288, 4096): gemm_dispatch.MID_M_LIMIT}, "mxfp4": {}}
    with ms.mid_m_table(None, None):
        assert gemm_dispatch.GLUON_MID_M == {"nvfp4": {}, "mxfp4": {}}
    assert gemm_dispatch.GLUON_MID_M is shipped


def test_rule_is_the_largest_m_won_every_round_from_17():
    rows = [_row("nvfp4", 4096, 12288, M) for M in (17, 24, 32, 48, 64, 96)]            # lost nowhere; 128 missing
    rows += [_row("nvfp4", 12288, 4096, M, win4=M < 48) for M in (17, 24, 32, 48, 64)]   # W4A4 lost at 48
    rows += [_row("mxfp4", 4096, 6144, M, win16=M != 17) for M in (17, 24, 32, 48, 64)]  # lost at 17: no entry
    rows += [_row("mxfp4", 4096, 1024, M) for M in (17, 24, 32, 48, 64, 96)]
    rows += [{"fmt": "mxfp4", "K": 4096, "N": 1024, "M": 128, "dequant_cublas": True}]   # not the table's choice
    rule = ms.rule_proposal(rows)
    assert rule["nvfp4 4096x12288"]["max_m"] == 96 and "128 not measured" in rule["nvfp4 4096x12288"]["why"]
    assert rule["nvfp4 12288x4096"]["max_m"] == 32 and "lost at M = 48" in rule["nvfp4 12288x4096"]["why"]
    assert rule["mxfp4 4096x6144"]["max_m"] is None
    assert rule["mxfp4 4096x1024"]["max_m"] == 96
    line = rule["GLUON_MID_M"]
    assert line == ('GLUON_MID_M: dict[str, dict[tuple[int, int], int]] = {"nvfp4": {(12288, 4096): 96, '
                    '(4096, 12288): 32}, "mxfp4": {(1024, 4096): 96}}')
    table = eval(line.split(" = ", 1)[1])                    # the pasted line is valid Python of the table's type
    assert table["nvfp4"][(12288, 4096)] == 96


def test_issue15_m64_ratios_and_summary():
    rows = [_row("nvfp4", 4096, 12288, 64, g_us=18.0, cub=30.0), _row("mxfp4", 12288, 4096, 64, g_us=25.0, cub=30.0),
            _row("nvfp4", 4096, 12288, 32)]
    m64 = ms.issue15_m64(rows)
    assert m64["nvfp4 4096x12288"]["w4a16_gluon_x_cublas"] == 1.667 and m64["nvfp4 4096x12288"]["meets_target"]
    assert not m64["mxfp4 12288x4096"]["meets_target"] and len(m64) == 2
    s = ms.summarize({"rows": rows, "skipped": [], "errors": []})
    assert s["points"]["timed"] == 3 and len(s["table"]) == 3 and "GLUON_MID_M" in s["rule_proposal"]


def test_check_is_registered():
    checks = open(os.path.join(ROOT, "benchmarks", "h200_session_checks.sh")).read()
    assert "midm) bash benchmarks/midm_h200.sh" in checks and "#   midm " in checks
    script = open(os.path.join(ROOT, "benchmarks", "midm_h200.sh")).read()
    assert "test_fp4_gemm_gluon_mid_m.py" in script and "midm_sweep.py" in script
    assert [s for s in ms.SHAPES] == [(4096, 12288), (12288, 4096), (4096, 6144), (4096, 4096), (4096, 24576),
                                      (4096, 1024)]
