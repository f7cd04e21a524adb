"""`CountdownTask`: combine the given numbers with + - * / and parentheses to hit a target.

Prompt `"Make 82 from 25 3 7: "`, a reference answer `"25*3+7"`, stop `"\\n"`, SFT target `"25*3+7\\n"`.
    format_ok: the response up to the first newline is an expression in the grammar of expression.py
               (non-negative integer literals, + - * /, parentheses, spaces; nothing else: no '= 82');
    correct:   format_ok, every literal is one of the given numbers and each given number is used at most
               as many times as it is given (all of them when `must_use_all`), and the exact value (true
               division, fractions allowed along the way) equals the target. Division by zero is incorrect.

Problems are made solvable by construction: the numbers are combined at random (subtraction kept positive,
division kept exact) and the result becomes the target when it lies in [min_target, max_target].
"""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction
from typing import Literal

from pydantic import Field, field_validator

from trace_rl.tasks.answers import cut_at_stop
from trace_rl.tasks.base import GeneratedTask, Problem, TaskConfigBase, Verdict
from trace_rl.tasks.expression import BinOp, ExpressionError, Node, Num, evaluate, numbers_used, parse, render


class CountdownConfig(TaskConfigBase):
    """Countdown problems: how many numbers, how large, which targets."""

    kind: Literal["countdown"] = Field("countdown", description="Task type tag.")
    min_numbers: int = Field(3, ge=2, le=10, description="Fewest numbers given.")
    max_numbers: int = Field(4, ge=2, le=10, description="Most numbers given.")
    max_number: int = Field(50, ge=2, le=10_000, description="Numbers are drawn from 1..max_number.")
    min_target: int = Field(1, ge=1, description="Smallest target.")
    max_target: int = Field(100, ge=1, description="Largest target.")
    must_use_all: bool = Field(False, description="A correct answer uses every given number exactly once "
                                                  "(otherwise each at most once).")

    @field_validator("max_numbers")
    @classmethod
    def _numbers_ordered(cls, v: int, info) -> int:
        if (lo := info.data.get("min_numbers")) is not None and v < lo:
            raise ValueError(f"max_numbers ({v}) must be >= min_numbers ({lo})")
        return v

    @field_validator("max_target")
    @classmethod
    def _targets_ordered(cls, v: int, info) -> int:
        if (lo := info.data.get("min_target")) is not None and v < lo:
            raise ValueError(f"max_target ({v}) must be >= min_target ({lo})")
        return v


class CountdownTask(GeneratedTask):
    name = "countdown"

    def __init__(self, config: CountdownConfig | None = None, **fields):
        if config is not None and fields:
            raise TypeError("pass either a CountdownConfig or its fields as keywords, not both")
        super().__init__(config if config is not None else CountdownConfig.parse(fields))
        self.config: CountdownConfig

    # -- problems --
    def draw(self, rng: random.Random) -> Problem:
        cfg = self.config
        for _ in range(10_000):
            numbers = [rng.randint(1, cfg.max_number) for _ in range(rng.randint(cfg.min_numbers, cfg.max_numbers))]
            solution = _random_combination(numbers, rng)
            if solution is None:
                continue
            target = int(evaluate(solution))  # an integer: subtraction stays positive, division exact
            if cfg.min_target <= target <= cfg.max_target:
                prompt = f"Make {target} from {' '.join(map(str, numbers))}: "
                meta = {"numbers": numbers, "target": target}
                return Problem(prompt=prompt, answer=render(solution), meta=meta)
        raise RuntimeError(
            f"countdown: no target in [{cfg.min_target}, {cfg.max_target}] came out of 10000 random combinations "
            f"of {cfg.min_numbers}-{cfg.max_numbers} numbers up to {cfg.max_number}; widen the target range")

    def split_key(self, problem: Problem) -> str:
        return f"countdown:{sorted(problem.meta['numbers'])}->{problem.meta['target']}"

    # -- checking --
    def judge(self, problem: Problem, response: str) -> Verdict:
        text = cut_at_stop(response, self.stop_strings)
        try:
            tree = parse(text)
        except ExpressionError as err:
            return Verdict(False, False, f"not an expression: {err}")
        given, used = Counter(map(str, problem.meta["numbers"])), Counter(numbers_used(tree))
        extra = used - given
        if extra:
            return Verdict(False, True, f"uses {', '.join(sorted(extra))} more often than given")
        if self.config.must_use_all and used != given:
            return Verdict(False, True, f"leaves out {', '.join(sorted(given - used))}")
        try:
            value = evaluate(tree)
        except ZeroDivisionError:
            return Verdict(False, True, "division by zero")
        if value != problem.meta["target"]:
            return Verdict(False, True, f"value {value} != target {problem.meta['target']}")
        return Verdict(True, True)

    def sft_target(self, problem: Problem) -> str:
        return problem.answer + "\n"


def _random_combination(numbers: list[int], rng: random.Random) -> Node | None:
    """Combine all numbers pairwise at random into one tree with a positive integer value, or None when a
    drawn step would go to zero, negative or a fraction."""
    pool: list[tuple[Node, Fraction]] = [(Num(str(x)), Fraction(x)) for x in numbers]
    while len(pool) > 1:
        (a, va), (b, vb) = (pool.pop(rng.randrange(len(pool))) for _ in range(2))
        op = rng.choice("+-*/")
        if op == "-" and va <= vb:
            (a, va), (b, vb) = (b, vb), (a, va)
            if va == vb:
                return None
        if op == "/" and va % vb:
            return None
        value = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va / vb}[op]
        pool.append((BinOp(op, a, b), value))
    return pool[0][0]
