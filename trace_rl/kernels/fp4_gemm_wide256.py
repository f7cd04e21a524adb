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
three slots = 222 KB. The scale box stays TMA's narrowest (16 bytes = 4 int32 words per row, `SW_STEP` words per
128 columns: 2 nvfp4, 1 mxfp4, so a box holds the words of 2 / 4 consecutive steps: `BOX_STEPS`) and starts at
the 16-byte aligned word at or below the step's first (`scale_box`): a TMA load's innermost coordinate must be a
multiple of 16 bytes, and an unaligned one (word 2 kb / kb) raises "an illegal instruction was encountered" on the
H200 (the GPU check of the first version faulted at every launch). The consumer loads the box's candidate words and
selects the step's (`_step_scale_words`: 2 / 4 LDS and 1 / 3 SEL per scale word a thread holds), 2 KB of TMA per
step.

Roles (as fp4_gemm_gluon.py): a producer warp (24 registers after setmaxnreg) streams the three boxes into a
STAGES-deep ring (`ready` with expect-tx, `empty` released by the consumers); the default partition is two consumer
warpgroups, 64 weight rows each (BN = 128): accumulator [64, BM] fp32 = BM / 2 registers per thread (128 at BM =
256), the decoded chunk [64, 128] bf16 = 32 registers. With OVERLAP the chunk's wgmmas stay in flight under the next
chunk's decode (wait(1)); the slot of step it - 1 is released once step it's first wait has retired step it - 1's
wgmmas. The steps run in pairs with two operand register sets (`_steps256`): the wgmma reads its register A
operand while in flight, and a one-step loop rewrote it with the next decode (nan / inf on the H200; the gate's
`a_in_flight` check, sass_wgmma_hazard.py, now catches that on CPU). Grid (N tiles, split, token tiles); the split-K
reduction is fp4_gemm_gluon_epilogue._finish (partials + ticket, the last program adds in split order:
deterministic).

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

from trace_rl.kernels import fp4_gemm_gluon_ring as ring
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


