"""Where a quantized KV cache keeps each code and scale: the storage layouts behind `PagedKV` (pure torch).

The decode-attention kernel (trace_rl/kernels/paged_attention.py) computes S^T = K q^T and
O^T = V^T P^T with the tokens (for K) and the head dims (for V^T) as the M of Hopper's `wgmma`, the
decoded K / V^T tile being its *register* operand. A thread's fragment of that operand is 16-row x
(2 x 2)-column pieces (rows g, g+8 of its warp's 16; columns 2tq, 2tq+1, 2tq+8, 2tq+9 of every 16), so
the cache is arranged at write time such that a thread's fragment is contiguous in memory (one 16-byte
load), its E2M1 nibbles sit where a few shifts and masks turn them into bf16 pairs, and its block scales
are the pairs its `mul.bf16x2` needs. Everything here is a pure permutation plus a bijective re-encoding
of scale bytes: `PagedKV.unshuffle` gives back the reference codes and scales bit for bit (tests).

Notation per (page, kv head) block: S tokens (the page size, a multiple of 16), D head dims, G the
format's block (16 nvfp4, 32 mxfp4). Fragment coordinates: warp w (0..3), lane group g (0..7), thread in
group tq (0..3), h/l/hr single bits.

K (role "k"): token rows in order; within a row, column c = 16 kt + 8 h + 2 tq + l of the MMA holds
    dim pi(c) = (D/4) tq + (D/8) l + 2 kt + h
  (the query is permuted the same way once per program: a dot product does not care about order, and
  this puts a thread's columns in two runs of D/8 dims, so one nvfp4 scale pair serves the whole row).
  FP4: word (tq, jw) of a row (4 bytes, jw < D/32) holds the 8 codes {(l, i)}: dim
  (D/4) tq + (D/8) l + 4 jw + i, in half l at the E2M1 twiddle slot i (below).
  FP8: word (tq, jw) (jw < D/16) holds bytes [dim(l=0, m), dim(l=0, m+1), dim(l=1, m), dim(l=1, m+1)]
  with m = 2 jw.
  Scales: [row group rg (S/16), g, block, hr] with token 16 rg + 8 hr + g.
V (role "v"): stored transposed, V^T [DV, S] with DV = max(D, 128) rows (rows >= D are zero padding).
  Fragment row rho = 64 mt + 16 w + 8 hr + g holds dim 16 (2w + g//4) + 4 (g%4) + 2 (mt%2) + hr
  + 128 (mt//2), so a thread's rows share one nvfp4 block (and one mxfp4 block). A 32-bit word holds the
  token pair (t, t+1) = (16 kt + 8 h + 2 tq, +1) of four rows; its low half is token t, its high half
  token t+1, so writing a token stores 16-bit halves and never touches another token's bits.
  FP4 word order [kt_hi, mw, w, g, tq, kt_lo, h], slot i = 2 (mt%2) + hr, mw = mt//2.
  FP8 word order [kt_hi, mw, w, g, tq, kt_lo, h, mt%2]: bytes [hr=0 @ t, hr=1 @ t, hr=0 @ t+1, hr=1 @ t+1].
  (kt_lo ranges over 2 when S is a multiple of 32, else 1: a thread's fragment of a page is then 16 bytes.)
  Scales: [block, tq, kt, l, h], i.e. the 4 bytes of (block, tq, kt) are tokens t, t+8, t+1, t+9.

E2M1 twiddle (triton_kernels' Hopper value layout): in each 16-bit half, slot i keeps the code's
(sign, e1, e0, m) bits at (15,8,7,6), (12,5,4,3), (9,2,1,0), (14,11,10,13), so `x & 0x81C081C0`,
`(x << 3) & ..`, `(x << 6) & ..` and one mixed shift give bf16 pairs of code * 2**-126 (0.5 lands on a
bf16 subnormal, which `mul.bf16x2` handles exactly).

Scale bytes are re-encoded so that one integer multiply-add turns a pair of them into the bf16x2 pair
`mul.bf16x2` needs, exact for every byte the quantizer produces:
- nvfp4 (E4M3, >= 0): stored = ((E + 2) << 3) | M with the scale normalised as 2**(E-7) (1 + M/8)
  (subnormal scales too); bf16 bits = stored * 16 + (237 << 7) = scale * 2**119, so a decoded element
  is code * scale * 2**-7 (the 2**7 goes into the per-token float32 factor). A zero scale is stored as
  152, which decodes to -0.0 (every code times it is a zero); NaN as 145, which decodes to a bf16 NaN.
- mxfp4 (E8M0): stored = code + 1, so bf16 bits = stored << 7 = 2**(code-126), and the element is
  (code * 2**-126 * 2**125) * that. NaN (255) stays 255 (+Inf: its block's codes are stored as 0, and
  0 * Inf is NaN). 254 (2**127), which no finite block produces (amax < 2**128 gives <= 252), is stored
  as 0 and decodes to zeros.
- fp8 row scales: a token whose values hold NaN/Inf gets its row scale stored negated; the kernel turns
  a negative factor into NaN (the whole token, not only the element, becomes NaN in the output).
A block whose scale is NaN has its codes stored as 0 (the reference leaves them unspecified).
"""

