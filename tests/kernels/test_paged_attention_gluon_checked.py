"""mxfp4's checked fold in the Gluon FP4-KV decode attention (GluonAttentionConfig.mx_checked, LEAN_CHECKED; the
constexpr MX = 3 of paged_attention_gluon_kv, whose MX_CHK comment states the contract): on CPU, the scale pairs
for every stored byte (exact 2**(stored - 133) in the window MX_CHK_LO..134, +Inf V pairs and a flagged K byte
outside it),
the decoded values against the exact kernel's bit for bit, the writer never storing byte 0, and the config / default
switch; on an sm_90 GPU with Triton 3.6, the checked launch + its exact REDO bit-identical to the exact kernel over
ragged caches with in-window extremes, out-of-window and NaN scale bytes in K and V."""

import pytest
import torch

from tests.gpu_marks import gpu36

gluon = pytest.importorskip("trace_rl.kernels.paged_attention_gluon")

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _helpers():
    from tests.kernels.test_paged_attention_gluon import (
        _bf16,
        _decode_attention_tests,
        _mx_k_pairs,
        _mx_v_pairs,
        _values,
    )
    return _bf16, _decode_attention_tests, _mx_k_pairs, _mx_v_pairs, _values


def _k_flagged(b):
    """_k_decode / _consume_tiles' K window check on stored bytes b: stored - MX_CHK_LO as uint32 (a byte below the
    window wraps to ~2**32), flagged (the item's l NaN: REDO) when >= MX_CHK_TOP - MX_CHK_LO."""
    from trace_rl.kernels.paged_attention_gluon_kv import MX_CHK_LO, MX_CHK_TOP

    return ((b.to(torch.int64) - MX_CHK_LO.value) % 2 ** 32) >= MX_CHK_TOP.value - MX_CHK_LO.value


def test_checked_pairs_are_exact_in_the_window_and_loud_outside():
    """Every stored byte s (E8M0 code + 1; the exact kernel's scale is 2**(s - 128)): the K and V pairs are 2**(s - 7)
    for s in MX_CHK_LO..134 (times a code's bf16 bits, code x 2**-126: code x scale x 2**-MX_CHK); outside (below
    MX_CHK_LO, byte 0 included, or >= 135), V's pair is +Inf (its values +-Inf or NaN: every output column of those
    head dims non-finite) and K's byte is flagged by the kernel's unsigned per-thread max of stored - MX_CHK_LO, which
    turns into a NaN row sum (the whole item NaN: REDO)."""
    _bf16, _, _mx_k_pairs, _mx_v_pairs, _ = _helpers()
    from trace_rl.kernels.paged_attention_gluon_kv import MX_CHK, MX_CHK_LO, MX_CHK_LO_BYTE, MX_CHK_TOP

    assert MX_CHK_LO.value == MX_CHK_LO_BYTE == 64 and MX_CHK_TOP.value == 135
    s = torch.arange(256, dtype=torch.int32)
    words = s | (s.flip(0) << 8) | (s << 16) | (s.flip(0) << 24)
    v02, v13 = _mx_v_pairs(words, 3)
    k02, k13 = _mx_k_pairs((s | (s.flip(0) << 8)).to(torch.int16), 3)
    window = (s >= MX_CHK_LO.value) & (s <= 134)
    want = torch.exp2((s - 128 - MX_CHK + 126).double()).float()
    for pair, b, v in ((v02, s, True), (v13, s.flip(0), True), (k02, s, False), (k13, s.flip(0), False)):
        pair = pair.to(torch.int64) & 0xFFFFFFFF
        lo, hi = _bf16(pair & 0xFFFF), _bf16(pair >> 16)
        assert torch.equal(lo, hi)
        inside = window[b.long()]
        assert torch.equal(lo[inside], want[b.long()][inside])
        if v:                                                               # V: +Inf outside, on both ends
            assert (lo[~inside] == torch.inf).all()
    assert torch.equal(_k_flagged(s), ~window)                              # K: flagged exactly outside