def scale_box(kb: int, fmt: str) -> tuple[int, int]:
    """(first word of the scale box TMA loads for K step `kb`, the step's position in it, counted in steps): the box
    starts at a multiple of SCALE_BOX_WORDS words (16 bytes: TMA's innermost coordinate must be 16-byte aligned),
    the step's words are words sub x SW .. of it. The kernels' `_producer256` / `_step_scale_words` arithmetic."""
    steps = SCALE_BOX_WORDS // scale_words_per_step(fmt)
    return (kb // steps) * SCALE_BOX_WORDS, kb % steps


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
# after setmaxnreg): two independent consumers per SM hide the decode's latency at the short 64-token steps, so
# no overlap: the overlap's two operand register sets (_steps256) do not fit in 104 registers next to the
# accumulator (ptxas serialises every wgmma), and the first version's single set was the in-flight A-register
# hazard (sass_wgmma_hazard.py), correct on the H200 only by timing
WIDE64_2CTA = Wide256Config(block_m=64, stages=4, maxnreg=80, overlap=False)


@gluon.jit
def _producer256(w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, n16_0, row0, m0, kb_lo, n_iters,
                 SW_STEP: gl.constexpr, STAGES: gl.constexpr):
    """1 warp: step `kb_lo + it`'s words [1, BN/16, 256], the scale box [BN, 4] holding its scale words (`scale_box`)
    and activations [BM, 128] into slot it % STAGES once the consumers have released it."""
    nbytes: gl.constexpr = w_desc.block_type.nbytes + s_desc.block_type.nbytes + x_desc.block_type.nbytes
    BOX_STEPS: gl.constexpr = s_desc.block_type.shape[1] // SW_STEP
    for it in range(n_iters):
        slot = it % STAGES
        mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)   # a fresh barrier passes the first round
        bar = ready.index(slot)
        mbarrier.expect(bar, nbytes)
        kb = kb_lo + it
        tma.async_copy_global_to_shared(w_desc, [kb, n16_0, 0], bar, w_bufs.index(slot))
        # the box holding step kb's words, from a 16-byte aligned word (scale_box): an unaligned innermost TMA
        # coordinate is an illegal instruction
        tma.async_copy_global_to_shared(s_desc, [row0, (kb // BOX_STEPS) * s_desc.block_type.shape[1]], bar,
                                        s_bufs.index(slot))
        tma.async_copy_global_to_shared(x_desc, [m0, kb * 128], bar, x_bufs.index(slot))


@gluon.jit
def _step_scale_words(s_s, sub, S_LAYOUT: gl.constexpr, BOX_STEPS: gl.constexpr):
    """Step `sub`'s scale words (of the BOX_STEPS steps whose words the slot's box holds, dim 3 of the view `s_s`),
    loaded from every candidate position and selected (the position is a runtime value; a shared-memory view can
    only be sliced at constant offsets)."""
    s = s_s.slice(0, 1, dim=3).load(S_LAYOUT)
    for j in gl.static_range(1, BOX_STEPS):
        s = gl.where(sub == j, s_s.slice(j, 1, dim=3).load(S_LAYOUT), s)
    return s


@gluon.jit
def _step256(w_raw, s_raw, x_bufs, ready, empty, it, sub, acc, a_in_flight, release_prev, W_LAYOUT: gl.constexpr,
             A_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
             MX: gl.constexpr, BOX_STEPS: gl.constexpr, OVERLAP: gl.constexpr):
    """Ring step `it` (box sub-step `sub`): words, scale words, decode, HGMMA 64xBMx16 x 8; returns (acc, the decoded
    operand). OVERLAP: wait(1) retires step it - 1 (whose operand `a_in_flight` must be a different SSA value than
    this step's, see _steps256) and releases its slot (`release_prev`); else wait(0) and release this step's slot."""
    slot = it % STAGES
    mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
    w = w_raw.index(slot).load(W_LAYOUT)                          # [BN/16, 2, 8, 4, 2, 2] int32
    s = _step_scale_words(s_raw.index(slot), sub, S_LAYOUT, BOX_STEPS)   # [.., 1(, 2)]
    a = _decode_chunk(w, s, W_LAYOUT, A_LAYOUT, BN, MX)
    acc = warpgroup_mma(a, x_bufs.index(slot).permute((1, 0)), acc, is_async=True)
    if OVERLAP:
        acc, a_in_flight = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_in_flight))
        fence_async_shared()
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), count=1, pred=release_prev)
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        fence_async_shared()
        mbarrier.arrive(empty.index(slot), count=1)
    return acc, a


@gluon.jit
def _steps256(w_raw, s_raw, x_bufs, ready, empty, it0, kb0, n, acc, W_LAYOUT: gl.constexpr, A_LAYOUT: gl.constexpr,
              S_LAYOUT: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr,
              BOX_STEPS: gl.constexpr, OVERLAP: gl.constexpr):
    """`n` steps from ring position `it0` (K step kb0 + j of the box grid), accumulated into `acc`; returns acc with
    every wgmma retired and all n slots released.

    OVERLAP runs the steps in PAIRS (even step: operand a0, odd step: a1). Why: a register-A wgmma reads its A
    registers while in flight, and with one step per loop iteration the decoded operand is the same SSA value
    every iteration, so LLVM gives it the same PTX registers and the next step's decode overwrote the operand of
    the step still in flight (wait(1)): PTX-level undefined behaviour that the H200 showed as nan / inf at the
    256-token tile (the longest HGMMAs; the 64 / 128-token tiles hid it by timing). With two SSA values per
    iteration each set is rewritten only after the wait(1) that retired its previous reader (as in
    fp4_gemm_gluon._consumer, whose >= 2 chunks per step give the same property). An odd count's last step runs
    unoverlapped after the pairs."""
    if OVERLAP:
        a0 = gl.zeros([BN, 128], gl.bfloat16, A_LAYOUT)
        a1 = gl.zeros([BN, 128], gl.bfloat16, A_LAYOUT)
        n_even = n - n % 2
        for j in range(0, n_even, 2):
            acc, a0 = _step256(w_raw, s_raw, x_bufs, ready, empty, it0 + j, (kb0 + j) % BOX_STEPS, acc, a1, j > 0,
                               W_LAYOUT, A_LAYOUT, S_LAYOUT, BN, STAGES, MX, BOX_STEPS, True)
            acc, a1 = _step256(w_raw, s_raw, x_bufs, ready, empty, it0 + j + 1, (kb0 + j + 1) % BOX_STEPS, acc,
                               a0, True, W_LAYOUT, A_LAYOUT, S_LAYOUT, BN, STAGES, MX, BOX_STEPS, True)
        acc, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a1))
        fence_async_shared()     # the last pair's odd step retired: its slot can be refilled
        mbarrier.arrive(empty.index((it0 + n_even + STAGES - 1) % STAGES), count=1, pred=n_even > 0)
        for j in range(n_even, n):
            acc, a0 = _step256(w_raw, s_raw, x_bufs, ready, empty, it0 + j, (kb0 + j) % BOX_STEPS, acc, a0, True,
                               W_LAYOUT, A_LAYOUT, S_LAYOUT, BN, STAGES, MX, BOX_STEPS, False)
    else:
        a = gl.zeros([BN, 128], gl.bfloat16, A_LAYOUT)
        for j in range(n):
            acc, a = _step256(w_raw, s_raw, x_bufs, ready, empty, it0 + j, (kb0 + j) % BOX_STEPS, acc, a, True,
                              W_LAYOUT, A_LAYOUT, S_LAYOUT, BN, STAGES, MX, BOX_STEPS, False)
    return acc


