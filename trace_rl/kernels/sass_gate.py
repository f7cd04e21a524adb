"""Compile gate: compile shipped kernel configurations for sm_90 on any machine (no GPU) and check the SASS
of their main loop. Triton's wheel carries ptxas and cuobjdump, so this runs on CPU.

    python -m trace_rl.kernels.sass_gate                 # every case; exit status 1 if one fails
    python -m trace_rl.kernels.sass_gate --json out.json --only gemm
    PYTHONPATH=/path/to/triton-3.6 python -m trace_rl.kernels.sass_gate   # the H200's Triton

Run it with TRITON_INTERPRET unset (the interpreter replaces `triton.jit` kernels, which then cannot be
compiled); tests/kernels/test_sass_gate.py runs it in a subprocess.

A case (`GateCase`) names a `@triton.jit` kernel, its signature and constexprs, and what one iteration of its
main loop processes per thread (`elements_per_thread`: weight elements for a GEMM, K/V elements for
attention). The gate finds the main loop (the longest backward branch), counts its SASS instructions and
checks (a loop-free kernel, e.g. an element-wise one that holds its whole tile in registers, sets
`whole_kernel`: its every instruction up to the last EXIT counts, against what one program processes per
thread):
- instructions per element <= `budget`;
- no opcode of `forbid` in the loop (default STS / STSM / LDSM: a decoded tile must not go through shared
  memory before the MMA);
- every HGMMA takes its A operand from registers (`HGMMA.* R<n>, gdesc[...]`), when `register_a`;
- at most `max_full_waits` `WARPGROUP.DEPBAR.LE gsb0, 0x0` in the loop (ptxas serialises every wgmma
  when it cannot prove the accumulator untouched in between, C7515, which serialises decode and MMA);
- with `a_in_flight`, no loop instruction writes the A registers of a register-A HGMMA still in flight
  (sass_wgmma_hazard.py: undefined behaviour that gives wrong results, timing-dependent);
- no spill traffic (LDL/STL) in the loop (spills elsewhere are reported, not failed);
- every opcode prefix of `require` somewhere in the kernel (e.g. a warp-specialised kernel's USETMAXREG, mbarrier
  SYNCS and UTMALDG);
- every opcode prefix of `first_before` before the kernel's first global memory access (LDG / STG / generic LD / ST,
  atomics, cp.async, TMA; `first_global_access`): a kernel launched with PDL must pass griddepcontrol.wait (ACQBULK)
  before it reads what the kernel before it wrote, or writes what that kernel may still read.
A `@gluon.jit` kernel compiles through Gluon's source (its `options` can carry e.g. maxnreg).

Adding a case: define `sass_gate_cases() -> list[GateCase]` in your kernel module and list the module in
`GATE_MODULES` (modules that do not exist yet or define no cases are skipped).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

GATE_MODULES = ("trace_rl.kernels.fp4_gemm", "trace_rl.kernels.fp4_gemm_tma", "trace_rl.kernels.fp4_grouped",
                "trace_rl.kernels.fp4_relayout", "trace_rl.kernels.paged_attention",
                "trace_rl.kernels.row_quantize_gate", "trace_rl.kernels.swiglu", "trace_rl.kernels.fp4_dequant",
                "trace_rl.kernels.fp4_gemm_gluon_gate", "trace_rl.kernels.fp4_gemm_wide256_gate",
                "trace_rl.kernels.paged_attention_gluon_gate",
                "trace_rl.kernels.rmsnorm_quantize", "trace_rl.kernels.epilogue_silu_quantize",
                "trace_rl.kernels.operand_cache_fp8",
                "trace_rl.kernels.fp4_grouped_gluon")
_LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_OPCODE = re.compile(r"^(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)")


@dataclass(frozen=True)
class GateCase:
    name: str
    kernel: object                       # the @triton.jit function
    signature: dict                      # argument name -> Triton type string ("*bf16", "i32", ...)
    constexprs: dict
    num_warps: int
    num_stages: int
    elements_per_thread: float           # elements one main-loop iteration processes per thread
    budget: float                        # SASS instructions per element
    divisible: tuple = ()                # arguments assumed divisible by 16 (pointers, strides)
    register_a: bool = True
    forbid: tuple = ("STS", "STSM", "LDSM")
    max_full_waits: int = 1
    whole_kernel: bool = False           # no main loop: count the whole kernel (static, up to the last EXIT)
    options: tuple = ()                  # extra compile options as (name, value) pairs, e.g. (("maxnreg", 128),)
    require: tuple = ()                  # opcode prefixes that must occur somewhere in the kernel's SASS
    innermost: bool = False              # the main loop is a loop holding no other loop (a persistent kernel's tile
                                         # loop inside its work-item loop)
    a_in_flight: bool = False            # check that no loop instruction writes an in-flight HGMMA's A registers
                                         # (sass_wgmma_hazard.py)
    first_before: tuple = ()             # opcode prefixes that must occur before the kernel's first global access


@dataclass
class GateReport:
    name: str
    triton: str
    per_element: float
    loop_instructions: int
    registers: int
    spills: int
    shared_bytes: int
    opcodes: dict = field(default_factory=dict)
    violations: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def _constexpr_defaults(fn, case: GateCase) -> dict:
    """The kernel's constexpr parameters with a default that the case does not name: Triton 3.9's ASTSource leaves
    an unnamed constexpr None (a switch added to a kernel would otherwise break every older gate case of it)."""
    import inspect

    out = {}
    for name, p in inspect.signature(getattr(fn, "fn", fn)).parameters.items():
        if (name not in case.constexprs and name not in case.signature and p.default is not inspect.Parameter.empty
                and "constexpr" in str(p.annotation)):
            out[name] = p.default
    return out


def compile_kernel(case: GateCase):
    """`case` compiled for sm_90 (Triton's CompiledKernel: .asm["ptx"] / ["cubin"], .metadata)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = case.kernel
    if getattr(fn, "is_gluon", lambda: False)():     # a @gluon.jit kernel (Triton >= 3.5): its source is ttgir
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    if not hasattr(fn, "arg_names") or type(fn).__name__ == "InterpretedFunction":
        raise RuntimeError("sass_gate: the kernels were decorated under TRITON_INTERPRET=1 and cannot be "
                           "compiled; run the gate in a process without TRITON_INTERPRET")
    constexprs = {**_constexpr_defaults(fn, case), **case.constexprs}
    sig = {**case.signature, **{k: "constexpr" for k in constexprs}}
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in case.divisible}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=case.num_warps, num_stages=case.num_stages, **dict(case.options)))


