"""Writing K/V into a `PagedKV` cache in the decode kernel's layout (trace_rl/formats/kv_layout.py).

- `kv_write(cache, slots, x)`: quantize x [T, H, D] per token and head and store token i at flat slot
  slots[i]; bit-exact with `PagedKV.write_reference`. One program handles BLOCK_M (token, head) rows.
- `qk_norm_rope_kv_write(...)`: the decode step's q/k RMSNorm + RoPE + the K/V write in one kernel (one
  program per token, all heads); returns the normalised, rotated queries.

Every store touches only the writing token's own bits, so concurrent writers of one page never race:
K rows are whole (a token's K is D/2 contiguous bytes per head), the transposed V is written in 16-bit
halves that belong to a single token, and each scale is its own byte. Quantization follows
trace_rl/kernels/row_quantize.py (same arithmetic, bit-exact with trace_rl/formats); values are rounded
with integer bit operations, never through float casts (the interpreter's are not faithful).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trace_rl.formats.paged_kv import PagedKV
from trace_rl.kernels.fp_bits import e2m1_encode, e4m3_round, e8m0_inverse, e8m0_scale_code, finite_abs

KV_FP8, KV_NVFP4, KV_MXFP4 = 1, 2, 3
FORMAT_IDS = {"fp8_e4m3:row": KV_FP8, "nvfp4:row": KV_NVFP4, "mxfp4": KV_MXFP4}


@triton.jit
def quantize_rows(x, FMT: tl.constexpr):
    """x float32 [R, D] -> (codes int32 [R, D], scale codes int32 [R, D/G] (fp8: unused), global float32 [R]
    (nvfp4 global scale / fp8 row scale, negated for an fp8 row holding NaN/Inf), NaN-block mask [R, D/G]).
    The arithmetic of row_quantize._quantize_chunk, per (token, head) row."""
    R: tl.constexpr = x.shape[0]
    D: tl.constexpr = x.shape[1]
    xa, finite = finite_abs(x)
    if FMT == 1:
        amax = tl.max(xa, axis=1)
        g = tl.where(amax > 0, tl.math.div_rn(amax, 448.0), 1.0)
        scaled = tl.minimum(tl.maximum(tl.math.div_rn(x, g[:, None]), -448.0), 448.0)
        mag_code, _ = e4m3_round(tl.abs(scaled))
        code = mag_code | ((scaled.to(tl.int32, bitcast=True) < 0).to(tl.int32) << 7)
        code = tl.where(finite, code, 0x7F)                       # NaN and +-Inf -> NaN
        bad_row = tl.max(tl.where(finite, 0, 1), axis=1) > 0
        scode = tl.zeros([R, 1], dtype=tl.int32)
        bad = bad_row[:, None]
        g = tl.where(bad_row, -g, g)
    else:
        G: tl.constexpr = 16 if FMT == 2 else 32
        blocks = tl.reshape(x, [R, D // G, G])
        xab, finb = finite_abs(blocks)
        block_amax = tl.max(xab, axis=2)
        bad = tl.max(tl.where(finb, 0, 1), axis=2) > 0
        if FMT == 3:
            scode = tl.where(bad, 255, e8m0_scale_code(block_amax))
            inv_step = e8m0_inverse(tl.minimum(scode, 254))
            scaled = blocks * inv_step[:, :, None]
            g = tl.full([R], 1.0, dtype=tl.float32)
        else:
            amax = tl.max(xa, axis=1)
            g = tl.where(amax > 0, tl.math.div_rn(amax, 2688.0), 1.0)
            v = tl.minimum(tl.math.div_rn(tl.math.div_rn(block_amax, 6.0), g[:, None]), 448.0)
            scode, scale_val = e4m3_round(v)
            scode = tl.where(bad, 0x7F, scode)
            step = scale_val * g[:, None]
            step_b = step[:, :, None]
            scaled = tl.where(step_b == 0, blocks * 0.0, tl.math.div_rn(blocks, step_b))
        codes = e2m1_encode(scaled)
        codes = tl.where(bad[:, :, None], 0, codes)               # NaN blocks: zero codes (kv_layout.py)
        code = tl.reshape(codes, [R, D])
    return code, scode, g, bad


@triton.jit
def _encode_scale(b, MX: tl.constexpr):
    """Scale code -> the stored byte (kv_layout.encode_scales): mxfp4 code + 1 (NaN stays 255); nvfp4 the
    normalised (E + 2, M) form, zero as 152 (decodes to -0.0), NaN as 145."""
    if MX:
        enc = tl.where(b == 255, 255, b + 1)
    else:
        e = (b >= 2).to(tl.int32) + (b >= 4).to(tl.int32)
        sub = (e << 3) | (((b << 3) >> e) & 7)
        enc = tl.where(b >= 8, b + 16, sub)
        enc = tl.where(b == 0, 152, enc)
        enc = tl.where(b == 127, 145, enc)
    return enc


@triton.jit
def _twiddle(c0, c1, c2, c3):
    """Four E2M1 codes (int32) -> a 16-bit half with slot i's (s, e1, e0, m) at kv_layout.TWIDDLE[i]."""
    h = ((c0 & 8) << 12) | ((c0 & 7) << 6)
    h |= ((c1 & 8) << 9) | ((c1 & 7) << 3)
    h |= ((c2 & 8) << 6) | (c2 & 7)
    h |= ((c3 & 8) << 11) | ((c3 & 4) << 9) | ((c3 & 2) << 9) | ((c3 & 1) << 13)
    return h


