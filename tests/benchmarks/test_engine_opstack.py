"""benchmarks/engine_opstack_h200.sh (the `opstack` check) on its CPU dry path, and the operand-cache GB it reports
for the full Qwen3-8B shape from the plan alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import engine_opstack

from trace_rl.plan import PrecisionPlan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_full_model_cache_bytes():
    """Qwen3-8B, w4a4-kv4: 36 layers x (q, k, v, o, gate, up, down) in nvfp4, 2 bytes per element either way; the
    stacks (q|k|v and gate|up of each layer) add 4 bytes per row of row factors."""
    r = engine_opstack.cache_bytes_for("qwen3-8b", PrecisionPlan.preset("w4a4-kv4"))
    per_layer = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 12288 * 4096
    assert r["separate_gb"] == round(2 * 36 * per_layer / 1e9, 4) and r["stacked_groups"] == 72
    rf = 4 * 36 * (4096 + 2 * 1024 + 2 * 12288)
    assert r["row_factor_mb"] == round(rf / 1e6, 3) and r["stacked_gb"] == round((2 * 36 * per_layer + rf) / 1e9, 4)
    mx = engine_opstack.cache_bytes_for("qwen3-8b", PrecisionPlan.preset("w4a4-kv4-mx"))
    assert mx["stacked_groups"] == 0 and mx["stacked_gb"] == mx["separate_gb"]   # mxfp4: stacked by to_rollout


def test_script_dry_cpu(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "DRY": "1"}
    done = subprocess.run(["bash", "benchmarks/engine_opstack_h200.sh", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["bench_rc"] == 0 and s["pytest_rc"] == -1 and not s.get("error") and "summary_error" not in s
    assert [(x["L"], x["stacked"]) for x in s["steps"]] == [(9, True), (9, False), (17, True), (17, False)]
    assert all(x["logits_stacked_vs_per_part"]["argmax_agree"] == 1.0 for x in s["ab"]) and len(s["ab"]) == 2
    assert s["full_model_cache"]["stacked_groups"] == 72
    assert sorted(p.name for p in tmp_path.iterdir()) == ["opstack.json", "opstack.log", "summary.json"]