def sass_text(cubin: bytes) -> str:
    """cuobjdump -sass of a cubin (Triton's wheel carries cuobjdump)."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout


def compile_sass(case: GateCase) -> tuple[str, dict]:
    """(SASS text, resource usage) of `case` compiled for sm_90: cuobjdump's REG / STACK / SHARED (static) / LOCAL and
    TRITON_SHARED, the shared memory a launch requests (the pipeline's buffers included)."""
    import triton

    kernel = compile_kernel(case)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    res = {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage)}
    res["TRITON_SHARED"] = kernel.metadata.shared     # static + dynamic bytes a launch asks for (occupancy)
    return sass, res


def main_loop(sass: str, innermost: bool = False) -> list[str]:
    """Instructions (text without address) of the main loop: of the backward branches' bodies (branches before
    the last EXIT; with `innermost`, only those whose body holds no other backward branch's), the one with the most
    MMA instructions (HGMMA/HMMA), then the longest."""
    lines = [(int(m.group(1), 16), m.group(2)) for m in map(_LINE.match, sass.splitlines()) if m]
    # ptxas places slow paths out of line after the last EXIT (e.g. a TMA mbarrier's retry loop), branching back
    # into the body: such a branch is no loop and would span the whole kernel
    last_exit = max((a for a, t in lines if re.match(r"(?:@!?U?P\w+\s+)?EXIT\b", t)), default=None)
    loops = []
    for addr, text in lines:
        if last_exit is not None and addr > last_exit:
            continue
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", text)
        target = int(m.group(1), 16) if m and m.group(1) else None
        if target is not None and target < addr:
            loops.append((target, addr))
    if innermost:
        loops = [(t, a) for t, a in loops if not any((t, a) != (t2, a2) and t <= t2 and a2 <= a for t2, a2 in loops)]
    best = (0, 0, 0, -1)
    for target, addr in loops:
        body = [t for a, t in lines if target <= a <= addr]
        mma = sum(1 for t in body if t.startswith(("HGMMA", "HMMA")))
        best = max(best, (mma, len(body), target, addr))
    return [text for a, text in lines if best[2] <= a <= best[3]]


def whole_kernel(sass: str) -> list[str]:
    """Instructions (text without address) of the kernel up to its last EXIT (the self-branch and NOP padding
    after it are no work)."""
    body = [m.group(2) for m in map(_LINE.match, sass.splitlines()) if m]
    last_exit = max((i for i, t in enumerate(body) if re.match(r"(?:@!?U?P\w+\s+)?EXIT\b", t)), default=-1)
    return body[:last_exit + 1]


# Base opcodes (before the first ".") that touch global memory: LDG / STG, generic LD / ST (a generic address may be
# global), global atomics and reductions, cp.async (LDGSTS) and TMA. Shared memory's LDS / STS / LDSM are not.
GLOBAL_ACCESS = ("LDG", "STG", "LD", "ST", "ATOM", "ATOMG", "RED", "REDG", "LDGSTS", "UTMALDG", "UTMASTG", "UBLKCP")


