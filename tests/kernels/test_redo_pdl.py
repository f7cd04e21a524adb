"""mxfp4's checked fold with its REDO launched as a programmatic dependent (GluonAttentionConfig.redo_pdl, preset
LEAN_CHECKED_PDL, switch LEAN_REDO_PDL; paged_attention_gluon.py). On CPU: the launches `decode_attention_gluon`
makes, recorded with stand-in kernels (the checked launch with PDL, the REDO with PDL and launch_pdl=True, on the same
grid and arguments as without redo_pdl; nothing PDL without it), the config check and the default switch. On an sm_90
GPU with Triton 3.6: checked + PDL REDO bit-identical to the exact kernel and to the plain REDO ('window' and 'loud'
corruption: 'loud' makes the REDO recompute items, so the PDL wait is what the result rests on), also with more
programs than resident CTA slots and under a CUDA graph."""

import pytest
import torch

from tests.gpu_marks import gpu36
from trace_rl.formats.paged_kv import PagedKV

gluon = pytest.importorskip("trace_rl.kernels.paged_attention_gluon")
persistent = pytest.importorskip("trace_rl.kernels.paged_attention_gluon_persistent")


class _Recorder:
    """Stands in for a Gluon kernel: `kernel[grid](*args, **kw)` records (name, grid, args, kw)."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((self.name, grid, args, kw))


@pytest.fixture
def launches(monkeypatch):
    calls = []
    monkeypatch.setattr(gluon, "_check", lambda *a, **k: None)            # no sm_90 here
    monkeypatch.setattr(gluon, "_block_desc", lambda t, blocks: ("desc", tuple(t.shape), t.dtype, blocks))
    monkeypatch.setattr(gluon, "_decode_attention_ws_kernel", _Recorder("ws", calls))
    monkeypatch.setattr(persistent, "_decode_attention_persistent_kernel", _Recorder("persistent", calls))

    def run(config, fmt="mxfp4", batch=3, group=4):
        calls.clear()
        k, v = (PagedKV.allocate(fmt, 8, 64, 2, 128, role=r) for r in "kv")
        q = torch.zeros(batch, 2 * group, 128, dtype=torch.bfloat16)
        bt = torch.zeros(batch, 4, dtype=torch.int32)
        sl = torch.full((batch, ), 100, dtype=torch.int32)
        gluon.decode_attention_gluon(q, k, v, bt, sl, 0.1, config=config)
        return list(calls)

    return run


def _norm(args):
    """Launch arguments comparable across calls: tensors by shape and dtype (each call allocates its own)."""
    return tuple(("tensor", tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


def _plain(kw):
    """A launch's keyword arguments without the PDL ones."""
    return {k: v for k, v in kw.items() if k not in ("PDL", "launch_pdl")}


def test_pdl_redo_launch_args(launches):
    """redo_pdl: the checked launch (MX 3) carries PDL=True (launch_dependents after its tile loop) and is not itself
    a PDL launch (it must wait for whatever ran before it); the REDO carries PDL=True (griddepcontrol.wait first) and
    launch_pdl=True. Grids, tensors, score factors and every other constexpr are the plain REDO's: the same items
    recomputed by the same exact kernel, so the same bits."""
    plain, pdl = launches(gluon.LEAN_CHECKED), launches(gluon.LEAN_CHECKED_PDL)
    assert [c[:2] for c in plain] == [c[:2] for c in pdl] == [("ws", (2, 3)), ("ws", (2, 3))]
    (_, _, a0, k0), (_, _, a1, k1) = pdl
    assert k0["MX"] == 3 and k0["PDL"] is True and "launch_pdl" not in k0 and not k0.get("REDO")
    assert k1["MX"] == 1 and k1["REDO"] is True and k1["PDL"] is True and k1["launch_pdl"] is True
    assert all(x is y for x, y in zip(a0[:10], a1[:10]))    # q, out, table, lengths, descriptors: this out
    for (_, _, a, kw), (_, _, pa, pkw) in zip(plain, pdl):
        assert "PDL" not in kw and "launch_pdl" not in kw               # the cached non-PDL compiles
        assert _norm(a) == _norm(pa) and kw == _plain(pkw)


def test_pdl_persistent_checked_launch_signals(launches):
    """The persistent checked kernel signals too; its REDO is the one-program-per-item kernel, launched with PDL."""
    c = gluon.GluonAttentionConfig(persistent=True, programs=5, n_pad=8, unroll=2, col_max=True, mx_checked=True,
                                   redo_pdl=True)
    (n0, g0, _, k0), (n1, g1, _, k1) = launches(c)
    assert (n0, g0, k0["MX"], k0["PDL"]) == ("persistent", (5, ), 3, True) and "launch_pdl" not in k0
    assert (n1, g1, k1["REDO"], k1["PDL"], k1["launch_pdl"]) == ("ws", (2, 3), True, True, True)


def test_no_pdl_without_a_redo(launches):
    """nvfp4 ignores mx_checked (no REDO), so no PDL either; an empty batch: the checked launch's empty grid (a no-op
    launch, as ever) without PDL and no REDO."""
    ((name, _, _, kw), ) = launches(gluon.LEAN_CHECKED_PDL, fmt="nvfp4")
    assert name == "ws" and kw["MX"] == 0 and "PDL" not in kw and "launch_pdl" not in kw
    ((_, grid, _, kw), ) = launches(gluon.LEAN_CHECKED_PDL, batch=0)
    assert grid == (2, 0) and "PDL" not in kw


