"""The opt-in Gluon warp-specialised FP4 (nvfp4 / mxfp4) decode attention (paged_attention_gluon.py): launcher checks
and a torch emulation of its decode on CPU; on an sm_90 GPU with Triton 3.6, for both formats, a ragged problem
(odd lengths, tails of 1-88 tokens, an empty sequence, a one-token one, pages scattered, garbage block-table entries
past each sequence, stale NaN V scales in unwritten slots) against the float64 reference and the shipped Triton
kernel, per sequence."""

import importlib.util
import os
import sys

import pytest
import torch

from tests.gpu_marks import gpu36
from trace_rl.formats.paged_kv import PagedKV

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")


def _decode_attention_tests():
    """tests/kernels/test_decode_attention.py (its _setup and float64 reference; tests/kernels is no package)."""
    name = "trace_rl_test_decode_attention"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__),
                                                                         "test_decode_attention.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[name] = mod
    return sys.modules[name]


# ---- torch emulation of the consumer's data path: a slot's words viewed as the ring's plain views, decoded with the
# same bit operations (kv_decode's DECODE_PURE) and rearranged by the same joins / permutes / reshapes as the Gluon
# code, compared with the shipped kernel's decode of the same pages (paged_attention.decode_tiles). Checks the index
# algebra on CPU; that the Gluon layouts realise it as the MMA's fragments the compiler asserts (convert_layout
# with assert_trivial), and the numbers need the GPU test below.
def _bf16(bits):
    return (bits.to(torch.int32) << 16).view(torch.float32)


def _values(x, pair, mx=0):
    """kv_decode.fp4_words (pure): words and scale pairs -> 8 float32 tensors (slot 0 lo, .., slot 3 hi); mxfp4 (mx 1)
    through the 2**125 bias multiply (exact in float32, as in bf16 on the GPU); mx 2 (folded): none."""
    x = x.to(torch.int64) & 0xFFFFFFFF
    pair = pair.to(torch.int64) & 0xFFFFFFFF
    o = [x & 0x81C081C0, (x << 3) & 0x81C081C0, (x << 6) & 0x81C081C0,
         ((x << 1) & 0x80008000) | ((x >> 3) & 0x01800180) | ((x >> 7) & 0x00400040)]
    s_lo, s_hi = _bf16(pair & 0xFFFF), _bf16((pair >> 16) & 0xFFFF)
    bias = 2.0 ** 125 if mx == 1 else 1.0
    out = []
    for oi in o:
        out += [_bf16(oi & 0xFFFF) * bias * s_lo, _bf16((oi >> 16) & 0xFFFF) * bias * s_hi]
    return out


def _pairs(sw):
    """NV_PAIRS_ASM: a scale word [b0 b1 b2 b3] -> bf16x2 words (b0, b2), (b1, b3) of scale x 2**119."""
    sw = sw.to(torch.int64) & 0xFFFFFFFF
    a, b = sw & 0x00FF00FF, (sw & 0xFF00FF00) >> 8
    return (a * 16 + 0x76807680) & 0xFFFFFFFF, (b * 16 + 0x76807680) & 0xFFFFFFFF


def _mx_k_pairs(hw, mx):
    """_k_decode's mxfp4 pairs, in int32 as the kernel does them: a 16-bit half [b_hr0, b_hr1] (int16, sign-extended
    by .to(int32)) -> (f(b_hr0), f(b_hr0)), (f(b_hr1), f(b_hr1)): f(b) = b << 7 (mx 1), (min(b, 192) + 63) << 7
    (mx 2, folded), (b + 120) << 7 (mx 3, checked: not clamped, the window is checked on the bytes)."""
    from trace_rl.kernels.paged_attention_gluon import MX_ADD, MX_CLAMP

    hw = hw.to(torch.int32) & 0xFFFF
    if mx == 3:
        return ((hw & 255) + 120) * 0x00800080, ((hw >> 8) + 120) * 0x00800080
    if mx == 2:
        return ((hw & 255).clamp(max=MX_CLAMP.value) + MX_ADD.value) * 0x00800080, \
            ((hw >> 8).clamp(max=MX_CLAMP.value) + MX_ADD.value) * 0x00800080
    return (hw & 255) * 0x00800080, (hw >> 8) * 0x00800080