def test_checked_decode_is_the_exact_decode_times_2_to_the_minus_5():
    """Each E2M1 code x each in-window byte: the checked value (one product of the code's bf16 bits and the pair) is
    the exact kernel's (bits x 2**125 x 2**(s - 127)) x 2**-5, and both are exact in bf16 (down to bf16's smallest
    subnormal, 2**-133, at s = 1): so the MMAs see the exact operands scaled by a power of two. Inside the window the
    checked values are normal bf16 numbers >= 2**(MX_CHK_LO - 134) = 2**-70 (or zero)."""
    _, _, _mx_k_pairs, _mx_v_pairs, _values = _helpers()
    from trace_rl.kernels.paged_attention_gluon_kv import MX_CHK, MX_CHK_LO

    nib = torch.arange(16, dtype=torch.int32)
    # a word whose 8 slots hold codes i, i+1, ..; twiddled order does not matter here (all codes are covered)
    x = torch.stack([sum(((n + j) % 16) << (4 * j) for j in range(8)) for n in nib]).to(torch.int32)
    for s in range(MX_CHK_LO.value, 135):
        sw = torch.tensor([s | (s << 8) | (s << 16) | (s << 24)], dtype=torch.int64).to(torch.int32)
        chk = _values(x, _mx_v_pairs(sw, 3)[0].to(torch.int32), 3)
        exact = _values(x, _mx_v_pairs(sw, 1)[0], 1)
        for c, e in zip(chk, exact):
            assert torch.equal(c * 2.0 ** MX_CHK, e), s
            assert torch.equal(c.to(torch.bfloat16).float(), c) and torch.equal(e.to(torch.bfloat16).float(), e), s
            assert ((c == 0) | (c.abs() >= 2.0 ** (MX_CHK_LO.value - 134))).all(), s
    got = sorted({abs(v) for t in _values(x, _mx_v_pairs(torch.tensor([0x80808080]).to(torch.int32), 1)[0], 1)
                  for v in t.tolist()})
    assert got == list(E2M1)                                # stored 128: scale 1, the codes themselves


def test_writer_stores_scale_bytes_1_to_253_or_255(gen):
    """What the checked window sees from the writers: zero blocks store byte 1 (code 0: below MX_CHK_LO, so a live
    zero block costs an exact REDO of its item, never a wrong result), finite blocks 1..253 (amax < 2**128 gives
    codes <= 252), NaN / Inf blocks 255, and never byte 0 (code 254; the checked path would catch it too). kv_write
    runs on CUDA tensors where a GPU is there (on a CPU-only machine conftest sets TRITON_INTERPRET=1 and it runs in
    the interpreter); PagedKV.write_reference, the torch writer, must store the same bytes."""
    from trace_rl.formats import kv_layout as L
    from trace_rl.formats.paged_kv import PagedKV
    from trace_rl.kernels import kv_write
    from trace_rl.kernels.paged_attention_gluon_kv import MX_CHK_LO

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for role in "kv":
        x = torch.randn(256, 2, 128, generator=gen) * torch.exp2(torch.randint(-140, 128, (256, 2, 1),
                                                                                generator=gen).float())
        x[:8] = 0.0
        x[8:16] = torch.finfo(torch.bfloat16).max
        x[16, 0, 3], x[17, 1, 40], x[18, 0, 100] = float("nan"), float("inf"), -float("inf")
        x = x.to(torch.bfloat16)
        ref = PagedKV.allocate("mxfp4", 4, 64, 2, 128, role=role)
        ref.write_reference(torch.arange(256), x)
        cache = PagedKV.allocate("mxfp4", 4, 64, 2, 128, role=role, device=dev)
        kv_write(cache, torch.arange(256, device=dev), x.to(dev))
        stored = cache.scales.cpu().flatten().long()
        assert torch.equal(stored, ref.scales.flatten().long())
        assert stored.min() >= 1 and ((stored <= 253) | (stored == 255)).all()
        assert (stored == 255).any() and (stored > 134).any()                 # NaN and out-of-window blocks exist
        assert (stored == 1).any() and (stored < MX_CHK_LO.value).any()        # zero / tiny blocks: below the window
    assert (L.encode_scales("mxfp4", torch.arange(253)) != 0).all()


