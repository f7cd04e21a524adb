"""The sm_90 compile gate (trace_rl/kernels/sass_gate.py) on the shipped kernel configurations, on CPU.

It compiles in a subprocess without TRITON_INTERPRET (interpreted kernels cannot be compiled). It uses the
installed Triton, or the one at $TRACE_RL_GATE_TRITON (a directory put first on PYTHONPATH: the H200's
Triton 3.6, e.g. /work/triton36); `tox -e gate36` runs it with triton==3.6.0. $TRACE_RL_GATE_ONLY (substrings of
case names, separated by "|", e.g. "small grid q|small grid p5") restricts it to those cases (the gate CLI's --only).
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
    only = [o for o in os.environ.get("TRACE_RL_GATE_ONLY", "").split("|") if o]
    proc = subprocess.run([sys.executable, "-m", "trace_rl.kernels.sass_gate", "--json", str(out)] +
                          (["--only", *only] if only else []),
                          env=_gate_env(), capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stdout + proc.stderr[-3000:]
    reports = json.loads(out.read_text())
    if only and not reports:     # e.g. Gluon cases under a Triton other than 3.6 (fp4_gemm_gluon_gate.py)
        pytest.skip(f"no gate case of this Triton matches {only}")
    assert only or any(r["name"].startswith("gemm") for r in reports)
    assert proc.returncode == 0, proc.stdout
    for r in reports:
        assert not r["violations"], (r["name"], r["violations"])


def _sass(*instructions: str) -> str:
    """cuobjdump-style text of `instructions`, one per line at consecutive addresses."""
    return "\n".join(f"        /*{16 * i:04x}*/                   {t} ;" for i, t in enumerate(instructions))


def test_first_before_rule_on_synthetic_sass():
    """`GateCase.first_before`: an opcode (a PDL launch's wait, ACQBULK) must come before the kernel's first global
    access; shared-memory and constant loads do not count, predicated and generic accesses do."""
    from trace_rl.kernels.sass_gate import first_before_violations, first_global_access, whole_kernel

    ok = whole_kernel(_sass("LDC R1, c[0x0][0x28]", "S2R R2, SR_TID.X", "LDS R3, [R2]", "PREEXIT", "ACQBULK",
                            "LDG.E.128 R4, desc[UR4][R2.64]", "STG.E [R2.64], R4", "EXIT", "BRA 0x70"))
    assert first_global_access(ok) == 5
    assert first_before_violations(ok, ("ACQBULK", "PREEXIT")) == []
    late = whole_kernel(_sass("S2R R2, SR_TID.X", "@P0 LDG.E R4, desc[UR4][R2.64]", "ACQBULK", "STG.E [R2.64], R4",
                              "EXIT"))
    (v, ) = first_before_violations(late, ("ACQBULK", ))
    assert "after the first global access" in v and "LDG.E" in v
    generic = whole_kernel(_sass("ST.E [R2.64], R4", "ACQBULK", "EXIT"))
    assert first_before_violations(generic, ("ACQBULK", ))
    (missing, ) = first_before_violations(ok, ("USETMAXREG", ))
    assert missing.startswith("no USETMAXREG")
    assert first_before_violations(whole_kernel(_sass("ACQBULK", "EXIT")), ("ACQBULK", )) == []   # no global access
