"""Qwen3-MoE against transformers, both checkpoint layouts, expert dispatch, plans over experts."""

from __future__ import annotations

import json

import pytest
import torch

from tests.models.hf_tiny import hf_moe_model
from trace_rl.backends.grouped_linear import GroupedQuantLinear, grouped_mm
from trace_rl.models import ModelConfig, load, preset, save_pretrained, tiny_model
from trace_rl.models.grouped import buffer_rows, gather_rows, permute, unpermute
from trace_rl.models.moe import MoEBlock, Router, expert_names, load_balancing_loss, moe_blocks
from trace_rl.objectives.logprobs import response_log_probs
from trace_rl.plan import PrecisionPlan

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


@pytest.mark.parametrize("norm_topk_prob,original_format,layout", [
    (True, True, dict(mlp_only_layers=(1,))),
    (False, False, dict(mlp_only_layers=(1,))),
    (True, True, dict(mlp_only_layers=(), sparse_step=2)),
])
def test_logits_and_log_probs_equal_transformers(norm_topk_prob, original_format, layout, tmp_path, rng):
    seed = int(torch.randint(0, 2**31, (), generator=rng))
    ref = hf_moe_model(seed, norm_topk_prob=norm_topk_prob, **layout)
    ref.save_pretrained(str(tmp_path), save_original_format=original_format)
    keys = set(__import__("safetensors.torch", fromlist=["load_file"]).load_file(str(tmp_path / "model.safetensors")))
    assert any(".experts.0.gate_proj.weight" in k for k in keys) == original_format   # both layouts seen
    ours = load(tmp_path)
    assert ours.config.family == "qwen3_moe" and ours.config.norm_topk_prob == norm_topk_prob
    assert [i for i, layer in enumerate(ours.model.layers) if isinstance(layer.mlp, MoEBlock)] == \
        [i for i, layer in enumerate(ref.model.layers) if type(layer.mlp).__name__.endswith("SparseMoeBlock")]
    tokens = torch.randint(0, 83, (3, 37), generator=rng)
    with torch.no_grad():
        want = ref(tokens).logits
        got = ours(tokens)
    assert _rel(got, want) <= 1e-4
    # log-probs of a "response" through our trainer path vs transformers' logits
    prompt, resp = tokens[:, :20], tokens[:, 20:]
    ones = torch.ones_like
    lp, _ = response_log_probs(ours, prompt, ones(prompt, dtype=torch.bool), resp, ones(resp, dtype=torch.bool))
    ref_lp = torch.log_softmax(want[:, 19:-1].double(), -1).gather(-1, resp[..., None]).squeeze(-1)
    assert (lp.double() - ref_lp).abs().max() <= 1e-4


def test_save_pretrained_writes_per_expert_and_loads_in_both(tmp_path, rng):
    from transformers import AutoModelForCausalLM

    model, tok = tiny_model("tiny-moe", seed=4)
    save_pretrained(model, tok, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_moe" and cfg["num_experts"] == 8 and cfg["mlp_only_layers"] == [0]
    again = load(tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), local_files_only=True).float().eval()
    assert hf.config.num_experts == 8
    tokens = torch.randint(0, tok.vocab_size, (2, 13), generator=rng)
    with torch.no_grad():
        ours = model(tokens)
        assert torch.equal(again(tokens), ours)
        assert _rel(hf(tokens).logits, ours) <= 1e-4