def test_checked_configs():
    assert gluon.LEAN_CHECKED == gluon.GluonAttentionConfig(n_pad=8, unroll=2, col_max=True, mx_checked=True)
    gluon.LEAN_CHECKED.check()
    with pytest.raises(ValueError, match="mx_fold and mx_checked"):
        gluon.GluonAttentionConfig(mx_fold=True, mx_checked=True).check()
    assert [gluon.LEAN_CHECKED.mx(f) for f in ("nvfp4:row", "mxfp4")] == [0, 3]        # nvfp4 ignores it
    assert [gluon.GluonAttentionConfig(mx_fold=f).mx("mxfp4") for f in (False, True)] == [1, 2]


def test_default_config_follows_lean_mx_checked(monkeypatch):
    """With LEAN_MX_CHECKED set, mxfp4 caches at groups <= 8 run LEAN_CHECKED; nvfp4, groups 9..16 and unknown
    groups are unchanged. The last two lines pin the shipped switch: flip them with it."""
    monkeypatch.setattr(gluon, "LEAN_MX_CHECKED", True)
    assert gluon.default_config(4, "mxfp4") == gluon.LEAN_CHECKED == gluon.default_config(8, "mxfp4")
    assert gluon.default_config(4, "nvfp4:row") == gluon.LEAN == gluon.default_config(4)
    assert gluon.default_config(12, "mxfp4") == gluon.default_config(12, "nvfp4:row")
    assert gluon.default_config(0, "mxfp4") == gluon.DEFAULT
    monkeypatch.undo()
    assert gluon.LEAN_MX_CHECKED is True                    # on since the H200 check mxkv was green (_1203c)
    assert gluon.default_config(4, "mxfp4") == gluon.LEAN_CHECKED


def test_probability_flush_keeps_folded_products_normal():
    """The flush threshold against the window: the smallest kept bf16 probability (2**-MX_P_FLUSH_LOG2; p >= it
    rounds to a bf16 >= it) times the smallest nonzero checked element (0.5 x 2**(MX_CHK_LO - 133)) is a normal
    float32 with the exact kernel's products 2**MX_CHK larger: both kernels' P x v products are normal, so the
    checked one's are the exact one's x 2**-MX_CHK bit for bit. Checked in float32 arithmetic too."""
    from trace_rl.kernels.paged_attention_gluon_kv import MX_CHK, MX_CHK_LO
    from trace_rl.kernels.paged_attention_gluon_tiles import MX_P_FLUSH, MX_P_FLUSH_LOG2

    assert MX_P_FLUSH.value == MX_P_FLUSH_LOG2
    smallest_v = 2.0 ** -1 * 2.0 ** (MX_CHK_LO.value - 133)
    assert smallest_v == 2.0 ** -70
    p = torch.tensor(2.0 ** -MX_P_FLUSH_LOG2, dtype=torch.float32)
    assert p.to(torch.bfloat16).float() == p                                 # exactly a bf16
    prod = p * torch.tensor(smallest_v, dtype=torch.float32)
    assert prod >= torch.finfo(torch.float32).tiny                           # normal in the checked kernel
    assert prod * 2.0 ** MX_CHK == p * torch.tensor(smallest_v * 2.0 ** MX_CHK, dtype=torch.float32)
    # the largest element the window allows (6 x 2**(134 - 133) folded) times 1 stays finite, far from overflow
    assert torch.isfinite(torch.tensor(6.0 * 2.0 ** (134 - 133) * 2.0 ** MX_CHK, dtype=torch.float32))


