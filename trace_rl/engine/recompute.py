"""`RecomputeEngine`: the exact, slow reference engine. Re-runs the full forward for every new token.

It works with any `nn.Module` mapping token ids [B, T] -> logits [B, T, V] that is causal (position t
sees tokens 0..t). There is no KV cache, no attention mask and no position ids: each row is kept
*packed* (prompt tokens, then generated tokens, then padding), so for a causal model the trailing padding
cannot influence the logits at real positions, and the next-token logits of row b sit at its own last
real position. Prompts of different lengths therefore need no special handling beyond the gather.

Sampling goes through `trace_rl.engine.sampling`, so ("log_probs", "rollout") are the log-probs of the
distribution actually sampled (temperature, then top-k, then top-p).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tensordict import TensorDict
from torch import nn

from trace_rl.data import schema as K
from trace_rl.engine.base import RolloutEngine, SamplingParams, rollout_output
from trace_rl.engine.sampling import make_generator, process_logits, sample


class RecomputeEngine(RolloutEngine):
    """Reference `RolloutEngine` over a plain causal LM module.

    Args:
        model: module mapping token ids [B, T] (int64) -> logits [B, T, V].
        pad_token_id: written into padding positions of the response.
        device: where generation runs (default: the device of the model's first parameter, else CPU).
        policy_version: version stamped on samples until `load_weights` sets another one.

    Output rows follow `RolloutEngine`: responses to prompt i are rows i*n .. i*n+n-1. Keys written:
    ("tokens"|"masks", "prompt"|"response"), ("log_probs", "rollout"), "policy_version",
    "num_generated" (stop token included), "prompt_index". The response width is the longest response
    generated in the call (at most `max_new_tokens`).
    """

    def __init__(
        self,
        model: nn.Module,
        pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT,
        *,
        device: torch.device | str | None = None,
        policy_version: int = 0,
    ):
        self.model = model
        self.pad_token_id = pad_token_id
        if device is None:
            param = next(model.parameters(), None)
            device = param.device if param is not None else torch.device("cpu")
        self.device = torch.device(device)
        self.policy_version = policy_version

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy trainer weights into the module (strict: every key must match) and stamp `version`."""
        self.model.load_state_dict(dict(state_dict), strict=True)
        self.policy_version = int(version)

    def _generator(self, seed: int | None) -> torch.Generator:
        return make_generator(seed, self.device)

    @torch.no_grad()
    def generate(self, prompts: TensorDict, sampling: SamplingParams) -> TensorDict:
        prompt_tokens = prompts.get(K.TOKENS_PROMPT).to(self.device)
        prompt_mask = prompts.get(K.MASK_PROMPT).to(self.device).bool()
        num_prompts, prompt_width = prompt_tokens.shape
        n, max_new = sampling.n, sampling.max_new_tokens
        rows = num_prompts * n

        # Pack each prompt to the left (a right-padded prompt is already packed, but a mask with holes
        # would not be): stable sort puts real tokens first in their original order.
        order = torch.sort((~prompt_mask).to(torch.int8), dim=1, stable=True).indices
        packed = prompt_tokens.gather(1, order)
        prompt_len = prompt_mask.sum(1)
        if int(prompt_len.min()) == 0:
            raise ValueError("every prompt needs at least one token (the first response token is "
                             "predicted from the prompt's last position)")

        prompt_index = torch.arange(num_prompts, device=self.device).repeat_interleave(n)
        seq = torch.full((rows, prompt_width + max_new), self.pad_token_id, dtype=torch.long,
                         device=self.device)
        seq[:, :prompt_width] = packed[prompt_index]
        seq[:, :prompt_width].masked_fill_(~prompt_mask.gather(1, order)[prompt_index], self.pad_token_id)
        length = prompt_len[prompt_index].clone()  # current packed length per row

        resp_tokens = torch.full((rows, max_new), self.pad_token_id, dtype=torch.long, device=self.device)
        resp_logp = torch.zeros(rows, max_new, dtype=torch.float32, device=self.device)
        resp_mask = torch.zeros(rows, max_new, dtype=torch.bool, device=self.device)
        finished = torch.zeros(rows, dtype=torch.bool, device=self.device)
        stop_ids = torch.tensor(sampling.stop_token_ids, dtype=torch.long, device=self.device)
        generator = self._generator(sampling.seed)
        max_prompt_len = int(prompt_len.max())

        was_training = self.model.training
        self.model.eval()
        try:
            steps = 0
            for step in range(max_new):
                width = max_prompt_len + step  # every row's real tokens lie in seq[:, :width]
                logits = self.model(seq[:, :width])
                last = logits.gather(1, (length - 1).view(rows, 1, 1).expand(rows, 1, logits.shape[-1]))
                logq = process_logits(last.squeeze(1), sampling.temperature, sampling.top_k, sampling.top_p)
                token, token_logp = sample(logq, generator)
                active = ~finished
                token = torch.where(active, token, self.pad_token_id)
                resp_tokens[:, step] = token
                resp_logp[:, step] = torch.where(active, token_logp, 0.0)
                resp_mask[:, step] = active
                # Finished rows write a pad just past their real tokens, where a pad already is.
                seq.scatter_(1, length.view(rows, 1), token.view(rows, 1))
                length = length + active.long()
                if not sampling.ignore_stop and stop_ids.numel():
                    finished = finished | (active & torch.isin(token, stop_ids))
                steps = step + 1
                if bool(finished.all()):  # host sync: fine for a reference engine
                    break
        finally:
            self.model.train(was_training)

        return rollout_output(
            prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, prompt_index=prompt_index,
            response_tokens=resp_tokens[:, :steps], response_mask=resp_mask[:, :steps],
            rollout_log_probs=resp_logp[:, :steps], num_generated=resp_mask[:, :steps].sum(1),
            policy_version=self.policy_version, device=self.device)