def test_config_reads_both_expert_count_keys_and_refuses_inconsistent():
    base = preset("tiny-moe").to_hf_dict()
    assert ModelConfig.from_hf_dict(base).num_experts == 8
    alt = {k: v for k, v in base.items() if k != "num_experts"} | {"num_local_experts": 8}
    assert ModelConfig.from_hf_dict(alt) == ModelConfig.from_hf_dict(base)
    with pytest.raises(ValueError, match="num_experts"):
        ModelConfig.from_hf_dict({k: v for k, v in base.items() if k != "num_experts"})
    with pytest.raises(ValueError, match="qwen3_moe"):
        ModelConfig(family="qwen3", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        preset("tiny-moe").replace(num_experts_per_tok=9)
    big = preset("qwen3-30b-a3b")
    assert 30.0e9 < big.num_params < 31.0e9 and 3.2e9 < big.num_active_params < 3.5e9


@pytest.mark.parametrize("align", [1, 4])
def test_permute_groups_slots_by_expert(align, rng):
    n, k, e = 13, 3, 6
    ids = torch.stack([torch.randperm(e, generator=rng)[:k] for _ in range(n)])
    perm = permute(ids, e, align)
    assert perm.rows == buffer_rows(n, k, e, align)
    ends = perm.ends.tolist()
    counts = torch.bincount(ids.flatten(), minlength=e).tolist()
    starts = [0, *ends[:-1]]
    for x in range(e):
        assert (ends[x] - starts[x]) % align == 0 and ends[x] - starts[x] - counts[x] in range(align)
    # every slot has its own row, inside its expert's group, holding its token
    rows = perm.row_of_slot.view(n, k)
    assert len(set(perm.row_of_slot.tolist())) == n * k
    for t in range(n):
        for j in range(k):
            r = int(rows[t, j])
            assert starts[ids[t, j]] <= r < ends[ids[t, j]] and int(perm.token_of_row[r]) == t
    # rows no slot owns point at the zero padding row
    owned = set(perm.row_of_slot.tolist())
    assert all(int(perm.token_of_row[r]) == n for r in range(perm.rows) if r not in owned)
    # the whole dispatch equals the per-token sum over experts
    x = torch.randn(n, 10, generator=rng, dtype=torch.float64)
    w = torch.randn(e, 7, 10, generator=rng, dtype=torch.float64)
    weights = torch.rand(n, k, generator=rng, dtype=torch.float64)
    y = unpermute(grouped_mm(gather_rows(x, perm), w, perm.ends, "loop"), perm, weights)
    want = torch.stack([sum(weights[t, j] * (w[ids[t, j]] @ x[t]) for j in range(k)) for t in range(n)])
    assert torch.allclose(y, want, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int16])
