"""Where the SASS of a kernel's main loop goes, by instruction class (compile-only, no GPU): the breakdown behind
docs/benchmarks.md's "Decode attention" table (issue 15: the Gluon FP4-KV decode attention is issue-bound, so its
time follows the loop's instruction count per K/V element).

    TRACE_RL_GATE_TRITON=/work/triton36 PYTHONPATH=/work/triton36:$PWD python -m trace_rl.kernels.sass_histogram
    ... --only "nvfp4 g4 s4" --json out.json          # cases of the compile gate (sass_gate.py), by name substring

Classes (`classify`, one per instruction; the order of the rules below decides ties):
- decode: the E2M1 code extraction (LOP3 / SHF / IMAD.SHL / PRMT / SGXT) and the scale pairs (nvfp4's
  `mad` by 16 / 2**28 -> LEA / LEA.HI with 0x7680 in them, mxfp4's IMAD by 0x800080, VIMNMX of the folded pairs);
- scale: the bf16x2 multiplies (HMUL2 / HFMA2): code x scale pair, mxfp4's 2**125 bias;
- wgmma: HGMMA and WARPGROUP.ARRIVE / DEPBAR (the waits);
- loads: LDS / LDSM / LDG / LDGSTS / UTMALDG (the slot's words, scales, per-token factors, the cross-warp max);
- softmax: FMNMX / MUFU / FADD / FMUL / FFMA / FSEL / FSETP / SHFL / F2FP and the P^T / cross-warp-max stores
  (STSM / STS);
- sync: BAR / SYNCS (mbarrier) / MEMBAR / FENCE / BSSY / BSYNC / WARPSYNC;
- moves: MOV / IMAD.MOV / UMOV / CS2R / IMAD.U32 Rd, RZ, RZ, URn (register copies, zeroing);
- bookkeeping: everything else (IADD3 / VIADD / ISETP / BRA / LEA / IMAD address math / R2UR / UIADD3 ...).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys

CLASSES = ("decode", "scale", "wgmma", "loads", "softmax", "sync", "moves", "bookkeeping")
_OP = re.compile(r"^(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)")


def classify(text: str) -> str:
    """The class of one SASS instruction (its text without the address)."""
    m = _OP.match(text)
    op = m.group(1) if m else ""
    base = op.split(".")[0]
    if base in ("HMUL2", "HFMA2"):
        return "scale"
    if base in ("HGMMA", "WARPGROUP"):
        return "wgmma"
    if base in ("LDS", "LDSM", "LDG", "LDGSTS", "UTMALDG", "LDC", "ULDC"):
        return "loads"
    if base in ("FMNMX", "MUFU", "FADD", "FMUL", "FFMA", "FSEL", "FSETP", "SHFL", "F2FP", "STSM", "STS"):
        return "softmax"
    if base in ("BAR", "SYNCS", "MEMBAR", "FENCE", "BSSY", "BSYNC", "WARPSYNC", "DEPBAR"):
        return "sync"
    if op in ("MOV", "IMAD.MOV.U32", "IMAD.MOV", "UMOV", "CS2R") or \
            re.match(r"(?:@!?U?P\w+\s+)?IMAD\.U32 R\d+, RZ, RZ, UR?Z?\d*", text):
        return "moves"
    if base in ("LOP3", "SHF", "PRMT", "SGXT", "VIMNMX") or op == "IMAD.SHL.U32":
        return "decode"
    if base in ("LEA", "IMAD") and re.search(r"0x76807680|0x800080|0x1f801f80", text, re.I):
        return "decode"                      # the scale pairs' multiply-adds
    return "bookkeeping"


def histogram(body: list[str], elements_per_thread: float) -> dict:
    """{class: {"count", "per_element", "opcodes": {opcode: count}}} of a loop body, plus "total"."""
    out = {c: {"count": 0, "opcodes": collections.Counter()} for c in CLASSES}
    for text in body:
        c = classify(text)
        m = _OP.match(text)
        out[c]["count"] += 1
        out[c]["opcodes"][m.group(1) if m else text] += 1
    for c in CLASSES:
        out[c]["per_element"] = out[c]["count"] / elements_per_thread
        out[c]["opcodes"] = dict(out[c]["opcodes"].most_common())
    out["total"] = {"count": len(body), "per_element": len(body) / elements_per_thread}
    return out


def case_histogram(case) -> dict:
    from trace_rl.kernels.sass_gate import compile_sass, main_loop

    sass, usage = compile_sass(case)
    h = histogram(main_loop(sass, case.innermost), case.elements_per_thread)
    h["registers"] = usage.get("REG", 0)
    h["spills"] = usage.get("STACK", 0) + usage.get("LOCAL", 0)
    return h


def table(rows: dict) -> str:
    """A markdown table: one column per case, one row per class (SASS per K/V element, count in the loop)."""
    names = list(rows)
    lines = ["| class | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for c in CLASSES + ("total",):
        cells = [f"{rows[n][c]['per_element']:.2f} ({rows[n][c]['count']})" for n in names]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="SASS class histogram of the Gluon attention's main loop (sm_90)")
    ap.add_argument("--only", nargs="*", default=["attention gluon ws"], help="substrings of gate case names")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from trace_rl.kernels.sass_gate import gate_cases

    cases = gate_cases(args.only)
    if not cases:
        print("sass_histogram: no gate case matches (Triton 3.6 needed: set TRACE_RL_GATE_TRITON / PYTHONPATH)",
              file=sys.stderr)
        return 2
    rows = {c.name: case_histogram(c) for c in cases}
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
