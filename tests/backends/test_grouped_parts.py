"""`GroupedQuantLinear(parts=2)`: an MoE layer's gate | up stacked into one grouped linear, each half quantized as
its own Linear (nvfp4: its own global scale, held per row). Against the unstacked pair, bit for bit: the packed
codes, scales and global scales of each half, the Hopper layout (torch reference and the relayout kernel), the
loop path and the grouped FP4 kernel (Triton's interpreter on CPU; on a GPU machine the tensors go to CUDA), and
weight sync (load_weight, offloaded re-derivation, a packed copy + refresh_layouts). The GPU check at the
Qwen3-30B-A3B expert shape is in test_grouped_parts_gpu.py."""

from __future__ import annotations

import pytest
import torch

from trace_rl.backends.grouped_linear import GroupedQuantLinear
from trace_rl.backends.grouped_parts import stack_parts
from trace_rl.kernels import interpreting
from trace_rl.models.grouped import gather_rows, permute

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),   # the interpreter's numpy
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")]

DEV = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
BUFFERS = ("w_codes", "w_scales", "w_global_scale")


def _gate_up(rng, e=3, i=40, k=64):
    """[E, 2I, K] with gate and up halves of very different magnitudes (so their nvfp4 global scales differ)."""
    w = torch.randn(e, 2 * i, k, generator=rng)
    return (w * torch.exp(2 * torch.randn(e, 2, 1, generator=rng)).repeat_interleave(i, dim=1)).to(DEV)


def _pair(w, fmt="nvfp4", act="nvfp4"):
    i = w.shape[1] // 2
    return (GroupedQuantLinear(w, fmt, act, parts=2), GroupedQuantLinear(w[:, :i].contiguous(), fmt, act),
            GroupedQuantLinear(w[:, i:].contiguous(), fmt, act))


def _tokens(rng, e, tokens, k):
    ids = torch.stack([torch.randint(0, e, (tokens,), generator=rng), torch.randint(0, e, (tokens,), generator=rng)], 1)
    perm = permute(ids, e, 1)
    x = gather_rows(torch.randn(tokens, k, generator=rng).to(torch.bfloat16), perm)
    return x.to(DEV), perm.ends.to(DEV)


def _assert_halves_equal(st, gate, up):
    """Each half of the stacked buffers is the unstacked module's, byte for byte (global: one per row)."""
    i = gate.out_features
    for name in ("w_codes", "w_scales"):
        s, g, u = (getattr(m, name).view(torch.uint8) for m in (st, gate, up))
        assert torch.equal(s[:, :i], g) and torch.equal(s[:, i:], u)
    glob = st.w_global_scale
    assert glob.shape == (st.num_experts, 2 * i, 1)
    assert torch.equal(glob[:, :i], gate.w_global_scale.view(-1, 1, 1).expand(-1, i, 1))
    assert torch.equal(glob[:, i:], up.w_global_scale.view(-1, 1, 1).expand(-1, i, 1))


@pytest.mark.parametrize("act", ["bf16", "nvfp4"])
def test_nvfp4_stacked_gate_up_equals_the_unstacked_pair(act, rng):
    """Odd sizes (I = 40: a 16-row layout block straddles gate and up; 7 tokens, top-2 over 3 experts): the same
    codes, scales, globals and layouts; the loop path and the grouped kernel give the pair's outputs bit for bit."""
    from trace_rl.kernels.hopper_fp4 import expert_q, from_hopper, to_hopper
    from trace_rl.kernels.linear import hopper_weight

    w = _gate_up(rng)
    st, gate, up = _pair(w, act=act)
    _assert_halves_equal(st, gate, up)
    assert bool((st.w_global_scale[:, 0] != st.w_global_scale[:, -1]).all())   # the halves' globals differ
    # per expert: dequantization (the emulated loop's weight) is the halves', bit for bit
    for e in range(st.num_experts):
        deq = st.packed(e).dequantized()
        assert torch.equal(deq, torch.cat([gate.packed(e).dequantized(), up.packed(e).dequantized()]))
    # the Hopper layout: row factors per row (each half its global x 2**19), the rest the halves' layouts
    h, hg, hu = (hopper_weight(m.stacked()) for m in (st, gate, up))
    assert torch.equal(h.row_factor[:, :40], hg.row_factor[:, :40])
    assert torch.equal(h.row_factor[:, 40:80], hu.row_factor[:, :40])
    back = from_hopper(to_hopper(expert_q(st.stacked().q, 1)))       # the per-row global survives the round trip
    assert torch.equal(back.global_scale.cpu(), st.w_global_scale[1].cpu())
    assert torch.equal(back.codes.cpu(), st.w_codes[1].cpu())
    x, ends = _tokens(rng, 3, 7, 64)
    for path in ("loop", "fp4_grouped"):
        for m in (st, gate, up):
            m.force_path = path
        seen = st.backend.paths.counts.get(f"experts.{path}", 0)
        got = st(x, ends)
        assert st.backend.paths.counts[f"experts.{path}"] == seen + 1
        assert torch.equal(got, torch.cat([gate(x, ends), up(x, ends)], dim=1)), path


