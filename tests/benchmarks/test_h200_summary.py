"""benchmarks/h200_summary.py on CPU: `pytest_shards` over fake junit shards, and the summary heredocs of the sharded
checks (midm, smallm, m64, gemm_ship) run on a fake OUT, as they run after a cut GPU step (no sweep JSON)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import h200_summary as hs  # noqa: E402

SHARD0 = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1"
skipped="1" tests="3"><testcase name="test_a[1]"/><testcase name="test_b"><failure message="x"/></testcase>
<testcase name="test_c"><skipped/></testcase></testsuite></testsuites>"""
SHARD1 = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="0"
skipped="0" tests="2"><testcase name="test_d"/><testcase name="test_e"><error message="y"/></testcase></testsuite>
</testsuites>"""


def _fake_out(tmp_path, n_ids: int = 6) -> None:
    (tmp_path / "pytest_0.xml").write_text(SHARD0)
    (tmp_path / "pytest_1.xml").write_text(SHARD1)
    (tmp_path / "pytest_2.xml").write_text("<testsuites><testsuite")      # a shard cut mid-write
    for i in range(3):
        (tmp_path / f"pytest_{i}.log").write_text(f"line1\nline2\n== shard {i} ==\n")
    (tmp_path / "test_ids.txt").write_text("".join(f"t.py::test_{i}\n" for i in range(n_ids)))


def test_pytest_shards_sums_and_names(tmp_path):
    _fake_out(tmp_path)
    r = hs.pytest_shards(str(tmp_path))
    assert list(r) == ["pytest", "pytest_failed", "pytest_tails"]
    assert r["pytest"] == {"tests": 5, "failures": 1, "errors": 1, "skipped": 1, "collected": 6}
    assert r["pytest_failed"][:2] == ["test_b", "test_e"] and len(r["pytest_failed"]) == 3
    assert "pytest_2.xml" in r["pytest_failed"][2] and "ParseError" in r["pytest_failed"][2]
    assert r["pytest_tails"] == {f"pytest_{i}.log": ["line2", f"== shard {i} =="] for i in range(3)}


def test_pytest_shards_empty_out(tmp_path):
    r = hs.pytest_shards(str(tmp_path))       # collection failed: no ids, no shards
    assert r == {"pytest": {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "collected": 0},
                 "pytest_failed": [], "pytest_tails": {}}


def test_pytest_shards_caps_failures_at_20(tmp_path):
    cases = "".join(f'<testcase name="t{i}"><failure/></testcase>' for i in range(25))
    (tmp_path / "pytest_0.xml").write_text(f'<testsuites><testsuite tests="25" failures="25">{cases}</testsuite>'
                                           "</testsuites>")
    r = hs.pytest_shards(str(tmp_path))
    assert r["pytest"]["failures"] == 25 and r["pytest_failed"] == [f"t{i}" for i in range(20)]


@pytest.mark.parametrize("script", ["midm_h200.sh", "smallm_h200.sh", "m64_h200.sh", "gemm_ship_h200.sh"])
def test_check_summary_heredoc(script, tmp_path):
    """The script's summary step alone (its python heredoc, the rcs as arguments) over fake shards and no sweep JSON."""
    text = open(os.path.join(ROOT, "benchmarks", script)).read()
    code = text.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    _fake_out(tmp_path)
    p = subprocess.run([sys.executable, "-", str(tmp_path), "0", "1", "2"], input=code, cwd=ROOT, text=True,
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    s = json.load(open(tmp_path / "summary.json"))
    assert s["pytest"] == {"tests": 5, "failures": 1, "errors": 1, "skipped": 1, "collected": 6}
    assert s["pytest_failed"][:2] == ["test_b", "test_e"] and len(s["pytest_tails"]) == 3
    assert (s["precompile_rc"], s["bench_rc"], s["pytest_rc"]) == (0, 1, 2) and "bench_error" in s
    if script == "midm_h200.sh":
        assert s["pytest_pass"] is False
        keys = list(s)
        assert keys.index("pytest_failed") < keys.index("pytest_pass") < keys.index("pytest_tails")


def test_start_and_wait_pytest_shards(tmp_path):
    """benchmarks/h200_check.sh's sharded run on CPU: 3 ids (one parametrized: no globbing) in 4 shards, the empty
    one not started, the failing shard's rc in $test_rc, the shards summed by pytest_shards."""
    (tmp_path / "test_fake.py").write_text("import pytest\n\ndef test_ok():\n    pass\n\n"
                                           "@pytest.mark.parametrize('p', [1])\ndef test_p(p):\n    pass\n\n"
                                           "def test_fail():\n    assert False\n")
    out = tmp_path / "out"
    out.mkdir()
    f = tmp_path / "test_fake.py"
    (out / "test_ids.txt").write_text(f"{f}::test_ok\n{f}::test_p[1]\n{f}::test_fail\n")
    env = dict(os.environ, PYTHON=sys.executable)
    p = subprocess.run(["bash", "-c", '. benchmarks/h200_check.sh "$1"; start_pytest_shards 4 60; wait_pytest_shards; '
                        'echo "test_rc=$test_rc"', "_", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=180)
    assert "test_rc=1" in p.stdout, (p.stdout, p.stderr)
    assert sorted(x.name for x in out.glob("pytest_*.xml")) == ["pytest_1.xml", "pytest_2.xml", "pytest_3.xml"]
    assert (out / "shard_0.txt").read_text() == ""      # NR % 4 == 0: the 4th id
    r = hs.pytest_shards(str(out))
    assert r["pytest"] == {"tests": 3, "failures": 1, "errors": 0, "skipped": 0, "collected": 3}
    assert r["pytest_failed"] == ["test_fail"]
