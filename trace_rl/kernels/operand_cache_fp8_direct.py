"""The FP8 operand cache's direct weight writer (operand_cache_fp8.py's default, `WRITER_DIRECT`): each mxfp4 code
of a block looked up in the block's table of E4M3 bytes instead of going through the bf16 operand and a float
rounding (`_weight_e4m3_kernel`), the same bytes and inexact count for every code and scale byte; and its integer twin
in torch, which the CPU test holds to the old writer's float spec."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The direct writer (`WRITER_DIRECT`, the default): each block's eight E4M3 results (E2M1 magnitude 0..7 x
# 2**(b - 248), rounded like the old writer) as the bytes of two int32 words, bit 7 of each byte its inexact flag
# (E4M3 magnitudes are < 0x80); an element is one byte of one word. Per block k = b - 242 (E2M1 x 2**-6 has the E4M3
# bits magnitude << 2): k >= 1: magnitude << 2 + 8k (0.5 -> 8k, 2**(k - 7)); k = 0..-6: the tables below (E4M3
# subnormals, ties to even: 0.5 -> 0, 1.5 -> 2 quanta of 2**-9), k <= -7: 0. Inexact: what the old writer counts,
# the finite nonzero bf16 operand values x 32 that E4M3 does not hold: k = -3 rounds 0.5 and 1.5, -4 also 1 and 3,
# -5 everything but 2 and 4, -6 every nonzero value, down to where the bf16 operand itself underflows to 0
# (code x 2**(b - 253) <= 2**-134, ties to even): b = 120 keeps magnitudes >= 1, 119 >= 1.5, 118 >= 3, 117 only 6.
# b = 255 (the NaN block): 0x7F, no sign (the old writer's NaN).


@triton.jit
def _direct_tables(s):
    """(lo, hi, sign mask) int32 per scale byte s (int32 0..255): the module comment's tables, flags in bit 7."""
    k = s - 242
    lo = tl.where(k >= 1, 0x0C080000 + k * 0x08080800,
                  tl.where(k == 0, 0x0C080400, tl.where(k == -1, 0x06040200, tl.where(
                      k == -2, 0x03020100, tl.where(k == -3, 0x02010000, tl.where(k == -4, 0x01000000, 0))))))
    hi = tl.where(k >= 1, 0x1C181410 + k * 0x08080808,
                  tl.where(k == 0, 0x1C181410, tl.where(k == -1, 0x14100C08, tl.where(k == -2, 0x0C080604, tl.where(
                      k == -3, 0x06040302, tl.where(k == -4, 0x03020201, tl.where(
                          k == -5, 0x02010100, tl.where(k == -6, 0x01000000, 0))))))))
    # flags (bit 7 of a byte; 0x80808000 etc. as int32): magnitudes 1 3 | 1 2 3, 5 | 1 2 3, 4 5 7 | all nonzero
    lo = lo | tl.where(k >= -2, 0, tl.where(k == -3, -2147450880, tl.where(k >= -121, -2139062272, tl.where(
        k == -122, -2139095040, tl.where(k == -123, -2147483648, 0)))))
    hi = hi | tl.where(k >= -3, 0, tl.where(k == -4, 0x8000, tl.where(k == -5, -2147450752, tl.where(
        k >= -123, -2139062144, tl.where(k == -124, -2139062272, tl.where(k == -125, -2147483648, 0))))))
    nan = s == 255
    return tl.where(nan, 0x7F7F7F7F, lo), tl.where(nan, 0x7F7F7F7F, hi), tl.where(nan, 0, 0x80)


