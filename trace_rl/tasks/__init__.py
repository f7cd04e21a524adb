"""Verifiable tasks and rewards: arithmetic, countdown, sorting, and GSM8K-style JSONL files (docs/tasks.md)."""

from trace_rl.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from trace_rl.tasks.base import Problem, Score, Split, Task, TaskConfigBase, Verdict, split_of
from trace_rl.tasks.config import TASK_KINDS, TaskConfig, build_task, parse_task_config
from trace_rl.tasks.countdown import CountdownConfig, CountdownTask
from trace_rl.tasks.jsonl import JsonlConfig, JsonlError, JsonlTask
from trace_rl.tasks.sorting import SortingConfig, SortingTask

__all__ = [
    "ArithmeticConfig", "ArithmeticTask", "CountdownConfig", "CountdownTask", "JsonlConfig", "JsonlError",
    "JsonlTask", "Problem", "Score", "SortingConfig", "SortingTask", "Split", "TASK_KINDS", "Task", "TaskConfig",
    "TaskConfigBase", "Verdict", "build_task", "parse_task_config", "split_of",
]
