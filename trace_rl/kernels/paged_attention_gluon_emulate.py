"""The Gluon FP4-KV decode attention's consumer partition (paged_attention_gluon._decode_attention_ws_kernel, tids
0-127) run through the SASS emulator (sass_emulate.py) for a few sequence lengths, on CPU (Triton 3.6's compiler):
shared / global accesses and HGMMA B operands out of the allocation, registers read before any write (issue 15:
n_pad=8's P^T as an unswizzled [T, 8] N-major operand made ptxas read two of every four PV wgmma descriptors from
uniform registers only the producer warp's code writes: an illegal address on the H200; P^T is K-major since).
tests/kernels/test_sass_emulate.py runs it.

    PYTHONPATH=/work/triton36:$PWD python -m trace_rl.kernels.paged_attention_gluon_emulate
"""

from __future__ import annotations

import collections
import struct

import numpy as np

from trace_rl.kernels.sass_emulate import SassEmu, cbank_from_ptx

LENS = (600, 2944, 129)        # full tiles 4 (+ tail), 23 (odd: the unrolled loop's leftover), 1 (+ tail)


def gluon_attention_report(config, kv_format: str = "nvfp4:row", group: int = 4, lens=LENS) -> dict:
    """Compile the one-program-per-(kv head, sequence) kernel for `config` (sm_90, Triton 3.6) and emulate its
    consumer warpgroup (tids 0-127) for one kv head of each sequence length: errors (kind -> count), the first of
    each, uninitialised register reads (uniform and vector: name -> first instruction) and the HGMMA B operand
    descriptors seen (shape, transposed, swizzle, LBO, SBO)."""
    from trace_rl.kernels.paged_attention_gluon_gate import gate_case
    from trace_rl.kernels.sass_gate import compile_kernel, sass_text

    if config.persistent:
        raise ValueError("gluon_attention_report emulates the one-program-per-(kv head, sequence) kernel only")
    kernel = compile_kernel(gate_case(config, group, kv_format=kv_format))
    ptx, sass, shared = kernel.asm["ptx"], sass_text(kernel.asm["cubin"]), kernel.metadata.shared
    hkv, D, B = 8, 128, len(lens)
    maxp = max(-(-n // 64) for n in lens) + 1
    bt = np.full((B, maxp), 10 ** 6, np.int32)
    used = 0
    for b, n in enumerate(lens):
        p = -(-n // 64)
        bt[b, :p] = np.arange(used, used + p)
        used += p
    QB, OB, BTB, LB = 1 << 32, 2 << 32, 3 << 32, 4 << 32
    arrays = ((QB, np.zeros((B, hkv * group, D), np.uint16)), (OB, np.zeros((B, hkv * group, D), np.uint16)),
              (BTB, bt), (LB, np.array(lens, np.int32)))
    regions = [(base, a.nbytes, np.frombuffer(a.tobytes(), np.uint8)) for base, a in arrays]
    params = {0: QB, 1: OB, 2: BTB, 3: LB, 46: struct.unpack("<I", struct.pack("<f", 0.1))[0], 47: hkv * group * D,
              48: D, 49: hkv * group * D, 50: D, 51: maxp}
    out = {"shared": shared, "errors": collections.Counter(), "first": {}, "uninitialised": {}, "hgmma": set()}
    for b in range(B):
        emu = SassEmu(sass, list(range(128)), cbank_from_ptx(ptx, params), 0x400, 0x400 + shared, regions, (1, b, 0),
                      log=lambda *a: None)
        emu.run(0)
        out["errors"].update(emu.errors)
        for k, v in emu.samples.items():
            out["first"].setdefault(k, v)
        for k, v in emu.uninit_first.items():
            if not v.startswith("PRMT"):     # PRMT Rx, RZ, 0x7610, Rx: ptxas's half-register init, reads its own dst
                out["uninitialised"].setdefault(k, v)
        out["hgmma"].update(emu.hgmma)
    out["errors"] = dict(out["errors"])
    out["hgmma"] = sorted(out["hgmma"])
    return out


def main() -> int:
    import json

    from trace_rl.kernels.paged_attention_gluon import DEFAULT, LEAN, LEAN_CHECKED

    for name, c in (("default", DEFAULT), ("lean", LEAN), ("lean_checked", LEAN_CHECKED)):
        for fmt in ("nvfp4:row", "mxfp4"):
            if c.mx_checked and fmt != "mxfp4":
                continue
            r = gluon_attention_report(c, fmt)
            print(name, fmt, json.dumps({k: r[k] for k in ("errors", "first", "uninitialised", "hgmma")}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