from __future__ import annotations

import functools

import torch

KV_FORMATS = ("bf16", "fp8_e4m3", "nvfp4", "mxfp4")
DEFAULT_BLOCK_SIZE = {"bf16": 16, "fp8_e4m3": 64, "nvfp4": 64, "mxfp4": 64}
TWIDDLE = ((15, 8, 7, 6), (12, 5, 4, 3), (9, 2, 1, 0), (14, 11, 10, 13))   # slot -> bit of (s, e1, e0, m)
NVFP4_SCALE_BIAS = 237          # bf16 exponent offset added to stored nvfp4 scales (<< 7)
NVFP4_FACTOR = 2.0 ** 7         # decoded nvfp4 elements are code * scale / NVFP4_FACTOR
MXFP4_CODE_BIAS = 2.0 ** 125    # mxfp4 elements: (code * 2**-126 * 2**125) * 2**(scale - 126)


def v_rows(head_dim: int) -> int:
    """Rows of the stored V^T (head dims padded to 128: the MMA's M per warpgroup is 64 x 2)."""
    return max(head_dim, 128)


def check_geometry(fmt: str, block_size: int, head_dim: int) -> None:
    if fmt == "bf16":
        return
    if block_size % 16:
        raise ValueError(f"{fmt} KV caches need pages of a multiple of 16 tokens (the decode kernel's MMA tile); "
                         f"got block_size={block_size} (default {DEFAULT_BLOCK_SIZE[fmt]})")
    if head_dim % 32 or (head_dim > 128 and head_dim % 128):
        raise ValueError(f"{fmt} KV caches need head_dim a multiple of 32 (of 128 above 128), got {head_dim}")