def test_relayout_kernel_takes_per_row_globals(rng):
    """The Triton relayout (weight sync on the GPU) on stacked experts with per-row globals = `to_hopper`."""
    from trace_rl.kernels.fp4_relayout import relayout
    from trace_rl.kernels.hopper_fp4 import to_hopper

    st = GroupedQuantLinear(_gate_up(rng, e=2, i=24, k=128), "nvfp4", parts=2)
    q = st.stacked().q
    ref, got = to_hopper(q.to("cpu")), relayout(q.to(DEV) if DEV == "cuda" else q)
    for a, b in ((got.values, ref.values), (got.scales, ref.scales),
                 (got.row_factor.view(torch.int32), ref.row_factor.view(torch.int32))):
        assert torch.equal(a.cpu(), b)
    assert not torch.equal(ref.row_factor[:, 0], ref.row_factor[:, 24])


def test_weight_sync_requantizes_both_halves(monkeypatch, rng):
    """load_weight quantizes each half on its own (= fresh unstacked modules), re-deriving the layout in place;
    with the reference offloaded (re-derived 2 experts at a time), and through a packed copy + refresh_layouts."""
    from trace_rl.kernels.linear import hopper_weight

    monkeypatch.setattr(GroupedQuantLinear, "REDERIVE_CHUNK", 2)          # 3 experts: chunks of 2, 1
    old, new = _gate_up(rng), _gate_up(rng)
    st, _, _ = _pair(old)
    fresh, gate, up = _pair(new)
    for m in (st, fresh, gate, up):
        m.force_path = "fp4_grouped"
    x, ends = _tokens(rng, 3, 5, 64)
    before = st(x, ends)
    layout = hopper_weight(st.stacked())
    ptrs = [t.data_ptr() for t in (layout.values, layout.scales, layout.row_factor)]
    st.load_weight(new)
    _assert_halves_equal(st, gate, up)
    assert [t.data_ptr() for t in (layout.values, layout.scales, layout.row_factor)] == ptrs
    want = torch.cat([gate(x, ends), up(x, ends)], dim=1)
    assert torch.equal(st(x, ends), want) and not torch.equal(want, before)
    st.offload_reference()
    st.load_weight(old)                                     # re-derived from the host reference, chunk by chunk
    assert torch.equal(st(x, ends), before)
    for name in BUFFERS:                                    # packed weight sync: copy the buffers, then refresh
        getattr(st, name).copy_(getattr(fresh, name))
    st.refresh_layouts()
    assert torch.equal(st(x, ends), want)
    assert hopper_weight(st.stacked()) is layout


def test_parts_for_row_local_formats_change_nothing_and_spanning_scales_are_refused(rng):
    w = _gate_up(rng, e=2, i=16, k=64)
    mx, mx_whole = GroupedQuantLinear(w, "mxfp4", parts=2), GroupedQuantLinear(w, "mxfp4")
    assert torch.equal(mx.w_codes, mx_whole.w_codes) and torch.equal(mx.w_scales, mx_whole.w_scales)
    with pytest.raises(ValueError, match="scales span rows"):
        GroupedQuantLinear(w, "fp8_e4m3:tensor", parts=2)
    with pytest.raises(ValueError, match="divide the 32 output rows"):
        GroupedQuantLinear(w, "nvfp4", parts=3)
    q = stack_parts([GroupedQuantLinear(half, "nvfp4").packed(0).q for half in (w[:, :16], w[:, 16:])])
    assert q.shape == (32, 64) and q.global_scale.shape == (32, 1)
