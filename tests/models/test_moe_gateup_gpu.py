"""On the GPU, at the Qwen3-30B-A3B expert shape (128 experts, hidden 2048, intermediate 768, top-8) with 200 tokens:
nvfp4 gate | up stacked (`GroupedQuantLinear(parts=2)`, one grouped FP4 GEMM launch, the tokens quantized once)
equals the unstacked gate and up pair bit for bit (buffers quantized by the CUDA quantize kernel, layouts derived
by the relayout kernel with per-row globals, the grouped kernel's per-row factor in its epilogue); the MoE block
equals the unstacked pair's outputs fed to the same fused SiLU x up quantize launch, bit for bit. At 200 tokens
(12.5 rows per expert) on sm_90 with Triton 3.6 the grouped GEMMs are the Gluon kernel's (kernels.grouped_dispatch:
nvfp4, K = 2048 and 768; the rule has no N input, so the stacked and unstacked GEMMs take the same kernel and tile)."""

from __future__ import annotations

import pytest
import torch

from tests.models.test_moe_gateup import unstacked_with_fused_silu
from trace_rl.backends.grouped_linear import GroupedQuantLinear
from trace_rl.models import moe, preset
from trace_rl.models.grouped import permute

pytestmark = pytest.mark.gpu

TOKENS = 200


def _kernel() -> str:
    """The grouped kernel kernels.grouped_dispatch picks here for nvfp4 at 200 x 8 rows over 128 experts."""
    from trace_rl.kernels.grouped_dispatch import GLUON_GROUPED, grouped_gluon_available

    on = torch.cuda.get_device_capability() == (9, 0) and GLUON_GROUPED and grouped_gluon_available()
    return "gluon" if on else "triton"


def _routing(e: int, k: int, gen: torch.Generator):
    scores = torch.rand(TOKENS, e, device="cuda", generator=gen)
    ids = scores.topk(k, dim=-1).indices
    weights = torch.softmax(scores.gather(1, ids), dim=-1).to(torch.bfloat16)
    return ids, weights


def _experts(cfg, weights, stackable):
    with torch.device("cuda"):
        ex = moe.Experts(cfg).to(torch.bfloat16)
    ex.gate_up_proj.data.copy_(weights[0])
    ex.down_proj.data.copy_(weights[1])
    ex.formats = {p: ("nvfp4", "nvfp4") for p in moe.PROJECTIONS}
    old = moe.STACKABLE
    moe.STACKABLE = stackable
    try:
        ex.to_rollout()
    finally:
        moe.STACKABLE = old
    return ex


@pytest.mark.parametrize("act", ["nvfp4", "bf16"])
def test_stacked_gate_up_equals_the_unstacked_pair_at_qwen3_30b_shape(act):
    cfg = preset("qwen3-30b-a3b")
    e, h, i, k = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(e, 2 * i, h, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    w[:, i:] *= 8                                           # the halves' global scales differ
    st = GroupedQuantLinear(w, "nvfp4", act, parts=2)
    gate = GroupedQuantLinear(w[:, :i].contiguous(), "nvfp4", act)
    up = GroupedQuantLinear(w[:, i:].contiguous(), "nvfp4", act)
    for name in ("w_codes", "w_scales"):
        s = getattr(st, name).view(torch.uint8)
        assert torch.equal(s[:, :i], getattr(gate, name).view(torch.uint8))
        assert torch.equal(s[:, i:], getattr(up, name).view(torch.uint8))
    assert torch.equal(st.w_global_scale[:, :i, 0], gate.w_global_scale[:, None].expand(-1, i))
    assert torch.equal(st.w_global_scale[:, i:, 0], up.w_global_scale[:, None].expand(-1, i))
    ids, _ = _routing(e, k, gen)
    x = torch.randn(TOKENS, h, device="cuda", generator=gen).to(torch.bfloat16)
    perm = permute(ids, e, st.row_align(x))
    assert all(m.path(x) == "fp4_grouped" for m in (st, gate, up))
    got = st(x, perm.ends, src_rows=perm.token_of_row, src_padded=perm.padded)
    assert st.backend.paths.last == f"experts.fp4_grouped.{_kernel()}"
    pair = [m(x, perm.ends, src_rows=perm.token_of_row, src_padded=perm.padded) for m in (gate, up)]
    assert got.shape == (perm.token_of_row.shape[0], 2 * i)
    assert torch.equal(got, torch.cat(pair, dim=1))
    assert got[: int(perm.ends[-1])].abs().amax() > 0


def test_moe_block_stacked_equals_unstacked_at_qwen3_30b_shape():
    cfg = preset("qwen3-30b-a3b")
    e, h, i, k = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    gen = torch.Generator(device="cuda").manual_seed(1)
    weights = (torch.randn(e, 2 * i, h, device="cuda", generator=gen) * 0.02,
               torch.randn(e, h, i, device="cuda", generator=gen) * 0.02)
    new = _experts(cfg, weights, moe.STACKABLE)
    old = _experts(cfg, weights, tuple(f for f in moe.STACKABLE if f != "nvfp4"))
    assert set(new.rollout) == {"gate_up", "down"} and set(old.rollout) == {"gate", "up", "down"}
    ids, route_w = _routing(e, k, gen)
    x = torch.randn(TOKENS, h, device="cuda", generator=gen).to(torch.bfloat16)
    backend = new.rollout["gate_up"].backend
    before = backend.paths.counts.get("experts.fp4_grouped", 0)
    kernel = f"experts.fp4_grouped.{_kernel()}"
    before_kernel = backend.paths.counts.get(kernel, 0)
    with torch.no_grad():
        got = new(x, ids, route_w)
        assert backend.paths.counts["experts.fp4_grouped"] == before + 2          # gate_up and down: 2 launches
        assert backend.paths.counts[kernel] == before_kernel + 2                  # both on the dispatch's kernel
        assert torch.equal(got, unstacked_with_fused_silu(old, x, ids, route_w))
        # before the change: torch's F.silu(gate) * up; the fused launch rounds SiLU as torch does, with Triton's exp
        prev = old(x, ids, route_w)
    rel = float((got.float() - prev.float()).norm() / prev.float().norm())
    print(f"stacked vs previous (torch SiLU): rel {rel:.3g}, "
          f"{float((got != prev).float().mean()):.3g} of the outputs differ")
    assert rel < 1e-2
