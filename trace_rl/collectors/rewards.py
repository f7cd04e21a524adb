"""Reward functions for the collector: adapters from `trace_rl.tasks` (text in, score out) to tensors."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

from trace_rl.collectors.prompts import PROBLEM, TextTokenizer
from trace_rl.data import schema as K


class TaskReward(TensorDictModuleBase):
    """`reward_fn` for a `trace_rl.tasks.Task`: decodes each response's real tokens with `tokenizer` and
    writes `task.score(problem, text).reward` per row to "reward", reading the `Problem` under "problem"
    (written by `TaskPrompts` and copied onto every response by the collector). A TensorDict module
    (composes in `TensorDictSequential`); `score(batch)` returns the rewards as a tensor instead.

    The latest scores' `correct` / `format_ok` fractions are kept in `last_stats` for logging.
    """

    def __init__(self, task, tokenizer: TextTokenizer, problem_key: str = PROBLEM, reward_key: str = K.REWARD):
        super().__init__()
        self.task, self.tokenizer, self.problem_key = task, tokenizer, problem_key
        self.in_keys = [K.TOKENS_RESPONSE, K.MASK_RESPONSE, problem_key]
        self.out_keys = [reward_key]
        self.last_stats: dict[str, float] = {}

    def forward(self, batch: TensorDictBase) -> TensorDictBase:
        batch.set(self.out_keys[0], self.score(batch).to(batch.device or "cpu"))
        return batch

    def score(self, batch: TensorDictBase) -> torch.Tensor:
        problems = batch.get(self.problem_key)
        problems = problems.tolist() if hasattr(problems, "tolist") else list(problems)
        tokens, mask = batch.get(K.TOKENS_RESPONSE), batch.get(K.MASK_RESPONSE).bool()
        scores = [
            self.task.score(problem, self.tokenizer.decode(row[m].tolist()))
            for problem, row, m in zip(problems, tokens, mask)
        ]
        n = max(len(scores), 1)
        self.last_stats = {
            "correct": sum(s.correct for s in scores) / n,
            "format_ok": sum(s.format_ok for s in scores) / n,
        }
        return torch.tensor([s.reward for s in scores], dtype=torch.float32)
