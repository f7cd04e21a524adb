"""Paged decode attention over a quantized KV cache (bf16, fp8_e4m3, nvfp4, mxfp4), grouped-query.

Split-KV ("flash decoding"): program (kv head, split, sequence) walks BLOCK_T tokens at a time through
its share of the sequence's pages, for all GROUP query heads of that kv head at once (padded to 16 rows
for the tensor cores). K and V rows are gathered through the block table and dequantized in registers:
FP4 codes -> bf16 value * block scale (exact, `fp4x8_to_bf16`), FP8 codes -> bf16 (exact). The per
(token, head) float32 factor (nvfp4 global scale, fp8 row scale) multiplies the scores for K and the
probabilities for V instead of every element. Online softmax in float32 (base 2); a second kernel
merges the splits. KV heads vary fastest over the grid so that the heads of one token, whose scales
share 32-byte sectors in the cache layout, are read at about the same time (one DRAM read, L2 hits).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trace_rl.formats.paged_kv import PagedKV
from trace_rl.kernels.fp_bits import (
    default_decode,
    dot_acc,
    e4m3_to_float,
    e8m0_to_float,
    fp4x8_to_bf16,
    scale_per_word,
)

KV_BF16, KV_FP8, KV_NVFP4, KV_MXFP4 = 0, 1, 2, 3
KV_FORMAT_IDS = {"bf16": KV_BF16, "fp8_e4m3:row": KV_FP8, "nvfp4:row": KV_NVFP4, "mxfp4": KV_MXFP4}
LOG2E = 1.4426950408889634


@triton.jit
def _fp8x4_to_bf16(words, DECODE: tl.constexpr):
    """int32 [R, C] words of 4 E4M3 codes (little-endian) -> bf16 [R, 4C] (exact)."""
    b0, b1, b2, b3 = words & 0xFF, (words >> 8) & 0xFF, (words >> 16) & 0xFF, (words >> 24) & 0xFF
    if DECODE == 0:
        f0, f1 = e4m3_to_float(b0).to(tl.bfloat16), e4m3_to_float(b1).to(tl.bfloat16)
        f2, f3 = e4m3_to_float(b2).to(tl.bfloat16), e4m3_to_float(b3).to(tl.bfloat16)
    else:
        f0 = b0.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
        f1 = b1.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
        f2 = b2.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
        f3 = b3.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
    return tl.reshape(tl.join(tl.join(f0, f2), tl.join(f1, f3)), [words.shape[0], words.shape[1] * 4])


@triton.jit
def _load_kv(c_ptr, s_ptr, g_ptr, row, t_mask, KV_FMT: tl.constexpr, HEAD_DIM: tl.constexpr,
             DECODE: tl.constexpr, SCALE_WORDS: tl.constexpr):
    """Rows (flat slot * heads + head) of one cache -> (bf16 [T, D] values, float32 [T] row factor).
    Codes are read as int32 words (16-byte loads; byte-wide loads of FP8 codes went through shared
    memory a byte at a time, and byte-wide scale loads were not pipelined: H200 run 1)."""
    if KV_FMT == 0:
        d = tl.arange(0, HEAD_DIM)
        x = tl.load(c_ptr + row[:, None] * HEAD_DIM + d[None, :], mask=t_mask[:, None], other=0.0)
        fac = tl.where(t_mask, 1.0, 0.0)
    elif KV_FMT == 1:
        w = tl.arange(0, HEAD_DIM // 4)
        words = tl.load(c_ptr + row[:, None] * (HEAD_DIM // 4) + w[None, :], mask=t_mask[:, None], other=0)
        x = _fp8x4_to_bf16(words, DECODE)
        fac = tl.load(s_ptr + row, mask=t_mask, other=0.0)
    else:
        G: tl.constexpr = 16 if KV_FMT == 2 else 32
        w = tl.arange(0, HEAD_DIM // 8)
        words = tl.load(c_ptr + row[:, None] * (HEAD_DIM // 8) + w[None, :], mask=t_mask[:, None], other=0)
        if SCALE_WORDS:   # s_ptr: the scales viewed as int32 (head_dim % (4G) == 0)
            sw_i = tl.arange(0, HEAD_DIM // (4 * G))
            sw = tl.load(s_ptr + row[:, None] * (HEAD_DIM // (4 * G)) + sw_i[None, :], mask=t_mask[:, None], other=0)
            scale = scale_per_word(sw, G, KV_FMT == 3)
        else:
            sg = tl.arange(0, HEAD_DIM // G)
            sc = tl.load(s_ptr + row[:, None] * (HEAD_DIM // G) + sg[None, :], mask=t_mask[:, None], other=0)
            if KV_FMT == 2:
                scale = e4m3_to_float(sc.to(tl.int32))
                scale = tl.join(scale, scale)
            else:
                scale = e8m0_to_float(sc.to(tl.int32))
                scale = tl.join(tl.join(scale, scale), tl.join(scale, scale))
            scale = tl.reshape(scale, [row.shape[0], HEAD_DIM // 8])
        if KV_FMT == 2:
            fac = tl.load(g_ptr + row, mask=t_mask, other=0.0)
        else:
            fac = tl.where(t_mask, 1.0, 0.0)
        x = fp4x8_to_bf16(words, scale, DECODE)
    return x, fac


@triton.jit
def _decode_attention_kernel(
    q_ptr, kc_ptr, ks_ptr, kg_ptr, vc_ptr, vs_ptr, vg_ptr, bt_ptr, lens_ptr, part_ptr, ml_ptr,
    qk_scale, stride_qb, stride_qh, stride_bt, tokens_per_split, splits,
    HEADS_KV: tl.constexpr, HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    PAGE: tl.constexpr, KV_FMT: tl.constexpr, BLOCK_T: tl.constexpr,
    DECODE: tl.constexpr, DOT_F32: tl.constexpr, SCALE_WORDS: tl.constexpr,
):
    h, split, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    t_lo = split * tokens_per_split
    t_hi = tl.minimum(t_lo + tokens_per_split, seq_len)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + (h * GROUP + g)[:, None] * stride_qh
    q = tl.load(q_rows + d[None, :], mask=(g < GROUP)[:, None], other=0.0).to(tl.bfloat16)
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    for t0 in range(t_lo, t_hi, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        t_mask = t < t_hi
        page = tl.load(bt_row + t // PAGE, mask=t_mask, other=0)
        row = (page.to(tl.int64) * PAGE + t % PAGE) * HEADS_KV + h
        k, k_fac = _load_kv(kc_ptr, ks_ptr, kg_ptr, row, t_mask, KV_FMT, HEAD_DIM, DECODE, SCALE_WORDS)
        s = dot_acc(q, tl.trans(k), tl.zeros([GROUP_PAD, BLOCK_T], dtype=tl.float32), DOT_F32)
        s = tl.where(t_mask[None, :], s * (k_fac * qk_scale)[None, :], float("-inf"))   # log2 domain
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v, v_fac = _load_kv(vc_ptr, vs_ptr, vg_ptr, row, t_mask, KV_FMT, HEAD_DIM, DECODE, SCALE_WORDS)
        acc = dot_acc((p * v_fac[None, :]).to(tl.bfloat16), v, acc * alpha[:, None], DOT_F32)
        m_i = m_new
    out_rows = (b * GROUP * HEADS_KV + h * GROUP + g).to(tl.int64) * splits + split   # [B, Hq, splits]
    g_mask = g < GROUP
    tl.store(part_ptr + out_rows[:, None] * HEAD_DIM + d[None, :], acc, mask=g_mask[:, None])
    tl.store(ml_ptr + out_rows * 2, m_i, mask=g_mask)
    tl.store(ml_ptr + out_rows * 2 + 1, l_i, mask=g_mask)


@triton.jit
def _merge_splits_kernel(part_ptr, ml_ptr, out_ptr, stride_ob, stride_oh, HQ: tl.constexpr,
                         HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr):
    bh = tl.program_id(0)                      # b * HQ + head
    s = tl.arange(0, SPLITS_PAD)
    s_mask = s < SPLITS
    d = tl.arange(0, HEAD_DIM)
    base = bh.to(tl.int64) * SPLITS + s
    m = tl.load(ml_ptr + base * 2, mask=s_mask, other=float("-inf"))
    l_s = tl.load(ml_ptr + base * 2 + 1, mask=s_mask, other=0.0)
    m_max = tl.max(m, axis=0)
    w = tl.where(m == float("-inf"), 0.0, tl.math.exp2(m - m_max))   # empty splits weigh nothing; NaN stays
    part = tl.load(part_ptr + base[:, None] * HEAD_DIM + d[None, :], mask=s_mask[:, None], other=0.0)
    num = tl.sum(part * w[:, None], axis=0)
    den = tl.sum(l_s * w, axis=0)
    out = tl.where(den == 0, 0.0, num / den)    # a sequence of length 0 gives zeros; NaN stays NaN
    b, head = bh // HQ, bh % HQ
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + head * stride_oh + d, out.to(out_ptr.dtype.element_ty))


def _scale_words(c: PagedKV) -> bool:
    """FP4 block scales can be read 4 to an int32 word when a row's scales fill whole words."""
    return c.fmt in ("nvfp4:row", "mxfp4") and c.scales.shape[-1] % 4 == 0


