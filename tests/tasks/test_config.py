"""Task configs: YAML/TOML round-trips through the union, errors that name the field, build_task."""

import json

import pytest

from trace_rl.config import ConfigError, TraceConfig, undocumented_fields
from trace_rl.tasks import (
    ArithmeticConfig,
    ArithmeticTask,
    CountdownConfig,
    JsonlConfig,
    JsonlTask,
    SortingConfig,
    SortingTask,
    build_task,
    parse_task_config,
)

CONFIGS = [
    ArithmeticConfig(),
    ArithmeticConfig(ops=("add", "mul", "mul"), min_digits=2, max_digits=5, num_operands=3, show_work=True,
                     format_reward=0.0, eval_fraction=0.25),
    CountdownConfig(min_numbers=4, max_numbers=6, must_use_all=True, correct_reward=2.0),
    SortingConfig(items="letters", min_length=2, max_length=20, show_work=True),
    JsonlConfig(path="data/gsm8k_train.jsonl", prompt_template="Question: {prompt}\nAnswer:", stop_strings=("\n\n",)),
    JsonlConfig(path="a.jsonl", eval_path="b.jsonl", tolerance=0.0, require_marker=True),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.kind)
def test_round_trip(cfg):
    assert type(cfg).from_yaml(cfg.to_yaml()) == cfg
    assert type(cfg).from_toml(cfg.to_toml()) == cfg
    assert parse_task_config(cfg.to_dict()) == cfg
    assert "kind:" in cfg.to_yaml()


def test_every_field_documented_and_frozen():
    for cls in (ArithmeticConfig, CountdownConfig, SortingConfig, JsonlConfig):
        assert issubclass(cls, TraceConfig) and undocumented_fields(cls) == []
    with pytest.raises(Exception, match="frozen"):
        ArithmeticConfig().min_digits = 4


def test_embeds_in_a_parent_config_by_kind():
    from pydantic import Field

    from trace_rl.tasks import TaskConfig

    class Parent(TraceConfig):
        task: TaskConfig = Field(default_factory=ArithmeticConfig, description="The task.")

    parent = Parent.from_yaml("task:\n  kind: sorting\n  max_length: 9\n")
    assert parent.task == SortingConfig(max_length=9)
    assert Parent.from_yaml(parent.to_yaml()) == parent
    with pytest.raises(ConfigError, match="task.sorting.max_lenght: unknown key"):
        Parent.from_yaml("task:\n  kind: sorting\n  max_lenght: 9\n")


@pytest.mark.parametrize("data,field", [
    ({"kind": "arithmetic", "min_digits": 0}, "arithmetic.min_digits"),
    ({"kind": "arithmetic", "min_digits": 4, "max_digits": 2}, "arithmetic.max_digits"),
    ({"kind": "arithmetic", "ops": ["div"]}, "arithmetic.ops.0"),
    ({"kind": "arithmetic", "num_operands": 1}, "arithmetic.num_operands"),
    ({"kind": "arithmetic", "digits": 3}, "arithmetic.digits"),
    ({"kind": "arithmetic", "eval_fraction": 1.0}, "arithmetic.eval_fraction"),
    ({"kind": "arithmetic", "correct_reward": float("nan")}, "arithmetic.correct_reward"),
    ({"kind": "countdown", "min_target": 50, "max_target": 10}, "countdown.max_target"),
    ({"kind": "countdown", "min_numbers": 5, "max_numbers": 3}, "countdown.max_numbers"),
    ({"kind": "sorting", "items": "words"}, "sorting.items"),
    ({"kind": "sorting", "min_length": 7, "max_length": 3}, "sorting.max_length"),
    ({"kind": "jsonl"}, "jsonl.path"),
    ({"kind": "jsonl", "path": "x", "prompt_template": "no slot"}, "jsonl.prompt_template"),
    ({"kind": "jsonl", "path": "x", "stop_strings": [""]}, "jsonl.stop_strings"),
    ({"kind": "chess"}, "kind"),
    ({"max_digits": 3}, "kind"),
])
def test_errors_name_the_field(data, field):
    with pytest.raises(ConfigError) as err:
        parse_task_config(data, source="task.yaml")
    assert field in err.value.fields, str(err.value)
    assert f"{field}:" in str(err.value) and "task.yaml" in str(err.value)


def test_direct_parse_and_task_keywords_raise_config_errors():
    with pytest.raises(ConfigError, match="max_digits"):
        ArithmeticConfig.from_yaml("min_digits: 3\nmax_digits: 1\n")
    with pytest.raises(ConfigError, match="min_length"):
        SortingTask(min_length=0)
    with pytest.raises(TypeError, match="not both"):
        ArithmeticTask(ArithmeticConfig(), show_work=True)


def test_build_task(tmp_path):
    assert isinstance(build_task(ArithmeticConfig()), ArithmeticTask)
    assert isinstance(build_task({"kind": "sorting", "items": "letters"}), SortingTask)
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    task = build_task(JsonlConfig(path=str(path)))
    assert isinstance(task, JsonlTask) and task.stop_strings == ()
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        build_task({"kind": "jsonl", "path": str(tmp_path / "missing.jsonl")})
    with pytest.raises(TypeError, match="build_task needs"):
        build_task(object())
