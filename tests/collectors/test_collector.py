"""RolloutCollector: groups, rewards, policy versions, extras, replay buffer, seeds, task adapter."""

from dataclasses import dataclass

import pytest
import torch

from tests.tiny_lm import TinyLM
from trace_rl.collectors import PromptBatches, RolloutCollector, TaskPrompts, TaskReward
from trace_rl.data import GroupAdvantage, make_replay_buffer
from trace_rl.data import schema as K
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.recompute import RecomputeEngine

PROMPTS = [[3, 5, 7], [4], [9, 1], [2, 2, 2, 2], [6, 5]]
TARGETS = [5, 6, 7, 8, 9]


def first_token_reward(batch):
    """1 when the first response token equals the prompt's "target" extra."""
    return (batch[K.TOKENS_RESPONSE][:, 0] == batch["target"]).float()


def make_collector(**kwargs):
    engine = RecomputeEngine(TinyLM(vocab_size=12, seed=0))
    prompts = PromptBatches(PROMPTS, batch_size=2, extras={"target": TARGETS, "name": list("abcde")}, seed=1)
    sampling = SamplingParams(n=3, max_new_tokens=4, seed=5)
    return RolloutCollector(engine, prompts, first_token_reward, sampling, **kwargs)


def test_batches_have_groups_rewards_versions_and_extras():
    collector = make_collector(total_batches=3)
    batches = list(collector)
    assert len(batches) == 3
    seen_groups = []
    for b in batches:
        assert b.batch_size == torch.Size([6])
        groups = b[K.GROUP_ID].tolist()
        assert groups[0:3] == [groups[0]] * 3 and groups[3:6] == [groups[3]] * 3 and groups[0] != groups[3]
        seen_groups += sorted(set(groups))
        assert b[K.POLICY_VERSION].tolist() == [0] * 6
        torch.testing.assert_close(b[K.REWARD], first_token_reward(b))
        # extras follow their prompt onto each of its responses
        for row in range(6):
            prompt = b[K.TOKENS_PROMPT][row][b[K.MASK_PROMPT][row]].tolist()
            i = PROMPTS.index(prompt)
            assert int(b["target"][row]) == TARGETS[i] and b["name"][row] == "abcde"[i]
    assert seen_groups == list(range(6))  # unique across batches


def test_update_policy_weights_stamps_new_version():
    collector = make_collector(total_batches=2)
    it = iter(collector)
    next(it)
    collector.update_policy_weights_(TinyLM(vocab_size=12, seed=9).state_dict(), version=4)
    assert collector.policy_version == 4
    assert next(it)[K.POLICY_VERSION].tolist() == [4] * 6


def test_writes_to_replay_buffer_and_runs_postproc():
    rb = make_replay_buffer(64)
    collector = make_collector(total_batches=2, replay_buffer=rb, postproc=GroupAdvantage(scale="none"))
    batches = list(collector)
    assert len(rb) == 12
    for b in batches:
        assert K.ADVANTAGE in b.keys()
        for g in b[K.GROUP_ID].unique():
            assert abs(float(b[K.ADVANTAGE][b[K.GROUP_ID] == g].sum())) < 1e-5  # centred per group
    sample = rb.sample(6)
    assert sample[K.GROUP_ID].unique().numel() == 2


def test_seeded_runs_reproduce():
    a = [b[K.TOKENS_RESPONSE] for b in make_collector(total_batches=2)]
    b = [b[K.TOKENS_RESPONSE] for b in make_collector(total_batches=2)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_bad_reward_shape_is_an_error():
    collector = make_collector(total_batches=1)
    collector.reward_fn = lambda batch: torch.zeros(2)
    with pytest.raises(ValueError, match="reward_fn"):
        next(iter(collector))


# -- the task adapter, with a stand-in task and tokenizer (the real ones live in tasks/ and models/) --
@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


@dataclass
class Score:
    reward: float
    correct: bool
    format_ok: bool


class EchoTask:
    """Correct when the response starts with the answer."""

    def problems(self, n, seed, split):
        return [Problem(prompt=f"{(seed + i) % 7}?", answer=str((seed + i) % 7)) for i in range(n)]

    def score(self, problem, response):
        ok = response.startswith(problem.answer)
        return Score(float(ok), ok, True)


class DigitTokenizer:
    def encode(self, text):
        return [3 + "0123456789?".index(c) for c in text]

    def decode(self, ids):
        return "".join("0123456789?"[i - 3] for i in ids if 3 <= i < 14)


def test_task_prompts_and_task_reward():
    tok, task = DigitTokenizer(), EchoTask()
    reward = TaskReward(task, tok)
    collector = RolloutCollector(RecomputeEngine(TinyLM(vocab_size=14)), TaskPrompts(task, tok, batch_size=3),
                                 reward, SamplingParams(n=2, max_new_tokens=3, seed=0), total_batches=1)
    batch = next(iter(collector))
    for row in range(6):
        problem = batch["problem"][row]
        text = tok.decode(batch[K.TOKENS_RESPONSE][row][batch[K.MASK_RESPONSE][row]].tolist())
        assert batch[K.REWARD][row].item() == float(text.startswith(problem.answer))
        assert tok.decode(batch[K.TOKENS_PROMPT][row][batch[K.MASK_PROMPT][row]].tolist()) == problem.prompt
    assert set(reward.last_stats) == {"correct", "format_ok"}
