"""Gluon FP4 W4A16 GEMM with up to 256 tokens per CTA (issue 15, M = 64 .. 512; opt-in, not dispatched).

out[M, N] = x[M, K] @ dequant(W)^T for an nvfp4 / mxfp4 weight in the Hopper layout (hopper_fp4.py), the same data
path and bits per k16 as fp4_gemm_gluon.py (same decode PTX, same register-A swap-AB wgmma, fp32 accumulation, same
epilogue `_finish`), but with the token tile as wide as wgmma allows: BM = 256 tokens is the wgmma N
(HGMMA 64x256x16), so at M <= 256 every weight element is decoded ONCE per CTA (the 128-token wide tiles decode it
twice at M = 256, four times at M = 512) and each decoded k16 fragment feeds 256 tokens.

Why a separate kernel and not `block_m=256` of the wide configs: the activation tile is the ring's big buffer
(BM x BK bf16). At 256 tokens and the wide kernel's 256 (nvfp4) / 512 (mxfp4) column K steps one slot is 128 /
256 KB, so not even two fit in 227 KB. Here a K step is ONE 128-column decode chunk for both formats: a slot is the
activation box [256, 128] bf16 (64 KB), the layout words [1, BN/16, 256] (8 KB at BN = 128) and the scale words;
three slots = 222 KB. The scale box stays TMA's narrowest (16 bytes = 4 int32 words per row) but starts at the
step's first word (`SW_STEP` words per 128 columns: 2 nvfp4, 1 mxfp4); the words past the step's are fetched and
ignored (a TMA box may start at any element; past the row end it is zero-filled), 2 KB per step.

Roles (as fp4_gemm_gluon.py): a producer warp (24 registers after setmaxnreg) streams the three boxes into a
STAGES-deep ring (`ready` with expect-tx, `empty` released by the consumers); the default partition is two consumer
warpgroups, 64 weight rows each (BN = 128): accumulator [64, BM] fp32 = BM / 2 registers per thread (128 at BM =
256), the decoded chunk [64, 128] bf16 = 32 registers. With OVERLAP the chunk's wgmmas stay in flight under the next
chunk's decode (wait(1)); the slot of step it - 1 is released once step it's first wait has retired step it - 1's
wgmmas. Grid (N tiles, split, token tiles); the split-K reduction is fp4_gemm_gluon_epilogue._finish (partials +
ticket, the last program adds in split order: deterministic).

Gluon has no interpreter: GPU only (sm_90, Triton 3.6); the compile gate (`sass_gate_cases`) compiles it anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from trace_rl.kernels.fp4_gemm_gluon import _capability, _decode_chunk, _finish, _sm_count, auto_split
from trace_rl.kernels.hopper_fp4 import COLS, ROWS, HopperFP4

BK = 128                  # columns per K step: one decode chunk
SCALE_BOX_WORDS = 4       # TMA's narrowest box: 16 bytes per row
SMEM_LIMIT = 227 * 1024


def scale_words_per_step(fmt: str) -> int:
    """int32 scale words per weight row and 128 columns: a byte per 16 nvfp4 / 32 mxfp4 columns."""
    if fmt not in ("nvfp4", "mxfp4"):
        raise ValueError(f"fp4_gemm_wide256 takes nvfp4 or mxfp4 weights, got {fmt!r}")
    return 2 if fmt == "nvfp4" else 1


@dataclass(frozen=True)
class Wide256Config:
    """BN weight rows (64 per consumer warpgroup: num_warps = BN / 16) x up to `block_m` tokens (the wgmma N: the
    smallest of 64 / 128 / 256 covering M, a grid over token tiles past it), `stages` ring slots (0: as many as fit,
    up to 8: 3 at 256 tokens, 5 at 128, 8 at 64 — a step's MMA time falls with the token tile while the load latency
    does not, so the narrower tiles keep more steps in flight), `split_k` (0:
    auto_split over the SMs, one CTA per SM), `overlap`, `maxnreg` (the budget the kernel is compiled for; the
    consumers get more through setmaxnreg)."""

    block_n: int = 128
    block_m: int = 256
    stages: int = 0
    split_k: int = 0
    overlap: bool = True
    maxnreg: int = 168

    @property
    def num_warps(self) -> int:
        return self.block_n // 16

    def check(self) -> None:
        if self.block_n not in (64, 128):
            raise ValueError(f"{self}: block_n must be 64 or 128 (one or two consumer warpgroups of 64 rows)")
        if self.block_m not in TOKEN_TILES:
            raise ValueError(f"{self}: block_m must be one of {TOKEN_TILES} (the wgmma N)")
        if not (self.stages == 0 or 2 <= self.stages <= 8) or self.split_k < 0:
            raise ValueError(f"{self}: stages must be 0 (auto) or in 2..8 and split_k >= 0")

    def tile_m(self, M: int) -> int:
        return next((t for t in TOKEN_TILES if t >= min(M, self.block_m)), self.block_m)

    def slot_bytes(self, block_m: int) -> int:
        return block_m * BK * 2 + self.block_n * BK // 2 + self.block_n * SCALE_BOX_WORDS * 4

    def slots(self, block_m: int) -> int:
        """Ring slots at `block_m` tokens: `stages`, or as many as fit in SMEM_LIMIT (at most 8)."""
        return self.stages or min(8, (SMEM_LIMIT - 1024) // self.slot_bytes(block_m))

    def smem_bytes(self, block_m: int) -> int:
        return self.slots(block_m) * self.slot_bytes(block_m) + 1024

    def ctas_per_sm(self, block_m: int) -> int:
        """Resident CTAs per SM: by shared memory (228 KB, 1 KB reserved per CTA) and registers (maxnreg for every
        thread of the consumer warps and the producer's warpgroup)."""
        by_smem = (228 * 1024) // (self.smem_bytes(block_m) + 1024)
        by_regs = 65536 // (self.maxnreg * (self.num_warps + 4) * 32)
        return max(1, min(by_smem, by_regs))


TOKEN_TILES = (64, 128, 256)
WIDE256 = Wide256Config()
# variants the benchmark times (each gated): no overlap (the two warpgroups' wgmmas still interleave), two slots
VARIANTS = {"w256": WIDE256, "w256_nooverlap": Wide256Config(overlap=False, maxnreg=168),
            "w256_s2": Wide256Config(stages=2)}
# M <= 64 (or 64-token tiles past it): two CTAs per SM, 4 slots of 27 KB each, maxnreg 80 (the consumers get 104
# after setmaxnreg; overlap compiles without spills or serialised wgmmas down to maxnreg 72): two independent
# consumers per SM to hide the decode's latency at the short 64-token steps
WIDE64_2CTA = Wide256Config(block_m=64, stages=4, maxnreg=80)


@gluon.jit
def _producer256(w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, n16_0, row0, m0, kb_lo, n_iters,
                 SW_STEP: gl.constexpr, STAGES: gl.constexpr):
    """1 warp: step `kb_lo + it`'s words [1, BN/16, 256], scale words [BN, 4] from word SW_STEP x kb and activations
    [BM, 128] into slot it % STAGES once the consumers have released it."""
    nbytes: gl.constexpr = w_desc.block_type.nbytes + s_desc.block_type.nbytes + x_desc.block_type.nbytes
    for it in range(n_iters):
        slot = it % STAGES
        mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)   # a fresh barrier passes the first round
        bar = ready.index(slot)
        mbarrier.expect(bar, nbytes)
        kb = kb_lo + it
        tma.async_copy_global_to_shared(w_desc, [kb, n16_0, 0], bar, w_bufs.index(slot))
        tma.async_copy_global_to_shared(s_desc, [row0, kb * SW_STEP], bar, s_bufs.index(slot))
        tma.async_copy_global_to_shared(x_desc, [m0, kb * 128], bar, x_bufs.index(slot))


