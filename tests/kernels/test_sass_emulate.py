"""The SASS emulator (trace_rl/kernels/sass_emulate.py): on a hand-written snippet of the instruction pattern that made
the Gluon attention's LEAN variant fault on the H200 (issue 15: a PV wgmma descriptor built from uniform registers
the consumer warps never write, read as shared memory below the CTA's allocation), and, with Triton 3.6, on the
Gluon attention's consumer partition (paged_attention_gluon_emulate.py): the shipped config and LEAN (its N = 8 P^T
stored K-major) read no register before writing it and touch no shared memory outside the allocation."""

import json
import os
import subprocess
import sys

import pytest

from trace_rl.kernels.sass_emulate import SassEmu

# the unpadded LEAN build's PV descriptor for k-step 2 (2026-12-02): UR38:39 written only by the producer warp's code
FAULTING = """
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   UMOV UR4, 0x400 ;
        /*0020*/                   UIADD3 UR38, UP0, UR38, 0x80020, URZ ;
        /*0030*/                   UIADD3.X UR39, UR39, 0x80000, URZ, UP0, !UPT ;
        /*0040*/                   HGMMA.64x8x16.F32.BF16 R24, R104, gdesc[UR36].tnspB, R24 ;
        /*0050*/                   LEA R2, R0, UR4, 0x2 ;
        /*0060*/                   LDS R3, [R2+0x100] ;
        /*0070*/                   STS [R2+0x1000], R3 ;
        /*0080*/                   EXIT ;
"""


def test_emulator_catches_uninitialised_descriptor_and_out_of_range_shared():
    emu = SassEmu(FAULTING, list(range(128)), {}, 0x400, 0x400 + 4096, [], (0, 0, 0), log=lambda *a: None)
    emu.run(0)
    assert {"UR38", "UR39"} <= set(emu.uninit_first), emu.uninit_first        # read before any write in this warp
    assert emu.errors.get("HGMMA B OOB"), emu.errors                            # start 0x200: below the allocation
    assert emu.errors.get("smem OOB STS") and not emu.errors.get("smem OOB LDS"), emu.errors  # 0x1400 + 4 tid > 0x1400


SCRIPT = """
import json
from trace_rl.kernels.paged_attention_gluon import DEFAULT, LEAN, LEAN_CHECKED, GluonAttentionConfig
from trace_rl.kernels.paged_attention_gluon_emulate import gluon_attention_report
out = {}
for name, c, fmt in (("default", DEFAULT, "nvfp4:row"), ("lean", LEAN, "nvfp4:row"), ("lean_mx", LEAN, "mxfp4"),
                     ("n8", GluonAttentionConfig(n_pad=8), "nvfp4:row"), ("lean_checked", LEAN_CHECKED, "mxfp4")):
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
    for name, rep in r.items():
        assert not rep["uninitialised"], (name, rep)
        # what may remain: branches that split the warpgroup (followed by majority), FP-valued predicates
        assert set(rep["errors"]) <= {"divergent BRA", "tainted predicate"}, (name, rep)
