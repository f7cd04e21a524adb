"""The integer ALU, predicate and FP-taint instructions of the SASS emulator (sass_emulate.SassEmu mixes this in):
IMAD / IADD3 (carries, UIADD3.64) / LOP3 / PLOP3 / SHF / LEA (.HI / .X) / SEL / SGXT / PRMT / ISETP / SHFL and
their uniform forms, computed per thread in int64 with 32-bit results; FP results are tainted, not computed."""

import re

import numpy as np

M32 = 0xFFFFFFFF


class SassAluOps:

    # integer
    def op_IMAD(self, pc, op, ops, mask):
        if ".WIDE" in op:
            a, ta = self.rv(ops[1])
            b, tb = self.rv(ops[2])
            c_lo, tc = self.rv(ops[3])
            c_hi, tc2 = (self.rv(self.next_reg(ops[3].replace(".reuse", ""))) if re.match(r"^U?R\d+", ops[3])
                         else (np.zeros(self.n, np.int64), False))
            if ".U32" in op:
                prod = a * b
            else:
                sa = np.where(a >= 1 << 31, a - (1 << 32), a)
                sb = np.where(b >= 1 << 31, b - (1 << 32), b)
                prod = sa * sb
            r = prod + c_lo + (c_hi << 32)
            self.setr(ops[0], r & M32, ta or tb or tc or tc2, mask)
            self.setr(self.next_reg(ops[0]), (r >> 32) & M32, ta or tb or tc or tc2, mask)
            return None
        if ".HI" in op or ".X" in op:
            self.setr(ops[0], 0, True, mask)
            return None
        a, ta = self.rv(ops[1])
        b, tb = self.rv(ops[2])
        c, tc = self.rv(ops[3])
        self.setr(ops[0], a * b + c, ta or tb or tc, mask)
    op_UIMAD = op_IMAD

    def op_VIADD(self, pc, op, ops, mask):
        a, ta = self.rv(ops[1])
        b, tb = self.rv(ops[2])
        self.setr(ops[0], a + b, ta or tb, mask)

    def _carry_ops(self, ops):
        dst = ops[0]
        rest = ops[1:]
        cps = []
        while rest and re.match(r"^!?U?P[T\d]+$", rest[0]):
            cps.append(rest.pop(0))
        return dst, cps, rest

    def op_IADD3(self, pc, op, ops, mask):
        if ".64" in op:     # UIADD3.64 URd, URa, URb|imm, URZ: 64-bit pairs
            def v64(tok):
                if re.match(r"^U?R\d+$", tok.replace(".reuse", "")) and tok not in ("RZ", "URZ"):
                    lo, t1 = self.rv(tok)
                    hi, t2 = self.rv(self.next_reg(tok))
                    return lo.astype(np.uint64) + (hi.astype(np.uint64) << np.uint64(32)), t1 or t2
                v, t = self.rv(tok)
                v = v.astype(np.uint64)
                if tok.startswith("-"):
                    v = v + np.uint64(0xFFFFFFFF00000000)
                return v, t
            a, ta = v64(ops[1])
            b, tb = v64(ops[2])
            c, tc = v64(ops[3])
            r = a + b + c
            self.setr(ops[0], (r & np.uint64(M32)).astype(np.int64), ta or tb or tc, mask)
            self.setr(self.next_reg(ops[0]), (r >> np.uint64(32)).astype(np.int64), ta or tb or tc, mask)
            return None
        dst, cps, rest = self._carry_ops(ops)
        vals = []
        t = False
        ins = rest[:3]
        for x in ins:
            v, tt = self.rv(x)
            vals.append(v)
            t |= tt
        s = vals[0] + vals[1] + vals[2]
        if ".X" in op:   # carry-in predicates after the 3 sources
            for cp in rest[3:]:
                p, tp = self.pv(cp)
                if cp.startswith("!"):
                    continue
                s = s + p.astype(np.int64)
                t |= tp
        self.setr(dst, s, t, mask)
        if cps:
            self.setp(cps[0], (s >> 32) > 0, t, mask)
    op_UIADD3 = op_IADD3

    def op_LOP3(self, pc, op, ops, mask):
        pdst = None
        if re.match(r"^U?P[T\d]+$", ops[0]):
            pdst, ops = ops[0], ops[1:]
        a, ta = self.rv(ops[1])
        b, tb = self.rv(ops[2])
        c, tc = self.rv(ops[3])
        lut = int(ops[4], 16)
        r = np.zeros(self.n, np.int64)
        for bit in range(8):
            if lut >> bit & 1:
                ma = a if bit & 4 else (~a & M32)
                mb = b if bit & 2 else (~b & M32)
                mc = c if bit & 1 else (~c & M32)
                r |= ma & mb & mc
        self.setr(ops[0], r, ta or tb or tc, mask)
        if pdst:
            self.setp(pdst, r != 0, ta or tb or tc, mask)
    op_ULOP3 = op_LOP3

    def op_PLOP3(self, pc, op, ops, mask):
        a, ta = self.pv(ops[2])
        b, tb = self.pv(ops[3])
        c, tc = self.pv(ops[4])
        lut = int(ops[5], 16)
        r = np.zeros(self.n, bool)
        for bit in range(8):
            if lut >> bit & 1:
                r |= (a if bit & 4 else ~a) & (b if bit & 2 else ~b) & (c if bit & 1 else ~c)
        self.setp(ops[0], r, ta or tb or tc, mask)
    op_UPLOP3 = op_PLOP3

    def op_SHF(self, pc, op, ops, mask):
        a, ta = self.rv(ops[1])
        sh, ts = self.rv(ops[2])
        c, tc = self.rv(ops[3])
        sh = sh & 63
        if ".L" in op:
            if ".U64" in op or ".HI" in op:      # funnel: high word of ({c, a} << sh)
                full = (c << 32) | a
                r = ((full << np.minimum(sh, 63)) >> 32) & M32 if ".HI" in op else (full << sh) & M32
            else:
                r = np.where(sh >= 32, 0, (a << sh) & M32)
        else:
            if ".S32" in op:
                sc = np.where(c >= 1 << 31, c - (1 << 32), c)
                r = (sc >> np.minimum(sh, 31)) & M32
            elif ".S64" in op:
                full = (c << 32) | a
                full = np.where(full >= 1 << 63, full - (1 << 64), full) if False else full
                r = (full >> sh) & M32
            elif ".HI" in op:
                r = np.where(sh >= 32, 0, c >> np.minimum(sh, 31))
            else:
                full = (c << 32) | a
                r = (full >> sh) & M32
        self.setr(ops[0], r, ta or ts or tc, mask)
    op_USHF = op_SHF

    def op_LEA(self, pc, op, ops, mask):
        dst, cps, rest = self._carry_ops(ops)
        a, ta = self.rv(rest[0])
        b, tb = self.rv(rest[1])
        if ".HI" in op:
            if ".X" in op:
                # LEA.HI.X Rd, Ra, Rb, Rc, sh, Pcarry : Rb + ({Rc:Ra} << sh >> 32) + carry
                if ".SX32" in op:
                    sh = int(rest[2], 0)
                    cin = rest[3] if len(rest) > 3 else None
                    sa = np.where(a >= 1 << 31, a - (1 << 32), a)
                    hi = ((sa << sh) >> 32) & M32
                else:
                    c, tc = self.rv(rest[2])
                    sh = int(rest[3], 0)
                    cin = rest[4] if len(rest) > 4 else None
                    hi = ((((c << 32) | a) << sh) >> 32) & M32
                    ta |= tc
                r = b + hi
                if cin and not cin.startswith("!") and cin not in ("PT", "UPT"):
                    p, tp = self.pv(cin)
                    r = r + p.astype(np.int64)
                elif cin in ("PT", "UPT"):
                    pass
                self.setr(dst, r, ta or tb, mask)
                return None
            c, tc = self.rv(rest[2])
            sh = int(rest[3], 0)
            r = b + (((((c << 32) | a) << sh) >> 32) & M32)
            self.setr(dst, r, ta or tb or tc, mask)
            if cps:
                self.setp(cps[0], (r >> 32) > 0, ta or tb, mask)
            return None
        sh = int(rest[2], 0)
        r = (a << sh) + b
        self.setr(dst, r, ta or tb, mask)
        if cps:
            self.setp(cps[0], (r >> 32) > 0, ta or tb, mask)
    op_ULEA = op_LEA

    def op_SEL(self, pc, op, ops, mask):
        a, ta = self.rv(ops[1])
        b, tb = self.rv(ops[2])
        p, tp = self.pv(ops[3])
        self.setr(ops[0], np.where(p, a, b), ta or tb or tp, mask)
    op_USEL = op_SEL

    def op_SGXT(self, pc, op, ops, mask):
        a, ta = self.rv(ops[1])
        n, tn = self.rv(ops[2])
        r = a & ((1 << n) - 1)
        if ".U32" not in op:
            r = np.where(r >> (n - 1) & 1, r - (1 << n), r) & M32
        self.setr(ops[0], r, ta or tn, mask)
    op_USGXT = op_SGXT

    def op_PRMT(self, pc, op, ops, mask):
        a, ta = self.rv(ops[1])
        sel, ts = self.rv(ops[2])
        b, tb = self.rv(ops[3])
        if ts or len(np.unique(sel)) > 1:
            self.setr(ops[0], 0, True, mask)
            return None
        sv = int(sel[0])
        src = a | (b << 32)
        r = np.zeros(self.n, np.int64)
        for i in range(4):
            s_ = (sv >> (4 * i)) & 7
            r |= ((src >> (8 * s_)) & 0xFF) << (8 * i)
        self.setr(ops[0], r, ta or tb, mask)

    def op_ISETP(self, pc, op, ops, mask):
        # ISETP.GE.AND P0, PT, a, b, PT   (.U32, .EX)
        cmp = op.split(".")[1]
        a, ta = self.rv(ops[2])
        b, tb = self.rv(ops[3])
        if ".U32" not in op:
            a = np.where(a >= 1 << 31, a - (1 << 32), a)
            b = np.where(b >= 1 << 31, b - (1 << 32), b)
        r = {"GE": a >= b, "GT": a > b, "LE": a <= b, "LT": a < b, "EQ": a == b, "NE": a != b}[cmp]
        t = ta or tb
        if ".EX" in op:
            t = True
        comb, tc = self.pv(ops[4])
        r = (r & comb) if ".AND" in op else (r | comb) if ".OR" in op else (r ^ comb)
        self.setp(ops[0], r, t or tc, mask)
        if ops[1] not in ("PT", "UPT"):
            self.setp(ops[1], ~r, t or tc, mask)
    op_UISETP = op_ISETP

    def op_SHFL(self, pc, op, ops, mask):
        # SHFL.BFLY PT, Rd, Ra, lanemask, clamp
        d = ops[1]
        v, t = self.rv(ops[2])
        l, tl = self.rv(ops[3])
        if ".BFLY" in op:
            src = self.lane ^ l
        elif ".IDX" in op:
            src = l & 31
        elif ".DOWN" in op:
            src = np.minimum(self.lane + l, 31)
        else:
            src = np.maximum(self.lane - l, 0)
        idx = self.warp * 32 + src
        pos = {int(x): i for i, x in enumerate(self.tids)}
        out = np.array([v[pos[int(k)]] for k in idx], np.int64)
        self.setr(d, out, t or tl, mask)

    # FP: taint destination
    def ftaint(self, pc, op, ops, mask):
        if ops and re.match(r"^U?R\d+$", ops[0]):
            self.setr(ops[0], 0, True, mask)
        elif ops and re.match(r"^U?P\d$", ops[0]):
            self.setp(ops[0], np.zeros(self.n, bool), True, mask)
    op_FMUL = op_FFMA = op_FADD = op_FMNMX = op_MUFU = op_HMUL2 = op_HFMA2 = op_F2FP = op_FSEL = ftaint
    op_FSETP = op_I2F = op_F2I = op_FCHK = op_HADD2 = ftaint