@gluon.jit
def _consumer256(w_bufs, s_bufs, x_bufs, ready, empty, n_iters, BN: gl.constexpr, BM: gl.constexpr,
                 STAGES: gl.constexpr, OVERLAP: gl.constexpr, MX: gl.constexpr):
    """Default partition (BN / 16 warps, warp w owning weight rows 16 w ..): per 128-column step, LDS.128 of the
    words, decode to the register A operand, HGMMA 64xBMx16 x 8 against the activation slot; returns (acc, )."""
    NW: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BM, 16])
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    W_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, 2, 2], [1, 1, 8, 4, 1, 1], [NW, 1, 1, 1, 1, 1],
                                              [5, 4, 3, 2, 1, 0])
    RAW6: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [5, 4, 3, 2, 1, 0])
    w_raw = w_bufs._reinterpret(gl.int32, [STAGES, BN // 16, 2, 8, 4, 2, 2], RAW6)
    if MX:   # word 0 of the 4-word box: byte i covers K-slices 2i, 2i + 1
        S_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1], [1, 1, 8, 4], [NW, 1, 1, 1], [3, 2, 1, 0])
        s_raw = s_bufs._reinterpret(gl.int32, [STAGES, BN // 16, 2, 8, 4],
                                    gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0]))
    else:    # words 0, 1 of the box (as [2, 2]: the first pair): byte b of word j is K-slice 4j + b
        S_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, 2], [1, 1, 8, 4, 1], [NW, 1, 1, 1, 1],
                                                  [4, 3, 2, 1, 0])
        s_raw = s_bufs._reinterpret(gl.int32, [STAGES, BN // 16, 2, 8, 2, 2],
                                    gl.SwizzledSharedLayout(1, 1, 1, [4, 3, 2, 1, 0]))
    acc = gl.zeros([BN, BM], gl.float32, mma)
    a_prev = gl.zeros([BN, 128], gl.bfloat16, A_LAYOUT)
    for it in range(n_iters):
        slot = it % STAGES
        mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
        w = w_raw.index(slot).load(W_LAYOUT)                          # [BN/16, 2, 8, 4, 2, 2] int32
        s = s_raw.index(slot).slice(0, 1, dim=3).load(S_LAYOUT)      # [BN/16, 2, 8, 1(, 2)] int32
        a = _decode_chunk(w, s, W_LAYOUT, A_LAYOUT, BN, MX)
        acc = warpgroup_mma(a, x_bufs.index(slot).permute((1, 0)), acc, is_async=True)
        if OVERLAP:
            acc, a_prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_prev))
            a_prev = a
            # step it - 1's wgmmas have retired: its slot can be refilled
            fence_async_shared()
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), count=1, pred=it > 0)
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            fence_async_shared()
            mbarrier.arrive(empty.index(slot), count=1)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    return (acc, )


