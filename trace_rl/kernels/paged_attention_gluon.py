"""Opt-in Gluon (Triton 3.6 `triton.experimental.gluon`) warp-specialised FP4-KV paged decode attention (issue 15).

Computes what `paged_attention.decode_attention` computes over an nvfp4 or mxfp4 cache (same write-time layout,
trace_rl/formats/kv_layout.py; same orientation: S^T = K q^T and O^T = V^T P^T with the tokens / head dims as the
MMA's M, K and V^T decoded in registers as the wgmma A operand, per-token float32 factors on the scores and the
probabilities), organised against what bounds the shipped kernel (docs/benchmarks.md, "What bounds FP4"): a
producer warp streams each 128-token tile's pages by TMA into a shared ring, and the consumer warpgroup decodes K
and V^T in registers while the wgmmas are in flight. The tile code, which this kernel and the persistent variant
(paged_attention_gluon_persistent.py) share, is paged_attention_gluon_tiles.py (the K / V^T decode:
paged_attention_gluon_kv.py); this file holds the
one-program-per-(kv head, sequence) kernel (`_decode_attention_ws_kernel`: the ring, the two partitions, the
epilogue), its configuration (`GluonAttentionConfig`), the TMA descriptors and the launcher
(`decode_attention_gluon`, which checks the scope below).

One split per (kv head, sequence) program (no split-KV): the first version targets B x kv heads >= ~2 per SM
(B = 32 / 256 x 8 kv heads: 256 / 2048 programs against 132 SMs x 2 resident CTAs). Scope: nvfp4 or mxfp4 (one
kernel, the constexpr MX: mxfp4's scales are 32-element E8M0 blocks, whose 2**125 code bias is multiplied as the
shipped kernel does (the default, exact) or, opt-in mx_fold=True, folded into the scale pairs (MX_FOLD in
paged_attention_gluon_kv.py: exact only for scales 2**-70 .. 2**63) or, opt-in mx_checked=True, folded with a
2**5 offset that is exact for scales 2**-64 .. 2**6 (stored bytes 64..134) and checked: items with a block outside
that window (zero blocks included: their byte is 1) come out
non-finite and a second launch (REDO) recomputes exactly those with the exact kernel, so the result is the exact
kernel's bit for bit (MX_CHK in paged_attention_gluon_kv.py; opt-in redo_pdl launches that REDO as a programmatic
dependent of the checked launch, which waits for the checked grid before it reads anything), and it has no per-token
factors, so its
producer copies four boxes per page, not six), head_dim 128, pages of 64 tokens (128-token tiles = 2 pages), GQA
group <= 16 (the query heads of a kv head padded to the MMA's N = 16); `decode_attention_gluon` refuses other
shapes with a message. Gluon has no interpreter: this runs only on an sm_90 GPU; the compile gate's cases
(paged_attention_gluon_gate.py) compile it for sm_90 on any machine.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from trace_rl.formats import kv_layout as L
from trace_rl.kernels.fp4_gemm_gluon_epilogue import _gdc_launch, _gdc_wait
from trace_rl.kernels.paged_attention_gluon_kv import (  # noqa: F401 - MX_ADD, MX_CLAMP: this module's names too
    MX_ADD,
    MX_CHK,
    MX_CLAMP,
    MX_FOLD,
)
from trace_rl.kernels.paged_attention_gluon_tiles import (
    _consume_tiles,
    _epilogue,
    _load_q,
    _out_not_finite,
    _produce_tiles,
    _ring,
)

FORMATS = {"nvfp4:row": 0, "mxfp4": 1}      # PagedKV.fmt -> the MX constexpr (2: mxfp4 with MX_FOLD, 3: mx_checked)
LOG2E = 1.4426950408889634
HEAD_DIM, PAGE, BLOCK_T, N_PAD = 128, 64, 128, 16


@gluon.jit
def _producer(kc_desc, ks_desc, kg_desc, vc_desc, vs_desc, vg_desc, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b,
              ready, empty, bt_row, h, seq_len, n_tiles, HKV: gl.constexpr, NP: gl.constexpr,
              PAGE: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr, WAIT: gl.constexpr):
    """1 warp: one (kv head, sequence)'s tiles, ring positions 0 .. n_tiles - 1. WAIT (a PDL REDO): the worker
    partition's own griddepcontrol.wait before its first block-table load. It starts only after the default
    partition's wait, so this one returns at once; it keeps the rule "no global access before the wait" true of
    each partition's code (the worker's comes first in the SASS, where the gate's first_before rule reads it)."""
    if WAIT:
        _gdc_wait()
    _produce_tiles(0, kc_desc, ks_desc, kg_desc, vc_desc, vs_desc, vg_desc, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b,
                   ready, empty, bt_row, h, seq_len, n_tiles, HKV, NP, PAGE, STAGES, MX)


