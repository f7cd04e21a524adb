"""`RoutingRecorder`: the native engine records which experts each token used, for router replay.

Every MoE block of the rollout model gets a `routing_hook`; it receives the expert ids [B, T, k] of each
forward. In prefill (eager) a fresh prompt's records go straight to a per-prompt store (the samples of a
prompt share them, as they share its prefill); a sample that was preempted and is recomputed keeps the
records of its first pass (they describe the forwards its tokens were sampled from). In decode they are
copied into a static buffer [max_batch, layers, k] — a device copy, so the step stays capturable in a
CUDA graph — and the scheduler moves the rows of live slots to the per-row store after each step (device
indexing, no sync).

`result` lays the records out per output row and position exactly as the trainer packs [prompt, response]
(`trace_rl.data.padding.pack_full`), like the TRACE guidance records:
("routing", "experts") [rows, prompt width + response width, MoE layers, k] int16 and
("routing", "valid") [rows, width] bool. Prompt positions and every fed response token are recorded; the
last response token is never fed (the trainer never needs its routing: causality), nor is padding.
Memory: 2 x layers x k bytes per token (768 B for Qwen3-30B-A3B).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from trace_rl.data import schema as K
from trace_rl.models.moe import moe_blocks

RECORD_DTYPE = torch.int16


class RoutingRecorder:
    def __init__(self, model, max_batch: int, device: torch.device):
        self.blocks = moe_blocks(model)
        if not self.blocks:
            raise ValueError("routing recording needs a mixture-of-experts model (this one has no MoE layers)")
        self.top_k = self.blocks[0].top_k
        self.layers = [b.layer_idx for b in self.blocks]
        self.decode_buf = torch.zeros(max_batch, len(self.blocks), self.top_k, dtype=RECORD_DTYPE, device=device)
        self.context = None          # ("prefill", prompt indices [P], chunk rows [P]) while prefilling
        self.prompt_buf = self.resp_buf = None
        for slot, block in enumerate(self.blocks):
            block.routing_hook = lambda b, ids, slot=slot: self._store(slot, ids)

    def detach(self) -> None:
        for block in self.blocks:
            block.routing_hook = None

    @property
    def bytes_per_token(self) -> int:
        return len(self.blocks) * self.top_k * RECORD_DTYPE.itemsize

    def begin(self, num_prompts: int, prompt_width: int, rows: int, max_new: int) -> None:
        dev, shape = self.decode_buf.device, (len(self.blocks), self.top_k)
        self.prompt_buf = torch.zeros(num_prompts, prompt_width, *shape, dtype=RECORD_DTYPE, device=dev)
        self.resp_buf = torch.zeros(rows + 1, max_new, *shape, dtype=RECORD_DTYPE, device=dev)

    def _store(self, slot: int, ids: torch.Tensor) -> None:
        if self.context is not None:            # prefill (eager): fresh prompts' rows to the per-prompt store
            _, prompts, rows = self.context          # a chunk may be wider than prompts (recomputed samples)
            w = min(ids.shape[1], self.prompt_buf.shape[1])
            self.prompt_buf[prompts, :w, slot] = ids[rows, :w].to(RECORD_DTYPE)
        elif ids.shape[1] == 1 and ids.shape[0] <= self.decode_buf.shape[0]:
            # decode (one token per slot): a device copy, so it is part of any captured graph; the scheduler
            # moves the live slots' rows to the per-row store after the step (`store_decode`)
            self.decode_buf[: ids.shape[0], slot].copy_(ids[:, 0])

    def store_decode(self, rows: torch.Tensor, cols: torch.Tensor) -> None:
        """After a decode step over n slots: slot i's record goes to output row rows[i], response index cols[i]."""
        self.resp_buf[rows, cols] = self.decode_buf[: rows.shape[0]]

    def result(self, prompt_index, prompt_lens, ngen, prompt_width: int, resp_width: int) -> TensorDict:
        rows, dev = prompt_index.shape[0], prompt_index.device
        t = torch.arange(prompt_width + resp_width, device=dev)[None, :]
        plen = prompt_lens[prompt_index][:, None]
        in_prompt = t < plen
        resp_pos = t - plen
        in_resp = (~in_prompt) & (resp_pos < (ngen[:, None] - 1))
        a = self.prompt_buf[prompt_index[:, None], t.clamp(max=self.prompt_buf.shape[1] - 1)]
        b = self.resp_buf[torch.arange(rows, device=dev)[:, None], resp_pos.clamp(0, self.resp_buf.shape[1] - 1)]
        experts = torch.where(in_prompt[..., None, None], a, torch.where(in_resp[..., None, None], b, 0))
        return TensorDict({K.ROUTING_EXPERTS[1]: experts, K.ROUTING_VALID[1]: in_prompt | in_resp},
                          batch_size=[rows])
