"""Splitting a prompt batch across rollout workers and merging their results back into one batch.

Prompts are split into contiguous chunks, so the responses to prompt i stay together on one worker and the
merged batch keeps the engine contract: rows i*n .. i*n+n-1 answer prompt i, "prompt_index" indexes the
whole prompt batch (the collector derives "group_id" from it). Each worker's responses are right-padded to
its own longest answer; the merge pads them to the longest of all. TRACE guidance records (guided plans)
and MoE routing records (router replay) are laid out per packed [prompt, response] position, so they are
padded at the end to the merged batch's prompt width + response width, with ("guidance", "valid") /
("routing", "valid") False there.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from trace_rl.data import schema as K
from trace_rl.data.padding import pad_value_for

PROMPT_KEYS = (K.TOKENS_PROMPT, K.MASK_PROMPT)


def split_prompts(prompts: TensorDictBase, workers: int) -> list[tuple[int, TensorDict]]:
    """[(first prompt index, chunk)] for the workers that get at least one prompt (sizes differ by <= 1)."""
    n = prompts.batch_size[0]
    tokens, mask = prompts.get(K.TOKENS_PROMPT), prompts.get(K.MASK_PROMPT)
    bounds = torch.linspace(0, n, workers + 1).round().long().tolist()
    chunks = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi > lo:
            width = max(int(mask[lo:hi].sum(1).max()), 1)     # drop all-padding columns of this chunk
            chunks.append((lo, TensorDict({K.TOKENS_PROMPT: tokens[lo:hi, :width].contiguous(),
                                           K.MASK_PROMPT: mask[lo:hi, :width].contiguous()}, batch_size=[hi - lo])))
    return chunks


def worker_seed(seed: int | None, worker: int) -> int | None:
    """Worker 0 keeps the seed (one worker reproduces the in-process engine); the others get distinct ones."""
    if seed is None or worker == 0:
        return seed
    return (seed * 1_000_003 + worker * 7_919) % (2**62)


def _pad_to(t: torch.Tensor, width: int, value) -> torch.Tensor:
    if t.shape[1] == width:
        return t
    pad = t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), value)
    return torch.cat([t, pad], dim=1)


def merge_results(parts: list[tuple[int, TensorDictBase]], prompts: TensorDictBase,
                  pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT) -> TensorDict:
    """One batch from [(first prompt index, worker result)], in prompt order, with the full prompts."""
    parts = sorted(parts, key=lambda p: p[0])
    width = max(td.get(K.TOKENS_RESPONSE).shape[1] for _, td in parts)
    packed_width = prompts.get(K.TOKENS_PROMPT).shape[1] + width      # [prompt, response] as the trainer packs
    keys = [k for k in parts[0][1].keys(include_nested=True, leaves_only=True) if k not in PROMPT_KEYS]
    out = {}
    for key in keys:
        values = []
        for first, td in parts:
            v = td.get(key).cpu()
            if key == K.PROMPT_INDEX:
                v = v + first
            elif key in K.RESPONSE_ALIGNED_KEYS:
                v = _pad_to(v, width, pad_value_for(key, pad_token_id))
            elif isinstance(key, tuple) and key[0] in (K.GUIDANCE, K.ROUTING):
                v = _pad_to(v, packed_width, 0)          # records sit at packed positions: pad the tail
            values.append(v)
        if len({v.shape[1:] for v in values}) > 1:
            raise ValueError(f"merge_results: {key} has per-worker shapes {[tuple(v.shape) for v in values]}; "
                             f"only response-aligned, guidance and routing keys are padded")
        out[key] = torch.cat(values)
    index = out[K.PROMPT_INDEX]
    out[K.TOKENS_PROMPT] = prompts.get(K.TOKENS_PROMPT)[index]
    out[K.MASK_PROMPT] = prompts.get(K.MASK_PROMPT)[index]
    return TensorDict(out, batch_size=[index.shape[0]])
