"""`HFEngine`: transformers' `generate` behind the `RolloutEngine` interface: the slow reference and the
baseline users would otherwise pick.

- Prompts arrive right-padded; HF decoder-only generation wants them left-padded, so they are re-packed
  (HF derives position ids from the attention mask).
- Sampling goes through HF's own logits processors (temperature, top-k, top-p) with a fresh
  `GenerationConfig`, so no model default (e.g. top_k=50) sneaks in. ("log_probs","rollout") is the
  log-softmax of HF's processed scores at the sampled token: the distribution HF actually sampled from
  (HF's top-p keeps the same set as ours except on exact probability ties); 0 for greedy.
- `seed` seeds torch's global RNG inside a forked RNG state (HF samples with the global generator).
- `stopping_criteria` (a transformers `StoppingCriteriaList`, default None) is passed to every `generate`: the
  rollout bench stops a long HF run on wall time with it (`trace_rl.bench.hf.DecodeClock`).
- transformers is imported lazily: `import trace_rl` never needs it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tensordict import TensorDict

from trace_rl.data import schema as K
from trace_rl.engine.base import RolloutEngine, SamplingParams, rollout_output


class HFEngine(RolloutEngine):
    def __init__(self, model, pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT, return_log_probs: bool = True,
                 policy_version: int = 0, stopping_criteria=None):
        self.model = model.eval()
        self.stopping_criteria = stopping_criteria
        self.pad_token_id = pad_token_id
        self.return_log_probs = return_log_probs
        self.policy_version = policy_version
        self.device = next(model.parameters()).device

    @classmethod
    def from_pretrained(cls, path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                        **kwargs) -> HFEngine:
        from trace_rl.models.hf import require_transformers

        require_transformers("HFEngine")
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or "auto", local_files_only=True)
        return cls(model.to(device), **kwargs)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        missing, unexpected = self.model.load_state_dict(dict(state_dict), strict=False)
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        missing = [k for k in missing if not (tied and k == "lm_head.weight")]
        if missing or unexpected:
            raise KeyError(f"HFEngine.load_weights: missing {missing[:8]}, unexpected {unexpected[:8]}")
        self.policy_version = int(version)

    def _generation_config(self, s: SamplingParams):
        from transformers import GenerationConfig

        greedy = s.temperature == 0
        stops = None if s.ignore_stop or not s.stop_token_ids else list(s.stop_token_ids)
        return GenerationConfig(
            do_sample=not greedy, temperature=None if greedy else s.temperature,
            top_k=None if greedy else s.top_k, top_p=None if greedy else s.top_p,
            max_new_tokens=s.max_new_tokens, min_new_tokens=s.max_new_tokens if s.ignore_stop else None,
            num_return_sequences=s.n, eos_token_id=stops, pad_token_id=self.pad_token_id,
            output_scores=self.return_log_probs and not greedy, return_dict_in_generate=True,
        )

    @torch.no_grad()
    def generate(self, prompts: TensorDict, sampling: SamplingParams) -> TensorDict:
        tokens = prompts.get(K.TOKENS_PROMPT).to(self.device)
        mask = prompts.get(K.MASK_PROMPT).to(self.device).bool()
        num_prompts, width = tokens.shape
        lens = mask.sum(1)
        # Right-padded -> left-padded: shift each row right by its padding.
        shift = width - lens
        idx = (torch.arange(width, device=self.device)[None, :] - shift[:, None]) % width
        left = tokens.gather(1, idx)
        left_mask = torch.arange(width, device=self.device)[None, :] >= shift[:, None]
        left = left.masked_fill(~left_mask, self.pad_token_id)
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            out = self.model.generate(input_ids=left, attention_mask=left_mask.long(),
                                      generation_config=self._generation_config(sampling),
                                      stopping_criteria=self.stopping_criteria)
        rows = num_prompts * sampling.n
        resp = out.sequences[:, width:]
        new = resp.shape[1]
        stops = () if sampling.ignore_stop else sampling.stop_token_ids
        if stops:   # a response ends at its first stop token (HF pads after it)
            is_stop = torch.isin(resp, torch.tensor(stops, device=self.device))
            after = (is_stop.long().cumsum(1) - is_stop.long()) > 0
            resp_mask = ~after
        else:
            resp_mask = torch.ones_like(resp, dtype=torch.bool)
        logp = torch.zeros(rows, new, dtype=torch.float32, device=self.device)
        if out.scores is not None and self.return_log_probs:
            scores = torch.stack(out.scores, dim=1).float()                  # [rows, new, V], processed
            logp = torch.log_softmax(scores, dim=-1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
        logp = logp.masked_fill(~resp_mask, 0.0)
        resp = resp.masked_fill(~resp_mask, self.pad_token_id)
        return rollout_output(
            prompt_tokens=tokens, prompt_mask=mask, prompt_index=torch.arange(rows, device=self.device) // sampling.n,
            response_tokens=resp, response_mask=resp_mask, rollout_log_probs=logp, num_generated=resp_mask.sum(1),
            policy_version=self.policy_version, device=self.device)
