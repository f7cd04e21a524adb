"""Paged decode attention over a quantized KV cache (bf16, fp8_e4m3, nvfp4, mxfp4), grouped-query.

Orientation (shared/notes/fp4-hopper-kernels.md 4.2): the tokens are the M of the MMAs. A program
(kv head, split, sequence) walks BLOCK_T tokens at a time and computes S^T = K q^T (K [T, D] the
register A operand, decoded from the cache in registers; q^T [D, N] in shared memory, the GROUP query
heads of the kv head padded to N >= 16 columns), an online softmax down the tokens, and
O^T = V^T P^T (V^T [DV, T] decoded in registers; P^T [T, N] the only tile that goes through shared
memory). The cache is laid out at write time (trace_rl/formats/kv_layout.py) so that a thread's MMA
fragment is one 16-byte load, its E2M1 codes decode with shifts and masks, and its block scales are the
bf16 pairs `mul.bf16x2` takes; the query is permuted once to K's column order and the output rows are
un-permuted once at the end. Per-token float32 factors (nvfp4 row scale x 2**7, fp8 row scale) multiply
the scores (K) and the probabilities (V), not the elements. bf16 caches keep their token-major pages and
are read through shared memory (both MMA operands from `wgmma` descriptors).

Full tiles run unmasked; the last (partial) tile of a split masks tokens past the sequence (their
scores -inf, their per-token factors 0; FP4 V block scales zeroed so that a stale NaN scale in a reused
page cannot leak in, while FP8 codes always decode finite and need no mask). Split-KV
when B x kv heads is small (`choose_splits`) or when the caller asks (`splits=`: the engine times split counts,
`attention_config.split_variants`): programs then write float32 partials, merged in a fixed order by a second
kernel (deterministic); with one split the output is written directly.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from trace_rl.formats import kv_layout as L
from trace_rl.formats.paged_kv import PagedKV
from trace_rl.kernels.attention_config import (
    SPLIT_BELOW_PROGRAMS_PER_SM,
    choose_splits,
    launch_config,
    split_tokens,
)
from trace_rl.kernels.attention_tiles import _k_tile, _low_half, _pad_half, _page_heads, _row_factor, _vt_tile
from trace_rl.kernels.fp_bits import dot_acc
from trace_rl.kernels.kv_decode import DECODE_ASM, DECODE_PURE

KV_BF16, KV_FP8, KV_NVFP4, KV_MXFP4 = 0, 1, 2, 3
KV_FORMAT_IDS = {"bf16": KV_BF16, "fp8_e4m3:row": KV_FP8, "nvfp4:row": KV_NVFP4, "mxfp4": KV_MXFP4}
LOG2E = 1.4426950408889634
# The last kernel `decode_attention` launches (the attention itself at one split, else the merge) signals
# griddepcontrol.launch_dependents once its tiles / loads are done, so the engine's next kernel when it is a PDL
# launch (o_proj's W4A4 quantize in a CUDA graph, kernels.linear.w4a4_quantize_pdl) starts under its last wave.
# Same results either way (the dependent waits for completion); False turns it off (check `oprojpf`'s A/B).
LAUNCH_DEPENDENTS = True
# 64-token tiles over FP4 caches with the partial last tile run after the full tiles gave wrong tails on the H200
# (docs/benchmarks.md, "Decode attention"); with it run first (the policy below) they pass every check there. The
# after-order is refused on the GPU; setting this variable to 1 lifts the refusal, for the script that reproduces
# the failure (benchmarks/attention_small_tiles.py).
ALLOW_SMALL_FP4_TILES_ENV = "TRACE_RL_TEST_SMALL_FP4_TILES"


# Where the partial last tile of a split runs: after the full tiles (the measured launches), or before them (64-token
# FP4 tiles). After the loop q^T, the QK MMA's shared-memory operand, is dead once the last tile's QK MMA has read
# it, and Triton 3.6 gives that tile's P^T and reduction scratch q^T's shared memory whenever q^T sits at offset 0:
# it does for 64-token FP4 tiles (and did for the 2-3 stage fp8 tile of the pipelined-tail bug, docs/benchmarks.md),
# not for the 128-token FP4, fp8 and 64-token fp8 tiles. Every configuration that failed on the H200 had that reuse
# and every one that passed had not (compiled for sm_90 on a CPU). Confirmed on the H200: run first, 64-token
# nvfp4/mxfp4 tiles pass every check (1-12 splits, tails of 1-63), run after they fail (benchmarks/results/
# attention_small_tiles_h200.jsonl). Run
# first, the last tile needs its buffers while q^T is live, so nothing of it can share q^T's memory. Not for the
# 128-token tiles: there it costs 39 more SASS instructions per loop iteration and 24 bytes of spills (nvfp4, 168
# registers). None: that policy; True / False force an order (for the GPU diagnosis).
LAST_TILE_FIRST: bool | None = None


def _last_tile_first(fmt_id: int, block_t: int) -> bool:
    if LAST_TILE_FIRST is not None:
        return LAST_TILE_FIRST
    return fmt_id in (KV_NVFP4, KV_MXFP4) and block_t < 128


def _small_fp4_tiles_allowed() -> bool:
    return os.environ.get(ALLOW_SMALL_FP4_TILES_ENV) == "1"

@triton.jit
def _tile(q_t, m_i, l_acc, acc, kc, ks, kg, vc, vs, vg, bt_row, h, t0, t_hi, qk_scale,
          HKV: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, PAGE: tl.constexpr, LOG2_PAGE: tl.constexpr,
          BLOCK_T: tl.constexpr, KV_FMT: tl.constexpr, MODE: tl.constexpr, DOT_F32: tl.constexpr,
          MASKED: tl.constexpr, HALF: tl.constexpr):
    """One tile of BLOCK_T tokens from t0: online-softmax update of (m_i [NS], l_acc [T, NS], acc [DV, N]);
    NS = N / 2 when HALF (the group fits the low half of the padded columns), else N."""
    NP: tl.constexpr = BLOCK_T // PAGE if BLOCK_T > PAGE else 1
    RP: tl.constexpr = BLOCK_T // NP
    hp = _page_heads(bt_row, t0, t_hi, h, HKV, NP, LOG2_PAGE, MASKED)
    r0 = t0 & (PAGE - 1)
    t = t0 + tl.arange(0, BLOCK_T)
    k = _k_tile(kc, ks, hp, r0, HKV, D, PAGE, NP, RP, KV_FMT, MODE)
    s = dot_acc(k, q_t, tl.zeros([BLOCK_T, q_t.shape[1]], dtype=tl.float32), DOT_F32)   # [T, N]
    if HALF:
        s = _low_half(s)
    if KV_FMT == 1 or KV_FMT == 2:
        fk = _row_factor(kg, hp, r0, t, t_hi, PAGE, NP, RP, MASKED, KV_FMT == 1) * qk_scale
        s = s * fk[:, None]
    else:
        s = s * qk_scale
    if MASKED:
        s = tl.where((t < t_hi)[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=0))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[None, :])
    l_acc = l_acc * alpha[None, :] + p
    if KV_FMT == 1 or KV_FMT == 2:
        p = p * _row_factor(vg, hp, r0, t, t_hi, PAGE, NP, RP, MASKED, KV_FMT == 1)[:, None]
    if HALF:
        p = _pad_half(p, 0.0)
        alpha = tl.reshape(_pad_half(alpha[None, :], 1.0), [2 * alpha.shape[0]])
    vt = _vt_tile(vc, vs, hp, r0, t0, t_hi, HKV, D, DV, PAGE, NP, RP, KV_FMT, MODE, MASKED)
    if DOT_F32:
        acc = dot_acc(vt, p, acc * alpha[None, :], DOT_F32)
    else:
        acc = tl.dot(vt, p.to(tl.bfloat16), acc * alpha[None, :])
    return m_new, l_acc, acc


@triton.jit
def _decode_attention_kernel(
    q_ptr, kc, ks, kg, vc, vs, vg, bt_ptr, lens_ptr, out_ptr, part_ptr, ml_ptr,
    qk_scale, stride_qb, stride_qh, stride_ob, stride_oh, stride_bt, tokens_per_split, splits,
    HKV: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, GROUP: tl.constexpr, N: tl.constexpr,
    PAGE: tl.constexpr, LOG2_PAGE: tl.constexpr, KV_FMT: tl.constexpr, BLOCK_T: tl.constexpr, MODE: tl.constexpr,
    DOT_F32: tl.constexpr, SPLIT: tl.constexpr, LAST_TILE_FIRST: tl.constexpr, LAUNCH_DEPS: tl.constexpr = False,
):
    h, split, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    t_lo = split * tokens_per_split
    t_hi = tl.minimum(t_lo + tokens_per_split, seq_len)
    n = tl.arange(0, N)
    c = tl.arange(0, D)
    if KV_FMT == 0:
        dim = c
    else:            # K's MMA column order (trace_rl/formats/kv_layout.py: pi)
        dim = (D // 4) * ((c >> 1) & 3) + (D // 8) * (c & 1) + 2 * (c >> 4) + ((c >> 3) & 1)
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + (h * GROUP + n)[None, :] * stride_qh
    q_t = tl.load(q_rows + dim[:, None], mask=(n < GROUP)[None, :], other=0.0).to(tl.bfloat16)   # [D, N]
    if DOT_F32:
        q_t = q_t.to(tl.float32)
    HALF: tl.constexpr = GROUP <= N // 2
    NS: tl.constexpr = N // 2 if HALF else N
    m_i = tl.full([NS], float("-inf"), dtype=tl.float32)
    l_acc = tl.zeros([BLOCK_T, NS], dtype=tl.float32)
    acc = tl.zeros([DV, N], dtype=tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    t_full = t_lo + tl.maximum(t_hi - t_lo, 0) // BLOCK_T * BLOCK_T
    if LAST_TILE_FIRST and t_full < t_hi:    # see _last_tile_first
        m_i, l_acc, acc = _tile(q_t, m_i, l_acc, acc, kc, ks, kg, vc, vs, vg, bt_row, h, t_full, t_hi,
                                qk_scale, HKV, D, DV, PAGE, LOG2_PAGE, BLOCK_T, KV_FMT, MODE, DOT_F32, True, HALF)
    for t0 in range(t_lo, t_full, BLOCK_T):
        m_i, l_acc, acc = _tile(q_t, m_i, l_acc, acc, kc, ks, kg, vc, vs, vg, bt_row, h, t0, t_hi, qk_scale,
                                HKV, D, DV, PAGE, LOG2_PAGE, BLOCK_T, KV_FMT, MODE, DOT_F32, False, HALF)
    if not LAST_TILE_FIRST and t_full < t_hi:
        m_i, l_acc, acc = _tile(q_t, m_i, l_acc, acc, kc, ks, kg, vc, vs, vg, bt_row, h, t_full, t_hi,
                                qk_scale, HKV, D, DV, PAGE, LOG2_PAGE, BLOCK_T, KV_FMT, MODE, DOT_F32, True, HALF)
    if LAUNCH_DEPS:   # the tiles are done: the next PDL launch may start under this wave's epilogue (LAUNCH_DEPENDENTS)
        tl.extra.cuda.gdc_launch_dependents()
    l_i = tl.sum(l_acc, axis=0)
    if HALF:
        acc = _low_half(acc)
        n = tl.arange(0, NS)
    if KV_FMT == 2:    # nvfp4 V elements decode to code * scale / 2**7
        acc = acc * 128.0
    rho = tl.arange(0, DV)
    if KV_FMT == 0:
        out_dim = rho
    else:            # V^T's MMA row order
        g, hr, w, mt = rho & 7, (rho >> 3) & 1, (rho >> 4) & 3, rho >> 6
        out_dim = 16 * (2 * w + (g >> 2)) + 4 * (g & 3) + 2 * (mt & 1) + hr + 128 * (mt >> 1)
    keep = (out_dim < D)[:, None] & (n < GROUP)[None, :]
    if SPLIT:
        rows = (b * GROUP * HKV + h * GROUP + n).to(tl.int64) * splits + split                # [B, Hq, splits]
        tl.store(part_ptr + rows[None, :] * D + out_dim[:, None], acc, mask=keep)
        tl.store(ml_ptr + rows * 2, m_i, mask=n < GROUP)
        tl.store(ml_ptr + rows * 2 + 1, l_i, mask=n < GROUP)
    else:
        o = tl.where(l_i[None, :] == 0, 0.0, acc / l_i[None, :])    # a sequence of length 0 gives zeros
        o_ptr = out_ptr + b.to(tl.int64) * stride_ob + (h * GROUP + n)[None, :] * stride_oh + out_dim[:, None]
        tl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=keep)


@triton.jit
def _merge_splits_kernel(part_ptr, ml_ptr, out_ptr, stride_ob, stride_oh, HQ: tl.constexpr,
                         HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr,
                         LAUNCH_DEPS: tl.constexpr = False):
    """Fixed-order merge of the splits' partials (deterministic)."""
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
    if LAUNCH_DEPS:                             # loads done: the next PDL launch may start (LAUNCH_DEPENDENTS)
        tl.extra.cuda.gdc_launch_dependents()
    b, head = bh // HQ, bh % HQ
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + head * stride_oh + d, out.to(out_ptr.dtype.element_ty))


