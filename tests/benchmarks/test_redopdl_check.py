"""The `redopdl` check's wiring on CPU (benchmarks/redopdl_h200.sh, benchmarks/redopdl_summary.py): registered, its
cases are the GPU tests' parametrizations, the timed variant is LEAN_CHECKED_PDL's fields against the exact LEAN, and
the summary turns fake rcs / junit xmls and a fake attention_sass.json into the verdict."""

import json
import os
import re
import sys

import attention_sass
import redopdl_summary as R

from tests.benchmarks.test_mxkv_check import junit_xml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "redopdl_h200.sh")


def test_registered_and_cases_match_the_gpu_tests():
    script = open(SCRIPT).read()
    checks = open(os.path.join(ROOT, "benchmarks", "h200_session_checks.sh")).read()
    assert "redopdl) bash benchmarks/redopdl_h200.sh" in checks and "#   redopdl " in checks
    sys.path.insert(0, ROOT)
    from tests.kernels import test_paged_attention_gluon_checked as checked
    from tests.kernels import test_redo_pdl as pdl
    from trace_rl.kernels.paged_attention_gluon import LEAN_CHECKED_PDL, GluonAttentionConfig

    assert re.search(r'^CASES="([^"]+)"', script, re.M).group(1).split() == list(pdl.CASES)
    shared = re.search(r'^SHARED="([^"]+)"', script, re.M).group(1).split()
    assert shared == [c for c in pdl.CASES if c in checked.CASES]
    kw = attention_sass.VARIANTS["mxfp4"]["checked_lean_pdl"]
    assert GluonAttentionConfig(**kw) == LEAN_CHECKED_PDL and attention_sass.BASE["checked_lean_pdl"] == "lean"
    assert attention_sass.PAIRS == {"checked_lean_pdl": "checked_lean"}
    assert "--pair-rounds 5" in script and "32x8192," in script


def _row(plain: float, pdl: float, rounds: list, identical: bool = True) -> dict:
    return {"format": "mxfp4", "batch": 32, "context": 8192, "roofline_us": 66.0, "gluon": {"us": 111.0},
            "lean": {"us": 96.0}, "checked_lean": {"us": plain, "vs_base": {"base": "lean", "bit_identical": True}},
            "checked_lean_pdl": {"us": pdl, "vs_base": {"base": "lean", "bit_identical": identical}},
            "pairs": {"checked_lean_pdl": {"vs": "checked_lean", "rounds": rounds}},
            "sdpa_best_us": 236.0, "sdpa_best": "default"}


def _summary(tmp_path, rows, failed: str = "", skipped: int = 0, cases=("a", "b")):
    for c in cases:
        (tmp_path / f"case_{c}.expected").write_text("4\n")
        (tmp_path / f"case_{c}.rc").write_text("1\n" if c == failed else "0\n")
        (tmp_path / f"case_{c}.xml").write_text(junit_xml(4, int(c == failed), skipped))
    (tmp_path / "attention_sass.json").write_text(json.dumps({"ceilings": {"read_TBps": 4.4}, "rows": rows}))
    R.main([str(tmp_path), "0", *cases])
    return json.load(open(tmp_path / "summary.json"))


def test_summary_best_times_speedup_and_green(tmp_path):
    rounds = [{"checked_lean": 92.5, "checked_lean_pdl": 88.5}, {"checked_lean": 91.8, "checked_lean_pdl": 88.0}]
    s = _summary(tmp_path, [_row(92.0, 89.0, rounds)])
    e = s["rows"][0]
    assert (e["checked_us"], e["checked_pdl_us"]) == (91.8, 88.0)           # the best of each variant's timings
    assert abs(e["pdl_speedup"] - 91.8 / 88.0) < 1e-12 and e["pdl_not_slower"]
    assert abs(e["bw_frac"] - 66.0 / 88.0) < 1e-12 and e["bw_target_0.75_met"]
    assert abs(e["bw_frac_plain"] - 66.0 / 91.8) < 1e-12
    assert s["green"] and "LEAN_REDO_PDL = True" in s["verdict"] and s["bw_frac"] == {"32x8192": 0.75}
    slower = [{"checked_lean": 90.0, "checked_lean_pdl": 90.6}]                # 0.67% slower: past the band
    assert not _summary(tmp_path, [_row(91.0, 91.0, slower)])["green"]
    within = [{"checked_lean": 90.0, "checked_lean_pdl": 90.3}]                # 0.33%: noise
    assert _summary(tmp_path, [_row(91.0, 91.0, within)])["green"]
    assert not _summary(tmp_path, [_row(92.0, 89.0, rounds, identical=False)])["green"]
    assert not _summary(tmp_path, [_row(92.0, 89.0, rounds)], failed="b")["green"]
    assert not _summary(tmp_path, [_row(92.0, 89.0, rounds)], skipped=4)["green"]     # rc 0, nothing ran
    assert not _summary(tmp_path, [])["green"]


def test_summary_without_bench_or_logs(tmp_path):
    """A check cut before anything finished still writes its summary (not green)."""
    R.main([str(tmp_path), "124", "g4-lean"])
    s = json.load(open(tmp_path / "summary.json"))
    assert not s["green"] and s["tests"]["g4-lean"]["rc"] is None and s["rows"] == []
