"""Every user-input error exits 2 with one line naming the file or field (and the fix), before anything is
written: the run directory (and `runs/` in the working directory) stays absent. One table, run in-process."""

from __future__ import annotations

import pytest

from trace_rl.cli import main

BAD_YAML = "loop:\n  steps: 3\n precision: {kv_cache: bf16\n"
NOT_UTF8 = "loop:\n  steps: 3\n# caf\xe9\n".encode("latin-1")


def _files(tmp_path):
    (tmp_path / "bad.yaml").write_text(BAD_YAML)
    (tmp_path / "bad.json").write_text('{"loop": {"steps": 3,}}')
    (tmp_path / "latin1.yaml").write_bytes(NOT_UTF8)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "folder.yaml").mkdir()


# (argv, what the one line must contain); {tmp} is the test's folder
CASES = [
    (["run", "{tmp}/bad.yaml"], ["bad.yaml:3:", "invalid YAML"]),
    (["run", "{tmp}/bad.json"], ["bad.json:1:", "invalid JSON"]),
    (["run", "{tmp}/latin1.yaml"], ["latin1.yaml", "not UTF-8", "save it as UTF-8"]),
    (["run", "{tmp}/list.yaml"], ["list.yaml", "top level must be a mapping"]),
    (["run", "{tmp}/folder.yaml"], ["folder.yaml", "is a folder"]),
    (["validate", "{tmp}/bad.yaml"], ["bad.yaml:3:", "invalid YAML"]),
    (["run", "--set", "trainer.lr=.inf"], ["trainer.lr", "finite"]),
    (["run", "--set", "trainer.lr=.nan"], ["trainer.lr", "finite"]),
    (["run", "--set", "trainer.betas=[0.9, 1.5]"], ["trainer.betas", "betas[1] = 1.5", "[0, 1)"]),
    (["run", "--set", "trainer.betas=[-0.1, 0.9]"], ["trainer.betas", "betas[0]"]),
    (["run", "--set", "seed=123456789012345678901234567890"], ["seed", "less than or equal to 4294967295"]),
    (["run", "--set", "seed=-1"], ["seed", "greater than or equal to 0"]),
    (["run", "--set", "logging.name=../escape"], ["logging.name", "one path component"]),
    (["run", "--set", "logging.name=/tmp/abs"], ["logging.name", "one path component"]),
    (["run", "--set", "loop.group_size=1"], ["loop.group_size", "at least 2"]),
    (["run", "--set", "loop.steps=[1"], ["--set", "not valid YAML"]),
]


@pytest.mark.parametrize("argv,needles", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(argv, needles, tmp_path, monkeypatch, capsys):
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    out_dir = tmp_path / "run"
    if argv[0] == "run":
        argv = [*argv, "--out", str(out_dir)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("trace-rl: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not out_dir.exists() and not (tmp_path / "runs").exists()