def _check(q, k: PagedKV, v: PagedKV, block_table, seq_lens):
    B, Hq, D = q.shape
    if k.fmt != v.fmt or k.fmt not in KV_FORMAT_IDS:
        raise ValueError(f"decode_attention: K/V formats {k.fmt!r}/{v.fmt!r}; both must be one of "
                         f"{', '.join(KV_FORMAT_IDS)}")
    if k.fmt != "bf16" and (k.role, v.role) != ("k", "v"):
        raise ValueError(f"decode_attention: the caches must be allocated with role='k' and role='v' "
                         f"(got {k.role!r}, {v.role!r}): V is stored transposed")
    if (k.block_size, k.heads, k.head_dim) != (v.block_size, v.heads, v.head_dim):
        raise ValueError("decode_attention: K and V caches differ in page size, heads or head_dim")
    if Hq % k.heads or D != k.head_dim or D < 16 or D & (D - 1):
        raise ValueError(f"decode_attention: q [B, {Hq}, {D}] does not fit a cache of {k.heads} heads x "
                         f"{k.head_dim} (query heads must be a multiple of kv heads; head_dim a power of 2)")
    page = k.block_size
    if page & (page - 1) or (k.fmt != "bf16" and page < 16):
        raise ValueError(f"decode_attention: page size {page} must be a power of two (>= 16 for quantized "
                         f"caches; default {L.DEFAULT_BLOCK_SIZE[k.kv_format]})")
    if block_table.dim() != 2 or block_table.shape[0] != B or seq_lens.shape != (B,):
        raise ValueError(f"decode_attention: block_table must be [B={B}, pages] and seq_lens [B]")
    for t in (k.codes, k.scales, k.global_scale, v.codes, v.scales, v.global_scale):
        if t is not None and not t.is_contiguous():
            raise ValueError("decode_attention needs the PagedKV tensors contiguous (as PagedKV.allocate makes them)")