@gluon.jit
def _consumer(q_ptr, b, h, seq_len, n_tiles, qk_scale, stride_qb, stride_qh, q_s, p_s, kc_b, ks_b, kg_b, vc_b,
              vs_b, vg_b, ready, empty, GROUP: gl.constexpr, N: gl.constexpr, D: gl.constexpr, DV: gl.constexpr,
              T: gl.constexpr, NP: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr, UNROLL: gl.constexpr,
              COLMAX: gl.constexpr):
    q = _load_q(q_ptr, b, h, stride_qb, stride_qh, GROUP, N, D)
    q_s.store(q.to(gl.bfloat16))
    fence_async_shared()
    return _consume_tiles(0, seq_len, n_tiles, qk_scale, q_s, p_s, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b, ready, empty,
                          GROUP, N, D, DV, T, NP, STAGES, MX, UNROLL, COLMAX)


@gluon.jit
def _decode_attention_ws_kernel(q_ptr, out_ptr, bt_ptr, lens_ptr, kc_desc, ks_desc, kg_desc, vc_desc, vs_desc,
                                vg_desc, qk_scale, stride_qb, stride_qh, stride_ob, stride_oh, stride_bt,
                                HKV: gl.constexpr, GROUP: gl.constexpr, N: gl.constexpr, D: gl.constexpr,
                                DV: gl.constexpr, PAGE: gl.constexpr, T: gl.constexpr, STAGES: gl.constexpr,
                                MX: gl.constexpr, UNROLL: gl.constexpr = 1, COLMAX: gl.constexpr = False,
                                REDO: gl.constexpr = False, PDL: gl.constexpr = False,
                                LAUNCH_DEPS: gl.constexpr = False):
    h = gl.program_id(0)
    b = gl.program_id(1)
    if REDO:          # mx_checked's second launch: only the items the checked launch left non-finite, else nothing
        if PDL:       # launched as a programmatic dependent of the checked launch (redo_pdl): its whole output
            _gdc_wait()     # complete and visible before the first global access (gate rule first_before)
        if not _out_not_finite(out_ptr, b, h, stride_ob, stride_oh, GROUP, N, D):
            return    # the common case: leave before the ring, the barriers and the partitions are set up (the
            # lowering signals the worker warp to exit first: SASS STS of the exit state, BAR.SYNC 1, EXIT)
    seq_len = gl.load(lens_ptr + b)
    n_tiles = gl.cdiv(seq_len, T)
    NP: gl.constexpr = T // PAGE
    kc_b, ks_b, kg_b, vc_b, vs_b, vg_b, q_s, p_s, ready, empty = _ring(kc_desc, ks_desc, kg_desc, vc_desc, vs_desc,
                                                                       vg_desc, N, D, T, PAGE, STAGES, MX)
    bt_row = bt_ptr + b.to(gl.int64) * stride_bt
    acc, m_i, l_i = gl.warp_specialize([
        (_consumer, (q_ptr, b, h, seq_len, n_tiles, qk_scale, stride_qb, stride_qh, q_s, p_s, kc_b, ks_b, kg_b, vc_b,
                     vs_b, vg_b, ready, empty, GROUP, N, D, DV, T, NP, STAGES, MX, UNROLL, COLMAX)),
        (_producer, (kc_desc, ks_desc, kg_desc, vc_desc, vs_desc, vg_desc, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b,
                     ready, empty, bt_row, h, seq_len, n_tiles, HKV, NP, PAGE, STAGES, MX, REDO and PDL)),
    ], [1], [24])
    if LAUNCH_DEPS or (PDL and not REDO):   # the tiles are done (GluonAttentionConfig.launch_dependents: the
        _gdc_launch()   # engine's next PDL kernel, o_proj's W4A4 quantize; redo_pdl: the checked launch before its
        # PDL REDO): after the tile loop, so that dependent programs take no SM slot while programs of this grid
        # still wait to start (a REDO waits in _gdc_wait; the quantize in its own griddepcontrol.wait)
    _epilogue(acc, l_i, out_ptr, b, h, stride_ob, stride_oh, GROUP, N, D, DV, MX)