@triton.jit
def _weight_e4m3_direct_kernel(codes_ptr, scales_ptr, out_ptr, inexact_ptr, N, K, stride_c, stride_s, stride_o,
                               BN: tl.constexpr, BK: tl.constexpr):
    """`_weight_e4m3_kernel`'s bytes and inexact count (bit for bit, NaN 0x7F), each FP4 code looked up in its
    block's table (`_direct_tables`) instead of through the bf16 operand and a float rounding; the count's atomic only
    where a tile holds inexact values."""
    G: tl.constexpr = 32
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    r64 = rows[:, None].to(tl.int64)
    row_ok = (rows < N)[:, None]
    c2 = tl.program_id(1) * (BK // 2) + tl.arange(0, BK // 2)
    byte = tl.load(codes_ptr + r64 * stride_c + c2[None, :], mask=row_ok & (c2 < K // 2)[None, :],
                   other=0).to(tl.int32)
    c = tl.reshape(tl.join(byte & 15, byte >> 4), (BN, BK // G, G))      # column 2j: low nibble of byte j
    cs = tl.program_id(1) * (BK // G) + tl.arange(0, BK // G)
    s = tl.load(scales_ptr + r64 * stride_s + cs[None, :], mask=row_ok & (cs < K // G)[None, :],
                other=0).to(tl.int32)                                     # masked: s = 0, codes 0 (no flags)
    lo, hi, sign = _direct_tables(s)
    word = tl.where((c & 4) != 0, hi[:, :, None], lo[:, :, None])
    x = word >> ((c & 3) << 3)
    bad = tl.sum(tl.sum(tl.sum(x & 0x80, axis=2), axis=1), axis=0) >> 7
    code = tl.reshape((x & 0x7F) | ((c << 4) & sign[:, :, None]), (BN, BK))
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    tl.store(out_ptr + r64 * stride_o + cols[None, :], code.to(tl.uint8), mask=row_ok & (cols < K)[None, :])
    if bad != 0:                 # the common (exact) case adds nothing: no atomic traffic on one address
        tl.atomic_add(inexact_ptr, bad, sem="relaxed")


def _where_chain(k: torch.Tensor, cases, default: int) -> torch.Tensor:
    out = torch.full_like(k, default)
    for cond, value in reversed(cases):
        out = torch.where(cond(k), value if isinstance(value, int) else value(k), out)
    return out


def direct_e4m3_twin(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The direct writer's integer ops in torch (`_direct_tables`, then the lookup): mxfp4 codes uint8 [N, K/2] (two a
    byte, even column in the low nibble) and Hopper-layout scale bytes [N, K/32] -> (uint8 [N, K] E4M3 bytes,
    bool [N, K] inexact). The CPU test holds it and both kernels to the old writer's float spec over every code and
    scale byte."""
    s = scales.view(torch.uint8).to(torch.int64)
    k = s - 242
    lo = _where_chain(k, [(lambda k: k >= 1, lambda k: 0x0C080000 + k * 0x08080800), (lambda k: k == 0, 0x0C080400),
                          (lambda k: k == -1, 0x06040200), (lambda k: k == -2, 0x03020100),
                          (lambda k: k == -3, 0x02010000), (lambda k: k == -4, 0x01000000)], 0)
    hi = _where_chain(k, [(lambda k: k >= 1, lambda k: 0x1C181410 + k * 0x08080808), (lambda k: k == 0, 0x1C181410),
                          (lambda k: k == -1, 0x14100C08), (lambda k: k == -2, 0x0C080604),
                          (lambda k: k == -3, 0x06040302), (lambda k: k == -4, 0x03020201),
                          (lambda k: k == -5, 0x02010100), (lambda k: k == -6, 0x01000000)], 0)
    lo = lo | _where_chain(k, [(lambda k: k >= -2, 0), (lambda k: k == -3, 0x80008000),
                               (lambda k: k >= -121, 0x80808000), (lambda k: k == -122, 0x80800000),
                               (lambda k: k == -123, 0x80000000)], 0)
    hi = hi | _where_chain(k, [(lambda k: k >= -3, 0), (lambda k: k == -4, 0x8000), (lambda k: k == -5, 0x80008080),
                               (lambda k: k >= -123, 0x80808080), (lambda k: k == -124, 0x80808000),
                               (lambda k: k == -125, 0x80000000)], 0)
    nan = s == 255
    lo, hi = torch.where(nan, 0x7F7F7F7F, lo), torch.where(nan, 0x7F7F7F7F, hi)
    sign = torch.where(nan, 0, 0x80)
    b = codes.view(torch.uint8).to(torch.int64)
    c = torch.stack([b & 15, b >> 4], dim=-1).reshape(b.shape[0], -1)              # [N, K]
    rep = lambda t: t.repeat_interleave(32, dim=1)                                   # noqa: E731 - per block
    x = torch.where((c & 4) != 0, rep(hi), rep(lo)) >> ((c & 3) << 3)
    return ((x & 0x7F) | ((c << 4) & rep(sign))).to(torch.uint8), (x & 0x80) != 0