def _cache_args(c: PagedKV):
    """Flat pointers: codes (int32 words, bf16 for bf16 caches), scales (int32 words / float32 row
    scales), per-token float32 factors."""
    if c.fmt == "bf16":
        if c.codes.dtype != torch.bfloat16:
            raise ValueError(f"the decode-attention kernel reads bf16 caches in bfloat16, not {c.codes.dtype}")
        return c.codes, c.codes, c.codes
    codes = c.codes.view(torch.int32)
    if c.fmt == "fp8_e4m3:row":
        return codes, c.scales, c.scales
    glob = c.global_scale if c.global_scale is not None else c.scales
    return codes, c.scales.view(torch.int32), glob


def decode_attention(q: torch.Tensor, k: PagedKV, v: PagedKV, block_table: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float, *, block_t: int | None = None, splits: int | None = None,
                     decode: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                     programs_per_sm: float | None = None, maxnreg: int | None = 0,
                     launch_dependents: bool | None = None) -> torch.Tensor:
    """Kernel version of `decode_attention_reference` (same signature). The launch follows
    `attention_config` (tile per format, splits per shape); the keywords override it for benchmarks and for
    the engine's timed split counts (None / 0: the configured value; maxnreg=None: no register cap). `splits`
    divides the block table's capacity into whole tiles (`split_tokens`: fewer may launch); any count gives the
    reference's result, merged in a fixed order. `launch_dependents` (None: LAUNCH_DEPENDENTS): the last kernel
    signals griddepcontrol.launch_dependents once its tiles are done (no effect on the result)."""
    from trace_rl.kernels import interpreting

    _check(q, k, v, block_table, seq_lens)
    B, Hq, D = q.shape
    hkv, page = k.heads, k.block_size
    fmt_id = KV_FORMAT_IDS[k.fmt]
    interp = interpreting()
    capacity = block_table.shape[1] * page               # static bound on lengths: no host sync (CUDA graphs)
    sms = 4 if interp else torch.cuda.get_device_properties(q.device).multi_processor_count
    cfg, policy_splits = launch_config(k.kv_format, B, hkv, capacity, sms)
    block_t = block_t or (64 if interp else cfg.block_t)
    num_warps = num_warps or cfg.num_warps
    num_stages = num_stages or cfg.num_stages
    maxnreg = cfg.maxnreg if maxnreg == 0 else maxnreg
    if (fmt_id in (KV_NVFP4, KV_MXFP4) and block_t < 128 and not _last_tile_first(fmt_id, block_t) and not interp
            and not _small_fp4_tiles_allowed()):
        raise ValueError(f"decode_attention: block_t={block_t} over an FP4 cache with the partial last tile run after "
                         "the full tiles (LAST_TILE_FIRST=False) gives wrong results on the H200 "
                         "(benchmarks/results/attention_small_tiles_h200.jsonl); leave LAST_TILE_FIRST at None "
                         f"(set {ALLOW_SMALL_FP4_TILES_ENV}=1 only to reproduce the failure)")
    if block_t % page and page % block_t:
        raise ValueError(f"decode_attention: block_t={block_t} and the page size {page} must divide one another")
    if splits is None:
        if interp:
            splits = 2
        elif programs_per_sm is None and (block_t, num_warps, maxnreg) == (cfg.block_t, cfg.num_warps, cfg.maxnreg):
            splits = policy_splits
        else:                                            # an explicit tile: fill the GPU
            splits = choose_splits(B, hkv, capacity, block_t, sms,
                                   programs_per_sm or SPLIT_BELOW_PROGRAMS_PER_SM[k.kv_format])
    elif splits < 1:
        raise ValueError(f"decode_attention: splits={splits}; give a count >= 1 (None: the launch policy's)")
    per_split, splits = split_tokens(capacity, splits, block_t)
    group = Hq // hkv
    n_pad = max(16, triton.next_power_of_2(group))
    dv = D if fmt_id == KV_BF16 else L.v_rows(D)
    out = torch.empty(B, Hq, D, device=q.device, dtype=q.dtype)
    if splits > 1:
        part = torch.empty(B, Hq, splits, D, device=q.device, dtype=torch.float32)
        ml = torch.empty(B, Hq, splits, 2, device=q.device, dtype=torch.float32)
    else:
        part = ml = out
    kc, ks, kg = _cache_args(k)
    vc, vs, vg = _cache_args(v)
    bt = block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32)
    bt = bt if bt.stride(-1) == 1 else bt.contiguous()
    lens = seq_lens if seq_lens.dtype == torch.int32 else seq_lens.to(torch.int32)
    if decode is None:
        decode = DECODE_PURE if interp else DECODE_ASM
    # the LAST kernel launched signals griddepcontrol.launch_dependents (compiled kernels only, as row_quantize's)
    deps = (LAUNCH_DEPENDENTS if launch_dependents is None else launch_dependents) and not interp
    qk = scale * LOG2E * (L.NVFP4_FACTOR if fmt_id == KV_NVFP4 else 1.0)
    _decode_attention_kernel[(hkv, splits, B)](
        q, kc, ks, kg, vc, vs, vg, bt, lens, out, part, ml, qk, q.stride(0), q.stride(1), out.stride(0),
        out.stride(1), bt.stride(0), per_split, splits, HKV=hkv, D=D, DV=dv, GROUP=group, N=n_pad, PAGE=page,
        LOG2_PAGE=page.bit_length() - 1,
        KV_FMT=fmt_id, BLOCK_T=block_t, MODE=decode, DOT_F32=interp, SPLIT=splits > 1,
        LAST_TILE_FIRST=_last_tile_first(fmt_id, block_t), LAUNCH_DEPS=deps and splits == 1,
        num_warps=num_warps, num_stages=num_stages, **({} if maxnreg is None or interp else {"maxnreg": maxnreg}))
    if splits > 1:
        _merge_splits_kernel[(B * Hq,)](part, ml, out, out.stride(0), out.stride(1), HQ=Hq, HEAD_DIM=D,
                                        SPLITS=splits, SPLITS_PAD=triton.next_power_of_2(splits), LAUNCH_DEPS=deps)
    return out


