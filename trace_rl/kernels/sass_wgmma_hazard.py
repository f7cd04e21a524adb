"""Static SASS check: no instruction of a loop writes the A registers of a register-A HGMMA still in flight.

Why: a register-A wgmma (`HGMMA.64xNx16 Racc, Ra, gdesc[..]`) reads its A operand registers Ra .. Ra+3
asynchronously, until a `WARPGROUP.DEPBAR.LE gsb0, n` has retired its group; PTX calls writing them earlier
undefined behaviour, and ptxas does not protect a register that the PTX itself redefines. fp4_gemm_wide256's
first overlap loop did exactly that (one decode step per iteration: the decoded operand was the same SSA value, hence
the same PTX registers, every iteration, rewritten by the next step's decode under wait(1)): nan / inf on the
H200 at the 256-token tile (its HGMMAs are the longest), timing-masked at 64 / 128 tokens. This catches it on CPU.

The model: walk the loop body twice (the second pass sees what the previous iteration left in flight); HGMMAs add
their A registers to the open group, `gsb0` on an HGMMA commits the group, `WARPGROUP.DEPBAR.LE gsb0, n` keeps only
the n most recent groups in flight; any other instruction's destination registers must not meet an in-flight
(or open) group's. Destinations: the first operand when it is a register (not for stores, barriers, branches),
.64 / .128 / WIDE widen it.
"""

from __future__ import annotations

import re

_HGMMA = re.compile(r"HGMMA\.\S+\s+R(\d+),\s*R(\d+),")
_DEPBAR = re.compile(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x([0-9a-f]+)")
_PRED = re.compile(r"^@!?U?P\w+\s+")
_NO_DEST = ("ST", "STS", "STG", "STL", "RED", "BAR", "BRA", "SYNCS", "WARPGROUP", "MEMBAR", "FENCE", "NOP",
            "EXIT", "RET", "CALL", "UTMALDG", "UTMASTG", "UBLKCP", "ARRIVES", "DEPBAR", "WARPSYNC", "BSYNC",
            "BSSY", "YIELD", "USETMAXREG", "ERRBAR", "CCTL")


def _dest_registers(text: str) -> set[int]:
    body = _PRED.sub("", text)
    parts = body.split(None, 1)
    if len(parts) < 2:
        return set()
    opcode, operands = parts
    if opcode.split(".")[0] in _NO_DEST:
        return set()
    m = re.match(r"R(\d+)\b", operands.strip())
    if not m:
        return set()
    first = int(m.group(1))
    width = 4 if ".128" in opcode else 2 if (".64" in opcode or ".WIDE" in opcode) else 1
    return set(range(first, first + width))


def a_register_hazards(body: list[str]) -> list[str]:
    """Instructions of the loop `body` (SASS text without addresses, sass_gate.main_loop) that write an in-flight
    HGMMA's A registers, as 'instruction (writes R.. of the HGMMA group committed at ..)'; empty when safe."""
    groups: list[tuple[set[int], str]] = []       # committed, in flight: (A registers, committing HGMMA)
    open_regs: set[int] = set()
    hazards: list[str] = []
    for _pass in range(2):       # twice: the loop body wraps around (its back edge)
        for text in body:
            bare = _PRED.sub("", text)
            m = _HGMMA.match(bare)
            if m:
                a = int(m.group(2))
                open_regs |= set(range(a, a + 4))
                if "gsb0" in bare:
                    groups.append((open_regs, bare))
                    open_regs = set()
                continue
            m = _DEPBAR.match(bare)
            if m:
                keep = int(m.group(1), 16)
                groups = groups[len(groups) - keep:] if keep else []
                continue
            dest = _dest_registers(text)
            if not dest:
                continue
            for regs, where in groups + [(open_regs, "(open group)")]:
                hit = dest & regs
                if hit:
                    msg = f"{text} writes R{min(hit)} of the in-flight HGMMA group of {where}"
                    if msg not in hazards:
                        hazards.append(msg)
    return hazards
