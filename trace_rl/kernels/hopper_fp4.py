"""The Hopper FP4 weight layout: NVFP4/MXFP4 weights arranged for a shift/mask decode straight into wgmma's
register A operand. Pure torch (no Triton): this file is the layout's spec and its reference.

`to_hopper(q)` derives it from a reference `QTensor` (codes [N, K/2], scales, global scale), once per weight
sync (`PackedWeight.layout["hopper_fp4"]`); the reference `q` stays (CPU path, tests, TRACE guidance).

**Values**: int32 `values[Np/16, 2 * Kp]` (N padded to 16 rows, K to 128 with zero codes). A 16-row x
128-column block is 256 words: word `h * 128 + (4 g + t) * 4 + i` of block (n16, kc) holds the 8 codes of row
`16 n16 + 8 h + g` at columns `128 kc + 16 (2 i + r) + 8 c + 2 t + e`, (r, c, e) in {0, 1}^3. That is lane
(g, t) of the warp whose rows these are, wgmma K-slices 2i and 2i+1, its A-fragment registers
(c: columns +8) holding the column pair e = 0, 1: a thread's 16-byte load is four words = its fragment
over 8 K-slices, so the decoded registers feed `HGMMA` without a trip through shared memory.
Within a word, slot (r, c) -> A (0,0), B (0,1), C (1,0), D (1,1); e picks the 16-bit half. A code
`s e1 e0 m` is placed so that a rotation and a mask land it on bf16 bits 15 (sign), 8, 7 (exponent) and 6
(mantissa), i.e. bf16 = E2M1 value x 2**-126 (0.5 is a bf16 subnormal):
    A = x & 0x81C081C0                  B = rotr(x, 4) & 0x81C081C0       C = rotr(x, 10) & 0x81C081C0
    D = (rotr(x, 6) & 0x81808180) | (rotr(x, 14) & 0x00400040)
9 integer instructions per 8 codes (triton_kernels' HOPPER_VALUE twiddle takes 11; no rotation offsets give
fewer: checked exhaustively).

**Scales**, one byte per block, pre-biased so that one multiply-add gives the bf16x2 scale pair:
- nvfp4 (E4M3, blocks of 16): `scales[Np, Kp/16]`, byte = (E + 10) << 3 | mmm for a scale 1.mmm x 2**E
  (E4M3 subnormals normalised: E in [-9, 8]), 0 for a zero scale, 0xFF for NaN. In the kernel
  bf16 bits = 0x7000 | byte << 4 = scale x 2**107 (NaN for 0xFF; 2**97 for 0, whose block's codes are +-0).
  Scales with the sign bit set (never produced by the quantizer) are folded into their block's code signs.
- mxfp4 (E8M0, blocks of 32): `scales[Np, Kp/32]`, byte b = e + 126 - c_n with c_n = (largest non-NaN e of the
  row) - 128, so b is in [0, 254]; 255 for NaN. In the kernel bf16 bits = b << 7 = 2**(b - 127) (0 for b = 0).
**Row factor**: float32 `row_factor[Np]` applied to the accumulator (in the GEMMs' epilogues): nvfp4 global x
2**19 (the global may be per row: stacked parts, e.g. an MoE layer's gate | up, each keep their own), mxfp4 2**c_n; NaN
for an mxfp4 row holding a NaN block (its b = 255 decodes as Inf, and Inf x 0 = NaN only for zero codes), with
c_n kept in the NaN's payload (bits 0..21 = c_n + 256) so that the layout stays invertible.

Decoded value x scale is exact in bf16 (2-bit x 4-bit significands, products >= 2**-29 for nvfp4); mxfp4 is
exact for every block whose exponent is within 133 binades of its row's largest (below that, products fall
into bf16 subnormals; no realistic weight comes near). With these, code x scale x row factor reproduces the
reference dequantization: bit for bit for mxfp4 and whenever the nvfp4 global scale is a power of two,
otherwise to one float32 rounding of code x scale x global (the reference rounds scale x global first).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trace_rl.formats import QTensor

LAYOUT_KEY = "hopper_fp4"   # the layout's key in PackedWeight.layout (this module needs no Triton: backends import it)
ROWS = 16            # rows per layout block (one warp's wgmma rows: lanes g and g + 8)
COLS = 128           # columns per layout block (8 wgmma K-slices)
WORDS = ROWS * COLS // 8
MASK = 0x81C081C0
NV_EXP_OFFSET = 10   # nvfp4 byte exponent field = E + 10
NV_FACTOR_EXP = 19   # nvfp4: decoded x scale = code x scale x 2**-19
MX_TOP = 128         # mxfp4: the row's largest exponent maps to 2**(254 - 127) x 2**-126 ~ code x 2
# (sign, e1, e0, m) of each slot A, B, C, D: rotation of the word that brings it to bf16 bits (15, 8, 7, 6)
SLOT_ROTATIONS = ((0, 0, 0, 0), (4, 4, 4, 4), (10, 10, 10, 10), (6, 6, 6, 14))
_OUT_BITS = (15, 8, 7, 6)


def padded_shape(n: int, k: int) -> tuple[int, int]:
    return -(-n // ROWS) * ROWS, -(-k // COLS) * COLS


def block_size(fmt: str) -> int:
    if fmt == "nvfp4":
        return 16
    if fmt == "mxfp4":
        return 32
    raise ValueError(f"the Hopper FP4 layout takes nvfp4 or mxfp4 weights, got {fmt!r}")


@dataclass
class HopperFP4:
    """The layout's tensors (see module doc). `n`, `k`: the weight's unpadded [N, K]."""

    fmt: str
    n: int
    k: int
    values: torch.Tensor       # int32 [Np/16, 2 Kp]
    scales: torch.Tensor       # uint8 [Np, Kp/G], pre-biased
    row_factor: torch.Tensor   # float32 [Np]

    @property
    def padded(self) -> tuple[int, int]:
        return padded_shape(self.n, self.k)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.values, self.scales, self.row_factor))

    @classmethod
    def empty(cls, fmt: str, n: int, k: int, device, experts: int | None = None) -> HopperFP4:
        """Uninitialised tensors; with `experts`, stacked over a leading expert dimension (grouped GEMM)."""
        np_, kp = padded_shape(n, k)
        lead = () if experts is None else (experts,)
        return cls(fmt, n, k, torch.empty(*lead, np_ // ROWS, 2 * kp, dtype=torch.int32, device=device),
                   torch.empty(*lead, np_, kp // block_size(fmt), dtype=torch.uint8, device=device),
                   torch.empty(*lead, np_, dtype=torch.float32, device=device))

    def copy_(self, other: HopperFP4) -> HopperFP4:
        """In place (a captured CUDA graph keeps reading these tensors)."""
        if (other.fmt, other.n, other.k) != (self.fmt, self.n, self.k):
            raise ValueError(f"HopperFP4.copy_: {other.fmt} {other.n}x{other.k} into {self.fmt} {self.n}x{self.k}")
        self.values.copy_(other.values)
        self.scales.copy_(other.scales)
        self.row_factor.copy_(other.row_factor)
        return self


def _unpack_codes(q: QTensor) -> torch.Tensor:
    codes = q.codes.reshape(-1, q.codes.shape[-1])
    return torch.stack([codes & 15, codes >> 4], dim=-1).flatten(-2)          # uint8 [N, K]


def _nv_scale_bytes(scales_e4m3: torch.Tensor):
    """E4M3 scales -> (pre-biased bytes, sign flip per block, zero per block)."""
    bits = scales_e4m3.view(torch.uint8).to(torch.int32)
    nan = (bits & 0x7F) == 0x7F
    value = scales_e4m3.float().abs()
    mant, exp = torch.frexp(torch.where(nan, 1.0, value))    # value = mant x 2**exp, mant in [0.5, 1)
    e = exp - 1                                               # 1.mmm x 2**e
    mmm = ((mant * 16).to(torch.int32) - 8)                   # 3 fraction bits (exact: E4M3 has 3)
    byte = ((e + NV_EXP_OFFSET) << 3) | mmm
    zero = value == 0
    byte = torch.where(zero, 0, byte)
    byte = torch.where(nan, 0xFF, byte)
    return byte.to(torch.uint8), (bits >= 0x80) & ~nan, zero


def _nv_scale_from_bytes(byte: torch.Tensor) -> torch.Tensor:
    b = byte.to(torch.int32)
    value = torch.ldexp(1.0 + (b & 7).float() / 8, (b >> 3) - NV_EXP_OFFSET)
    value = torch.where(b == 0, 0.0, value)
    out = value.to(torch.float8_e4m3fn)
    return torch.where(b == 0xFF, torch.full_like(out, float("nan")), out)


def _place_bits(codes8: torch.Tensor) -> torch.Tensor:
    """[..., 8] codes in slot order (r, c, e) -> int32 words (the bit placement of the module doc)."""
    word = torch.zeros(codes8.shape[:-1], dtype=torch.int64, device=codes8.device)
    c = codes8.to(torch.int64)
    for slot in range(4):
        for e in range(2):
            code = c[..., 2 * slot + e]
            for bit, (out, rot) in enumerate(zip(_OUT_BITS, SLOT_ROTATIONS[slot])):
                src = (out + 16 * e + rot) % 32
                word |= ((code >> (3 - bit)) & 1) << src
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def _codes_to_values(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [Np, Kp] -> int32 values [Np/16, 2 Kp]."""
    np_, kp = codes.shape
    c = codes.reshape(np_ // ROWS, 2, 8, kp // COLS, 4, 2, 2, 4, 2)      # n16 h g kc i r c t e
    c = c.permute(0, 3, 1, 2, 7, 4, 5, 6, 8)                            # n16 kc h g t i r c e
    return _place_bits(c.reshape(*c.shape[:6], 8)).reshape(np_ // ROWS, 2 * kp)


def _values_to_codes(values: torch.Tensor) -> torch.Tensor:
    n16, w = values.shape
    kp = w // 2
    x = values.to(torch.int64) & 0xFFFFFFFF
    slots = []
    for slot in range(4):
        for e in range(2):
            code = torch.zeros_like(x)
            for bit, (out, rot) in enumerate(zip(_OUT_BITS, SLOT_ROTATIONS[slot])):
                code |= ((x >> ((out + 16 * e + rot) % 32)) & 1) << (3 - bit)
            slots.append(code)
    c = torch.stack(slots, dim=-1).reshape(n16, kp // COLS, 2, 8, 4, 4, 2, 2, 2)   # n16 kc h g t i r c e
    c = c.permute(0, 2, 3, 1, 5, 6, 7, 4, 8)                                         # n16 h g kc i r c t e
    return c.reshape(n16 * ROWS, kp).to(torch.uint8)


def to_hopper(q: QTensor, out: HopperFP4 | None = None) -> HopperFP4:
    """The Hopper layout of an nvfp4/mxfp4 weight `q` ([N, K]), in torch (any device). With `out`, written
    in place. The GPU uses the Triton kernel in hopper_fp4_kernels.py (same result)."""
    G = block_size(q.format)
    if len(q.shape) == 3:     # experts [E, N, K]: one layout per expert, stacked
        res = [to_hopper(expert_q(q, e)) for e in range(q.shape[0])]
        st = HopperFP4(q.format, q.shape[1], q.shape[2], torch.stack([r.values for r in res]),
                       torch.stack([r.scales for r in res]), torch.stack([r.row_factor for r in res]))
        return st if out is None else out.copy_(st)
    if len(q.shape) != 2:
        raise ValueError(f"the Hopper FP4 layout takes a 2-D weight or 3-D experts, got shape {q.shape}")
    n, k = q.shape
    np_, kp = padded_shape(n, k)
    codes = torch.zeros(np_, kp, dtype=torch.uint8, device=q.codes.device)
    codes[:n, :k] = _unpack_codes(q)
    scales = q.scales.reshape(n, k // G)
    row_factor = torch.ones(np_, dtype=torch.float32, device=codes.device)
    blocks = codes.view(np_, kp // G, G)
    sbytes = torch.zeros(np_, kp // G, dtype=torch.uint8, device=codes.device)
    if q.format == "nvfp4":
        byte, flip, zero = _nv_scale_bytes(scales)
        sbytes[:n, : k // G] = byte
        fix = torch.zeros(np_, kp // G, dtype=torch.uint8, device=codes.device)
        fix[:n, : k // G] = flip.to(torch.uint8) << 3
        zb = torch.zeros(np_, kp // G, dtype=torch.bool, device=codes.device)
        zb[:n, : k // G] = zero
        blocks = torch.where(zb[..., None], blocks & 8, blocks) ^ fix[..., None]
        g = q.global_scale.float().reshape(-1)
        row_factor[:n] = torch.ldexp(g, torch.tensor(NV_FACTOR_EXP, device=g.device)).expand(n) \
            if g.numel() == 1 else torch.ldexp(g, torch.tensor(NV_FACTOR_EXP, device=g.device))
    else:
        e = scales.to(torch.int32)
        nan = e == 255
        top = torch.where(nan, -1, e).amax(dim=1, keepdim=True)
        top = torch.where(top < 0, MX_TOP, top)                           # all-NaN row
        b = torch.where(nan, 255, e + (254 - top))
        sbytes[:n, : k // G] = b.to(torch.uint8)
        c = (top - MX_TOP).reshape(n)
        row_factor[:n] = _mx_row_factor(c, nan.any(dim=1))
    values = _codes_to_values(blocks.reshape(np_, kp))
    res = HopperFP4(q.format, n, k, values, sbytes, row_factor)
    return res if out is None else out.copy_(res)


def expert_q(q: QTensor, e: int) -> QTensor:
    """Expert e of a stacked [E, N, K] QTensor (its own global scale for nvfp4: one, or one per row [N, 1] for
    stacked parts, `backends.grouped_linear.stack_parts`)."""
    g = q.global_scale
    if g is not None:
        if g.numel() == q.shape[0] * q.shape[1] and q.shape[1] > 1:
            g = g.reshape(q.shape[0], q.shape[1], 1)[e]
        else:
            g = g.reshape(-1)[e] if g.numel() == q.shape[0] else g.reshape(())
    return QTensor(q.codes[e], q.scales[e], g, tuple(q.shape[1:]), q.dtype, q.format)


def from_hopper(h: HopperFP4) -> QTensor:
    """The inverse of `to_hopper`: a QTensor whose dequantization equals the original's bit for bit (for
    quantizer output, codes and scales themselves round trip; see the module doc for folded scale signs)."""
    G = block_size(h.fmt)
    n, k = h.n, h.k
    codes = _values_to_codes(h.values)[:n, :k]
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    byte = h.scales[:n, : k // G]
    if h.fmt == "nvfp4":
        scales = _nv_scale_from_bytes(byte)
        glob = torch.ldexp(h.row_factor[:n].clone(), torch.tensor(-NV_FACTOR_EXP, device=byte.device))
        # one global scale, or one per row (stacked parts whose globals differ), as `to_hopper` took it
        glob = glob[:1].reshape(()) if bool((glob == glob[0]).all()) else glob.view(n, 1)
        return QTensor(packed, scales, glob, (n, k), torch.float32, "nvfp4")
    nan = byte == 255
    c = _mx_row_exponent(h.row_factor[:n])[:, None]
    scales = torch.where(nan, 255, byte.to(torch.int32) - 126 + c).to(torch.uint8)
    return QTensor(packed, scales, None, (n, k), torch.float32, "mxfp4")


def _mx_row_factor(c: torch.Tensor, has_nan: torch.Tensor) -> torch.Tensor:
    """2**c_n, or for a row holding a NaN block a NaN whose payload keeps c_n (for `from_hopper`)."""
    factor = torch.ldexp(torch.ones(c.shape, device=c.device), c)
    payload = (0x7FC00000 | (c + 256)).to(torch.int32).view(torch.float32)
    return torch.where(has_nan, payload, factor)


def _mx_row_exponent(row_factor: torch.Tensor) -> torch.Tensor:
    bits = row_factor.view(torch.int32)
    nan = torch.isnan(row_factor)
    c = torch.frexp(torch.where(nan, 1.0, row_factor))[1] - 1
    return torch.where(nan, (bits & 0x3FFFFF) - 256, c)


def scale_values(h: HopperFP4) -> torch.Tensor:
    """float32 [Np, Kp/G]: the bf16 scale each pre-biased byte decodes to in the kernel (nvfp4
    0x7000 | byte << 4, mxfp4 byte << 7), as float32."""
    b = h.scales.to(torch.int32)
    bits = (b << 7) if h.fmt == "mxfp4" else (0x7000 | (b << 4))
    return (bits << 16).view(torch.float32)


def operand(h: HopperFP4) -> torch.Tensor:
    """bf16 [N, K]: what the GEMM multiplies, (E2M1 x 2**-126) x scale rounded to bf16 (the kernel's
    mul.bf16x2), before the row factor."""
    G = block_size(h.fmt)
    codes = _values_to_codes(h.values).to(torch.int64)
    mag = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64, device=codes.device)
    value = torch.where(codes >= 8, -mag[codes & 7], mag[codes & 7])
    scale = scale_values(h).double().repeat_interleave(G, dim=1)
    return (value * 2.0 ** -126 * scale).to(torch.bfloat16)[: h.n, : h.k]


def dequantize(h: HopperFP4) -> torch.Tensor:
    """float32 [N, K]: `operand(h)` times the row factor; equal to the reference dequantization (see the
    module doc for when bit for bit)."""
    return operand(h).float() * h.row_factor[: h.n, None]
