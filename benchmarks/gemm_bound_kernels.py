"""Probe kernels for benchmarks/gemm_bound.py: what bounds the W4A16 GEMM at M <= 16 (trace_rl/kernels/fp4_gemm.py).

A separate file, so that the shipped kernel's SASS stays what the compile gate holds (no probe switch in it). The
GEMM probe mirrors `_fp4_gemm_kernel`'s body line for line and calls the shipped jitted pieces (`_load_decode_w`
via `fp4_tile_mma`, `decode_w`, `finish_tile`), so its K loop is the shipped one except where MODE cuts it:

- MODE 0 (full): the shipped body; should time like `fp4_matmul` (a check that the mirror is faithful).
- MODE 1 (load-only): the K loop loads the same weight words, scale words and activation tile per step (same
  pointers, masks, pipelining: `tl.range(num_stages=...)`, since Triton only pipelines dot-free loops when told)
  and XOR-accumulates them in registers; one int32 per program is stored (no decode, no wgmma, no split-K epilogue).
- MODE 2 (compute-only): no weight loads: each step decodes words made in registers from the program id and the
  step (so nothing is hoisted or folded) and runs the same wgmmas on the loaded activation tile, same trip count,
  same split-K epilogue.

The load- and compute-only loops load the activation tile unmasked along K (K a multiple of BK: the probe's
shapes). `_stream_kernel` is the read floor: programs stream contiguous chunks of two int32 regions (the weight's values
and scale words) with 16-byte cp.async loads (STAGES deep) and reduce them to one XOR word each.
"""

from __future__ import annotations

import triton
import triton.language as tl

from trace_rl.kernels.fp4_gemm import decode_w, finish_tile, fp4_tile_mma

FULL, LOAD_ONLY, COMPUTE_ONLY = 0, 1, 2
MODES = {"full": FULL, "load_only": LOAD_ONLY, "compute_only": COMPUTE_ONLY}


