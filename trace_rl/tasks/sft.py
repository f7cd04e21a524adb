"""`sft_batch`: supervised fine-tuning rows of a task (prompt + its `sft_target`), the one encoder the policy
recipes share (scripts/train_default_policy.py, scripts/train_study_policy.py, benchmarks/stability_gpu.py)."""

from __future__ import annotations

import torch

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
