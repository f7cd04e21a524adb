"""The SASS emulator (trace_rl/kernels/sass_emulate.py) on the Gluon FP4-KV attention's consumer partition
(paged_attention_gluon_emulate.py), on CPU: the shipped config and LEAN (n_pad=8 padded) read no register before
writing it and touch no shared memory outside the CTA's allocation; LEAN unpadded (pad_smem=False, what faulted on
the H200 with an illegal address, issue 15) is caught: PV HGMMA descriptors from never-written uniform registers,
B operand outside the allocation. Needs Triton 3.6 (Gluon; $TRACE_RL_GATE_TRITON, as tests/kernels/test_sass_gate.py)
and runs in a subprocess without TRITON_INTERPRET."""

import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")

SCRIPT = """
import json
from trace_rl.kernels.paged_attention_gluon import DEFAULT, LEAN, GluonAttentionConfig
from trace_rl.kernels.paged_attention_gluon_emulate import gluon_attention_report
out = {}
for name, c, fmt in (("default", DEFAULT, "nvfp4:row"), ("lean", LEAN, "nvfp4:row"), ("lean_mx", LEAN, "mxfp4"),
                     ("unpadded", GluonAttentionConfig(n_pad=8, unroll=2, col_max=True, pad_smem=False), "nvfp4:row")):
    r = gluon_attention_report(c, fmt, lens=(600, 2944))
    out[name] = {"errors": r["errors"], "uninitialised": r["uninitialised"]}
print(json.dumps(out))
"""


def test_gluon_attention_consumer_sass_stays_in_bounds():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("TRACE_RL_GATE_TRITON", ""), root,
                                                    env.get("PYTHONPATH", "")) if p)
    probe = subprocess.run([sys.executable, "-c", "import triton; print(triton.__version__)"], env=env,
                           capture_output=True, text=True)
    if not probe.stdout.startswith("3.6"):
        pytest.skip(f"needs Triton 3.6 (Gluon; set TRACE_RL_GATE_TRITON), found {probe.stdout.strip()!r}")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    bad = ("HGMMA B OOB", "smem OOB", "gmem OOB", "tainted", "nonuniform HGMMA desc", "R2UR non-uniform")
    for name in ("default", "lean", "lean_mx"):
        assert not r[name]["uninitialised"], (name, r[name])
        assert not [k for k in r[name]["errors"] if k.startswith(bad) and k != "tainted predicate"], (name, r[name])
    # the detector sees the bug that faulted: k-steps 2 / 3 of the PV wgmma from never-written uniform registers
    assert r["unpadded"]["errors"].get("HGMMA B OOB"), r["unpadded"]
    assert any(k.startswith("UR") for k in r["unpadded"]["uninitialised"]), r["unpadded"]
