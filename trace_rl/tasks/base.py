"""The task interface: problems with known answers, a checker, and the reward built from it.

A `Task` hands out `Problem`s (`problems(n, seed, split)`), scores a model's response to one
(`score(problem, response) -> Score`) and says what an SFT model should learn to write (`sft_target`).

Reward = `correct_reward * correct + format_reward * format_ok` (defaults 1.0 and 0.1). `format_ok` means the
response parses in the task's answer format; `correct` means its answer is right. Each task documents exactly
what counts as either (docs/tasks.md).

Splits: a problem's split is decided by a hash of its `split_key` (the problem with its order-free parts put
in a canonical order), never by the seed: `problems(n, s1, "train")` and `problems(m, s2, "eval")` share no
problem for any seeds, and a problem stays in its split however many are drawn.
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple

from pydantic import Field

from trace_rl.config import TraceConfig

Split = Literal["train", "eval"]
SPLITS: tuple[Split, ...] = ("train", "eval")


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer. `meta` holds task-specific facts (operands, source line, ...)."""

    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Score:
    """The reward of one response and the two facts it is made of. `reason` says why it is not correct."""

    reward: float
    correct: bool
    format_ok: bool
    reason: str = ""


class Verdict(NamedTuple):
    """What a task's checker found; `Task.score` turns it into a `Score` with the configured weights."""

    correct: bool
    format_ok: bool
    reason: str = ""


class TaskConfigBase(TraceConfig):
    """Fields every task config has: the reward weights and the share of problems held out for eval."""

    correct_reward: float = Field(
        1.0, allow_inf_nan=False, description="Reward added when the answer is correct.")
    format_reward: float = Field(
        0.1, allow_inf_nan=False, description="Reward added when the response parses in the task's answer "
                                              "format (whether or not the answer is right).")
    eval_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="Share of the problem space in the eval split (chosen by a hash of "
                                         "each problem, so train and eval never share a problem).")


def split_of(key: str, eval_fraction: float) -> Split:
    """'eval' for a fixed `eval_fraction` of all keys, 'train' for the rest; depends on the key alone."""
    digest = hashlib.blake2b(key.encode(), digest_size=8, person=b"trace_rl.split").digest()
    return "eval" if int.from_bytes(digest, "little") / 2**64 < eval_fraction else "train"


def seeded_rng(*parts: object) -> random.Random:
    """A generator seeded from `parts` through a stable hash (Python's `hash()` of str varies per process)."""
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


def check_request(n: int, split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'eval'; got {split!r}")
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int; got {n!r}")


class Task(ABC):
    """A verifiable task. Subclasses set `name`, implement `problems`, `judge` and `sft_target`."""

    name: ClassVar[str]

    def __init__(self, config: TaskConfigBase):
        self.config = config

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """Generation ends at the first of these (kept out of the answer). Empty: the response ends at the
        model's end-of-sequence token, which SFT must append to `sft_target`."""
        return ("\n",)

    @abstractmethod
    def problems(self, n: int, seed: int, split: Split) -> list[Problem]:
        """`n` problems of `split`, the same list for the same seed (and config)."""

    @abstractmethod
    def judge(self, problem: Problem, response: str) -> Verdict:
        """Is `response` (the generated text after the prompt) well-formed, and is its answer right?"""

    @abstractmethod
    def sft_target(self, problem: Problem) -> str:
        """The completion an SFT model should learn; it scores correct and format-ok, and ends with the first
        stop string when the task has one."""

    def score(self, problem: Problem, response: str) -> Score:
        if not isinstance(response, str):
            raise TypeError(f"{self.name}: response must be a str (decoded text); got {type(response).__name__}")
        verdict = self.judge(problem, response)
        reward = self.config.correct_reward * verdict.correct + self.config.format_reward * verdict.format_ok
        return Score(float(reward), verdict.correct, verdict.format_ok, verdict.reason)


class GeneratedTask(Task):
    """A task whose problems are drawn at random: subclasses implement `draw(rng)` and `split_key`.

    `problems` draws candidates from a generator seeded by (name, seed, split) and keeps those whose
    `split_key` hashes into `split`; problems may repeat when the problem space is small."""

    @abstractmethod
    def draw(self, rng: random.Random) -> Problem: ...

    @abstractmethod
    def split_key(self, problem: Problem) -> str:
        """The problem in canonical form: problems that are the same question share a key (and a split)."""

    def problems(self, n: int, seed: int, split: Split) -> list[Problem]:
        check_request(n, split)
        rng = seeded_rng(self.name, seed, split)
        share = self.config.eval_fraction if split == "eval" else 1.0 - self.config.eval_fraction
        budget = int(50 * n / share) + 1000  # ~50x the expected number of draws
        out: list[Problem] = []
        for _ in range(budget):
            if len(out) == n:
                return out
            problem = self.draw(rng)
            if split_of(self.split_key(problem), self.config.eval_fraction) == split:
                out.append(problem)
        if len(out) == n:
            return out
        raise RuntimeError(
            f"{self.name}: found only {len(out)} of {n} {split!r} problems in {budget} draws; the problem space "
            f"of this config is too small for its {split} share (eval_fraction={self.config.eval_fraction}). "
            f"Widen the config (more digits, longer lists) or change eval_fraction.")
