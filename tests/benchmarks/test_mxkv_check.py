"""The `mxkv` check's wiring on CPU (benchmarks/mxkv_h200.sh): registered, its test cases are the GPU test's
parametrization, the timed variant exists and is compared against the exact LEAN, and its summary step turns logs and
a benchmark JSON into the verdict (run here on fake ones)."""

import json
import os
import re
import subprocess
import sys

import attention_sass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "mxkv_h200.sh")


def test_registered_and_cases_match_the_gpu_test():
    script = open(SCRIPT).read()
    checks = open(os.path.join(ROOT, "benchmarks", "h200_session_checks.sh")).read()
    assert "mxkv) bash benchmarks/mxkv_h200.sh" in checks and "#   mxkv " in checks
    sys.path.insert(0, ROOT)
    from tests.kernels.test_paged_attention_gluon_checked import CASES

    assert re.search(r'^CASES="([^"]+)"', script, re.M).group(1).split() == list(CASES)
    assert attention_sass.VARIANTS["mxfp4"]["checked_lean"] == dict(attention_sass.LEAN, mx_checked=True)
    assert attention_sass.BASE["checked_lean"] == "lean"


def junit_xml(tests: int, failures: int = 0, skipped: int = 0) -> str:
    """A pytest junit xml with these counts (what --junitxml writes, reduced to the counts)."""
    return (f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" '
            f'failures="{failures}" skipped="{skipped}" tests="{tests}"></testsuite></testsuites>')


def _summary(tmp_path, passed: bool, identical: bool, skipped: int = 0, xml: bool = True):
    """The script's summary heredoc run on fake case logs / rcs / junit xmls and a fake attention_sass.json."""
    script = open(SCRIPT).read()
    body = script[script.index("<<'PY'\n") + 7: script.rindex("\nPY")]
    cases = re.search(r'^CASES="([^"]+)"', script, re.M).group(1).split()
    for c in cases:
        # the log's text is not what decides (it used to be: "2 passed" in it)
        (tmp_path / f"case_{c}.log").write_text("..\n2 passed in 9.1s\n")
        (tmp_path / f"case_{c}.rc").write_text("0\n" if passed else "1\n")
        if xml:
            (tmp_path / f"case_{c}.xml").write_text(junit_xml(2, 0 if passed else 1, skipped))
    row = {"format": "mxfp4", "batch": 32, "context": 8192, "roofline_us": 50.0, "gluon": {"us": 80.0},
           "lean": {"us": 70.0, "bw_frac": 0.71},
           "checked_lean": {"us": 62.0, "bw_frac": 0.806, "vs_base": {"base": "lean", "bit_identical": identical}},
           "sdpa_best_us": 120.0, "sdpa_best": "cudnn"}
    (tmp_path / "attention_sass.json").write_text(json.dumps({"ceilings": {"read_TBps": 4.1}, "rows": [row]}))
    proc = subprocess.run([sys.executable, "-c", body, str(tmp_path), "0", *cases], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    return json.load(open(tmp_path / "summary.json"))


def test_summary_says_green_only_when_tests_pass_and_bits_match(tmp_path):
    s = _summary(tmp_path, True, True)
    assert s["green"] and "LEAN_MX_CHECKED = True" in s["verdict"]
    e = s["rows"][0]
    assert abs(e["checked_speedup_over_lean"] - 70 / 62) < 1e-9 and e["bw_frac"] == 0.806
    assert e["bw_target_0.75_met"] and e["checked_lean"]["vs_base"]["bit_identical"]
    assert not _summary(tmp_path, False, True)["green"]
    assert not _summary(tmp_path, True, True, skipped=2)["green"]           # rc 0 but nothing ran: not a pass
    for f in tmp_path.glob("case_*.xml"):
        f.unlink()
    assert not _summary(tmp_path, True, True, xml=False)["green"]           # no junit: cut before it finished
    assert not _summary(tmp_path, True, False)["green"]
