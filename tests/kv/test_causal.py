"""`causal_attention`'s plan (how it calls SDPA) and the expanded-K/V path against SDPA's own GQA."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from trace_rl.kv import causal
from trace_rl.kv.causal import attention_plan, causal_attention, plan_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_plan_expands_only_float32_gqa_on_cuda_without_native_support():
    f32, bf16 = torch.float32, torch.bfloat16
    assert attention_plan("cuda", f32, 6, 2) == "expand_kv"
    assert attention_plan("cuda", f32, 6, 2, efficient_gqa=True) == "sdpa_gqa"   # torch with pytorch#191085
    assert attention_plan("cuda", f32, 6, 1) == "expand_kv"                        # MQA too
    for dtype in (bf16, torch.float16, torch.float64):    # flash/cuDNN take GQA; no fused kernel takes fp64
        assert attention_plan("cuda", dtype, 6, 2) == "sdpa_gqa"
    for dtype in (f32, bf16):
        assert attention_plan("cpu", dtype, 6, 2) == "sdpa_gqa"                    # CPU: unchanged
        assert attention_plan("cuda", dtype, 6, 6) == "sdpa"
        assert attention_plan("cpu", dtype, 6, 6) == "sdpa"
    with pytest.raises(ValueError, match="do not divide"):
        attention_plan("cuda", f32, 6, 4)


def test_cpu_keeps_sdpa_gqa(rng):
    q, k, v = (torch.randn(2, 37, h, 64, generator=rng) for h in (6, 2, 2))
    assert plan_for(q, k) == "sdpa_gqa" and plan_for(q, q) == "sdpa"
    want = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                          scale=0.125, enable_gqa=True).transpose(1, 2)
    assert torch.equal(causal_attention(q, k, v, 0.125), want)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference relative to the largest magnitude (q's gradient is 0 at T = 1)."""
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("backend", ["default", "math"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,hq,hkv", [(37, 6, 2), (1, 6, 2), (53, 4, 1)])
def test_expanded_kv_equals_sdpa_gqa(dtype, backend, t, hq, hkv, rng, monkeypatch):
    """The expanded path (what CUDA float32 takes) against SDPA's enable_gqa on the same inputs, odd lengths,
    through CPU's default kernel choice and through the math kernel: the output and q's gradient agree to
    relative 1e-6 in both dtypes (seen: equal), K/V's gradients in float32 (seen: <= 1.2e-7). In bf16 K/V's
    gradients differ by bf16 rounding: enable_gqa sums a group's gradients in float32 before rounding once,
    the expanded path rounds each query head's share to bf16 and sums in bf16 (seen: <= 0.8% of the
    largest). This is one reason the plan expands float32 only."""
    monkeypatch.setattr(causal, "plan_for", lambda q, k: "expand_kv")
    base = [torch.randn(2, t, h, 64, generator=rng).to(dtype) for h in (hq, hkv, hkv)]
    grad = torch.randn(2, t, hq, 64, generator=rng).to(dtype)

    def run(expanded: bool):
        q, k, v = (x.clone().requires_grad_() for x in base)
        with sdpa_kernel(SDPBackend.MATH) if backend == "math" else contextlib.nullcontext():
            out = causal_attention(q, k, v, 0.125) if expanded else F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=0.125,
                enable_gqa=True).transpose(1, 2)
            out.backward(grad)
        return out.detach(), q.grad, k.grad, v.grad

    for name, got, want in zip(("out", "dq", "dk", "dv"), run(True), run(False)):
        assert got.shape == want.shape and got.dtype == want.dtype
        bf16_kv = dtype == torch.bfloat16 and name in ("dk", "dv")
        assert _rel(got, want) <= (2 ** -6 if bf16_kv else 1e-6), name


@pytest.mark.gpu
def test_cuda_float32_gqa_runs_the_efficient_kernel_and_matches_math(rng):
    """On CUDA, float32 GQA takes the expanded path, which SDPA serves with its memory-efficient kernel (its
    float32 GEMMs are 3xTF32, about float32 accuracy); against the math kernel's GQA: output and gradients."""
    q, k, v = (torch.randn(3, 129, h, 64, generator=rng).cuda().requires_grad_() for h in (6, 2, 2))
    grad = torch.randn(3, 129, 6, 64, generator=rng).cuda()
    assert plan_for(q.bfloat16(), k.bfloat16()) == "sdpa_gqa"
    with torch.autocast("cuda", dtype=torch.bfloat16):          # SFT: SDPA gets bf16 whatever q's dtype
        assert plan_for(q, k) == "sdpa_gqa"
    if causal.efficient_takes_gqa(q.device):
        assert plan_for(q, k) == "sdpa_gqa"
        pytest.skip("this torch's efficient kernel takes enable_gqa itself")
    assert plan_for(q, k) == "expand_kv"
    out = causal_attention(q, k, v, 0.125)
    node = out.grad_fn.next_functions[0][0]
    assert "Efficient" in node.name(), node.name()
    got = [out.detach(), *torch.autograd.grad(out, (q, k, v), grad)]
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True, scale=0.125, enable_gqa=True).transpose(1, 2)
    want = [ref.detach(), *torch.autograd.grad(ref, (q, k, v), grad)]
    for name, x, y in zip(("out", "dq", "dk", "dv"), got, want):
        assert _rel(x, y) <= 2e-5, name
