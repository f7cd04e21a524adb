"""JsonlTask: loading (good and bad records), the math-answer checker, splits, SFT targets."""

import json

import pytest

from trace_rl.tasks import JsonlError, JsonlTask

RECORDS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=7\n#### 7"},
    {"prompt": "What is half of 3?", "answer": 1.5},
    {"question": "How many cents in $12.50?", "answer": "#### 1,250"},
    {"question": "A debt of 5 dollars is", "answer": "-5"},
    {"question": "Three quarters as a fraction", "answer": "#### 3/4", "id": "extra keys are ignored"},
    {"question": "Tiny", "answer": 1e-7},
]


def _write(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture
def task(tmp_path):
    train = _write(tmp_path / "train.jsonl", RECORDS[:4] + [""])  # a trailing blank line is fine
    evals = _write(tmp_path / "eval.jsonl", RECORDS[4:])
    return JsonlTask(path=str(train), eval_path=str(evals), prompt_template="Q: {prompt}\nA:")


def test_loads_records(task):
    train = task.problems(4, 0, "train")
    assert sorted(p.answer for p in train) == ["-5", "1.5", "1250", "7"]
    p = next(p for p in train if p.answer == "7")
    assert p.prompt == "Q: Tom has 3 apples and buys 4. How many?\nA:"
    assert p.meta["source"].endswith("train.jsonl:1")
    assert sorted(p.answer for p in task.problems(2, 0, "eval")) == ["0.0000001", "3/4"]


@pytest.mark.parametrize("response,correct,format_ok", [
    ("3+4 = 7 apples\n#### 7", True, True),
    ("#### 7.0", True, True),
    ("The answer is 7.", True, False),          # right, but without the '####' format
    ("#### 7\nthen rambles about 12", True, True),
    ("#### 7\n#### 8", True, True),               # the first answer counts
    ("7 or maybe 8", False, False),             # the last number counts
    ("#### 8", False, True),
    ("no idea", False, False),
])
def test_math_checker(task, response, correct, format_ok):
    p = next(p for p in task.problems(4, 0, "train") if p.answer == "7")
    score = task.score(p, response)
    assert (score.correct, score.format_ok) == (correct, format_ok), score.reason
    assert score.reward == pytest.approx(correct + 0.1 * format_ok)


def test_commas_signs_decimals_fractions(task):
    by_answer = {p.answer: p for p in task.problems(4, 0, "train") + task.problems(2, 0, "eval")}
    assert task.score(by_answer["1250"], "#### 1,250 cents").correct
    assert task.score(by_answer["1250"], "#### 1250").correct
    assert task.score(by_answer["-5"], "You owe, so #### -5").correct
    assert not task.score(by_answer["-5"], "#### 5").correct
    assert task.score(by_answer["1.5"], "#### 3/2").correct
    assert task.score(by_answer["3/4"], "#### 0.75").correct
    assert not task.score(by_answer["3/4"], "#### 0.7").correct
    assert task.score(by_answer["0.0000001"], "#### 0.0000001").correct


def test_require_marker_and_stop_strings(tmp_path):
    path = _write(tmp_path / "d.jsonl", [RECORDS[0]])
    strict = JsonlTask(path=str(path), eval_fraction=0.01, require_marker=True)
    p = strict.problems(1, 0, "train")[0]
    assert not strict.score(p, "it is 7").correct and strict.score(p, "#### 7").correct
    stopped = JsonlTask(path=str(path), eval_fraction=0.01, stop_strings=("</s>",))
    assert not stopped.score(p, "#### 8</s>#### 7").correct
    with pytest.raises(JsonlError, match="stop string"):
        JsonlTask(path=str(path), eval_fraction=0.01, stop_strings=("\n",)).sft_target(p)


def test_sft_targets(task):
    for p in task.problems(4, 0, "train") + task.problems(2, 0, "eval"):
        target = task.sft_target(p)
        assert "####" in target and task.score(p, target).reward == pytest.approx(1.1)
    p = next(p for p in task.problems(4, 0, "train") if p.answer == "-5")
    assert task.sft_target(p) == "#### -5"


@pytest.mark.parametrize("line,message", [
    ("{not json", r"bad.jsonl:2: not valid JSON"),
    ("[1, 2]", r"bad.jsonl:2: a record must be a JSON object"),
    ('{"answer": "#### 3"}', r"bad.jsonl:2: needs a non-empty string 'question'"),
    ('{"question": "  ", "answer": "3"}', r"bad.jsonl:2: needs a non-empty string"),
    ('{"question": "q"}', r"bad.jsonl:2: needs an 'answer'"),
    ('{"question": "q", "answer": true}', r"bad.jsonl:2: needs an 'answer'"),
    ('{"question": "q", "answer": "no number here"}', r"bad.jsonl:2: answer .* has no number"),
    ('{"question": "q", "answer": NaN}', r"bad.jsonl:2: answer nan is not a finite number"),
])
def test_bad_records_name_file_and_line(tmp_path, line, message):
    path = _write(tmp_path / "bad.jsonl", [RECORDS[0], line])
    with pytest.raises(JsonlError, match=message):
        JsonlTask(path=str(path))


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"not found: .*nope\.jsonl"):
        JsonlTask(path=str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(JsonlError, match="no records"):
        JsonlTask(path=str(tmp_path / "empty.jsonl"))


def test_overlapping_eval_file_is_an_error(tmp_path):
    train = _write(tmp_path / "train.jsonl", RECORDS[:3])
    evals = _write(tmp_path / "eval.jsonl", RECORDS[2:4])
    with pytest.raises(JsonlError, match="1 eval records repeat a train question"):
        JsonlTask(path=str(train), eval_path=str(evals))


def test_hash_split_is_disjoint_and_deterministic(tmp_path, seed):
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"} for i in range(2000)]
    task = JsonlTask(path=str(_write(tmp_path / "many.jsonl", rows)), eval_fraction=0.2)
    n_train, n_eval = task.split_size("train"), task.split_size("eval")
    assert n_train + n_eval == 2000 and 300 < n_eval < 500
    train, evals = task.problems(n_train, seed, "train"), task.problems(n_eval, seed, "eval")
    assert not {p.prompt for p in train} & {p.prompt for p in evals}
    assert len({p.prompt for p in train}) == n_train  # one full pass visits each record once
    assert task.problems(n_train + 5, seed, "train")[:n_train] == train  # more than a pass: a new shuffle follows
    assert task.problems(10, seed + 1, "train") != train[:10]
