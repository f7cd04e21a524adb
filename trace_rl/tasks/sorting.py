"""`SortingTask`: sort a list of numbers (numerically) or lowercase letters, ascending.

Plain:      prompt `"sort 5 31 9 1: "`, answer `"1 5 9 31"`, stop `"\\n"`, SFT target `"1 5 9 31\\n"`.
    format_ok: the response up to the first newline is one or more whitespace-separated items of the
               list's kind (`\\d+` for numbers, one letter a-z for letters);
    correct:   format_ok and the items, in order, are the sorted list (duplicates kept).
Show work:  prompt `"work: sort 5 31 9 1\\n"`; the SFT target is a selection sort, one line per pick
    (`5 31 9 1 -> min 1 -> 1`), ending in the line `#### 1 5 9 31`; no stop string. format_ok and correct
    as above, read from the first line that starts with `####`. Its length grows as length^2.
"""

from __future__ import annotations

import random
import re
import string
from typing import Literal

from pydantic import Field, field_validator

from trace_rl.tasks.answers import cut_at_stop, marker_line
from trace_rl.tasks.base import GeneratedTask, Problem, TaskConfigBase, Verdict

_ITEM = {"numbers": re.compile(r"[0-9]{1,30}"), "letters": re.compile(r"[a-z]")}


class SortingConfig(TaskConfigBase):
    """Sorting problems; the list length is the difficulty (and, with show_work, the answer-length) knob."""

    kind: Literal["sorting"] = Field("sorting", description="Task type tag.")
    items: Literal["numbers", "letters"] = Field(
        "numbers", description="Sort non-negative integers (numerically) or lowercase letters.")
    min_length: int = Field(3, ge=1, le=1000, description="Shortest list.")
    max_length: int = Field(6, ge=1, le=1000, description="Longest list.")
    max_value: int = Field(99, ge=1, le=10**18, description="Numbers are drawn from 0..max_value (repeats allowed).")
    show_work: bool = Field(
        False, description="Ask for (and SFT on) a selection sort shown step by step, ending in '#### <list>'.")

    @field_validator("max_length")
    @classmethod
    def _lengths_ordered(cls, v: int, info) -> int:
        if (lo := info.data.get("min_length")) is not None and v < lo:
            raise ValueError(f"max_length ({v}) must be >= min_length ({lo})")
        return v


class SortingTask(GeneratedTask):
    name = "sorting"

    def __init__(self, config: SortingConfig | None = None, **fields):
        if config is not None and fields:
            raise TypeError("pass either a SortingConfig or its fields as keywords, not both")
        super().__init__(config if config is not None else SortingConfig.parse(fields))
        self.config: SortingConfig

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return () if self.config.show_work else ("\n",)

    def _sorted(self, items: list[str]) -> list[str]:
        return sorted(items, key=int) if self.config.items == "numbers" else sorted(items)

    # -- problems --
    def draw(self, rng: random.Random) -> Problem:
        cfg = self.config
        n = rng.randint(cfg.min_length, cfg.max_length)
        if cfg.items == "numbers":
            items = [str(rng.randint(0, cfg.max_value)) for _ in range(n)]
        else:
            items = [rng.choice(string.ascii_lowercase) for _ in range(n)]
        listed = " ".join(items)
        prompt = f"work: sort {listed}\n" if cfg.show_work else f"sort {listed}: "
        return Problem(prompt=prompt, answer=" ".join(self._sorted(items)), meta={"items": items})

    def split_key(self, problem: Problem) -> str:
        # Every ordering of the same items asks the same question (it has the same answer).
        return f"sorting:{self.config.items}:{problem.answer}"

    # -- checking --
    def judge(self, problem: Problem, response: str) -> Verdict:
        if self.config.show_work:
            text = marker_line(response)
            if text is None:
                return Verdict(False, False, "no '#### <sorted list>' line")
        else:
            text = cut_at_stop(response, self.stop_strings)
        got = text.split()
        pattern = _ITEM[self.config.items]
        if not got or not all(pattern.fullmatch(x) for x in got):
            return Verdict(False, False, f"{text.strip()[:40]!r} is not a list of {self.config.items}")
        want = problem.answer.split()
        same = [int(x) for x in got] == [int(x) for x in want] if self.config.items == "numbers" else got == want
        if not same:
            return Verdict(False, True, f"answered {' '.join(got)[:60]!r}, expected {problem.answer[:60]!r}")
        return Verdict(True, True)

    def sft_target(self, problem: Problem) -> str:
        if not self.config.show_work:
            return problem.answer + "\n"
        left, done, lines = list(problem.meta["items"]), [], []
        while left:
            smallest = self._sorted(left)[0]
            lines.append(f"{' '.join(left)} -> min {smallest} -> {' '.join([*done, smallest])}")
            left.remove(smallest)
            done.append(smallest)
        assert " ".join(done) == problem.answer
        return "\n".join([*lines, f"#### {problem.answer}"])