@dataclass(frozen=True)
class GluonAttentionConfig:
    """`stages` ring slots of one 128-token tile (2 pages: 19 KB each) and `maxnreg`, the per-thread register budget
    the kernel is compiled for: the producer warp keeps 24 and setmaxnreg hands the rest to the consumer warpgroup;
    maxnreg x 8 warps x 32 (the producer's warp is padded to a warpgroup) bounds the CTAs per SM (128: 2)."""

    stages: int = 4
    maxnreg: int = 128
    # mxfp4: False (the default): kv_decode's 2**125 bias HMUL2, exact for every scale byte, as the shipped kernel;
    # True: the bias folded into the scale pairs (MX_FOLD, 0.28 fewer SASS per element) but exact only for block
    # scales 2**-70 .. 2**63 (larger ones give +-Inf where the shipped kernel stays finite): opt-in, never a default
    # that can turn a finite result into Inf.
    mx_fold: bool = False
    # True: the persistent kernel (paged_attention_gluon_persistent.py: SMs x ctas_per_sm() programs looping over the
    # (kv head, sequence) items, the ring and barriers set up once, the next item's tiles prefetched under the
    # current one), for short contexts where the per-program prologue and epilogue dominate. Same tile code, same
    # results up to nothing (each item's arithmetic is the shipped kernel's).
    persistent: bool = False
    # full 128-token tiles per iteration of the tile loop (the same tiles in the same order: bit-identical results;
    # benchmarks/attention_sass_h200.sh checks that on the GPU): 2 pays the loop's per-iteration fixed SASS once per
    # two tiles. 1 (the default) until the GPU timing confirms it.
    unroll: int = 1
    # the MMA's N, the query heads of a kv head padded to it: 16 (the default, groups 1..16) or 8 (groups 1..8: no
    # padded half to zero and re-pad every tile, HGMMA 64x8x16, half the P^T tile; the same per-column arithmetic).
    n_pad: int = 16
    # the softmax's column max over the tile's tokens: True, each warp's partial through shared memory once and
    # reduced in registers (paged_attention_gluon_tiles._col_max: one barrier instead of gl.max's three; the same
    # max). In the persistent kernel it also ends ptxas's serialisation of every nvfp4 wgmma (C7513;
    # paged_attention_gluon_gate.GATE_SERIALISED): 3.36 -> 2.91 SASS per element, 2 full waits per tile.
    col_max: bool = False
    # persistent only: programs to launch (0: SMs x ctas_per_sm(), one per resident CTA slot; tests set a few to
    # give each program several items)
    programs: int = 0
    # mxfp4 only (nvfp4 ignores it, as mx_fold): the scale folded into the pairs with a 2**5 offset (MX = 3,
    # paged_attention_gluon_kv.MX_CHK: one HMUL2 per pair, no bias multiply, like mx_fold) and checked: exact for
    # stored scale bytes 64..134 (tiles.MX_CHK_LO: no folded element near the subnormals), a live block outside that
    # window (zero blocks, byte 1, included) makes its (sequence, kv head) output NaN / Inf, and a second launch (the
    # exact kernel, REDO) recomputes exactly the items whose output is not finite. The result is bit-identical to
    # the exact kernel's (NaN blocks and out-of-window scales included) for every stored byte, under the condition
    # on q and the probabilities in docs/kernels.md. Opt-in until the H200 check mxkv has timed it.
    mx_checked: bool = False
    # mx_checked only: the REDO launch as a programmatic dependent (PDL, `launch_pdl=True`) of the checked launch:
    # the checked programs signal griddepcontrol.launch_dependents after their tile loop, the REDO programs wait in
    # griddepcontrol.wait (the checked grid complete, its output flushed) before they read anything. Takes the
    # second launch's gap off the critical path (at 32 x 8k the whole call is one ~90 us wave); the same items
    # recomputed by the same kernel: bit-identical. Opt-in (LEAN_REDO_PDL) until the H200 check redopdl has timed it.
    redo_pdl: bool = False
    # griddepcontrol.launch_dependents once a program's tiles are done (after the main loop, before the epilogue):
    # the engine's next kernel, launched with PDL (o_proj's W4A4 activation quantize in a CUDA graph,
    # kernels.linear.w4a4_quantize_pdl) is scheduled as soon as every program has signalled or exited, so its CTAs
    # (and, through its own early signal, the GEMM's weight prefetch) start under the attention's last wave instead
    # of after it. Not at the start: a dependent grid's CTAs become resident once every primary CTA signalled, and
    # in a multi-wave grid would take the slots of primary CTAs not yet launched. No effect on any result (the
    # dependent waits for the attention's completion in griddepcontrol.wait) and a no-op when the next kernel is not
    # a PDL launch. False: the A/B of check `oprojpf`.
    launch_dependents: bool = True

    def check(self) -> None:
        if not 2 <= self.stages <= 6:
            raise ValueError(f"GluonAttentionConfig {self}: stages must be in 2..6")
        if self.n_pad not in (8, 16):
            raise ValueError(f"GluonAttentionConfig {self}: n_pad (the MMA's N) must be 8 or 16")
        if self.unroll not in (1, 2):
            raise ValueError(f"GluonAttentionConfig {self}: unroll (full tiles per loop iteration) is 1 or 2")
        if self.programs < 0 or (self.programs and not self.persistent):
            raise ValueError(f"GluonAttentionConfig {self}: programs is a count >= 1 of the persistent kernel's")
        if self.mx_fold and self.mx_checked:
            raise ValueError(f"GluonAttentionConfig {self}: mx_fold and mx_checked are two ways to fold mxfp4's scale; "
                             "set one")
        if self.redo_pdl and not self.mx_checked:
            raise ValueError(f"GluonAttentionConfig {self}: redo_pdl launches mx_checked's REDO with PDL; set "
                             "mx_checked=True too (without it there is no REDO launch)")

    def mx(self, kv_format: str) -> int:
        """The kernel's MX constexpr for a cache of `kv_format`: 0 nvfp4, 1 mxfp4 exact, 2 folded, 3 checked."""
        return FORMATS[kv_format] * (2 if self.mx_fold else 3 if self.mx_checked else 1)

    def smem_bytes(self, kv_format: str = "nvfp4:row") -> int:
        per_page = 4 * sum(_words(kv_format).values())
        return self.stages * (BLOCK_T // PAGE) * per_page + 2 * self.n_pad * HEAD_DIM * 2 + 2048

    def ctas_per_sm(self) -> int:
        return max(1, min(65536 // (self.maxnreg * 8 * 32), (228 * 1024) // (self.smem_bytes() + 1024)))


DEFAULT = GluonAttentionConfig()
# The SASS-reduction variants (issue 15; docs/benchmarks.md "Decode attention"; compile gate at group 4: nvfp4 3.08 ->
# 2.78 SASS per K/V element, mxfp4 exact 3.43 -> 3.21, folded 3.15 -> 2.82), bit-identical to DEFAULT: LEAN (N = 8,
# two tiles per loop iteration, the one-barrier column max) for GQA groups <= 8 (Qwen3-8B: 4), LEAN_WIDE (the column
# max alone: 3.29 -> 3.18 at group 16) for 9..16. LEAN_LOOP makes LEAN what a call without a config runs (the
# engine's path): on since the H200 check attnfault (2026-12-02, benchmarks/attention_fault_h200.sh, after the N = 8
# P^T layout fix) found it bit-identical to DEFAULT (groups 1 / 4 / 8, nvfp4 and mxfp4, NaN scales, the persistent
# kernel too) and 1.12-1.22x faster at 8k-32k (nvfp4 0.82-0.90 of the read ceiling, mxfp4 0.67-0.73). LEAN_WIDE_LOOP
# does the same for LEAN_WIDE at groups 9..16: its GPU tests (mxfp4-g16-colmax, nvfp4-g16-colmax*) pass (2026-12-02,
# bit-identical), but it has not been timed at group 16: off until it has.
LEAN = GluonAttentionConfig(n_pad=8, unroll=2, col_max=True)
LEAN_WIDE = GluonAttentionConfig(col_max=True)
LEAN_LOOP = True
LEAN_WIDE_LOOP = False
# LEAN with mxfp4's checked fold (mx_checked; compile gate: 2.92 SASS per element at group 8 against exact LEAN's
# 3.26, both with the probability flush), bit-identical to the exact kernel. LEAN_MX_CHECKED makes it what a call
# without a config runs over mxfp4 caches (groups <= 8; groups 9..16 stay exact): on since the H200 check mxkv
# (benchmarks/mxkv_h200.sh, 2026-12-03 `_1203c`, window 64..134 + the probability flush) found it bit-identical in
# all 10 GPU tests and 1.05-1.08x exact LEAN (0.70-0.77 of the read ceiling). Turning it off is this one line;
# tests/kernels/test_paged_attention_gluon_checked.py::test_default_config_follows_lean_mx_checked follows it.
LEAN_CHECKED = GluonAttentionConfig(n_pad=8, unroll=2, col_max=True, mx_checked=True)
LEAN_MX_CHECKED = True
# LEAN_CHECKED with its REDO launched as a programmatic dependent (redo_pdl); LEAN_REDO_PDL makes it what
# LEAN_MX_CHECKED selects. Off until the H200 check redopdl (benchmarks/redopdl_h200.sh) finds it bit-identical and
# not slower at any row; tests/kernels/test_redo_pdl.py::test_default_config_follows_lean_redo_pdl pins it.
LEAN_CHECKED_PDL = GluonAttentionConfig(n_pad=8, unroll=2, col_max=True, mx_checked=True, redo_pdl=True)
LEAN_REDO_PDL = False


def default_config(group: int, kv_format: str | None = None) -> GluonAttentionConfig:
    """The config a call without one runs: with LEAN_LOOP set, LEAN where the group fits its N (LEAN_CHECKED for an
    mxfp4 cache with LEAN_MX_CHECKED set; else LEAN_WIDE with LEAN_WIDE_LOOP set); DEFAULT otherwise, and for a group
    not known (< 1): DEFAULT's N = 16 takes every group."""
    if not LEAN_LOOP or group < 1:
        return DEFAULT
    if group <= LEAN.n_pad:
        if LEAN_MX_CHECKED and kv_format == "mxfp4":
            return LEAN_CHECKED_PDL if LEAN_REDO_PDL else LEAN_CHECKED
        return LEAN
    return LEAN_WIDE if LEAN_WIDE_LOOP else DEFAULT


def _box(words: int) -> list[int]:
    """A (page, kv head) block of `words` 4-byte elements as one TMA box [1, rows, <= 256]."""
    cols = min(words, 256)
    return [1, words // cols, cols]


def _block_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)


def _block_desc(t: torch.Tensor, blocks: int) -> TensorDescriptor:
    words = t.numel() // blocks
    box = _box(words)
    return TensorDescriptor(t, [blocks, box[1], box[2]], [words, box[2], 1], box, _block_layout())


def _block_sig(words: int, dtype: str) -> str:
    return f"tensordesc<{dtype}{_box(words)},{_block_layout()!r}>"


def _words(kv_format: str = "nvfp4:row", dv: int = HEAD_DIM) -> dict:
    """Words per (page, kv head) block: K codes, K scales, K factors, V codes, V scales, V factors (mxfp4: 32-element
    blocks, no factors)."""
    if kv_format == "mxfp4":
        return dict(kc=PAGE * HEAD_DIM // 8, ks=PAGE * HEAD_DIM // 128, vc=PAGE * dv // 8,
                    vs=HEAD_DIM // 32 * PAGE // 4)
    return dict(kc=PAGE * HEAD_DIM // 8, ks=PAGE * HEAD_DIM // 64, kg=PAGE, vc=PAGE * dv // 8,
                vs=HEAD_DIM // 16 * PAGE // 4, vg=PAGE)


def _out_factor(mx: int) -> float:
    """What a decoded element is short of its value (the factor on the scores and the output)."""
    return (L.NVFP4_FACTOR, 1.0, 2.0 ** MX_FOLD, 2.0 ** MX_CHK)[mx]


def _check(q, k, v, block_table, seq_lens, n_pad: int = N_PAD):
    from trace_rl.formats.paged_kv import PagedKV

    if not (isinstance(k, PagedKV) and isinstance(v, PagedKV)) or k.fmt != v.fmt or k.fmt not in FORMATS:
        raise ValueError(f"decode_attention_gluon: nvfp4 or mxfp4 K/V caches only, both of one format (got "
                         f"{getattr(k, 'fmt', k)!r}/{getattr(v, 'fmt', v)!r}); use paged_attention.decode_attention")
    if (k.role, v.role) != ("k", "v"):
        raise ValueError(f"decode_attention_gluon: caches must be allocated with role='k' / 'v' (got {k.role!r}, "
                         f"{v.role!r})")
    if q.dim() != 3 or q.dtype != torch.bfloat16:
        raise ValueError(f"decode_attention_gluon: q must be [B, Hq, D] bf16, got {q.dtype} {tuple(q.shape)}")
    B, Hq, D = q.shape
    if (k.block_size, k.head_dim, k.heads) != (v.block_size, v.head_dim, v.heads):
        raise ValueError("decode_attention_gluon: K and V caches differ in page size, heads or head_dim")
    if D != HEAD_DIM or k.head_dim != HEAD_DIM or k.block_size != PAGE:
        raise ValueError(f"decode_attention_gluon: head_dim {HEAD_DIM} and pages of {PAGE} tokens only (got q "
                         f"head_dim {D}, cache {k.head_dim} x page {k.block_size}); use "
                         "paged_attention.decode_attention")
    if Hq % k.heads or not 1 <= Hq // k.heads <= N_PAD:
        raise ValueError(f"decode_attention_gluon: {Hq} query heads over {k.heads} kv heads; the group must be a "
                         f"whole number in 1..{N_PAD}")
    if Hq // k.heads > n_pad:
        raise ValueError(f"decode_attention_gluon: a GQA group of {Hq // k.heads} query heads does not fit "
                         f"GluonAttentionConfig.n_pad={n_pad} columns; use n_pad=16 (groups up to 16)")
    if block_table.dim() != 2 or block_table.shape[0] != B or seq_lens.shape != (B,):
        raise ValueError(f"decode_attention_gluon: block_table must be [B={B}, pages] and seq_lens [B]")
    tensors = (k.codes, k.scales, v.codes, v.scales) + ((k.global_scale, v.global_scale) if k.fmt == "nvfp4:row"
                                                        else ())
    for t in tensors:
        if t is None or not t.is_contiguous():
            raise ValueError("decode_attention_gluon needs the PagedKV tensors (codes, scales, nvfp4's global scale) "
                             "contiguous, as PagedKV.allocate makes them")
    if not q.is_cuda or torch.cuda.get_device_capability(q.device) != (9, 0):
        raise RuntimeError("decode_attention_gluon: needs an sm_90 GPU (wgmma, TMA, setmaxnreg)")
    elsewhere = [t.device for t in tensors + (block_table, seq_lens) if t.device != q.device]
    if elsewhere:       # a TMA descriptor over another device's memory fails at launch, far from the cause
        raise ValueError(f"decode_attention_gluon: the caches, block table and lengths must be on q's device "
                         f"{q.device}, found {elsewhere[0]}; allocate them there (PagedKV.allocate(device=...))")
    if not triton.__version__.startswith("3.6"):
        raise RuntimeError(f"decode_attention_gluon: written against Triton 3.6's experimental Gluon API, found "
                           f"{triton.__version__}")


def decode_attention_gluon(q: torch.Tensor, k, v, block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           config: GluonAttentionConfig | None = None) -> torch.Tensor:
    """`paged_attention.decode_attention` over nvfp4 or mxfp4 caches (same arguments), warp-specialised, one split
    per (kv head, sequence). Returns [B, Hq, D] in q.dtype; a sequence of length 0 gives zeros."""
    c = config or default_config(q.shape[-2] // k.heads if getattr(k, "heads", 0) and q.dim() == 3 else 0,
                                 getattr(k, "fmt", None))
    c.check()
    _check(q, k, v, block_table, seq_lens, c.n_pad)
    B, Hq, D = q.shape
    hkv = k.heads
    blocks = k.num_blocks * hkv
    dv = L.v_rows(D)
    mx = c.mx(k.fmt)
    kc, ks, vc, vs = (_block_desc(t.view(torch.int32), blocks) for t in (k.codes, k.scales, v.codes, v.scales))
    # mxfp4: no per-token factors; the K / V scale descriptors stand in for them (the kernel never loads them)
    kg, vg = (ks, vs) if mx else (_block_desc(k.global_scale, blocks), _block_desc(v.global_scale, blocks))
    if q.stride(2) != 1:
        q = q.contiguous()
    out = torch.empty(B, Hq, D, device=q.device, dtype=q.dtype)
    bt = block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32)
    bt = bt if bt.stride(-1) == 1 else bt.contiguous()
    lens = seq_lens if seq_lens.dtype == torch.int32 else seq_lens.to(torch.int32)
    tensors = (q, out, bt, lens, kc, ks, kg, vc, vs, vg)
    strides = (q.stride(0), q.stride(1), out.stride(0), out.stride(1), bt.stride(0))
    args = (*tensors, scale * LOG2E * _out_factor(mx), *strides)
    consts = dict(HKV=hkv, GROUP=Hq // hkv, N=c.n_pad, D=D, DV=dv, PAGE=PAGE, T=BLOCK_T, STAGES=c.stages, MX=mx)
    pdl = mx == 3 and c.redo_pdl and B > 0      # the checked launch signals, its REDO waits (redo_pdl)
    signal = {"PDL": True} if pdl else {}       # unset: the cached non-PDL compiles
    if c.persistent:
        from trace_rl.kernels.paged_attention_gluon_persistent import (
            _decode_attention_persistent_kernel,
            persistent_grid,
        )

        grid = min(B * hkv, c.programs) if c.programs else persistent_grid(B * hkv, _sms(q.device), c.ctas_per_sm())
        if grid:
            _decode_attention_persistent_kernel[(grid, )](*args, B * hkv, **consts, UNROLL=c.unroll, COLMAX=c.col_max,
                                                          **signal, LAUNCH_DEPS=c.launch_dependents, num_warps=4,
                                                          maxnreg=c.maxnreg)
    else:
        _decode_attention_ws_kernel[(hkv, B)](*args, **consts, UNROLL=c.unroll, COLMAX=c.col_max, **signal,
                                              LAUNCH_DEPS=c.launch_dependents, num_warps=4, maxnreg=c.maxnreg)
    if mx == 3 and B:   # REDO: the exact kernel (MX 1, its own score factor) over the items left non-finite only
        args = (*tensors, scale * LOG2E * _out_factor(1), *strides)
        _decode_attention_ws_kernel[(hkv, B)](*args, **dict(consts, MX=1), UNROLL=c.unroll, COLMAX=c.col_max,
                                              REDO=True, **signal, LAUNCH_DEPS=c.launch_dependents, num_warps=4,
                                              maxnreg=c.maxnreg, **({"launch_pdl": True} if pdl else {}))
    return out


@functools.cache
def _sms_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sms(device) -> int:
    return _sms_of(device.index if device.index is not None else torch.cuda.current_device())