@triton.jit
def _load_only_loop(x_ptrs, x_mask_m, w_ptrs, w_mask, s_ptrs, s_mask, kb_lo, kb_hi, BN: tl.constexpr,
                    BK: tl.constexpr, SW: tl.constexpr, MASK_W: tl.constexpr, STAGES: tl.constexpr):
    """XOR of every word the shipped K loop loads (weight words, scale words, activation bits) over its steps."""
    acc_w = tl.zeros([BN // 16, 2 * BK], dtype=tl.int32)
    acc_s = tl.zeros([BN, SW], dtype=tl.int32)
    acc_x = tl.zeros(x_ptrs.shape, dtype=tl.int16)
    for kb in tl.range(kb_lo, kb_hi, num_stages=STAGES):
        if MASK_W:
            w = tl.load(w_ptrs + kb * (2 * BK), mask=w_mask, other=0)
            sw = tl.load(s_ptrs + kb * SW, mask=s_mask, other=0)
        else:
            w = tl.load(w_ptrs + kb * (2 * BK))
            sw = tl.load(s_ptrs + kb * SW)
        x = tl.load(x_ptrs + kb * BK, mask=x_mask_m, other=0.0)
        acc_w ^= w
        acc_s ^= sw
        acc_x ^= x.to(tl.int16, bitcast=True)
    return tl.xor_sum(tl.ravel(acc_w), 0) ^ tl.xor_sum(tl.ravel(acc_s), 0) ^ \
        tl.xor_sum(tl.ravel(acc_x), 0).to(tl.int32)


@triton.jit
def _compute_only_loop(acc, x_ptrs, x_mask_m, seed, kb_lo, kb_hi, BN: tl.constexpr, BK: tl.constexpr,
                       SW: tl.constexpr, MX: tl.constexpr, DECODE: tl.constexpr, DOT_F32: tl.constexpr):
    """The shipped K loop with the weight loads replaced by register words that change every step."""
    w0 = (tl.arange(0, BN // 16)[:, None] * (2 * BK) + tl.arange(0, 2 * BK)[None, :]) * 1103515245 + seed
    # scale words: bytes 0x40-0x47 (a modest, finite scale in both formats' pre-biased encodings)
    s0 = (tl.arange(0, BN)[:, None] * SW + tl.arange(0, SW)[None, :]) & 0x07070707 | 0x40404040
    for kb in range(kb_lo, kb_hi):
        wt = decode_w(w0 ^ kb, s0 ^ (kb & 7), BN, BK, MX, DECODE, DOT_F32)
        x = tl.load(x_ptrs + kb * BK, mask=x_mask_m, other=0.0)
        if DOT_F32:
            acc = tl.dot(wt, tl.trans(x.to(tl.float32)), acc)
        else:
            acc = tl.dot(wt, tl.trans(x), acc)
    return acc


@triton.jit(do_not_specialize=["M", "N", "KB", "NP16", "SPLIT_K"])   # as the shipped kernel: one binary per mode
def _probe_gemm_kernel(
    x_ptr, w_ptr, s_ptr, rf_ptr, out_ptr, row_scale_ptr, bias_ptr, part_ptr, count_ptr, sink_ptr,
    M, N, K, KB, NP16, SPLIT_K, stride_xm, stride_w, stride_s, stride_om,
    MX: tl.constexpr, HAS_ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr, DOT_F32: tl.constexpr,
    EVEN_K: tl.constexpr, MASK_W: tl.constexpr, MODE: tl.constexpr, STAGES: tl.constexpr,
):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    SW: tl.constexpr = BK // 128 if MX else BK // 64
    n16 = pid_n * (BN // 16) + tl.arange(0, BN // 16)
    rows = pid_n * BN + tl.arange(0, BN)
    offs_m = pid_m * BM + tl.arange(0, BM)
    w_ptrs = w_ptr + n16[:, None].to(tl.int64) * stride_w + tl.arange(0, 2 * BK)[None, :]
    s_ptrs = s_ptr + rows[:, None].to(tl.int64) * stride_s + tl.arange(0, SW)[None, :]
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + tl.arange(0, BK)[None, :]
    per_split = tl.cdiv(KB, SPLIT_K)
    kb_lo = pid_k * per_split
    kb_hi = tl.minimum(kb_lo + per_split, KB)
    tl.assume(kb_hi > kb_lo)   # as the shipped kernel (its C7515 note)
    if MODE == 1:
        word = _load_only_loop(x_ptrs, (offs_m < M)[:, None], w_ptrs, (n16 < NP16)[:, None], s_ptrs,
                               (rows < NP16 * 16)[:, None], kb_lo, kb_hi, BN, BK, SW, MASK_W, STAGES)
        pid = (pid_k * tl.num_programs(1) + pid_m) * tl.num_programs(0) + pid_n
        tl.store(sink_ptr + pid, word)
    else:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        if MODE == 2:
            acc = _compute_only_loop(acc, x_ptrs, (offs_m < M)[:, None], pid_n * 7919 + pid_k, kb_lo, kb_hi, BN,
                                     BK, SW, MX, DECODE, DOT_F32)
        else:
            acc = fp4_tile_mma(acc, x_ptrs, (offs_m < M)[:, None], K, w_ptrs, (n16 < NP16)[:, None], s_ptrs,
                               (rows < NP16 * 16)[:, None], kb_lo, kb_hi, BN, BK, MX, DECODE, DOT_F32, EVEN_K,
                               MASK_W)
        finish_tile(acc, rows, offs_m, N, M, pid_n, pid_m, pid_k, SPLIT_K, rf_ptr, row_scale_ptr, bias_ptr,
                    out_ptr, stride_om, part_ptr, count_ptr, HAS_ROW_SCALE, HAS_BIAS, BM, BN)


@triton.jit
def _stream_region(acc, ptr, n, per_blocks, pid, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """acc ^= blocks [pid per_blocks, (pid+1) per_blocks) of the n words at ptr; the last program adds the partial
    block past the last full one. Whole blocks at multiples of BLOCK: unmasked 16-byte loads (cp.async stages)."""
    offs = tl.arange(0, BLOCK)
    full = n // BLOCK
    lo = pid * per_blocks
    hi = tl.minimum(lo + per_blocks, full)
    for j in tl.range(lo, hi, num_stages=STAGES):
        acc ^= tl.load(ptr + j * BLOCK + offs)      # int32 offsets: regions < 2**31 words
    if pid == tl.num_programs(0) - 1:
        tail = full * BLOCK + offs
        acc ^= tl.load(ptr + tail, mask=tail < n, other=0)
    return acc


@triton.jit(do_not_specialize=["n_a", "n_b", "per_a", "per_b"])
def _stream_kernel(a_ptr, b_ptr, sink_ptr, n_a, n_b, per_a, per_b, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """Program p XORs its share (per_a, per_b whole blocks of BLOCK words) of the int32 regions a and b into
    sink[p]."""
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    acc = _stream_region(acc, a_ptr, n_a, per_a, pid, BLOCK, STAGES)
    acc = _stream_region(acc, b_ptr, n_b, per_b, pid, BLOCK, STAGES)
    tl.store(sink_ptr + pid, tl.xor_sum(acc, 0))


def stream_words(a, b, sink, programs: int, block: int = 4096, stages: int = 3, num_warps: int = 4):
    """`_stream_kernel` over the flat int32 tensors a and b with `programs` programs (sink: int32 [>= programs]);
    the launch's CompiledKernel (None under the interpreter)."""
    per = [triton.cdiv(t.numel() // block, programs) for t in (a, b)]
    return _stream_kernel[(programs,)](a, b, sink, a.numel(), b.numel(), per[0], per[1], BLOCK=block, STAGES=stages,
                                       num_warps=num_warps)


def probe_matmul(x2, w, mode: int, config, out, sink=None):
    """`fp4_matmul(x2, w, config=config)` through the probe kernel in `mode` (FULL / LOAD_ONLY / COMPUTE_ONLY) into
    `out` ([M, N] bf16); the launcher's own grid, split normalisation and arguments. LOAD_ONLY writes one int32 per
    program into `sink` (int32, >= the grid's size) and leaves `out` unwritten. Returns the launch's CompiledKernel
    (registers, shared memory; None under the interpreter)."""
    import torch

    from trace_rl.kernels import interpreting
    from trace_rl.kernels.fp4_gemm import tile_counters
    from trace_rl.kernels.hopper_fp4 import COLS, ROWS

    M, K = x2.shape
    c = config
    np_, kp = w.padded
    if kp % c.block_k:
        c = c.__class__(**{**c.__dict__, "block_k": COLS})
    n_tiles, m_tiles = triton.cdiv(np_, c.block_n), triton.cdiv(M, c.block_m)
    kb = kp // c.block_k
    split = max(1, min(c.split_k, kb))
    split = triton.cdiv(kb, triton.cdiv(kb, split))
    if split > 1 and mode != LOAD_ONLY:
        part = torch.empty(n_tiles * m_tiles * split * c.block_n * c.block_m, device=x2.device, dtype=torch.float32)
        counters = tile_counters(x2.device, n_tiles * m_tiles)
    else:
        part = counters = w.row_factor
    if sink is None:
        sink = torch.empty(n_tiles * m_tiles * split, device=x2.device, dtype=torch.int32)
    G = 32 if w.fmt == "mxfp4" else 16
    interp = interpreting()
    return _probe_gemm_kernel[(n_tiles, m_tiles, split)](
        x2, w.values, w.scales.view(torch.int32), w.row_factor, out, w.row_factor, w.row_factor, part, counters,
        sink, M, w.n, K, kb, np_ // ROWS, split, x2.stride(0), w.values.stride(0), kp // (4 * G), out.stride(0),
        MX=w.fmt == "mxfp4", HAS_ROW_SCALE=False, HAS_BIAS=False, BM=c.block_m, BN=c.block_n, BK=c.block_k,
        DECODE=c.decode, DOT_F32=interp, EVEN_K=K % c.block_k == 0, MASK_W=np_ % c.block_n != 0, MODE=mode,
        STAGES=c.num_stages, num_warps=c.num_warps, num_stages=c.num_stages)


def probe_gate_case(cfg, fmt: str, mode: int):
    """A sass_gate case for the probe kernel in `mode` (compile-only checks: the mirror's loop against the
    shipped one's, the load-only loop's cp.async pipelining, the compute-only loop's wgmma)."""
    from trace_rl.kernels.fp4_decode import DECODE_ASM
    from trace_rl.kernels.fp4_gemm import GEMM_DIVISIBLE, GEMM_SIGNATURE
    from trace_rl.kernels.sass_gate import GateCase

    keys = list(GEMM_SIGNATURE)     # the shipped arguments with sink_ptr after count_ptr
    sig = {k: GEMM_SIGNATURE[k] for k in keys[:9]} | {"sink_ptr": "*i32"} | {k: GEMM_SIGNATURE[k] for k in keys[9:]}
    consts = dict(MX=fmt == "mxfp4", HAS_ROW_SCALE=False, HAS_BIAS=False, BM=cfg.block_m, BN=cfg.block_n,
                  BK=cfg.block_k, DECODE=DECODE_ASM, DOT_F32=False, EVEN_K=True, MASK_W=False, MODE=mode,
                  STAGES=cfg.num_stages)
    name = {v: k for k, v in MODES.items()}[mode]
    return GateCase(f"probe {name} {fmt} {cfg.block_m}x{cfg.block_n}x{cfg.block_k}", _probe_gemm_kernel, sig, consts,
                    cfg.num_warps, cfg.num_stages, cfg.block_n * cfg.block_k / (32 * cfg.num_warps), 99.0,
                    GEMM_DIVISIBLE + ("sink_ptr",), register_a=mode != LOAD_ONLY,
                    forbid=("STS", "STSM", "LDSM") if mode != LOAD_ONLY else ())


def stream_gate_case(block: int = 4096, stages: int = 3, num_warps: int = 4):
    """A sass_gate case for `_stream_kernel` (compile-only: its registers and shared memory)."""
    from trace_rl.kernels.sass_gate import GateCase

    sig = dict(a_ptr="*i32", b_ptr="*i32", sink_ptr="*i32", n_a="i32", n_b="i32", per_a="i32", per_b="i32")
    return GateCase(f"probe stream {block} s{stages}", _stream_kernel, sig, dict(BLOCK=block, STAGES=stages), num_warps,
                    stages, block / (32 * num_warps), 99.0, ("a_ptr", "b_ptr", "sink_ptr"), register_a=False,
                    forbid=())
