"""Supervised fine-tuning pieces the policy recipes share (scripts/train_default_policy.py,
scripts/train_study_policy.py, benchmarks/stability_gpu.py): `sft_batch`, the rows of a task (prompt + its
`sft_target`); `sft_step`, one optimizer step of masked next-token cross-entropy on them (`sft_loss`)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from trace_rl.tasks.base import Problem, Task


def sft_batch(task: Task, tok, problems: list[Problem], eos: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [B, T] long (prompt + target (+ EOS when `eos`), right-padded with the pad id) and a bool loss
    mask [B, T] over the target (and EOS) tokens, on the CPU."""
    tail = [tok.eos_token_id] if eos else []
    rows, starts = [], []
    for p in problems:
        prompt = tok.encode(p.prompt)
        rows.append(prompt + tok.encode(task.sft_target(p)) + tail)
        starts.append(len(prompt))
    width = max(map(len, rows))
    tokens = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (r, s) in enumerate(zip(rows, starts)):
        tokens[i, :len(r)] = torch.tensor(r)
        mask[i, s:len(r)] = True
    return tokens, mask


def sft_autocast(device: torch.device):
    """bf16 autocast on CUDA (fp32 master weights); on CPU a disabled one (the model runs in its own dtype)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def sft_loss(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean fp32 next-token cross-entropy over the masked tokens: `logits` [B, T-1, V] of tokens[:, :-1]
    predict tokens[:, 1:], counted where mask[:, 1:] holds."""
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1),
                           reduction="none")
    return (loss * mask[:, 1:].reshape(-1)).sum() / mask[:, 1:].sum()


def sft_step(model, opt: torch.optim.Optimizer, tokens: torch.Tensor, mask: torch.Tensor,
             autocast=None, clip: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """One step: forward (under `autocast`, default none), `sft_loss`, backward, gradients clipped to norm
    `clip`, `opt.step()`. Returns (loss, gradient norm before clipping), both still tensors (no sync)."""
    with autocast if autocast is not None else contextlib.nullcontext():
        logits = model(tokens[:, :-1])
    loss = sft_loss(logits, tokens, mask)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss, grad_norm