# ---------------------------------------------------------------- index maps (cached per geometry)
@functools.cache
def k_dim_of_col(D: int) -> torch.Tensor:
    """pi: MMA column c of K -> head dim (also the order of the permuted query)."""
    c = torch.arange(D)
    tq, l, h, kt = (c >> 1) & 3, c & 1, (c >> 3) & 1, c >> 4
    return (D // 4) * tq + (D // 8) * l + 2 * kt + h


@functools.cache
def v_dim_of_row(DV: int) -> torch.Tensor:
    """MMA row rho of V^T -> head dim (>= the real head_dim for padding rows)."""
    rho = torch.arange(DV)
    g, hr, w, mt = rho & 7, (rho >> 3) & 1, (rho >> 4) & 3, rho >> 6
    return 16 * (2 * w + (g >> 2)) + 4 * (g & 3) + 2 * (mt & 1) + hr + 128 * (mt >> 1)


def _k_row_dims(D: int, n: int) -> torch.Tensor:
    """[4 tq, D/(8n) chunks, 2 halves, n] -> dim of one K row: its MMA column order (`k_dim_of_col`) read in
    chunks of n consecutive dims (n = 4: the nibble slots of an fp4 word; n = 2: a pair of fp8 bytes)."""
    tq = torch.arange(4).view(4, 1, 1, 1)
    jw = torch.arange(D // (8 * n)).view(1, -1, 1, 1)
    half = torch.arange(2).view(1, 1, 2, 1)
    i = torch.arange(n).view(1, 1, 1, n)
    return (D // 4) * tq + (D // 8) * half + n * jw + i


@functools.cache
def k_fp4_word_dims(D: int) -> torch.Tensor:
    """[D/8 words, 2 halves, 4 slots] -> dim, for one K row (word j = tq * D/32 + jw)."""
    return _k_row_dims(D, 4).reshape(D // 8, 2, 4)


@functools.cache
def k_fp8_byte_dims(D: int) -> torch.Tensor:
    """[D] byte of a K row -> dim."""
    return _k_row_dims(D, 2).reshape(D)


def _kt_split(S: int) -> tuple[int, int]:
    kt_lo = 2 if S % 32 == 0 else 1
    return S // 16 // kt_lo, kt_lo


@functools.cache
def v_fp4_halves(S: int, DV: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each token of a page: the 16-bit halves of the stored V^T it owns and their dims.
    Returns (half index [S, DV/4], dims [S, DV/4, 4 slots])."""
    kh_n, kl_n = _kt_split(S)
    mw_n = DV // 128
    kh, mw, w, g, tq, kl, h, half, i = torch.meshgrid(
        *(torch.arange(n) for n in (kh_n, mw_n, 4, 8, 4, kl_n, 2, 2, 4)), indexing="ij")
    token = 16 * (kh * kl_n + kl) + 8 * h + 2 * tq + half
    rho = 64 * (2 * mw + (i >> 1)) + 16 * w + 8 * (i & 1) + g
    dims = v_dim_of_row(DV)[rho]
    half_index = torch.arange(token[..., 0].numel()).view(token.shape[:-1])   # storage order = flat order
    tok = token[..., 0].reshape(-1)
    order = torch.argsort(tok, stable=True)
    n = DV // 4
    return half_index.reshape(-1)[order].view(S, n), dims.reshape(-1, 4)[order].view(S, n, 4)


@functools.cache
def v_fp8_halves(S: int, DV: int) -> tuple[torch.Tensor, torch.Tensor]:
    """As `v_fp4_halves` for FP8 V^T: (half index [S, DV/2], dims [S, DV/2, 2 bytes])."""
    kh_n, kl_n = _kt_split(S)
    mw_n = DV // 128
    kh, mw, w, g, tq, kl, h, ml, half, b = torch.meshgrid(
        *(torch.arange(n) for n in (kh_n, mw_n, 4, 8, 4, kl_n, 2, 2, 2, 2)), indexing="ij")
    token = 16 * (kh * kl_n + kl) + 8 * h + 2 * tq + half
    rho = 64 * (2 * mw + ml) + 16 * w + 8 * b + g
    dims = v_dim_of_row(DV)[rho]
    half_index = torch.arange(token[..., 0].numel()).view(token.shape[:-1])
    tok = token[..., 0].reshape(-1)
    order = torch.argsort(tok, stable=True)
    n = DV // 2
    return half_index.reshape(-1)[order].view(S, n), dims.reshape(-1, 2)[order].view(S, n, 2)


@functools.cache
def k_scale_index(S: int, nblocks: int) -> torch.Tensor:
    """[S, nblocks] -> byte offset in the page's K scales: order [rg, g, block, hr]."""
    r = torch.arange(S).view(S, 1)
    b = torch.arange(nblocks).view(1, nblocks)
    rg, hr, g = r >> 4, (r >> 3) & 1, r & 7
    return ((rg * 8 + g) * nblocks + b) * 2 + hr


@functools.cache
def v_scale_index(S: int, nblocks: int) -> torch.Tensor:
    """[S, nblocks] -> byte offset in the page's V scales: order [block, tq, kt, l, h]."""
    t = torch.arange(S).view(S, 1)
    b = torch.arange(nblocks).view(1, nblocks)
    kt, h, tq, l = t >> 4, (t >> 3) & 1, (t >> 1) & 3, t & 1
    return (((b * 4 + tq) * (S // 16) + kt) * 2 + l) * 2 + h


# ---------------------------------------------------------------- E2M1 twiddle
def twiddle(codes: torch.Tensor) -> torch.Tensor:
    """codes [..., 4 slots] (0..15) -> int32 [...] 16-bit halves."""
    c = codes.to(torch.int32)
    out = torch.zeros(c.shape[:-1], dtype=torch.int32, device=c.device)
    for i, (s, e1, e0, m) in enumerate(TWIDDLE):
        x = c[..., i]
        out |= ((x >> 3) & 1) << s | ((x >> 2) & 1) << e1 | ((x >> 1) & 1) << e0 | (x & 1) << m
    return out


def untwiddle(halves: torch.Tensor) -> torch.Tensor:
    """int32 [...] 16-bit halves -> codes [..., 4] (uint8)."""
    x = halves.to(torch.int32)
    slots = [((x >> s) & 1) << 3 | ((x >> e1) & 1) << 2 | ((x >> e0) & 1) << 1 | ((x >> m) & 1)
             for s, e1, e0, m in TWIDDLE]
    return torch.stack(slots, -1).to(torch.uint8)


# ---------------------------------------------------------------- scale byte re-encoding
@functools.cache
def _e4m3_tables() -> tuple[torch.Tensor, torch.Tensor]:
    enc = [-1] * 256
    enc[0] = 152                                 # zero scale: decodes to -0.0, so every code gives a zero
    for m in range(1, 8):                        # subnormal m * 2**-9, normalised
        e = m.bit_length() - 1                   # m = 2**e * (1 + frac)
        mant = ((m << 3) >> e) & 7               # 3-bit mantissa of m / 2**e
        enc[m] = ((e - 2 + 2) << 3) | mant       # exponent field E = e - 2 (2**-9 has E = -2)
    for b in range(8, 127):
        enc[b] = b + 16
    enc[127] = 145                               # NaN
    free = sorted(set(range(256)) - set(v for v in enc if v >= 0))
    for b in range(128, 256):                    # negative scales: never produced; kept bijective
        enc[b] = free[b - 128]
    enc_t = torch.tensor(enc, dtype=torch.uint8)
    dec = torch.empty(256, dtype=torch.uint8)
    dec[enc_t.long()] = torch.arange(256, dtype=torch.uint8)
    return enc_t, dec


@functools.cache
def _e8m0_tables() -> tuple[torch.Tensor, torch.Tensor]:
    enc = torch.arange(256, dtype=torch.int32) + 1
    enc[254], enc[255] = 0, 255
    enc_t = enc.to(torch.uint8)
    dec = torch.empty(256, dtype=torch.uint8)
    dec[enc_t.long()] = torch.arange(256, dtype=torch.uint8)
    return enc_t, dec


def encode_scales(fmt: str, scale_bytes: torch.Tensor) -> torch.Tensor:
    enc, _ = _e4m3_tables() if fmt == "nvfp4:row" else _e8m0_tables()
    return enc.to(scale_bytes.device)[scale_bytes.long()]


def decode_scales(fmt: str, stored: torch.Tensor) -> torch.Tensor:
    _, dec = _e4m3_tables() if fmt == "nvfp4:row" else _e8m0_tables()
    return dec.to(stored.device)[stored.long()]


def stored_scale_value(fmt: str, stored: torch.Tensor) -> torch.Tensor:
    """float32 value of the bf16 the kernel builds from stored scale bytes (for tests of the decode)."""
    s = stored.to(torch.int32)
    bits = s * 16 + (NVFP4_SCALE_BIAS << 7) if fmt == "nvfp4:row" else s << 7
    return (bits << 16).view(torch.float32)