@gluon.jit(do_not_specialize=["M", "N", "KB", "SPLIT_K"])
def _fp4_gemm_wide256_kernel(w_desc, s_desc, x_desc, rf_ptr, out_ptr, part_ptr, count_ptr, M, N, KB, SPLIT_K,
                             stride_om, BN: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr,
                             OVERLAP: gl.constexpr, MX: gl.constexpr):
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    pid_m = gl.program_id(2)
    tile = pid_m * gl.num_programs(0) + pid_n
    per_split = gl.cdiv(KB, SPLIT_K)
    kb_lo = pid_k * per_split
    n_iters = gl.minimum(kb_lo + per_split, KB) - kb_lo
    w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    s_bufs = gl.allocate_shared_memory(gl.int32, [STAGES] + s_desc.block_type.shape, s_desc.layout)
    x_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    SW_STEP: gl.constexpr = 1 if MX else 2
    (acc, ) = gl.warp_specialize([
        (_consumer256, (w_bufs, s_bufs, x_bufs, ready, empty, n_iters, BN, BM, STAGES, OVERLAP, MX)),
        (_producer256, (w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, pid_n * (BN // 16),
                        pid_n * BN, pid_m * BM, kb_lo, n_iters, SW_STEP, STAGES)),
    ], [1], [24])
    _finish(acc, pid_n, pid_m, tile, pid_k, SPLIT_K, M, N, rf_ptr, out_ptr, part_ptr, count_ptr, stride_om, BN, BM)


def shared_layouts(block_m: int):
    """The TMA boxes' shared layouts (words, scale words, activations): the launch's and the gate's."""
    return (gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3),
            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2),
            gl.NVMMASharedLayout.get_default_for([block_m, BK], gl.bfloat16))


