"""The pieces every Gluon FP4 GEMM kernel (fp4_gemm_gluon.py's dense kernels, fp4_grouped_gluon.py's grouped one and
the benchmark probes built on them: benchmarks/gemm_bound_gluon.py, benchmarks/gemm_compute_kernels.py) sets up the
same way, so each is written once:

- `alloc_ring`: the STAGES-slot shared-memory ring the TMA producer fills (layout words, scale words, activation
  tile per slot) and its `ready` / `empty` mbarriers, initialised;
- `k_range`: the K steps of a dense program's split-K share;
- the consumer's register layouts (`mma_layout`, `a_layout`, `w_layout`, `s_layout`: constexpr builders) and its raw
  views of the ring (`word_views`, `scale_views`): plain row-major int32 views of what TMA wrote unswizzled, in the
  shapes `fp4_gemm_gluon._decode_chunk` takes.

The kernels import the module (`from trace_rl.kernels import fp4_gemm_gluon_ring as ring`) and call `ring.alloc_ring`
etc.

Moving code here changes no compiled kernel: the helpers are inlined, and benchmarks/sass_diff.py checks the sm_90
SASS of every gate case byte for byte against the revision before.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier


@gluon.jit
def alloc_ring(w_desc, s_desc, x_desc, STAGES: gl.constexpr):
    """(w_bufs, s_bufs, x_bufs, ready, empty): STAGES slots of each TMA box (the descriptors' block shapes and
    shared layouts) and a `ready` (expect-tx, producer -> consumer) and `empty` (consumer -> producer) mbarrier per
    slot, each initialised to one arrival."""
    w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    s_bufs = gl.allocate_shared_memory(gl.int32, [STAGES] + s_desc.block_type.shape, s_desc.layout)
    x_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    return w_bufs, s_bufs, x_bufs, ready, empty


@gluon.jit
def k_range(pid_k, KB, SPLIT_K):
    """(kb_lo, n_iters): the K steps kb_lo .. kb_lo + n_iters - 1 (of KB, split evenly over SPLIT_K programs) that
    split `pid_k` runs; the launcher evens the split out so that no split's range is empty. The program ids stay in
    the kernel: read inside a helper, they move ptxas's schedule (an inlined scope's debug label lands among them)."""
    per_split = gl.cdiv(KB, SPLIT_K)
    kb_lo = pid_k * per_split
    return kb_lo, gl.minimum(kb_lo + per_split, KB) - kb_lo


@gluon.constexpr_function
def mma_layout(num_warps, bm):
    """The wgmma accumulator [BN weight rows, BM tokens] over `num_warps` warps (swap-AB: the tokens are the MMA N)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, bm, 16])


@gluon.constexpr_function
def a_layout(num_warps, bm):
    """The decoded weight chunk [BN, 128] bf16 as wgmma's register A operand."""
    return gl.DotOperandLayout(operand_index=0, parent=mma_layout(num_warps, bm), k_width=2)


@gluon.constexpr_function
def w_layout(num_warps):
    """A chunk's layout words [BN/16, 2, 8, 4, 2, 2] (n16, h, g, t, j, ii): a thread's four words (LDS.128) are its
    wgmma A fragment over the chunk's 8 K-slices (hopper_fp4.py)."""
    return gl.BlockedLayout([1, 1, 1, 1, 2, 2], [1, 1, 8, 4, 1, 1], [num_warps, 1, 1, 1, 1, 1], [5, 4, 3, 2, 1, 0])


@gluon.constexpr_function
def s_layout(num_warps, mx):
    """A chunk's scale words: mxfp4 [BN/16, 2, 8, 1] (a word per row), nvfp4 [BN/16, 2, 8, 1, 2] (two)."""
    if mx:
        return gl.BlockedLayout([1, 1, 1, 1], [1, 1, 8, 4], [num_warps, 1, 1, 1], [3, 2, 1, 0])
    return gl.BlockedLayout([1, 1, 1, 1, 2], [1, 1, 8, 4, 1], [num_warps, 1, 1, 1, 1], [4, 3, 2, 1, 0])


@gluon.jit
def word_views(w_bufs, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """The ring's layout words as [STAGES x BK/128 chunks, BN/16, 2, 8, 4, 2, 2] int32: chunk kc of slot s is
    index s x BK/128 + kc. Plain row-major (TMA wrote them unswizzled: a warp's LDS.128 of four words per lane covers
    512 contiguous bytes, conflict-free); the shared layout describes the trailing dims, the leading one indexes."""
    RAW6: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [5, 4, 3, 2, 1, 0])
    return w_bufs._reinterpret(gl.int32, [STAGES * (BK // 128), BN // 16, 2, 8, 4, 2, 2], RAW6)


@gluon.jit
def scale_views(s_bufs, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr):
    """The ring's scale words per slot: mxfp4 [STAGES, BN/16, 2, 8, BK/128] (a word per row and chunk, byte i: K-slices
    2i, 2i + 1), nvfp4 [STAGES, BN/16, 2, 8, BK/128, 2] (two per row and chunk, byte b of word j: K-slice 4j + b);
    chunk kc of a slot is `.slice(kc, 1, dim=3)`."""
    KC: gl.constexpr = BK // 128
    if MX:
        s_raw = s_bufs._reinterpret(gl.int32, [STAGES, BN // 16, 2, 8, KC],
                                    gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0]))
    else:
        s_raw = s_bufs._reinterpret(gl.int32, [STAGES, BN // 16, 2, 8, KC, 2],
                                    gl.SwizzledSharedLayout(1, 1, 1, [4, 3, 2, 1, 0]))
    return s_raw