def test_redo_pdl_config():
    assert gluon.LEAN_CHECKED_PDL == gluon.GluonAttentionConfig(n_pad=8, unroll=2, col_max=True, mx_checked=True,
                                                                 redo_pdl=True)
    gluon.LEAN_CHECKED_PDL.check()
    with pytest.raises(ValueError, match="mx_checked=True"):
        gluon.GluonAttentionConfig(redo_pdl=True).check()


def test_default_config_follows_lean_redo_pdl(monkeypatch):
    """With LEAN_MX_CHECKED and LEAN_REDO_PDL set, mxfp4 caches at groups <= 8 run LEAN_CHECKED_PDL; nvfp4 and groups
    9..16 are unchanged. The last two lines pin the shipped switch: flip them with it."""
    monkeypatch.setattr(gluon, "LEAN_MX_CHECKED", True)
    monkeypatch.setattr(gluon, "LEAN_REDO_PDL", True)
    assert gluon.default_config(4, "mxfp4") == gluon.LEAN_CHECKED_PDL == gluon.default_config(8, "mxfp4")
    assert gluon.default_config(4, "nvfp4:row") == gluon.LEAN
    assert gluon.default_config(12, "mxfp4") == gluon.default_config(12, "nvfp4:row")
    monkeypatch.setattr(gluon, "LEAN_MX_CHECKED", False)
    assert gluon.default_config(4, "mxfp4") == gluon.LEAN                  # no checked fold: no REDO to launch
    monkeypatch.undo()
    assert gluon.LEAN_REDO_PDL is False                     # off until the H200 check redopdl is green
    assert gluon.default_config(4, "mxfp4") == gluon.LEAN_CHECKED


CASES = {   # id: (group, GluonAttentionConfig fields of the exact base; lengths: None = the checked tests' ragged set)
    "g4-lean": (4, dict(n_pad=8, unroll=2, col_max=True), None),
    "g8-lean": (8, dict(n_pad=8, unroll=2, col_max=True), None),
    "g1-lean": (1, dict(n_pad=8, unroll=2, col_max=True), None),
    "g4-persistent-lean": (4, dict(persistent=True, programs=5, n_pad=8, unroll=2, col_max=True), None),
    # 300 sequences x 8 kv heads = 2400 programs, ~9 waves of the 264 resident slots: the checked grid's signal
    # completes only in its last wave, REDO programs then take slots as checked ones exit
    "g4-lean-waves": (4, dict(n_pad=8, unroll=2, col_max=True), "waves"),
}


@gpu36[0]
@gpu36[1]
@pytest.mark.parametrize("mode", ["window", "loud"])
@pytest.mark.parametrize("case", list(CASES))
def test_pdl_redo_is_bit_identical_gpu(case, mode, gen):
    """The checked launch + PDL REDO against the exact kernel and the plain REDO, bit for bit (NaN included), over
    test_paged_attention_gluon_checked's corrupted ragged caches. The output buffer is handed out by the caching
    allocator from a block just filled with zeros: a REDO program that read its item before the checked launch wrote
    it would see a finite item, skip a needed recompute and leave the checked NaN ('loud' mode: a mismatch)."""
    from tests.kernels.test_paged_attention_gluon_checked import _corrupt, _helpers
    from trace_rl.kernels.paged_attention_gluon import GluonAttentionConfig, decode_attention_gluon

    group, fields, lens = CASES[case]
    t = _helpers()[1]()
    lens_ragged = [1, 600, 133, 0, 1024, 3000, 255, 384, 256, 129, 2944]     # _corrupt's items: sequences 1..10
    if lens == "waves":           # the ragged set first (_corrupt's bytes land in live tokens), then 289 short ones
        lens = lens_ragged + torch.randint(1, 700, (289, ), generator=gen).tolist()
    else:
        lens = lens_ragged
    q, k, v, bt, sl = t._setup("mxfp4", lens, 8, group, 128, 64, "cuda", gen)
    hits = _corrupt(k, v, bt, lens, gen, mode)
    args = (q.cuda(), k, v, bt.cuda(), sl.cuda(), 128 ** -0.5)
    exact = decode_attention_gluon(*args, config=GluonAttentionConfig(**fields))
    plain = decode_attention_gluon(*args, config=GluonAttentionConfig(mx_checked=True, **fields))
    cfg = GluonAttentionConfig(mx_checked=True, redo_pdl=True, **fields)
    for _ in range(3):
        torch.zeros_like(exact)               # freed at once: the next output's block, zeros (see the docstring)
        pdl = decode_attention_gluon(*args, config=cfg)
        assert torch.equal(pdl.view(torch.int16), exact.view(torch.int16))
    assert torch.equal(plain.view(torch.int16), exact.view(torch.int16))
    assert (pdl[3] == 0).all()
    if mode == "loud":
        assert hits and not exact[5].isfinite().all()               # a NaN block: redone, still non-finite
    else:
        assert exact.isfinite().all()
    if "persistent" not in case:                            # PDL edges inside a CUDA graph: the same bits
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = decode_attention_gluon(*args, config=cfg)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), exact.view(torch.int16))
