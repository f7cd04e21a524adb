"""benchmarks/fp8sync_h200.sh (the `fp8sync` check) on its CPU dry path: the plumbing and the summary (2 small layers
in the interpreter; the bit-identity flags are real there, the times are not)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_script_dry_cpu(tmp_path):
    pytest.importorskip("triton")
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "DRY": "1"}
    done = subprocess.run(["bash", "benchmarks/fp8sync_h200.sh", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["bench_rc"] == 0 and s["pytest_rc"] == -1 and "bench_error" not in s
    assert s["writers_bit_identical"] and s["fp8_equals_bf16_x32"] and s["wide_span_inexact_values"] > 0
    assert {"fp8_per_weight_ms", "fp8_batched_ms", "bf16_ms", "batched_over_bf16", "look_at"} <= set(s)
    assert s["pass"] is False                          # no GPU tests ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp8sync.json", "fp8sync.log", "summary.json"]
