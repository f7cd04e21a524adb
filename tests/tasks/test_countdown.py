"""Countdown: the expression parser (precedence, parentheses, bad input), number use, scoring, generation."""

from fractions import Fraction

import pytest

from trace_rl.tasks import CountdownTask, Problem
from trace_rl.tasks.expression import ExpressionError, evaluate, numbers_used, parse, render


@pytest.mark.parametrize("text,value", [
    ("2+3*4", 14), ("(2+3)*4", 20), ("10-4-3", 3), ("10-(4-3)", 9), ("8/4/2", 1), ("8/(4/2)", 4),
    ("2*3+4*5", 26), (" ( 7 ) ", 7), ("1/3+2/3", 1), ("7/2", Fraction(7, 2)), ("((1+2))*(3)", 9),
])
def test_precedence_and_parentheses(text, value):
    assert evaluate(parse(text)) == value


@pytest.mark.parametrize("text", ["", "   ", "2+", "+2", "-2+5", "2 3", "(2+3", "2+3)", "2**3", "2^3", "2x3",
                                  "2+3=5", "1.5*2", "()", "__import__('os')", "(" * 60 + "1" + ")" * 60,
                                  "1+" * 300 + "1"])
def test_not_expressions(text):
    with pytest.raises(ExpressionError):
        parse(text)


def test_render_keeps_only_needed_parentheses(seed):
    assert render(parse("(1+2)*3")) == "(1+2)*3"
    assert render(parse("(1*2)+3")) == "1*2+3"
    assert render(parse("8-(3-1)")) == "8-(3-1)"
    assert render(parse("8/(4*2)")) == "8/(4*2)"
    task = CountdownTask(min_numbers=2, max_numbers=6, max_number=20, max_target=10_000)
    for p in task.problems(100, seed, "train"):  # rendering round-trips the value of random trees
        assert render(parse(p.answer)) == p.answer and evaluate(parse(p.answer)) == p.meta["target"]


def _problem(numbers, target):
    return Problem(f"Make {target} from {' '.join(map(str, numbers))}: ", "", {"numbers": numbers, "target": target})


@pytest.mark.parametrize("response,correct,format_ok", [
    ("25*3+7", True, True),
    ("7+3*25\nmore text", True, True),
    (" (25*3)+7 ", True, True),
    ("25*3+7*1", False, True),        # 1 is not given
    ("25*3+7+7-7", False, True),      # 7 used three times, given once
    ("25*3", False, True),            # right numbers, wrong value
    ("7/(25-25)", False, True),       # division by zero: incorrect, no crash
    ("25*3+7=82", False, False),
    ("82", False, True),              # a literal that is not given
    ("", False, False),
])
def test_scores(response, correct, format_ok):
    score = CountdownTask().score(_problem([25, 3, 7], 82), response)
    assert (score.correct, score.format_ok) == (correct, format_ok), score.reason


def test_fractions_along_the_way_and_non_integer_results():
    task = CountdownTask()
    assert task.score(_problem([3, 2, 4], 6), "3/2*4").correct        # 3/2 is fine in the middle
    s = task.score(_problem([7, 2], 3), "7/2")                        # 3.5 is not 3
    assert (s.correct, s.format_ok) == (False, True) and "7/2" in s.reason


def test_duplicates_and_must_use_all():
    assert CountdownTask().score(_problem([5, 5, 2], 12), "5+5+2").correct
    assert not CountdownTask().score(_problem([5, 2], 12), "5+5+2").correct
    strict = CountdownTask(must_use_all=True)
    assert strict.score(_problem([5, 6, 1], 30), "5*6*1").correct
    s = strict.score(_problem([5, 6, 1], 30), "5*6")
    assert not s.correct and "leaves out 1" in s.reason
    assert CountdownTask().score(_problem([5, 6, 1], 30), "5*6").correct


def test_generation_knobs_and_solvability(seed):
    task = CountdownTask(min_numbers=3, max_numbers=5, max_number=30, min_target=10, max_target=200, must_use_all=True)
    ps = task.problems(200, seed, "eval")
    assert {len(p.meta["numbers"]) for p in ps} == {3, 4, 5}
    for p in ps:
        assert all(1 <= x <= 30 for x in p.meta["numbers"]) and 10 <= p.meta["target"] <= 200
        assert sorted(numbers_used(parse(p.answer))) == sorted(map(str, p.meta["numbers"]))
        assert task.score(p, task.sft_target(p)).reward == pytest.approx(1.1)
    assert ps == task.problems(200, seed, "eval")
