"""The sm_90 compile gate (trace_rl/kernels/sass_gate.py) on the shipped kernel configurations, on CPU.

It compiles in a subprocess without TRITON_INTERPRET (interpreted kernels cannot be compiled). It uses the
installed Triton, or the one at $TRACE_RL_GATE_TRITON (a directory put first on PYTHONPATH: the H200's
Triton 3.6, e.g. /work/triton36); `tox -e gate36` runs it with triton==3.6.0.
"""

import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")


def _gate_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [os.environ.get("TRACE_RL_GATE_TRITON", ""), root, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def test_shipped_kernel_configs_pass_the_sm90_gate(tmp_path):
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool) and not os.environ.get("TRACE_RL_GATE_TRITON"):
        pytest.skip("this Triton wheel carries no cuobjdump")
    out = tmp_path / "gate.json"
    proc = subprocess.run([sys.executable, "-m", "trace_rl.kernels.sass_gate", "--json", str(out)],
                          env=_gate_env(), capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stdout + proc.stderr[-3000:]
    reports = json.loads(out.read_text())
    assert any(r["name"].startswith("gemm") for r in reports)
    assert proc.returncode == 0, proc.stdout
    for r in reports:
        assert not r["violations"], (r["name"], r["violations"])