def first_global_access(body: list[str]) -> int | None:
    """Index in `body` (instruction texts) of the first global memory access (`GLOBAL_ACCESS`), or None."""
    for i, text in enumerate(body):
        m = _OPCODE.match(text)
        if m and m.group(1).split(".")[0] in GLOBAL_ACCESS:
            return i
    return None


def first_before_violations(body: list[str], ops: tuple) -> list[str]:
    """What is wrong with `ops` (opcode prefixes) having to come before the first global access of `body`."""
    first = first_global_access(body)
    out = []
    for op in ops:
        at = next((i for i, t in enumerate(body) if (m := _OPCODE.match(t)) and m.group(1).startswith(op)), None)
        if at is None:
            out.append(f"no {op} in the kernel (it must precede the first global access)")
        elif first is not None and at > first:
            out.append(f"{op} (instruction {at}) after the first global access ({body[first]}, instruction {first}): "
                       f"a PDL launch must wait before it reads or writes global memory")
    return out


def inspect(case: GateCase, sass: str, usage: dict) -> GateReport:
    import triton

    body = whole_kernel(sass) if case.whole_kernel else main_loop(sass, case.innermost)
    ops = collections.Counter(m.group(1) for m in map(_OPCODE.match, body) if m)
    rep = GateReport(case.name, triton.__version__, len(body) / case.elements_per_thread, len(body),
                     usage.get("REG", 0), usage.get("STACK", 0) + usage.get("LOCAL", 0), usage.get("SHARED", 0),
                     dict(ops.most_common()))
    if not body:
        rep.violations.append("no EXIT found" if case.whole_kernel else "no main loop found")
        return rep
    if rep.per_element > case.budget:
        rep.violations.append(f"{rep.per_element:.2f} SASS per element > budget {case.budget}")
    for op in ops:
        if op.split(".")[0] in case.forbid:
            rep.violations.append(f"{op} x{ops[op]} in the main loop (a tile goes through shared memory)")
    hgmma = [t for t in body if t.startswith("HGMMA")]
    if case.register_a:
        if not hgmma:
            rep.violations.append("no HGMMA in the main loop")
        bad = [t for t in hgmma if not re.match(r"HGMMA\.\S+\s+R\d+,\s*R\d+,", t)]
        if bad:
            rep.violations.append(f"{len(bad)} HGMMA with a shared-memory A operand: {bad[0]}")
    waits = sum(1 for t in body if re.match(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x0\b", t))
    if waits > case.max_full_waits:
        rep.violations.append(f"{waits} full wgmma waits in the main loop (> {case.max_full_waits}): decode and "
                              f"MMA are serialised")
    every = collections.Counter(m.group(1) for m in map(_OPCODE.match, whole_kernel(sass)) if m)
    for op in case.require:
        if not any(o.startswith(op) for o in every):
            rep.violations.append(f"no {op} in the kernel")
    rep.violations += first_before_violations(whole_kernel(sass), case.first_before)
    if case.a_in_flight:
        from trace_rl.kernels.sass_wgmma_hazard import a_register_hazards

        hazards = a_register_hazards(body)
        if hazards:
            rep.violations.append(f"{len(hazards)} writes of an in-flight HGMMA's A registers in the main loop "
                                  f"(PTX undefined behaviour: wrong results), e.g. {hazards[0]}")
    local = sum(c for op, c in ops.items() if op.startswith(("LDL", "STL")))
    if local:
        rep.violations.append(f"{local} local-memory (spill) accesses in the main loop")
    return rep


def gate_cases(only: list[str] | None = None) -> list[GateCase]:
    cases = []
    for name in GATE_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        for case in getattr(mod, "sass_gate_cases", lambda: [])():
            if not only or any(o in case.name for o in only):
                cases.append(case)
    return cases


def run(only: list[str] | None = None) -> list[GateReport]:
    return [inspect(c, *compile_sass(c)) for c in gate_cases(only)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="sm_90 compile gate (SASS of the shipped kernel configs)")
    ap.add_argument("--only", nargs="*", help="substrings of case names")
    ap.add_argument("--json", help="write the reports here")
    ap.add_argument("--verbose", action="store_true", help="print the opcode counts")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("sass_gate: unset TRITON_INTERPRET (interpreted kernels cannot be compiled)", file=sys.stderr)
        return 2
    reports = run(args.only)
    for r in reports:
        status = "ok  " if r.ok else "FAIL"
        print(f"{status} {r.name:<34} {r.per_element:5.2f} SASS/elem  {r.loop_instructions:5d} instr  "
              f"{r.registers:3d} regs  Triton {r.triton}" + ("" if r.ok else "  " + "; ".join(r.violations)))
        if args.verbose:
            print("     ", dict(list(r.opcodes.items())[:16]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in reports], f, indent=1)
    return 0 if reports and all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