def test_unpadded_permute_equals_the_padded_construction(dtype, rng):
    """align 1 takes the sort + searchsorted construction: the same rows, slots and ends as the general one,
    with empty experts at both ends and in the middle."""
    from trace_rl.models.grouped import _permute_padded

    ids = torch.randint(1, 6, (23, 3), generator=rng)
    ids[ids == 3] = 4                                        # experts 0, 3 and 7 get nothing
    ids = ids.to(dtype)
    fast, slow = permute(ids, 8, 1), _permute_padded(ids, 8, 1)
    assert not fast.padded and slow.padded and fast.rows == slow.rows == 69
    for name in ("token_of_row", "row_of_slot", "ends"):
        a, b = getattr(fast, name), getattr(slow, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    x = torch.randn(23, 5, generator=rng)
    assert torch.equal(gather_rows(x, fast), gather_rows(x, slow))


def test_grouped_paths_agree(rng):
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch has no _grouped_mm")
    ids = torch.randint(0, 5, (17, 2), generator=rng)
    ids[:, 1] = (ids[:, 0] + 1) % 5
    perm = permute(ids, 5, 1)
    x = gather_rows(torch.randn(17, 24, generator=rng), perm)
    w = torch.randn(5, 16, 24, generator=rng)
    with torch.no_grad():
        a = grouped_mm(x, w, perm.ends, "grouped_mm")
    b = grouped_mm(x, w, perm.ends, "loop")
    assert torch.allclose(a, b, atol=1e-5)
    g = GroupedQuantLinear(w, "bf16")
    assert g.path(x) == "grouped_mm" and torch.allclose(g(x, perm.ends), b, atol=1e-5)


def test_router_never_quantized_and_experts_follow_the_plan():
    plan = PrecisionPlan.preset("w4a4-kv4").model_copy(
        update={"keep_high_precision": ("lm_head", "embed_tokens", "*norm*", "model.layers.2.mlp.experts.*")})
    model, _ = tiny_model("tiny-moe", plan=plan)
    routers = [m for m in model.modules() if isinstance(m, Router)]
    assert len(routers) == 3 and not any(name.endswith("mlp.gate") for name in model.linears())
    ex = {e.name: e for e in model.experts()}
    assert ex["model.layers.1.mlp.experts"].formats["down_proj"] == ("nvfp4", "nvfp4")
    assert ex["model.layers.2.mlp.experts"].formats["gate_proj"] == ("bf16", "bf16")
    assert len(expert_names(model, "*.experts.*")) == 3 * 8 * 3
    model.to_rollout()
    assert all(isinstance(r.weight, torch.nn.Parameter) and r.weight.dtype == torch.float32 for r in routers)
    layer1 = ex["model.layers.1.mlp.experts"].rollout
    assert set(layer1) == {"gate_up", "down"} and layer1["down"].w_codes.dtype == torch.uint8   # nvfp4: stacked
    assert layer1["down"].w_global_scale.shape == (8,)                 # one global scale per expert
    glob = layer1["gate_up"].w_global_scale                            # gate | up: each half its own, per row
    assert glob.shape == (8, 128, 1)
    assert bool((glob[:, :64] == glob[:, :1]).all()) and bool((glob[:, 64:] == glob[:, 64:65]).all())
    assert set(ex["model.layers.2.mlp.experts"].rollout) == {"gate_up", "down"}   # bf16: gate/up stacked
    # a glob that splits one layer's experts is refused, naming the layer
    split = plan.model_copy(update={"keep_high_precision": ("*norm*", "model.layers.1.mlp.experts.3.*")})
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.experts\.\*\.gate_proj.*grouped GEMM"):
        tiny_model("tiny-moe", plan=split)


def test_fp4_rollout_equals_aligned_trainer_in_float64(rng):
    """The rollout's packed experts (each quantized as its own Linear) compute what the aligned trainer's
    per-expert fake quantization computes (float64: no rounding boundary crossed by float noise)."""
    from trace_rl.engine.native import rollout_copy

    plan = PrecisionPlan.preset("fp4-aligned")
    model, _ = tiny_model("tiny-moe", seed=2, dtype=torch.float64, plan=plan)
    rollout = rollout_copy(model, plan, torch.device("cpu"), torch.float64)
    tokens = torch.randint(4, 100, (2, 9), generator=rng)
    with torch.no_grad():
        trainer = model(tokens)
        packed = rollout(tokens)
        plain = model.apply_plan(None)(tokens)
    assert _rel(packed, trainer) < 1e-10
    assert _rel(trainer, plain) > 1e-3            # quantization did change the experts


def test_gradients_reach_router_and_experts_and_aux_loss_matches_transformers(rng):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    model, _ = tiny_model("tiny-moe", seed=1)
    blocks = moe_blocks(model)
    for b in blocks:
        b.collect_router_logits = True
    tokens = torch.randint(4, 100, (2, 11), generator=rng)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, 7:] = False
    logits = model(tokens)
    aux = load_balancing_loss([b.router_logits for b in blocks], 8, 2, mask)
    want = load_balancing_loss_func(tuple(b.router_logits for b in blocks), 8, 2, mask.long())
    assert torch.allclose(aux, want, rtol=1e-6)
    assert torch.allclose(load_balancing_loss([b.router_logits for b in blocks], 8, 2),
                          load_balancing_loss_func(tuple(b.router_logits for b in blocks), 8, 2), rtol=1e-6)
    (logits.logsumexp(-1).mean() + aux).backward()
    for b in blocks:
        assert b.gate.weight.grad.abs().sum() > 0
        assert b.experts.gate_up_proj.grad.abs().sum() > 0 and b.experts.down_proj.grad.abs().sum() > 0


def test_padded_groups_change_nothing(rng):
    model, _ = tiny_model("tiny-moe", seed=6)
    tokens = torch.randint(4, 100, (2, 7), generator=rng)
    with torch.no_grad():
        plain = model(tokens)
        for ex in model.experts():
            ex.align = 8                 # what CUDA uses: zero rows pad each expert's group
        assert torch.allclose(model(tokens), plain, atol=1e-6)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("plan", ["fp4", "w4a16-mx"])
def test_fp4_grouped_kernel_rollout_equals_the_loop(plan, rng):
    """A whole FP4 rollout model with its experts on the grouped FP4 kernel (Triton's interpreter on CPU) computes
    what the per-expert loop computes. float32 model: W4A4 differs by the kernel's float32 roundings only; W4A16
    also by the kernel reading the activations in bf16 (as the dense FP4 GEMM does; the emulated loop keeps
    float32)."""
    from trace_rl.engine.native import rollout_copy

    p = PrecisionPlan.preset(plan)
    model, _ = tiny_model("tiny-moe", seed=5, plan=p)
    rollout = rollout_copy(model, p, torch.device("cpu"), torch.float32)
    tokens = torch.randint(4, 100, (2, 5), generator=rng)
    with torch.no_grad():
        loop = rollout(tokens)
        for ex in rollout.experts():
            for g in ex.grouped_linears().values():
                g.force_path = "fp4_grouped"
        grouped = rollout(tokens)
    assert _rel(grouped, loop) < (1e-5 if plan == "fp4" else 1e-3)      # seen: 1.5e-7, 2e-4