def _cache_args(c: PagedKV):
    """Flat pointers of one cache: codes (int32 words for FP4/FP8), scales (int32 words where possible),
    global scales."""
    for t in (c.codes, c.scales, c.global_scale):
        if t is not None and not t.is_contiguous():
            raise ValueError("decode_attention needs the PagedKV tensors contiguous (as PagedKV.allocate makes them)")
    if c.fmt == "bf16":
        if c.codes.dtype != torch.bfloat16:
            raise ValueError(f"the decode-attention kernel reads bf16 caches in bfloat16, not {c.codes.dtype}")
        return c.codes, c.codes, c.codes
    codes = c.codes.view(torch.uint8).view(torch.int32)
    if c.fmt == "fp8_e4m3:row":
        scales = c.scales
    else:
        scales = c.scales.view(torch.uint8)
        scales = scales.view(torch.int32) if _scale_words(c) else scales
    glob = codes if c.global_scale is None else c.global_scale
    return codes, scales, glob


def decode_attention(q: torch.Tensor, k: PagedKV, v: PagedKV, block_table: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float, *, block_t: int | None = None, splits: int | None = None,
                     decode: int | None = None) -> torch.Tensor:
    """Kernel version of `decode_attention_reference` (same signature); keyword tiles for benchmarks."""
    from trace_rl.kernels import interpreting

    B, Hq, D = q.shape
    P, page, hkv = k.codes.shape[:3]
    if k.fmt != v.fmt or k.fmt not in KV_FORMAT_IDS:
        raise ValueError(f"decode_attention: K/V formats {k.fmt!r}/{v.fmt!r}; both must be one of "
                         f"{', '.join(KV_FORMAT_IDS)}")
    if Hq % hkv or D != k.head_dim or D % 32 or D & (D - 1):
        raise ValueError(f"decode_attention: q [B, {Hq}, {D}] does not fit a cache of {hkv} heads x "
                         f"{k.head_dim} (query heads must be a multiple of kv heads; head_dim a power of 2 >= 32)")
    interp = interpreting()
    block_t = block_t or (32 if interp else 64)
    capacity = block_table.shape[1] * page               # static bound on lengths: no host sync (CUDA graphs)
    if splits is None:
        if interp:
            splits = 2
        else:
            sms = torch.cuda.get_device_properties(q.device).multi_processor_count
            splits = max(1, min(triton.cdiv(4 * sms, B * hkv), triton.cdiv(capacity, 4 * block_t)))
    per_split = triton.cdiv(triton.cdiv(capacity, splits), block_t) * block_t
    group = Hq // hkv
    part = torch.empty(B, Hq, splits, D, device=q.device, dtype=torch.float32)
    ml = torch.empty(B, Hq, splits, 2, device=q.device, dtype=torch.float32)
    kc, ks, kg = _cache_args(k)
    vc, vs, vg = _cache_args(v)
    bt = block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32)
    lens = seq_lens if seq_lens.dtype == torch.int32 else seq_lens.to(torch.int32)
    bt = bt if bt.stride(-1) == 1 else bt.contiguous()
    _decode_attention_kernel[(hkv, splits, B)](
        q, kc, ks, kg, vc, vs, vg, bt, lens, part, ml, scale * LOG2E, q.stride(0), q.stride(1), bt.stride(0),
        per_split, splits, HEADS_KV=hkv, HEAD_DIM=D, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        PAGE=page, KV_FMT=KV_FORMAT_IDS[k.fmt], BLOCK_T=block_t,
        DECODE=default_decode(q.device) if decode is None else decode, DOT_F32=interp, SCALE_WORDS=_scale_words(k),
        num_warps=4, num_stages=2)
    out = torch.empty(B, Hq, D, device=q.device, dtype=q.dtype)
    _merge_splits_kernel[(B * Hq,)](part, ml, out, out.stride(0), out.stride(1), HQ=Hq, HEAD_DIM=D,
                                    SPLITS=splits, SPLITS_PAD=triton.next_power_of_2(splits))
    return out
