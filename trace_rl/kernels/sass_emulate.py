"""Emulate the integer / address side of one CTA's warpgroup through sm_90 SASS (cuobjdump text), on CPU: every
shared-memory access (LDS / STS / LDSM / STSM / SYNCS) and every HGMMA's shared B operand (its descriptor decoded,
swizzle included) is checked against the CTA's dynamic allocation, global accesses against given regions, and
every register read that no executed instruction wrote is recorded (uniform ones are per warp: a value only another
warp's code writes is undefined here). Floating-point results are "tainted" (not computed); an address or a
predicate that depends on one is reported. Branches follow the majority of the active threads (reported).

Why (issue 15): the Gluon attention's LEAN variants faulted with an illegal address on the H200 while their PTX is
clean (every shared / global address in range, checked the same way)
the SASS showed the cause, which no compile
gate sees: with n_pad=8's unswizzled P^T, ptxas builds two of every four PV wgmma descriptors from uniform
registers the consumer warps never write. paged_attention_gluon_emulate.py runs the attention's consumer partition
through it
tests/kernels/test_sass_emulate.py keeps it clean.
"""
import collections
import re

import numpy as np

from trace_rl.kernels.sass_emulate_alu import M32, SassAluOps

LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def parse_sass(text):
    ins = []
    for l in text.splitlines():
        m = LINE.match(l)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    return ins


def split_ops(rest):
    ops, depth, cur = [], 0, ""
    for ch in rest:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            ops.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        ops.append(cur.strip())
    return ops


