"""Reward functions for the collector: adapters from `trace_rl.tasks` (text in, score out) to tensors."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from trace_rl.collectors.prompts import PROBLEM, TextTokenizer
from trace_rl.data import schema as K


class TaskReward:
    """`reward_fn` for a `trace_rl.tasks.Task`: decodes each response's real tokens with `tokenizer` and
    returns `task.score(problem, text).reward` per row, reading the `Problem` under "problem" (written by
    `TaskPrompts` and copied onto every response by the collector).

    The latest scores' `correct` / `format_ok` fractions are kept in `last_stats` for logging.
    """

    in_keys = [K.TOKENS_RESPONSE, K.MASK_RESPONSE, PROBLEM]
    out_keys = [K.REWARD]

    def __init__(self, task, tokenizer: TextTokenizer, problem_key: str = PROBLEM):
        self.task, self.tokenizer, self.problem_key = task, tokenizer, problem_key
        self.last_stats: dict[str, float] = {}

    def __call__(self, batch: TensorDictBase) -> torch.Tensor:
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