def _mx_v_pairs(sw, mx):
    """_vt_decode's mxfp4 pairs (int32 arithmetic shift as on the GPU): [b0 b1 b2 b3] -> (f(b0), f(b2)),
    (f(b1), f(b3)); mx 2: _MX_PAIRS (and, min.u16x2 by 192, mad by 128 + (63 << 7) per half); mx 3: _MX_CHK_PAIRS
    step by step (prmt to 16-bit halves, add 0x8000 - LO per half, min.s16x2 by 0x8000 + 135 - LO, mad by 128 plus
    the constant that takes the low half's spill out, mod 2**32)."""
    sw = sw.to(torch.int32)
    if mx == 3:
        from trace_rl.kernels.paged_attention_gluon_kv import MX_CHK_LO_BYTE as lo_byte

        sw = sw.to(torch.int64) & 0xFFFFFFFF
        top = 0x8000 + 135 - lo_byte - 0x10000                               # as a signed 16-bit value
        add = ((lo_byte + 120 - 0x8000) * 128 * 0x00010001) % 2 ** 32
        out = []
        for a in (sw & 0x00FF00FF, (sw >> 8) & 0x00FF00FF):
            a = a + (0x8000 - lo_byte) * 0x00010001                          # no carry: each half < 0x10000
            h = [((a >> s) & 0xFFFF) for s in (0, 16)]
            h = [torch.where(x >= 0x8000, x - 0x10000, x).clamp(max=top) & 0xFFFF for x in h]   # min.s16x2
            out.append(((h[0] | (h[1] << 16)) * 128 + add) & 0xFFFFFFFF)
        return out
    if mx == 2:
        sw = sw.to(torch.int64) & 0xFFFFFFFF
        out = []
        for a in (sw & 0x00FF00FF, (sw >> 8) & 0x00FF00FF):
            lo, hi = (a & 0xFFFF).clamp(max=192), (a >> 16).clamp(max=192)
            out.append(((lo | (hi << 16)) * 128 + 0x1F801F80) & 0xFFFFFFFF)
        return out
    return (sw << 7) & 0x7F807F80, (sw >> 1) & 0x7F807F80


def _join(a, b):
    """tl.join / gl.join: a new minor dimension (a nested join's outer selector is the last dim)."""
    return torch.stack([a, b], -1)


def _join8(x, pair, mx=0):
    """paged_attention_gluon_kv._join8: dims [.., half, i & 1, i >> 1] of slot i's half."""
    o = _values(x, pair, mx)
    return _join(_join(_join(o[0], o[1]), _join(o[2], o[3])), _join(_join(o[4], o[5]), _join(o[6], o[7])))