def _corrupt(k, v, bt, lens, gen, mode):
    """Scale bytes of written pages rewritten at random positions: 'window' in-window extremes (LO..LO+11, 123..134;
    LO = MX_CHK_LO) over ~2% of the bytes (stale slots too); 'loud': out-of-window bytes above (135, 170..254), below
    (0, 1, LO - 1) and NaN (255), in K of some sequences and V of others, one byte in a full page each; returns the
    (sequence, kv head) items hit."""
    from trace_rl.kernels.paged_attention_gluon_kv import MX_CHK_LO

    lo = MX_CHK_LO.value
    pages = [bt[b, : -(-n // 64)].tolist() for b, n in enumerate(lens)]
    if mode == "window":
        for cache in (k, v):
            flat = cache.scales.view(-1)
            idx = torch.randint(0, flat.numel(), (flat.numel() // 50, ), generator=gen)
            vals = torch.cat([torch.randint(lo, lo + 12, (len(idx) // 2, ), generator=gen),
                              torch.randint(123, 135, (len(idx) - len(idx) // 2, ), generator=gen)])
            flat[idx.to(flat.device)] = vals.to(torch.uint8).to(flat.device)
        return []
    hits = []         # (sequence, kv head): the items that must come out of the REDO
    for b, cache, byte in ((1, k, 135), (4, k, 200), (5, k, 255), (2, v, 135), (6, v, 170), (10, v, 255),
                           (9, k, 254), (9, v, 254), (7, k, lo - 1), (8, v, lo - 1), (2, k, 0), (8, k, 1),
                           (6, v, 1), (4, v, 0)):
        if not pages[b]:
            continue
        full = pages[b][: max(1, lens[b] // 64)]              # a full page: the byte's token is a live one
        p = full[int(torch.randint(0, len(full), (1, ), generator=gen))]
        h = int(torch.randint(0, cache.heads, (1, ), generator=gen))
        pos = int(torch.randint(0, cache.scales.shape[-1], (1, ), generator=gen))
        cache.scales[p, h, pos] = byte
        hits.append((b, h))
    return hits


CASES = {   # id: (group, GluonAttentionConfig fields of the checked variant; the exact base drops mx_checked)
    "g4-lean": (4, dict(n_pad=8, unroll=2, col_max=True)),
    "g8-lean": (8, dict(n_pad=8, unroll=2, col_max=True)),
    "g1-lean": (1, dict(n_pad=8, unroll=2, col_max=True)),
    "g16-default": (16, dict()),
    "g4-persistent-lean": (4, dict(persistent=True, programs=5, n_pad=8, unroll=2, col_max=True)),
}


@gpu36[0]
@gpu36[1]
@pytest.mark.parametrize("mode", ["window", "loud"])
@pytest.mark.parametrize("case", list(CASES))
def test_checked_is_bit_identical_to_exact_gpu(case, mode, gen):
    """The checked launch + REDO against the exact kernel of the same fields (mx_checked off), bit for bit (NaN
    included): ragged lengths (full tiles 0, 4, 1, 0, 8, 23, 1, 3, 2, 1, 23; tails; an empty sequence), random
    caches; 'window': in-window extreme scale bytes everywhere; 'loud': out-of-window / NaN bytes in K and in V.
    'window' holds by the probability flush every mxfp4 path does (probabilities and alpha < 2**-51 to 0,
    test_probability_flush_keeps_folded_products_normal): its high K bytes (123..134) spread a row's scores ~2**10
    apart, so most probabilities are tiny, and unflushed their products with the small v of the 64..75 blocks were
    float32-subnormal in the checked kernel only (two H200 runs failed here at random groups before the flush)."""
    from trace_rl.kernels.paged_attention_gluon import GluonAttentionConfig, decode_attention_gluon

    group, fields = CASES[case]
    t = _helpers()[1]()
    lens = [1, 600, 133, 0, 1024, 3000, 255, 384, 256, 129, 2944]
    hkv = 8 if group < 16 else 2
    q, k, v, bt, sl = t._setup("mxfp4", lens, hkv, group, 128, 64, "cuda", gen)
    hits = _corrupt(k, v, bt, lens, gen, mode)
    args = (q.cuda(), k, v, bt.cuda(), sl.cuda(), 128 ** -0.5)
    exact = decode_attention_gluon(*args, config=GluonAttentionConfig(**fields))
    checked = decode_attention_gluon(*args, config=GluonAttentionConfig(mx_checked=True, **fields))
    assert torch.equal(checked.view(torch.int16), exact.view(torch.int16))
    assert (checked[3] == 0).all()
    if mode == "loud":
        assert hits and not exact[0].isnan().any()
        assert not exact[5].isfinite().all() and not exact[10].isfinite().all()     # NaN blocks stay non-finite
    else:
        assert exact.isfinite().all()
    if "persistent" not in case:                            # the checked path under a CUDA graph: the same bits
        g = torch.cuda.CUDAGraph()
        cfg = GluonAttentionConfig(mx_checked=True, **fields)
        with torch.cuda.graph(g):
            out = decode_attention_gluon(*args, config=cfg)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), exact.view(torch.int16))
