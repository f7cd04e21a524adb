"""SortingTask: scores, show-work selection sort, length knob, letters."""

import pytest

from trace_rl.tasks import Problem, SortingTask


def _problem(items, show_work=False):
    listed = " ".join(items)
    answer = " ".join(sorted(items, key=int) if items[0].isdigit() else sorted(items))
    return Problem(f"work: sort {listed}\n" if show_work else f"sort {listed}: ", answer, {"items": items})


@pytest.mark.parametrize("response,correct,format_ok", [
    ("1 5 9 31", True, True),
    ("  1  5 9\t31 \nrest", True, True),
    ("1 5 9 031", True, True),
    ("1 5 31 9", False, True),        # string order, not numeric
    ("1 5 9", False, True),
    ("1 5 9 31 31", False, True),
    ("1,5,9,31", False, False),
    ("-1 5", False, False),
    ("", False, False),
])
def test_number_scores(response, correct, format_ok):
    score = SortingTask().score(_problem(["5", "31", "9", "1"]), response)
    assert (score.correct, score.format_ok) == (correct, format_ok), score.reason


def test_letters():
    task = SortingTask(items="letters")
    p = _problem(["q", "a", "q", "c"])
    assert task.score(p, "a c q q").correct
    assert task.score(p, "A C Q Q").format_ok is False
    assert task.score(p, "a q c q").format_ok is True


def test_show_work_by_hand():
    task = SortingTask(show_work=True)
    p = _problem(["5", "31", "9", "1"], show_work=True)
    assert task.sft_target(p) == ("5 31 9 1 -> min 1 -> 1\n5 31 9 -> min 5 -> 1 5\n31 9 -> min 9 -> 1 5 9\n"
                                  "31 -> min 31 -> 1 5 9 31\n#### 1 5 9 31")
    assert task.score(p, "whatever\n#### 1 5 9 31").correct
    assert not task.score(p, "1 5 9 31").format_ok


def test_length_knob_and_show_work_growth(seed):
    for lo, hi in [(1, 1), (4, 9)]:
        lengths = {len(p.meta["items"]) for p in SortingTask(min_length=lo, max_length=hi).problems(300, seed, "train")}
        assert lengths == set(range(lo, hi + 1))

    def target_len(n):
        task = SortingTask(min_length=n, max_length=n, show_work=True)
        return max(len(task.sft_target(p)) for p in task.problems(5, seed, "train"))
    assert target_len(5) < target_len(20) < target_len(60) and target_len(60) > 5000


def test_targets_score_and_determinism(seed):
    for items in ("numbers", "letters"):
        for show_work in (False, True):
            task = SortingTask(items=items, show_work=show_work, max_length=12)
            ps = task.problems(50, seed, "eval")
            assert ps == task.problems(50, seed, "eval")
            assert all(task.score(p, task.sft_target(p)).reward == pytest.approx(1.1) for p in ps)