def _emulate_k(kc, ks, T=128, D=128, mx=0):
    """_k_decode: one tile's K words [T * D/8] and scale words (nvfp4 [T/16 * 32]; mxfp4 [T/16 * 16], read as
    16-bit halves [T/16, 8, 4]) -> K [T, D] in MMA column order."""
    w = kc.reshape(T // 16, 2, 8, 4, D // 32).permute(0, 2, 3, 4, 1)             # [n16, g, tq, jw, hr]
    if mx:
        p02, p13 = _mx_k_pairs(ks.contiguous().view(torch.int16).reshape(T // 16, 8, 4), mx)
    else:
        p02, p13 = _pairs(ks.reshape(T // 16, 8, 4))
    pair = torch.stack([p02, p13], -1).reshape(T // 16, 8, 4, 1, 2).expand(w.shape)
    y = _join8(w, pair, mx).permute(0, 4, 1, 3, 7, 6, 2, 5)
    return y.reshape(T, D)


def _emulate_vt(vc, vs, NP=2, DV=128, T=128, mx=0):
    """_vt_decode: one tile's V^T words and scale words -> V^T [DV, T] in MMA row order."""
    w = vc.reshape(NP, 2, 4, 2, 4, 4, 2, 2)                                        # p, kth, w, gh, gl, tq, kl, h
    if mx:
        p02, p13 = _mx_v_pairs(vs.reshape(NP, 4, 4, 2, 2), mx)                    # p, w, tq, kth, kl
        pair = torch.stack([p02, p13], -1).permute(0, 3, 1, 2, 4, 5).reshape(NP, 2, 4, 1, 1, 4, 2, 2)
    else:
        p02, p13 = _pairs(vs.reshape(NP, 4, 2, 4, 2, 2))                          # p, w, gh, tq, kth, kl
        pair = torch.stack([p02, p13], -1).permute(0, 4, 1, 2, 3, 5, 6).reshape(NP, 2, 4, 2, 1, 4, 2, 2)
    y = _join8(w, pair.expand(w.shape), mx).permute(10, 2, 9, 3, 4, 0, 1, 6, 7, 5, 8)
    return y.reshape(DV, T)


@pytest.mark.parametrize("fmt,mx", [("nvfp4", 0), ("mxfp4", 1), ("mxfp4", 2), ("mxfp4", 3)])
def test_emulated_decode_matches_shipped_decode(fmt, mx, gen):
    """mx 1: mxfp4 through the bias multiply (mx_fold=False), 2: the bias folded into the pairs (decoded values
    2**-MX_FOLD of the shipped ones, exactly, for these scales), 3: mx_checked (2**-MX_CHK of them)."""
    from trace_rl.formats import kv_layout as L
    from trace_rl.kernels import kv_write
    from trace_rl.kernels.paged_attention import decode_tiles
    from trace_rl.kernels.paged_attention_gluon import MX_CHK, MX_FOLD

    P, H, D, S = 4, 2, 128, 64
    k = PagedKV.allocate(fmt, P, S, H, D, role="k")
    v = PagedKV.allocate(fmt, P, S, H, D, role="v")
    slots = torch.arange(P * S)
    x = torch.randn(P * S, H, D, generator=gen) * torch.exp(torch.randn(P * S, H, 1, generator=gen))
    kv_write(k, slots, x.to(torch.bfloat16))
    kv_write(v, slots, torch.randn(P * S, H, D, generator=gen).to(torch.bfloat16))
    kd = decode_tiles(k).reshape(P, S, H, D)                       # code x scale (nvfp4: the 2**-7 undone)
    vd = decode_tiles(v).reshape(P, S, H, D)
    f = (128.0, 1.0, 2.0 ** MX_FOLD, 2.0 ** MX_CHK)[mx]
    kc, ks = k.codes.view(torch.int32).reshape(P, H, -1), k.scales.view(torch.int32).reshape(P, H, -1)
    vc, vs = v.codes.view(torch.int32).reshape(P, H, -1), v.scales.view(torch.int32).reshape(P, H, -1)
    pi, rho = L.k_dim_of_col(D), L.v_dim_of_row(D)
    for pages in ((0, 1), (3, 0), (2, 2)):                          # a tile's two pages, anywhere in the cache
        for h in range(H):
            got_k = _emulate_k(torch.cat([kc[p, h] for p in pages]), torch.cat([ks[p, h] for p in pages]), mx=mx) * f
            want_k = torch.cat([kd[p, :, h] for p in pages])[:, pi]
            assert torch.equal(got_k, want_k)
            got_v = _emulate_vt(torch.cat([vc[p, h] for p in pages]), torch.cat([vs[p, h] for p in pages]),
                                mx=mx) * f
            want_v = torch.cat([vd[p, :, h] for p in pages])[:, rho].T
            assert torch.equal(got_v, want_v)


def test_mx_fold_pairs_keep_nan_and_are_exact_in_the_window():
    """The folded mxfp4 pairs (emulated as the kernel computes them) for every stored scale byte s (= E8M0 code + 1):
    2**(code - 1 - MX_FOLD) for codes 0..190, +Inf from 191 on: stored 255 (NaN, codes stored 0) stays NaN."""
    from trace_rl.kernels.paged_attention_gluon import MX_FOLD

    s = torch.arange(256, dtype=torch.int32)
    words = s | (s.flip(0) << 8) | (s << 16) | (s.flip(0) << 24)       # [s, 255 - s, s, 255 - s]
    p02, p13 = _mx_v_pairs(words, 2)
    hk = (s | (s.flip(0) << 8)).to(torch.int16)
    k02, k13 = _mx_k_pairs(hk, 2)
    for pair, b in ((p02, s), (p13, s.flip(0)), (k02, s), (k13, s.flip(0))):
        pair = pair.to(torch.int64) & 0xFFFFFFFF
        lo, hi = _bf16(pair & 0xFFFF), _bf16(pair >> 16)
        assert torch.equal(lo, hi)
        code = b.long() - 1
        want = torch.where(code <= 190, torch.exp2((code - 1 - MX_FOLD).double()), torch.inf).float()
        assert torch.equal(lo, want), (b[lo != want], lo[lo != want])
    zero = _values(torch.zeros(1, dtype=torch.int32), p02[255:], 2)              # stored 255: NaN
    assert all(v.isnan().all() for v in zero)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_tma_boxes_are_the_page_blocks(fmt):
    """The producer's descriptors (nvfp4 six, mxfp4 four: no factors): box [1, r, c] at [page * heads + head, 0, 0]
    is that (page, head) block, whole (what the ring views above take a slot's tile for), and the expect-tx byte
    count is the boxes' bytes."""
    gluon = pytest.importorskip("trace_rl.kernels.paged_attention_gluon")
    P, H = 5, 3
    k = PagedKV.allocate(fmt, P, 64, H, 128, role="k")
    v = PagedKV.allocate(fmt, P, 64, H, 128, role="v")
    if fmt == "nvfp4":
        tensors = (k.codes.view(torch.int32), k.scales.view(torch.int32), k.global_scale, v.codes.view(torch.int32),
                   v.scales.view(torch.int32), v.global_scale)
    else:
        tensors = (k.codes.view(torch.int32), k.scales.view(torch.int32), v.codes.view(torch.int32),
                   v.scales.view(torch.int32))
    words = list(gluon._words(k.fmt).values())
    assert len(words) == len(tensors)
    total = 0
    for t, n in zip(tensors, words):
        t.copy_(torch.arange(t.numel()).reshape(t.shape).to(t.dtype))
        d = gluon._block_desc(t, P * H)
        assert list(d.block_shape) == [1, n // min(n, 256), min(n, 256)]
        total += 4 * n
        view = torch.as_strided(t, d.shape, d.strides)
        for p_, h in ((0, 0), (4, 2), (2, 1)):
            assert torch.equal(view[p_ * H + h].reshape(-1), t.reshape(P, H, -1)[p_, h])
    assert total == (9728 if fmt == "nvfp4" else 8704)     # per page (x 2 per ring slot)
    assert k.nbytes + v.nbytes == total * P * H             # every byte of the caches, nothing else
    assert gluon.DEFAULT.smem_bytes(k.fmt) == 4 * 2 * total + 2 * 16 * 128 * 2 + 2048


def test_launcher_refuses_unsupported_shapes():
    gluon = pytest.importorskip("trace_rl.kernels.paged_attention_gluon")
    q = torch.zeros(1, 8, 128, dtype=torch.bfloat16)
    bt, sl = torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    k = PagedKV.allocate("bf16", 4, 16, 2, 128, role="k")
    with pytest.raises(ValueError, match="nvfp4"):
        gluon.decode_attention_gluon(q, k, k, bt, sl, 0.1)
    k = PagedKV.allocate("nvfp4", 4, 32, 2, 128, role="k")
    v = PagedKV.allocate("nvfp4", 4, 32, 2, 128, role="v")
    with pytest.raises(ValueError, match="pages of 64"):
        gluon.decode_attention_gluon(q, k, v, bt, sl, 0.1)
    k = PagedKV.allocate("nvfp4", 4, 64, 2, 64, role="k")
    v = PagedKV.allocate("nvfp4", 4, 64, 2, 64, role="v")
    with pytest.raises(ValueError, match="head_dim 128"):
        gluon.decode_attention_gluon(q[..., :64], k, v, bt, sl, 0.1)
    k = PagedKV.allocate("nvfp4", 4, 64, 2, 128, role="k")
    v = PagedKV.allocate("nvfp4", 4, 64, 2, 128, role="v")
    with pytest.raises(ValueError, match="role"):
        gluon.decode_attention_gluon(q, k, k, bt, sl, 0.1)
    with pytest.raises(ValueError, match="group"):
        gluon.decode_attention_gluon(torch.zeros(1, 34, 128, dtype=torch.bfloat16), k, v, bt, sl, 0.1)
    with pytest.raises(ValueError, match="stages"):
        gluon.GluonAttentionConfig(stages=1).check()
    with pytest.raises(ValueError, match="programs"):
        gluon.GluonAttentionConfig(programs=4).check()                   # a count of the persistent kernel's only
    with pytest.raises(RuntimeError, match="sm_90 GPU"):                 # the persistent launch checks the same
        gluon.decode_attention_gluon(q, *[PagedKV.allocate("nvfp4", 4, 64, 2, 128, role=r) for r in "kv"], bt, sl,
                                     0.1, config=gluon.GluonAttentionConfig(persistent=True, programs=3))


def test_launcher_takes_nvfp4_and_mxfp4_pairs_only():
    """nvfp4/nvfp4 and mxfp4/mxfp4 pass every shape check (on CPU the next refusal is the machine's); a mixed pair,
    fp8 or bf16 is refused naming the formats and the fix; mxfp4's shape refusals are nvfp4's."""
    gluon = pytest.importorskip("trace_rl.kernels.paged_attention_gluon")
    q = torch.zeros(1, 8, 128, dtype=torch.bfloat16)
    bt, sl = torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    caches = {f: (PagedKV.allocate(f, 4, 64, 2, 128, role="k"), PagedKV.allocate(f, 4, 64, 2, 128, role="v"))
              for f in ("nvfp4", "mxfp4", "fp8_e4m3")}
    for f in ("nvfp4", "mxfp4"):
        with pytest.raises(RuntimeError, match="sm_90 GPU"):
            gluon.decode_attention_gluon(q, *caches[f], bt, sl, 0.1)
    for k, v in ((caches["nvfp4"][0], caches["mxfp4"][1]), (caches["mxfp4"][0], caches["nvfp4"][1]),
                 caches["fp8_e4m3"]):
        with pytest.raises(ValueError, match=r"nvfp4 or mxfp4 K/V caches only, both of one format .* use "
                                             r"paged_attention.decode_attention"):
            gluon.decode_attention_gluon(q, k, v, bt, sl, 0.1)
    k, v = caches["mxfp4"]
    with pytest.raises(ValueError, match="role"):
        gluon.decode_attention_gluon(q, k, k, bt, sl, 0.1)
    with pytest.raises(ValueError, match="group"):
        gluon.decode_attention_gluon(torch.zeros(1, 34, 128, dtype=torch.bfloat16), k, v, bt, sl, 0.1)
    k, v = (PagedKV.allocate("mxfp4", 4, 32, 2, 128, role=r) for r in ("k", "v"))
    with pytest.raises(ValueError, match="pages of 64"):
        gluon.decode_attention_gluon(q, k, v, bt, sl, 0.1)


@gpu36[0]
@gpu36[1]
@pytest.mark.parametrize("fmt, group, stages, fold", [
    ("nvfp4", 4, 4, False), ("nvfp4", 1, 2, False), ("nvfp4", 16, 3, False),
    ("mxfp4", 4, 4, False), ("mxfp4", 1, 3, False), ("mxfp4", 16, 2, False), ("mxfp4", 4, 4, True),
])                                  # each is a compile (~5 s); fold: mxfp4's bias in the scale pairs (opt-in)
def test_matches_reference_and_shipped_gpu(fmt, group, stages, fold, gen):
    from trace_rl.kernels.paged_attention import decode_attention
    from trace_rl.kernels.paged_attention_gluon import GluonAttentionConfig, decode_attention_gluon

    t = _decode_attention_tests()
    # tails (length mod 128) 1, 88, 5, 0, 64, 127, 1 and an empty sequence; 3000 = 23 tiles + 56
    lens = [1, 600, 133, 0, 1024, 3000, 255, 88, 129]
    q, k, v, bt, sl = t._setup(fmt, lens, 8 if group < 16 else 2, group, 128, 64, "cuda", gen)
    ref = t._reference64(q, k, v, bt, sl, 128 ** -0.5)
    args = (q.cuda(), k, v, bt.cuda(), sl.cuda(), 128 ** -0.5)
    config = GluonAttentionConfig(stages=stages, mx_fold=fold)
    out = decode_attention_gluon(*args, config=config)
    shipped = decode_attention(*args, splits=1)
    assert not out.isnan().any()
    for b in range(len(lens)):       # per sequence: a wrong tail must not hide behind a long neighbour
        if lens[b] == 0:
            assert (out[b] == 0).all()
            continue
        assert t._rel_err(out[b : b + 1], ref[b : b + 1]) < 1e-2, (b, lens[b])
        assert t._rel_err(out[b : b + 1], shipped[b : b + 1].double().cpu()) < 2e-3, (b, lens[b])
    assert torch.equal(decode_attention_gluon(*args, config=config), out)


@gpu36[0]
@gpu36[1]
@pytest.mark.parametrize("fmt, group, programs", [
    ("nvfp4", 4, 0), ("nvfp4", 4, 5), ("mxfp4", 4, 0), ("mxfp4", 4, 3), ("nvfp4", 16, 7),
])   # programs 0: the default grid (one item each here); 3-7: several items each. 3 persistent compiles (~5 s each)
def test_persistent_matches_reference_and_shipped_gpu(fmt, group, programs, gen):
    """GluonAttentionConfig(persistent=True): the shipped Gluon kernel's tile code per (kv head, sequence) item, the
    items dealt over `programs` programs (ring positions continuing across items, the next item's q and length
    loaded under the current epilogue); two empty sequences, one of them last."""
    from trace_rl.kernels.paged_attention import decode_attention
    from trace_rl.kernels.paged_attention_gluon import GluonAttentionConfig, decode_attention_gluon

    t = _decode_attention_tests()
    lens = [1, 600, 133, 0, 1024, 257, 3000, 255, 88, 129, 0]
    q, k, v, bt, sl = t._setup(fmt, lens, 8 if group < 16 else 2, group, 128, 64, "cuda", gen)
    ref = t._reference64(q, k, v, bt, sl, 128 ** -0.5)
    args = (q.cuda(), k, v, bt.cuda(), sl.cuda(), 128 ** -0.5)
    config = GluonAttentionConfig(persistent=True, programs=programs)
    out = decode_attention_gluon(*args, config=config)
    gluon = decode_attention_gluon(*args)
    shipped = decode_attention(*args, splits=1)
    assert not out.isnan().any()
    for b in range(len(lens)):
        if lens[b] == 0:
            assert (out[b] == 0).all()
            continue
        assert t._rel_err(out[b : b + 1], ref[b : b + 1]) < 1e-2, (b, lens[b])
        assert t._rel_err(out[b : b + 1], gluon[b : b + 1].double().cpu()) < 1e-3, (b, lens[b])
        assert t._rel_err(out[b : b + 1], shipped[b : b + 1].double().cpu()) < 2e-3, (b, lens[b])
    assert torch.equal(decode_attention_gluon(*args, config=config), out)


def test_variant_configs_are_checked():
    gluon = pytest.importorskip("trace_rl.kernels.paged_attention_gluon")
    gluon.GluonAttentionConfig(unroll=2).check()
    gluon.LEAN.check()
    gluon.LEAN_WIDE.check()
    gluon.GluonAttentionConfig(persistent=True, n_pad=8, unroll=2, col_max=True).check()
    for bad, what in ((dict(unroll=3), "unroll"), (dict(unroll=0), "unroll"), (dict(n_pad=4), "n_pad"),
                      (dict(n_pad=32), "n_pad")):
        with pytest.raises(ValueError, match=what):
            gluon.GluonAttentionConfig(**bad).check()
    assert gluon.default_config(4) == (gluon.LEAN if gluon.LEAN_LOOP else gluon.DEFAULT)
    assert gluon.default_config(0) == gluon.DEFAULT                     # group not known: N = 16 takes any
    assert gluon.default_config(12) == (gluon.LEAN_WIDE if gluon.LEAN_LOOP and gluon.LEAN_WIDE_LOOP
                                        else gluon.DEFAULT)                          # over 8: N = 16
    assert gluon.LEAN_WIDE.n_pad == 16
    assert gluon.DEFAULT == gluon.GluonAttentionConfig()
    k, v = (PagedKV.allocate("nvfp4", 4, 64, 2, 128, role=r) for r in "kv")
    with pytest.raises(ValueError, match="n_pad=16"):                     # group 12 > 8 columns, before the GPU check
        gluon.decode_attention_gluon(torch.zeros(1, 24, 128, dtype=torch.bfloat16), k, v,
                                     torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32), 0.1,
                                     config=gluon.GluonAttentionConfig(n_pad=8))


SASS_VARIANTS = {   # id: (format, group, mx_fold, GluonAttentionConfig fields of the variant)
    "nvfp4-g4-lean": ("nvfp4", 4, False, dict(n_pad=8, unroll=2, col_max=True)),
    "nvfp4-g4-colmax": ("nvfp4", 4, False, dict(col_max=True)),
    "mxfp4-g4-lean": ("mxfp4", 4, False, dict(n_pad=8, unroll=2, col_max=True)),
    "mxfp4fold-g4-lean": ("mxfp4", 4, True, dict(n_pad=8, unroll=2, col_max=True)),
    "nvfp4-g4-n8": ("nvfp4", 4, False, dict(n_pad=8)), "nvfp4-g4-unroll2": ("nvfp4", 4, False, dict(unroll=2)),
    "nvfp4-g1-lean": ("nvfp4", 1, False, dict(n_pad=8, unroll=2, col_max=True)),
    "nvfp4-g8-lean": ("nvfp4", 8, False, dict(n_pad=8, unroll=2, col_max=True)),
    "nvfp4-g16-colmax-unroll2": ("nvfp4", 16, False, dict(col_max=True, unroll=2)),
    "mxfp4-g16-colmax": ("mxfp4", 16, False, dict(col_max=True)),
    "nvfp4-g16-colmax": ("nvfp4", 16, False, dict(col_max=True)),
    "nvfp4-g4-colmax-unroll2": ("nvfp4", 4, False, dict(col_max=True, unroll=2)),
    "mxfp4-g4-colmax": ("mxfp4", 4, False, dict(col_max=True)),
    "mxfp4-g4-colmax-unroll2": ("mxfp4", 4, False, dict(col_max=True, unroll=2)),
    "mxfp4-g4-n8": ("mxfp4", 4, False, dict(n_pad=8)),
    # the persistent kernel (5 programs: several items each), against its own default
    "nvfp4-g4-persistent-colmax": ("nvfp4", 4, False, dict(persistent=True, programs=5, col_max=True)),
    "nvfp4-g4-persistent-lean": ("nvfp4", 4, False, dict(persistent=True, programs=5, n_pad=8, unroll=2, col_max=True)),
    "mxfp4-g4-persistent-lean": ("mxfp4", 4, False, dict(persistent=True, programs=5, n_pad=8, unroll=2, col_max=True)),
}


@gpu36[0]
@gpu36[1]
@pytest.mark.parametrize("case", list(SASS_VARIANTS))
def test_sass_variants_bit_identical_to_shipped_gpu(case, gen):
    """The SASS-reduction variants (GluonAttentionConfig unroll=2: two full tiles per loop iteration, the leftover
    full tile after the loop; n_pad=8: the MMA's N = 8; col_max: the one-barrier column max) against the same
    format's default config (the persistent kernel's, for its cases): the same arithmetic per column in the same
    order (max is order-independent), so bit-identical outputs (NaN included): lengths with even and odd full-tile
    counts, with and without a tail, an empty sequence; live NaN scales (a K scale block of one sequence, a V scale
    block of another) stay NaN in both; and vs the float64 reference."""
    from trace_rl.kernels.paged_attention_gluon import GluonAttentionConfig, decode_attention_gluon

    fmt, group, fold, fields = SASS_VARIANTS[case]
    t = _decode_attention_tests()
    lens = [1, 600, 133, 0, 1024, 3000, 255, 384, 256, 129, 2944]   # full tiles 0, 4, 1, 0, 8, 23, 1, 3, 2, 1, 23
    hkv = 8 if group < 16 else 2
    q, k, v, bt, sl = t._setup(fmt, lens, hkv, group, 128, 64, "cuda", gen)
    args = (q.cuda(), k, v, bt.cuda(), sl.cuda(), 128 ** -0.5)
    ref = t._reference64(q, k, v, bt, sl, 128 ** -0.5)
    base = GluonAttentionConfig(mx_fold=fold, **{k: v for k, v in fields.items() if k in ("persistent", "programs")})
    variant = GluonAttentionConfig(mx_fold=fold, **fields)
    shipped = decode_attention_gluon(*args, config=base)
    out = decode_attention_gluon(*args, config=variant)
    assert torch.equal(out.view(torch.int16), shipped.view(torch.int16))
    for b in range(len(lens)):
        if lens[b]:
            assert t._rel_err(out[b : b + 1], ref[b : b + 1]) < 1e-2, (b, lens[b])
        else:
            assert (out[b] == 0).all()
    nan = 145 if fmt == "nvfp4" else 255                    # the stored scale byte that decodes to NaN
    k.scales[bt[5, 7].item(), 1] = nan                      # sequence 5, page 7 (a full tile inside the loop)
    v.scales[bt[10, 45].item(), 0] = nan                    # sequence 10, its last page (the leftover full tile)
    shipped = decode_attention_gluon(*args, config=base)
    out = decode_attention_gluon(*args, config=variant)
    assert torch.equal(out.view(torch.int16), shipped.view(torch.int16))
    h1 = slice(group, 2 * group) if hkv > 1 else slice(0, group)
    assert out[5, h1].isnan().any() and out[10, :group].isnan().any()   # NaN stays NaN
    assert not out[[0, 1, 2, 4, 6, 7, 8, 9]].isnan().any()
