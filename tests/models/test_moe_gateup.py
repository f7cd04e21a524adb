"""nvfp4 MoE experts stack gate | up in the rollout (`Experts.to_rollout`: one `GroupedQuantLinear(parts=2)`):
the block computes what the unstacked gate/up pair computed before. The per-expert loop (CPU) runs the same ops,
so the whole model is bit for bit the same; on the grouped FP4 kernel (Triton's interpreter here) the one change
is where SiLU x up runs (fused into the down projection's quantize launch instead of torch's `F.silu(gate) * up`),
so the block is compared bit for bit with the unstacked pair's gate and up outputs fed to that same fused launch.
The GPU version (Qwen3-30B-A3B expert shapes) is test_moe_gateup_gpu.py."""

from __future__ import annotations

import pytest
import torch

from trace_rl.engine.native import rollout_copy
from trace_rl.models import moe, tiny_model
from trace_rl.models.grouped import permute, unpermute
from trace_rl.plan import PrecisionPlan

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),   # the interpreter's numpy
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")]


def stacked_and_unstacked(model, plan, device, dtype, monkeypatch):
    """Rollout copies of `model`: nvfp4 gate/up stacked (now) and unstacked (before: nvfp4 not STACKABLE)."""
    stacked = rollout_copy(model, plan, device, dtype)
    with monkeypatch.context() as m:
        m.setattr(moe, "STACKABLE", tuple(f for f in moe.STACKABLE if f != "nvfp4"))
        unstacked = rollout_copy(model, plan, device, dtype)
    return stacked, unstacked


def unstacked_with_fused_silu(ex, x, ids, weights):
    """The unstacked experts' gate and up outputs, SiLU x up and the down projection in the stacked path's
    fused launch (`silu_mul=True`): what the stacked block must equal bit for bit on every path."""
    r = ex.rollout
    perm = permute(ids, ex.num_experts, ex._align(x))
    gate, up = (r[p](x, perm.ends, src_rows=perm.token_of_row, src_padded=perm.padded) for p in ("gate", "up"))
    return unpermute(r["down"](torch.cat([gate, up], dim=1), perm.ends, silu_mul=True), perm, weights)


@pytest.mark.parametrize("plan", ["w4a4-kv4", "w4a16"])
def test_nvfp4_stacked_gate_up_equals_the_unstacked_experts(plan, monkeypatch, rng):
    p = PrecisionPlan.preset(plan)
    model, _ = tiny_model("tiny-moe", seed=5, plan=p)
    new, old = stacked_and_unstacked(model, p, torch.device("cpu"), torch.bfloat16, monkeypatch)
    for ex_new, ex_old in zip(new.experts(), old.experts()):
        assert set(ex_new.rollout) == {"gate_up", "down"} and set(ex_old.rollout) == {"gate", "up", "down"}
        assert ex_new.rollout["gate_up"].parts == 2 and ex_new.rollout["gate_up"].weight_fmt == "nvfp4"
    tokens = torch.randint(4, 100, (2, 5), generator=rng)
    with torch.no_grad():
        assert torch.equal(new(tokens), old(tokens))                 # the per-expert loop: the same ops
        ex_new, ex_old = new.experts()[0], old.experts()[0]
        x = torch.randn(9, model.config.hidden_size, generator=rng).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(ex_new.num_experts, generator=rng)[:2] for _ in range(9)])
        weights = torch.rand(9, 2, generator=rng).to(torch.bfloat16)
        for ex in (ex_new, ex_old):
            for g in ex.grouped_linears().values():
                g.force_path = "fp4_grouped"
        got = ex_new(x, ids, weights)
        counts = ex_new.rollout["gate_up"].backend.paths.counts
        assert counts["experts.fp4_grouped"] > 0
        assert torch.equal(got, unstacked_with_fused_silu(ex_old, x, ids, weights))