@triton.jit
def _split4(c):
    """[..., 4] -> its four slices (a reshape to [..., 2, 2] and two splits: register moves only)."""
    a, b = tl.split(tl.reshape(c, c.shape[:-1] + [2, 2]))     # a = slots (0, 2), b = (1, 3)
    c0, c2 = tl.split(a)
    c1, c3 = tl.split(b)
    return c0, c1, c2, c3


@triton.jit
def store_kv_rows(x, hp, r, row_mask, codes_ptr, scales_ptr, glob_ptr, D: tl.constexpr, PAGE: tl.constexpr,
                  FMT: tl.constexpr, ROLE_V: tl.constexpr):
    """Quantize rows x [R, D] (float32) and store them at page-head block hp [R] (int64), row r [R] (int32)."""
    R: tl.constexpr = x.shape[0]
    DV: tl.constexpr = 128 if D < 128 else D
    MW: tl.constexpr = DV // 128
    KL: tl.constexpr = 2 if PAGE % 32 == 0 else 1
    code, scode, g, bad = quantize_rows(x, FMT)
    m1 = row_mask[:, None]
    if FMT == 1 or FMT == 2:
        tl.store(glob_ptr + hp * PAGE + r, g, mask=row_mask)
    if FMT != 1:
        G: tl.constexpr = 16 if FMT == 2 else 32
        NB: tl.constexpr = D // G
        blk = tl.arange(0, NB)[None, :]
        if ROLE_V:   # [block, tq, kt, l, h]
            s_idx = (((blk * 4 + ((r[:, None] >> 1) & 3)) * (PAGE // 16) + (r[:, None] >> 4)) * 2
                     + (r[:, None] & 1)) * 2 + ((r[:, None] >> 3) & 1)
        else:        # [rg, g, block, hr]
            s_idx = (((r[:, None] >> 4) * 8 + (r[:, None] & 7)) * NB + blk) * 2 + ((r[:, None] >> 3) & 1)
        tl.store(scales_ptr + hp[:, None] * (PAGE * NB) + s_idx, _encode_scale(scode, FMT == 3).to(tl.uint8), mask=m1)
    if ROLE_V:
        # V^T: 16-bit halves of one token. Token r's half for rows (mw, w, g) holds dims
        # 128 mw + 32 w + 4 g + {0..3} (FP4 slots) or 128 mw + 32 w + 4 g + 2 ml + {0, 1} (FP8 bytes).
        if DV > D:     # zero padding rows (D = 32 or 64)
            code = tl.reshape(tl.permute(tl.join(code, tl.zeros([R, D], dtype=tl.int32)), (0, 2, 1)), [R, 2 * D])
            if DV > 2 * D:
                code = tl.reshape(tl.permute(tl.join(code, tl.zeros([R, 2 * D], dtype=tl.int32)), (0, 2, 1)), [R, DV])
        kt = r >> 4
        word0 = (((kt // KL) * MW * 4 * 8 * 4 + ((r >> 1) & 3)) * KL + kt % KL) * 2 + ((r >> 3) & 1)
        if FMT == 1:
            c = tl.reshape(code, [R, MW, 4, 8, 2, 2])
            b0, b1 = tl.split(c)                                                     # hr = 0, 1
            half = b0 | (b1 << 8)                                                    # [R, MW, 4, 8, ml]
            mwg = tl.arange(0, MW * 4 * 8)
            wi = (word0[:, None, None] + (mwg * 4 * KL * 2)[None, :, None]) * 2 + tl.arange(0, 2)[None, None, :]
            half = tl.reshape(half, [R, MW * 4 * 8, 2])
            tl.store(codes_ptr.to(tl.pointer_type(tl.int16)) + hp[:, None, None] * (PAGE * DV // 2)
                     + wi * 2 + (r & 1)[:, None, None], half.to(tl.int16), mask=row_mask[:, None, None])
        else:
            c0, c1, c2, c3 = _split4(tl.reshape(code, [R, MW * 4 * 8, 4]))
            half = _twiddle(c0, c1, c2, c3)                                          # [R, MW*4*8]
            mwg = tl.arange(0, MW * 4 * 8)
            wi = word0[:, None] + (mwg * 4 * KL * 2)[None, :]
            tl.store(codes_ptr.to(tl.pointer_type(tl.int16)) + hp[:, None] * (PAGE * DV // 4)
                     + wi * 2 + (r & 1)[:, None], half.to(tl.int16), mask=m1)
    else:
        if FMT == 1:   # row bytes: word (tq, jw) = dims (D/4) tq + (D/8) l + 2 jw + b, byte 2 l + b
            c = tl.permute(tl.reshape(code, [R, 4, 2, D // 16, 2]), (0, 1, 3, 2, 4))
            byte = tl.reshape(c, [R, D])
            tl.store(codes_ptr + (hp * PAGE + r)[:, None] * D + tl.arange(0, D)[None, :], byte.to(tl.uint8), mask=m1)
        else:          # word (tq, jw), half l, slot i = dim (D/4) tq + (D/8) l + 4 jw + i
            c = tl.permute(tl.reshape(code, [R, 4, 2, D // 32, 4]), (0, 1, 3, 2, 4))   # r, tq, jw, l, i
            c0, c1, c2, c3 = _split4(c)
            lo, hi = tl.split(_twiddle(c0, c1, c2, c3))                               # [R, 4, D/32]
            word = tl.reshape(lo | (hi << 16), [R, D // 8])
            tl.store(codes_ptr.to(tl.pointer_type(tl.int32)) + (hp * PAGE + r)[:, None] * (D // 8)
                     + tl.arange(0, D // 8)[None, :], word, mask=m1)


@triton.jit
def _kv_write_kernel(x_ptr, slots_ptr, codes_ptr, scales_ptr, glob_ptr, n_rows, stride_xt, stride_xh,
                     H: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, FMT: tl.constexpr,
                     ROLE_V: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    tok, head = rows // H, rows % H
    x = tl.load(x_ptr + tok.to(tl.int64)[:, None] * stride_xt + head[:, None] * stride_xh + tl.arange(0, D)[None, :],
                mask=row_mask[:, None], other=0.0).to(tl.float32)
    slot = tl.load(slots_ptr + tok, mask=row_mask, other=0).to(tl.int64)
    hp = (slot // PAGE) * H + head
    r = (slot % PAGE).to(tl.int32)
    store_kv_rows(x, hp, r, row_mask, codes_ptr, scales_ptr, glob_ptr, D, PAGE, FMT, ROLE_V)


def _check(cache: PagedKV, slots: torch.Tensor, x: torch.Tensor, what: str) -> None:
    T, H, D = x.shape
    if (H, D) != (cache.heads, cache.head_dim):
        raise ValueError(f"{what}: x has {H} heads x {D}, the cache holds {cache.heads} x {cache.head_dim}")
    if slots.shape != (T,):
        raise ValueError(f"{what}: slots must be [T] = [{T}], got {tuple(slots.shape)}")
    if D & (D - 1):
        raise ValueError(f"{what}: head_dim {D} must be a power of two for the write kernel")


def _cache_ptrs(cache: PagedKV):
    glob = cache.global_scale if cache.global_scale is not None else cache.scales
    return cache.codes, cache.scales, glob


def kv_write(cache: PagedKV, slots: torch.Tensor, x: torch.Tensor) -> None:
    """Store x [T, H, D] (token i in flat slot slots[i], int64) quantized per token and head."""
    from trace_rl.kernels import interpreting

    _check(cache, slots, x, "kv_write")
    T, H, D = x.shape
    if cache.fmt == "bf16":
        cache.codes.view(-1, H, D)[slots] = x.to(cache.codes.dtype)
        return
    if T == 0:
        return
    x = x if x.stride(-1) == 1 else x.contiguous()
    rows = T * H
    block_m = min(64 if interpreting() else 16, triton.next_power_of_2(rows))
    codes, scales, glob = _cache_ptrs(cache)
    _kv_write_kernel[(triton.cdiv(rows, block_m),)](
        x, slots, codes, scales, glob, rows, x.stride(0), x.stride(1), H=H, D=D, PAGE=cache.block_size,
        FMT=FORMAT_IDS[cache.fmt], ROLE_V=cache.role == "v", BLOCK_M=block_m, num_warps=4)


@triton.jit
def _round_bf16(x, ROUND: tl.constexpr):
    """float32 -> the float32 value of its bf16 rounding (nearest, ties to even) when ROUND; NaN stays NaN."""
    if ROUND:
        bits = x.to(tl.int32, bitcast=True)
        r = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
        x = tl.where(x != x, x, r)
    return x


@triton.jit
def _norm_rope(x, w_ptr, cos, sin, eps, HAS_NORM: tl.constexpr, ROUND: tl.constexpr):
    """RMSNorm (float32 statistics, result rounded to the activation dtype, then times the weight) and RoPE
    `x * cos + rotate_half(x) * sin` (each product and the sum rounded), as trace_rl/models does in bf16."""
    H: tl.constexpr = x.shape[0]
    D: tl.constexpr = x.shape[1]
    if HAS_NORM:
        ms = tl.sum(x * x, axis=1) / D
        hn = _round_bf16(x * tl.math.rsqrt(ms + eps)[:, None], ROUND)
        w = tl.load(w_ptr + tl.arange(0, D)).to(tl.float32)
        x = _round_bf16(w[None, :] * hn, ROUND)
    x1, x2 = tl.split(tl.permute(tl.reshape(x, [H, 2, D // 2]), (0, 2, 1)))
    rot = tl.reshape(tl.permute(tl.join(-x2, x1), (0, 2, 1)), [H, D])
    a = _round_bf16(x * cos[None, :], ROUND)
    b = _round_bf16(rot * sin[None, :], ROUND)
    return _round_bf16(a + b, ROUND)


@triton.jit
def _qk_norm_rope_write_kernel(
    q_ptr, k_ptr, v_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, slots_ptr,
    kc_ptr, ks_ptr, kg_ptr, vc_ptr, vs_ptr, vg_ptr, eps,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_cb, stride_ob, stride_oh,
    HQ: tl.constexpr, HKV: tl.constexpr, HQP: tl.constexpr, HKVP: tl.constexpr, D: tl.constexpr,
    PAGE: tl.constexpr, FMT: tl.constexpr, HAS_NORM: tl.constexpr, HAS_KO: tl.constexpr, ROUND: tl.constexpr,
):
    """One program per token: q and k normalised and rotated, q stored, k and v written to the caches."""
    b = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, D)
    cos = tl.load(cos_ptr + b * stride_cb + d).to(tl.float32)
    sin = tl.load(sin_ptr + b * stride_cb + d).to(tl.float32)
    hq = tl.arange(0, HQP)
    q = tl.load(q_ptr + b * stride_qb + hq[:, None] * stride_qh + d[None, :], mask=(hq < HQ)[:, None],
                other=0.0).to(tl.float32)
    q = _norm_rope(q, qw_ptr, cos, sin, eps, HAS_NORM, ROUND)
    tl.store(qo_ptr + b * stride_ob + hq[:, None] * stride_oh + d[None, :], q.to(qo_ptr.dtype.element_ty),
             mask=(hq < HQ)[:, None])
    hk = tl.arange(0, HKVP)
    hmask = hk < HKV
    k = tl.load(k_ptr + b * stride_kb + hk[:, None] * stride_kh + d[None, :], mask=hmask[:, None],
                other=0.0).to(tl.float32)
    k = _norm_rope(k, kw_ptr, cos, sin, eps, HAS_NORM, ROUND)
    if HAS_KO:
        tl.store(ko_ptr + (b * HKV + hk)[:, None] * D + d[None, :], k.to(ko_ptr.dtype.element_ty), mask=hmask[:, None])
    v = tl.load(v_ptr + b * stride_vb + hk[:, None] * stride_vh + d[None, :], mask=hmask[:, None],
                other=0.0).to(tl.float32)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    page = slot // PAGE
    r = (slot % PAGE).to(tl.int32)
    if FMT == 0:       # bf16 cache: token-major [P, S, H, D]
        row = ((page * PAGE + r) * HKV + hk)[:, None] * D + d[None, :]
        tl.store(kc_ptr + row, k.to(kc_ptr.dtype.element_ty), mask=hmask[:, None])
        tl.store(vc_ptr + row, v.to(vc_ptr.dtype.element_ty), mask=hmask[:, None])
    else:
        hp = page * HKV + hk
        rr = tl.zeros([HKVP], dtype=tl.int32) + r
        store_kv_rows(k, hp, rr, hmask, kc_ptr, ks_ptr, kg_ptr, D, PAGE, FMT, False)
        store_kv_rows(v, hp, rr, hmask, vc_ptr, vs_ptr, vg_ptr, D, PAGE, FMT, True)


def qk_norm_rope_kv_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          k_cache: PagedKV, v_cache: PagedKV, slots: torch.Tensor,
                          q_norm_weight: torch.Tensor | None = None, k_norm_weight: torch.Tensor | None = None,
                          eps: float = 1e-6, k_out: torch.Tensor | None = None) -> torch.Tensor:
    """The decode step's attention prologue in one kernel: q [B, Hq, D] and k [B, Hkv, D] through RMSNorm
    (when the weights are given) and RoPE (cos/sin [B, D]); k and v [B, Hkv, D] written to the caches at
    `slots` [B] (as `kv_write`). Returns the normalised, rotated q ([B, Hq, D], q's dtype); `k_out`
    ([B, Hkv, D]) receives the normalised, rotated k when given. Inputs may be strided views (e.g. of a
    fused qkv projection) with a unit last stride. Reference: `attention_reference.qk_norm_rope_kv_write_reference`."""
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    if k.shape != (B, Hkv, D) or v.shape != k.shape or cos.shape != (B, D) or sin.shape != (B, D):
        raise ValueError(f"qk_norm_rope_kv_write: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"cos/sin {tuple(cos.shape)}/{tuple(sin.shape)}; need q [B, Hq, D], k/v [B, Hkv, D], "
                         f"cos/sin [B, D]")
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("qk_norm_rope_kv_write: give both q_norm_weight and k_norm_weight, or neither")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check(c, slots, k if name == "k_cache" else v, "qk_norm_rope_kv_write")
    if k_cache.fmt != "bf16" and (k_cache.role, v_cache.role) != ("k", "v"):
        raise ValueError("qk_norm_rope_kv_write: caches must be allocated with role='k' and role='v'")
    if any(t.stride(-1) != 1 for t in (q, k, v, cos, sin)) or sin.stride(0) != cos.stride(0):
        raise ValueError("qk_norm_rope_kv_write: q/k/v/cos/sin need a unit last stride (and cos, sin the same "
                         "row stride)")
    out = torch.empty(B, Hq, D, device=q.device, dtype=q.dtype)
    if B == 0:
        return out
    kc, ks, kg = _cache_ptrs(k_cache)
    vc, vs, vg = _cache_ptrs(v_cache)
    has_norm = q_norm_weight is not None
    fmt = 0 if k_cache.fmt == "bf16" else FORMAT_IDS[k_cache.fmt]
    _qk_norm_rope_write_kernel[(B,)](
        q, k, v, out, k_out if k_out is not None else out, cos, sin,
        q_norm_weight if has_norm else cos, k_norm_weight if has_norm else cos, slots,
        kc, ks, kg, vc, vs, vg, eps, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0), out.stride(0), out.stride(1), HQ=Hq, HKV=Hkv, HQP=triton.next_power_of_2(Hq),
        HKVP=triton.next_power_of_2(Hkv), D=D, PAGE=k_cache.block_size, FMT=fmt, HAS_NORM=has_norm,
        HAS_KO=k_out is not None, ROUND=q.dtype == torch.bfloat16, num_warps=4)
    return out
