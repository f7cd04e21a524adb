"""The trajectory TensorDict schema: every key trace_rl components read or write, in TorchRL's LLM layout.

Batch dimension: one row per sampled response. Prompts and responses are right-padded; masks say which
positions are real. Per-token tensors of the response (`log_probs.*`, `advantage` when per token) are
aligned with `tokens.response`: position t is the t-th generated token. `guidance.*` and `routing.*` are
laid out per packed [prompt, response] position instead (`trace_rl.data.padding.pack_full`); a guidance
site's scales / global scales / bits are views of ("guidance", "bytes") cut by its `engine.guidance.Site`.

| key                          | shape      | dtype   | written by          |
|------------------------------|------------|---------|---------------------|
| ("tokens", "prompt")         | [B, Lp]    | int64   | prompt source       |
| ("masks", "prompt")          | [B, Lp]    | bool    | prompt source       |
| ("tokens", "response")       | [B, Lr]    | int64   | engine              |
| ("masks", "response")        | [B, Lr]    | bool    | engine              |
| ("tokens", "full")           | [B, Lp+Lr] | int64   | `full_sequence`     |
| ("masks", "full")            | [B, Lp+Lr] | bool    | `full_sequence`     |
| ("log_probs", "rollout")     | [B, Lr]    | float32 | engine (sampling distribution, after temperature/top-k/top-p) |
| ("log_probs", "trainer")     | [B, Lr]    | float32 | trainer recomputation |
| ("log_probs", "old")         | [B, Lr]    | float32 | trainer, before the first epoch on a batch |
| ("log_probs", "ref")         | [B, Lr]    | float32 | reference policy (KL term), optional |
| ("log_probs", "current")     | [B, Lr]    | float32 | caller, when a loss has no actor network (carries grad) |
| "reward"                     | [B]        | float32 | task                |
| "advantage"                  | [B] or [B, Lr] | float32 | advantage estimator (per sequence, or per token) |
| "group_id"                   | [B]        | int64   | collector (responses to one prompt share it) |
| "prompt_index"               | [B]        | int64   | engine (row of the prompt batch) |
| "policy_version"             | [B]        | int64   | engine (weights version that sampled it) |
| "num_generated"              | [B]        | int64   | engine (response length, stop token included) |
| ("guidance", "bytes")        | [B, Lp+Lr, N] | uint8 | engine, guided plans: TRACE records (N bytes a token) |
| ("guidance", "valid")        | [B, Lp+Lr] | bool    | engine, guided plans: positions with a record |
| ("routing", "experts")       | [B, Lp+Lr, M, k] | int16 | engine, MoE models: experts each token used (M MoE layers) |
| ("routing", "valid")         | [B, Lp+Lr] | bool    | engine: positions with a routing record |
| ("routing", "trainer")       | [B, Lp+Lr, M, k] | int16 | trainer log-probs: its own top-k there (drift metrics) |
| ("correction", "weight")     | [B, Lr]    | float32 | corrections (importance weight, detached) |
| ("correction", "mask")       | [B, Lr]    | bool    | corrections (tokens kept in the loss) |
"""

from __future__ import annotations

TOKENS_PROMPT = ("tokens", "prompt")
TOKENS_RESPONSE = ("tokens", "response")
TOKENS_FULL = ("tokens", "full")
MASK_PROMPT = ("masks", "prompt")
MASK_RESPONSE = ("masks", "response")
MASK_FULL = ("masks", "full")
LOGP_ROLLOUT = ("log_probs", "rollout")
LOGP_TRAINER = ("log_probs", "trainer")
LOGP_OLD = ("log_probs", "old")
LOGP_REF = ("log_probs", "ref")
LOGP_CURRENT = ("log_probs", "current")
REWARD = "reward"
ADVANTAGE = "advantage"
GROUP_ID = "group_id"
PROMPT_INDEX = "prompt_index"
POLICY_VERSION = "policy_version"
NUM_GENERATED = "num_generated"
GUIDANCE = "guidance"
GUIDANCE_BYTES = ("guidance", "bytes")
GUIDANCE_VALID = ("guidance", "valid")
# Router replay (MoE). Per *packed* position, as `trace_rl.data.padding.pack_full` lays out [prompt, response]
# (the same layout as the guidance records): position p of row b is real prompt token p for p < prompt
# length, then response token p - prompt length. Valid: every prompt token and every response token but the
# last (the rollout never feeds it; causality means the trainer never needs its routing).
ROUTING = "routing"
ROUTING_EXPERTS = ("routing", "experts")
ROUTING_VALID = ("routing", "valid")
ROUTING_TRAINER = ("routing", "trainer")
CORRECTION_WEIGHT = ("correction", "weight")
CORRECTION_MASK = ("correction", "mask")

PAD_TOKEN_ID_DEFAULT = 0

# Keys aligned position by position with ("tokens", "response"): padded, trimmed and unpadded together.
RESPONSE_ALIGNED_KEYS = (
    TOKENS_RESPONSE,
    MASK_RESPONSE,
    LOGP_ROLLOUT,
    LOGP_TRAINER,
    LOGP_OLD,
    LOGP_REF,
    LOGP_CURRENT,
    CORRECTION_WEIGHT,
    CORRECTION_MASK,
)
