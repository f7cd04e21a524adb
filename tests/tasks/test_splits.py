"""Train and eval never share a problem, for any seeds; split membership depends on the problem alone."""

import pytest

from trace_rl.tasks import ArithmeticTask, CountdownTask, SortingTask, split_of

TASKS = [
    ArithmeticTask(ops=("add", "sub", "mul"), min_digits=1, max_digits=2),
    ArithmeticTask(ops=("add",), num_operands=3, max_digits=2, show_work=True),
    CountdownTask(),
    SortingTask(min_length=2, max_length=4, max_value=20),
    SortingTask(items="letters", min_length=2, max_length=3),
]


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_train_and_eval_are_disjoint(task, seed):
    train = task.problems(3000, seed, "train")
    evals = task.problems(500, seed + 1, "eval")
    assert not {task.split_key(p) for p in train} & {task.split_key(p) for p in evals}
    assert not {p.prompt for p in train} & {p.prompt for p in evals}
    assert all(split_of(task.split_key(p), task.config.eval_fraction) == "eval" for p in evals)


def test_reordered_operands_share_a_split():
    task = ArithmeticTask(ops=("add", "mul"), num_operands=3)
    a, b = task.problems(50, 1, "eval"), task.problems(50, 1, "eval")
    for p, q in zip(a, b):
        keyed = task.split_key(p)
        swapped = type(p)(p.prompt, p.answer, {**p.meta, "operands": list(reversed(p.meta["operands"]))})
        assert task.split_key(swapped) == keyed and task.split_key(q) == keyed


def test_eval_fraction_sets_the_share():
    keys = [f"k{i}" for i in range(20_000)]
    for fraction in (0.05, 0.3):
        share = sum(split_of(k, fraction) == "eval" for k in keys) / len(keys)
        assert abs(share - fraction) < 0.02


def test_too_small_a_space_is_an_error_not_a_hang():
    task = ArithmeticTask(ops=("add",), min_digits=1, max_digits=1, eval_fraction=0.001)
    with pytest.raises(RuntimeError, match="problem space"):
        task.problems(1, 0, "eval")
