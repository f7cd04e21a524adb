"""benchmarks/attention_sass.py and its check (attention_sass_h200.sh) on CPU: the rows at tiny shapes with the Gluon
kernel replaced by the torch reference (the folded variants off by a rounding: not bit-identical, recorded), graph
timing by one call; then the .sh, whose benchmark fails at once without a GPU, summarising that JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
try:
    import attention as A  # noqa: E402
    import attention_sass as S  # noqa: E402
except Exception:   # noqa: BLE001 -- a Triton without Gluon
    S = None
pytestmark = pytest.mark.skipif(S is None, reason="needs triton.experimental.gluon")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_rows_and_summary(tmp_path, monkeypatch):
    from trace_rl.kernels import paged_attention_gluon
    from trace_rl.kernels.attention_reference import decode_attention_reference

    monkeypatch.setattr(A, "SMOKE", True)
    monkeypatch.setattr(A, "DEV", "cpu")
    monkeypatch.setattr(S, "DEV", "cpu")
    monkeypatch.setattr(S, "SHAPES", ((3, 130), (2, 257)))

    def gluon(q, k, v, table, lens, scale, config=None):
        out = decode_attention_reference(q, k, v, table, lens, scale).to(q.dtype)
        return out * (1 + 2 ** -7) if config.mx_fold else out

    monkeypatch.setattr(paged_attention_gluon, "decode_attention_gluon", gluon)
    out = str(tmp_path / "attention_sass.json")
    monkeypatch.setattr(sys, "argv", ["attention_sass.py", "--out", out, "--budget-s", "600"])
    S.main()
    r = json.load(open(out))
    assert [(row["format"], row["batch"], row["context"]) for row in r["rows"]] == \
        [("nvfp4", 3, 130), ("mxfp4", 3, 130), ("nvfp4", 2, 257), ("mxfp4", 2, 257)] and not r["skipped"]
    for row in r["rows"]:
        assert row["roofline_us"] > 0 and row["cache_bytes"] > 0
        for name in S.VARIANTS[row["format"]]:
            assert row[name]["us"] > 0 and row[name]["rel_err_vs_reference"] < 1e-2 and not row[name]["nan"]
        assert row["lean"]["vs_base"]["bit_identical"] and row["lean"]["speedup_vs_gluon"] > 0
        if row["format"] == "nvfp4":
            assert row["persistent_colmax"]["vs_base"]["base"] == "persistent"
        if row["format"] == "mxfp4":
            assert not row["fold"]["vs_base"]["bit_identical"] and row["fold"]["vs_base"]["base"] == "gluon"
            assert row["fold_lean"]["vs_base"]["bit_identical"] and row["fold_lean"]["vs_base"]["base"] == "fold"
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("TRITON_INTERPRET", None)
    subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "attention_sass_h200.sh"), str(tmp_path)], cwd=ROOT,
                   env=env, capture_output=True, text=True, timeout=300)
    s = json.load(open(tmp_path / "summary.json"))
    assert s["bench_rc"] != 0 and len(s["rows"]) == 4 and "bench_error" not in s
    assert s["rows"][1]["fold_lean"]["us"] > 0 and "bit_identical" in s["rows"][0]["lean_s2"]["vs_base"]
