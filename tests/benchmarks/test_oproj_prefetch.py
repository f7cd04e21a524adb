"""benchmarks/oproj_prefetch.py on CPU (the timing runs on the H200: check `oprojpf`): the variants per format, the
table override and its restore, the compile jobs, a row's wins and the summary's rule proposal, and the check's
registration."""

import os

import oproj_prefetch as bench

from trace_rl.kernels import fp4_gemm_gluon_prefetch as pf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_variants_per_format():
    assert list(bench.variants("nvfp4")) == ["w4a16", "shipped", "pf_k256_split2", "pf_k256_split3", "pf_k512_split2",
                                             "pf_k512_split3", "k256_split4", "split4"]
    assert list(bench.variants("mxfp4")) == ["w4a16", "shipped", "pf_k512_split2", "pf_k512_split3", "split4"]
    assert bench.variants("mxfp4")["w4a16"] == ("bf16", None) and bench.variants("mxfp4")["shipped"] == ("mxfp4", None)


def test_table_entry_sets_and_restores():
    c = pf.PREFETCH_ALL_CANDIDATES["pf_k512_split3"][0]
    before = {f: dict(t) for f, t in pf.W4A4_PDL_GRID.items()}
    with bench.table_entry("mxfp4", 16, c):
        assert pf.w4a4_pdl_config(16, "mxfp4", *bench.SHAPE) == c
        assert pf.w4a4_pdl_config(8, "mxfp4", *bench.SHAPE) is None
    with bench.table_entry("mxfp4", 16, None):
        assert pf.W4A4_PDL_GRID == before
    assert pf.W4A4_PDL_GRID == before


def test_compile_jobs_cover_both_tiles_and_the_engine_pair():
    jobs = bench.compile_jobs(["nvfp4", "mxfp4"], [1, 4, 8, 16])
    assert {(f, M) for f, M, _ in jobs} == {("nvfp4", 1), ("nvfp4", 16), ("mxfp4", 1), ("mxfp4", 16)}
    assert ("nvfp4", 16, "engine") in jobs and ("mxfp4", 16, "engine") in jobs
    assert len(jobs) == 2 * (8 + 5) + 2


def _row(fmt, M, rounds):
    rounds = {n: [r[n] for r in rounds] for n in rounds[0]}      # interleaved_rounds' shape: {variant: [us]}
    row = {"fmt": fmt, "M": M, "rounds_us": rounds, "bits": {"shipped": {"graph_pdl_eq_eager": True},
                                                       "pf_k512_split3": {"eq_eager": True}}}
    bench.summarize_row(row)
    return row


def test_summary_rule_needs_a_win_in_every_round_at_every_m_of_a_bucket():
    win = [{"w4a16": 10.0, "shipped": 12.0, "pf_k512_split3": 11.0, "split4": 11.9} for _ in range(3)]
    close = [dict(r, pf_k512_split3=11.9) for r in win]          # 0.99 x shipped: not a win
    one_lost = win[:2] + [dict(win[2], pf_k512_split3=12.1)]
    rows = [_row("mxfp4", 1, win), _row("mxfp4", 4, win), _row("mxfp4", 8, win), _row("mxfp4", 16, one_lost),
            _row("nvfp4", 1, win), _row("nvfp4", 8, close)]
    assert rows[0]["best"] == {"name": "pf_k512_split3", "over_shipped": 0.917, "wins": True, "ratio_w4a16": 1.1}
    assert rows[0]["ratio_w4a16"]["shipped"] == 1.2 and rows[0]["winners"] == ["pf_k512_split3"]
    assert rows[3]["best"]["wins"] is False
    s = bench.summarize({"rows": rows, "engine": [{"fmt": "mxfp4", "shipped_on_over_off": 0.97}]})
    assert s["bits_ok"] and s["bits_failed"] == []
    assert s["rule_proposal"]["per_bucket"] == {"mxfp4": {8: "pf_k512_split3"}, "nvfp4": {}}
    assert s["rule_proposal"]["W4A4_PDL_GRID"] == \
        "{'mxfp4': {(4096, 4096): {8: PREFETCH_ALL_CANDIDATES['pf_k512_split3'][0]}}}"
    assert "mxfp4 M=16: 1.2" in s["over_target_shipped"]
    assert s["over_target_with_rule"] == ["mxfp4 M=16: 1.2", "nvfp4 M=8: 1.2"]     # won points are at 1.1
    assert s["engine"][0]["shipped_on_over_off"] == 0.97
    bad = dict(rows[0], bits={"pf_k256_split2": {"eq_eager": False}})
    s = bench.summarize({"rows": [bad]})
    assert not s["bits_ok"] and s["bits_failed"] == ["mxfp4 M=1 pf_k256_split2: {'eq_eager': False}"]
    assert bench.summarize({"rows": []})["rule_proposal"]["W4A4_PDL_GRID"].startswith("none")


def test_check_is_registered():
    text = open(os.path.join(ROOT, "benchmarks", "h200_session_checks.sh")).read()
    assert "        oprojpf) bash benchmarks/oprojpf_h200.sh" in text
    assert "#   oprojpf  benchmarks/oprojpf_h200.sh" in text
    script = open(os.path.join(ROOT, "benchmarks", "oprojpf_h200.sh")).read()
    assert "tests/kernels/test_oproj_prefetch_gpu.py" in script and "summary.json" in script
