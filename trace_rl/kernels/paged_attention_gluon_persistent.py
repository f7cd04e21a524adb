"""Persistent variant of the Gluon FP4-KV decode attention (paged_attention_gluon.py), for short contexts
(`GluonAttentionConfig(persistent=True)`; opt-in, the one-program-per-(kv head, sequence) kernel stays the default).

Why: the shipped kernel launches one program per (kv head, sequence). At the engine's fixed 8k workload's first
context (B = 313 x L = 257, 8 kv heads: 2504 programs of 3 tiles, 9.5 waves of 264 resident CTAs) it took ~74 us
per layer on the H200 against ~21 us at the bytes floor (benchmarks/results/engine_opcache_profile_h200_1202c.json).
Per program, before its first tile can start, the SASS of the shipped kernel (Triton 3.6, sm_90) runs a chain of
dependent latencies that nothing else in the CTA overlaps: the setmaxnreg hand-off (USETMAXREG + BAR.SYNC), the
seq_len load (LDG) that n_tiles depends on, the barrier init (8 SYNCS.EXCH, 3 BAR.SYNC), the producer's
block-table load (LDG) that every TMA of a page depends on (one LDG -> six UTMALDG per page, serially per page),
the TMA round trip from DRAM, and on the consumer's side 16 scalar LDG.E.U16 of q (its permuted columns) -> STS ->
fence before the first QK HGMMA; after the last tile the epilogue's wait on the last PV, the normalisation and the
stores, then the CTA exits and the next one starts from the top. With 3 tiles per program that chain is of the
order of the program's whole compute, and the second resident CTA is in the same phase as often as not.

What this does: grid = min(work items, SMs x resident CTAs per SM); program p takes work items p, p + grid, ...
(item w = kv head w % HKV of sequence w // HKV: `work_items`). Shared memory, barriers and the setmaxnreg split are
set up once per program. The producer walks the same items and keeps one ring counter across them (an item's tiles
take ring positions j0 .. j0 + n_tiles - 1, `schedule`), so it streams the next item's first tiles (block-table
loads and TMAs included) while the consumer still decodes the current one; the consumer loads the next item's
seq_len and q before the current item's epilogue, so their latency hides under it. The tile code
(paged_attention_gluon_tiles._produce_tiles / _consume_tiles / _tile) and the epilogue are the shipped kernel's.

Compile gate (Triton 3.6, sm_90, the tile loop inside the item loop): mxfp4 3.38 SASS per element at group 4 (the
shipped kernel 3.43), no spills, 2 full wgmma waits per tile. nvfp4: ptxas serialises every wgmma of the tile loop
(C7513; paged_attention_gluon_gate.GATE_SERIALISED has what was tried), so its timing decides whether it is worth it.

Not done here: a last tile of few tokens still costs a whole 128-token tile of decode (L = 257: 3 tiles for 2.01
tiles of tokens); ragged batches are dealt round-robin in item order (no longest-first order, no work stealing).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared

from trace_rl.kernels.fp4_gemm_gluon_epilogue import _gdc_launch
from trace_rl.kernels.paged_attention_gluon_tiles import _consume_tiles, _epilogue, _load_q, _produce_tiles, _ring


# ---- the work partition (pure Python; the kernel computes the same from program_id / num_programs)
def persistent_grid(work: int, sms: int, ctas_per_sm: int) -> int:
    """Programs to launch for `work` (kv head, sequence) items: one per resident CTA slot, never more than items."""
    return max(0, min(work, sms * ctas_per_sm))


def work_items(pid: int, grid: int, work: int, kv_heads: int) -> list[tuple[int, int]]:
    """(sequence, kv head) of the items program `pid` of `grid` runs, in order (item w: kv head w % kv_heads of
    sequence w // kv_heads, as the shipped kernel's grid (kv heads, B) numbers its programs)."""
    return [(w // kv_heads, w % kv_heads) for w in range(pid, work, grid)]


def schedule(seq_lens, kv_heads: int, grid: int, block_t: int = 128) -> list[list[tuple[int, int, int, int]]]:
    """Per program: (sequence, kv head, first ring position, tiles) of each item, as producer and consumer count
    them (an empty sequence takes no ring position)."""
    out = []
    for pid in range(grid):
        j, items = 0, []
        for b, h in work_items(pid, grid, len(seq_lens) * kv_heads, kv_heads):
            n = -(-int(seq_lens[b]) // block_t)
            items.append((b, h, j, n))
            j += n
        out.append(items)
    return out


# ---- the kernel
@gluon.jit
def _producer_persistent(kc_desc, ks_desc, kg_desc, vc_desc, vs_desc, vg_desc, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b,
                         ready, empty, bt_ptr, lens_ptr, stride_bt, pid, nprog, work, HKV: gl.constexpr,
                         NP: gl.constexpr, PAGE: gl.constexpr, T: gl.constexpr, STAGES: gl.constexpr,
                         MX: gl.constexpr):
    j = 0
    for w in range(pid, work, nprog):
        b = w // HKV
        seq_len = gl.load(lens_ptr + b)
        n_tiles = gl.cdiv(seq_len, T)
        _produce_tiles(j, kc_desc, ks_desc, kg_desc, vc_desc, vs_desc, vg_desc, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b,
                       ready, empty, bt_ptr + b.to(gl.int64) * stride_bt, w % HKV, seq_len, n_tiles, HKV, NP, PAGE,
                       STAGES, MX)
        j += n_tiles


@gluon.jit
def _consumer_persistent(q_ptr, out_ptr, lens_ptr, pid, nprog, work, qk_scale, stride_qb, stride_qh, stride_ob,
                         stride_oh, q_s, p_s, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b, ready, empty, HKV: gl.constexpr,
                         GROUP: gl.constexpr, N: gl.constexpr, D: gl.constexpr, DV: gl.constexpr, T: gl.constexpr,
                         NP: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr, UNROLL: gl.constexpr,
                         COLMAX: gl.constexpr):
    b = pid // HKV
    h = pid % HKV
    seq_len = gl.load(lens_ptr + b)
    q = _load_q(q_ptr, b, h, stride_qb, stride_qh, GROUP, N, D)
    j = 0
    for w in range(pid, work, nprog):
        q_s.store(q.to(gl.bfloat16))          # the previous item's wgmmas are retired (_consume_tiles waits)
        fence_async_shared()
        n_tiles = gl.cdiv(seq_len, T)
        acc, m_i, l_i = _consume_tiles(j, seq_len, n_tiles, qk_scale, q_s, p_s, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b,
                                       ready, empty, GROUP, N, D, DV, T, NP, STAGES, MX, UNROLL, COLMAX)
        j += n_tiles
        # the next item's length and q (the last program item reloads its own: harmless), in flight under the
        # epilogue
        wn = gl.minimum(w + nprog, work - 1)
        seq_len = gl.load(lens_ptr + wn // HKV)
        q = _load_q(q_ptr, wn // HKV, wn % HKV, stride_qb, stride_qh, GROUP, N, D)
        _epilogue(acc, l_i, out_ptr, w // HKV, w % HKV, stride_ob, stride_oh, GROUP, N, D, DV, MX)


@gluon.jit
def _decode_attention_persistent_kernel(q_ptr, out_ptr, bt_ptr, lens_ptr, kc_desc, ks_desc, kg_desc, vc_desc, vs_desc,
                                        vg_desc, qk_scale, stride_qb, stride_qh, stride_ob, stride_oh, stride_bt, work,
                                        HKV: gl.constexpr, GROUP: gl.constexpr, N: gl.constexpr, D: gl.constexpr,
                                        DV: gl.constexpr, PAGE: gl.constexpr, T: gl.constexpr,
                                        STAGES: gl.constexpr, MX: gl.constexpr, UNROLL: gl.constexpr = 1,
                                        COLMAX: gl.constexpr = False, PDL: gl.constexpr = False,
                                        LAUNCH_DEPS: gl.constexpr = False):
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    NP: gl.constexpr = T // PAGE
    kc_b, ks_b, kg_b, vc_b, vs_b, vg_b, q_s, p_s, ready, empty = _ring(kc_desc, ks_desc, kg_desc, vc_desc, vs_desc,
                                                                       vg_desc, N, D, T, PAGE, STAGES, MX)
    gl.warp_specialize([
        (_consumer_persistent, (q_ptr, out_ptr, lens_ptr, pid, nprog, work, qk_scale, stride_qb, stride_qh, stride_ob,
                                stride_oh, q_s, p_s, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b, ready, empty, HKV, GROUP, N,
                                D, DV, T, NP, STAGES, MX, UNROLL, COLMAX)),
        (_producer_persistent, (kc_desc, ks_desc, kg_desc, vc_desc, vs_desc, vg_desc, kc_b, ks_b, kg_b, vc_b, vs_b,
                                vg_b, ready, empty, bt_ptr, lens_ptr, stride_bt, pid, nprog, work, HKV, NP, PAGE, T,
                                STAGES, MX)),
    ], [1], [24])
    if LAUNCH_DEPS or PDL:   # every item done: the next PDL kernel (GluonAttentionConfig.launch_dependents: the
        _gdc_launch()        # engine's, o_proj's W4A4 quantize; PDL: mx_checked's redo_pdl REDO) may be scheduled;
        # it waits for this grid's completion anyway
