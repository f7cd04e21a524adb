"""`JsonlTask`: prompt/answer pairs from a local JSONL file (GSM8K style), checked as math answers.

File: one JSON object per line, `{"question": "...", "answer": "... #### 42"}` (`"prompt"` may stand for
`"question"`; it wins when both are present). `answer` is a string or a number; its reference value is the
number after its first `####`, else its last number. Blank lines are skipped, other keys ignored. A bad
record is an error naming the file and line.

Checking (after cutting the response at the first stop string, if any):
    extracted: the first number after the first `####` in the response, else its last number; numbers may
               carry a sign, thousands commas, decimals or be fractions (`3/4` = 0.75);
    format_ok: the response has a `####` followed by a number;
    correct:   the extracted number equals the reference within `tolerance` (relative, absolute near 0);
               with `require_marker`, only when format_ok too.
SFT target: the record's answer text, with `#### <reference>` added when it has no `####`.

Splits: with `eval_path`, train is `path` and eval is `eval_path` (a prompt in both is an error); else a hash
of each prompt puts `eval_fraction` of the records in eval.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from trace_rl.tasks.answers import (
    MARKER,
    cut_at_stop,
    extract_final_number,
    normalize_number,
    numbers_match,
    parse_number,
)
from trace_rl.tasks.base import Problem, Split, Task, TaskConfigBase, Verdict, check_request, seeded_rng, split_of


class JsonlError(ValueError):
    """A record of a JSONL task file is unusable; the message starts with `file:line:`."""


class JsonlConfig(TaskConfigBase):
    """Prompts and reference answers from local JSONL files (bring your own GSM8K-style data)."""

    kind: Literal["jsonl"] = Field("jsonl", description="Task type tag.")
    path: str = Field(..., min_length=1, description="JSONL file of {question|prompt, answer} records (the train "
                                                     "split, or both splits when eval_path is not set); "
                                                     "relative to the working directory.")
    eval_path: str | None = Field(None, description="Optional JSONL file of eval records; when set, path is "
                                                    "all train and eval_fraction is not used.")
    prompt_template: str = Field("{prompt}", description="The prompt given to the model; '{prompt}' is "
                                                         "replaced by the record's question.")
    stop_strings: tuple[str, ...] = Field((), description="Generation ends at the first of these; empty: at the "
                                                          "model's end-of-sequence token.")
    tolerance: float = Field(1e-6, ge=0.0, allow_inf_nan=False,
                             description="Relative tolerance (absolute near zero) when comparing numbers.")
    require_marker: bool = Field(False, description="Count an answer correct only when it is given after "
                                                    "'####' (otherwise the last number also counts).")

    @field_validator("prompt_template")
    @classmethod
    def _has_slot(cls, v: str) -> str:
        if "{prompt}" not in v:
            raise ValueError("prompt_template must contain '{prompt}' (where the record's question goes)")
        return v

    @field_validator("stop_strings")
    @classmethod
    def _no_empty_stop(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(s == "" for s in v):
            raise ValueError("stop strings must be non-empty")
        return v


def load_jsonl(path: str | Path, field: str = "path") -> list[tuple[int, str, str, str]]:
    """(line number, question, reference number, answer text) per record of `path`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"JSONL task file not found: {path} (config field {field!r}; relative paths are resolved against "
            f"the working directory {Path.cwd()})")
    records = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise JsonlError(f"{where}: not valid JSON ({err.msg} at column {err.colno}); each line must be "
                                 f'one object like {{"question": "...", "answer": "... #### 42"}}') from None
            if not isinstance(rec, dict):
                raise JsonlError(f"{where}: a record must be a JSON object; got {type(rec).__name__}")
            question = rec.get("prompt", rec.get("question"))
            if not isinstance(question, str) or not question.strip():
                raise JsonlError(f"{where}: needs a non-empty string 'question' (or 'prompt'); "
                                 f"keys present: {sorted(rec)}")
            answer = rec.get("answer")
            if isinstance(answer, bool) or not isinstance(answer, str | int | float):
                raise JsonlError(f"{where}: needs an 'answer' that is a string or a number; got {answer!r}")
            if isinstance(answer, float) and not math.isfinite(answer):
                raise JsonlError(f"{where}: answer {answer} is not a finite number")
            answer = _as_text(answer)
            ref = extract_final_number(answer)
            if ref is None or parse_number(ref) is None:
                raise JsonlError(f"{where}: answer {answer[-60:]!r} has no number to check against (write it as "
                                 f"'... #### 42' or '42')")
            records.append((lineno, question, normalize_number(ref), answer))
    if not records:
        raise JsonlError(f"{path}: no records (the file is empty or only blank lines)")
    return records


