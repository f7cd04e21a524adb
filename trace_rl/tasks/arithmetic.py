"""`ArithmeticTask`: integer addition, subtraction and multiplication, plain or with the work shown.

Plain:      prompt `"482+39="`, answer `"521"`, stop `"\\n"`, SFT target `"521\\n"`.
    format_ok: the response up to the first newline, stripped of spaces, is `-?\\d+`;
    correct:   format_ok and that integer equals the answer.
Show work:  prompt `"work: 482+39\\n"`, SFT target = the worked solution (worked_arithmetic.py) ending in the
    line `#### 521`; no stop string (the response ends at the model's end-of-sequence token).
    format_ok: some line starts with `####` and the rest of the first such line is `-?\\d+`;
    correct:   format_ok and that integer equals the answer (the work itself is not graded).

One problem uses one operation over `num_operands` operands, evaluated left to right (`50-12-7`). Each
operand has a digit count drawn from [min_digits, max_digits], then a value uniform over those digits
(1-digit operands include 0).
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import Field, field_validator

from trace_rl.tasks.answers import cut_at_stop, marker_line, parse_int
from trace_rl.tasks.base import GeneratedTask, Problem, TaskConfigBase, Verdict
from trace_rl.tasks.worked_arithmetic import OPS, worked_chain

Op = Literal["add", "sub", "mul"]


class ArithmeticConfig(TaskConfigBase):
    """Integer arithmetic problems; the digit range is the difficulty knob."""

    kind: Literal["arithmetic"] = Field("arithmetic", description="Task type tag.")
    ops: tuple[Op, ...] = Field(
        ("add",), min_length=1, description="Operations drawn from (uniformly; repeat one to weight it).")
    min_digits: int = Field(1, ge=1, le=100, description="Fewest digits of an operand.")
    max_digits: int = Field(3, ge=1, le=100, description="Most digits of an operand.")
    num_operands: int = Field(2, ge=2, le=10, description="Operands per problem (`a+b+c` has 3).")
    allow_negative: bool = Field(
        True, description="Subtraction may give a negative answer; false redraws until the answer is >= 0.")
    show_work: bool = Field(
        False, description="Ask for (and SFT on) the worked solution ending in '#### <answer>'.")

    @field_validator("max_digits")
    @classmethod
    def _digits_ordered(cls, v: int, info) -> int:
        lo = info.data.get("min_digits")
        if lo is not None and v < lo:
            raise ValueError(f"max_digits ({v}) must be >= min_digits ({lo})")
        return v


class ArithmeticTask(GeneratedTask):
    name = "arithmetic"

    def __init__(self, config: ArithmeticConfig | None = None, **fields):
        if config is not None and fields:
            raise TypeError("pass either an ArithmeticConfig or its fields as keywords, not both")
        super().__init__(config if config is not None else ArithmeticConfig.parse(fields))
        self.config: ArithmeticConfig

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return () if self.config.show_work else ("\n",)

    # -- problems --
    def _operand(self, rng: random.Random) -> int:
        d = rng.randint(self.config.min_digits, self.config.max_digits)
        return rng.randint(0 if d == 1 else 10 ** (d - 1), 10**d - 1)

    def draw(self, rng: random.Random) -> Problem:
        cfg = self.config
        for _ in range(1000):
            op = rng.choice(cfg.ops)
            operands = [self._operand(rng) for _ in range(cfg.num_operands)]
            value = _evaluate(op, operands)
            if value >= 0 or cfg.allow_negative:
                break
        else:
            raise RuntimeError(
                f"arithmetic: 1000 draws gave only negative answers with allow_negative=False "
                f"({cfg.num_operands} operands of {cfg.min_digits}-{cfg.max_digits} digits); allow negative "
                f"answers, use fewer operands, or widen the digit range")
        expr = OPS[op][0].join(map(str, operands))
        prompt = f"work: {expr}\n" if cfg.show_work else f"{expr}="
        meta = {"op": op, "operands": operands, "expression": expr}
        return Problem(prompt=prompt, answer=str(value), meta=meta)

    def split_key(self, problem: Problem) -> str:
        # The same question in another order is the same problem: a+b+c ~ c+a+b; a-b-c ~ a-c-b.
        op, xs = problem.meta["op"], problem.meta["operands"]
        canonical = sorted(xs) if op in ("add", "mul") else [xs[0], *sorted(xs[1:])]
        return f"arithmetic:{op}:{','.join(map(str, canonical))}"

    # -- checking --
    def judge(self, problem: Problem, response: str) -> Verdict:
        if self.config.show_work:
            line = marker_line(response)
            if line is None:
                return Verdict(False, False, "no '#### <answer>' line")
            got = parse_int(line)
            if got is None:
                return Verdict(False, False, f"'#### {line[:40]}' is not an integer")
        else:
            text = cut_at_stop(response, self.stop_strings)
            got = parse_int(text)
            if got is None:
                return Verdict(False, False, f"{text.strip()[:40]!r} is not an integer")
        if got != int(problem.answer):
            return Verdict(False, True, f"answered {got}, expected {problem.answer}")
        return Verdict(True, True)

    def sft_target(self, problem: Problem) -> str:
        if not self.config.show_work:
            return problem.answer + "\n"
        lines, value = worked_chain(problem.meta["op"], problem.meta["operands"])
        assert str(value) == problem.answer
        return "\n".join([*lines, f"#### {value}"])


def _evaluate(op: str, operands: list[int]) -> int:
    acc = operands[0]
    for x in operands[1:]:
        acc = acc + x if op == "add" else acc - x if op == "sub" else acc * x
    return acc