@gluon.jit
def _segment256(w_bufs, s_bufs, x_bufs, ready, empty, it0, kb0, n, BN: gl.constexpr, BM: gl.constexpr,
                STAGES: gl.constexpr, OVERLAP: gl.constexpr, MX: gl.constexpr):
    """`n` steps from ring position `it0` (K step kb0 + j of the box grid) into a fresh accumulator (`_steps256`),
    with the consumer's layouts and raw views of the ring: one place for `_consumer256` and the stream-K
    consumers (fp4_gemm_wide256_sk, _sk2), which call it per tile segment."""
    NW: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BM, 16])
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    W_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, 2, 2], [1, 1, 8, 4, 1, 1], [NW, 1, 1, 1, 1, 1],
                                              [5, 4, 3, 2, 1, 0])
    RAW6: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [5, 4, 3, 2, 1, 0])
    w_raw = w_bufs._reinterpret(gl.int32, [STAGES, BN // 16, 2, 8, 4, 2, 2], RAW6)
    if MX:   # word kb % 4 of the 4-word box: byte i covers K-slices 2i, 2i + 1
        BOX_STEPS: gl.constexpr = 4
        S_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1], [1, 1, 8, 4], [NW, 1, 1, 1], [3, 2, 1, 0])
        s_raw = s_bufs._reinterpret(gl.int32, [STAGES, BN // 16, 2, 8, 4],
                                    gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0]))
    else:    # pair kb % 2 of the box (as [2, 2]): byte b of word j is K-slice 4j + b
        BOX_STEPS: gl.constexpr = 2
        S_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, 2], [1, 1, 8, 4, 1], [NW, 1, 1, 1, 1],
                                                  [4, 3, 2, 1, 0])
        s_raw = s_bufs._reinterpret(gl.int32, [STAGES, BN // 16, 2, 8, 2, 2],
                                    gl.SwizzledSharedLayout(1, 1, 1, [4, 3, 2, 1, 0]))
    return _steps256(w_raw, s_raw, x_bufs, ready, empty, it0, kb0, n, gl.zeros([BN, BM], gl.float32, mma),
                     W_LAYOUT, A_LAYOUT, S_LAYOUT, BN, STAGES, MX, BOX_STEPS, OVERLAP)


@gluon.jit
def _consumer256(w_bufs, s_bufs, x_bufs, ready, empty, kb_lo, n_iters, BN: gl.constexpr, BM: gl.constexpr,
                 STAGES: gl.constexpr, OVERLAP: gl.constexpr, MX: gl.constexpr):
    """Default partition (BN / 16 warps, warp w owning weight rows 16 w ..): per 128-column step, LDS.128 of the
    words, the step's scale words out of the slot's box (`_step_scale_words`), decode to the register A operand,
    HGMMA 64xBMx16 x 8 against the activation slot (`_steps256`); returns (acc, )."""
    acc = _segment256(w_bufs, s_bufs, x_bufs, ready, empty, 0, kb_lo, n_iters, BN, BM, STAGES, OVERLAP, MX)
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
    w_bufs, s_bufs, x_bufs, ready, empty = ring.alloc_ring(w_desc, s_desc, x_desc, STAGES)
    SW_STEP: gl.constexpr = 1 if MX else 2
    (acc, ) = gl.warp_specialize([
        (_consumer256, (w_bufs, s_bufs, x_bufs, ready, empty, kb_lo, n_iters, BN, BM, STAGES, OVERLAP, MX)),
        (_producer256, (w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, pid_n * (BN // 16),
                        pid_n * BN, pid_m * BM, kb_lo, n_iters, SW_STEP, STAGES)),
    ], [1], [24])
    _finish(acc, pid_n, pid_m, tile, pid_k, SPLIT_K, M, N, rf_ptr, out_ptr, part_ptr, count_ptr, stride_om, BN, BM)


def shared_layouts(block_m: int):
    """The TMA boxes' shared layouts (words, scale words, activations): the launch's and the gate's."""
    return (gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3),
            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2),
            gl.NVMMASharedLayout.get_default_for([block_m, BK], gl.bfloat16))


