"""benchmarks/silu_exact_h200.sh (the `siluexact` check) on its CPU dry path: the plumbing and the summary (the
bits it records there are the interpreter's, not checked: see benchmarks/silu_exact.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_script_dry_cpu(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "DRY": "1"}
    done = subprocess.run(["bash", "benchmarks/silu_exact_h200.sh", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["bench_rc"] == 0 and s["pytest_rc"] == -1 and "bench_error" not in s and "bits_error" not in s
    assert set(s["us"]) == {"apart", "fused_exact", "fused_fast", "fused_exact_8_warps",
                              "silu_mul_kernel_then_quantize"}
    assert all(set(v) == {"hot", "cold"} for v in s["us"].values())
    assert "saved_us_per_layer_hot" in s and "fused_exact_vs_apart" in s["bits"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["silu_exact.json", "silu_exact.log", "summary.json"]
