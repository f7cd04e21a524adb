"""Task configs as one discriminated union on `kind`, and `build_task(cfg) -> Task`.

A pipeline config embeds a task as `task: TaskConfig = Field(discriminator="kind")`; in YAML:

    task:
      kind: arithmetic
      ops: [add, sub]
      max_digits: 3
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from trace_rl.config import ConfigError
from trace_rl.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from trace_rl.tasks.base import Task
from trace_rl.tasks.countdown import CountdownConfig, CountdownTask
from trace_rl.tasks.jsonl import JsonlConfig, JsonlTask
from trace_rl.tasks.sorting import SortingConfig, SortingTask

TaskConfig = Annotated[
    ArithmeticConfig | CountdownConfig | SortingConfig | JsonlConfig, Field(discriminator="kind")]

TASKS: dict[type, type[Task]] = {
    ArithmeticConfig: ArithmeticTask,
    CountdownConfig: CountdownTask,
    SortingConfig: SortingTask,
    JsonlConfig: JsonlTask,
}
TASK_KINDS = tuple(cfg.model_fields["kind"].default for cfg in TASKS)

_ADAPTER: TypeAdapter = TypeAdapter(TaskConfig)


def parse_task_config(data: dict[str, Any], source: str | None = None) -> TaskConfig:
    """The config of the task named by `data["kind"]`; ConfigError naming each bad field otherwise."""
    if not isinstance(data, dict):
        raise ConfigError(f"invalid task config{f' in {source}' if source else ''}: expected a mapping with a "
                          f"'kind' ({', '.join(TASK_KINDS)}); got {type(data).__name__}")
    if data.get("kind") not in TASK_KINDS:
        where = f" in {source}" if source else ""
        got = f"got {data['kind']!r}" if "kind" in data else "missing"
        raise ConfigError(f"invalid task config{where}:\n  kind: must be one of {', '.join(TASK_KINDS)} ({got})",
                          ("kind",))
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as err:
        raise ConfigError.from_validation(err, source) from None


def build_task(cfg: TaskConfig | dict[str, Any]) -> Task:
    """The task a config describes (a dict is parsed first). JsonlTask reads its files here."""
    if isinstance(cfg, dict):
        cfg = parse_task_config(cfg)
    task_cls = TASKS.get(type(cfg))
    if task_cls is None:
        raise TypeError(f"build_task needs one of {', '.join(c.__name__ for c in TASKS)}; got {type(cfg).__name__}")
    return task_cls(cfg)