def fp4_matmul_wide256(x2: torch.Tensor, w: HopperFP4, config: Wide256Config | None = None,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """x2 [M, K] bf16 @ W^T (nvfp4 / mxfp4 Hopper layout) -> [M, N] bf16 (or `out`'s dtype). Nothing synchronises
    (capturable). Needs an sm_90 GPU and Triton 3.6."""
    from trace_rl.kernels.fp4_gemm import tile_counters

    c = config or WIDE256
    c.check()
    if not isinstance(w, HopperFP4) or w.fmt not in ("nvfp4", "mxfp4") or w.values.dim() != 2:
        raise ValueError("fp4_matmul_wide256: the weight must be a 2-D nvfp4 or mxfp4 HopperFP4 layout "
                         "(hopper_fp4.to_hopper)")
    if x2.dim() != 2 or x2.dtype != torch.bfloat16:
        raise ValueError(f"fp4_matmul_wide256: x must be a 2-D bf16 tensor, got {x2.dtype} {tuple(x2.shape)}")
    M, K = x2.shape
    if M < 1 or K != w.k:
        raise ValueError(f"fp4_matmul_wide256: x is [{M}, {K}], the weight has {w.k} columns (needs M >= 1)")
    np_, kp = w.padded
    sw = scale_words_per_step(w.fmt)
    if (kp // BK * sw * 4) % 16:
        raise ValueError(f"fp4_matmul_wide256: K = {K} pads to {kp} columns, whose {w.fmt} scale rows "
                         f"({kp // BK * sw * 4} bytes) are not 16-byte aligned for TMA (use fp4_matmul_gluon)")
    bm = c.tile_m(M)
    if c.smem_bytes(bm) > SMEM_LIMIT:
        raise ValueError(f"fp4_matmul_wide256: {c} needs {c.smem_bytes(bm)} bytes of shared memory at {bm} tokens "
                         f"(> {SMEM_LIMIT}): fewer stages")
    if not (x2.is_cuda and w.values.is_cuda and x2.device == w.values.device):
        raise ValueError("fp4_matmul_wide256: x and the weight must be on the same CUDA device")
    dev = x2.device.index if x2.device.index is not None else torch.cuda.current_device()
    if _capability(dev) != (9, 0) or not triton.__version__.startswith("3.6"):
        raise RuntimeError(f"fp4_matmul_wide256: needs an sm_90 GPU and Triton 3.6 (found {triton.__version__})")
    if x2.stride(1) != 1 or (x2.stride(0) * 2) % 16 or x2.data_ptr() % 16:
        x2 = x2.clone(memory_format=torch.contiguous_format)
    N = w.n
    n_tiles, m_tiles, kb = triton.cdiv(np_, c.block_n), triton.cdiv(M, bm), kp // BK
    split = c.split_k or auto_split(n_tiles * m_tiles, kb, _sm_count(dev) * c.ctas_per_sm(bm))
    split = triton.cdiv(kb, triton.cdiv(kb, max(1, min(split, kb))))
    out = torch.empty(M, N, device=x2.device, dtype=torch.bfloat16) if out is None else out
    if out.shape != (M, N) or out.stride(1) != 1:
        raise ValueError(f"fp4_matmul_wide256: out must be [{M}, {N}] with unit column stride")
    if split > 1:
        part = torch.empty(n_tiles * m_tiles * split * c.block_n * bm, device=x2.device, dtype=torch.float32)
        counters = tile_counters(x2.device, n_tiles * m_tiles)
    else:
        part = counters = w.row_factor      # unused
    wl, sl, xl = shared_layouts(bm)
    w_desc = TensorDescriptor(w.values, [kp // COLS, np_ // ROWS, 256], [256, w.values.stride(0), 1],
                              [1, c.block_n // ROWS, 256], wl)
    scales = w.scales.view(torch.int32)
    s_desc = TensorDescriptor(scales, list(scales.shape), list(scales.stride()), [c.block_n, SCALE_BOX_WORDS], sl)
    x_desc = TensorDescriptor(x2, list(x2.shape), list(x2.stride()), [bm, BK], xl)
    _fp4_gemm_wide256_kernel[(n_tiles, split, m_tiles)](
        w_desc, s_desc, x_desc, w.row_factor, out, part, counters, M, N, kb, split, out.stride(0),
        BN=c.block_n, BM=bm, STAGES=c.slots(bm), OVERLAP=c.overlap, MX=w.fmt == "mxfp4", num_warps=c.num_warps,
        maxnreg=c.maxnreg)
    return out
