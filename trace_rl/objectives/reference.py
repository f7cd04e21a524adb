"""`ReferencePolicy`: a frozen copy of the initial policy that writes ("log_probs", "ref") for the loss's KL
term (`trainer.loss.kl_to_ref_coeff`), optionally on another device (the CPU) or in lower precision.

It runs the same trainer computation as the policy (same precision plan, same temperature / top-k / top-p),
so at step 0 with the same device and dtype its log-probs equal the trainer's and the KL is 0. A guided
plan's reference computes as `aligned` (the rollout's rounding records are served to the policy only).
"""

from __future__ import annotations

import copy

import torch
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

from trace_rl.data import schema as K
from trace_rl.objectives.logprobs import TrainerLogProbs


class ReferencePolicy(TensorDictModuleBase):
    """Reads the prompt and response tokens/masks, writes ("log_probs", "ref") on the batch's device.

    Args:
        model: the reference model (used as given: `from_policy` makes the frozen copy).

    Keyword Args:
        temperature, top_k, top_p, pad_token_id, micro_batch_size: as `TrainerLogProbs`.
        ref_key: the key written (default ("log_probs", "ref")).
    """

    def __init__(self, model: nn.Module, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT, micro_batch_size: int | None = None,
                 ref_key: NestedKey = K.LOGP_REF):
        super().__init__()
        self.logprobs = TrainerLogProbs(model, temperature=temperature, top_k=top_k, top_p=top_p,
                                        pad_token_id=pad_token_id, write_old=False, micro_batch_size=micro_batch_size,
                                        trainer_key=ref_key)
        self.in_keys = list(self.logprobs.in_keys)
        self.out_keys = [ref_key]

    @property
    def model(self) -> nn.Module:
        return self.logprobs.model

    @classmethod
    def from_policy(cls, policy: nn.Module, *, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None, **kwargs) -> ReferencePolicy:
        """A frozen (eval, no grad) deep copy of `policy`, moved to `device` / cast to `dtype` when given."""
        ref = copy.deepcopy(policy).eval()
        plan = getattr(ref, "plan", None)
        if plan is not None and getattr(plan, "trainer", None) == "guided" and hasattr(ref, "apply_plan"):
            ref.apply_plan(plan.model_copy(update={"trainer": "aligned"}))
        if device is not None or dtype is not None:
            ref = ref.to(device=device, dtype=dtype)
        for p in ref.parameters():
            p.requires_grad_(False)
        return cls(ref, **kwargs)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        device = next(self.model.parameters()).device
        inputs = td.select(*self.in_keys).to(device)
        self.logprobs(inputs)
        home = td.get(self.in_keys[-1]).device         # where the batch's tensors live
        td.set(self.out_keys[0], inputs.get(self.out_keys[0]).float().to(home))
        return td