def checked_inputs(name: str, x2: torch.Tensor, w: HopperFP4, config: Wide256Config | None):
    """The launchers' shared argument checks (`name` heads the errors): (config, x2 (a TMA-aligned copy where
    needed), M, padded N, padded K, the token tile, the device index)."""
    c = config or WIDE256
    c.check()
    if not isinstance(w, HopperFP4) or w.fmt not in ("nvfp4", "mxfp4") or w.values.dim() != 2:
        raise ValueError(f"{name}: the weight must be a 2-D nvfp4 or mxfp4 HopperFP4 layout (hopper_fp4.to_hopper)")
    if x2.dim() != 2 or x2.dtype != torch.bfloat16:
        raise ValueError(f"{name}: x must be a 2-D bf16 tensor, got {x2.dtype} {tuple(x2.shape)}")
    M, K = x2.shape
    if M < 1 or K != w.k:
        raise ValueError(f"{name}: x is [{M}, {K}], the weight has {w.k} columns (needs M >= 1)")
    np_, kp = w.padded
    sw = scale_words_per_step(w.fmt)
    if (kp // BK * sw * 4) % 16:
        raise ValueError(f"{name}: K = {K} pads to {kp} columns, whose {w.fmt} scale rows "
                         f"({kp // BK * sw * 4} bytes) are not 16-byte aligned for TMA (use fp4_matmul_gluon)")
    bm = c.tile_m(M)
    if c.smem_bytes(bm) > SMEM_LIMIT:
        raise ValueError(f"{name}: {c} needs {c.smem_bytes(bm)} bytes of shared memory at {bm} tokens "
                         f"(> {SMEM_LIMIT}): fewer stages")
    if not (x2.is_cuda and w.values.is_cuda and x2.device == w.values.device):
        raise ValueError(f"{name}: x and the weight must be on the same CUDA device")
    dev = x2.device.index if x2.device.index is not None else torch.cuda.current_device()
    if _capability(dev) != (9, 0) or not triton.__version__.startswith("3.6"):
        raise RuntimeError(f"{name}: needs an sm_90 GPU and Triton 3.6 (found {triton.__version__})")
    if x2.stride(1) != 1 or (x2.stride(0) * 2) % 16 or x2.data_ptr() % 16:
        x2 = x2.clone(memory_format=torch.contiguous_format)
    return c, x2, M, np_, kp, bm, dev


def fp4_matmul_wide256(x2: torch.Tensor, w: HopperFP4, config: Wide256Config | None = None,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """x2 [M, K] bf16 @ W^T (nvfp4 / mxfp4 Hopper layout) -> [M, N] bf16 (or `out`'s dtype). Nothing synchronises
    (capturable). Needs an sm_90 GPU and Triton 3.6."""
    from trace_rl.kernels.fp4_gemm import tile_counters

    c, x2, M, np_, kp, bm, dev = checked_inputs("fp4_matmul_wide256", x2, w, config)
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