@triton.jit
def _decode_tiles_kernel(kc, ks, out_ptr, HKV: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, PAGE: tl.constexpr,
                         KV_FMT: tl.constexpr, ROLE_V: tl.constexpr, MODE: tl.constexpr):
    """Decode one (page, head) block exactly as the attention kernel does; write float32 [PAGE, D] values
    (code x block scale; nvfp4 undone from its 2**-7) to out [P*PAGE, HKV, D]."""
    p, h = tl.program_id(0), tl.program_id(1)
    hp = tl.zeros([1], dtype=tl.int64) + p * HKV + h
    t = tl.arange(0, PAGE)
    scale = 128.0 if KV_FMT == 2 else 1.0
    if ROLE_V:
        vt = _vt_tile(kc, ks, hp, 0, 0, PAGE, HKV, D, DV, PAGE, 1, PAGE, KV_FMT, MODE, False).to(tl.float32)
        rho = tl.arange(0, DV)
        g, hr, w, mt = rho & 7, (rho >> 3) & 1, (rho >> 4) & 3, rho >> 6
        dim = 16 * (2 * w + (g >> 2)) + 4 * (g & 3) + 2 * (mt & 1) + hr + 128 * (mt >> 1)
        ptrs = out_ptr + ((p * PAGE + t)[None, :] * HKV + h) * D + dim[:, None]
        tl.store(ptrs, vt * scale, mask=(dim < D)[:, None])
    else:
        k = _k_tile(kc, ks, hp, 0, HKV, D, PAGE, 1, PAGE, KV_FMT, MODE).to(tl.float32)
        c = tl.arange(0, D)
        dim = (D // 4) * ((c >> 1) & 3) + (D // 8) * (c & 1) + 2 * (c >> 4) + ((c >> 3) & 1)
        tl.store(out_ptr + ((p * PAGE + t)[:, None] * HKV + h) * D + dim[None, :], k * scale)


def decode_tiles(cache: PagedKV, decode: int | None = None) -> torch.Tensor:
    """Every stored value of a quantized cache as the attention kernel decodes it: float32 [P*S, H, D] =
    code x block scale (FP4) or the E4M3 value (FP8), before the per-token float32 factor. For tests."""
    from trace_rl.kernels import interpreting

    if cache.fmt == "bf16":
        raise ValueError("decode_tiles: a bf16 cache holds its values as they are")
    P, S, H, D = cache.num_blocks, cache.block_size, cache.heads, cache.head_dim
    if S < 64 or S & (S - 1):
        raise ValueError(f"decode_tiles decodes whole pages of 64 tokens or more (a power of two); got {S}")
    out = torch.full((P * S, H, D), float("nan"), device=cache.codes.device, dtype=torch.float32)
    codes, scales, _ = _cache_args(cache)
    if decode is None:
        decode = DECODE_PURE if interpreting() else DECODE_ASM
    _decode_tiles_kernel[(P, H)](codes, scales, out, HKV=H, D=D, DV=L.v_rows(D), PAGE=S,
                                 KV_FMT=KV_FORMAT_IDS[cache.fmt], ROLE_V=cache.role == "v", MODE=decode, num_warps=4)
    return out
