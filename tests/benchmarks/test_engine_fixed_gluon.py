"""benchmarks/engine_fixed_gluon_h200.sh's summary on CPU: the bench is made to fail at once (an unknown flag in
BENCH_ARGS) over a rollout.json written beforehand, as a run cut after its rows would leave it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _row(plan: str, tps: float, forced=None, cache=False, compiled=None) -> dict:
    steps = [{"L": L, "step_ms": 10.0, "forward_ms": 9.0, "roofline_frac": 0.5, "path": "kernels.decode_attention",
              "attention_times": {"ms": {}}, **({"baseline_compiled": compiled} if compiled is not None else {})}
             for L in (257, 4352, 8447)]
    return {"plan": plan, "attention_requested": forced or "auto", "attention_forced": forced,
            "attention_refused": None, "attention_used": ["kernels.decode_attention"], "layout": "pool",
            "batch": 100, "operand_cache": cache, "operand_cache_GB": 14.0 if cache else 0.0, "tokens_per_s": tps,
            "steps": steps, "prefill_s": 1.0, "e2e": {"ratio": 1.0},
            "plain_baseline": {"decode_tokens_per_s": 50.0} if plan == "bf16" else None}


def test_summary_survives_a_failed_compiled_baseline(tmp_path):
    """The bf16 row's compiled plain step failed ({"error": ...} per step): the summary keeps every row."""
    (tmp_path / "fixed").mkdir()
    rows = [_row("bf16", 100.0, compiled={"error": "RuntimeError: no compiler"}),
            _row("w4a4-kv4", 250.0, "gluon"), _row("w4a4-kv4", 260.0, "gluon", cache=True),
            _row("w4a4-kv4", 200.0, "kernels")]
    (tmp_path / "fixed" / "rollout.json").write_text(json.dumps(
        {"device": "cpu", "read_bandwidth_TBps": 4.0, "errors": [], "results": rows, "summary": []}))
    env = {**os.environ, "PYTHON": sys.executable, "BENCH_ARGS": "--no-such-flag"}
    done = subprocess.run(["bash", "benchmarks/engine_fixed_gluon_h200.sh", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["bench_rc"] == 2 and "summary_error" not in s, s.get("summary_error")
    assert s["plain_step_decode_tokens_per_s"] == {"best": 50.0, "compiled": None}
    assert [r["tokens_per_s"] for r in s["rows"]] == [100.0, 250.0, 260.0, 200.0]
    assert s["w4a4-kv4_gluon_vs_kernels"]["tokens_per_s"] == 1.25
    assert s["w4a4-kv4_gluon_operand_cache_vs_off"]["tokens_per_s"] == 1.04


def test_summary_compares_the_mxfp4_operand_caches(tmp_path):
    """OPCACHE=...,w4a4-kv4-mx,w4a4-kv4-mx=fp8: the mxfp4 rows without, with the bf16 and with the FP8 cache are
    summarised side by side, and the FP8 cache against the bf16 one."""
    (tmp_path / "fixed").mkdir()
    fp8 = {**_row("w4a4-kv4-mx", 275.0, cache=True), "operand_cache_kind": "fp8", "operand_cache_GB": 7.0}
    rows = [_row("bf16", 100.0), _row("w4a4-kv4-mx", 200.0), _row("w4a4-kv4-mx", 250.0, cache=True), fp8]
    (tmp_path / "fixed" / "rollout.json").write_text(json.dumps(
        {"device": "cpu", "read_bandwidth_TBps": 4.0, "errors": [], "results": rows, "summary": []}))
    env = {**os.environ, "PYTHON": sys.executable, "BENCH_ARGS": "--no-such-flag"}
    done = subprocess.run(["bash", "benchmarks/engine_fixed_gluon_h200.sh", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert "summary_error" not in s, s.get("summary_error")
    assert [r["operand_cache_kind"] for r in s["rows"]] == [None, None, "bf16", "fp8"]
    mx = s["w4a4-kv4-mx_operand_cache"]
    assert {k: v["tokens_per_s"] for k, v in mx.items()} == {"off": 200.0, "bf16": 250.0, "fp8": 275.0}
    assert mx["fp8"]["vs_bf16"] == 2.75 and mx["fp8"]["cache_GB"] == 7.0
    assert s["w4a4-kv4-mx_fp8_vs_bf16_cache"]["tokens_per_s"] == 1.1