class SassEmu(SassAluOps):
    def __init__(self, sass, tids, cbank, smem_lo, smem_hi, globals_, ctaid, log=print):
        self.ins = parse_sass(sass)
        self.addr_index = {a: i for i, (a, _) in enumerate(self.ins)}
        self.tids = np.array(tids, dtype=np.int64)
        self.n = len(tids)
        self.lane = self.tids % 32
        self.warp = self.tids // 32
        self.R = collections.defaultdict(lambda: np.zeros(self.n, np.int64))
        self.T = collections.defaultdict(bool)    # taint per register name
        self.P = collections.defaultdict(lambda: np.zeros(self.n, bool))
        self.PT = collections.defaultdict(bool)
        self.cbank = cbank
        self.smem_lo, self.smem_hi = smem_lo, smem_hi
        self.globals = globals_
        self.ctaid = ctaid
        self.log = log
        self.errors = collections.Counter()
        self.samples = {}
        self.unknown = collections.Counter()
        self.stats = collections.Counter()
        self.hgmma = collections.Counter()
        self.uninit = collections.Counter()
        self.uninit_first = {}

    def err(self, kind, msg):
        self.errors[kind] += 1
        if kind not in self.samples:
            self.samples[kind] = msg
            self.log("ERROR", kind, msg)

    # ---- operands
    def rv(self, tok):
        """(value int64 array (32-bit semantics), tainted) of a register/immediate/constant operand."""
        tok = tok.strip().replace(".reuse", "")
        neg = inv = False
        if tok.startswith("-"):
            neg, tok = True, tok[1:]
        if tok.startswith("~"):
            inv, tok = True, tok[1:]
        if tok.startswith("|"):
            tok = tok.strip("|")
        if tok in ("RZ", "URZ"):
            v, t = np.zeros(self.n, np.int64), False
        elif re.match(r"^U?R\d+$", tok):
            if tok not in self.R:
                self.uninit[tok] += 1
                if tok not in self.uninit_first:
                    self.uninit_first[tok] = self.cur
            v, t = self.R[tok], self.T[tok]
        elif re.match(r"^U?R\d+\.(H1|B\d|H0_H0|H1_H1)", tok):
            v, t = np.zeros(self.n, np.int64), True
        elif re.match(r"^-?0x[0-9a-f]+$", tok) or re.match(r"^-?\d+$", tok):
            v, t = np.full(self.n, int(tok, 0) & M32, np.int64), False
        elif tok.startswith("c[0x0]["):
            off = int(tok[7:-1], 16)
            if off in self.cbank:
                v, t = np.full(self.n, self.cbank[off] & M32, np.int64), False
            else:
                v, t = np.zeros(self.n, np.int64), True
        else:   # float immediates etc.
            v, t = np.zeros(self.n, np.int64), True
        if inv:
            v = (~v) & M32
        if neg:
            v = (-v) & M32
        return v.copy(), t

    def pv(self, tok):
        tok = tok.strip()
        neg = tok.startswith("!")
        tok = tok.lstrip("!")
        if tok in ("PT", "UPT"):
            v, t = np.ones(self.n, bool), False
        else:
            v, t = self.P[tok].copy(), self.PT[tok]
        return (~v if neg else v), t

    def setr(self, name, v, t, mask):
        name = name.replace(".reuse", "")
        if name in ("RZ", "URZ"):
            return
        v = np.broadcast_to(np.asarray(v, dtype=np.int64) & M32, (self.n,)).copy()
        if mask is not None and mask.all():      # every thread writes: the old value (and its taint) is gone
            mask = None
        if mask is None:
            self.R[name] = v
            self.T[name] = bool(t)
        else:
            self.R[name] = np.where(mask, v, self.R[name])
            self.T[name] = bool(t) or self.T[name]

    def setp(self, name, v, t, mask):
        if name in ("PT", "UPT"):
            return
        v = np.broadcast_to(np.asarray(v, bool), (self.n,)).copy()
        if mask is not None and mask.all():
            mask = None
        if mask is None:
            self.P[name] = v
            self.PT[name] = bool(t)
        else:
            self.P[name] = np.where(mask, v, self.P[name])
            self.PT[name] = bool(t) or self.PT[name]

    def next_reg(self, name, k=1):
        name = name.replace(".reuse", "")
        m = re.match(r"^(U?R)(\d+)$", name)
        return f"{m.group(1)}{int(m.group(2)) + k}"

    def addr(self, tok):
        """[R2+UR61+0x1413c], [R2.64+0x4], desc[UR6][R4.64] -> (int64 addresses, tainted)"""
        if tok.startswith("desc["):
            tok = tok[tok.index("]") + 1:]
        tok = tok.strip()[1:-1]
        total = np.zeros(self.n, np.int64)
        taint = False
        for part in re.split(r"\+", tok.replace("+-", "+-")):
            part = part.strip()
            if not part:
                continue
            if part.endswith(".64"):
                r = part[:-3]
                lo, t1 = self.rv(r)
                hi, t2 = self.rv(self.next_reg(r))
                total = total + (lo + (hi << 32))
                taint |= t1 or t2
            elif part.endswith(".X4") or part.endswith(".X8") or part.endswith(".X16"):
                r, sc = part.rsplit(".X", 1)
                v, t = self.rv(r)
                total = total + v * int(sc)
                taint |= t
            else:
                v, t = self.rv(part)
                if part.startswith("-0x"):
                    v = v - (1 << 32)
                total = total + v
                taint |= t
        return total, taint

    def check_smem(self, a, nbytes, mask, what, pc):
        if mask is not None and not mask.any():
            return
        aa = a if mask is None else a[mask]
        lo, hi = int(aa.min()), int(aa.max()) + nbytes
        self.stats[what] += 1
        if lo < self.smem_lo or hi > self.smem_hi:
            self.err(f"smem OOB {what}", f"pc {pc:#x} {self.cur[:100]} [{lo:#x}, {hi:#x}) allowed [{self.smem_lo:#x}, "
                                         f"{self.smem_hi:#x})")

    def check_gmem(self, a, nbytes, mask, what, pc):
        act = np.ones(self.n, bool) if mask is None else mask
        for i in np.nonzero(act)[0]:
            ai = int(a[i])
            if not any(b <= ai and ai + nbytes <= b + s for b, s, _ in self.globals):
                self.err(f"gmem OOB {what}", f"pc {pc:#x} {self.cur[:100]} thread {i} addr {ai:#x}")
                return
        self.stats[what] += 1

    # ---- run
    def run(self, start_pc=0, max_steps=2_000_000, stop_pc=None):
        i = self.addr_index[start_pc]
        steps = 0
        while i < len(self.ins) and steps < max_steps:
            pc, s = self.ins[i]
            if stop_pc is not None and pc == stop_pc:
                return pc
            steps += 1
            self.cur = s
            nxt = self.step(pc, s)
            if nxt == "exit":
                return pc
            i = i + 1 if nxt is None else self.addr_index[nxt]
        return self.ins[i][0] if i < len(self.ins) else None

    def step(self, pc, s):
        mask = None
        m = re.match(r"^@(!?U?P[T\d]+)\s+(.*)$", s)
        if m:
            mask, t = self.pv(m.group(1))
            if t:
                self.err("tainted predicate", f"pc {pc:#x} {s[:80]}")
            s = m.group(2)
        parts = s.split(None, 1)
        op = parts[0]
        ops = split_ops(parts[1]) if len(parts) > 1 else []
        base = op.split(".")[0]
        fn = getattr(self, "op_" + base, None)
        if fn is None:
            self.unknown[base] += 1
            if ops and re.match(r"^U?R\d+$", ops[0]):
                self.setr(ops[0], 0, True, mask)
                if ".64" in op or op.startswith(("F2FP",)):
                    pass
            elif ops and re.match(r"^U?P\d$", ops[0]):
                self.setp(ops[0], np.zeros(self.n, bool), True, mask)
            return None
        return fn(pc, op, ops, mask)

    # control
    def op_BRA(self, pc, op, ops, mask):
        tgt = int(ops[-1], 16)
        if mask is None or mask.all():
            return tgt
        if not mask.any():
            return None
        self.err("divergent BRA", f"pc {pc:#x} {mask.sum()}/{self.n}")
        return tgt if mask.sum() * 2 >= self.n else None

    def op_EXIT(self, pc, op, ops, mask):
        return "exit"

    def op_BRX(self, pc, op, ops, mask):
        self.err("BRX", f"pc {pc:#x}")
        return "exit"

    def nop(self, *a):
        return None
    op_NOP = op_BAR = op_BSSY = op_BSYNC = op_WARPSYNC = op_FENCE = op_MEMBAR = op_WARPGROUP = op_BREAK = nop
    op_DEPBAR = op_ERRBAR = op_CCTL = nop

    def op_USETMAXREG(self, pc, op, ops, mask):
        if ops and ops[0].startswith("UP"):
            self.setp(ops[0], np.ones(self.n, bool), False, None)
        return None

    # moves / specials
    def op_MOV(self, pc, op, ops, mask):
        v, t = self.rv(ops[1])
        self.setr(ops[0], v, t, mask)
    op_UMOV = op_MOV

    def op_S2R(self, pc, op, ops, mask):
        sr = ops[1]
        v = {"SR_TID.X": self.tids, "SR_TID.Y": 0, "SR_TID.Z": 0, "SR_CTAID.X": self.ctaid[0],
             "SR_CTAID.Y": self.ctaid[1], "SR_CTAID.Z": 0, "SR_LANEID": self.lane, "SR_CgaCtaId": 0,
             "SR_SWINHI": 0}.get(sr)
        if v is None:
            self.setr(ops[0], 0, True, mask)
            return None
        self.setr(ops[0], np.broadcast_to(np.asarray(v, np.int64), (self.n,)), False, mask)
    op_S2UR = op_S2R

    def op_CS2R(self, pc, op, ops, mask):
        if ops[1] == "SRZ":
            self.setr(ops[0], 0, False, mask)
            if ".32" not in op:
                self.setr(self.next_reg(ops[0]), 0, False, mask)
        else:
            self.setr(ops[0], 0, True, mask)

    def op_LDC(self, pc, op, ops, mask):
        v, t = self.rv(ops[1])
        self.setr(ops[0], v, t, mask)
        if ".64" in op:
            off = int(ops[1][7:-1], 16) + 4
            v2, t2 = self.rv(f"c[0x0][{off:#x}]")
            self.setr(self.next_reg(ops[0]), v2, t2, mask)
    op_ULDC = op_LDC

    def op_R2UR(self, pc, op, ops, mask):
        v, t = self.rv(ops[1])
        for w in np.unique(self.warp):
            sel = self.warp == w
            if not (v[sel] == v[sel][0]).all() and not t:
                self.err("R2UR non-uniform", f"pc {pc:#x} {self.cur}")
        self.setr(ops[0], v, t, mask)

    def op_P2R(self, pc, op, ops, mask):
        # P2R Rd, PR, Rs, mask: the predicates P0..P6 as bits 0..6, merged into Rs under mask
        src, ts = self.rv(ops[2])
        m = int(ops[3], 0)
        bits = np.zeros(self.n, np.int64)
        t = ts
        for i in range(7):
            if m >> i & 1:
                p, tp = self.pv(f"P{i}")
                bits |= p.astype(np.int64) << i
                t |= tp
        self.setr(ops[0], (src & ~m) | (bits & m), t, mask)

    def op_R2P(self, pc, op, ops, mask):
        # R2P PR, Rs, mask: bits 0..6 of Rs into P0..P6 under mask
        src, t = self.rv(ops[1])
        m = int(ops[2], 0)
        for i in range(7):
            if m >> i & 1:
                self.setp(f"P{i}", (src >> i) & 1 == 1, t, mask)

    def op_VOTEU(self, pc, op, ops, mask):
        # VOTEU.ALL UPx, Py  /  VOTEU.ANY
        p, t = self.pv(ops[-1])
        out = np.zeros(self.n, bool)
        for w in np.unique(self.warp):
            sel = self.warp == w
            out[sel] = p[sel].all() if ".ALL" in op else p[sel].any()
        self.setp(ops[0], out, t, mask)


    # memory
    def op_LDS(self, pc, op, ops, mask):
        a, t = self.addr(ops[1])
        if t:
            self.err("tainted LDS addr", f"pc {pc:#x} {self.cur}")
        nb = 16 if ".128" in op else 8 if ".64" in op else 1 if (".U8" in op or ".S8" in op) else 4
        self.check_smem(a, nb, mask, "LDS", pc)
        self.setr(ops[0], 0, True, mask)
        for k in range(1, nb // 4):
            self.setr(self.next_reg(ops[0], k), 0, True, mask)

    def op_STS(self, pc, op, ops, mask):
        a, t = self.addr(ops[0])
        if t:
            self.err("tainted STS addr", f"pc {pc:#x} {self.cur}")
        nb = 16 if ".128" in op else 8 if ".64" in op else 4
        self.check_smem(a, nb, mask, "STS", pc)

    def op_LDSM(self, pc, op, ops, mask):
        a, t = self.addr(ops[1])
        if t:
            self.err("tainted LDSM addr", f"pc {pc:#x} {self.cur}")
        x = int(op.split(".")[-1])
        use = self.lane < 8 * x
        self.check_smem(a, 16, use if mask is None else (use & mask), "LDSM", pc)
        for k in range(x):
            self.setr(self.next_reg(ops[0], k), 0, True, mask)

    def op_STSM(self, pc, op, ops, mask):
        a, t = self.addr(ops[0])
        if t:
            self.err("tainted STSM addr", f"pc {pc:#x} {self.cur}")
        x = int(op.split(".")[-1])
        use = self.lane < 8 * x
        self.check_smem(a, 16, use if mask is None else (use & mask), "STSM", pc)

    def op_SYNCS(self, pc, op, ops, mask):
        mem = [o for o in ops if o.startswith("[")][0]
        a, t = self.addr(mem)
        if t:
            self.err("tainted SYNCS addr", f"pc {pc:#x} {self.cur}")
        self.check_smem(a, 8, mask, "SYNCS", pc)
        if "TRYWAIT" in op or "PHASECHK" in op:
            self.setp(ops[0], np.ones(self.n, bool), False, None)

    def op_LDG(self, pc, op, ops, mask):
        a, t = self.addr(ops[1])
        if t:
            self.err("tainted LDG addr", f"pc {pc:#x} {self.cur}")
        nb = 2 if ".U16" in op else 4
        self.check_gmem(a, nb, mask, "LDG", pc)
        self.setr(ops[0], self.gload(a, nb, mask), False, mask)

    def gload(self, a, nb, mask):
        out = np.zeros(self.n, np.int64)
        for i in range(self.n):
            for b, s, arr in self.globals:
                ai = int(a[i])
                if b <= ai < b + s:
                    out[i] = int.from_bytes(arr[ai - b: ai - b + nb].tobytes(), "little")
        return out

    def op_STG(self, pc, op, ops, mask):
        a, t = self.addr(ops[0])
        if t:
            self.err("tainted STG addr", f"pc {pc:#x} {self.cur}")
        self.check_gmem(a, 2 if ".U16" in op else 4, mask, "STG", pc)

    def op_HGMMA(self, pc, op, ops, mask):
        m = re.search(r"(\d+)x(\d+)x(\d+)", op)
        M, N, K = map(int, m.groups())
        g = [o for o in ops if o.startswith("gdesc[")][0]
        tnsp = ".tnspB" in g
        ur = re.search(r"gdesc\[(UR\d+)\]", g).group(1)
        bl = self.next_reg(ur, 2)
        lo, t1 = self.rv(bl)
        hi, t2 = self.rv(self.next_reg(bl))
        if t1 or t2:
            self.err("tainted HGMMA desc", f"pc {pc:#x} {self.cur}")
        d = int(lo[0]) | (int(hi[0]) << 32)
        if not ((lo == lo[0]).all() and (hi == hi[0]).all()):
            self.err("nonuniform HGMMA desc", f"pc {pc:#x}")
        start = (d & 0x3FFF) * 16
        lbo = ((d >> 16) & 0x3FFF) * 16
        sbo = ((d >> 32) & 0x3FFF) * 16
        swz = d >> 62
        W = {0: 16, 1: 128, 2: 64, 3: 32}[swz]
        addrs = []
        for n in range(N):
            for k in range(K):
                if not tnsp:
                    kb = 2 * k
                    a = start + (n % 8) * 16 + (n // 8) * sbo + (kb // 16) * lbo + kb % 16 if swz == 0 else \
                        start + (n % 8) * W + (n // 8) * sbo + kb
                else:
                    nb = 2 * n
                    a = start + nb % 16 + (nb // 16) * sbo + (k % 8) * 16 + (k // 8) * lbo if swz == 0 else \
                        start + (k % 8) * W + nb % W + (nb // W) * lbo + (k // 8) * sbo
                if swz:
                    bb = {1: 3, 2: 2, 3: 1}[swz]
                    a ^= ((a >> 7) & ((1 << bb) - 1)) << 4
                addrs.append(a)
        lo_, hi_ = min(addrs), max(addrs) + 2
        self.hgmma[(f"{M}x{N}x{K}", tnsp, swz, lbo, sbo)] += 1
        if lo_ < self.smem_lo or hi_ > self.smem_hi:
            self.err("HGMMA B OOB", f"pc {pc:#x} [{lo_:#x}, {hi_:#x}) desc {d:#x} {self.cur}")
        self.stats["HGMMA"] += 1
        r = ops[0]
        for k in range(N // 2):
            self.setr(self.next_reg(r, k), 0, True, None)


def cbank_from_ptx(ptx, values):
    """c[0x0] offsets of the kernel parameters (sm_90: from 0x210), laid out as the .param list."""
    param = r"\.param (?:\.align (\d+) )?\.(\w+)(?: \.ptr \.global \.align \d+)? \w+_param_(\d+)(\[(\d+)\])?"
    params = re.findall(param, ptx)
    off = 0x210
    cb = {0x0: 256, 0x4: 1, 0x8: 1, 0x28: 0xFFFC00}
    for align, ty, idx, _, arr in params:
        size = int(arr) if arr else {"u64": 8, "u32": 4, "f32": 4, "b8": 1}[ty]
        al = int(align) if align else size
        off = (off + al - 1) // al * al
        idx = int(idx)
        v = values.get(idx, 0)
        if size == 8:
            cb[off] = v & M32
            cb[off + 4] = (v >> 32) & M32
        elif size == 4:
            cb[off] = v & M32
        off += size
    return cb