def _as_text(answer: str | int | float) -> str:
    """A numeric answer written out in full (1e-07 -> '0.0000001'; an exponent would read as two numbers)."""
    if isinstance(answer, float):
        return format(Decimal(repr(answer)), "f")
    return str(answer)


class JsonlTask(Task):
    name = "jsonl"

    def __init__(self, config: JsonlConfig | None = None, **fields):
        if config is not None and fields:
            raise TypeError("pass either a JsonlConfig or its fields as keywords, not both")
        super().__init__(config if config is not None else JsonlConfig.parse(fields))
        self.config: JsonlConfig
        cfg = self.config
        train = [self._problem(cfg.path, r) for r in load_jsonl(cfg.path)]
        if cfg.eval_path is None:
            self._splits: dict[str, list[Problem]] = {"train": [], "eval": []}
            for p in train:
                self._splits[split_of(f"jsonl:{p.meta['question']}", cfg.eval_fraction)].append(p)
        else:
            evals = [self._problem(cfg.eval_path, r) for r in load_jsonl(cfg.eval_path, "eval_path")]
            seen = {p.meta["question"]: p.meta["source"] for p in train}
            shared = [(p.meta["source"], seen[p.meta["question"]]) for p in evals if p.meta["question"] in seen]
            if shared:
                raise JsonlError(f"{len(shared)} eval records repeat a train question (first: {shared[0][0]} = "
                                 f"{shared[0][1]}); remove them from one file so the splits stay disjoint")
            self._splits = {"train": train, "eval": evals}

    def _problem(self, path: str, record: tuple[int, str, str, str]) -> Problem:
        lineno, question, ref, answer = record
        prompt = self.config.prompt_template.replace("{prompt}", question)
        meta = {"source": f"{Path(path).expanduser()}:{lineno}", "question": question, "solution": answer}
        return Problem(prompt=prompt, answer=ref, meta=meta)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self.config.stop_strings

    def split_size(self, split: Split) -> int:
        return len(self._splits[split])

    def problems(self, n: int, seed: int, split: Split) -> list[Problem]:
        """`n` records of `split` in a seeded order; past the end of the split it starts a new shuffled pass."""
        check_request(n, split)
        pool = self._splits[split]
        if n and not pool:
            raise JsonlError(f"{self.config.path}: no record fell in the {split!r} split (eval_fraction="
                             f"{self.config.eval_fraction}, {self.split_size('train')} train records); "
                             f"add records, change eval_fraction or give eval_path")
        rng, out = seeded_rng(self.name, seed, split), []
        while len(out) < n:
            order = list(range(len(pool)))
            rng.shuffle(order)
            out += [pool[i] for i in order[: n - len(out)]]
        return out

    def judge(self, problem: Problem, response: str) -> Verdict:
        text = cut_at_stop(response, self.stop_strings)
        got_text = extract_final_number(text)
        format_ok = MARKER in text and got_text is not None
        if got_text is None:
            return Verdict(False, False, f"no number {'after ' + MARKER if MARKER in text else 'in the response'}")
        if self.config.require_marker and not format_ok:
            return Verdict(False, False, f"no '{MARKER} <answer>' (require_marker is set)")
        got = parse_number(got_text)
        if got is None:
            return Verdict(False, format_ok, f"{got_text!r} is not a number")
        want = parse_number(problem.answer)
        if not numbers_match(got, want, self.config.tolerance):
            return Verdict(False, format_ok, f"answered {got_text}, expected {problem.answer}")
        return Verdict(True, format_ok)

    def sft_target(self, problem: Problem) -> str:
        solution = problem.meta["solution"]
        if MARKER not in solution:
            solution = f"{MARKER} {problem.answer}" if solution.strip() == problem.answer else (
                f"{solution.rstrip()}\n{MARKER} {problem.answer}")
        for stop in self.stop_strings:
            if stop in solution:
                raise JsonlError(f"{problem.meta['source']}: the answer contains the stop string {stop!r}, so a "
                                 f"model trained on it would stop before its final answer; change stop_strings")
        return solution + (self.stop_strings[0] if self.stop_strings else "")
