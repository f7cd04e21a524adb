"""Weight sync, trainer -> rollout engines. Two payloads, same result bit for bit:

- `state_dict`: the trainer's (full) weights; each engine re-quantizes them (`NativeEngine.load_weights`).
  Ships 4 (float32) or 2 (bf16) bytes per weight; every worker pays the quantization.
- `packed`: the trainer quantizes once (`TrainerSidePacker`) and ships the engine's packed buffers
  (codes + scales: ~0.56 bytes per nvfp4 weight); each worker only copies them in place (`load_packed`).

Both keep the engine's buffers (no reallocation: captured CUDA graphs stay valid) and stamp the version.
The packer is a one-slot `NativeEngine` whose model is never run: its `load_weights` is the exact code the
workers would run, so the packed buffers cannot drift from a worker's own re-quantization.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn


def unique_state_keys(model: nn.Module) -> list[str]:
    """State-dict keys minus aliases (a tied bf16 lm_head reads the embedding table: ship it once)."""
    seen, keys = set(), []
    for key, t in model.state_dict().items():
        ident = (t.data_ptr(), t.dtype, tuple(t.shape), t.device)
        if ident not in seen:
            seen.add(ident)
            keys.append(key)
    return keys


def payload_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class TrainerSidePacker:
    """Quantizes trainer weights into the rollout engines' packed layout, once per sync ('packed' mode)."""

    def __init__(self, model: nn.Module, plan, device: torch.device | str, dtype: torch.dtype):
        from trace_rl.engine.native import NativeEngine

        self.engine = NativeEngine(model, plan, max_batch=1, max_seq_len=16, block_size=16, device=device,
                                   dtype=dtype, cuda_graphs=False)
        self.keys = unique_state_keys(self.engine.model)

    @torch.no_grad()
    def pack(self, state_dict: Mapping[str, torch.Tensor], version: int) -> dict[str, torch.Tensor]:
        self.engine.load_weights(state_dict, version)
        live = self.engine.model.state_dict()
        return {k: live[k] for k in self.keys}


@torch.no_grad()
def load_packed(engine, tensors: Mapping[str, torch.Tensor], version: int) -> None:
    """Copy packed buffers (from `TrainerSidePacker.pack`) into a `NativeEngine`'s model, in place."""
    live = engine.model.state_dict(keep_vars=True)
    expected = unique_state_keys(engine.model)
    if set(tensors) != set(expected):
        missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
        raise KeyError(f"load_packed: payload does not match this engine's layout (missing {missing[:4]}, "
                       f"unexpected {extra[:4]}); the packer and the workers must share plan, model and dtype")
    for key in expected:
        src, dst = tensors[key], live[key]
        if src.shape != dst.shape or src.dtype != dst.dtype:
            raise ValueError(f"load_packed: {key} is {tuple(src.shape)} {src.dtype}, the engine holds "
                             f"{tuple(dst.shape)} {dst.dtype}")
        dst.copy_(src)
    from trace_rl.backends.quant_linear import fp8_sync_check

    with fp8_sync_check():                          # FP8 operand caches: one exactness read for all of them
        for lin in engine.model.linears().values():   # dequantized copies and kernel layouts are stale now
            lin.quant.packed.refresh_layouts()
    for experts in engine.model.experts():         # MoE: the grouped kernel's layouts, the loop's caches
        experts.refresh_layouts()
    if engine.recapture_after_load and engine.graphs is not None:
        engine.graphs.invalidate()
    engine.policy_version = int(version)
