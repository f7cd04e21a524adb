"""`op_range(name)`: a named profiler range around a part of the decode step (linears, attention, norms,
RoPE, KV write, sampling, ...), so `torch.profiler` can attribute each GPU kernel to an op class
(`trace-rl bench rollout --parts profile`). Free when no profiler runs: a null context, and nothing is
recorded inside captured CUDA graphs either way."""

from __future__ import annotations

from contextlib import nullcontext

import torch

PREFIX = "op:"


def op_range(name: str):
    if torch._C._autograd._profiler_enabled():
        return torch.profiler.record_function(PREFIX + name)
    return nullcontext()
